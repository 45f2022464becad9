//! `shmastra-cloud serve` attacked as a hostile client, a hostile tenant and through a flaky
//! upstream: the real binary on a real socket, real git, real `git http-backend`, and a GitLab
//! double that resolves project paths case-insensitively as GitLab does. Each test states the
//! attack and asserts on what the attacker and the other tenants see.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use testkit::fake_gitlab::{FakeGitLab, GROUP_ID, GROUP_PATH, SERVICE_TOKEN};
use testkit::git::{git, git_output, init_repo};
use testkit::git_server::GitServer;
use testkit::wait;

use common::{DEADLINE, Serve};

const SECRET: &str = "serve-attack-secret-0123456789abcdef";
const WEBHOOK_SECRET: &str = "webhook-attack-secret-0123456789";
const ZERO: &str = "0000000000000000000000000000000000000000";

/// serve signed with this file's secret; its sync command records each event.
fn serve(args: &[&str], env: &[(&str, &str)]) -> Serve {
    Serve::start(SECRET, args, env, "true")
}

/// Like `serve`, with `sync_extra` run by the sync command after it recorded the event.
fn serve_with(args: &[&str], env: &[(&str, &str)], sync_extra: &str) -> Serve {
    Serve::start(SECRET, args, env, sync_extra)
}

/// `token mint --user USER` with the test secret and `env`.
fn token(user: &str, env: &[(&str, &str)]) -> String {
    let out = token_command("mint", user, env);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .trim()
        .to_owned()
}

fn token_command(action: &str, user: &str, env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shmastra-cloud"))
        .args(["token", action, "--user", user])
        .env_clear()
        .env("SHMASTRA_TOKEN_SECRET", SECRET)
        .envs(env.iter().copied())
        .output()
        .expect("shmastra-cloud token")
}

fn basic(token: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("x:{token}"))
    )
}

/// Sends `head` (the request line and headers, without the blank line) and `body`.
fn send_raw(stream: &mut TcpStream, head: &str, body: &[u8]) {
    stream
        .write_all(format!("{head}\r\n\r\n").as_bytes())
        .expect("send head");
    // The server may answer (413, 415) and close before it read the body.
    let _ = stream.write_all(body);
}

