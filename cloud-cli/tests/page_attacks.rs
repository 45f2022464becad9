//! The workspace page of the real `serve` attacked (issue 27): each test states the attack and
//! asserts on what the attacker and the user see.

mod common;

use std::path::Path;
use std::process::Command;

use reqwest::StatusCode;
use reqwest::header::SET_COOKIE;
use testkit::wait::until;

use common::page::{block, client, get, post, redeem, saved_project_with_secrets, sign_in};
use common::workspace::{SECRET, Workspace, csrf_of};
use common::{PATIENCE, Serve};

/// serve with the embedded upstream and its token state in `state` (no sandboxes: the page
/// shows history only).
fn serve_with_state(state: &Path) -> Serve {
    serve_with_state_and(state, &[])
}

/// [`serve_with_state`] with more flags.
fn serve_with_state_and(state: &Path, extra: &[&str]) -> Serve {
    let up = state.parent().expect("a parent").join("upstream");
    let mut args = vec!["--upstream-dir", up.to_str().expect("utf-8")];
    args.extend_from_slice(extra);
    Serve::start(
        SECRET,
        &args,
        &[("SHMASTRA_TOKEN_STATE", state.to_str().expect("utf-8"))],
        "true",
    )
}

/// The real `login-link` for `user` on `serve`, generations read from `state`.
fn link(serve: &Serve, state: &Path, user: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_shmastra-cloud"))
        .args(["login-link", "--user", user, "--public-url", &serve.url("")])
        .env_clear()
        .env("SHMASTRA_TOKEN_SECRET", SECRET)
        .env("SHMASTRA_TOKEN_STATE", state)
        .output()
        .expect("login-link");
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

/// `HEAD url`: the status and whether a cookie was set.
fn head(url: &str) -> (StatusCode, bool) {
    block(async {
        let response = client().head(url).send().await.expect("HEAD");
        (
            response.status(),
            response.headers().contains_key(SET_COOKIE),
        )
    })
}

/// The `dotenv` Next.js ships (`@next/env`), and the newest.
const DOTENV_VERSIONS: [&str; 2] = ["16.4.5", "18.0.10"];

/// `path` as Node's `dotenv` of `version` parses it (run by node), as JSON.
fn node_dotenv(version: &str, path: &Path) -> serde_json::Value {
    let module = testkit::npm::package("dotenv", version);
    let out = Command::new("node")
        .arg("-e")
        .arg("process.stdout.write(JSON.stringify(require(process.argv[1]).parse(require('fs').readFileSync(process.argv[2]))))")
        .arg(&module)
        .arg(path)
        .output()
        .expect("node is installed");
    assert!(
        out.status.success(),
        "node: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("dotenv's JSON")
}

/// The restore form's `.env` was quoted for dotenvy alone: a value `x'`, a line break and
/// `NODE_OPTIONS=--require /tmp/evil.js #` became a second variable for Node's `dotenv` (which
/// Next.js, Vite and Mastra read `.env` with), and a value with `'` arrived corrupted. A value
/// is now written in a form both read exactly, and one no form carries is refused next to its
/// field, with nothing written.
#[test]
fn the_restore_forms_env_reads_the_same_in_node_and_dotenvy_or_is_refused() {
    let ws = Workspace::start(&[], saved_project_with_secrets);
    let (cookie, _) = sign_in(&ws.link("alice", "15m"));
    let page_url = ws.serve.url("/u/alice");
    let form_page = || {
        until(PATIENCE, "the restore form", || {
            let (_, _, page) = get(&page_url, Some(&cookie));
            page.contains("id=\"restore-project\"").then_some(page)
        })
    };
    let submit = |fields: &[(&str, &str)]| {
        let csrf = csrf_of(&form_page());
        let mut form = vec![("csrf", csrf.as_str())];
        form.extend_from_slice(fields);
        let (status, _) = post(
            &ws.serve.url("/u/alice/restore-project"),
            &cookie,
            Some(&ws.serve.url("")),
            &form,
        );
        assert_eq!(status, StatusCode::SEE_OTHER);
    };
    let env_file = ws.project("alice").join(".env");

    submit(&[
        ("env.API_KEY", "x'\nNODE_OPTIONS=--require /tmp/evil.js #"),
        ("env.DATABASE_URL", "postgres://db"),
    ]);
    assert!(
        !env_file.exists(),
        "the form was taken; Node's dotenv reads {}",
        node_dotenv(DOTENV_VERSIONS[0], &env_file)
    );
    let page = form_page();
    assert!(
        page.contains("data-field=\"API_KEY\"") && page.contains("every tool reads it the same"),
        "the refusal is shown next to the field"
    );
    assert!(!page.contains("evil.js"), "a submitted value came back");

    let api_key = "it's mine";
    let database_url = r#"postgres://u:p@db/x?a=1#frag "quoted" \ $HOME `tick`"#;
    submit(&[("env.API_KEY", api_key), ("env.DATABASE_URL", database_url)]);
    let expected = serde_json::json!({"API_KEY": api_key, "DATABASE_URL": database_url});
    for version in DOTENV_VERSIONS {
        assert_eq!(
            node_dotenv(version, &env_file),
            expected,
            "dotenv {version}"
        );
    }
    let dotenvy: serde_json::Map<String, serde_json::Value> = dotenvy::from_path_iter(&env_file)
        .expect("dotenvy opens .env")
        .map(|item| {
            let (k, v) = item.expect("dotenvy reads .env");
            (k, v.into())
        })
        .collect();
    assert_eq!(serde_json::Value::Object(dotenvy), expected, "dotenvy");
}

/// A bare GET or HEAD of `/login?t=...` spent the one-use link and returned a 12 h session:
/// chat previews and mail scanners got the session, the user got "already used"; and any page
/// could sign a browser in as someone else. Opening the link now shows who it signs in and a
/// button; only the `POST` from this server's own page spends it.
#[test]
fn a_link_preview_spends_nothing_and_only_this_servers_page_signs_in() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let serve = serve_with_state(&state);
    let alice = link(&serve, &state, "alice");

    for _ in 0..3 {
        let (status, headers, body) = get(&alice, None);
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(headers.get(SET_COOKIE).is_none(), "a preview got a session");
        assert!(body.contains("Sign in as alice"), "{body}");
        assert_eq!(head(&alice), (StatusCode::OK, false), "HEAD");
    }
    for origin in [Some("https://evil.example"), Some("null"), None] {
        let (status, headers, body) = redeem(&alice, origin);
        assert_eq!(status, StatusCode::FORBIDDEN, "Origin {origin:?}: {body}");
        assert!(headers.get(SET_COOKIE).is_none());
    }
    // Still unspent: the user signs in with it.
    let (cookie, _) = sign_in(&alice);
    let (status, _, _) = get(&serve.url("/u/alice"), Some(&cookie));
    assert_eq!(status, StatusCode::OK);
}

/// Sessions were stateless MACs with no sign-out: after `token rotate` an older session still
/// loaded the page, which showed the new token, and a link minted before it still signed in.
/// Sessions and links now carry the user's token generation, and sign-out ends a session for
/// good, even for someone who kept the cookie.
#[test]
fn a_token_rotation_ends_earlier_sessions_and_links_and_sign_out_ends_a_session() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let serve = serve_with_state(&state);
    let (before, _) = sign_in(&link(&serve, &state, "alice"));
    let unused = link(&serve, &state, "alice");
    let page = serve.url("/u/alice");
    assert_eq!(get(&page, Some(&before)).0, StatusCode::OK);

    let out = Command::new(env!("CARGO_BIN_EXE_shmastra-cloud"))
        .args(["token", "rotate", "--user", "alice"])
        .env_clear()
        .env("SHMASTRA_TOKEN_SECRET", SECRET)
        .env("SHMASTRA_TOKEN_STATE", &state)
        .output()
        .expect("token rotate");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let new_token = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let (status, _, body) = get(&page, Some(&before));
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "the old session after a rotation"
    );
    assert!(
        !body.contains(&new_token),
        "the old session saw the new token"
    );
    let (status, _, body) = get(&unused, None);
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "a link from before: {body}"
    );
    assert!(body.contains("replaced"), "{body}");

    let (after, _) = sign_in(&link(&serve, &state, "alice"));
    let (status, _, html) = get(&page, Some(&after));
    assert_eq!(status, StatusCode::OK);
    let (status, body) = post(
        &serve.url("/u/alice/sign-out"),
        &after,
        Some(&serve.url("")),
        &[("csrf", &csrf_of(&html))],
    );
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains("Signed out"), "{body}");
    assert_eq!(
        get(&page, Some(&after)).0,
        StatusCode::UNAUTHORIZED,
        "a kept copy of the signed-out cookie"
    );
}

