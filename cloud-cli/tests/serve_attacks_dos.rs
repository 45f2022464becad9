//! `shmastra-cloud serve` under denial-of-service attacks: aborted and stalled pushes, killed
//! servers, slowloris sockets, request floods and compressed bodies, against the real binary on
//! a real socket with real `git http-backend`.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use testkit::git::git;
use testkit::wait;

use common::attack::*;
use common::{PATIENCE, work_tree};

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
    let children = wait::until_seen(PATIENCE, "the push's http-backend to start", || {
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
    wait::until(PATIENCE, "the stalled push's child", || {
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
    wait::until(PATIENCE, "the in-flight push's child", || {
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
    wait::until(PATIENCE, "the in-flight push's child", || {
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
    // Every slow socket is closed by the server after the header timeout: the configured 2 s,
    // not the default (10 s), which is what the first one, connected at `started`, shows.
    let default = cloud_core::ConnectionLimits::default().header_timeout;
    assert!(
        closed_by_server(&idle[0], default),
        "the first slow socket is closed"
    );
    let first_closed = started.elapsed();
    assert!(
        first_closed < default,
        "the first slow socket was held for {first_closed:?}, as long as the default header timeout"
    );
    let closed = idle
        .iter_mut()
        .take(39)
        .filter(|s| closed_by_server(s, default))
        .count();
    assert_eq!(closed, 39, "slow sockets are closed");
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
    assert!(closed_by_server(&kept, default));
    assert!(
        idle_since.elapsed() < default,
        "an idle connection held as long as the default header timeout"
    );
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
        wait::until_seen(PATIENCE, "a stalled push admitted", || {
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
    let over_user = wait::until_seen(PATIENCE, "alice's third request refused", || {
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
    let over_total = wait::until_seen(PATIENCE, "a fourth request in total refused", || {
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
        PATIENCE,
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