/// Reads one whole response (until the server closes or the status line and body arrived).
fn read_response(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                out.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&out);
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    let len = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                        })
                        .unwrap_or(usize::MAX);
                    if body.len() >= len {
                        break;
                    }
                }
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Reads up to the end of a response head.
fn read_head(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut byte = [0u8; 1];
    while !out.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => out.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn status_of(response: &str) -> u16 {
    response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"))
}

/// The head of a receive-pack POST with a declared length.
fn receive_pack_head(user: &str, token: &str, len: usize, extra: &str) -> String {
    format!(
        "POST /api/git/{user}.git/git-receive-pack HTTP/1.1\r\nHost: x\r\nAuthorization: {}\r\nContent-Type: application/x-git-receive-pack-request\r\nContent-Length: {len}{extra}",
        basic(token)
    )
}

fn pkt(line: &str) -> Vec<u8> {
    let mut out = format!("{:04x}", line.len() + 4).into_bytes();
    out.extend_from_slice(line.as_bytes());
    out
}

/// A receive-pack request body: `commands` (old, new, ref), then the pack of `revs` made in
/// `work`.
fn push_body(work: &Path, commands: &[(&str, &str, &str)], revs: &str) -> Vec<u8> {
    let mut body = Vec::new();
    for (i, (old, new, refname)) in commands.iter().enumerate() {
        let line = if i == 0 {
            format!("{old} {new} {refname}\0report-status side-band-64k\n")
        } else {
            format!("{old} {new} {refname}\n")
        };
        body.extend(pkt(&line));
    }
    body.extend_from_slice(b"0000");
    let mut pack = testkit::git::command(work)
        // Stored, not deflated: the pack is as large as its content.
        .args([
            "-c",
            "pack.compression=0",
            "pack-objects",
            "--stdout",
            "-q",
            "--revs",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("git pack-objects");
    pack.stdin
        .take()
        .expect("stdin")
        .write_all(format!("{revs}\n").as_bytes())
        .expect("revs");
    let out = pack.wait_with_output().expect("pack");
    assert!(out.status.success());
    body.extend(out.stdout);
    body
}

/// Processes whose environment holds `needle` (`NAME=value`): the CGI children of one test's
/// upstream directory carry `GIT_PROJECT_ROOT=<dir>`.
fn processes_with_env(needle: &str) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        if environ.split(|&b| b == 0).any(|v| v == needle.as_bytes()) {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            found.push((pid, String::from_utf8_lossy(&cmdline).replace('\0', " ")));
        }
    }
    found
}

/// Whether the server closes `stream` (EOF or reset) within `within`; whatever it sends first
/// is read and skipped.
fn closed_by_server(mut stream: &TcpStream, within: Duration) -> bool {
    stream.set_read_timeout(Some(within)).expect("read timeout");
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

/// A work tree with one commit on `main` whose remote `origin` is `url`; returns its HEAD.
fn work_tree(dir: &Path, url: &str) -> String {
    init_repo(dir);
    std::fs::write(dir.join("a.txt"), "a\n").expect("write");
    git(dir, ["add", "-A"]);
    git(dir, ["commit", "-qm", "first"]);
    git(dir, ["remote", "add", "origin", url]);
    git(dir, ["rev-parse", "HEAD"]).trim().to_owned()
}

fn embedded(extra: &[&str]) -> (Serve, tempfile::TempDir) {
    let up = tempfile::tempdir().expect("tempdir");
    let mut args = vec!["--upstream-dir", up.path().to_str().expect("utf-8")];
    args.extend_from_slice(extra);
    (serve(&args, &[]), up)
}

// ---------------------------------------------------------------------------------------------
// Denial of service

/// A push that declares a length and stops early used to leave `git http-backend` spinning at
/// 100% CPU forever (git's fixed-length reader loops on EOF), outliving serve. Now every CGI
/// child ends with its request, and a stopping server ends the rest.
#[test]
fn an_aborted_push_leaves_no_cgi_child_behind_and_stop_ends_the_rest() {
    let (mut serve, up_dir) = embedded(&["--idle-timeout", "2s"]);
    let up = up_dir.path();
    let marker = format!("GIT_PROJECT_ROOT={}", up.display());
    let alice = token("alice", &[]);
    let body = format!("{ZERO} {} refs/heads/main\0report-status\n", "1".repeat(40));

    // The client hangs up half-way through its declared body.
    let mut hangs_up = serve.connect();
    send_raw(
        &mut hangs_up,
        &receive_pack_head("alice", &alice, 1_000_000, ""),
        &[pkt(&body), b"0000PACK".to_vec()].concat(),
    );
    let children = wait::until_seen(DEADLINE, "the push's http-backend to start", || {
        let found = processes_with_env(&marker);
        if found.is_empty() {
            Err(found)
        } else {
            Ok(found)
        }
    });
    // Children get only what they need: no server secret in their environment.
    for (pid, _) in &children {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let environ = String::from_utf8_lossy(&environ);
        assert!(
            !environ.contains(SECRET),
            "the CGI child {pid} holds the token secret"
        );
        assert!(!environ.contains("SHMASTRA_TOKEN_SECRET"));
    }
    drop(hangs_up);
    wait::until_seen(
        Duration::from_secs(20),
        "no CGI child after the client hung up",
        || {
            let found = processes_with_env(&marker);
            if found.is_empty() { Ok(()) } else { Err(found) }
        },
    );

    // The client stalls (the proxy's own idle timeout ends the request).
    let mut stalls = serve.connect();
    send_raw(
        &mut stalls,
        &receive_pack_head("alice", &alice, 1_000_000, ""),
        &pkt(&body),
    );
    wait::until(DEADLINE, "the stalled push's child", || {
        (!processes_with_env(&marker).is_empty()).then_some(())
    });
    wait::until_seen(
        Duration::from_secs(20),
        "no CGI child after the idle timeout",
        || {
            let found = processes_with_env(&marker);
            if found.is_empty() { Ok(()) } else { Err(found) }
        },
    );

    // A request still in flight when serve stops: its child ends with the server.
    let mut in_flight = serve.connect();
    send_raw(
        &mut in_flight,
        &receive_pack_head("alice", &alice, 1_000_000, ""),
        &pkt(&body),
    );
    wait::until(DEADLINE, "the in-flight push's child", || {
        (!processes_with_env(&marker).is_empty()).then_some(())
    });
    assert!(serve.stop().success());
    wait::until_seen(
        Duration::from_secs(10),
        "no CGI child after serve stopped",
        || {
            let found = processes_with_env(&marker);
            if found.is_empty() { Ok(()) } else { Err(found) }
        },
    );
    drop(in_flight);
}

/// Even a serve killed with SIGKILL (no chance to end its children) leaves no CGI child: with
/// no declared length, http-backend and receive-pack see the closed pipe as the end of input.
#[test]
fn a_killed_serve_leaves_no_cgi_child() {
    let (mut serve, up_dir) = embedded(&[]);
    let marker = format!("GIT_PROJECT_ROOT={}", up_dir.path().display());
    let alice = token("alice", &[]);
    let body = format!("{ZERO} {} refs/heads/main\0report-status\n", "1".repeat(40));
    let mut in_flight = serve.connect();
    send_raw(
        &mut in_flight,
        &receive_pack_head("alice", &alice, 1_000_000, ""),
        &pkt(&body),
    );
    wait::until(DEADLINE, "the in-flight push's child", || {
        (!processes_with_env(&marker).is_empty()).then_some(())
    });
    serve.child.kill().expect("SIGKILL serve");
    serve.child.wait().expect("reap serve");
    wait::until_seen(
        Duration::from_secs(10),
        "no CGI child after serve was killed",
        || {
            let found = processes_with_env(&marker);
            if found.is_empty() { Ok(()) } else { Err(found) }
        },
    );
    drop(in_flight);
}

/// Slowloris: hundreds of sockets that never finish their headers. Past the connection limit
/// new connections get a cheap 503; connections already open keep being served; idle and
/// slow ones are closed after the header timeout, and `/healthz` answers again.
#[test]
fn slowloris_sockets_are_bounded_and_closed_and_healthz_keeps_answering() {
    let (serve, _up) = embedded(&["--max-connections", "40", "--header-timeout", "2s"]);
    // A client connected before the attack, on a kept-alive connection.
    let mut regular = serve.connect();
    let healthz = "GET /healthz HTTP/1.1\r\nHost: x";
    send_raw(&mut regular, healthz, b"");
    assert!(read_response(&mut regular).starts_with("HTTP/1.1 200"));

    let started = Instant::now();
    let mut idle: Vec<TcpStream> = (0..300)
        .map(|_| {
            let mut s = serve.connect();
            let _ = s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n");
            s
        })
        .collect();
    // The regular client is still served while the attack holds every other slot.
    send_raw(&mut regular, healthz, b"");
    let answer = read_response(&mut regular);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // Connections past the limit were answered at once with 503 and Retry-After.
    let refused = idle
        .iter_mut()
        .skip(60)
        .take(20)
        .map(read_response)
        .filter(|r| r.starts_with("HTTP/1.1 503") && r.contains("Retry-After: 5"))
        .count();
    assert_eq!(
        refused, 20,
        "connections past the limit get 503 + Retry-After"
    );
    // Every slow socket is closed by the server after the header timeout.
    let closed = idle
        .iter_mut()
        .take(39)
        .filter(|s| closed_by_server(s, Duration::from_secs(10)))
        .count();
    assert_eq!(closed, 39, "slow sockets are closed");
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(12),
        "slow sockets held for {waited:?}"
    );
    // /healthz answers again from a new connection.
    wait::until_seen(
        Duration::from_secs(10),
        "/healthz from a new connection",
        || {
            let mut s = serve.connect();
            send_raw(&mut s, healthz, b"");
            let r = read_response(&mut s);
            if r.starts_with("HTTP/1.1 200") {
                Ok(())
            } else {
                Err(r)
            }
        },
    );
    // An idle kept-alive connection is closed after the header timeout too.
    let mut kept = serve.connect();
    send_raw(&mut kept, healthz, b"");
    assert!(read_response(&mut kept).starts_with("HTTP/1.1 200"));
    let idle_since = Instant::now();
    assert!(closed_by_server(&kept, Duration::from_secs(10)));
    assert!(idle_since.elapsed() < Duration::from_secs(8));
    idle.clear();
    let logs = serve.logs();
    assert!(
        logs.contains("connection refused: at the connection limit")
            && logs.contains("\"client\":\"127.0.0.1:"),
        "refusals are logged with the client's address:\n{}",
        logs.lines().take(20).collect::<Vec<_>>().join("\n")
    );
}

/// One token held hundreds of stalled pushes, each with its own backend child. Now requests in
/// flight are capped per user (429) and in total (503), both with Retry-After, and a user's
/// slot comes back when their request ends.
#[test]
fn requests_in_flight_are_capped_per_user_and_in_total() {
    let (serve, _up) = embedded(&["--max-requests-per-user", "2", "--max-requests", "3"]);
    let (alice, bob, carol) = (token("alice", &[]), token("bob", &[]), token("carol", &[]));
    // A command line and no more: receive-pack waits for the rest, the request stays open.
    let command = pkt(&format!(
        "{ZERO} {} refs/heads/main\0report-status\n",
        "1".repeat(40)
    ));
    // Admitted once its response head (sent before http-backend reads the body) arrives; a
    // finished request leaves the count a moment after its last byte, so retry until admitted.
    let stalled = |user: &str, token: &str| {
        wait::until_seen(DEADLINE, "a stalled push admitted", || {
            let mut s = serve.connect();
            send_raw(
                &mut s,
                &receive_pack_head(user, token, 1_000_000, ""),
                &command,
            );
            let head = read_head(&mut s);
            if head.starts_with("HTTP/1.1 200") {
                Ok(s)
            } else {
                Err(head)
            }
        })
    };
    let probe = |user: &str, token: &str| {
        let mut s = serve.connect();
        send_raw(
            &mut s,
            &format!(
                "GET /api/git/{user}.git/info/refs?service=git-upload-pack HTTP/1.1\r\nHost: x\r\nAuthorization: {}\r\nConnection: close",
                basic(token)
            ),
            b"",
        );
        read_response(&mut s)
    };
    assert!(probe("alice", &alice).starts_with("HTTP/1.1 200"));
    let alice_stalled = [stalled("alice", &alice), stalled("alice", &alice)];
    let over_user = wait::until_seen(DEADLINE, "alice's third request refused", || {
        let r = probe("alice", &alice);
        if r.starts_with("HTTP/1.1 429") {
            Ok(r)
        } else {
            Err(r)
        }
    });
    assert!(
        over_user.to_ascii_lowercase().contains("retry-after: 5"),
        "{over_user}"
    );
    assert!(
        probe("bob", &bob).starts_with("HTTP/1.1 200"),
        "other users are served"
    );
    let bob_stalled = stalled("bob", &bob);
    let over_total = wait::until_seen(DEADLINE, "a fourth request in total refused", || {
        let r = probe("carol", &carol);
        if r.starts_with("HTTP/1.1 503") {
            Ok(r)
        } else {
            Err(r)
        }
    });
    assert!(
        over_total.to_ascii_lowercase().contains("retry-after: 5"),
        "{over_total}"
    );
    drop(alice_stalled);
    drop(bob_stalled);
    wait::until_seen(
        DEADLINE,
        "alice served again once her requests ended",
        || {
            let r = probe("alice", &alice);
            if r.starts_with("HTTP/1.1 200") {
                Ok(())
            } else {
                Err(r)
            }
        },
    );
    let logs = serve.logs();
    assert!(
        logs.lines()
            .any(|l| l.contains("\"status\":429") && l.contains("\"client\":\"127.0.0.1:")),
        "429 logged with the client address"
    );
}

/// `--max-request-bytes` counted compressed bytes: a small gzip body inflated to a large push
/// inside http-backend, and its commands were hidden from push detection. Compressed push
/// bodies are refused before anything reaches the upstream.
#[test]
fn a_compressed_push_is_refused_and_stores_nothing() {
    let (serve, up_dir) = embedded(&["--max-request-bytes", "100000"]);
    let up = up_dir.path();
    let work = serve.tmp.path().join("work");
    let head = work_tree(&work, &serve.remote_url("alice"));
    // 1 MB of zeros: compresses to about 1 KB.
    std::fs::write(work.join("zeros.bin"), vec![0u8; 1 << 20]).expect("write");
    git(&work, ["add", "-A"]);
    git(&work, ["commit", "-qm", "zeros"]);
    let big = git(&work, ["rev-parse", "HEAD"]).trim().to_owned();
    let plain = push_body(&work, &[(ZERO, &big, "refs/heads/main")], &big);
    let mut gzip = Command::new("gzip")
        .arg("-c")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("gzip");
    gzip.stdin
        .take()
        .expect("stdin")
        .write_all(&plain)
        .expect("gzip input");
    let gzipped = gzip.wait_with_output().expect("gzip").stdout;
    assert!(
        gzipped.len() < 100_000 && plain.len() > 1_000_000,
        "{} bytes gzipped, {} plain",
        gzipped.len(),
        plain.len()
    );

    let mut s = serve.connect();
    send_raw(
        &mut s,
        &receive_pack_head(
            "alice",
            &token("alice", &[]),
            gzipped.len(),
            "\r\nContent-Encoding: gzip",
        ),
        &gzipped,
    );
    let response = read_response(&mut s);
    assert_eq!(status_of(&response), 415, "{response}");
    let bare = up.join("alice.git");
    if bare.exists() {
        let refs = git(&bare, ["for-each-ref"]);
        assert!(refs.is_empty(), "the compressed push stored {refs}");
    }
    assert!(serve.events().is_empty());
    // The same push uncompressed is over the byte limit and refused as such.
    let mut s = serve.connect();
    send_raw(
        &mut s,
        &receive_pack_head("alice", &token("alice", &[]), plain.len(), ""),
        &plain,
    );
    assert_eq!(status_of(&read_response(&mut s)), 413);
    let _ = head;
}

// ---------------------------------------------------------------------------------------------
// Tenants

/// The fake GitLab API and a real git server holding the group's repositories, which only
/// accepts the service token.
struct GitLabSetup {
    gitlab: FakeGitLab,
    server: GitServer,
    _repos: tempfile::TempDir,
    _runtime: tokio::runtime::Runtime,
}

impl GitLabSetup {
    fn start() -> GitLabSetup {
        let repos = tempfile::tempdir().expect("tempdir");
        let server = GitServer::start(repos.path());
        server.require_password(SERVICE_TOKEN);
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        let gitlab = runtime.block_on(FakeGitLab::start());
        gitlab.set_repo_base(&server.base_url());
        GitLabSetup {
            gitlab,
            server,
            _repos: repos,
            _runtime: runtime,
        }
    }

    /// A user project in the group, known to the API and present on the git server.
    fn project(&self, path: &str) -> PathBuf {
        self.gitlab.add_project(path);
        self.server.create_bare(&format!("{GROUP_PATH}/{path}.git"))
    }

    fn serve(&self, extra_env: &[(&str, &str)]) -> Serve {
        let group = GROUP_ID.to_string();
        let api = self.gitlab.api_url();
        let mut env = vec![
            ("GITLAB_SERVICE_TOKEN", SERVICE_TOKEN),
            ("GITLAB_GROUP_ID", group.as_str()),
            ("GITLAB_API_URL", api.as_str()),
            ("GITLAB_WEBHOOK_SECRET", WEBHOOK_SECRET),
        ];
        env.extend_from_slice(extra_env);
        serve(&[], &env)
    }
}

fn http() -> (tokio::runtime::Runtime, reqwest::Client) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    (runtime, reqwest::Client::new())
}

