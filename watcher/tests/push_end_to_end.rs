//! End to end: the real `project-watcher watch` binary pushing to `testkit`'s smart-HTTP git
//! server (git http-backend) while the server fails in the ways a network does.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};

use project_watcher::status::{self, State, Status};
use testkit::git::{git, git_output, hermetic_env, init_repo, tree_of, tree_of_add_all};
use testkit::git_server::{Fault, GitServer};
use testkit::wait::{PATIENCE, until, until_seen};

const TOKEN: &str = "ptok-7c1d2e93b8a4-do-not-leak";

struct Sandbox {
    tmp: tempfile::TempDir,
    server: GitServer,
    bare: PathBuf,
    work: PathBuf,
}

impl Sandbox {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let server = GitServer::start(&tmp.path().join("srv"));
        let bare = server.create_bare("user.git");
        let work = tmp.path().join("project");
        init_repo(&work);
        git(&work, ["remote", "add", "project", &server.url("user.git")]);
        Self {
            tmp,
            server,
            bare,
            work,
        }
    }

    fn write(&self, rel: &str, body: &str) {
        fs::write(self.work.join(rel), body).unwrap();
    }

    fn status(&self) -> Option<Status> {
        status::read(&self.work.join(".git")).ok()
    }

    /// Waits for a status the check accepts; the last status seen is in the panic message.
    fn wait_status(&self, what: &str, check: impl Fn(&Status) -> bool) -> Status {
        until_seen(PATIENCE, what, || match self.status() {
            Some(s) if check(&s) => Ok(s),
            other => Err(Box::new(other)),
        })
    }

    fn remote_rev(&self, rev: &str) -> Option<String> {
        let out = git_output(&self.bare, ["rev-parse", "--verify", "-q", rev]);
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    fn local_head(&self) -> String {
        git(&self.work, ["rev-parse", "HEAD"]).trim().to_owned()
    }

    /// Waits until the remote `main` holds exactly what `git add -A` would commit now, and the
    /// status file says nothing is left to push.
    fn wait_all_pushed(&self) -> Status {
        until(PATIENCE, "the remote main to hold the working tree", || {
            let expected = tree_of_add_all(&self.work);
            (tree_of(&self.bare, "main").as_deref() == Some(expected.as_str())).then_some(())
        });
        self.wait_status("unpushed_commits 0 and state idle", |s| {
            s.unpushed_commits == 0 && s.state == State::Idle && s.last_push_error.is_none()
        })
    }

    /// Starts the watcher with short debounce times, logging JSON at debug level to a file.
    fn watch(&self, token: Option<&str>) -> Watcher {
        self.watch_with(token, &["--debounce", "150ms", "--max-delay", "2s"])
    }

    /// [`Self::watch`] with other debounce times.
    fn watch_with(&self, token: Option<&str>, debounce: &[&str]) -> Watcher {
        let home = self.tmp.path().join("home");
        fs::create_dir_all(&home).unwrap();
        let log = self.tmp.path().join(format!("watcher-{}.log", now_nanos()));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_project-watcher"));
        cmd.args(["watch", "--dir"])
            .arg(&self.work)
            .args(debounce)
            .args(["--shutdown-timeout", "10s", "--log-format", "json"])
            .env_remove("PROJECT_TOKEN")
            .env("RUST_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(fs::File::create(log.with_extension("out")).unwrap())
            .stderr(fs::File::create(&log).unwrap());
        for (k, v) in hermetic_env(&home) {
            cmd.env(k, v);
        }
        if let Some(token) = token {
            cmd.env("PROJECT_TOKEN", token);
        }
        let child = cmd.spawn().expect("start project-watcher");
        let watcher = Watcher { child, log };
        self.wait_status("the watcher to start", |s| s.pid == watcher.child.id());
        watcher
    }
}

struct Watcher {
    child: Child,
    log: PathBuf,
}

impl Watcher {
    /// SIGTERM (as PM2 and `docker stop` send), then the exit status.
    fn stop(mut self) -> (ExitStatus, String) {
        let pid = self.child.id().to_string();
        let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(killed.success());
        let status = until(PATIENCE, "the watcher to exit", || {
            self.child.try_wait().unwrap()
        });
        (status, self.logs())
    }

    fn logs(&self) -> String {
        let mut text = fs::read_to_string(&self.log).unwrap_or_default();
        text.push_str(&fs::read_to_string(self.log.with_extension("out")).unwrap_or_default());
        text
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn now_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn assert_no_token_in(path: &Path) {
    let text = fs::read_to_string(path).unwrap();
    assert!(!text.contains(TOKEN), "{} holds the token", path.display());
}

#[test]
fn an_edit_reaches_main_tagged_and_authenticated_and_the_token_stays_off_disk_and_logs() {
    let sb = Sandbox::new();
    sb.server.require_password(TOKEN);
    let watcher = sb.watch(Some(TOKEN));
    sb.write("index.ts", "export const answer = 42;\n");
    let status = sb.wait_all_pushed();
    assert_eq!(sb.remote_rev("main"), Some(sb.local_head()));
    assert_eq!(status.head.as_deref(), Some(sb.local_head().as_str()));
    assert!(status.last_push_at.is_some());
    assert_eq!(
        git(&sb.bare, ["show", "main:index.ts"]),
        "export const answer = 42;\n"
    );

    let requests = sb.server.requests();
    let tag = format!("project-watcher/{}", env!("CARGO_PKG_VERSION"));
    assert!(
        requests
            .iter()
            .any(|r| r.path.ends_with("git-receive-pack"))
    );
    for r in &requests {
        let ua = r.user_agent.as_deref().unwrap_or_default();
        assert!(ua.contains(&tag), "{} sent User-Agent {ua:?}", r.path);
    }
    assert!(
        requests
            .iter()
            .any(|r| r.basic_password().as_deref() == Some(TOKEN)),
        "the token is the basic-auth password on the wire"
    );

    let (exit, logs) = watcher.stop();
    assert_eq!(exit.code(), Some(0), "{logs}");
    assert!(!logs.is_empty());
    assert!(!logs.contains(TOKEN), "the token leaked into the logs");
    assert_no_token_in(&sb.work.join(".git/config"));
    assert_no_token_in(&status::status_path(&sb.work.join(".git")));
}

#[test]
fn edits_made_while_the_server_is_down_all_arrive_once_it_is_back() {
    let sb = Sandbox::new();
    let watcher = sb.watch(None);
    sb.write("a.txt", "first\n");
    sb.wait_all_pushed();
    let pushed_before = sb.local_head();

    sb.server.set_fault(Fault::RefuseConnections);
    let mut heads = vec![pushed_before.clone()];
    for i in 0..8 {
        sb.write(&format!("file-{i}.txt"), &format!("edit {i}\n"));
        sb.write("a.txt", &format!("first, changed {i} times\n"));
        let head = until(PATIENCE, "the edit to be committed", || {
            let head = sb.local_head();
            (Some(&head) != heads.last()).then_some(head)
        });
        heads.push(head);
    }
    let down = sb.wait_status("a push failure in the status", |s| {
        s.last_push_error.is_some() && s.unpushed_commits >= 8
    });
    assert!(
        down.last_push_error
            .as_deref()
            .unwrap()
            .contains("cannot reach remote `project`"),
        "{down:#?}"
    );
    assert_eq!(sb.remote_rev("main"), Some(pushed_before));

    sb.server.set_fault(Fault::None);
    sb.wait_all_pushed();
    assert_eq!(
        git(&sb.bare, ["rev-list", "main"]),
        git(&sb.work, ["rev-list", "HEAD"]),
        "the remote history is exactly the local one: nothing lost, nothing doubled"
    );
    for i in 0..8 {
        assert_eq!(
            git(&sb.bare, ["show", &format!("main:file-{i}.txt")]),
            format!("edit {i}\n")
        );
    }
    let (exit, logs) = watcher.stop();
    assert_eq!(exit.code(), Some(0), "{logs}");
}

#[test]
fn server_errors_are_retried_and_shown_until_they_clear() {
    let sb = Sandbox::new();
    sb.server.set_fault(Fault::Status500);
    let watcher = sb.watch(None);
    sb.write("a.txt", "a\n");
    let failing = sb.wait_status("a 500 in the status", |s| {
        s.last_push_error
            .as_deref()
            .is_some_and(|e| e.contains("server error") && e.contains("500"))
    });
    assert!(failing.unpushed_commits >= 1);
    let attempts = |sb: &Sandbox| {
        sb.server
            .requests()
            .iter()
            .filter(|r| r.path.contains("receive-pack"))
            .count()
    };
    until(PATIENCE, "a second attempt after a 500", || {
        (attempts(&sb) >= 2).then_some(())
    });
    sb.server.set_fault(Fault::None);
    sb.wait_all_pushed();
    sb.write("b.txt", "b\n");
    until(PATIENCE, "a second push that needed no retry", || {
        (sb.remote_rev("main:b.txt").is_some()).then_some(())
    });
    let (_, logs) = watcher.stop();
    let messages: Vec<String> = logs
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["message"].as_str().map(str::to_owned))
        .collect();
    let failed = messages
        .iter()
        .filter(|m| m.starts_with("push failed: "))
        .count();
    assert!(failed >= 2, "{logs}");
    let again: Vec<_> = messages
        .iter()
        .filter(|m| m.contains("pushed again"))
        .collect();
    assert_eq!(
        again,
        [&format!("pushed again after {failed} failures")],
        "once, when the pushes resumed: {logs}"
    );
}

#[test]
fn a_refused_token_backs_off_and_says_so_in_the_status() {
    for (fault, token, expected) in [
        (
            Fault::None,
            "not-the-token",
            "refused PROJECT_TOKEN (HTTP 401",
        ),
        (Fault::Status403, TOKEN, "denied access (HTTP 403)"),
    ] {
        let sb = Sandbox::new();
        sb.server.require_password(TOKEN);
        sb.server.set_fault(fault);
        let watcher = sb.watch(Some(token));
        sb.write("a.txt", "a\n");
        let status = sb.wait_status("an auth failure in the status", |s| {
            s.state == State::Backoff && s.last_push_error.is_some()
        });
        let error = status.last_push_error.unwrap();
        assert!(error.contains(expected), "{error}");
        assert!(!error.contains(token), "{error}");

        // More edits do not make it try again: the back-off is minutes long.
        let requests = sb.server.requests().len();
        for i in 0..3 {
            sb.write("a.txt", &format!("again {i}\n"));
            let before = sb.status().and_then(|s| s.head);
            until(PATIENCE, "the edit to be committed", || {
                (sb.status().and_then(|s| s.head) != before).then_some(())
            });
        }
        assert_eq!(
            sb.server.requests().len(),
            requests,
            "no request while backing off: {:?}",
            sb.server.requests()
        );
        let status = sb.status().unwrap();
        assert!(status.unpushed_commits >= 4, "{status:#?}");
        assert_eq!(sb.remote_rev("main"), None);
        drop(watcher);
    }
}

#[test]
fn a_hook_rejection_is_a_failure_with_the_hooks_message() {
    let sb = Sandbox::new();
    sb.server
        .install_pre_receive_reject("user.git", "rejected: project over its 1 GiB quota");
    let watcher = sb.watch(None);
    sb.write("a.txt", "a\n");
    let status = sb.wait_status("the rejection in the status", |s| {
        s.last_push_error.is_some() && s.state == State::Backoff
    });
    let error = status.last_push_error.unwrap();
    assert!(error.contains("pre-receive hook declined"), "{error}");
    assert!(
        error.contains("rejected: project over its 1 GiB quota"),
        "{error}"
    );
    assert_eq!(status.state, State::Backoff);
    assert_eq!(sb.remote_rev("main"), None);
    assert!(status.unpushed_commits >= 1);
    drop(watcher);
}

#[test]
fn someone_elses_push_sends_our_commits_to_a_recovery_branch_until_a_sync() {
    let sb = Sandbox::new();
    let watcher = sb.watch(None);
    sb.write("a.txt", "ours, first\n");
    sb.wait_all_pushed();

    // A developer pushes to main from their own clone.
    let other = sb.tmp.path().join("laptop");
    git(
        sb.tmp.path(),
        ["clone", "-q", &sb.server.url("user.git"), "laptop"],
    );
    fs::write(other.join("b.txt"), "theirs\n").unwrap();
    git(&other, ["add", "-A"]);
    git(&other, ["commit", "-q", "-m", "from the laptop"]);
    git(&other, ["push", "-q", "origin", "main"]);
    let theirs = git(&other, ["rev-parse", "HEAD"]).trim().to_owned();

    sb.write("a.txt", "ours, second\n");
    let status = sb.wait_status("state diverged", |s| s.state == State::Diverged);
    let recovery = status.recovery_ref.clone().expect("a recovery branch");
    let stamp = recovery.strip_prefix("refs/heads/recovery/").unwrap();
    assert!(stamp.ends_with('Z') && !stamp.contains(':'), "{recovery}");
    assert_eq!(
        sb.remote_rev("main"),
        Some(theirs.clone()),
        "main untouched"
    );
    assert_eq!(sb.remote_rev(&recovery), Some(sb.local_head()));

    // It keeps committing locally; the commits follow to the recovery branch.
    sb.write("c.txt", "ours, third\n");
    until(PATIENCE, "the recovery branch to follow", || {
        let head = sb.local_head();
        let committed = git_output(&sb.work, ["show", "HEAD:c.txt"]).stdout;
        (committed == b"ours, third\n"
            && sb.remote_rev(&recovery).as_deref() == Some(head.as_str()))
        .then_some(())
    });
    sb.wait_status("still diverged", |s| {
        s.state == State::Diverged && s.recovery_ref.as_deref() == Some(recovery.as_str())
    });
    assert_eq!(
        sb.remote_rev("main"),
        Some(theirs.clone()),
        "never force-pushed"
    );

    // `project-watcher sync` takes the remote's tree; the next edit pushes to main again.
    let home = sb.tmp.path().join("home");
    let mut sync = Command::new(env!("CARGO_BIN_EXE_project-watcher"));
    sync.args(["sync", "--dir"])
        .arg(&sb.work)
        .arg("--failure-file")
        .arg(sb.tmp.path().join("sync-failure"));
    for (k, v) in hermetic_env(&home) {
        sync.env(k, v);
    }
    let out = sync.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    sb.write("after-sync.txt", "back in step\n");
    sb.wait_all_pushed();
    let status = sb.status().unwrap();
    assert_eq!(status.recovery_ref, None, "{status:#?}");
    assert_eq!(sb.remote_rev("main"), Some(sb.local_head()));
    let ancestry = git_output(&sb.bare, ["merge-base", "--is-ancestor", &theirs, "main"]);
    assert!(
        ancestry.status.success(),
        "main grew on top of their commit"
    );
    assert_eq!(
        git(&sb.bare, ["show", "main:after-sync.txt"]),
        "back in step\n"
    );
    let (exit, logs) = watcher.stop();
    assert_eq!(exit.code(), Some(0), "{logs}");
}

#[test]
fn sigterm_commits_the_pending_edit_and_pushes_it_before_exiting() {
    let sb = Sandbox::new();
    sb.write("a.txt", "a\n");
    let watcher = sb.watch_with(None, &["--debounce", "10m", "--max-delay", "20m"]);
    sb.wait_all_pushed();
    sb.write("late.txt", "written just before the stop\n");
    // Seen and still pending, inside a 10-minute debounce: only the shutdown path can save
    // and push it.
    sb.wait_status("the edit pending", |s| s.state == State::Pending);
    assert_eq!(git(&sb.work, ["ls-tree", "HEAD", "late.txt"]), "");
    let (exit, logs) = watcher.stop();
    assert_eq!(exit.code(), Some(0), "{logs}");
    assert_eq!(
        git(&sb.bare, ["show", "main:late.txt"]),
        "written just before the stop\n"
    );
    assert_eq!(sb.remote_rev("main"), Some(sb.local_head()));
    let status = sb.status().unwrap();
    assert_eq!(status.unpushed_commits, 0, "{status:#?}");
    assert!(status.last_push_error.is_none());
}

#[test]
fn once_pushes_or_exits_1_saying_why() {
    let sb = Sandbox::new();
    let home = sb.tmp.path().join("home");
    fs::create_dir_all(&home).unwrap();
    let once = || {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_project-watcher"));
        cmd.args(["once", "--dir"])
            .arg(&sb.work)
            .args(["--log-format", "json"])
            .env("PROJECT_TOKEN", TOKEN);
        for (k, v) in hermetic_env(&home) {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    };
    sb.server.require_password(TOKEN);
    sb.server.set_fault(Fault::Status500);
    sb.write("a.txt", "a\n");
    let out = once();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("500"), "{stderr}");
    assert!(!stderr.contains(TOKEN));
    assert_eq!(sb.remote_rev("main"), None);
    let attempts = sb
        .server
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("service=git-receive-pack"))
        .count();
    assert_eq!(attempts, 1, "once makes one push attempt");

    sb.server.set_fault(Fault::None);
    let out = once();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(sb.remote_rev("main"), Some(sb.local_head()));
    assert_eq!(git(&sb.bare, ["show", "main:a.txt"]), "a\n");
}

#[test]
fn https_remotes_work_with_the_system_trust_settings() {
    let tmp = tempfile::tempdir().unwrap();
    let server = GitServer::start_https(&tmp.path().join("srv"));
    let bare = server.create_bare("user.git");
    let work = tmp.path().join("project");
    init_repo(&work);
    git(&work, ["remote", "add", "project", &server.url("user.git")]);
    fs::write(work.join("a.txt"), "over TLS\n").unwrap();
    // Incompressible and larger than any buffer on the way: the pack streams through TLS.
    let mut seed = 0x9E37_79B9_7F4A_7C15_u64;
    let big: Vec<u8> = (0..(3 << 20) / 8)
        .flat_map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed.to_le_bytes()
        })
        .collect();
    fs::write(work.join("big.bin"), &big).unwrap();
    let home = tmp.path().join("home");
    fs::create_dir_all(&home).unwrap();
    let run = |command: &str, dir: &Path, ca_file: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_project-watcher"));
        cmd.args([command, "--dir"])
            .arg(dir)
            .env("PROJECT_TOKEN", TOKEN)
            .env_remove("SSL_CERT_DIR");
        for (k, v) in hermetic_env(&home) {
            cmd.env(k, v);
        }
        match ca_file {
            Some(file) => cmd.env("SSL_CERT_FILE", file),
            None => cmd.env_remove("SSL_CERT_FILE"),
        };
        cmd.output().unwrap()
    };
    let once = |ca_file| run("once", &work, ca_file);

    let untrusted = once(None);
    let said = String::from_utf8_lossy(&untrusted.stderr);
    assert_eq!(untrusted.status.code(), Some(1), "{said}");
    assert!(
        said.contains("certificate"),
        "an unknown certificate is refused: {said}"
    );
    assert_eq!(tree_of(&bare, "main"), None);

    let out = once(Some(testkit::git_server::LOOPBACK_CA_FILE));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(git(&bare, ["show", "main:a.txt"]), "over TLS\n");
    assert_eq!(
        git(&bare, ["rev-parse", "main:big.bin"]),
        git(&work, ["hash-object", "big.bin"])
    );

    // And back: a restore fetches the pack through TLS into a fresh clone of the template.
    let sandbox = tmp.path().join("sandbox");
    init_repo(&sandbox);
    git(
        &sandbox,
        ["remote", "add", "project", &server.url("user.git")],
    );
    let out = run(
        "restore",
        &sandbox,
        Some(testkit::git_server::LOOPBACK_CA_FILE),
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(fs::read(sandbox.join("big.bin")).unwrap(), big);
    assert_eq!(tree_of_add_all(&sandbox), tree_of(&bare, "main").unwrap());

    let tag = format!("project-watcher/{}", env!("CARGO_PKG_VERSION"));
    let requests = server.requests();
    assert!(
        requests
            .iter()
            .any(|r| r.path.ends_with("/git-upload-pack"))
    );
    assert!(
        requests
            .iter()
            .all(|r| r.user_agent.as_deref().unwrap_or_default().contains(&tag))
    );
}
