//! The `project-watcher` binary as PM2 and a developer run it: exit codes, signals, the
//! status command, `once`.

mod common;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use common::{PATIENCE, Repo};
use project_watcher::status::{self, State};
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