/// GET `url` with `token` as the basic-auth password: status and body.
fn get_with(url: &str, token: Option<&str>) -> (u16, String) {
    let (runtime, client) = http();
    runtime.block_on(async {
        let mut request = client.get(url);
        if let Some(token) = token {
            request = request.basic_auth("x", Some(token));
        }
        let response = request.send().await.expect("serve answers");
        let status = response.status().as_u16();
        (status, response.text().await.expect("body"))
    })
}

fn post_webhook(serve: &Serve, headers: &[(&str, &str)], body: String) -> (u16, String) {
    let (runtime, client) = http();
    runtime.block_on(async {
        let mut request = client
            .post(serve.url("/api/gitlab/webhook"))
            .header("x-gitlab-token", WEBHOOK_SECRET)
            .header("x-gitlab-event", "Push Hook")
            .body(body);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await.expect("webhook answers");
        let status = response.status().as_u16();
        (status, response.text().await.expect("body"))
    })
}

fn push_payload(project: &str, refname: &str, new_oid: &str) -> String {
    serde_json::json!({
        "object_kind": "push",
        "ref": refname,
        "before": ZERO,
        "after": new_oid,
        "project": { "path_with_namespace": project },
    })
    .to_string()
}

/// GitLab resolves `group/alice` to a project named `group/Alice`. An upper-case id is refused
/// at the edge, and the project GitLab answers with is checked against the one asked for
/// before any git traffic goes to it.
#[test]
fn user_ids_differing_in_case_never_reach_another_tenants_project() {
    let setup = GitLabSetup::start();
    let victim = setup.project("Alice");
    let seed = tempfile::tempdir().expect("tempdir");
    let secret_head = work_tree(seed.path(), victim.to_str().expect("utf-8"));
    git(seed.path(), ["push", "-q", "origin", "main"]);

    let out = token_command("mint", "Alice", &[]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("upper-case"), "{stderr}");

    let serve = setup.serve(&[]);
    let git_requests = setup.server.requests().len();
    let out = git_output(serve.tmp.path(), ["ls-remote", &serve.remote_url("alice")]);
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success(),
        "alice listed Alice's project: {listed}"
    );
    assert!(!listed.contains(&secret_head));
    assert_eq!(
        setup.server.requests().len(),
        git_requests,
        "no git traffic went to another tenant's project"
    );
    assert!(
        serve.logs().contains("another tenant's project"),
        "{}",
        serve.logs()
    );
    assert!(
        setup.gitlab.projects().iter().all(|p| p.path != "alice"),
        "no look-alike project was created either"
    );
}

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

