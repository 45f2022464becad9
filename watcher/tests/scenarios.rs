//! The watcher in-process on real repositories: what ends up in HEAD after ordinary and
//! awkward work, compared with what `git add -A` would commit.

mod support;

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::symlink;
use std::time::Duration;

use project_watcher::daemon::DaemonError;
use support::PATIENCE;
use support::in_process::{Daemon, Repo};
use testkit::git::git;
use testkit::wait::until;

#[test]
fn start_up_commits_uncommitted_work_and_an_empty_manifest() {
    let repo = Repo::new();
    repo.write("tracked.txt", "v1");
    repo.git(&["add", "-A"]);
    repo.git(&["commit", "-qm", "first"]);
    repo.write("tracked.txt", "v2");
    repo.write("new/file.txt", "new");
    let _daemon = Daemon::start(&repo, repo.config());
    assert_eq!(repo.commit_count(), 2, "start-up saves in one commit");
    repo.wait_saved();
    assert_eq!(
        fs::read_to_string(repo.path("shmastra.json")).unwrap(),
        "{\n  \"version\": 1,\n  \"env\": []\n}\n"
    );
    let message = repo.git(&["log", "-1", "--format=%B"]);
    assert!(
        message.starts_with("autosave: new/file.txt, shmastra.json, tracked.txt\n"),
        "{message}"
    );
    assert!(
        message.contains("\nSaved-by: project-watcher/"),
        "{message}"
    );
    assert_eq!(
        repo.git(&["log", "-1", "--format=%an <%ae>"]).trim(),
        "Test Author <author@example.test>"
    );
    let status = repo.status().unwrap();
    assert_eq!(status.state, project_watcher::status::State::Idle);
    assert_eq!(status.unpushed_commits, 2);
}

/// The project's top holds `.git`, yet an event on it (here a chmod) is not a nested
/// repository appearing: the watches stay, and a later file is committed while running.
#[test]
fn a_chmod_of_the_project_top_keeps_every_watch() {
    use std::os::unix::fs::PermissionsExt;
    let repo = Repo::new();
    fs::create_dir_all(repo.path("src")).unwrap();
    let _daemon = Daemon::start(&repo, repo.config());
    fs::set_permissions(&repo.dir, fs::Permissions::from_mode(0o750)).unwrap();
    repo.wait_saved();
    repo.write("src/after-chmod.txt", "saved while running\n");
    repo.wait_saved_within(Duration::from_secs(15));
    assert!(
        repo.head_paths()
            .contains(&"src/after-chmod.txt".to_owned()),
        "{:?}",
        repo.head_paths()
    );
}

#[test]
fn a_deep_tree_made_in_one_go_is_committed_completely() {
    let repo = Repo::new();
    let _daemon = Daemon::start(&repo, repo.config());
    let deep = repo.path("a/b/c/d/e/f/g/h");
    fs::create_dir_all(&deep).unwrap();
    let mut expected = Vec::new();
    for (i, dir) in ["a", "a/b", "a/b/c/d", "a/b/c/d/e/f/g/h"]
        .iter()
        .enumerate()
    {
        for j in 0..5 {
            let rel = format!("{dir}/file{i}{j}.txt");
            fs::write(repo.path(&rel), format!("{i}{j}")).unwrap();
            expected.push(rel);
        }
    }
    repo.wait_saved();
    let paths = repo.head_paths();
    for rel in expected {
        assert!(paths.contains(&rel), "{rel} missing from {paths:?}");
    }
}