/// Without `--database-url`, used links were remembered in memory only: after a restart the
/// same link signed in again. They are now kept where the token state lives
/// (`SHMASTRA_TOKEN_STATE`), as are signed-out sessions; with neither, serve signs no one in
/// (and `login-link` makes no link).
#[test]
fn used_links_and_ended_sessions_outlive_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let mut first = serve_with_state(&state);
    let link_a = link(&first, &state, "alice");
    let (session, _) = sign_in(&link_a);
    let (_, _, html) = get(&first.url("/u/alice"), Some(&session));
    let (status, _) = post(
        &first.url("/u/alice/sign-out"),
        &session,
        Some(&first.url("")),
        &[("csrf", &csrf_of(&html))],
    );
    assert_eq!(status, StatusCode::OK);
    let (kept, _) = sign_in(&link(&first, &state, "alice"));
    assert!(first.stop().success());

    let second = serve_with_state(&state);
    let again = link_a.replacen(&first.url(""), &second.url(""), 1);
    let (status, _, body) = get(&again, None);
    assert_eq!(
        status,
        StatusCode::GONE,
        "a used link after a restart: {body}"
    );
    let (status, _, body) = redeem(&again, Some(&second.url("")));
    assert_eq!(status, StatusCode::GONE, "{body}");
    assert_eq!(
        get(&second.url("/u/alice"), Some(&session)).0,
        StatusCode::UNAUTHORIZED,
        "a signed-out session after a restart"
    );
    assert_eq!(get(&second.url("/u/alice"), Some(&kept)).0, StatusCode::OK);

    let up = dir.path().join("upstream2");
    let bare = Serve::start(
        SECRET,
        &["--upstream-dir", up.to_str().expect("utf-8")],
        &[],
        "true",
    );
    let (status, _, body) = get(&bare.url("/login?t=x"), None);
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains("SHMASTRA_TOKEN_STATE"), "{body}");
}