/// Every pushed branch was one run of the sync command, in one global queue run one at a
/// time: one user's big push starved everyone's sync. Runs are now coalesced per user, and
/// one user's volume never delays another's.
#[test]
fn one_users_push_volume_never_delays_another_users_sync() {
    let up = tempfile::tempdir().expect("tempdir");
    let serve = serve_with(
        &["--upstream-dir", up.path().to_str().expect("utf-8")],
        &[],
        "if [ \"$SHMASTRA_USER\" = alice ]; then sleep 8; fi",
    );
    let alice = serve.tmp.path().join("alice");
    work_tree(&alice, &serve.remote_url("alice"));
    let refspecs: Vec<String> = (0..30)
        .map(|n| format!("main:refs/heads/b{n:02}"))
        .collect();
    let mut args = vec!["push", "-q", "origin"];
    args.extend(refspecs.iter().map(String::as_str));
    git(&alice, args);
    let bob = serve.tmp.path().join("bob");
    let bob_head = work_tree(&bob, &serve.remote_url("bob"));
    let pushed = Instant::now();
    git(&bob, ["push", "-q", "origin", "main"]);
    wait::until_seen(
        Duration::from_secs(6),
        "bob's sync while alice's runs",
        || {
            let events = serve.events();
            if events.contains(&format!("bob refs/heads/main {bob_head}")) {
                Ok(())
            } else {
                Err(events)
            }
        },
    );
    assert!(pushed.elapsed() < Duration::from_secs(8));
    // Alice's 30 branches: one run going on, then at most one more, the last with the newest
    // (one run in all when the pushes were queued before a worker claimed the first).
    let finished = |user: &str| {
        serve
            .logs()
            .lines()
            .filter(|l| {
                l.contains("sync command finished") && l.contains(&format!("\"user\":\"{user}\""))
            })
            .count()
    };
    let alice_runs = || -> Vec<String> {
        serve
            .events()
            .into_iter()
            .filter(|e| e.starts_with("alice "))
            .collect()
    };
    wait::until_seen(
        DEADLINE,
        "alice's runs to finish with the newest push",
        || {
            let runs = alice_runs();
            if finished("alice") == runs.len()
                && runs
                    .last()
                    .is_some_and(|r| r.starts_with("alice refs/heads/b29 "))
            {
                Ok(())
            } else {
                Err(runs)
            }
        },
    );
    let runs = alice_runs();
    assert!((1..=2).contains(&runs.len()), "{runs:?}");
}