#[test]
fn a_thousand_edits_become_one_commit() {
    let repo = Repo::new();
    for i in 0..1000 {
        repo.write(&format!("src/m{}/f{i}.txt", i % 10), "v1");
    }
    let mut config = repo.config();
    config.debounce = Duration::from_secs(1);
    config.max_delay = Duration::from_secs(30);
    let _daemon = Daemon::start(&repo, config);
    let before = repo.commit_count();
    for i in 0..1000 {
        repo.write(&format!("src/m{}/f{i}.txt", i % 10), "v2");
    }
    repo.wait_saved();
    assert_eq!(repo.commit_count(), before + 1);
    let message = repo.git(&["log", "-1", "--format=%B"]);
    assert!(
        message.starts_with("autosave: 1000 files in src\n"),
        "{message}"
    );
    assert!(message.contains("... and 980 more"), "{message}");
}

#[test]
fn gitignore_edits_add_and_remove_directories() {
    let repo = Repo::new();
    repo.write(".gitignore", "generated/\n");
    repo.write("generated/out.txt", "out");
    repo.write("docs/readme.md", "docs");
    let _daemon = Daemon::start(&repo, repo.config());
    assert!(!repo.head_paths().contains(&"generated/out.txt".to_owned()));

    repo.write(".gitignore", "docs/\n");
    repo.write("docs/new.md", "new");
    repo.wait_saved();
    let paths = repo.head_paths();
    assert!(paths.contains(&"generated/out.txt".to_owned()), "{paths:?}");
    // As git does: what is tracked stays tracked under the new rule, nothing new is added.
    assert!(paths.contains(&"docs/readme.md".to_owned()), "{paths:?}");
    assert!(!paths.contains(&"docs/new.md".to_owned()), "{paths:?}");
    // ... and edits to it are still saved, at once: its ignored directory stays watched.
    repo.write("docs/readme.md", "edited");
    until(PATIENCE, "the edit to the tracked ignored file", || {
        (repo.git(&["show", "HEAD:docs/readme.md"]) == "edited").then_some(())
    });

    // The un-ignored directory is watched now: a new file in it is saved too.
    repo.write("generated/later.txt", "later");
    repo.wait_saved();
    assert!(
        repo.head_paths()
            .contains(&"generated/later.txt".to_owned())
    );
}

/// The rules travel with each batch (the watch stage's snapshot): a batch that edits a rule
/// is saved by the new rule, even when the files it ignores came first.
#[test]
fn a_batch_that_edits_a_rule_is_saved_by_the_new_rule() {
    let repo = Repo::new();
    repo.write("keep.txt", "kept");
    let mut config = repo.config();
    // Long enough for every write below to fall into one batch.
    config.debounce = Duration::from_millis(800);
    let _daemon = Daemon::start(&repo, config);
    let commits = repo.commit_count();

    // The ignored files come first, the rule that ignores them last, all in one batch.
    repo.write("gen/out.txt", "generated");
    repo.write("gen/deep/more.txt", "generated");
    repo.write("app.log", "log");
    repo.write("second.txt", "second");
    let exclude = repo.path(".git/info/exclude");
    let mut text = fs::read_to_string(&exclude).unwrap();
    text.push_str("*.log\n");
    fs::write(&exclude, text).unwrap();
    repo.write(".gitignore", "gen/\n");
    repo.wait_saved();
    let paths = repo.head_paths();
    assert!(paths.contains(&"second.txt".to_owned()), "{paths:?}");
    assert!(paths.contains(&".gitignore".to_owned()), "{paths:?}");
    for ignored in ["gen/out.txt", "gen/deep/more.txt", "app.log"] {
        assert!(!paths.contains(&ignored.to_owned()), "{ignored}: {paths:?}");
    }
    assert_eq!(repo.commit_count(), commits + 1, "one batch, one commit");

    // Lifting the rule in a batch saves what it ignored, by the lifted rule.
    repo.write("gen/out.txt", "generated again");
    repo.write(".gitignore", "");
    repo.wait_saved();
    let paths = repo.head_paths();
    for now_kept in ["gen/out.txt", "gen/deep/more.txt"] {
        assert!(
            paths.contains(&now_kept.to_owned()),
            "{now_kept}: {paths:?}"
        );
    }
    assert!(!paths.contains(&"app.log".to_owned()), "{paths:?}");
    assert_eq!(repo.commit_count(), commits + 2);
}

