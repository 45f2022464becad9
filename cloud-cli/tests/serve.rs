//! `shmastra-cloud serve` as a real child process: the sync command per external push, the
//! webhook, the GitLab upstream (fake API + real git server) with the service token kept out of
//! every log line, and a 100 MB push through bounded proxy memory.

mod common;

use base64::Engine as _;
use testkit::fake_gitlab::{FakeGitLab, GROUP_ID, GROUP_PATH, SERVICE_TOKEN};
use testkit::git::{git, git_output, init_repo};
use testkit::git_server::GitServer;

use common::{Serve, work_tree};

const SECRET: &str = "serve-tests-secret-0123456789abcdef";
const WEBHOOK_SECRET: &str = "webhook-secret-for-tests";

/// serve signed with this file's secret; its sync command records each event.
fn serve(args: &[&str], env: &[(&str, &str)]) -> Serve {
    Serve::start(SECRET, args, env, "true")
}

fn post_webhook(serve: &Serve, token: &str, body: String) -> (u16, String) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let response = reqwest::Client::new()
            .post(serve.url("/api/gitlab/webhook"))
            .header("x-gitlab-token", token)
            .header("x-gitlab-event", "Push Hook")
            .body(body)
            .send()
            .await
            .expect("webhook answers");
        let status = response.status().as_u16();
        (status, response.text().await.expect("body"))
    })
}

fn push_payload(user: &str, new_oid: &str) -> String {
    serde_json::json!({
        "object_kind": "push",
        "ref": "refs/heads/main",
        "before": "0000000000000000000000000000000000000000",
        "after": new_oid,
        "project": { "path_with_namespace": format!("{GROUP_PATH}/{user}") },
    })
    .to_string()
}

#[test]
fn external_pushes_run_the_sync_command_once() {
    let up = tempfile::tempdir().expect("tempdir");
    let up_dir = up.path().to_str().expect("utf-8 path");
    let mut serve = serve(&["--upstream-dir", up_dir], &[]);
    let work = serve.tmp.path().join("work");
    let head = work_tree(&work, &serve.remote_url("alice"));

    let watcher_push = git_output(
        &work,
        [
            "-c",
            "http.userAgent=project-watcher/0.1.0",
            "push",
            "-q",
            "origin",
            "main:refs/heads/from-watcher",
        ],
    );
    assert!(watcher_push.status.success());
    git(&work, ["push", "-q", "origin", "main"]);
    assert_eq!(
        serve.wait_for_events(1),
        [format!("alice refs/heads/main {head}")],
        "exactly one event per external push, the watcher's push fired none"
    );
    let logs = serve.logs();
    assert_eq!(
        logs.lines()
            .filter(|l| l.contains("\"external push\""))
            .count(),
        1,
        "one structured log line per event:\n{logs}"
    );
    assert!(serve.stop().success(), "SIGTERM is a clean shutdown");
}

#[test]
fn gitlab_upstream_gets_the_service_token_which_no_log_line_shows_and_webhook_echoes_are_skipped() {
    let repos = tempfile::tempdir().expect("tempdir");
    let server = GitServer::start(repos.path());
    server.create_bare(&format!("{GROUP_PATH}/alice.git"));
    server.require_password(SERVICE_TOKEN);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let gitlab = runtime.block_on(FakeGitLab::start());
    gitlab.set_repo_base(&server.base_url());
    gitlab.add_project("alice");
    let serve = serve(
        &[],
        &[
            ("GITLAB_SERVICE_TOKEN", SERVICE_TOKEN),
            ("GITLAB_GROUP_ID", &GROUP_ID.to_string()),
            ("GITLAB_API_URL", &gitlab.api_url()),
            ("GITLAB_WEBHOOK_SECRET", WEBHOOK_SECRET),
            ("RUST_LOG", "trace"),
        ],
    );
    let work = serve.tmp.path().join("work");
    let head = work_tree(&work, &serve.remote_url("alice"));
    git(&work, ["push", "-q", "origin", "main"]);
    assert_eq!(
        serve.wait_for_events(1),
        [format!("alice refs/heads/main {head}")]
    );
    // GitLab's echo of the push the proxy forwarded: no second sync.
    let (status, body) = post_webhook(&serve, WEBHOOK_SECRET, push_payload("alice", &head));
    assert_eq!((status, body.trim()), (200, "seen by the proxy"));
    let (status, _) = post_webhook(&serve, "wrong", push_payload("alice", &"2".repeat(40)));
    assert_eq!(status, 401);
    // A push made directly to GitLab.
    let direct = "3".repeat(40);
    let (status, _) = post_webhook(&serve, WEBHOOK_SECRET, push_payload("bob", &direct));
    assert_eq!(status, 200);
    assert_eq!(
        serve.wait_for_events(2),
        [
            format!("alice refs/heads/main {head}"),
            format!("bob refs/heads/main {direct}")
        ],
        "exactly one event per external push"
    );

    let clone = serve.tmp.path().join("clone");
    git(
        serve.tmp.path(),
        [
            "clone".as_ref(),
            "-q".as_ref(),
            serve.remote_url("alice").as_ref(),
            clone.as_os_str(),
        ],
    );
    assert_eq!(git(&clone, ["rev-parse", "HEAD"]).trim(), head);

    let git_requests = server.requests().len();
    let api_requests = gitlab.requests().len();
    let bad = format!("http://x:v1.YWxpY2U.bad@{}/api/git/alice.git", serve.addr);
    for _ in 0..3 {
        let out = git_output(serve.tmp.path(), ["ls-remote", &bad]);
        assert!(!out.status.success());
    }
    assert_eq!(
        server.requests().len(),
        git_requests,
        "bad tokens reach no git server"
    );
    assert_eq!(
        gitlab.requests().len(),
        api_requests,
        "bad tokens reach no GitLab API"
    );

    let logs = serve.logs();
    assert!(logs.contains("TRACE"), "trace logging was on:\n{logs}");
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("oauth2:{SERVICE_TOKEN}"));
    assert!(!logs.contains(SERVICE_TOKEN), "service token in the logs");
    assert!(!logs.contains(&basic), "service credentials in the logs");
    assert!(
        !logs.contains(&serve.token("alice")),
        "project token in the logs"
    );
}

