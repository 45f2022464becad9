//! Time travel end to end: saves made by a running `project-watcher watch`, then `history`,
//! `show` and `restore --at` of the real binary against real git. The oracle is git itself:
//! tree ids (same paths, bytes and modes), the remote's refs, `git log`.

mod support;

use std::fs;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, SystemTime};

use serde_json::Value;
use support::{PATIENCE, Project};
use testkit::git::{SavedProject, git, git_output, hermetic_env, tree_of};
use testkit::wait::until;

const BIN: &str = env!("CARGO_BIN_EXE_project-watcher");

fn run(project: &Project, args: &[&str]) -> Output {
    let mut cmd = Command::new(BIN);
    for (k, v) in hermetic_env(&project.home) {
        cmd.env(k, v);
    }
    cmd.env_remove("PROJECT_DIR")
        .env_remove("PROJECT_TOKEN")
        .args(args)
        .args(["--dir".as_ref(), project.work.as_os_str()])
        .output()
        .unwrap()
}

fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}: {}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn history(project: &Project, extra: &[&str]) -> Vec<Value> {
    let mut args = vec!["history", "--json"];
    args.extend(extra);
    serde_json::from_str::<Value>(&ok(run(project, &args)))
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

fn head(dir: &Path) -> String {
    git(dir, ["rev-parse", "HEAD"]).trim().to_owned()
}

fn tree(dir: &Path, rev: &str) -> String {
    tree_of(dir, rev).unwrap_or_else(|| panic!("{rev} has no tree"))
}

/// Waits until the clock is past the second `after` was in: saves in different seconds can be
/// told apart by time.
fn next_second(after: SystemTime) {
    let second = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
    until(
        Duration::from_secs(3),
        "the clock to reach the next second",
        || (second(SystemTime::now()) > second(after)).then_some(()),
    );
}

/// A project with ignored files and a `.env`, watched by the real binary, with three saves
/// on the remote. Returns the project, the watcher and the saves (oldest first).
fn three_saves(root: &Path) -> (Project, support::Watcher, [String; 3]) {
    let p = Project::local(root);
    p.write(".gitignore", "node_modules/\n");
    p.write("src/agents/weather.ts", "v1\n");
    p.write("notes.md", "first notes\n");
    p.write("node_modules/dep/index.js", "dep\n");
    p.write(".env", "OPENAI_API_KEY=sk-test\n");
    let watcher = p.start(&[], &[]);
    p.wait_pushed(PATIENCE);
    let first = head(&p.work);
    // Two seconds apart at least, so a duration ago can land between them (below).
    next_second(SystemTime::now());
    next_second(SystemTime::now());

    // Enough files that a restore takes a while, so the watcher sees its events mid-restore;
    // made outside and moved in with one rename, so the second save is one commit.
    let generated = root.join("generated");
    fs::create_dir_all(&generated).unwrap();
    for i in 0..300 {
        fs::write(generated.join(format!("t{i}.ts")), format!("{i}\n")).unwrap();
    }
    p.write("src/agents/weather.ts", "v2\n");
    p.write("src/tools/search.ts", "search\n");
    fs::rename(&generated, p.path("src/tools/generated")).unwrap();
    fs::remove_file(p.path("notes.md")).unwrap();
    p.wait_pushed(PATIENCE);
    let second = head(&p.work);
    next_second(SystemTime::now());

    p.write("src/agents/weather.ts", "v3 broken by an agent\n");
    p.wait_pushed(PATIENCE);
    let third = head(&p.work);
    assert_ne!(first, second);
    assert_ne!(second, third);
    (p, watcher, [first, second, third])
}

#[test]
fn restore_while_watch_runs_brings_back_an_earlier_save_and_pushes_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (p, _watcher, [first, second, third]) = three_saves(tmp.path());

    // The subjects name what changed; git log --oneline shows the file's name.
    let oneline = git(&p.work, ["log", "--oneline", "-1", &third]);
    assert!(
        oneline.contains("autosave: src/agents/weather.ts"),
        "{oneline}"
    );

    // The watcher is idle (all pushed): only it can push the restore commit below.
    let out = ok(run(&p, &["restore", "--at", &first[..8]]));
    assert!(out.contains("as at"), "{out}");

    // The tree is the first save's, byte for byte; ignored files and .env are untouched.
    assert_eq!(p.expected_tree(&[]), tree(&p.work, &first));
    assert_eq!(tree(&p.work, "HEAD"), tree(&p.work, &first));
    assert_eq!(
        fs::read_to_string(p.path("notes.md")).unwrap(),
        "first notes\n"
    );
    assert!(!p.path("src/tools/search.ts").exists());
    assert_eq!(
        fs::read_to_string(p.path(".env")).unwrap(),
        "OPENAI_API_KEY=sk-test\n"
    );
    assert_eq!(
        fs::read_to_string(p.path("node_modules/dep/index.js")).unwrap(),
        "dep\n"
    );
    let restore_commit = head(&p.work);
    assert_eq!(git(&p.work, ["rev-parse", "HEAD~1"]).trim(), third);
    let message = git(&p.work, ["log", "-1", "--format=%B"]);
    assert!(
        message.starts_with(&format!("restore: the project as at {}", &first[..7])),
        "{message}"
    );
    assert!(message.contains("\nSave-kind: restore\n"), "{message}");
    assert!(
        message.contains(&format!("Restored-from: {first}")),
        "{message}"
    );

    // The running watcher pushes the restore commit and saves nothing of its own for it.
    until(PATIENCE, "the remote to get the restore commit", || {
        (git(&p.bare, ["rev-parse", "main"]).trim() == restore_commit).then_some(())
    });
    assert_eq!(head(&p.work), restore_commit);

    // A further edit is saved on top of the restore.
    p.write("src/agents/weather.ts", "v5 after the restore\n");
    p.wait_pushed(PATIENCE);
    assert_eq!(git(&p.work, ["rev-parse", "HEAD~1"]).trim(), restore_commit);

    let saves = history(&p, &[]);
    let kinds: Vec<&str> = saves.iter().map(|s| s["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds[..3],
        ["autosave", "restore", "autosave"],
        "{saves:#?}"
    );
    assert_eq!(saves[1]["commit"], restore_commit.as_str());
    assert!(saves.iter().all(|s| s["pushed"] == true), "{saves:#?}");
    assert!(saves.iter().any(|s| s["commit"] == second.as_str()));
    for save in &saves {
        let time = save["time"].as_str().unwrap();
        assert!(humantime::parse_rfc3339(time).is_ok(), "{time}");
    }
}

#[test]
fn restore_of_one_path_by_time_and_its_undo() {
    let tmp = tempfile::tempdir().unwrap();
    let (p, _watcher, [first, second, third]) = three_saves(tmp.path());
    let first_time = git(&p.work, ["show", "-s", "--format=%cI", &first])
        .trim()
        .to_owned();

    // By time (RFC 3339 with an offset, as `git` prints it): the newest save at or before it.
    let out = ok(run(
        &p,
        &[
            "restore",
            "--at",
            &first_time,
            "--path",
            "src/agents/weather.ts",
            "--json",
        ],
    ));
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["from"], first.as_str(), "{report:#}");
    assert_eq!(report["watcher_running"], true, "{report:#}");
    assert_eq!(
        report["files"],
        serde_json::json!(["src/agents/weather.ts"])
    );
    let restore_commit = report["commit"].as_str().unwrap().to_owned();
    assert_eq!(head(&p.work), restore_commit);

    // Only that path went back; everything else stays as in the newest save.
    assert_eq!(
        fs::read_to_string(p.path("src/agents/weather.ts")).unwrap(),
        "v1\n"
    );
    assert_eq!(
        fs::read_to_string(p.path("src/tools/search.ts")).unwrap(),
        "search\n"
    );
    assert!(!p.path("notes.md").exists());
    let changed = git(&p.work, ["diff", "--name-only", &third, "HEAD"]);
    assert_eq!(changed, "src/agents/weather.ts\n");
    assert_eq!(p.expected_tree(&[]), tree(&p.work, "HEAD"));

    // Undo: restore the save before the restore.
    let out = ok(run(&p, &["restore", "--at", &third, "--json"]));
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["from"], third.as_str());
    assert_eq!(tree(&p.work, "HEAD"), tree(&p.work, &third));
    assert_eq!(p.expected_tree(&[]), tree(&p.work, &third));
    assert_eq!(
        git(&p.work, ["rev-parse", "HEAD~1"]).trim(),
        restore_commit,
        "history is never rewritten"
    );
    p.wait_pushed(PATIENCE);
    assert_eq!(tree(&p.bare, "main"), tree(&p.work, &third));

    // A folder by a duration ago: as old as the first save, which is 2 s or more before the
    // second, so a second ticking over before the binary reads the clock still lands between.
    let first_secs: u64 = git(&p.work, ["show", "-s", "--format=%ct", &first])
        .trim()
        .parse()
        .unwrap();
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let ago = format!("{}s", now - first_secs);
    let out = ok(run(
        &p,
        &["restore", "--at", &ago, "--path", "src/tools", "--json"],
    ));
    let report: Value = serde_json::from_str(&out).unwrap();
    let listed: Vec<String> = history(&p, &[])
        .iter()
        .map(|s| {
            format!(
                "{} {} {} {}",
                s["commit"], s["time"], s["kind"], s["subject"]
            )
        })
        .collect();
    assert_eq!(
        report["from"],
        first.as_str(),
        "{report:#}\n{ago} ago\nsaves: {listed:#?}\nfirst {first}\nsecond {second}"
    );
    assert!(!p.path("src/tools/search.ts").exists());
    assert!(!p.path("src/tools").exists());
    assert_eq!(
        fs::read_to_string(p.path("src/agents/weather.ts")).unwrap(),
        "v3 broken by an agent\n"
    );

    // --path keeps the saves that touched it.
    let touched = history(&p, &["--path", "src/tools"]);
    let commits: Vec<&str> = touched
        .iter()
        .map(|s| s["commit"].as_str().unwrap())
        .collect();
    assert_eq!(commits.len(), 2, "{touched:#?}");
    assert_eq!(commits[1], second);
    assert_eq!(touched[0]["kind"], "restore");
    assert_eq!(history(&p, &["--limit", "2"]).len(), 2);
}

