//! The `project-watcher` binary as PM2 and a developer run it: exit codes, signals, the
//! status command, `once`.

mod support;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use project_watcher::status::{self, State};
use support::PATIENCE;
use support::in_process::Repo;
use testkit::wait::until;

fn watcher(repo_dir: &Path, home: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_project-watcher"));
    for (k, v) in testkit::git::hermetic_env(home) {
        cmd.env(k, v);
    }
    cmd.env_remove("PROJECT_DIR")
        .env_remove("PROJECT_TOKEN")
        .env_remove("WATCHER_DEBOUNCE")
        .env_remove("WATCHER_MAX_DELAY")
        .env_remove("PROJECT_WATCHER_DEBOUNCE")
        .env_remove("PROJECT_WATCHER_MAX_DELAY")
        .env_remove("RUST_LOG")
        .env_remove("PROJECT_WATCHER_NETWORK_TIMEOUT")
        .current_dir(repo_dir)
        .args(args);
    cmd
}

fn spawn_watch(repo: &Repo, home: &Path, debounce: &str) -> Child {
    watcher(
        &repo.dir,
        home,
        &[
            "watch",
            "--debounce",
            debounce,
            "--max-delay",
            "60s",
            "--log-format",
            "json",
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .expect("the watcher starts")
}

fn wait_ready(repo: &Repo, child: &mut Child) -> status::Status {
    until(PATIENCE, "the watcher to be ready", || {
        if let Ok(Some(code)) = child.try_wait() {
            panic!("the watcher exited during start-up: {code}");
        }
        repo.status().filter(|s| s.pid == child.id())
    })
}

fn signal(child: &Child, signal: libc::c_int) {
    #[allow(unsafe_code)]
    // SAFETY: kill(2) with the pid of our own child and a valid signal number.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, signal) };
    assert_eq!(rc, 0);
}

fn finish(child: Child) -> Output {
    let out = child.wait_with_output().expect("wait for the watcher");
    assert!(out.status.code().is_some(), "killed by a signal: {out:?}");
    out
}

#[test]
fn start_up_commits_and_sigint_saves_the_pending_change_then_exits_0() {
    let repo = Repo::new();
    let home = tempfile::tempdir().unwrap();
    repo.write("tracked.txt", "v1");
    repo.git(&["add", "-A"]);
    repo.git(&["commit", "-qm", "first"]);
    repo.write("tracked.txt", "uncommitted");
    let mut child = spawn_watch(&repo, home.path(), "30s");
    let ready = wait_ready(&repo, &mut child);
    assert_eq!(ready.state, State::Idle);
    assert_eq!(repo.commit_count(), 2, "start-up commits uncommitted work");

    repo.write("pending.txt", "saved on SIGINT");
    until(PATIENCE, "the watcher to see the change", || {
        repo.status().filter(|s| s.state == State::Pending)
    });
    signal(&child, libc::SIGINT);
    let out = finish(child);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(repo.head_paths().contains(&"pending.txt".to_owned()));
    assert_eq!(repo.commit_count(), 3);
    let logs = String::from_utf8_lossy(&out.stderr);
    let ready_line = logs
        .lines()
        .find(|l| l.contains("\"ready\""))
        .unwrap_or_else(|| panic!("no ready line in {logs}"));
    serde_json::from_str::<serde_json::Value>(ready_line).expect("JSON log lines");
    assert!(logs.contains("commits stay local"), "{logs}");
}

#[test]
fn sigterm_also_saves_and_a_second_watcher_exits_3() {
    let repo = Repo::new();
    let home = tempfile::tempdir().unwrap();
    let mut first = spawn_watch(&repo, home.path(), "30s");
    wait_ready(&repo, &mut first);

    let second = watcher(&repo.dir, home.path(), &["watch"])
        .output()
        .unwrap();
    assert_eq!(second.status.code(), Some(3));
    let message = String::from_utf8_lossy(&second.stderr);
    assert!(message.contains(&first.id().to_string()), "{message}");

    repo.write("late.txt", "late");
    until(PATIENCE, "the watcher to see the change", || {
        repo.status().filter(|s| s.state == State::Pending)
    });
    signal(&first, libc::SIGTERM);
    let out = finish(first);
    assert_eq!(out.status.code(), Some(0));
    assert!(repo.head_paths().contains(&"late.txt".to_owned()));
}

#[test]
fn usage_errors_exit_2_with_a_clear_message() {
    let home = tempfile::tempdir().unwrap();
    let plain = tempfile::tempdir().unwrap();
    let out = watcher(plain.path(), home.path(), &["watch"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let message = String::from_utf8_lossy(&out.stderr);
    assert!(message.contains("git init"), "{message}");

    let repo = Repo::new();
    for args in [
        &["watch", "--debounce", "soon"][..],
        &["watch", "--max-file-size", "lots"],
        &["watch", "--debounce", "10s", "--max-delay", "1s"],
        &["watch", "--log-format", "xml"],
        &["frobnicate"],
    ] {
        let out = watcher(&repo.dir, home.path(), args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(!out.stderr.is_empty(), "{args:?}");
    }
    for timeout in ["soon", "0s"] {
        let out = watcher(&repo.dir, home.path(), &["watch"])
            .env("PROJECT_WATCHER_NETWORK_TIMEOUT", timeout)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{timeout}");
        let message = String::from_utf8_lossy(&out.stderr);
        assert!(
            message.contains("PROJECT_WATCHER_NETWORK_TIMEOUT") && message.contains(timeout),
            "{message}"
        );
    }
}

#[test]
fn once_commits_without_a_watcher_and_status_reports() {
    let repo = Repo::new();
    let home = tempfile::tempdir().unwrap();
    repo.write("a.txt", "a");
    let out = watcher(&repo.dir, home.path(), &["once", "--log-format", "json"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(repo.head_paths().contains(&"a.txt".to_owned()));
    let again = watcher(&repo.dir, home.path(), &["once"]).output().unwrap();
    assert_eq!(again.status.code(), Some(0));
    assert_eq!(repo.commit_count(), 1, "nothing changed, no commit");

    let missing = watcher(&repo.dir, home.path(), &["status"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(3), "no watcher runs");
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no watcher is running"));

    let mut child = spawn_watch(&repo, home.path(), "200ms");
    wait_ready(&repo, &mut child);
    let human = watcher(&repo.dir, home.path(), &["status"])
        .output()
        .unwrap();
    assert_eq!(human.status.code(), Some(0));
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(text.contains("state:            idle"), "{text}");
    let json = watcher(&repo.dir, home.path(), &["status", "--json"])
        .output()
        .unwrap();
    let parsed: status::Status = serde_json::from_slice(&json.stdout).expect("status JSON");
    assert_eq!(parsed.pid, child.id());
    signal(&child, libc::SIGINT);
    assert_eq!(finish(child).status.code(), Some(0));
    let stopped = watcher(&repo.dir, home.path(), &["status"])
        .output()
        .unwrap();
    assert_eq!(stopped.status.code(), Some(3), "the watcher stopped");
    let text = String::from_utf8_lossy(&stopped.stdout);
    assert!(text.contains("state:            stopped"), "{text}");
}

/// Runs `args` with stderr on a pseudo-terminal; returns the exit code and what it printed.
fn on_a_terminal(mut cmd: Command) -> (Option<i32>, String) {
    use std::io::Read as _;
    use std::os::fd::{FromRawFd as _, OwnedFd};
    let (mut master, mut slave) = (0, 0);
    #[allow(unsafe_code)]
    // SAFETY: openpty(3) writes two new descriptors into the two ints; the rest may be null.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty");
    #[allow(unsafe_code)]
    // SAFETY: both descriptors were just opened and are owned by nothing else.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let status = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::from(slave))
        .status()
        .unwrap();
    // The command holds the terminal's other end until it is dropped.
    drop(cmd);
    let mut text = Vec::new();
    // The terminal's side reads until EIO once the child (its only other holder) is gone.
    let _ = std::fs::File::from(master).read_to_end(&mut text);
    (
        status.code(),
        String::from_utf8_lossy(&text).replace("\r\n", "\n"),
    )
}

/// A start-up error: exactly one plain line `project-watcher: ...` (no log line, no JSON),
/// piped or on a terminal, with exit 2; returns it.
fn start_error(dir: &Path, home: &Path, args: &[&str]) -> String {
    let mut full = args.to_vec();
    full.extend(["--dir", dir.to_str().unwrap()]);
    let piped = watcher(home, home, &full).output().unwrap();
    let text = String::from_utf8_lossy(&piped.stderr).into_owned();
    assert_eq!(piped.status.code(), Some(2), "{args:?}: {text}");
    let (code, on_terminal) = on_a_terminal(watcher(home, home, &full));
    assert_eq!(code, Some(2), "{args:?} on a terminal: {on_terminal}");
    for shown in [&text, &on_terminal] {
        assert_eq!(
            shown.lines().count(),
            1,
            "{args:?}: one line, got {shown:?}"
        );
        assert!(
            shown.starts_with("project-watcher: "),
            "{args:?}: {shown:?}"
        );
        assert!(
            shown.ends_with('\n') && !shown.contains('\u{1b}'),
            "{shown:?}"
        );
    }
    assert_eq!(text, on_terminal, "{args:?}: the same line either way");
    assert!(
        !text.contains("class=") && !text.contains("code="),
        "{args:?}: libgit2's internals in {text:?}"
    );
    text
}

const START_COMMANDS: [&[&str]; 5] = [
    &["watch", "--log-format", "json"],
    &["once"],
    &["history"],
    &["restore"],
    &["restore", "--at", "1h"],
];

#[test]
fn start_errors_are_one_plain_line_whose_hint_fits_the_case() {
    let home = tempfile::tempdir().unwrap();
    let plain = tempfile::tempdir().unwrap();
    let repo = Repo::new();
    let sub = repo.path("src/deep");
    std::fs::create_dir_all(&sub).unwrap();
    let missing = plain.path().join("no such folder");
    let file = repo.path("a file");
    std::fs::write(&file, "x").unwrap();
    for args in START_COMMANDS {
        let text = start_error(plain.path(), home.path(), args);
        assert!(text.contains("git init"), "{args:?}: {text}");

        let text = start_error(&sub, home.path(), args);
        assert!(
            !text.contains("git init"),
            "{args:?}: a nested repository: {text}"
        );
        let hint = format!("pass --dir {}", repo.dir.display());
        assert!(text.contains(&hint), "{args:?}: {text}");

        let text = start_error(&missing, home.path(), args);
        assert!(text.contains("does not exist"), "{args:?}: {text}");
        assert!(!text.contains("git init"), "{args:?}: {text}");

        let text = start_error(&file, home.path(), args);
        assert!(text.contains("is not a directory"), "{args:?}: {text}");
    }
    let status = watcher(home.path(), home.path(), &["status", "--dir"])
        .arg(&sub)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&status.stderr);
    assert_eq!(status.status.code(), Some(2), "{text}");
    assert!(
        text.contains(&format!("pass --dir {}", repo.dir.display())),
        "{text}"
    );
}

/// git refuses a repository another user owns; the watcher says so and how to trust it. Root
/// is trusted everywhere, so the test runs the watcher as `nobody` on a repository root owns.
#[test]
fn a_repository_owned_by_another_user_is_named_as_such() {
    use std::os::unix::fs::PermissionsExt as _;
    use std::os::unix::process::CommandExt as _;
    #[allow(unsafe_code)]
    // SAFETY: geteuid(2) has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this test needs root, to make a repository another user owns"
    );
    let repo = Repo::new();
    let home = tempfile::tempdir().unwrap();
    for dir in [repo.dir.parent().unwrap(), &repo.dir, home.path()] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    for args in START_COMMANDS {
        let mut cmd = watcher(home.path(), home.path(), args);
        cmd.arg("--dir").arg(&repo.dir).uid(65534).gid(65534);
        let out = cmd.output().unwrap();
        let text = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {text}");
        assert_eq!(text.lines().count(), 1, "{args:?}: {text}");
        assert!(text.contains("belongs to another user"), "{args:?}: {text}");
        assert!(text.contains("safe.directory"), "{args:?}: {text}");
        assert!(!text.contains("git init"), "{args:?}: {text}");
    }
}

/// What git says reaches the user as git's message: never libgit2's `class=...; code=...`.
#[test]
fn failures_name_no_libgit2_internals() {
    let repo = Repo::new();
    let home = tempfile::tempdir().unwrap();
    repo.write("a.txt", "a");
    let once = watcher(&repo.dir, home.path(), &["once"]).output().unwrap();
    assert_eq!(once.status.code(), Some(0));
    let check = |args: &[&str], code: i32| {
        let out = watcher(&repo.dir, home.path(), args).output().unwrap();
        let text = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {text}");
        assert_eq!(text.lines().count(), 1, "{args:?}: {text}");
        assert!(
            !text.contains("class=") && !text.contains("code="),
            "{args:?}: {text}"
        );
    };
    check(&["show", "0000000"], 2);
    check(&["show", "no-such-save"], 2);
    check(&["show", "--json", "no-such-save"], 2);
    check(&["restore", "--at", "0000000"], 2);
    // The branch names an object the repository does not hold: libgit2 fails reading it.
    let branch = repo.git(&["symbolic-ref", "HEAD"]);
    std::fs::write(
        repo.dir.join(".git").join(branch.trim()),
        format!("{}\n", "1".repeat(40)),
    )
    .unwrap();
    check(&["history"], 1);
    check(&["show", "HEAD"], 2);
    check(&["show", "--json", "HEAD"], 2);
}

/// `status --json` of a stopped watcher says it is not running, with no process figures,
/// and its `head` is the repository's after a `restore --at` made while it was stopped.
#[test]
fn status_json_of_a_stopped_watcher_says_so_and_follows_a_restore() {
    let repo = Repo::new();
    let home = tempfile::tempdir().unwrap();
    repo.write("a.txt", "first");
    let mut child = spawn_watch(&repo, home.path(), "200ms");
    wait_ready(&repo, &mut child);
    let first = repo.git(&["rev-parse", "HEAD"]).trim().to_owned();
    repo.write("a.txt", "second");
    until(PATIENCE, "the second save", || {
        (repo.git(&["rev-parse", "HEAD"]).trim() != first).then_some(())
    });
    signal(&child, libc::SIGINT);
    assert_eq!(finish(child).status.code(), Some(0));

    let restored = watcher(&repo.dir, home.path(), &["restore", "--at", &first])
        .output()
        .unwrap();
    assert_eq!(restored.status.code(), Some(0), "{restored:?}");
    let head = repo.git(&["rev-parse", "HEAD"]).trim().to_owned();
    let branch = repo.git(&["branch", "--show-current"]).trim().to_owned();

    let out = watcher(&repo.dir, home.path(), &["status", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "not running");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    assert_eq!(json["running"], false, "{json}");
    assert_eq!(json["state"], "stopped", "{json}");
    assert_eq!(json["head"], head.as_str(), "{json}");
    assert_eq!(json["branch"], branch.as_str(), "{json}");
    assert!(
        json["rss_bytes"].is_null() && json["cpu_ms"].is_null(),
        "{json}"
    );

    let human = watcher(&repo.dir, home.path(), &["status"])
        .output()
        .unwrap();
    assert_eq!(human.status.code(), Some(3));
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(
        text.contains(&format!("head:             {head}")),
        "{text}"
    );
}

#[test]
fn help_matches_what_each_command_does() {
    let home = tempfile::tempdir().unwrap();
    let help = |args: &[&str]| {
        let out = watcher(home.path(), home.path(), args).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let once = help(&["once", "--help"]);
    for watch_only in ["--debounce", "--max-delay", "--shutdown-timeout", "`watch`"] {
        assert!(
            !once.contains(watch_only),
            "once --help offers {watch_only}: {once}"
        );
    }
    let refused = watcher(home.path(), home.path(), &["once", "--debounce", "1s"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    let watch = help(&["watch", "--help"]);
    for flag in [
        "--debounce",
        "--max-delay",
        "--shutdown-timeout",
        "--no-push",
    ] {
        assert!(watch.contains(flag), "{watch}");
    }
    let top = help(&["--help"]);
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("the README");
    assert!(
        top.contains("Exit codes: 0") && top.contains("3 `status`: no watcher"),
        "{top}"
    );
    assert!(
        readme.contains("exit codes"),
        "the README lacks the exit codes"
    );
    for var in [
        "PROJECT_DIR",
        "PROJECT_REMOTE",
        "PROJECT_BRANCH",
        "PROJECT_TOKEN",
        "PROJECT_WATCHER_DEBOUNCE",
        "PROJECT_WATCHER_MAX_DELAY",
        "PROJECT_WATCHER_NETWORK_TIMEOUT",
        "PROJECT_WATCHER_MIN_FREE_DISK",
        "PROJECT_WATCHER_SYNC_STEP_FILE",
        "WATCHER_DEBOUNCE",
        "WATCHER_MAX_DELAY",
        "RUST_LOG",
    ] {
        assert!(top.contains(var), "--help lacks {var}");
        assert!(readme.contains(var), "the README lacks {var}");
    }
}

/// The settings' env vars, new names and old: a contradiction between them is refused, which
/// only happens when both were read.
#[test]
fn both_env_names_of_a_setting_are_read_and_the_new_one_wins() {
    let repo = Repo::new();
    let home = tempfile::tempdir().unwrap();
    // A watcher that starts instead of refusing is stopped once it is ready (code `None`).
    let run = |env: &[(&str, &str)]| {
        let mut child = watcher(&repo.dir, home.path(), &["watch", "--log-format", "json"])
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let code = until(PATIENCE, "the watcher to refuse or start", || {
            match child.try_wait().unwrap() {
                Some(status) => Some(status.code()),
                None => repo.status().filter(|s| s.pid == child.id()).map(|_| None),
            }
        });
        if code.is_none() {
            signal(&child, libc::SIGINT);
        }
        let out = finish(child);
        (code, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    for (debounce, max_delay) in [
        ("PROJECT_WATCHER_DEBOUNCE", "PROJECT_WATCHER_MAX_DELAY"),
        ("WATCHER_DEBOUNCE", "WATCHER_MAX_DELAY"),
        ("PROJECT_WATCHER_DEBOUNCE", "WATCHER_MAX_DELAY"),
    ] {
        let (code, text) = run(&[(debounce, "10s"), (max_delay, "1s")]);
        assert_eq!(code, Some(2), "{debounce} {max_delay}: {text}");
        assert!(text.contains("must not be shorter"), "{text}");
    }
    let (code, text) = run(&[("WATCHER_DEBOUNCE", "soon")]);
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("WATCHER_DEBOUNCE") && text.contains("soon"),
        "{text}"
    );
    // The new name wins: the old one's nonsense is not read.
    let mut child = watcher(&repo.dir, home.path(), &["watch", "--log-format", "json"])
        .envs([
            ("PROJECT_WATCHER_DEBOUNCE", "200ms"),
            ("WATCHER_DEBOUNCE", "soon"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_ready(&repo, &mut child);
    signal(&child, libc::SIGINT);
    assert_eq!(finish(child).status.code(), Some(0));
}

/// `-q` and `-v` step the level, `RUST_LOG` decides without them; the JSON lines' shape.
#[test]
fn q_and_v_set_the_log_level_and_rust_log_still_works() {
    let repo = Repo::new();
    let home = tempfile::tempdir().unwrap();
    let mut n = 0;
    let mut messages = |args: &[&str], rust_log: Option<&str>| {
        n += 1;
        repo.write("a.txt", &n.to_string());
        let mut all = vec!["once", "--log-format", "json"];
        all.extend(args);
        let mut cmd = watcher(&repo.dir, home.path(), &all);
        if let Some(filter) = rust_log {
            cmd.env("RUST_LOG", filter);
        }
        let out = cmd.output().unwrap();
        let logs = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(0), "{logs}");
        logs.lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("JSON lines"))
            .collect::<Vec<_>>()
    };
    let levels = |lines: &[serde_json::Value]| {
        let mut seen: Vec<String> = lines
            .iter()
            .map(|l| l["level"].as_str().unwrap().to_owned())
            .collect();
        seen.sort();
        seen.dedup();
        seen
    };
    let default = messages(&[], None);
    assert!(levels(&default).contains(&"INFO".to_owned()), "{default:?}");
    for line in &default {
        for key in ["timestamp", "level", "message", "target"] {
            assert!(line.get(key).is_some(), "{key} missing: {line}");
        }
        assert!(line.get("fields").is_none(), "nested fields: {line}");
    }
    assert!(!levels(&messages(&["-q"], None)).contains(&"INFO".to_owned()));
    assert!(!levels(&messages(&[], Some("warn"))).contains(&"INFO".to_owned()));
    // The flag wins: `-v` (debug) over `RUST_LOG=warn`.
    assert!(levels(&messages(&["-v"], Some("warn"))).contains(&"INFO".to_owned()));
    assert!(
        levels(&messages(&["-q"], Some("info"))) == ["WARN"],
        "-q: warnings still shown"
    );
}

/// `history`'s text: every column starts at the same place on every line, whatever the
/// save's kind (`autosave`, `restore`, `other`) and file count.
#[test]
fn history_columns_line_up() {
    let repo = Repo::new();
    let home = tempfile::tempdir().unwrap();
    repo.write("a.txt", "a");
    assert!(
        watcher(&repo.dir, home.path(), &["once"])
            .status()
            .unwrap()
            .success()
    );
    let first = repo.git(&["rev-parse", "HEAD"]).trim().to_owned();
    for (i, name) in ["b.txt", "c.txt", "d.txt"].iter().enumerate() {
        repo.write(name, &i.to_string());
    }
    assert!(
        watcher(&repo.dir, home.path(), &["once"])
            .status()
            .unwrap()
            .success()
    );
    let restored = watcher(&repo.dir, home.path(), &["restore", "--at", &first])
        .output()
        .unwrap();
    assert!(restored.status.success(), "{restored:?}");
    repo.write("by-hand.txt", "x");
    repo.git(&["add", "by-hand.txt"]);
    repo.git(&["commit", "-qm", "by hand"]);
    let out = watcher(&repo.dir, home.path(), &["history"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<&str> = text.lines().filter(|l| !l.starts_with("branch ")).collect();
    let kinds: Vec<&str> = rows
        .iter()
        .map(|r| r.split_whitespace().nth(2).unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["other", "restore", "autosave", "autosave"],
        "{text}"
    );
    // Where each column starts: after a run of two spaces, the first five columns.
    let starts = |row: &str| {
        let mut at = vec![0];
        let bytes = row.as_bytes();
        for i in 2..bytes.len() {
            if at.len() < 6 && bytes[i - 2] == b' ' && bytes[i - 1] == b' ' && bytes[i] != b' ' {
                at.push(i);
            }
        }
        at
    };
    let first_row = starts(rows[0]);
    assert_eq!(first_row.len(), 6, "{text}");
    for row in &rows {
        // The files column is right-aligned: compare where it ends, and the rest's starts.
        let at = starts(row);
        assert_eq!(at[..4], first_row[..4], "{text}");
        assert_eq!(at[5], first_row[5], "{text}");
    }
}
