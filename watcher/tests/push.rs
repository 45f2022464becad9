//! The push stage on its own, against real git: a repository, commits made with the git CLI,
//! and `testkit`'s smart-HTTP server (git http-backend) with faults switched on and off.
//!
//! A stalled server fails an attempt after [`network_timeout`] (5 s, or the watcher's own
//! `PROJECT_WATCHER_NETWORK_TIMEOUT`), not the daemon's 30 s: short enough for the stall tests,
//! long enough that no push on a loaded machine waits that long for one read or write.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use git2::Oid;
use project_watcher::push::{Head, PushEvent, PushHandle};
use project_watcher::remote::RemoteSettings;
use testkit::git::{git, init_bare, init_repo};
use testkit::git_server::{Fault, GitServer};
use testkit::wait::PATIENCE;
use tokio::sync::{mpsc, watch};

const TOKEN: &str = "tok-5f3a9c1e-secret";

/// One test's world: a work repository whose `project` remote is on the test server.
struct World {
    _tmp: tempfile::TempDir,
    server: GitServer,
    bare: PathBuf,
    work: PathBuf,
    heads: watch::Sender<Option<Head>>,
    events: mpsc::Receiver<PushEvent>,
    pusher: Option<PushHandle>,
}

/// The network timeout of this test binary (the first test to ask decides; libgit2's settings
/// are process-wide).
fn network_timeout() -> Duration {
    let wanted = match std::env::var_os(project_watcher::transport::NETWORK_TIMEOUT_ENV) {
        Some(_) => project_watcher::transport::network_timeout_from_env().expect("a valid timeout"),
        None => Duration::from_secs(5),
    };
    project_watcher::transport::init(wanted)
}

impl World {
    fn new(token: Option<&str>) -> Self {
        Self::with_remote(token, |server, _| server.url("r.git"))
    }

    fn with_remote(token: Option<&str>, url: impl FnOnce(&GitServer, &Path) -> String) -> Self {
        network_timeout();
        let tmp = tempfile::tempdir().unwrap();
        let server = GitServer::start(&tmp.path().join("srv"));
        let bare = server.create_bare("r.git");
        let work = tmp.path().join("work");
        init_repo(&work);
        let url = url(&server, tmp.path());
        git(&work, ["remote", "add", "project", &url]);
        let (heads, heads_rx) = watch::channel(None);
        let (events_tx, events) = mpsc::channel(256);
        let settings = RemoteSettings {
            workdir: work.clone(),
            remote: "project".into(),
            branch: "main".into(),
            token: token.map(str::to_owned),
        };
        let pusher = Some(PushHandle::spawn(settings, heads_rx, events_tx));
        Self {
            _tmp: tmp,
            server,
            bare,
            work,
            heads,
            events,
            pusher,
        }
    }

    /// Commits a file with the git CLI and publishes the new head, as the daemon does.
    fn commit(&self, name: &str, contents: &str) -> Oid {
        std::fs::write(self.work.join(name), contents).unwrap();
        git(&self.work, ["add", "-A"]);
        git(&self.work, ["commit", "-q", "-m", name]);
        let head = Oid::from_str(git(&self.work, ["rev-parse", "HEAD"]).trim()).unwrap();
        self.heads.send_replace(Some(on_main(head)));
        head
    }