/// `GET /u/<user>/events` with `cookie` on its own connection (HTTP/1.0: one response, then
/// the stream): the connection, and the status line of the answer.
fn open_events(serve: &Serve, user: &str, cookie: &str) -> (std::net::TcpStream, u16) {
    use std::io::{BufRead, BufReader, Write};
    let mut stream = serve.connect();
    write!(
        stream,
        "GET /u/{user}/events HTTP/1.0\r\nHost: x\r\nCookie: shmastra_session={cookie}\r\nAccept: text/event-stream\r\n\r\n"
    )
    .expect("send");
    let mut line = String::new();
    BufReader::new(stream.try_clone().expect("clone"))
        .read_line(&mut line)
        .expect("the status line");
    let status = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (stream, status)
}

/// One session could open any number of `/u/<user>/events` streams, and they never ended: at
/// the connection limit, `/healthz`, git and every other user's page got `503`. Streams are now
/// capped per user (429) and in total (a quarter of `--max-connections`, 503), both with
/// `Retry-After`, an idle one ends, and the connections left serve git and the other pages.
#[test]
fn event_streams_cannot_take_every_connection() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let serve = serve_with_state_and(
        &state,
        &["--max-connections", "40", "--event-stream-idle", "3s"],
    );
    let (alice, _) = sign_in(&link(&serve, &state, "alice"));
    let mut held = Vec::new();
    let mut statuses = Vec::new();
    for _ in 0..40 {
        let (stream, status) = open_events(&serve, "alice", &alice);
        statuses.push(status);
        held.push(stream);
    }
    let open = statuses.iter().filter(|s| **s == 200).count();
    assert_eq!(open, 4, "alice's streams: {statuses:?}");
    assert!(
        statuses.iter().all(|s| matches!(s, 200 | 429)),
        "{statuses:?}"
    );

    assert_eq!(
        serve.get("/healthz").0,
        200,
        "healthz with alice's streams open"
    );
    let (bob, _) = sign_in(&link(&serve, &state, "bob"));
    assert_eq!(get(&serve.url("/u/bob"), Some(&bob)).0, StatusCode::OK);
    let work = dir.path().join("work");
    common::work_tree(&work, &serve.remote_url("bob"));
    let pushed = testkit::git::git_output(&work, ["push", "-q", "origin", "HEAD:main"]);
    assert!(pushed.status.success(), "git with alice's streams open");

    // Ten users, four streams each: a quarter of 40 connections in all.
    let mut all = Vec::new();
    for n in 0..10 {
        let user = format!("user{n}");
        let (cookie, _) = sign_in(&link(&serve, &state, &user));
        for _ in 0..4 {
            all.push(open_events(&serve, &user, &cookie));
        }
    }
    let total_open = all.iter().filter(|(_, s)| *s == 200).count() + open;
    assert_eq!(total_open, 10, "streams open in all");
    assert!(all.iter().any(|(_, s)| *s == 503));
    assert_eq!(serve.get("/healthz").0, 200);

    // Idle streams end: the server closes alice's after 3 s without a change.
    let started = std::time::Instant::now();
    for (stream, status) in held.iter_mut().zip(&statuses) {
        if *status != 200 {
            continue;
        }
        use std::io::Read;
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(30)))
            .expect("timeout");
        let mut rest = Vec::new();
        let _ = stream.read_to_end(&mut rest);
    }
    let took = started.elapsed();
    assert!(
        took < std::time::Duration::from_secs(20),
        "streams ended after {took:?}"
    );
    let (_, again) = open_events(&serve, "alice", &alice);
    assert_eq!(again, 200, "the slots came back");
}

