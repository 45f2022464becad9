//! The git proxy with real git clients: in front of the embedded upstream (`git http-backend`
//! over a directory) and in front of a remote smart-HTTP server (testkit's `GitServer`, standing
//! in for GitLab) that only accepts the service token.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cloud_core::EmbeddedUpstream;
use cloud_core::TokenSigner;
use cloud_core::UserId;
use cloud_core::{ExternalPush, Proxy, ProxyLimits};
use cloud_core::{HttpUpstream, RepoPerUser, Upstream};
use secrecy::SecretString;
use testkit::git::{git, git_output, init_repo};
use testkit::git_server::{Fault, GitServer};
use testkit::wait;

const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef-proxy-tests";
const SERVICE_TOKEN: &str = "glpat-service-token-never-shown";

struct Harness {
    base: String,
    signer: TokenSigner,
    events: Arc<Mutex<Vec<ExternalPush>>>,
    tmp: tempfile::TempDir,
    runtime: tokio::runtime::Runtime,
}

impl Harness {
    fn start(upstream: Arc<dyn Upstream>, limits: ProxyLimits) -> Harness {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let signer = TokenSigner::new(SECRET).expect("secret");
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = events.clone();
        let proxy = Proxy::new(
            signer.clone(),
            upstream,
            limits,
            Arc::new(move |push| sink.lock().expect("events").push(push)),
        );
        let app = axum::Router::new().nest("/api/git", proxy.router());
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        runtime.spawn(async move { axum::serve(listener, app).await });
        Harness {
            base: format!("http://{addr}/api/git"),
            signer,
            events,
            tmp: tempfile::tempdir().expect("tempdir"),
            runtime,
        }
    }

    fn embedded() -> (Harness, PathBuf) {
        let repos = tempfile::tempdir().expect("tempdir").keep();
        let upstream = EmbeddedUpstream::new(&repos).expect("upstream dir");
        (
            Harness::start(Arc::new(upstream), ProxyLimits::default()),
            repos,
        )
    }

    fn remote(server: &GitServer, limits: ProxyLimits) -> Harness {
        let locator = Arc::new(RepoPerUser {
            base_url: server.base_url(),
        });
        let upstream = HttpUpstream::new(locator, "oauth2", SecretString::from(SERVICE_TOKEN))
            .expect("client");
        Harness::start(Arc::new(upstream), limits)
    }

    fn token(&self, user: &str) -> String {
        self.signer.mint(&UserId::parse(user).expect("user id"))
    }

    /// The clone URL a user's git would use, with the token as basic-auth password.
    fn url(&self, user: &str, repo: &str) -> String {
        let with_auth =
            self.base
                .replacen("http://", &format!("http://x:{}@", self.token(user)), 1);
        format!("{with_auth}/{repo}")
    }

    fn dir(&self, name: &str) -> PathBuf {
        self.tmp.path().join(name)
    }

    fn events(&self) -> Vec<ExternalPush> {
        self.events.lock().expect("events").clone()
    }

    /// Sends `request` and returns status, headers and body text.
    fn send(&self, request: reqwest::RequestBuilder) -> (u16, reqwest::header::HeaderMap, String) {
        self.runtime.block_on(async {
            let response = request.send().await.expect("proxy answers");
            let status = response.status().as_u16();
            let headers = response.headers().clone();
            (status, headers, response.text().await.expect("body"))
        })
    }
}

/// A work tree with one commit on `main` whose remote `origin` is `url`.
fn work_tree(dir: &Path, url: &str, file: &str) -> String {
    init_repo(dir);
    std::fs::write(dir.join(file), format!("content of {file}\n")).expect("write");
    git(dir, ["add", "-A"]);
    git(dir, ["commit", "-qm", "first"]);
    git(dir, ["remote", "add", "origin", url]);
    git(dir, ["rev-parse", "HEAD"]).trim().to_owned()
}

fn alice_main(oid: &str) -> ExternalPush {
    ExternalPush {
        user: UserId::parse("alice").expect("user"),
        refname: "refs/heads/main".into(),
        new_oid: oid.into(),
    }
}