fn vm_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
}

#[test]
fn a_100_mb_push_streams_through_bounded_proxy_memory() {
    let up = tempfile::tempdir().expect("tempdir");
    let serve = serve(
        &["--upstream-dir", up.path().to_str().expect("utf-8 path")],
        &[],
    );
    let work = serve.tmp.path().join("work");
    init_repo(&work);
    git(
        &work,
        ["remote", "add", "origin", &serve.remote_url("alice")],
    );
    // Random bytes do not compress: the pack is as large as the content.
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    for part in 0..4 {
        let mut bytes = vec![0u8; 25 << 20];
        for chunk in bytes.chunks_mut(8) {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            chunk.copy_from_slice(&seed.to_le_bytes()[..chunk.len()]);
        }
        std::fs::write(work.join(format!("blob-{part}.bin")), bytes).expect("write");
    }
    git(&work, ["add", "-A"]);
    git(&work, ["commit", "-qm", "large"]);
    let head = git(&work, ["rev-parse", "HEAD"]).trim().to_owned();
    let before = vm_kib(serve.pid(), "VmHWM:");

    git(&work, ["push", "-q", "origin", "main"]);

    let peak = vm_kib(serve.pid(), "VmHWM:");
    let bare = up.path().join("alice.git");
    assert_eq!(git(&bare, ["rev-parse", "main"]).trim(), head);
    assert_eq!(
        serve.wait_for_events(1),
        [format!("alice refs/heads/main {head}")]
    );
    eprintln!("proxy peak RSS: {before} KiB before, {peak} KiB after a 100 MiB push");
    assert!(
        peak < before + 40 * 1024,
        "proxy peak RSS grew from {before} KiB to {peak} KiB for a 100 MiB push"
    );
}

/// serve's JSON log lines have the watcher's shape (the event's fields beside `message`, no
/// `fields` object); `-q`/`-v` step the level from info, and `RUST_LOG` decides without them.
#[test]
fn serve_logs_in_the_watchers_shape_and_q_v_and_rust_log_set_the_level() {
    const INFO: &str = "the control API (/api/v1/) is off";
    let up = tempfile::tempdir().expect("tempdir");
    let up_dir = up.path().to_str().expect("utf-8 path");
    let lines = |args: &[&str], env: &[(&str, &str)]| {
        let args: Vec<&str> = ["--upstream-dir", up_dir]
            .into_iter()
            .chain(args.iter().copied())
            .collect();
        let serve = serve(&args, env);
        let logs = serve.logs();
        let parsed: Vec<serde_json::Value> = logs
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|_| panic!("not JSON: {l}")))
            .collect();
        parsed
    };
    let shown = |lines: &[serde_json::Value]| {
        lines
            .iter()
            .any(|l| l["message"].as_str().is_some_and(|m| m.contains(INFO)))
    };
    let default = lines(&[], &[]);
    assert!(shown(&default), "{default:?}");
    for line in &default {
        for key in ["timestamp", "level", "message", "target"] {
            assert!(line.get(key).is_some(), "{key} missing: {line}");
        }
        assert!(line.get("fields").is_none(), "nested fields: {line}");
    }
    assert!(!shown(&lines(&["-q"], &[])), "-q: warnings only");
    assert!(
        !shown(&lines(&[], &[("RUST_LOG", "warn")])),
        "RUST_LOG=warn"
    );
    assert!(shown(&lines(&["-v"], &[("RUST_LOG", "warn")])), "-v wins");
}