#[test]
fn nested_gitignore_and_exclude_file_rules_apply() {
    let repo = Repo::new();
    repo.write("a/.gitignore", "*.tmp\n!keep.tmp\n");
    repo.write("a/x.tmp", "x");
    repo.write("a/keep.tmp", "k");
    repo.write("a/b/y.tmp", "y");
    let _daemon = Daemon::start(&repo, repo.config());
    let exclude = repo.path(".git/info/exclude");
    let mut text = fs::read_to_string(&exclude).unwrap();
    assert!(text.lines().any(|l| l == ".env"), "{text}");
    repo.write("private.txt", "p");
    text.push_str("private.txt\n");
    fs::write(&exclude, text).unwrap();
    repo.write("public.txt", "p");
    repo.wait_saved();
    let paths = repo.head_paths();
    assert!(paths.contains(&"a/keep.tmp".to_owned()), "{paths:?}");
    assert!(paths.contains(&"public.txt".to_owned()), "{paths:?}");
    assert!(!paths.contains(&"a/x.tmp".to_owned()), "{paths:?}");
    assert!(!paths.contains(&"a/b/y.tmp".to_owned()), "{paths:?}");
    assert!(!paths.contains(&"private.txt".to_owned()), "{paths:?}");
}

#[test]
fn env_names_go_to_the_manifest_and_values_nowhere() {
    let repo = Repo::new();
    let _daemon = Daemon::start(&repo, repo.config());
    repo.write(
        ".env",
        "API_KEY=topsecret-1\nthis line is not valid\nexport DB_URL=\"postgres://u:topsecret-2@h\"\n",
    );
    until(PATIENCE, "manifest with the env names", || {
        let text = fs::read_to_string(repo.path("shmastra.json")).ok()?;
        text.contains("DB_URL").then_some(())
    });
    repo.wait_saved();
    assert_eq!(
        fs::read_to_string(repo.path("shmastra.json")).unwrap(),
        "{\n  \"version\": 1,\n  \"env\": [\n    \"API_KEY\",\n    \"DB_URL\"\n  ]\n}\n"
    );
    assert!(!repo.head_paths().contains(&".env".to_owned()));
    let everything = repo.git(&["log", "-p", "--all"]);
    assert!(!everything.contains("topsecret"), "a value reached git");
    let status = fs::read_to_string(repo.path(".git/project-watcher/status.json")).unwrap();
    assert!(!status.contains("topsecret"));

    // A new value for the same names changes nothing.
    let commits = repo.commit_count();
    repo.write(".env", "API_KEY=other\nDB_URL=other\n");
    repo.write("marker.txt", "m");
    repo.wait_saved();
    assert_eq!(repo.commit_count(), commits + 1);
    assert_eq!(
        repo.git(&["diff", "--name-only", "HEAD~1", "HEAD"]).trim(),
        "marker.txt"
    );
}

#[test]
fn odd_names_symlinks_and_loops_are_saved_as_git_would() {
    let repo = Repo::new();
    let _daemon = Daemon::start(&repo, repo.config());
    repo.write("line\nbreak.txt", "newline in name");
    let invalid = repo.dir.join(OsStr::from_bytes(b"bad-\xff-utf8.txt"));
    fs::write(&invalid, "invalid utf-8 name").unwrap();
    repo.write("target.txt", "t");
    symlink("target.txt", repo.path("link")).unwrap();
    symlink("missing", repo.path("dangling")).unwrap();
    fs::create_dir_all(repo.path("loop")).unwrap();
    symlink("..", repo.path("loop/up")).unwrap();
    symlink("self", repo.path("self")).unwrap();
    repo.wait_saved();
    let paths = repo.head_paths();
    assert!(paths.contains(&"line\nbreak.txt".to_owned()), "{paths:?}");
    assert!(repo.head_entry("link").starts_with("120000 "));
    assert!(repo.head_entry("loop/up").starts_with("120000 "));
    assert!(repo.head_entry("self").starts_with("120000 "));
    let raw = git(&repo.dir, ["ls-tree", "-r", "-z", "--name-only", "HEAD"]);
    assert!(raw.contains("bad-\u{fffd}-utf8.txt"), "{raw:?}");
    let message = repo.git(&["log", "--format=%B"]);
    assert!(message.contains("\"line\\nbreak.txt\""), "{message}");
}