/// Two replicas behind a load balancer kept their webhook memories apart: a push through one
/// and GitLab's echo of it to the other started a second sync, and a delivery retried to the
/// other replica fired again. With one database both are known to every replica.
#[test]
fn replicas_on_one_database_share_the_echo_and_delivery_memory() {
    let db = testkit::postgres::Postgres::start();
    let setup = GitLabSetup::start();
    setup.project("alice");
    let url = db.url();
    let a = setup.serve(&[("DATABASE_URL", url.as_str())]);
    let b = setup.serve(&[("DATABASE_URL", url.as_str())]);
    let work = a.tmp.path().join("alice");
    let head = work_tree(&work, &a.remote_url("alice"));
    git(&work, ["push", "-q", "origin", "main"]);
    let echo = push_payload(&format!("{GROUP_PATH}/alice"), "refs/heads/main", &head);
    assert_eq!(
        post_webhook(&b, &[], echo).1.trim(),
        "seen by the proxy",
        "replica b knows the push replica a proxied"
    );
    let other = "6".repeat(40);
    let payload = push_payload(&format!("{GROUP_PATH}/alice"), "refs/heads/main", &other);
    let delivery = [("idempotency-key", "7d1f0a9e-3333-4f5e-9b8e-1a2b3c4d5e6f")];
    assert_eq!(
        post_webhook(&a, &delivery, payload.clone()).1.trim(),
        "external push"
    );
    assert_eq!(
        post_webhook(&b, &delivery, payload).1.trim(),
        "already handled",
        "a retry of the delivery to replica b"
    );
    // The sync runs on whichever replica claimed it: for the proxied push and the direct one,
    // never for the echo or the retry.
    let events = || {
        let mut all = a.events();
        all.extend(b.events());
        all
    };
    wait::until_seen(DEADLINE, "a run with the direct push", || {
        let all = events();
        if all.contains(&format!("alice refs/heads/main {other}")) {
            Ok(())
        } else {
            Err(all)
        }
    });
    let all = events();
    assert!(all.len() <= 2, "{all:?}");
}

