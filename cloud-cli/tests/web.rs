//! The workspace page over plain HTTP against the real `serve` (no browser): sign-in links
//! (one use, expiry, forgery), the session cookie's flags, the security headers, another
//! user's project (403, leading to the user's own), CSRF (token and Origin) on every
//! state-changing request, and "Restore only this file" refusing what is not a file of a save.

mod common;

use std::path::Path;

use reqwest::StatusCode;
use reqwest::header::{LOCATION, SET_COOKIE};
use testkit::git::git;

use common::PATIENCE;
use common::page::{get, post, redeem, sign_in, sign_in_from};
use common::workspace::{Workspace, csrf_of};

#[test]
fn a_link_signs_in_once_expires_and_cannot_be_forged() {
    let ws = Workspace::start(&[], |_| {});
    let link = ws.link("alice", "15m");
    let origin = ws.serve.url("");
    for _ in 0..2 {
        let (status, headers, body) = get(&link, None);
        assert_eq!(
            status,
            StatusCode::OK,
            "opening the link spends nothing: {body}"
        );
        assert!(body.contains("Sign in as alice"), "{body}");
        assert!(headers.get(SET_COOKIE).is_none());
    }
    let (status, headers, body) = redeem(&link, Some(&origin));
    assert_eq!(status, StatusCode::OK);
    assert!(
        body.contains(r#"http-equiv="refresh" content="0; url=/u/alice""#),
        "{body}"
    );
    let cookie = headers.get(SET_COOKIE).unwrap().to_str().unwrap();
    let flags: Vec<&str> = cookie.split("; ").skip(1).collect();
    for flag in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(flags.contains(&flag), "{flag} missing from {cookie}");
    }
    assert!(!flags.contains(&"Secure"), "plain http: {cookie}");

    let (status, _, body) = redeem(&link, Some(&origin));
    assert_eq!(status, StatusCode::GONE, "a reused link: {body}");
    assert!(body.contains("already used"), "{body}");
    let (status, _, body) = get(&link, None);
    assert_eq!(status, StatusCode::GONE, "a used link's page: {body}");

    let expired = ws.expired_link("alice");
    let (status, _, body) = get(&expired, None);
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(body.contains("expired"), "{body}");
    let (status, _, body) = redeem(&expired, Some(&origin));
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");

    // bob's name under a link minted for alice.
    let fresh = ws.link("alice", "15m");
    let forged = fresh.replacen(".YWxpY2U.", ".Ym9i.", 1);
    assert_ne!(forged, fresh);
    let (status, _, body) = get(&forged, None);
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(body.contains("not valid"), "{body}");
    let (status, _, body) = redeem(&forged, Some(&origin));
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(body.contains("not valid"), "{body}");
    // The forgery spent nothing: the real link still signs in.
    let (cookie, _) = sign_in(&fresh);

    // Without a session a refused link's page names no workspace; with one, it leads to the
    // user's own.
    for refused in [&link, &expired, &forged] {
        let (_, _, body) = get(refused, None);
        assert!(!body.contains("own-workspace"), "{body}");
        let (status, _, body) = get(refused, Some(&cookie));
        assert_ne!(status, StatusCode::OK, "{body}");
        assert!(
            body.contains(r#"<a id="own-workspace" href="/u/alice">"#),
            "{body}"
        );
    }

    let (status, _, body) = get(&ws.serve.url("/u/alice"), None);
    assert_eq!(status, StatusCode::UNAUTHORIZED, "no session");
    assert!(body.contains("login-link"), "{body}");
    assert!(!body.contains("own-workspace"), "{body}");
    let (status, _, _) = get(
        &ws.serve.url("/u/alice"),
        Some("s2.YWxpY2U.0.9999999999.AAAA.AAAA"),
    );
    assert_eq!(status, StatusCode::UNAUTHORIZED, "a forged session");
}

#[test]
fn behind_https_the_cookie_is_secure_and_the_page_has_its_security_headers() {
    let ws = Workspace::start(&["--public-url", "https://cloud.example"], |_| {});
    let link = ws.link("alice", "15m");
    let local = link.replacen("https://cloud.example", &ws.serve.url(""), 1);
    let (cookie, line) = sign_in_from(&local, "https://cloud.example");
    assert!(line.split("; ").any(|f| f == "Secure"), "{line}");
    let (status, headers, body) = get(&ws.serve.url("/u/alice"), Some(&cookie));
    assert_eq!(status, StatusCode::OK, "{body}");
    let header = |name: &str| headers.get(name).map(|v| v.to_str().unwrap().to_owned());
    let csp = header("content-security-policy").expect("a CSP");
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
        "{csp}"
    );
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    assert_eq!(header("x-frame-options").as_deref(), Some("DENY"));
    assert_eq!(header("referrer-policy").as_deref(), Some("same-origin"));
    assert_eq!(header("cache-control").as_deref(), Some("no-store"));
    assert!(!body.contains("<script>"), "no inline script: {body}");
    assert!(
        body.contains("https://cloud.example/api/git/alice.git"),
        "{body}"
    );
}

