//! `project-watcher restore` and `sync` as PM2 and the cloud run them: the real binary, real
//! git remotes on disk, exit codes and files as the outcome. Also: a running watcher stays
//! consistent across a sync (the reset never comes back as a commit).

use std::fs;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use testkit::git::{
    SavedProject, git, hermetic_env, init_bare, init_repo, tree_of, tree_of_add_all,
};
use testkit::wait::{PATIENCE, until};

const BIN: &str = env!("CARGO_BIN_EXE_project-watcher");

/// The saved project these tests start from; its helpers are below.
struct Setup(SavedProject);

impl Deref for Setup {
    type Target = SavedProject;
    fn deref(&self) -> &SavedProject {
        &self.0
    }
}

/// A remote holding a saved project, a sandbox that has it checked out, a laptop clone.
fn setup() -> Setup {
    Setup(SavedProject::new(&[
        ("package.json", "{\"name\": \"app\"}\n"),
        ("app.ts", "v1\n"),
        ("old.txt", "the laptop deletes this\n"),
    ]))
}

impl Setup {
    fn watcher(&self) -> Command {
        let mut cmd = Command::new(BIN);
        for (k, v) in hermetic_env(self.tmp.path()) {
            cmd.env(k, v);
        }
        cmd.env_remove("PROJECT_TOKEN")
            .env_remove("PROJECT_DIR")
            .env("RUST_LOG", "info");
        cmd
    }

    fn run(&self, args: &[&str]) -> Output {
        self.watcher().args(args).output().unwrap()
    }

    fn push_from_laptop(&self) {
        fs::write(self.laptop.join("app.ts"), "v2 from the laptop\n").unwrap();
        fs::remove_file(self.laptop.join("old.txt")).unwrap();
        git(&self.laptop, ["add", "-A"]);
        git(&self.laptop, ["commit", "-qm", "from the laptop"]);
        git(&self.laptop, ["push", "-q", "origin", "main"]);
    }