#[test]
fn unsaved_edits_are_saved_before_going_back() {
    let tmp = tempfile::tempdir().unwrap();
    let p = Project::local(tmp.path());
    p.write("a.txt", "saved\n");
    ok(run(&p, &["once", "--no-push"]));
    let saved = head(&p.work);
    p.write("a.txt", "unsaved\n");
    p.write("new.txt", "new and unsaved\n");
    let big = vec![7u8; 2048];
    p.write("big.bin", &big);

    let out = ok(run(
        &p,
        &[
            "restore",
            "--at",
            &saved,
            "--json",
            "--max-file-size",
            "1KiB",
        ],
    ));
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["watcher_running"], false, "{report:#}");
    let saved_first = report["saved_first"]
        .as_str()
        .expect("a save first")
        .to_owned();
    assert_eq!(git(&p.work, ["rev-parse", "HEAD~1"]).trim(), saved_first);
    assert_eq!(git(&p.work, ["rev-parse", "HEAD~2"]).trim(), saved);
    assert_eq!(
        git(&p.work, ["show", &format!("{saved_first}:a.txt")]),
        "unsaved\n"
    );
    assert_eq!(
        git(&p.work, ["show", &format!("{saved_first}:new.txt")]),
        "new and unsaved\n"
    );
    assert_eq!(fs::read_to_string(p.path("a.txt")).unwrap(), "saved\n");
    assert!(!p.path("new.txt").exists());
    // Over the size limit: never committed, and left on disk as it was.
    assert_eq!(
        git(&p.work, ["log", "--all", "--format=%H", "--", "big.bin"]),
        ""
    );
    assert_eq!(fs::read(p.path("big.bin")).unwrap(), big);
    assert_eq!(p.expected_tree(&["big.bin"]), tree(&p.work, &saved));

    let kinds: Vec<Value> = history(&p, &[]).iter().map(|s| s["kind"].clone()).collect();
    assert_eq!(kinds, ["restore", "autosave", "autosave"]);

    // A path only the unsaved edits had goes too (it is in the save made first).
    p.write("scratch.txt", "unsaved scratch\n");
    let out = ok(run(
        &p,
        &["restore", "--at", &saved, "--path", "scratch.txt", "--json"],
    ));
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        report["files"],
        serde_json::json!(["scratch.txt"]),
        "{report:#}"
    );
    assert!(!p.path("scratch.txt").exists());
}