/// alice's project with one save, pushed from her laptop; her session cookie and the page.
fn alice_with_a_save(ws: &Workspace, laptop: &Path) -> (String, String) {
    ws.laptop("alice", laptop);
    std::fs::write(laptop.join("a.txt"), "one\n").unwrap();
    git(laptop, ["add", "-A"]);
    git(laptop, ["commit", "-qm", "first"]);
    git(laptop, ["push", "-q", "origin", "HEAD:main"]);
    let (cookie, _) = sign_in(&ws.link("alice", "15m"));
    let page = testkit::wait::until(PATIENCE, "the save in the history", || {
        let (_, _, page) = get(&ws.serve.url("/u/alice"), Some(&cookie));
        page.contains("restore-version").then_some(page)
    });
    (cookie, page)
}

#[test]
fn another_users_project_is_forbidden() {
    let ws = Workspace::start(&[], |_| {});
    let tmp = tempfile::tempdir().unwrap();
    let (alice, page) = alice_with_a_save(&ws, tmp.path());
    let csrf = csrf_of(&page);
    let (bob, _) = sign_in(&ws.link("bob", "15m"));
    for path in ["/u/alice", "/u/alice/events", "/u/alice/history"] {
        let (status, _, body) = get(&ws.serve.url(path), Some(&bob));
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {body}");
        assert!(!body.contains("a.txt"), "{path} leaked alice's project");
        assert!(
            body.contains(r#"<a id="own-workspace" href="/u/bob">"#),
            "{path}: the refusal leads bob to his own workspace: {body}"
        );
        assert!(!body.contains(r#"href="/u/alice"#), "{path}: {body}");
    }
    let commit = git(&ws.upstream_repo("alice"), ["rev-parse", "main"]);
    let (status, _, _) = get(
        &ws.serve.url(&format!("/u/alice/saves/{}", commit.trim())),
        Some(&bob),
    );
    assert_eq!(status, StatusCode::FORBIDDEN);
    // Even with alice's CSRF token, bob's session cannot act on her project.
    let (status, _) = post(
        &ws.serve.url("/u/alice/restore-version"),
        &bob,
        None,
        &[("csrf", &csrf), ("commit", commit.trim())],
    );
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _, _) = get(&ws.serve.url("/u/alice"), Some(&alice));
    assert_eq!(status, StatusCode::OK);
}

/// A refused form: what is wrong with it, the form, the answer.
type Refusal<'a> = (&'a str, &'a [(&'a str, &'a str)], StatusCode);

/// "Restore only this file" refuses, before anything runs, a form that does not name a file of
/// a save as git spells it, a save the project does not have, a file the save did not make, and
/// one from another user or without the session's token: the sandbox's file keeps its bytes
/// and no restore is saved. The page's own form then restores the file.
#[test]
fn restore_file_refuses_what_is_not_a_file_of_a_save() {
    let ws = Workspace::start(&[], |_| {});
    let tmp = tempfile::tempdir().unwrap();
    let laptop = tmp.path();
    let (cookie, _) = alice_with_a_save(&ws, laptop);
    let first = git(laptop, ["rev-parse", "HEAD"]);
    let first = first.trim();
    std::fs::write(laptop.join("a.txt"), "two\n").unwrap();
    std::fs::write(laptop.join("b.txt"), "new\n").unwrap();
    git(laptop, ["add", "-A"]);
    git(laptop, ["commit", "-qm", "second"]);
    // The sandbox's watcher has saved since (its `shmastra.json`).
    git(laptop, ["pull", "-q", "--rebase", "origin", "main"]);
    git(laptop, ["push", "-q", "origin", "HEAD:main"]);
    let second = git(laptop, ["rev-parse", "HEAD"]);
    let in_sandbox = ws.project("alice").join("a.txt");
    let sandbox_holds = |bytes: &[u8]| std::fs::read(&in_sandbox).ok().as_deref() == Some(bytes);
    testkit::wait::until(PATIENCE, "the second save in the sandbox", || {
        sandbox_holds(b"two\n").then_some(())
    });
    let (_, _, page) = get(&ws.serve.url("/u/alice"), Some(&cookie));
    let csrf = csrf_of(&page);
    let (bob, _) = sign_in(&ws.link("bob", "15m"));
    let url = ws.serve.url("/u/alice/restore-file");
    let long = "d/".repeat(2100) + "a.txt";
    let elsewhere = "0123456789abcdef0123456789abcdef01234567";
    let bad: [Refusal; 14] = [
        (
            "no token",
            &[("commit", first), ("path", "a.txt")],
            StatusCode::FORBIDDEN,
        ),
        (
            "a wrong token",
            &[("csrf", "x"), ("commit", first), ("path", "a.txt")],
            StatusCode::FORBIDDEN,
        ),
        (
            "no path",
            &[("csrf", &csrf), ("commit", first)],
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "no save",
            &[("csrf", &csrf), ("path", "a.txt")],
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "not a save id",
            &[("csrf", &csrf), ("commit", "main"), ("path", "a.txt")],
            StatusCode::BAD_REQUEST,
        ),
        (
            "a save the project does not have",
            &[("csrf", &csrf), ("commit", elsewhere), ("path", "a.txt")],
            StatusCode::NOT_FOUND,
        ),
        (
            "a file the save did not make",
            &[("csrf", &csrf), ("commit", first), ("path", "b.txt")],
            StatusCode::BAD_REQUEST,
        ),
        (
            "an empty path",
            &[("csrf", &csrf), ("commit", first), ("path", "")],
            StatusCode::BAD_REQUEST,
        ),
        (
            "a parent",
            &[("csrf", &csrf), ("commit", first), ("path", "../a.txt")],
            StatusCode::BAD_REQUEST,
        ),
        (
            "a parent inside",
            &[
                ("csrf", &csrf),
                ("commit", first),
                ("path", "d/../../a.txt"),
            ],
            StatusCode::BAD_REQUEST,
        ),
        (
            "an absolute path",
            &[("csrf", &csrf), ("commit", first), ("path", "/etc/passwd")],
            StatusCode::BAD_REQUEST,
        ),
        (
            "a dot segment",
            &[("csrf", &csrf), ("commit", first), ("path", "./a.txt")],
            StatusCode::BAD_REQUEST,
        ),
        (
            "an empty segment",
            &[("csrf", &csrf), ("commit", first), ("path", "d//a.txt")],
            StatusCode::BAD_REQUEST,
        ),
        (
            "a path over 4096 bytes",
            &[("csrf", &csrf), ("commit", first), ("path", &long)],
            StatusCode::BAD_REQUEST,
        ),
    ];
    for (what, form, expected) in bad {
        let (status, body) = post(&url, &cookie, None, form);
        assert_eq!(status, expected, "{what}: {body}");
    }
    let (status, body) = post(
        &url,
        &bob,
        None,
        &[("csrf", &csrf), ("commit", first), ("path", "a.txt")],
    );
    assert_eq!(status, StatusCode::FORBIDDEN, "another user: {body}");
    assert!(sandbox_holds(b"two\n"), "a refused form changed a.txt");
    // No restore came of them (the sandbox's watcher may have saved on its own meanwhile).
    let upstream = ws.upstream_repo("alice");
    let since = git(
        &upstream,
        ["log", "--format=%s", &format!("{}..main", second.trim())],
    );
    assert!(
        !since.lines().any(|subject| subject.starts_with("restore")),
        "{since}"
    );
    // The page's own form, to the same handler, is taken: a.txt is as the first save made it.
    let (status, body) = post(
        &url,
        &cookie,
        None,
        &[("csrf", &csrf), ("commit", first), ("path", "a.txt")],
    );
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    testkit::wait::until(PATIENCE, "a.txt restored in the sandbox", || {
        sandbox_holds(b"one\n").then_some(())
    });
}

/// A refused POST: what it lacks, its `Origin`, its form.
type Attempt<'a> = (&'a str, Option<&'a str>, &'a [(&'a str, &'a str)]);

#[test]
fn a_post_needs_the_sessions_csrf_token_and_this_origin() {
    let ws = Workspace::start(&[], |_| {});
    let tmp = tempfile::tempdir().unwrap();
    let (cookie, page) = alice_with_a_save(&ws, tmp.path());
    let csrf = csrf_of(&page);
    // Another session of alice's has another token.
    let (other_session, _) = sign_in(&ws.link("alice", "15m"));
    let (_, _, other_page) = get(&ws.serve.url("/u/alice"), Some(&other_session));
    let other_csrf = csrf_of(&other_page);
    assert_ne!(csrf, other_csrf);
    let head = git(&ws.upstream_repo("alice"), ["rev-parse", "main"]);
    let head = head.trim();
    let url = ws.serve.url("/u/alice/restore-version");
    let own_origin = ws.serve.url("");
    let refused: [Attempt; 4] = [
        ("no token", None, &[("commit", head)]),
        ("a wrong token", None, &[("csrf", "x"), ("commit", head)]),
        (
            "another session's token",
            None,
            &[("csrf", &other_csrf), ("commit", head)],
        ),
        (
            "another origin",
            Some("http://evil.example"),
            &[("csrf", &csrf), ("commit", head)],
        ),
    ];
    for (what, origin, form) in refused {
        let (status, body) = post(&url, &cookie, origin, form);
        assert_eq!(status, StatusCode::FORBIDDEN, "{what}: {body}");
    }
    let (status, _) = post(
        &ws.serve.url("/u/alice/restore-project"),
        &cookie,
        None,
        &[("env.API_KEY", "x")],
    );
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "restore-project without a token"
    );
    let (status, _) = post(
        &url,
        &cookie,
        Some(&own_origin),
        &[("csrf", &csrf), ("commit", head)],
    );
    assert_eq!(status, StatusCode::SEE_OTHER, "the page's own form");
}