#[test]
fn a_plain_push_through_the_embedded_upstream_fires_one_event() {
    let (h, repos) = Harness::embedded();
    let work = h.dir("work");
    let head = work_tree(&work, &h.url("alice", "alice.git"), "a.txt");

    git(&work, ["push", "-q", "origin", "main"]);

    let bare = repos.join("alice.git");
    assert_eq!(git(&bare, ["rev-parse", "main"]).trim(), head);
    assert_eq!(h.events(), vec![alice_main(&head)]);

    // A push the upstream refuses (report-status `ng refs/heads/main`: the embedded upstream's
    // hook refuses rewriting `main`) moves no ref and fires nothing: a real receive-pack
    // exchange, unlike a push of nothing new, which git never sends.
    git(&work, ["commit", "-q", "--amend", "-m", "rewritten"]);
    let refused = git_output(&work, ["push", "-q", "--force", "origin", "main"]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && said.contains("hook declined"),
        "{said}"
    );
    assert_eq!(git(&bare, ["rev-parse", "main"]).trim(), head);
    // The sentinel: a push the upstream accepts fires exactly one more event, its own.
    git(&work, ["reset", "-q", "--hard", &head]);
    std::fs::write(work.join("b.txt"), "b\n").expect("write");
    git(&work, ["add", "-A"]);
    git(&work, ["commit", "-qm", "second"]);
    git(&work, ["push", "-q", "origin", "main"]);
    let second = git(&work, ["rev-parse", "HEAD"]).trim().to_owned();
    assert_eq!(h.events(), vec![alice_main(&head), alice_main(&second)]);
}

#[test]
fn a_push_tagged_by_the_watcher_fires_nothing() {
    let (h, repos) = Harness::embedded();
    let work = h.dir("work");
    let head = work_tree(&work, &h.url("alice", ""), "a.txt");

    git(
        &work,
        [
            "-c",
            "http.userAgent=project-watcher/0.1.0 libgit2",
            "push",
            "-q",
            "origin",
            "main",
        ],
    );

    assert_eq!(
        git(&repos.join("alice.git"), ["rev-parse", "main"]).trim(),
        head
    );
    assert!(h.events().is_empty(), "events: {:?}", h.events());
}

#[test]
fn clone_and_fetch_work_with_protocol_v2() {
    let (h, _repos) = Harness::embedded();
    let work = h.dir("work");
    let head = work_tree(&work, &h.url("alice", "alice.git"), "a.txt");
    git(&work, ["push", "-q", "origin", "main"]);

    let clone = h.dir("clone");
    let out = testkit::git::command(h.tmp.path())
        .env("GIT_TRACE_PACKET", "1")
        .args(["-c", "protocol.version=2", "clone", "-q"])
        .arg(h.url("alice", "alice.git"))
        .arg(&clone)
        .output()
        .expect("git clone");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let trace = String::from_utf8_lossy(&out.stderr);
    assert!(trace.contains("< version 2"), "not protocol v2:\n{trace}");
    assert_eq!(git(&clone, ["rev-parse", "HEAD"]).trim(), head);

    std::fs::write(work.join("b.txt"), "b\n").expect("write");
    git(&work, ["add", "-A"]);
    git(&work, ["commit", "-qm", "second"]);
    git(&work, ["push", "-q", "origin", "main"]);
    let second = git(&work, ["rev-parse", "HEAD"]).trim().to_owned();
    git(
        &clone,
        ["-c", "protocol.version=2", "fetch", "-q", "origin"],
    );
    assert_eq!(git(&clone, ["rev-parse", "origin/main"]).trim(), second);
}

#[test]
fn the_remote_upstream_sees_only_the_service_token_and_a_rejected_push_fires_nothing() {
    let root = tempfile::tempdir().expect("tempdir");
    let server = GitServer::start(root.path());
    server.create_bare("alice.git");
    server.require_password(SERVICE_TOKEN);
    let h = Harness::remote(&server, ProxyLimits::default());
    let work = h.dir("work");
    let head = work_tree(&work, &h.url("alice", "alice.git"), "a.txt");

    server.install_pre_receive_reject("alice.git", "rejected by policy");
    let out = git_output(&work, ["push", "origin", "main"]);
    assert!(!out.status.success(), "the hook rejects the push");
    assert!(h.events().is_empty(), "events: {:?}", h.events());

    server.remove_pre_receive("alice.git");
    git(&work, ["push", "-q", "origin", "main"]);
    assert_eq!(h.events(), vec![alice_main(&head)]);

    // Git-Protocol crosses to the remote upstream: protocol v2 is negotiated end to end.
    let out = testkit::git::command(&work)
        .env("GIT_TRACE_PACKET", "1")
        .args(["-c", "protocol.version=2", "ls-remote", "origin", "main"])
        .output()
        .expect("git ls-remote");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("< version 2"));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with(&head));

    let requests = server.requests();
    assert!(!requests.is_empty());
    for r in &requests {
        assert_eq!(r.basic_password().as_deref(), Some(SERVICE_TOKEN), "{r:?}");
        assert!(r.path.starts_with("/alice.git/"), "{r:?}");
    }
}