#[test]
fn bad_revisions_times_and_paths_are_one_line_and_exit_2_and_change_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let p = Project::local(tmp.path());
    p.write("a.txt", "a\n");
    ok(run(&p, &["once", "--no-push"]));
    let before = head(&p.work);
    p.write("a.txt", "unsaved\n");
    let first_time = git(&p.work, ["show", "-s", "--format=%ct", &before])
        .trim()
        .parse::<u64>()
        .unwrap();
    let before_first = humantime::format_rfc3339_seconds(
        SystemTime::UNIX_EPOCH + Duration::from_secs(first_time - 60),
    )
    .to_string();
    let cases: &[(&[&str], &str)] = &[
        (&["restore", "--at", "deadbeef"], "is not a save"),
        (
            &["restore", "--at", "2026-13-01T00:00:00Z"],
            "not a valid time",
        ),
        (&["restore", "--at", &before_first], "no save at or before"),
        (
            &["restore", "--at", "HEAD", "--path", "never/was.txt"],
            "neither in the save",
        ),
        (
            &["restore", "--at", "HEAD", "--path", "../outside"],
            "not a path inside",
        ),
        (&["show", "deadbeef"], "is not a save"),
        (&["show", "--json", "deadbeef"], "is not a save"),
    ];
    for (args, expected) in cases {
        let out = run(&p, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert_eq!(head(&p.work), before, "{args:?} changed HEAD");
        assert_eq!(fs::read_to_string(p.path("a.txt")).unwrap(), "unsaved\n");
    }
}