    fn failure_file(&self) -> PathBuf {
        self.tmp.path().join("sync-failure")
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn restore_exits_0_and_changes_nothing_for_a_new_user() {
    let tmp = tempfile::tempdir().unwrap();
    let remote = tmp.path().join("remote.git");
    let project = tmp.path().join("project");
    init_bare(&remote);
    init_repo(&project);
    fs::write(project.join("template.ts"), "template\n").unwrap();
    git(
        &project,
        ["remote", "add", "project", remote.to_str().unwrap()],
    );

    let out = Command::new(BIN)
        .envs(hermetic_env(tmp.path()))
        .args(["restore", "--dir", project.to_str().unwrap()])
        .output()
        .unwrap();

    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        fs::read_to_string(project.join("template.ts")).unwrap(),
        "template\n"
    );
    assert!(tree_of(&project, "HEAD").is_none());
}

#[test]
fn restore_without_the_remote_is_a_usage_error_naming_it() {
    let s = setup();
    let out = s.run(&[
        "restore",
        "--dir",
        s.sandbox.to_str().unwrap(),
        "--remote",
        "nope",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("`nope`"), "{}", stderr(&out));
}

#[test]
fn sync_pulls_the_laptops_push_and_removes_the_failure_file() {
    let s = setup();
    s.push_from_laptop();
    fs::write(s.failure_file(), "step: install\n").unwrap();

    let out = s.run(&[
        "sync",
        "--dir",
        s.sandbox.to_str().unwrap(),
        "--failure-file",
        s.failure_file().to_str().unwrap(),
        "--install-cmd",
        "echo should not run; exit 1",
    ]);

    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        tree_of_add_all(&s.sandbox),
        tree_of(&s.remote, "main").unwrap()
    );
    assert!(!s.failure_file().exists());
    // Its log line holds plain values, and no field for what did not happen.
    let logs = stderr(&out);
    assert!(!logs.contains("Some(") && !logs.contains("None"), "{logs}");
    let done: serde_json::Value = logs
        .lines()
        .find(|l| l.contains("sync done"))
        .map(|l| serde_json::from_str(l).expect("a JSON log line"))
        .unwrap_or_else(|| panic!("no `sync done` line in {logs}"));
    let tip = git(&s.remote, ["rev-parse", "main"]);
    assert_eq!(done["commit"], tip.trim(), "{done}");
    assert!(done.get("installed_with").is_none(), "{done}");
}

#[test]
fn sync_with_a_failing_install_exits_1_and_leaves_the_output_tail() {
    let s = setup();
    fs::write(s.laptop.join("package.json"), "{\"name\": \"app2\"}\n").unwrap();
    git(&s.laptop, ["commit", "-qam", "rename the package"]);
    git(&s.laptop, ["push", "-q", "origin", "main"]);

    let out = s.run(&[
        "sync",
        "--dir",
        s.sandbox.to_str().unwrap(),
        "--failure-file",
        s.failure_file().to_str().unwrap(),
        "--install-cmd",
        "echo 'npm ERR! code E404'; exit 1",
        "--start-cmd",
        "touch started",
    ]);

    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let failure = fs::read_to_string(s.failure_file()).unwrap();
    assert!(failure.starts_with("step: install\n"), "{failure}");
    assert!(failure.contains("npm ERR! code E404"), "{failure}");
    let parsed = shmastra_contract::SyncFailure::parse(failure.as_bytes());
    assert_eq!(parsed.step, "install");
    assert!(
        parsed.message.contains("echo 'npm ERR! code E404'; exit 1"),
        "{parsed:?}"
    );
    assert_eq!(parsed.tail, "npm ERR! code E404");
    assert!(!s.sandbox.join("started").exists());
}

/// Kills the watcher when the test ends, however it ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn remote_has(remote: &Path, path: &str) -> bool {
    testkit::git::git_output(remote, ["cat-file", "-e", &format!("main:{path}")])
        .status
        .success()
}