#[test]
fn bad_requests_are_answered_locally_and_never_reach_the_upstream() {
    let root = tempfile::tempdir().expect("tempdir");
    let server = GitServer::start(root.path());
    server.create_bare("alice.git");
    server.create_bare("bob.git");
    let limits = ProxyLimits {
        max_request_bytes: 1024,
        ..ProxyLimits::default()
    };
    let h = Harness::remote(&server, limits);
    let http = reqwest::Client::new();
    let alice = h.token("alice");
    let info_refs = |repo: &str| format!("{}/{repo}/info/refs?service=git-upload-pack", h.base);

    let mut responses = Vec::new();
    let mut check = |request: reqwest::RequestBuilder, status: u16, why: &str| {
        let (got, headers, body) = h.send(request);
        assert_eq!(got, status, "{why}: {body}");
        assert!(!body.is_empty(), "{why}: the answer explains itself");
        if status == 401 {
            assert_eq!(
                headers
                    .get("www-authenticate")
                    .and_then(|v| v.to_str().ok()),
                Some("Basic realm=\"shmastra git\""),
                "{why}"
            );
        }
        responses.push(format!("{headers:?}\n{body}"));
    };

    check(http.get(info_refs("alice.git")), 401, "no credentials");
    for _ in 0..5 {
        check(
            http.get(info_refs("alice.git"))
                .basic_auth("x", Some("v1.YWxpY2U.forged")),
            401,
            "a wrong token",
        );
    }
    check(
        http.get(info_refs("alice.git"))
            .basic_auth("x", Some(SERVICE_TOKEN)),
        401,
        "the service token itself is no project token",
    );
    check(
        http.get(info_refs("alice.git")).bearer_auth(&alice),
        401,
        "a bearer header is not basic auth",
    );
    check(
        http.get(info_refs("bob.git")).basic_auth("x", Some(&alice)),
        403,
        "alice's token against bob's repository",
    );
    for path in [
        "/../bob.git/info/refs?service=git-upload-pack",
        "/%2e%2e/bob.git/info/refs?service=git-upload-pack",
        "/alice.git/..%2fbob.git/info/refs?service=git-upload-pack",
        "/alice.git%2f..%2fbob.git/info/refs?service=git-upload-pack",
        "/alice.git/HEAD",
        "/alice.git/objects/info/packs",
        "/alice.git/info/refs?service=git-upload-archive",
        "/api/v4/projects",
    ] {
        let (status, response) = raw_get(&h.base, path, &alice);
        assert_eq!(status, 404, "{path}: {response}");
        assert!(
            response.contains("not a git smart-HTTP endpoint"),
            "{path}: {response}"
        );
        responses.push(response);
    }
    let mut check = |request: reqwest::RequestBuilder, status: u16, why: &str| {
        let (got, headers, body) = h.send(request);
        assert_eq!(got, status, "{why}: {body}");
        responses.push(format!("{headers:?}\n{body}"));
    };
    check(
        http.post(format!("{}/alice.git/git-receive-pack", h.base))
            .basic_auth("x", Some(&alice))
            .header("content-type", "application/x-git-receive-pack-request")
            .body(vec![0u8; 4096]),
        413,
        "a declared body over the limit",
    );

    assert!(
        server.requests().is_empty(),
        "the upstream saw {:?}",
        server.requests()
    );
    for r in &responses {
        assert!(!r.contains(SERVICE_TOKEN), "service token leaked: {r}");
    }
    assert!(h.events().is_empty());
}

