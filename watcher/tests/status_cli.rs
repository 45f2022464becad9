//! `project-watcher status`: finds the status file under `.git/`, prints it for people and as
//! JSON, and says clearly when there is none.

use std::process::Command;

use testkit::git::{hermetic_env, init_repo};

const BIN: &str = env!("CARGO_BIN_EXE_project-watcher");

fn status(dir: &std::path::Path, home: &std::path::Path, json: bool) -> std::process::Output {
    let mut cmd = Command::new(BIN);
    cmd.arg("status").arg("--dir").arg(dir);
    if json {
        cmd.arg("--json");
    }
    for (k, v) in hermetic_env(home) {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// Holds the instance lock as a running watcher does.
fn pretend_running(repo: &std::path::Path) -> project_watcher::lock::InstanceLock {
    project_watcher::lock::InstanceLock::try_acquire(&repo.join(".git")).unwrap()
}

#[test]
fn status_reads_the_file_under_dot_git_and_prints_both_forms() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("p");
    init_repo(&repo);
    let _running = pretend_running(&repo);
    let written = project_watcher::status::Status {
        state: project_watcher::status::State::Backoff,
        unpushed_commits: 4,
        last_push_error: Some("server answered 500".into()),
        ..Default::default()
    };
    project_watcher::status::write(&repo.join(".git"), &written).unwrap();

    let out = status(&repo, tmp.path(), true);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let read: project_watcher::status::Status = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(read, written);

    let out = status(&repo, tmp.path(), false);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("state:            backoff"), "{text}");
    assert!(text.contains("unpushed commits: 4"), "{text}");
}

#[test]
fn status_without_a_watcher_or_a_file_says_so_and_exits_3() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("p");
    init_repo(&repo);
    let out = status(&repo, tmp.path(), false);
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no watcher is running"), "{err}");
}

#[test]
fn a_running_watcher_without_a_file_yet_is_a_runtime_error() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("p");
    init_repo(&repo);
    let _running = pretend_running(&repo);
    let out = status(&repo, tmp.path(), false);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(".git/project-watcher/status.json"), "{err}");
}

#[test]
fn a_stopped_watcher_s_last_status_is_shown_as_stopped_with_exit_3() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("p");
    init_repo(&repo);
    let left = project_watcher::status::Status {
        state: project_watcher::status::State::Idle,
        pid: 4_000_000,
        ..Default::default()
    };
    project_watcher::status::write(&repo.join(".git"), &left).unwrap();
    // A watcher that ran and stopped leaves its lock file behind, unlocked.
    drop(pretend_running(&repo));

    let out = status(&repo, tmp.path(), false);
    assert_eq!(out.status.code(), Some(3));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("state:            stopped"), "{text}");
    assert!(!text.contains("state:            idle"), "{text}");
    assert!(text.contains("not running (was pid 4000000"), "{text}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no watcher is running"), "{err}");

    let out = status(&repo, tmp.path(), true);
    assert_eq!(out.status.code(), Some(3));
    let read: project_watcher::status::Status = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(read, left);
}
