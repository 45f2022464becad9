//! `shmastra-cloud serve`'s secrets attacked: a rejected service token sent again, weak
//! secrets, children inheriting the server's environment, error bodies naming internal hosts;
//! the real binary with real git and the GitLab double.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use testkit::fake_gitlab::GROUP_PATH;
use testkit::git::{git, git_output};
use testkit::wait;

use common::attack::*;
use common::{PATIENCE, work_tree};

/// After GitLab rejected the service token, every client request used to send it again: 35
/// clones made 35 failed logins (GitLab bans the IP after 30 in 3 minutes). Now one 401
/// latches: clients get 503 with a reason, `/healthz` says why, GitLab sees no more attempts.
#[test]
fn a_rejected_service_token_is_not_sent_again_and_healthz_reports_it() {
    let setup = GitLabSetup::start();
    setup.project("alice");
    let serve = setup.serve(&[]);
    let url = serve.remote_url("alice");
    assert!(
        git_output(serve.tmp.path(), ["ls-remote", &url])
            .status
            .success()
    );
    assert_eq!(get_with(&serve.url("/healthz"), None), (200, "ok\n".into()));

    // Someone revokes the service token at GitLab.
    setup
        .server
        .require_password("glpat-the-new-token-nobody-configured");
    let before = setup.server.requests().len();
    let mut statuses = Vec::new();
    for _ in 0..35 {
        let (status, body) = get_with(
            &format!(
                "{}/api/git/alice.git/info/refs?service=git-upload-pack",
                serve.url("")
            ),
            Some(&token("alice", &[])),
        );
        statuses.push(status);
        if status == 503 {
            assert!(body.contains("rejected the proxy's credentials"), "{body}");
        }
    }
    let attempts = setup.server.requests().len() - before;
    assert_eq!(attempts, 1, "failed logins at the upstream: {attempts}");
    assert!(statuses.iter().all(|&s| s == 503), "{statuses:?}");
    let out = git_output(serve.tmp.path(), ["ls-remote", &url]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("503"));
    let (status, body) = get_with(&serve.url("/healthz"), None);
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("rejected the service credentials"), "{body}");
    assert_eq!(setup.server.requests().len() - before, 1);
}

/// A one-character webhook secret and a 32-byte token secret of one repeated character were
/// accepted. serve refuses to start with either, saying which and how to make a good one.
#[test]
fn weak_secrets_are_refused_at_start() {
    let up = tempfile::tempdir().expect("tempdir");
    // A serve that starts is killed after the deadline: the test fails instead of hanging.
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_shmastra-cloud"))
            .args(["serve", "--listen", "127.0.0.1:0", "--upstream-dir"])
            .arg(up.path())
            .args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run serve");
        let exited = Instant::now();
        while child.try_wait().expect("wait").is_none()
            && exited.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(25));
        }
        let _ = child.kill();
        child.wait_with_output().expect("serve output")
    };
    let repeated = "a".repeat(48);
    for (env, names) in [
        (
            vec![
                ("SHMASTRA_TOKEN_SECRET", SECRET),
                ("GITLAB_WEBHOOK_SECRET", "x"),
            ],
            "GITLAB_WEBHOOK_SECRET",
        ),
        (
            vec![("SHMASTRA_TOKEN_SECRET", repeated.as_str())],
            "SHMASTRA_TOKEN_SECRET",
        ),
        (
            vec![(
                "SHMASTRA_TOKEN_SECRET",
                "abcdabcdabcdabcdabcdabcdabcdabcdabcd",
            )],
            "SHMASTRA_TOKEN_SECRET",
        ),
    ] {
        let out = run(&[], &env);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{env:?}: {stderr}");
        assert!(
            stderr.contains(names) && stderr.contains("openssl rand"),
            "{stderr}"
        );
        assert!(
            out.stdout.is_empty() || !String::from_utf8_lossy(&out.stdout).contains("listening")
        );
    }
    // Asking to pass a server secret to the sync command is a usage error too.
    let out = run(
        &[
            "--on-external-push",
            "true",
            "--sync-env",
            "SHMASTRA_TOKEN_SECRET",
        ],
        &[("SHMASTRA_TOKEN_SECRET", SECRET)],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("never passed to the sync command"));
}