/// Sends `GET <mount><path>` exactly as written: an HTTP client library would resolve the dot
/// segments before the proxy ever saw them.
fn raw_get(base: &str, path: &str, token: &str) -> (u16, String) {
    use base64::Engine as _;
    use std::io::{Read, Write};
    let rest = base.strip_prefix("http://").expect("http base");
    let (host, mount) = rest.split_once('/').expect("mount path");
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("x:{token}"));
    let mut stream = std::net::TcpStream::connect(host).expect("connect");
    write!(
        stream,
        "GET /{mount}{path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Basic {auth}\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status line");
    (status, response)
}

#[test]
fn a_streamed_body_over_the_limit_gets_413() {
    let root = tempfile::tempdir().expect("tempdir");
    let server = GitServer::start(root.path());
    server.create_bare("alice.git");
    let limits = ProxyLimits {
        max_request_bytes: 64 * 1024,
        ..ProxyLimits::default()
    };
    let h = Harness::remote(&server, limits);
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        (0..64).map(|_| Ok(vec![0u8; 8192])).collect();
    let body = reqwest::Body::wrap_stream(futures_util::stream::iter(chunks));
    let response = h.runtime.block_on(
        reqwest::Client::new()
            .post(format!("{}/alice.git/git-receive-pack", h.base))
            .basic_auth("x", Some(h.token("alice")))
            .header("content-type", "application/x-git-receive-pack-request")
            .body(body)
            .send(),
    );
    // The proxy answers 413 and closes without draining the rest of the body, so a client still
    // sending may see the connection reset before it reads the answer. Either way nothing
    // succeeded, and an answer it did read says 413.
    match response {
        Ok(response) => assert_eq!(response.status().as_u16(), 413),
        Err(e) => assert!(e.is_request(), "{e}"),
    }
    assert_eq!(
        testkit::git::git(&root.path().join("alice.git"), ["for-each-ref"]),
        "",
        "the upstream repository is untouched"
    );
}

#[test]
fn upstream_failures_become_502_and_504_with_a_clear_body() {
    let root = tempfile::tempdir().expect("tempdir");
    let server = GitServer::start(root.path());
    server.create_bare("alice.git");
    let limits = ProxyLimits {
        upstream_timeout: Duration::from_secs(2),
        ..ProxyLimits::default()
    };
    let h = Harness::remote(&server, limits);
    let http = reqwest::Client::new();
    let url = format!("{}/alice.git/info/refs?service=git-upload-pack", h.base);
    let alice = h.token("alice");
    let get = || {
        let (status, _, body) = h.send(http.get(&url).basic_auth("x", Some(&alice)));
        (status, body)
    };

    // Refusal first: a pooled keep-alive connection from an earlier case would still be served.
    for (fault, status, says) in [
        (Fault::RefuseConnections, 502, "could not be reached"),
        (Fault::Status500, 502, "upstream git server failed"),
        (
            Fault::Status403,
            502,
            "rejected the proxy's service credentials",
        ),
        (Fault::Stall, 504, "did not answer in time"),
    ] {
        server.set_fault(fault);
        let body = wait::until(Duration::from_secs(30), &format!("{fault:?}"), || {
            let (got, body) = get();
            (got == status).then_some(body)
        });
        assert!(body.contains(says), "{fault:?}: {body}");
        assert!(!body.contains(SERVICE_TOKEN));
    }
    server.set_fault(Fault::None);
    wait::until(Duration::from_secs(30), "upstream recovers", || {
        (get().0 == 200).then_some(())
    });
}