#[test]
fn nested_repositories_are_gitlinks_and_one_without_a_commit_is_left_out() {
    let repo = Repo::new();
    let with_commit = repo.path("vendor/lib");
    testkit::git::init_repo(&with_commit);
    fs::write(with_commit.join("lib.rs"), "lib").unwrap();
    git(&with_commit, ["add", "-A"]);
    git(&with_commit, ["commit", "-qm", "lib"]);
    let lib_head = git(&with_commit, ["rev-parse", "HEAD"]);
    testkit::git::init_repo(&repo.path("scratch"));
    fs::write(repo.path("scratch/notes.txt"), "n").unwrap();
    repo.write("main.txt", "main");
    let _daemon = Daemon::start(&repo, repo.config());
    let entry = repo.head_entry("vendor/lib");
    assert!(
        entry.starts_with("160000 commit ") && entry.contains(lib_head.trim()),
        "{entry}"
    );
    let paths = repo.head_paths();
    assert!(paths.contains(&"main.txt".to_owned()), "{paths:?}");
    assert!(!paths.iter().any(|p| p.starts_with("scratch")), "{paths:?}");
}

#[test]
fn a_malformed_gitignore_line_is_skipped_and_the_rest_applies() {
    let repo = Repo::new();
    repo.write(".gitignore", "a{b\n*.log\n");
    repo.write("x.log", "log");
    repo.write("x.txt", "txt");
    let _daemon = Daemon::start(&repo, repo.config());
    let paths = repo.head_paths();
    assert!(paths.contains(&"x.txt".to_owned()), "{paths:?}");
    assert!(!paths.contains(&"x.log".to_owned()), "{paths:?}");
}

#[test]
fn files_over_the_size_limit_are_left_out_and_reported() {
    let repo = Repo::new();
    let mut config = repo.config();
    config.max_file_size = 1000;
    let _daemon = Daemon::start(&repo, config);
    repo.write("big.bin", &"x".repeat(2000));
    repo.write("small.txt", "s");
    until(PATIENCE, "small.txt saved", || {
        repo.head_paths()
            .contains(&"small.txt".to_owned())
            .then_some(())
    });
    assert!(!repo.head_paths().contains(&"big.bin".to_owned()));
    let status = until(PATIENCE, "big.bin in the status", || {
        repo.status().filter(|s| !s.skipped_files.is_empty())
    });
    assert_eq!(status.skipped_files[0].path, "big.bin");
    assert_eq!(status.skipped_files[0].size, 2000);

    // Shrunk below the limit, it is saved and no longer reported.
    repo.write("big.bin", "now small");
    until(PATIENCE, "big.bin saved", || {
        repo.head_paths()
            .contains(&"big.bin".to_owned())
            .then_some(())
    });
    until(PATIENCE, "skipped list cleared", || {
        repo.status().filter(|s| s.skipped_files.is_empty())
    });
}

