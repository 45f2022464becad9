//! The workspace page on two `shmastra-cloud serve` replicas (the real binary) over one real
//! PostgreSQL and one embedded upstream: replica A runs the sandboxes, replica B only serves
//! pages. A sign-in link works once across both; a status A sets (the sandbox coming up, a
//! failed sync with its step and tail) shows on B's page and arrives on B's event stream; with
//! the database down a link is refused with 503 and stays unspent for when it is back.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};

use reqwest::StatusCode;
use testkit::git::git;
use testkit::postgres::Postgres;

use common::workspace::{SECRET, Workspace};
use common::{PATIENCE, Serve};

fn block<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

/// GET with an optional session cookie: status, `Set-Cookie`'s session value, body.
fn get(url: &str, cookie: Option<&str>) -> (StatusCode, Option<String>, String) {
    block(async {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("client");
        let mut request = client.get(url);
        if let Some(cookie) = cookie {
            request = request.header("cookie", format!("shmastra_session={cookie}"));
        }
        let response = request.send().await.expect("GET");
        let status = response.status();
        let session = response
            .headers()
            .get("set-cookie")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("shmastra_session="))
            .and_then(|v| v.split(';').next())
            .map(str::to_owned);
        (status, session, response.text().await.expect("body"))
    })
}

/// `link` (minted with A's address) redeemed on `serve` by its sign-in page's button.
fn open_on(link: &str, minted_on: &Serve, serve: &Serve) -> (StatusCode, Option<String>, String) {
    let (status, headers, body) = common::page::redeem(
        &link.replacen(&minted_on.url(""), &serve.url(""), 1),
        Some(&serve.url("")),
    );
    let session = headers
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("shmastra_session="))
        .and_then(|v| v.split(';').next())
        .map(str::to_owned);
    (status, session, body)
}

/// The `data-state` of the status block in a page or an event.
fn state_of(html: &str) -> Option<&str> {
    let at = html.find("data-state=\"")? + 12;
    html[at..].split('"').next()
}

/// An open `GET /u/<user>/events` on `serve`: every line it sends is appended to `lines`
/// (HTTP/1.0, so the body is not chunked).
fn follow_events(serve: &Serve, user: &str, cookie: &str) -> Arc<Mutex<Vec<String>>> {
    let mut stream = serve.connect();
    write!(
        stream,
        "GET /u/{user}/events HTTP/1.0\r\nHost: x\r\nCookie: shmastra_session={cookie}\r\nAccept: text/event-stream\r\n\r\n"
    )
    .expect("send");
    stream
        .set_read_timeout(None)
        .expect("no read timeout: the stream is long-lived");
    let lines = Arc::new(Mutex::new(Vec::new()));
    let seen = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { return };
            seen.lock().expect("lines").push(line);
        }
    });
    lines
}

/// The states of the status events received so far, in order.
fn event_states(lines: &Mutex<Vec<String>>) -> Vec<String> {
    lines
        .lock()
        .expect("lines")
        .iter()
        .filter(|l| l.starts_with("data:"))
        .filter_map(|l| state_of(l).map(str::to_owned))
        .collect()
}

fn commit_push(laptop: &Path, files: &[(&str, Option<&str>)], message: &str) {
    for (path, body) in files {
        match body {
            Some(body) => std::fs::write(laptop.join(path), body).expect("write"),
            None => std::fs::remove_file(laptop.join(path)).expect("remove"),
        }
    }
    git(laptop, ["add", "-A"]);
    git(laptop, ["commit", "-qm", message]);
    git(laptop, ["push", "-q", "origin", "HEAD:main"]);
}