    /// The next event other than `Started`.
    async fn next(&mut self) -> PushEvent {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let event = tokio::time::timeout_at(deadline, self.events.recv())
                .await
                .expect("a push event in time")
                .expect("the pusher is running");
            if event != PushEvent::Started {
                return event;
            }
        }
    }

    async fn until_pushed(&mut self, head: Oid) -> Vec<PushEvent> {
        let mut seen = Vec::new();
        loop {
            let event = self.next().await;
            seen.push(event.clone());
            if matches!(event, PushEvent::Pushed { oid, .. } if oid == head) {
                return seen;
            }
        }
    }

    async fn failure(&mut self) -> (String, Duration) {
        match self.next().await {
            PushEvent::Failed {
                error, retry_in, ..
            } => (error, retry_in),
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    fn remote_rev(&self, rev: &str) -> Option<String> {
        let out = testkit::git::git_output(&self.bare, ["rev-parse", "--verify", "-q", rev]);
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    async fn shutdown(&mut self) {
        if let Some(p) = self.pusher.take() {
            p.shutdown(Duration::from_secs(5)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_reaches_main_tagged_and_authenticated_and_the_token_stays_off_disk() {
    let mut w = World::new(Some(TOKEN));
    w.server.require_password(TOKEN);
    let head = w.commit("a.txt", "hello\n");
    w.until_pushed(head).await;

    assert_eq!(w.remote_rev("main"), Some(head.to_string()));
    assert_eq!(
        git(&w.work, ["rev-parse", "refs/remotes/project/main"]).trim(),
        head.to_string(),
        "the tracking ref the daemon counts unpushed commits against"
    );
    let requests = w.server.requests();
    let tag = format!("project-watcher/{}", env!("CARGO_PKG_VERSION"));
    assert!(!requests.is_empty());
    for r in &requests {
        let ua = r.user_agent.as_deref().unwrap_or_default();
        assert!(ua.contains(&tag), "{ua:?} lacks {tag}");
    }
    assert!(
        requests
            .iter()
            .any(|r| r.basic_password().as_deref() == Some(TOKEN)),
        "the token went out as the basic-auth password"
    );
    let config = std::fs::read_to_string(w.work.join(".git/config")).unwrap();
    assert!(!config.contains(TOKEN), "{config}");
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_made_while_the_server_is_down_all_arrive_once_it_is_back() {
    let mut w = World::new(None);
    let first = w.commit("a.txt", "1\n");
    w.until_pushed(first).await;

    w.server.set_fault(Fault::RefuseConnections);
    let mut last = first;
    for i in 0..12 {
        last = w.commit(&format!("f{i}.txt"), &format!("{i}\n"));
    }
    let (error, _) = w.failure().await;
    assert!(error.contains("cannot reach remote `project`"), "{error}");
    assert_eq!(w.remote_rev("main"), Some(first.to_string()));

    w.server.set_fault(Fault::None);
    w.until_pushed(last).await;
    assert_eq!(
        git(&w.bare, ["rev-list", "main"]),
        git(&w.work, ["rev-list", "main"]),
        "the remote history is exactly the local one: nothing lost, nothing doubled"
    );
    assert_eq!(
        git(
            &w.work,
            ["rev-list", "--count", "refs/remotes/project/main..main"]
        )
        .trim(),
        "0"
    );
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_and_stalls_are_retried_soon() {
    let mut w = World::new(None);
    for (fault, expected) in [
        (Fault::Status500, "server error"),
        (Fault::Stall, "timed out"),
    ] {
        w.server.set_fault(fault);
        let head = w.commit("a.txt", &format!("{fault:?}\n"));
        let (error, retry_in) = w.failure().await;
        assert!(error.contains(expected), "{fault:?}: {error}");
        assert!(
            retry_in <= Duration::from_secs(30),
            "{fault:?}: {retry_in:?}"
        );
        w.server.set_fault(Fault::None);
        w.until_pushed(head).await;
        assert_eq!(w.remote_rev("main"), Some(head.to_string()));
    }
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_token_is_answered_once_and_backs_off_for_minutes() {
    let mut w = World::new(Some("wrong-token"));
    w.server.require_password(TOKEN);
    let committed = Instant::now();
    w.commit("a.txt", "a\n");
    let (error, retry_in) = w.failure().await;
    let attempt = committed.elapsed();
    assert!(
        error.contains("refused PROJECT_TOKEN") && error.contains("401"),
        "{error}"
    );
    assert!(!error.contains("wrong-token"));
    assert!(retry_in >= Duration::from_secs(150), "{retry_in:?}");
    let sent: Vec<_> = w
        .server
        .requests()
        .into_iter()
        .filter_map(|r| r.basic_password())
        .collect();
    assert_eq!(sent, ["wrong-token"], "one answer per attempt, no replays");

    // A newer commit does not cut the back-off short: nothing for three times what the first
    // attempt took (at least 1 s), then the sentinel, shutdown, which makes one attempt whatever
    // the back-off says; it must be the only other one.
    let before = w.server.requests().len();
    let b = w.commit("b.txt", "b\n");
    let window = (3 * attempt).max(Duration::from_secs(1));
    let quiet_from = Instant::now();
    while quiet_from.elapsed() < window {
        assert_eq!(
            w.server.requests().len(),
            before,
            "a newer commit cut the back-off short"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    w.shutdown().await;
    let mut after = Vec::new();
    while let Ok(event) = w.events.try_recv() {
        after.push(event);
    }
    assert!(
        matches!(
            after.as_slice(),
            [PushEvent::Started, PushEvent::Failed { .. }]
        ),
        "one attempt after the first, at shutdown (for {b}): {after:?}"
    );
    let sent: Vec<_> = w
        .server
        .requests()
        .into_iter()
        .filter_map(|r| r.basic_password())
        .collect();
    assert_eq!(sent, ["wrong-token", "wrong-token"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forbidden_and_missing_token_are_clear_auth_failures() {
    let mut w = World::new(Some(TOKEN));
    w.server.set_fault(Fault::Status403);
    w.commit("a.txt", "a\n");
    let (error, retry_in) = w.failure().await;
    assert!(error.contains("denied access (HTTP 403)"), "{error}");
    assert!(retry_in >= Duration::from_secs(150));
    w.shutdown().await;

    let mut w = World::new(None);
    w.server.require_password(TOKEN);
    w.commit("a.txt", "a\n");
    let (error, retry_in) = w.failure().await;
    assert!(
        error.contains("asks for credentials and PROJECT_TOKEN is not set"),
        "{error}"
    );
    assert!(retry_in >= Duration::from_secs(150));
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hook_rejection_is_a_failure_with_the_hooks_message() {
    let mut w = World::new(None);
    w.server
        .install_pre_receive_reject("r.git", "push blocked: repository over quota");
    w.commit("a.txt", "a\n");
    let (error, retry_in) = w.failure().await;
    assert!(error.contains("pre-receive hook declined"), "{error}");
    assert!(
        error.contains("push blocked: repository over quota"),
        "{error}"
    );
    assert!(retry_in >= Duration::from_secs(15));
    assert_eq!(w.remote_rev("main"), None);
    assert!(
        testkit::git::git_output(&w.work, ["rev-parse", "refs/remotes/project/main"])
            .status
            .code()
            != Some(0),
        "a rejected push is not recorded as pushed"
    );
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_that_moved_on_gets_a_recovery_branch_and_main_is_untouched() {
    let mut w = World::new(None);
    let base = w.commit("a.txt", "base\n");
    w.until_pushed(base).await;

    // Someone else pushes to main first.
    let other = w.work.parent().unwrap().join("other");
    git(
        w.work.parent().unwrap(),
        ["clone", "-q", &w.server.url("r.git"), "other"],
    );
    std::fs::write(other.join("b.txt"), "theirs\n").unwrap();
    git(&other, ["add", "-A"]);
    git(&other, ["commit", "-q", "-m", "theirs"]);
    git(&other, ["push", "-q", "origin", "main"]);
    let theirs = git(&other, ["rev-parse", "HEAD"]).trim().to_owned();

    let ours = w.commit("c.txt", "ours\n");
    let PushEvent::Diverged { recovery_ref } = w.next().await else {
        panic!("expected diverged")
    };
    let stamp = recovery_ref
        .strip_prefix("refs/heads/recovery/")
        .expect("a recovery branch");
    assert!(
        stamp.len() == 16 && stamp.ends_with('Z') && !stamp.contains(':'),
        "{stamp}"
    );
    assert_eq!(w.remote_rev("main"), Some(theirs.clone()), "main untouched");
    assert_eq!(w.remote_rev(&recovery_ref), Some(ours.to_string()));

    // Commits keep coming while diverged: they follow to the same recovery branch.
    let ours2 = w.commit("d.txt", "ours 2\n");
    assert_eq!(
        w.next().await,
        PushEvent::Diverged {
            recovery_ref: recovery_ref.clone()
        }
    );
    assert_eq!(w.remote_rev(&recovery_ref), Some(ours2.to_string()));
    assert_eq!(w.remote_rev("main"), Some(theirs.clone()));

    // A sync brings the remote's commits in; normal pushes resume.
    git(&w.work, ["fetch", "-q", "project"]);
    git(
        &w.work,
        ["merge", "-q", "--no-edit", "refs/remotes/project/main"],
    );
    let merged = Oid::from_str(git(&w.work, ["rev-parse", "HEAD"]).trim()).unwrap();
    w.heads.send_replace(Some(on_main(merged)));
    w.until_pushed(merged).await;
    assert_eq!(w.remote_rev("main"), Some(merged.to_string()));
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_urls_and_plain_paths_work_as_remotes() {
    for as_url in [true, false] {
        let mut w = World::with_remote(None, |_, tmp| {
            let bare = tmp.join("plain.git");
            init_bare(&bare);
            if as_url {
                format!("file://{}", bare.display())
            } else {
                bare.display().to_string()
            }
        });
        let head = w.commit("a.txt", "a\n");
        w.until_pushed(head).await;
        let plain = w.work.parent().unwrap().join("plain.git");
        assert_eq!(git(&plain, ["rev-parse", "main"]).trim(), head.to_string());
        w.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_in_the_remote_url_never_appear_in_a_message() {
    let mut w = World::with_remote(None, |server, _| {
        server
            .url("r.git")
            .replace("http://", "http://alice:hunter2-secret@")
    });
    w.server.set_fault(Fault::Status500);
    w.commit("a.txt", "a\n");
    let (error, _) = w.failure().await;
    assert!(!error.contains("hunter2-secret"), "{error}");
    assert!(error.contains("***@127.0.0.1"), "{error}");
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_pushes_the_newest_head_once_and_is_bounded_when_the_server_stalls() {
    let mut w = World::new(None);
    let head = w.commit("a.txt", "a\n");
    w.pusher
        .take()
        .unwrap()
        .shutdown(Duration::from_secs(10))
        .await;
    assert_eq!(w.remote_rev("main"), Some(head.to_string()));

    // Bounded by the shutdown's own deadline (1 s), not by the attempt's network timeout.
    let mut w = World::new(None);
    w.server.set_fault(Fault::Stall);
    w.commit("a.txt", "a\n");
    let started = Instant::now();
    w.pusher
        .take()
        .unwrap()
        .shutdown(Duration::from_secs(1))
        .await;
    assert!(
        started.elapsed() < network_timeout(),
        "{:?}",
        started.elapsed()
    );
}

/// Incompressible bytes, so a pack holding them is as large as they are.
fn noise(len: usize, mut seed: u64) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(len + 8);
    while bytes.len() < len {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        bytes.extend_from_slice(&seed.to_le_bytes());
    }
    bytes.truncate(len);
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_stops_reading_mid_pack_times_out_and_the_pack_arrives_later() {
    let mut w = World::new(None);
    w.server.set_fault(Fault::StallMidPack);
    std::fs::write(w.work.join("big.bin"), noise(8 << 20, 7)).unwrap();
    let head = w.commit("a.txt", "with a big file\n");
    let (error, retry_in) = w.failure().await;
    assert!(error.contains("timed out"), "{error}");
    assert!(retry_in <= Duration::from_secs(30), "{retry_in:?}");
    w.server.set_fault(Fault::None);
    w.until_pushed(head).await;
    assert_eq!(
        git(&w.bare, ["rev-parse", "main:big.bin"]),
        git(&w.work, ["rev-parse", "main:big.bin"])
    );
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_within_the_server_is_followed_with_the_token() {
    let mut w = World::with_remote(Some(TOKEN), |server, _| server.url("old.git"));
    w.server.require_password(TOKEN);
    w.server.redirect("old.git", "r.git");
    let head = w.commit("a.txt", "moved\n");
    w.until_pushed(head).await;
    assert_eq!(w.remote_rev("main"), Some(head.to_string()));
    let requests: Vec<_> = w
        .server
        .requests()
        .into_iter()
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert_eq!(
        requests,
        [
            "GET /old.git/info/refs?service=git-receive-pack",
            "GET /r.git/info/refs?service=git-receive-pack",
            "POST /r.git/git-receive-pack",
        ],
        "the POST goes where the advertisement was found"
    );
    w.shutdown().await;
}

/// A plain TCP server that answers every request with `response` and records the request
/// heads; it serves at most `limit` connections.
fn canned_server(response: String, limit: usize) -> (String, std::sync::mpsc::Receiver<String>) {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (heads, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(limit) {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut head = String::new();
            while reader.read_line(&mut head).is_ok_and(|n| n > 2) {}
            let _ = heads.send(head);
            let _ = stream.write_all(response.as_bytes());
        }
    });
    (url, received)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_to_another_origin_is_refused_and_the_token_stays_home() {
    let (elsewhere, _) = canned_server(String::new(), 0);
    let (url, heads) = canned_server(
        format!(
            "HTTP/1.1 302 Found\r\nLocation: {elsewhere}/r.git/info/refs?service=git-receive-pack\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        ),
        4,
    );
    let mut w = World::with_remote(Some(TOKEN), |_, _| format!("{url}/r.git"));
    w.commit("a.txt", "a\n");
    let (error, _) = w.failure().await;
    assert!(error.contains("redirected to another origin"), "{error}");
    assert!(!error.contains(TOKEN), "{error}");
    let head = heads.recv_timeout(PATIENCE).unwrap();
    assert!(
        head.starts_with("GET /r.git/info/refs?service=git-receive-pack "),
        "{head}"
    );
    assert!(heads.try_recv().is_err(), "one request, not followed");
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_not_git_is_refused_with_a_clear_error() {
    let page = "<html>sign in</html>";
    let (url, _) = canned_server(
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
            page.len()
        ),
        4,
    );
    let mut w = World::with_remote(None, |_, _| format!("{url}/r.git"));
    w.commit("a.txt", "a\n");
    let (error, _) = w.failure().await;
    assert!(
        error.contains("not a git smart-HTTP server") && error.contains("text/html"),
        "{error}"
    );
    w.shutdown().await;
}

/// `oid` as the tip of `main`, the branch these tests push.
fn on_main(oid: Oid) -> Head {
    Head {
        oid,
        branch: "main".to_owned(),
    }
}