#[test]
fn a_reset_under_the_repo_lock_is_not_committed_again() {
    let repo = Repo::new();
    repo.write("a.txt", "one");
    let _daemon = Daemon::start(&repo, repo.config());
    repo.write("a.txt", "two");
    repo.wait_saved();
    let commits = repo.commit_count();
    let before = repo.git(&["rev-parse", "HEAD~1"]);
    {
        let _lock = project_watcher::lock::RepoLock::acquire(&repo.dir.join(".git")).unwrap();
        repo.git(&["reset", "-q", "--hard", "HEAD~1"]);
    }
    // A sentinel: once its save is in HEAD, the watcher has handled the reset's events too.
    repo.write("sentinel.txt", "after the reset");
    until(PATIENCE, "the sentinel saved", || {
        repo.head_paths()
            .contains(&"sentinel.txt".to_owned())
            .then_some(())
    });
    assert_eq!(repo.commit_count(), commits, "the reset was committed back");
    assert_eq!(repo.git(&["rev-parse", "HEAD~1"]), before);
    assert_eq!(repo.git(&["show", "HEAD:a.txt"]), "one");
    assert_eq!(fs::read_to_string(repo.path("a.txt")).unwrap(), "one");
}

#[test]
fn a_stale_index_lock_is_removed_and_saving_continues() {
    let repo = Repo::new();
    let lock = repo.path(".git/index.lock");
    fs::write(&lock, "").unwrap();
    let old = std::time::SystemTime::now() - Duration::from_secs(3600);
    fs::File::options()
        .write(true)
        .open(&lock)
        .unwrap()
        .set_modified(old)
        .unwrap();
    repo.write("a.txt", "a");
    let _daemon = Daemon::start(&repo, repo.config());
    assert!(!support::in_process::exists(&lock));
    assert!(repo.head_paths().contains(&"a.txt".to_owned()));
}

#[test]
fn a_second_watcher_on_the_same_repo_is_refused() {
    let repo = Repo::new();
    let _first = Daemon::start(&repo, repo.config());
    let second = Daemon::spawn(repo.config()).join().unwrap_err();
    assert_eq!(second.exit_code(), 3, "{second}");
    assert!(
        second.to_string().contains(&std::process::id().to_string()),
        "{second}"
    );
}

#[test]
fn not_a_repository_is_a_usage_error_that_says_how_to_fix_it() {
    let dir = tempfile::tempdir().unwrap();
    let err = Daemon::spawn(project_watcher::config::Config::new(dir.path()))
        .join()
        .unwrap_err();
    assert_eq!(err.exit_code(), 2);
    assert!(err.to_string().contains("git init"), "{err}");
}

/// The project removed under a running watcher (a wiped sandbox), and, with `remake`, a new
/// directory made at the same path at once (the sandbox re-created): the watcher stops with
/// exit code 2 and writes nothing there, not even its state directory.
fn check_project_removed(remake: bool) {
    let repo = Repo::new();
    repo.write("a.txt", "a\n");
    let daemon = Daemon::start(&repo, repo.config());
    repo.wait_saved();

    // The watcher may write its status file while `rm -rf` runs; a second pass finishes.
    until(PATIENCE, "the project to be removed", || {
        fs::remove_dir_all(&repo.dir).ok()
    });
    if remake {
        fs::create_dir(&repo.dir).unwrap();
        fs::write(repo.dir.join("new.txt"), "new\n").unwrap();
    }
    until(PATIENCE, "the watcher to stop", || {
        daemon.finished().then_some(())
    });

    let err = daemon.join().unwrap_err();
    assert!(matches!(err, DaemonError::Gone { .. }), "{err}");
    assert_eq!(err.exit_code(), 2, "a supervisor must not restart it there");
    if remake {
        let names: Vec<_> = fs::read_dir(&repo.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["new.txt"]);
    } else {
        assert!(
            !repo.dir.exists(),
            "nothing brought the removed directory back"
        );
    }
}