#[test]
fn show_prints_a_stat_and_the_patch_with_binary_files_summarised() {
    let tmp = tempfile::tempdir().unwrap();
    let p = Project::local(tmp.path());
    p.write("a.txt", "one\n");
    ok(run(&p, &["once", "--no-push"]));
    p.write("a.txt", "two\n");
    p.write("logo.png", [0u8, 159, 146, 150, 0, 1, 2]);
    ok(run(&p, &["once", "--no-push"]));
    let id = head(&p.work);
    let out = ok(run(&p, &["show", &id[..10]]));
    assert!(
        out.starts_with(&format!("commit {id}\nKind: autosave\n")),
        "{out}"
    );
    assert!(out.contains(" a.txt    | 2 +-\n"), "{out}");
    // The summary line and the patch are what git itself prints for that commit.
    let shortstat = git(&p.work, ["show", "--format=", "--shortstat", &id]);
    assert!(
        out.contains(shortstat.trim_end()),
        "{out}\ngit: {shortstat}"
    );
    let patch = git(&p.work, ["show", "--format=", &id]);
    assert!(out.ends_with(&patch), "{out}\ngit:\n{patch}");
    assert!(
        patch.contains("Binary files /dev/null and b/logo.png differ"),
        "{patch}"
    );
}

/// `show --json` says what git says of the save: each file's change (`git diff-tree -r -M
/// --name-status`, the renames `git show` finds), its line counts (`git show --numstat`, `-`
/// for a binary file), and its patch, the patches joined being `git show`'s.
#[test]
fn show_json_is_the_save_as_git_shows_it() {
    let tmp = tempfile::tempdir().unwrap();
    let p = Project::local(tmp.path());
    p.write("keep.txt", "one\ntwo\nthree\n");
    p.write("gone.txt", "gone\n");
    p.write("src/old.ts", "a\nb\nc\nd\ne\nf\n");
    p.write("logo.png", [0u8, 159, 146, 150]);
    ok(run(&p, &["once", "--no-push"]));
    let first = head(&p.work);
    p.write("keep.txt", "one\n2\nthree\nfour\n");
    fs::remove_file(p.path("gone.txt")).unwrap();
    fs::remove_file(p.path("src/old.ts")).unwrap();
    p.write("src/tools/new.ts", "a\nb\nc\nd\ne\nf\ng\n");
    p.write("logo.png", [0u8, 1, 2]);
    p.write("added.txt", "new\n");
    p.write("data.bin", [7u8, 0, 7]);
    ok(run(&p, &["once", "--no-push"]));
    let id = head(&p.work);

    let save: Value = serde_json::from_str(&ok(run(&p, &["show", "--json", &id[..10]]))).unwrap();
    let log = |format: &str| git(&p.work, ["log", "-1", &format!("--format={format}"), &id]);
    assert_eq!(save["commit"], id);
    assert_eq!(
        save["short"],
        git(&p.work, ["rev-parse", "--short", &id]).trim()
    );
    assert_eq!(save["kind"], "autosave");
    assert_eq!(save["kind"], history(&p, &["--limit", "1"])[0]["kind"]);
    assert_eq!(save["subject"], log("%s").trim_end());
    assert_eq!(
        save["message"],
        log("%B").trim_end_matches('\n').to_owned() + "\n"
    );
    assert_eq!(save["author"]["name"], log("%an").trim());
    assert_eq!(save["author"]["email"], log("%ae").trim());
    let time = humantime::parse_rfc3339(save["time"].as_str().unwrap()).unwrap();
    let secs = time
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert_eq!(secs.to_string(), log("%ct").trim());
    assert_eq!(save["parents"], serde_json::json!([first]));

    // git's view, file by file: (letter, old path, path), (added, removed) or binary.
    let status = git(
        &p.work,
        ["diff-tree", "-r", "-M", "-z", "--name-status", &id],
    );
    let mut fields = status.split('\0').skip(1).filter(|f| !f.is_empty());
    let mut git_files = Vec::new();
    while let Some(letter) = fields.next() {
        let letter = &letter[..1];
        let old = (letter == "R").then(|| fields.next().unwrap().to_owned());
        git_files.push((letter.to_owned(), old, fields.next().unwrap().to_owned()));
    }
    let numstat = git(&p.work, ["show", "-z", "--numstat", "--format=", &id]);
    let mut fields = numstat.split('\0').filter(|f| !f.trim().is_empty());
    let mut git_counts = Vec::new();
    while let Some(counts) = fields.next() {
        let mut counts = counts.trim_start().split('\t');
        let (added, removed) = (counts.next().unwrap(), counts.next().unwrap());
        let path = match counts.next().unwrap() {
            "" => {
                fields.next();
                fields.next().unwrap()
            }
            path => path,
        };
        let count = |n: &str| n.parse::<u64>().ok();
        git_counts.push((path.to_owned(), count(added), count(removed)));
    }
    let files = save["files"].as_array().unwrap();
    let shown: Vec<(String, Option<String>, String)> = files
        .iter()
        .map(|f| {
            let letter = match f["change"].as_str().unwrap() {
                "added" => "A",
                "modified" => "M",
                "deleted" => "D",
                "renamed" => "R",
                other => panic!("unexpected change {other}"),
            };
            let old = f.get("old_path").map(|o| o.as_str().unwrap().to_owned());
            (
                letter.to_owned(),
                old,
                f["path"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(shown, git_files, "{save:#}");
    let letters: std::collections::BTreeSet<&str> =
        git_files.iter().map(|(l, _, _)| l.as_str()).collect();
    assert_eq!(letters, ["A", "D", "M", "R"].into(), "{status}");
    let counts: Vec<(String, Option<u64>, Option<u64>)> = files
        .iter()
        .map(|f| {
            assert_eq!(f["binary"], f["added"].is_null(), "{f:#}");
            let path = f["path"].as_str().unwrap().to_owned();
            (path, f["added"].as_u64(), f["removed"].as_u64())
        })
        .collect();
    assert_eq!(counts, git_counts, "{save:#}\ngit: {numstat:?}");
    let binaries: Vec<&str> = files
        .iter()
        .filter(|f| f["binary"] == true)
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(binaries, ["data.bin", "logo.png"]);

    // libgit2 scores an edited rename's similarity its own way: that one figure may differ.
    let similarity = |text: &str| {
        text.lines()
            .map(|l| match l.starts_with("similarity index ") {
                true => "similarity index N%\n".to_owned(),
                false => format!("{l}\n"),
            })
            .collect::<String>()
    };
    let patch = similarity(&git(&p.work, ["show", "--format=", &id]));
    let joined: String = files.iter().map(|f| f["patch"].as_str().unwrap()).collect();
    assert_eq!(similarity(&joined), patch);
    assert!(patch.contains("rename from src/old.ts"), "{patch}");
    // The text form shows the same diff, renames included.
    assert!(similarity(&ok(run(&p, &["show", &id]))).ends_with(&patch));
}

#[test]
fn a_sync_pushes_its_backup_to_a_recovery_branch_that_history_lists_and_restore_takes() {
    let saved = SavedProject::new(&[("app.ts", "v1\n")]);
    // Unsaved sandbox work, then a push from the laptop that the sync brings in.
    fs::write(saved.sandbox.join("app.ts"), "sandbox work\n").unwrap();
    fs::write(saved.laptop.join("app.ts"), "laptop\n").unwrap();
    git(&saved.laptop, ["commit", "-qam", "from the laptop"]);
    git(&saved.laptop, ["push", "-q", "origin", "main"]);
    let home = saved.tmp.path();
    let sandbox = saved.sandbox.to_str().unwrap();
    let cmd = |args: &[&str]| {
        let mut cmd = Command::new(BIN);
        for (k, v) in hermetic_env(home) {
            cmd.env(k, v);
        }
        cmd.env_remove("PROJECT_TOKEN").env_remove("PROJECT_DIR");
        cmd.args(args).args(["--dir", sandbox]).output().unwrap()
    };
    let out = cmd(&[
        "sync",
        "--failure-file",
        home.join("failure").to_str().unwrap(),
        "--install-cmd",
        "true",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        fs::read_to_string(saved.sandbox.join("app.ts")).unwrap(),
        "laptop\n"
    );

    // The remote holds the backup on a recovery branch: it outlives the sandbox.
    let branches = git(
        &saved.remote,
        [
            "for-each-ref",
            "--format=%(refname)",
            "refs/heads/recovery/",
        ],
    );
    let branch = branches
        .lines()
        .next()
        .expect("a recovery branch")
        .to_owned();
    assert_eq!(
        git(&saved.remote, ["show", &format!("{branch}:app.ts")]),
        "sandbox work\n"
    );

    let out = cmd(&["history", "--json"]);
    assert!(out.status.success());
    let saves: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let backup = saves
        .iter()
        .find(|s| s["kind"] == "backup")
        .unwrap_or_else(|| panic!("{saves:#?}"));
    assert_eq!(backup["pushed"], true, "{backup:#}");
    assert!(
        backup["ref"].as_str().unwrap().contains("recovery/"),
        "{backup:#}"
    );
    assert_eq!(backup["files"], serde_json::json!(["app.ts"]));
    let synced = saves
        .iter()
        .find(|s| s["subject"] == "from the laptop")
        .unwrap();
    // The page's word for a commit the watcher did not make, and the sync that brought it.
    assert_eq!(synced["kind"], "other", "{saves:#?}");
    assert_eq!(synced["synced"], true, "{saves:#?}");
    assert!(
        saves
            .iter()
            .filter(|s| s["subject"] != "from the laptop")
            .all(|s| s["synced"] == false),
        "{saves:#?}"
    );

    let out = cmd(&["restore", "--at", backup["commit"].as_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        fs::read_to_string(saved.sandbox.join("app.ts")).unwrap(),
        "sandbox work\n"
    );
    let out = git_output(&saved.sandbox, ["log", "-1", "--format=%B"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("Save-kind: restore"));
}

#[test]
fn a_recovery_branch_of_a_diverged_watcher_is_listed_as_a_pushed_backup() {
    let tmp = tempfile::tempdir().unwrap();
    let p = Project::local(tmp.path());
    p.write("app.ts", "v1\n");
    let _watcher = p.start(&[], &[]);
    p.wait_pushed(PATIENCE);
    // Someone else moves the remote branch on; the watcher's next save cannot go there.
    let laptop = tmp.path().join("laptop");
    git(
        tmp.path(),
        ["clone", "-q", p.bare.to_str().unwrap(), "laptop"],
    );
    testkit::git::init_repo(&laptop);
    fs::write(laptop.join("other.ts"), "elsewhere\n").unwrap();
    git(&laptop, ["add", "-A"]);
    git(&laptop, ["commit", "-qm", "elsewhere"]);
    git(&laptop, ["push", "-q", "origin", "main"]);
    p.write("app.ts", "v2 in the sandbox\n");
    let status = p.wait_status(
        "the watcher to divert to a recovery branch",
        PATIENCE,
        |s| s.recovery_ref.is_some(),
    );
    let recovery = status.recovery_ref.unwrap();
    let head = head(&p.work);
    assert_eq!(git(&p.bare, ["rev-parse", &recovery]).trim(), head);

    let saves = history(&p, &[]);
    let tip = saves
        .iter()
        .find(|s| s["commit"] == head.as_str())
        .unwrap_or_else(|| panic!("{saves:#?}"));
    assert_eq!(tip["kind"], "backup", "{tip:#}");
    assert_eq!(tip["pushed"], true, "{tip:#}");
    assert_eq!(
        tip["ref"],
        recovery
            .replace("refs/heads/", "refs/remotes/project/")
            .as_str()
    );
}

/// The saves of a 100k-commit history, as `git fast-import` reads them: `from` the tip of
/// `main` when `continues`.
fn fast_import_stream(range: std::ops::Range<usize>, continues: bool) -> String {
    let start = 1_700_000_000u64;
    let mut stream = String::with_capacity(range.len() * 200);
    for i in range.clone() {
        let body = format!("{i}\n");
        let message = format!(
            "autosave: f{}.txt\n\nf{}.txt\n\nSaved-by: project-watcher/0.1.0\nSave-kind: autosave\n",
            i % 100,
            i % 100
        );
        stream.push_str(&format!(
            "commit refs/heads/main\ncommitter W <w@x> {} +0000\ndata {}\n{message}",
            start + i as u64,
            message.len()
        ));
        if continues && i == range.start {
            stream.push_str("from refs/heads/main^0\n");
        }
        stream.push_str(&format!(
            "M 100644 inline f{}.txt\ndata {}\n{body}\n",
            i % 100,
            body.len()
        ));
    }
    stream
}

fn fast_import(work: &Path, stream: &str) {
    let mut child = testkit::git::command(work)
        .args(["fast-import", "--quiet"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stream.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success());
}

/// The pack files of `work` (`.pack` and `.idx`), by name.
fn packs(work: &Path) -> std::collections::BTreeSet<std::path::PathBuf> {
    fs::read_dir(work.join(".git/objects/pack"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect()
}

/// "Reads only what it shows", checked without a clock: the history is imported as two packs,
/// all but the newest 25 commits in the first, which is moved away while `history --limit 20`
/// runs. A command that read one commit beyond the saves it shows (and their parents) would
/// fail on the missing objects.
#[test]
fn history_of_100k_commits_reads_only_what_it_shows() {
    let tmp = tempfile::tempdir().unwrap();
    let p = Project::local(tmp.path());
    const COMMITS: usize = 100_000;
    const NEWEST: usize = 25;
    fast_import(&p.work, &fast_import_stream(0..COMMITS - NEWEST, false));
    let old_packs = packs(&p.work);
    fast_import(
        &p.work,
        &fast_import_stream(COMMITS - NEWEST..COMMITS, true),
    );
    git(&p.work, ["reset", "-q", "--hard", "main"]);
    assert_eq!(
        git(&p.work, ["rev-list", "--count", "HEAD"]).trim(),
        COMMITS.to_string()
    );

    let away = tmp.path().join("old-packs");
    fs::create_dir(&away).unwrap();
    for pack in &old_packs {
        fs::rename(pack, away.join(pack.file_name().unwrap())).unwrap();
    }
    let started = std::time::Instant::now();
    let saves = history(&p, &["--limit", "20"]);
    let took = started.elapsed();
    println!(
        "history --limit 20 of {COMMITS} commits, the oldest {} of them absent: {took:?}",
        COMMITS - NEWEST
    );
    for pack in &old_packs {
        fs::rename(away.join(pack.file_name().unwrap()), pack).unwrap();
    }
    assert_eq!(saves.len(), 20);
    assert_eq!(saves[0]["files"], serde_json::json!(["f99.txt"]));
    assert_eq!(saves[0]["pushed"], false);
    assert_eq!(saves[19]["files"], serde_json::json!(["f80.txt"]));

    // 100k ids share 4-character prefixes: such a prefix is ambiguous, one line, exit 2.
    let mut by_prefix = std::collections::HashMap::new();
    let ids = git(&p.work, ["rev-list", "HEAD"]);
    let shared = ids
        .lines()
        .find_map(|id| by_prefix.insert(&id[..4], id).map(|_| &id[..4]))
        .expect("two ids with the same first 4 characters");
    let out = run(&p, &["show", shared]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("is ambiguous"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}