#[test]
fn two_replicas_share_sign_in_links_and_statuses() {
    let db = Postgres::start();
    let url = db.url();
    let a = Workspace::start_with_env(&[], &[("DATABASE_URL", &url)], |_| {});
    let upstream = a.upstream.display().to_string();
    let b = Serve::start(
        SECRET,
        &["--upstream-dir", &upstream],
        &[("DATABASE_URL", &url)],
        "true",
    );

    // A link redeemed on A is used up on B, and the other way round.
    let link = a.link("alice", "15m");
    let (status, a_cookie, body) = open_on(&link, &a.serve, &a.serve);
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _, body) = open_on(&link, &a.serve, &b);
    assert_eq!(
        status,
        StatusCode::GONE,
        "redeemed on A, again on B: {body}"
    );
    assert!(body.contains("already used"), "{body}");
    let link = a.link("alice", "15m");
    let (status, b_cookie, body) = open_on(&link, &a.serve, &b);
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _, _) = open_on(&link, &a.serve, &a.serve);
    assert_eq!(status, StatusCode::GONE, "redeemed on B, again on A");
    let (a_cookie, b_cookie) = (
        a_cookie.expect("A's session"),
        b_cookie.expect("B's session"),
    );

    // B runs no sandbox: before A sets anything, its page has no status.
    let (status, _, page) = get(&b.url("/u/alice"), Some(&b_cookie));
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(state_of(&page), Some("none"), "{page}");
    let events = follow_events(&b, "alice", &b_cookie);
    testkit::wait::until_seen(PATIENCE, "B's first status event", || {
        let states = event_states(&events);
        if states.first().map(String::as_str) == Some("none") {
            Ok(())
        } else {
            Err(states)
        }
    });

    // A's page brings alice's sandbox up; B's page and B's stream show it.
    let (status, _, _) = get(&a.serve.url("/u/alice"), Some(&a_cookie));
    assert_eq!(status, StatusCode::OK);
    testkit::wait::until_seen(PATIENCE, "ready on B's event stream", || {
        let states = event_states(&events);
        if states.last().map(String::as_str) == Some("ready") {
            Ok(())
        } else {
            Err(states)
        }
    });
    let (_, _, page) = get(&b.url("/u/alice"), Some(&b_cookie));
    assert_eq!(state_of(&page), Some("ready"), "{page}");

    // A push whose install fails, synced by A: B shows the failure, step and tail.
    let tmp = tempfile::tempdir().expect("tempdir");
    let laptop = tmp.path().join("laptop");
    a.laptop("alice", &laptop);
    commit_push(
        &laptop,
        &[
            (
                "package.json",
                Some("{\"dependencies\": {\"left-pad\": \"9.9.9\"}}\n"),
            ),
            ("break-install", Some("\n")),
        ],
        "laptop: a dependency that does not exist",
    );
    testkit::wait::until_seen(PATIENCE, "broken on B's event stream", || {
        let states = event_states(&events);
        if states.last().map(String::as_str) == Some("broken") {
            Ok(())
        } else {
            Err(states)
        }
    });
    let (_, _, page) = get(&b.url("/u/alice"), Some(&b_cookie));
    assert_eq!(state_of(&page), Some("broken"), "{page}");
    assert!(
        page.contains(r#"<strong id="failure-step">install</strong>"#),
        "{page}"
    );
    // The cause, first in npm's output, is kept (through the store) above the usage text.
    assert!(
        page.contains(
            "<pre id=\"failure-first\">npm ERR! code ETARGET\n\
             npm ERR! notarget No matching version found for left-pad@9.9.9</pre>"
        ),
        "{page}"
    );

    // The database down: a link cannot be spent, so it is refused (503) and still works later.
    // (`login-link` reads the generation from the database: minted before it goes.)
    let link = a.link("alice", "15m");
    db.stop();
    let (status, _, body) = open_on(&link, &a.serve, &b);
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains("not possible right now"), "{body}");
    db.start_server();
    testkit::wait::until_seen(
        PATIENCE,
        "the link to sign in once the database is back",
        || {
            let (status, _, body) = open_on(&link, &a.serve, &b);
            if status == StatusCode::OK {
                Ok(())
            } else {
                Err((status, body))
            }
        },
    );
    let (status, _, _) = open_on(&link, &a.serve, &a.serve);
    assert_eq!(status, StatusCode::GONE, "spent once the database was back");
    drop(b);
    drop(a);
}