#[test]
fn a_stuck_upstream_times_out_whether_or_not_it_read_the_body() {
    let root = tempfile::tempdir().expect("tempdir");
    let server = GitServer::start(root.path());
    server.create_bare("alice.git");
    let limits = ProxyLimits {
        upstream_timeout: Duration::from_secs(2),
        idle_timeout: Duration::from_secs(8),
        ..ProxyLimits::default()
    };
    let h = Harness::remote(&server, limits);
    server.set_fault(Fault::Stall);
    let http = reqwest::Client::new();
    let post = |body: Vec<u8>| {
        h.send(
            http.post(format!("{}/alice.git/git-upload-pack", h.base))
                .basic_auth("x", Some(h.token("alice")))
                .header("content-type", "application/x-git-upload-pack-request")
                .body(body),
        )
    };
    // Small enough for the socket buffers: the upstream has it all, so the answer timeout runs.
    let started = std::time::Instant::now();
    let (status, _, body) = post(b"0000".to_vec());
    assert_eq!(status, 504, "{body}");
    assert!(
        started.elapsed() < Duration::from_secs(7),
        "a fully sent request waits for upstream_timeout, not the idle timeout: {:?}",
        started.elapsed()
    );
    // Far larger than the socket buffers: the upstream stops reading half-way, and the idle
    // timeout (not a wait for an answer that cannot start) ends it.
    let started = std::time::Instant::now();
    let (status, _, body) = post(vec![b'0'; 64 << 20]);
    assert_eq!(status, 504, "{body}");
    assert!(started.elapsed() >= Duration::from_secs(8));
}

#[test]
fn a_push_whose_client_never_reads_the_report_still_fires_its_event() {
    use base64::Engine as _;
    use std::io::Write;
    let (h, repos) = Harness::embedded();
    let work = h.dir("work");
    let head = work_tree(&work, &h.url("alice", "alice.git"), "a.txt");
    git(&work, ["ls-remote", "origin"]);

    let mut pack_objects = testkit::git::command(&work)
        .args(["pack-objects", "--stdout", "--revs", "-q"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("git pack-objects");
    pack_objects
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"HEAD\n")
        .expect("revs");
    let pack = pack_objects.wait_with_output().expect("pack").stdout;
    let zero = "0".repeat(40);
    let command =
        format!("{zero} {head} refs/heads/main\0report-status side-band-64k agent=test\n");
    let mut body = git_wire::pkt_line::encode(command.as_bytes());
    body.extend_from_slice(b"0000");
    body.extend_from_slice(&pack);

    let rest = h.base.strip_prefix("http://").expect("http base");
    let (host, mount) = rest.split_once('/').expect("mount");
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("x:{}", h.token("alice")));
    let mut stream = std::net::TcpStream::connect(host).expect("connect");
    write!(
        stream,
        "POST /{mount}/alice.git/git-receive-pack HTTP/1.1\r\nHost: {host}\r\n\
         Authorization: Basic {auth}\r\n\
         Content-Type: application/x-git-receive-pack-request\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    )
    .expect("send head");
    stream.write_all(&body).expect("send body");
    // Hang up once the push has landed, without reading a byte of the answer.
    let bare = repos.join("alice.git");
    wait::until(Duration::from_secs(30), "the push to land", || {
        testkit::git::tree_of(&bare, "main")
    });
    drop(stream);

    wait::until(Duration::from_secs(30), "the external-push event", || {
        (!h.events().is_empty()).then_some(())
    });
    assert_eq!(h.events(), vec![alice_main(&head)]);
    assert_eq!(git(&bare, ["rev-parse", "main"]).trim(), head);
}

#[test]
fn a_client_that_stops_sending_its_body_gets_408() {
    use base64::Engine as _;
    use std::io::{Read, Write};
    let root = tempfile::tempdir().expect("tempdir");
    let server = GitServer::start(root.path());
    server.create_bare("alice.git");
    let limits = ProxyLimits {
        idle_timeout: Duration::from_secs(1),
        ..ProxyLimits::default()
    };
    let h = Harness::remote(&server, limits);
    // An upstream that answers only after the whole body (as GitLab's front end does).
    server.set_fault(Fault::Stall);
    let rest = h.base.strip_prefix("http://").expect("http base");
    let (host, mount) = rest.split_once('/').expect("mount");
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("x:{}", h.token("alice")));
    let mut stream = std::net::TcpStream::connect(host).expect("connect");
    write!(
        stream,
        "POST /{mount}/alice.git/git-upload-pack HTTP/1.1\r\nHost: {host}\r\n\
         Authorization: Basic {auth}\r\n\
         Content-Type: application/x-git-upload-pack-request\r\n\
         Connection: close\r\nContent-Length: 1000\r\n\r\n0032want"
    )
    .expect("send a head and the start of a body");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    assert!(response.starts_with("HTTP/1.1 408"), "{response}");
    assert!(response.contains("the request body stalled"), "{response}");
}