#[test]
fn a_running_watcher_commits_only_the_users_changes_after_a_sync() {
    let s = setup();
    let watcher = Running(
        s.watcher()
            .args([
                "watch",
                "--dir",
                s.sandbox.to_str().unwrap(),
                "--debounce",
                "200ms",
                "--max-delay",
                "2s",
                "--log-format",
                "json",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // The watcher is up once it has saved and pushed a first edit.
    fs::write(s.sandbox.join("warmup.txt"), "up\n").unwrap();
    until(PATIENCE, "the watcher to push the warm-up edit", || {
        remote_has(&s.remote, "warmup.txt").then_some(())
    });
    git(&s.laptop, ["pull", "-q", "origin", "main"]);
    s.push_from_laptop();
    let pushed = git(&s.remote, ["rev-parse", "main"]).trim().to_owned();

    let out = s.run(&[
        "sync",
        "--dir",
        s.sandbox.to_str().unwrap(),
        "--failure-file",
        s.failure_file().to_str().unwrap(),
        "--install-cmd",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    // A real edit after the sync: the watcher saves exactly that on top of the pushed commit.
    fs::write(s.sandbox.join("after.txt"), "mine\n").unwrap();
    until(
        PATIENCE,
        "the watcher to push the edit made after the sync",
        || remote_has(&s.remote, "after.txt").then_some(()),
    );
    let changed = git(&s.remote, ["diff", "--name-only", &pushed, "main"]);
    assert_eq!(changed, "after.txt\n");
    assert_eq!(
        git(&s.remote, ["show", "main:app.ts"]),
        "v2 from the laptop\n"
    );
    assert!(!remote_has(&s.remote, "old.txt"));
    drop(watcher);
}

#[test]
fn restore_over_smart_http_sends_the_token_once_and_never_prints_it() {
    let s = setup();
    let root = s.tmp.path().join("served");
    fs::create_dir_all(&root).unwrap();
    let server = testkit::git_server::GitServer::start(&root);
    git(
        s.tmp.path(),
        [
            "clone",
            "-q",
            "--bare",
            s.remote.to_str().unwrap(),
            root.join("alice.git").to_str().unwrap(),
        ],
    );
    server.require_password("right-token");
    let template = s.tmp.path().join("template");
    init_repo(&template);
    fs::write(template.join("template-only.txt"), "goes away\n").unwrap();
    git(
        &template,
        ["remote", "add", "project", &server.url("alice.git")],
    );
    let restore = |token: &str| {
        s.watcher()
            .env("PROJECT_TOKEN", token)
            .args(["restore", "--dir", template.to_str().unwrap()])
            .output()
            .unwrap()
    };

    let refused = restore("wrong-token");
    assert_eq!(refused.status.code(), Some(1), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("PROJECT_TOKEN"),
        "{}",
        stderr(&refused)
    );
    assert!(!stderr(&refused).contains("wrong-token"));
    let tries = server
        .requests()
        .iter()
        .filter(|r| r.basic_password().as_deref() == Some("wrong-token"))
        .count();
    assert_eq!(tries, 1, "a refused token is not sent again");
    assert!(template.join("template-only.txt").exists());

    let out = restore("right-token");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        tree_of_add_all(&template),
        tree_of(&s.remote, "main").unwrap()
    );
    assert!(!template.join("template-only.txt").exists());
    assert!(
        server.requests().iter().all(|r| r
            .user_agent
            .as_deref()
            .is_some_and(|ua| ua.contains("project-watcher/"))),
        "every request carries the watcher's User-Agent"
    );
}

#[test]
fn a_sync_ends_the_diverged_state_and_keeps_the_rejected_work_in_a_backup() {
    let s = setup();
    let _watcher = Running(
        s.watcher()
            .args([
                "watch",
                "--dir",
                s.sandbox.to_str().unwrap(),
                "--debounce",
                "200ms",
                "--max-delay",
                "2s",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let state = || {
        project_watcher::status::read(&s.sandbox.join(".git"))
            .ok()
            .map(|st| st.state)
    };
    fs::write(s.sandbox.join("warmup.txt"), "up\n").unwrap();
    until(PATIENCE, "the warm-up edit on the remote", || {
        remote_has(&s.remote, "warmup.txt").then_some(())
    });
    git(&s.laptop, ["pull", "-q", "origin", "main"]);
    s.push_from_laptop();
    // The sandbox saves work the remote cannot take: its push is refused as non-fast-forward.
    fs::write(s.sandbox.join("rejected.txt"), "mine, not on the remote\n").unwrap();
    until(PATIENCE, "the watcher to report diverged", || {
        (state() == Some(project_watcher::status::State::Diverged)).then_some(())
    });

    let out = s.run(&[
        "sync",
        "--dir",
        s.sandbox.to_str().unwrap(),
        "--failure-file",
        s.failure_file().to_str().unwrap(),
        "--install-cmd",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    let backups = git(
        &s.sandbox,
        [
            "for-each-ref",
            "--format=%(refname)",
            "refs/project-watcher/backup/",
        ],
    );
    let backup = backups.trim();
    assert_eq!(
        git(&s.sandbox, ["show", &format!("{backup}:rejected.txt")]),
        "mine, not on the remote\n"
    );
    fs::write(s.sandbox.join("after-sync.txt"), "pushes again\n").unwrap();
    until(PATIENCE, "a normal push after the sync", || {
        remote_has(&s.remote, "after-sync.txt").then_some(())
    });
    until(PATIENCE, "the watcher to leave the diverged state", || {
        (state() == Some(project_watcher::status::State::Idle)).then_some(())
    });
    assert_eq!(
        git(&s.remote, ["show", "main:app.ts"]),
        "v2 from the laptop\n"
    );
}