/// The embedded `git init`, `git http-backend` and the sync command inherited the server's
/// secrets. Each child now gets only what it needs.
#[test]
fn children_get_only_the_environment_they_need() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let bin = tmp.path().join("bin");
    let seen = tmp.path().join("git-env");
    std::fs::create_dir_all(&bin).expect("mkdir");
    std::fs::create_dir_all(&seen).expect("mkdir");
    let real_git = String::from_utf8(
        Command::new("sh")
            .args(["-c", "command -v git"])
            .output()
            .expect("sh")
            .stdout,
    )
    .expect("utf-8");
    let wrapper = bin.join("git");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nenv > '{}/'$$\nexec '{}' \"$@\"\n",
            seen.display(),
            real_git.trim()
        ),
    )
    .expect("wrapper");
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let sync_env = tmp.path().join("sync-env");
    let up = tmp.path().join("up");
    let serve = serve_with(
        &[
            "--upstream-dir",
            up.to_str().expect("utf-8"),
            "--sync-env",
            "OPERATOR_VISIBLE",
        ],
        &[
            ("PATH", &path),
            ("GITLAB_WEBHOOK_SECRET", WEBHOOK_SECRET),
            ("OPERATOR_PRIVATE", "operator-private-value"),
            ("OPERATOR_VISIBLE", "operator-visible-value"),
        ],
        &format!("env > '{}'", sync_env.display()),
    );
    let work = serve.tmp.path().join("work");
    work_tree(&work, &serve.remote_url("alice"));
    git(&work, ["push", "-q", "origin", "main"]);
    serve.wait_for_events(1);
    let sync = wait::until(PATIENCE, "the sync command's env", || {
        std::fs::read_to_string(&sync_env)
            .ok()
            .filter(|s| s.contains("SHMASTRA_NEW_OID"))
    });
    let git_envs: Vec<String> = std::fs::read_dir(&seen)
        .expect("git envs")
        .map(|e| std::fs::read_to_string(e.expect("entry").path()).expect("env"))
        .collect();
    assert!(
        git_envs.len() >= 3,
        "git init, http-backend, receive-pack: {}",
        git_envs.len()
    );
    for env in git_envs.iter().chain([&sync]) {
        for secret in [SECRET, WEBHOOK_SECRET, "operator-private-value"] {
            assert!(!env.contains(secret), "a child inherited {secret}:\n{env}");
        }
    }
    assert!(
        sync.contains("SHMASTRA_USER=alice")
            && sync.contains("OPERATOR_VISIBLE=operator-visible-value"),
        "{sync}"
    );
}

/// 502 bodies named internal upstream URLs. They now say what failed without the host.
#[test]
fn bad_gateway_bodies_name_no_internal_host() {
    let setup = GitLabSetup::start();
    setup.project("alice");
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = closed.local_addr().expect("addr").port();
    drop(closed);
    setup
        .gitlab
        .set_repo_base(&format!("http://127.0.0.1:{port}/internal-git"));
    let serve = setup.serve(&[]);
    let (status, body) = get_with(
        &format!(
            "{}/api/git/alice.git/info/refs?service=git-upload-pack",
            serve.url("")
        ),
        Some(&token("alice", &[])),
    );
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("could not be reached"), "{body}");
    for internal in [
        port.to_string().as_str(),
        "internal-git",
        "127.0.0.1",
        GROUP_PATH,
    ] {
        assert!(
            !body.contains(internal),
            "the 502 body names {internal}: {body}"
        );
    }
    assert!(
        serve.logs().contains("internal-git"),
        "the log keeps the detail"
    );
}