/// The peak resident memory of process `pid` so far (`VmHWM`), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
        .expect("VmHWM")
        * 1024
}

/// A page of saves read all of `git show` before cutting it to 1 MiB: a 100 MB file pushed as
/// ~100 KB cost ~97 MiB of serve's memory per request (six at once: 732 MiB), and a history
/// of 30 MB subjects was a 90 MB page. git's output is now read as it comes up to the cap and
/// git stopped there; each message keeps only its head and tail, every field shown is
/// bounded, and a user runs at most two of the page's git commands at once (429 past it).
#[test]
fn a_huge_save_costs_the_page_neither_memory_nor_bandwidth() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let serve = serve_with_state(&state);
    let work = dir.path().join("work");
    common::work_tree(&work, &serve.remote_url("alice"));
    let huge = std::fs::File::create(work.join("huge.txt")).expect("create");
    {
        use std::io::Write;
        let mut out = std::io::BufWriter::new(huge);
        let line = b"+ a line of a file someone pushed to make the page expensive\n";
        for _ in 0..(100_000_000 / line.len()) {
            out.write_all(line).expect("write");
        }
    }
    testkit::git::git(&work, ["add", "-A"]);
    testkit::git::git(&work, ["commit", "-qm", "a 100 MB file"]);
    let big = testkit::git::git(&work, ["rev-parse", "HEAD"])
        .trim()
        .to_owned();
    let subject = "x".repeat(30 << 20);
    let message = dir.path().join("message");
    for n in 0..3 {
        std::fs::write(&message, format!("{subject}{n}\n")).expect("message");
        testkit::git::git(
            &work,
            [
                "commit",
                "-q",
                "--allow-empty",
                "-F",
                message.to_str().expect("utf-8"),
            ],
        );
    }
    let pushed = testkit::git::git_output(&work, ["push", "-q", "origin", "HEAD:main"]);
    assert!(
        pushed.status.success(),
        "{}",
        String::from_utf8_lossy(&pushed.stderr)
    );
    let (cookie, _) = sign_in(&link(&serve, &state, "alice"));
    let before = peak_rss(serve.pid());

    let diff_url = serve.url(&format!("/u/alice/saves/{big}"));
    let answers: Vec<(StatusCode, usize, bool)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..6)
            .map(|_| {
                scope.spawn(|| {
                    let (status, _, body) = get(&diff_url, Some(&cookie));
                    (status, body.len(), body.contains("the diff goes on"))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a request"))
            .collect()
    });
    let diff_grew = peak_rss(serve.pid()).saturating_sub(before);
    println!(
        "RELIABILITY page-huge-diff: six requests at once, peak RSS grew by {} KiB",
        diff_grew >> 10
    );
    assert!(
        diff_grew < 48 << 20,
        "six diffs grew serve's peak memory by {} MiB",
        diff_grew >> 20
    );
    let served: Vec<_> = answers
        .iter()
        .filter(|(s, _, _)| *s == StatusCode::OK)
        .collect();
    assert!(!served.is_empty(), "{answers:?}");
    assert!(
        answers
            .iter()
            .all(|(s, _, _)| matches!(*s, StatusCode::OK | StatusCode::TOO_MANY_REQUESTS)),
        "{answers:?}"
    );
    for (_, len, cut) in &served {
        assert!(*cut && *len < 2 << 20, "a diff page of {len} bytes");
    }

    let (status, _, history) = get(&serve.url("/u/alice/history"), Some(&cookie));
    assert_eq!(status, StatusCode::OK);
    assert!(
        history.len() < 256 << 10,
        "a history of {} bytes",
        history.len()
    );
    let clipped = format!("{}…", "x".repeat(300));
    assert!(history.contains(&clipped), "the huge subjects, clipped");
    let (status, _, page) = get(&serve.url("/u/alice"), Some(&cookie));
    assert_eq!(status, StatusCode::OK);
    assert!(page.len() < 256 << 10, "a page of {} bytes", page.len());

    let grew = peak_rss(serve.pid()).saturating_sub(before);
    println!(
        "RELIABILITY page-huge-history: peak RSS grew by {} KiB in all",
        grew >> 10
    );
    assert!(
        grew < 48 << 20,
        "serve's peak memory grew by {} MiB",
        grew >> 20
    );
}

/// Each load of `/u/<user>` made two uncached GitLab API calls with the one service token every
/// user shares: one user reloading in a loop could use up its rate limit for everyone. The
/// project link now comes from the client's cache and the history is kept per user for 10 s
/// (concurrent loads wait for one read), so a loop of loads costs a handful of calls.
#[test]
fn reloading_the_page_does_not_spend_the_gitlab_service_account() {
    use testkit::fake_gitlab::{FakeGitLab, GROUP_ID, GROUP_PATH, SERVICE_TOKEN};
    use testkit::git_server::GitServer;

    let dir = tempfile::tempdir().expect("tempdir");
    let server = GitServer::start(&dir.path().join("repos"));
    let bare = server.create_bare(&format!("{GROUP_PATH}/alice.git"));
    server.require_password(SERVICE_TOKEN);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let gitlab = runtime.block_on(FakeGitLab::start());
    gitlab.set_repo_base(&server.base_url());
    gitlab.add_project("alice");
    gitlab.set_repository("alice", &bare);
    let state = dir.path().join("state");
    let serve = Serve::start(
        SECRET,
        &[],
        &[
            ("GITLAB_SERVICE_TOKEN", SERVICE_TOKEN),
            ("GITLAB_GROUP_ID", &GROUP_ID.to_string()),
            ("GITLAB_API_URL", &gitlab.api_url()),
            ("SHMASTRA_TOKEN_STATE", state.to_str().expect("utf-8")),
        ],
        "true",
    );
    let (cookie, _) = sign_in(&link(&serve, &state, "alice"));
    let (status, _, page) = get(&serve.url("/u/alice"), Some(&cookie));
    assert_eq!(status, StatusCode::OK, "{page}");
    let before = gitlab.requests().len();

    let started = std::time::Instant::now();
    for _ in 0..40 {
        assert_eq!(get(&serve.url("/u/alice"), Some(&cookie)).0, StatusCode::OK);
        assert_eq!(
            get(&serve.url("/u/alice/history"), Some(&cookie)).0,
            StatusCode::OK
        );
    }
    let calls = gitlab.requests().len() - before;
    // At most one read of the commits per 10 s of reloading.
    let allowed = 1 + started.elapsed().as_secs() as usize / 10;
    println!("RELIABILITY page-gitlab-calls: 80 loads, {calls} GitLab API calls");
    assert!(calls <= allowed, "80 loads made {calls} GitLab API calls");
}