/// The de-duplication memory was one global list of 4096 updates, recorded when the commands
/// were read: a push of thousands of refs (or a failed request naming them) evicted other
/// users' pushes, and GitLab's echo of those then started a spurious sync; a refused update
/// counted as seen. The memory is per user now, and holds only what the server stored.
#[test]
fn the_push_memory_is_per_user_and_holds_only_stored_pushes() {
    let setup = GitLabSetup::start();
    setup.project("alice");
    setup.project("bob");
    let serve = setup.serve(&[]);
    let work = serve.tmp.path().join("alice");
    let head = work_tree(&work, &serve.remote_url("alice"));
    git(&work, ["push", "-q", "origin", "main"]);
    serve.wait_for_events(1);

    // Bob: ref updates with a pack that does not unpack; nothing is stored.
    let fake_oid = "ab".repeat(20);
    let mut body = Vec::new();
    for n in 0..5 {
        let caps = if n == 0 {
            "\0report-status side-band-64k"
        } else {
            ""
        };
        body.extend(pkt(&format!("{ZERO} {fake_oid} refs/heads/b{n}{caps}\n")));
    }
    body.extend_from_slice(b"0000PACK\0\0\0\x02\0\0\0\x01not a pack at all");
    let mut s = serve.connect();
    send_raw(
        &mut s,
        &receive_pack_head("bob", &token("bob", &[]), body.len(), ""),
        &body,
    );
    let response = read_response(&mut s);
    assert!(response.contains("unpack "), "{response}");
    assert!(!response.contains("ok refs/heads/b0"), "{response}");
    // The same update made directly at GitLab is external: the proxy never stored it.
    let (status, answer) = post_webhook(
        &serve,
        &[],
        push_payload(&format!("{GROUP_PATH}/bob"), "refs/heads/b0", &fake_oid),
    );
    assert_eq!((status, answer.trim()), (200, "external push"));

    // Bob: one push of 5000 branches (more than the old global memory of 4096), all stored.
    let bob = serve.tmp.path().join("bob");
    work_tree(&bob, &serve.remote_url("bob"));
    let refspecs: Vec<String> = (0..5000)
        .map(|n| format!("main:refs/heads/many/{n}"))
        .collect();
    let mut args = vec!["push", "-q", "origin"];
    args.extend(refspecs.iter().map(String::as_str));
    git(&bob, args);

    // GitLab's echo of alice's proxied push: still recognised, no second sync for alice.
    let (status, answer) = post_webhook(
        &serve,
        &[],
        push_payload(&format!("{GROUP_PATH}/alice"), "refs/heads/main", &head),
    );
    assert_eq!((status, answer.trim()), (200, "seen by the proxy"));
    let events = serve.wait_for_events(3);
    assert_eq!(
        events[..2],
        [
            format!("alice refs/heads/main {head}"),
            format!("bob refs/heads/b0 {fake_oid}")
        ]
    );
    assert_eq!(
        events.iter().filter(|e| e.starts_with("alice ")).count(),
        1,
        "{events:?}"
    );
}