#[test]
fn login_link_refuses_a_ttl_over_a_day_and_a_bad_user() {
    let state = tempfile::tempdir().unwrap();
    let run_in = |state: Option<&Path>, args: &[&str]| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_shmastra-cloud"));
        cmd.arg("login-link")
            .args(args)
            .env_clear()
            .env("SHMASTRA_TOKEN_SECRET", common::workspace::SECRET);
        if let Some(state) = state {
            cmd.env("SHMASTRA_TOKEN_STATE", state);
        }
        cmd.output().expect("login-link")
    };
    let run = |args: &[&str]| run_in(Some(state.path()), args);
    // Nothing durable would remember the link's use: no link is made.
    let out = run_in(None, &["--user", "alice"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("SHMASTRA_TOKEN_STATE"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(&["--user", "alice", "--ttl", "25h"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("at most"));
    let out = run(&["--user", "Alice"]);
    assert_eq!(out.status.code(), Some(2));
    let out = run(&["--user", "alice"]);
    assert!(out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("http://127.0.0.1:8080/login?t=l2."),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn with_gitlab_and_no_sandboxes_the_page_shows_the_history_and_the_gitlab_project() {
    use testkit::fake_gitlab::{FakeGitLab, GROUP_ID, GROUP_PATH, SERVICE_TOKEN};
    use testkit::git_server::GitServer;

    let repos = tempfile::tempdir().unwrap();
    let server = GitServer::start(repos.path());
    let bare = server.create_bare(&format!("{GROUP_PATH}/alice.git"));
    server.require_password(SERVICE_TOKEN);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let gitlab = runtime.block_on(FakeGitLab::start());
    gitlab.set_repo_base(&server.base_url());
    gitlab.add_project("alice");
    gitlab.set_repository("alice", &bare);
    let state = repos.path().join("token-state");
    let serve = common::Serve::start(
        common::workspace::SECRET,
        &[],
        &[
            ("GITLAB_SERVICE_TOKEN", SERVICE_TOKEN),
            ("GITLAB_GROUP_ID", &GROUP_ID.to_string()),
            ("GITLAB_API_URL", &gitlab.api_url()),
            ("SHMASTRA_TOKEN_STATE", state.to_str().unwrap()),
        ],
        "true",
    );
    let laptop = serve.tmp.path().join("laptop");
    testkit::git::init_repo(&laptop);
    std::fs::write(laptop.join("a.txt"), "a\n").unwrap();
    git(&laptop, ["add", "-A"]);
    git(&laptop, ["commit", "-qm", "from the laptop"]);
    git(
        &laptop,
        ["push", "-q", &serve.remote_url("alice"), "HEAD:main"],
    );
    let head = git(&laptop, ["rev-parse", "HEAD"]).trim().to_owned();

    let link = {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_shmastra-cloud"))
            .args([
                "login-link",
                "--user",
                "alice",
                "--public-url",
                &serve.url(""),
            ])
            .env_clear()
            .env("SHMASTRA_TOKEN_SECRET", common::workspace::SECRET)
            .env("SHMASTRA_TOKEN_STATE", &state)
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    let (cookie, _) = sign_in(&link);
    let (status, _, page) = get(&serve.url("/u/alice"), Some(&cookie));
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains(&format!("data-commit=\"{head}\"")), "{page}");
    assert!(page.contains("from the laptop"), "{page}");
    // The project button, as Studio's toolbar has it: the GitLab project in a new tab.
    assert!(
        page.contains(&format!(
            "/{GROUP_PATH}/alice\" target=\"_blank\" rel=\"noopener noreferrer\">Open the project on GitLab</a>"
        )),
        "{page}"
    );
    assert!(page.contains("No sandbox on this server"), "{page}");
    assert!(
        !page.contains("restore-version"),
        "nothing to restore here: {page}"
    );
    // A save's diff is GitLab's commit page.
    let (status, headers, _) = get(&serve.url(&format!("/u/alice/saves/{head}")), Some(&cookie));
    assert_eq!(status, StatusCode::SEE_OTHER);
    let location = headers.get(LOCATION).unwrap().to_str().unwrap();
    assert!(
        location.ends_with(&format!("/{GROUP_PATH}/alice/-/commit/{head}")),
        "{location}"
    );
}

#[test]
fn a_sandboxs_watcher_is_supervised_and_serve_stops_it() {
    let mut ws = Workspace::start(&[], |_| {});
    let (cookie, _) = sign_in(&ws.link("alice", "15m"));
    let (status, _, _) = get(&ws.serve.url("/u/alice"), Some(&cookie));
    assert_eq!(status, StatusCode::OK);
    let pid_file = ws.sandboxes.join("alice/watcher.pid");
    let alive = |pid: &str| {
        Path::new(&format!("/proc/{pid}/stat")).exists()
            && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .unwrap_or_default()
                .contains(") Z")
    };
    // A crash (SIGKILL): the supervisor starts it again. A watcher started while the sandbox
    // is still being made may exit by itself before the kill (its project directory replaced
    // by the restore), and is restarted too: the kill is aimed again at the one running then.
    let first = testkit::wait::until(PATIENCE, "a running watcher killed", || {
        let pid = std::fs::read_to_string(&pid_file).ok()?;
        let pid = pid.trim().to_owned();
        let killed = alive(&pid)
            && std::process::Command::new("kill")
                .args(["-KILL", &pid])
                .stderr(std::process::Stdio::null())
                .status()
                .unwrap()
                .success();
        killed.then_some(pid)
    });
    let second = testkit::wait::until(PATIENCE, "a new watcher", || {
        let pid = std::fs::read_to_string(&pid_file).ok()?;
        let pid = pid.trim().to_owned();
        (pid != first && alive(&pid)).then_some(pid)
    });
    ws.stop();
    assert!(!alive(&second), "the watcher outlived serve");
}

#[test]
fn a_form_body_over_two_mib_is_refused_and_sandboxes_need_a_watcher() {
    let ws = Workspace::start(&[], |_| {});
    let (cookie, _) = sign_in(&ws.link("alice", "15m"));
    let big = "x".repeat(3 << 20);
    let (status, _) = post(
        &ws.serve.url("/u/alice/restore-project"),
        &cookie,
        None,
        &[("env.API_KEY", &big)],
    );
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(
        !ws.serve.logs().contains(&big[..64]),
        "the body reached a log"
    );

    let tmp = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shmastra-cloud"))
        .args(["serve", "--listen", "127.0.0.1:0", "--upstream-dir"])
        .arg(tmp.path().join("up"))
        .arg("--sandboxes-dir")
        .arg(tmp.path().join("sb"))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("SHMASTRA_TOKEN_SECRET", common::workspace::SECRET)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--watcher-bin"), "{stderr}");
}