/// The project replaced in one step by another repository, complete with git's markers and
/// the watcher's state folder (a sandbox re-created at the same path between two saves): only
/// the directory's identity tells the watcher, which stops without saving into the new one.
#[test]
fn a_project_replaced_by_another_repository_stops_the_watcher_without_saving_there() {
    let repo = Repo::new();
    repo.write("a.txt", "a\n");
    let daemon = Daemon::start(&repo, repo.config());
    repo.wait_saved();
    let other = repo.dir.with_file_name("other");
    testkit::git::init_repo(&other);
    fs::write(other.join("b.txt"), "b\n").unwrap();
    git(&other, ["add", "-A"]);
    git(&other, ["commit", "-qm", "the new sandbox's"]);
    fs::create_dir(other.join(".git/project-watcher")).unwrap();
    let head = git(&other, ["rev-parse", "HEAD"]);

    until(PATIENCE, "the project to be removed", || {
        fs::remove_dir_all(&repo.dir).ok()
    });
    fs::rename(&other, &repo.dir).unwrap();
    until(PATIENCE, "the watcher to stop", || {
        daemon.finished().then_some(())
    });

    let err = daemon.join().unwrap_err();
    assert!(matches!(err, DaemonError::Gone { .. }), "{err}");
    assert_eq!(git(&repo.dir, ["rev-parse", "HEAD"]), head);
    assert_eq!(git(&repo.dir, ["status", "--porcelain"]), "");
    assert!(!repo.dir.join("shmastra.json").exists());
}

#[test]
fn a_project_removed_under_the_watcher_stops_it() {
    check_project_removed(false);
}

#[test]
fn a_project_removed_and_made_again_stops_the_watcher_without_touching_the_new_one() {
    check_project_removed(true);
}

#[test]
fn a_directory_replaced_by_a_file_and_back_is_saved() {
    let repo = Repo::new();
    repo.write("thing/inner/a.txt", "a");
    repo.write("other", "file");
    let _daemon = Daemon::start(&repo, repo.config());
    fs::rename(repo.path("thing"), repo.path("moved")).unwrap();
    repo.write("thing", "now a file");
    fs::remove_file(repo.path("other")).unwrap();
    repo.write("other/inside.txt", "now a directory");
    repo.wait_saved();
    let paths = repo.head_paths();
    assert!(paths.contains(&"thing".to_owned()), "{paths:?}");
    assert!(paths.contains(&"other/inside.txt".to_owned()), "{paths:?}");
    assert!(paths.contains(&"moved/inner/a.txt".to_owned()), "{paths:?}");
}

#[test]
fn a_directory_renamed_away_and_made_again_is_still_watched() {
    let repo = Repo::new();
    repo.write("dir/a.txt", "a");
    let _daemon = Daemon::start(&repo, repo.config());
    fs::rename(repo.path("dir"), repo.path("gone")).unwrap();
    repo.write("dir/b.txt", "b");
    repo.wait_saved();
    repo.write("dir/c.txt", "written after the watcher settled");
    repo.wait_saved();
    assert!(repo.head_paths().contains(&"dir/c.txt".to_owned()));
}

#[test]
fn core_excludes_file_is_respected_and_reloaded_when_edited() {
    let repo = Repo::new();
    let outside = tempfile::tempdir().unwrap();
    let excludes = outside.path().join("global-ignore");
    fs::write(&excludes, "*.swp\n").unwrap();
    repo.git(&["config", "core.excludesFile", excludes.to_str().unwrap()]);
    repo.write("notes.swp", "editor swap file");
    repo.write("notes.md", "notes");
    repo.write("scratch.tmp", "scratch");
    let _daemon = Daemon::start(&repo, repo.config());
    let paths = repo.head_paths();
    assert!(!paths.contains(&"notes.swp".to_owned()), "{paths:?}");
    assert!(paths.contains(&"scratch.tmp".to_owned()), "{paths:?}");

    fs::write(&excludes, "*.swp\n*.tmp\n").unwrap();
    repo.write("later.tmp", "later");
    repo.wait_saved();
    let paths = repo.head_paths();
    // Tracked before the rule, so git keeps it; the new one is ignored.
    assert!(paths.contains(&"scratch.tmp".to_owned()), "{paths:?}");
    assert!(!paths.contains(&"later.tmp".to_owned()), "{paths:?}");
    assert!(paths.contains(&"notes.md".to_owned()), "{paths:?}");
}