/// A command the server reported `ng` (the same ref listed twice: one stored, one refused)
/// fired an event, one of them for an object id that was never stored. Only commands reported
/// `ok`, and unambiguous, fire.
#[test]
fn a_command_reported_ng_fires_no_event() {
    let (serve, up_dir) = embedded(&[]);
    let up = up_dir.path();
    let work = serve.tmp.path().join("work");
    let first = work_tree(&work, &serve.remote_url("alice"));
    std::fs::write(work.join("b.txt"), "b\n").expect("write");
    git(&work, ["add", "-A"]);
    git(&work, ["commit", "-qm", "second"]);
    let second = git(&work, ["rev-parse", "HEAD"]).trim().to_owned();
    let body = push_body(
        &work,
        &[
            (ZERO, &first, "refs/heads/main"),
            (ZERO, &second, "refs/heads/main"),
        ],
        &second,
    );
    let mut s = serve.connect();
    send_raw(
        &mut s,
        &receive_pack_head("alice", &token("alice", &[]), body.len(), ""),
        &body,
    );
    let response = read_response(&mut s);
    assert!(response.contains("ng refs/heads/main"), "{response}");
    let stored = git(&up.join("alice.git"), ["rev-parse", "main"])
        .trim()
        .to_owned();
    assert!(stored == first || stored == second);

    // A later push of another branch is the first and only event.
    git(&work, ["push", "-q", "origin", "main:refs/heads/later"]);
    assert_eq!(
        serve.wait_for_events(1),
        [format!("alice refs/heads/later {second}")]
    );
}

/// Any token holder could force-push `main` to an unrelated root and delete `recovery/*`
/// branches and tags. The embedded upstream protects them as GitLab protects the default
/// branch; `--allow-history-rewrite` is the documented switch.
#[test]
fn history_is_protected_unless_the_operator_allows_rewriting_it() {
    for allow in [false, true] {
        let extra: &[&str] = if allow {
            &["--allow-history-rewrite"]
        } else {
            &[]
        };
        let (serve, up_dir) = embedded(extra);
        let up = up_dir.path();
        let bare = up.join("alice.git");
        let work = serve.tmp.path().join("work");
        let head = work_tree(&work, &serve.remote_url("alice"));
        git(&work, ["tag", "v1"]);
        git(
            &work,
            [
                "push",
                "-q",
                "origin",
                "main",
                "main:refs/heads/recovery/20260101T000000Z",
                "main:refs/heads/feature",
                "v1",
            ],
        );
        git(&work, ["checkout", "-q", "--orphan", "unrelated"]);
        std::fs::write(work.join("a.txt"), "rewritten\n").expect("write");
        git(&work, ["commit", "-qam", "unrelated root"]);
        let root = git(&work, ["rev-parse", "HEAD"]).trim().to_owned();
        let attempts: [&[&str]; 3] = [
            &["push", "-q", "-f", "origin", "unrelated:main"],
            &[
                "push",
                "-q",
                "origin",
                ":refs/heads/recovery/20260101T000000Z",
            ],
            &["push", "-q", "origin", ":refs/tags/v1"],
        ];
        for attempt in attempts {
            let out = git_output(&work, attempt);
            assert_eq!(
                out.status.success(),
                allow,
                "{attempt:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            if !allow {
                assert!(String::from_utf8_lossy(&out.stderr).contains("is protected"));
            }
        }
        let refs = git(&bare, ["for-each-ref", "--format=%(refname) %(objectname)"]);
        if allow {
            assert!(
                !refs.contains("refs/tags/v1") && !refs.contains("recovery/"),
                "{refs}"
            );
        } else {
            assert!(refs.contains(&format!("refs/heads/main {head}")), "{refs}");
            assert!(
                refs.contains("refs/heads/recovery/20260101T000000Z"),
                "{refs}"
            );
            assert!(refs.contains("refs/tags/v1"), "{refs}");
            // Other branches stay the user's to delete; main still moves forward.
            git(&work, ["push", "-q", "origin", ":feature"]);
            git(&work, ["checkout", "-q", "main"]);
            std::fs::write(work.join("c.txt"), "c\n").expect("write");
            git(&work, ["add", "-A"]);
            git(&work, ["commit", "-qm", "forward"]);
            git(&work, ["push", "-q", "origin", "main"]);
        }
        // The refused force-push fired no event with the unrelated root.
        if !allow {
            let events = serve.events();
            assert!(!events.iter().any(|e| e.contains(&root)), "{events:?}");
        }
    }
}

/// Tokens were valid forever and could not be revoked per user. Revoking (or rotating) one
/// user's token refuses it at the next request, without a restart, while every other user's
/// token and the signing secret stay as they are.
#[test]
fn a_revoked_token_is_refused_at_once_and_other_users_keep_theirs() {
    let state = tempfile::tempdir().expect("tempdir");
    let state_dir = state.path().to_str().expect("utf-8");
    let env = [("SHMASTRA_TOKEN_STATE", state_dir)];
    let up = tempfile::tempdir().expect("tempdir");
    let serve = serve(
        &["--upstream-dir", up.path().to_str().expect("utf-8")],
        &env,
    );
    let refs = |user: &str| {
        format!(
            "{}/api/git/{user}.git/info/refs?service=git-upload-pack",
            serve.url("")
        )
    };
    let leaked = token("alice", &env);
    let bobs = token("bob", &env);
    assert_eq!(get_with(&refs("alice"), Some(&leaked)).0, 200);

    let out = token_command("rotate", "alice", &env);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rotated = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert_ne!(rotated, leaked);
    assert_eq!(
        get_with(&refs("alice"), Some(&leaked)).0,
        401,
        "the leaked token is refused"
    );
    assert_eq!(get_with(&refs("alice"), Some(&rotated)).0, 200);
    assert_eq!(
        get_with(&refs("bob"), Some(&bobs)).0,
        200,
        "bob's token still works"
    );
    assert_eq!(
        token("alice", &env),
        rotated,
        "mint prints the current token"
    );

    let out = token_command("revoke", "alice", &env);
    assert!(out.status.success());
    assert_eq!(get_with(&refs("alice"), Some(&rotated)).0, 401);
    // Without the state directory there is nowhere to record a revocation: a usage error.
    let out = token_command("revoke", "alice", &[]);
    assert_eq!(out.status.code(), Some(2));
}

// ---------------------------------------------------------------------------------------------
// Webhook and hygiene

/// The webhook took the user from the last path segment of any project, so a project in
/// another namespace could trigger a user's sync, and a replayed delivery fired again.
#[test]
fn the_webhook_accepts_only_the_group_and_fires_once_per_delivery() {
    let setup = GitLabSetup::start();
    let serve = setup.serve(&[]);
    let oid = "4".repeat(40);
    for elsewhere in [
        "attacker/alice",
        "shmastra-users/sub/alice",
        "Shmastra-Users/alice",
        "shmastra-usersx/alice",
    ] {
        let (status, answer) = post_webhook(
            &serve,
            &[],
            push_payload(elsewhere, "refs/heads/main", &oid),
        );
        assert_eq!(status, 200);
        assert_eq!(
            answer.trim(),
            "ignored: project is not in the configured group",
            "{elsewhere}"
        );
    }
    let delivery = [(
        "x-gitlab-event-uuid",
        "0d6c3b1e-7f0a-4f5e-9b8e-1a2b3c4d5e6f",
    )];
    let payload = push_payload(&format!("{GROUP_PATH}/alice"), "refs/heads/main", &oid);
    assert_eq!(
        post_webhook(&serve, &delivery, payload.clone()).1.trim(),
        "external push"
    );
    assert_eq!(
        post_webhook(&serve, &delivery, payload.clone()).1.trim(),
        "already handled"
    );
    let retry = [("idempotency-key", "5c1f0a9e-2222-4f5e-9b8e-1a2b3c4d5e6f")];
    let other = "5".repeat(40);
    let payload = push_payload(&format!("{GROUP_PATH}/alice"), "refs/heads/main", &other);
    assert_eq!(
        post_webhook(&serve, &retry, payload.clone()).1.trim(),
        "external push"
    );
    assert_eq!(
        post_webhook(&serve, &retry, payload).1.trim(),
        "already handled"
    );
    assert_eq!(
        serve.wait_for_events(2),
        [
            format!("alice refs/heads/main {oid}"),
            format!("alice refs/heads/main {other}")
        ]
    );
    // Refusals name the client.
    let (runtime, client) = http();
    let status = runtime.block_on(async {
        client
            .post(serve.url("/api/gitlab/webhook"))
            .header("x-gitlab-token", "wrong")
            .body("{}")
            .send()
            .await
            .expect("answer")
            .status()
            .as_u16()
    });
    assert_eq!(status, 401);
    assert!(
        serve
            .logs()
            .lines()
            .any(|l| l.contains("\"status\":401") && l.contains("\"client\":\"127.0.0.1:"))
    );
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
    let sync = wait::until(DEADLINE, "the sync command's env", || {
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
