//! The control API (`/api/v1/`) against the real `serve` with the embedded upstream and
//! sandboxes on this machine: every route's refusals (no key, a wrong key, the other key of a
//! rotation, a bad user id, bad fields one by one), joined operations and `Idempotency-Key`,
//! the committed OpenAPI document against the served one, the README's snippet against the
//! tested one, and the TypeScript client's own suite (`node --test`) run against serve.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use reqwest::StatusCode;
use serde_json::{Value, json};
use testkit::git::git;

use common::PATIENCE;
use common::workspace::Workspace;

const KEY: &str = "api-key-0123456789abcdef-0123456789abcdef";
const NEXT_KEY: &str = "next-api-key-fedcba9876543210-fedcba98765";

fn block<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

/// One request: status, the `WWW-Authenticate` header, the JSON body (`Null` when not JSON).
fn call(
    ws: &Workspace,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: Option<Value>,
    idempotency_key: Option<&str>,
) -> (StatusCode, Option<String>, Value) {
    block(async {
        let client = reqwest::Client::new();
        let mut request = client.request(method.parse().expect("method"), ws.serve.url(path));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        if let Some(id) = idempotency_key {
            request = request.header("idempotency-key", id);
        }
        let response = request.send().await.expect("request");
        let status = response.status();
        let www = response
            .headers()
            .get("www-authenticate")
            .map(|v| v.to_str().expect("ascii").to_owned());
        let text = response.text().await.expect("body");
        (
            status,
            www,
            serde_json::from_str(&text).unwrap_or(Value::Null),
        )
    })
}

fn start(env: &[(&str, &str)]) -> (Workspace, tempfile::TempDir) {
    let state = tempfile::tempdir().expect("token state");
    let keys = format!("{KEY},{NEXT_KEY}");
    let mut all: Vec<(&str, &str)> = vec![
        ("SHMASTRA_API_KEY", keys.as_str()),
        (
            "SHMASTRA_TOKEN_STATE",
            state.path().to_str().expect("utf-8"),
        ),
    ];
    all.extend_from_slice(env);
    (Workspace::start_with_env(&[], &all, |_| {}), state)
}

/// Pushes `files` to `user`'s saved branch from a laptop clone through the proxy.
fn push_saved(ws: &Workspace, user: &str, files: &[(&str, &str)]) -> String {
    let laptop = ws.serve.tmp.path().join(format!("laptop-{user}"));
    ws.laptop(user, &laptop);
    for (name, text) in files {
        std::fs::write(laptop.join(name), text).expect("write");
    }
    git(&laptop, ["add", "-A"]);
    git(&laptop, ["commit", "-qm", "from the laptop"]);
    git(&laptop, ["push", "-q", "origin", "HEAD:main"]);
    git(&laptop, ["rev-parse", "HEAD"]).trim().to_owned()
}

/// Polls the operation until it ends; its last view.
fn finished(ws: &Workspace, op: &Value) -> Value {
    let url = op["status_url"].as_str().expect("a status URL").to_owned();
    testkit::wait::until_seen(PATIENCE, "the operation ends", || {
        let (status, _, view) = call(ws, "GET", &url, Some(KEY), None, None);
        assert_eq!(status, StatusCode::OK, "{view}");
        match view["state"].as_str() {
            Some("succeeded" | "failed") => Ok(view),
            _ => Err(view),
        }
    })
}

fn problems(body: &Value) -> Vec<(String, String)> {
    body["error"]["problems"]
        .as_array()
        .unwrap_or(&Vec::new())
        .iter()
        .map(|p| {
            (
                p["field"].as_str().unwrap_or_default().to_owned(),
                p["problem"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// Every route of the document, with a body it accepts.
fn every_route() -> Vec<(&'static str, &'static str, Option<Value>)> {
    vec![
        ("GET", "/api/v1/users/{user}/sandbox", None),
        ("POST", "/api/v1/users/{user}/sandbox", Some(json!({}))),
        ("GET", "/api/v1/users/{user}/sandbox/events", None),
        ("POST", "/api/v1/users/{user}/sync", None),
        (
            "POST",
            "/api/v1/users/{user}/restore",
            Some(json!({"at": "HEAD~1"})),
        ),
        ("GET", "/api/v1/users/{user}/operations/op_0", None),
        ("GET", "/api/v1/users/{user}/history?limit=5", None),
        ("GET", "/api/v1/users/{user}/manifest", None),
        ("POST", "/api/v1/users/{user}/login-links", Some(json!({}))),
        ("POST", "/api/v1/users/{user}/token/rotate", None),
    ]
}

#[test]
fn every_route_refuses_a_missing_or_wrong_key_and_a_bad_user_and_takes_either_rotation_key() {
    let (ws, _state) = start(&[]);
    let routes = every_route();
    // The document lists exactly these routes.
    let (_, _, document) = call(&ws, "GET", "/api/v1/openapi.json", None, None, None);
    let mut listed: Vec<String> = Vec::new();
    for (path, item) in document["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("item").keys() {
            listed.push(format!("{} {path}", method.to_uppercase()));
        }
    }
    let mut tested: Vec<String> = routes
        .iter()
        .map(|(m, p, _)| {
            let p = p.split('?').next().unwrap().replace("op_0", "{id}");
            format!("{m} {p}")
        })
        .collect();
    listed.sort();
    tested.sort();
    assert_eq!(listed, tested, "a route without its refusal test");

    for (method, path, body) in &routes {
        let path = path.replace("{user}", "carol");
        let (status, www, answer) = call(&ws, method, &path, None, body.clone(), None);
        assert_eq!(
            status,
            StatusCode::UNAUTHORIZED,
            "{method} {path} without a key: {answer}"
        );
        assert_eq!(answer["error"]["code"], "unauthorized", "{answer}");
        assert!(
            www.is_some_and(|w| w.starts_with("Bearer")),
            "{method} {path}"
        );
        for wrong in [
            "x",
            &KEY[..KEY.len() - 1],
            &format!("{KEY},{NEXT_KEY}"),
            &format!("{KEY}x"),
        ] {
            let (status, _, answer) = call(&ws, method, &path, Some(wrong), body.clone(), None);
            assert_eq!(
                status,
                StatusCode::UNAUTHORIZED,
                "{method} {path} with {wrong:?}: {answer}"
            );
        }
        for bad_user in ["Carol", "a..b", "a%2Fb", "-x", "x.git", &"a".repeat(65)] {
            let path = path.replace("carol", bad_user);
            let (status, _, answer) = call(&ws, method, &path, Some(KEY), body.clone(), None);
            assert_eq!(status, StatusCode::BAD_REQUEST, "{method} {path}: {answer}");
            assert_eq!(
                answer["error"]["code"], "invalid_user",
                "{method} {path}: {answer}"
            );
        }
        // Both keys of a rotation are accepted.
        for key in [KEY, NEXT_KEY] {
            if path.ends_with("/events") {
                continue;
            }
            let (status, _, answer) = call(&ws, method, &path, Some(key), body.clone(), None);
            assert_ne!(
                status,
                StatusCode::UNAUTHORIZED,
                "{method} {path}: {answer}"
            );
            assert_ne!(status, StatusCode::BAD_REQUEST, "{method} {path}: {answer}");
        }
    }
    let logs = ws.serve.logs();
    assert!(logs.contains("control API refused"), "refusals are logged");
    assert!(
        !logs.contains(KEY) && !logs.contains(NEXT_KEY),
        "a key in the log"
    );
}

#[test]
fn bad_fields_are_answered_one_by_one_and_nothing_starts() {
    let (ws, _state) = start(&[]);
    push_saved(
        &ws,
        "dave",
        &[(
            "shmastra.json",
            "{\n  \"version\": 1,\n  \"env\": [\n    \"DB_URL\",\n    \"OPENAI_API_KEY\"\n  ]\n}\n",
        )],
    );
    let (status, _, manifest) = call(
        &ws,
        "GET",
        "/api/v1/users/dave/manifest",
        Some(KEY),
        None,
        None,
    );
    assert_eq!(status, StatusCode::OK, "{manifest}");
    assert_eq!(manifest["names"], json!(["DB_URL", "OPENAI_API_KEY"]));
    assert_eq!(manifest["saved"], true);
    let (_, _, none) = call(
        &ws,
        "GET",
        "/api/v1/users/erin/manifest",
        Some(KEY),
        None,
        None,
    );
    assert_eq!(
        (none["saved"].clone(), none["names"].clone()),
        (json!(false), json!([]))
    );

    let form = json!({"secrets": {"OPENAI_API_KEY": "sk-\u{0}x", "WRONG": "v"}});
    let (status, _, answer) = call(
        &ws,
        "POST",
        "/api/v1/users/dave/sandbox",
        Some(KEY),
        Some(form),
        None,
    );
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    assert_eq!(answer["error"]["code"], "invalid_form");
    let mut got = problems(&answer);
    got.sort();
    assert_eq!(
        got,
        [
            ("secrets.DB_URL".to_owned(), "missing".to_owned()),
            (
                "secrets.OPENAI_API_KEY".to_owned(),
                "contains_nul".to_owned()
            ),
            ("secrets.WRONG".to_owned(), "unexpected".to_owned()),
        ]
    );
    assert!(
        !answer.to_string().contains("sk-"),
        "a value came back: {answer}"
    );
    assert!(
        !ws.sandboxes.join("dave").exists(),
        "a refused form made a sandbox"
    );

    let restore = json!({"at": "", "paths": ["/etc/passwd", "a/../../b", "ok.txt"]});
    let (status, _, answer) = call(
        &ws,
        "POST",
        "/api/v1/users/dave/restore",
        Some(KEY),
        Some(restore),
        None,
    );
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    assert_eq!(
        problems(&answer),
        [
            ("at".to_owned(), "missing".to_owned()),
            ("paths[0]".to_owned(), "invalid".to_owned()),
            ("paths[1]".to_owned(), "invalid".to_owned()),
        ]
    );
    let (status, _, answer) = call(
        &ws,
        "POST",
        "/api/v1/users/dave/restore",
        Some(KEY),
        Some(json!({"at": "--output=x"})),
        None,
    );
    assert_eq!(
        (status, problems(&answer)),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            vec![("at".to_owned(), "invalid".to_owned())]
        )
    );
    let (status, _, answer) = call(
        &ws,
        "POST",
        "/api/v1/users/dave/restore",
        Some(KEY),
        Some(json!({"at": "abc1", "extra": 1})),
        None,
    );
    assert_eq!(
        (status, answer["error"]["code"].clone()),
        (StatusCode::BAD_REQUEST, json!("invalid_request")),
        "{answer}"
    );
    let (status, _, answer) = call(
        &ws,
        "POST",
        "/api/v1/users/dave/login-links",
        Some(KEY),
        Some(json!({"ttl_seconds": 90000})),
        None,
    );
    assert_eq!(
        (status, problems(&answer)),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            vec![("ttl_seconds".to_owned(), "invalid".to_owned())]
        ),
        "{answer}"
    );
    for limit in ["0", "501", "x"] {
        let (status, _, answer) = call(
            &ws,
            "GET",
            &format!("/api/v1/users/dave/history?limit={limit}"),
            Some(KEY),
            None,
            None,
        );
        assert_eq!(status, StatusCode::BAD_REQUEST, "limit={limit}: {answer}");
    }
    // No sandbox yet: a sync or a restore has nothing to act on.
    let (status, _, answer) = call(
        &ws,
        "POST",
        "/api/v1/users/dave/sync",
        Some(KEY),
        None,
        None,
    );
    assert_eq!(
        (status, answer["error"]["code"].clone()),
        (StatusCode::CONFLICT, json!("no_sandbox"))
    );
    let (status, _, answer) = call(
        &ws,
        "POST",
        "/api/v1/users/dave/restore",
        Some(KEY),
        Some(json!({"at": "abc1"})),
        None,
    );
    assert_eq!(
        (status, answer["error"]["code"].clone()),
        (StatusCode::CONFLICT, json!("no_sandbox"))
    );
    let (status, _, answer) = call(
        &ws,
        "GET",
        "/api/v1/users/dave/operations/op_0",
        Some(KEY),
        None,
        None,
    );
    assert_eq!(
        (status, answer["error"]["code"].clone()),
        (StatusCode::NOT_FOUND, json!("not_found"))
    );
    assert!(!ws.sandboxes.join("dave").exists());
}

#[test]
fn a_request_while_one_runs_joins_it_and_an_idempotency_key_names_it() {
    let (ws, _state) = start(&[]);
    let path = "/api/v1/users/frank/sandbox";
    let (status, _, first) = call(&ws, "POST", path, Some(KEY), Some(json!({})), Some("key-1"));
    assert_eq!(status, StatusCode::ACCEPTED, "{first}");
    let (status, _, joined) = call(&ws, "POST", path, Some(KEY), Some(json!({})), None);
    assert_eq!(status, StatusCode::ACCEPTED, "{joined}");
    assert_eq!(
        joined["id"], first["id"],
        "the second request joins the running one"
    );
    let (status, _, reused) = call(
        &ws,
        "POST",
        path,
        Some(KEY),
        Some(json!({"secrets": {}})),
        Some("key-1"),
    );
    assert_eq!(
        (status, reused["error"]["code"].clone()),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            json!("idempotency_key_reused")
        ),
        "{reused}"
    );
    let done = finished(&ws, &first);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["provision"]["outcome"], "created", "{done}");
    // The key still names the finished operation; without it, a new one starts (and finds
    // the sandbox there).
    let (_, _, again) = call(&ws, "POST", path, Some(KEY), Some(json!({})), Some("key-1"));
    assert_eq!(
        (again["id"].clone(), again["state"].clone()),
        (first["id"].clone(), json!("succeeded"))
    );
    let (_, _, fresh) = call(&ws, "POST", path, Some(KEY), Some(json!({})), None);
    assert_ne!(fresh["id"], first["id"]);
    assert_eq!(finished(&ws, &fresh)["provision"]["outcome"], "present");
    let (status, _, view) = call(&ws, "GET", path, Some(KEY), None, None);
    assert_eq!(status, StatusCode::OK);
    assert_eq!(view["status"]["state"], "ready", "{view}");
    assert_eq!(
        std::fs::read_dir(&ws.sandboxes)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name() == "frank")
            .count(),
        1
    );
}

/// The committed document.
fn committed_document() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../clients/typescript/openapi.json")
}

#[test]
fn the_committed_openapi_document_is_the_served_one() {
    let ws = Workspace::start(&[], |_| {});
    let served = block(async {
        reqwest::get(ws.serve.url("/api/v1/openapi.json"))
            .await
            .expect("GET")
            .text()
            .await
            .expect("body")
    });
    assert_eq!(served, cloud_core::control_api_document());
    let document: Value = serde_json::from_str(&served).expect("JSON");
    assert_eq!(document["openapi"], "3.1.0");
    if std::env::var_os("UPDATE_OPENAPI").is_some() {
        std::fs::write(committed_document(), &served).expect("write the document");
    }
    let committed = std::fs::read_to_string(committed_document()).unwrap_or_default();
    assert!(
        committed == served,
        "clients/typescript/openapi.json is not what serve serves at /api/v1/openapi.json; \
         write it with `UPDATE_OPENAPI=1 cargo test -p shmastra-cloud --test api openapi` and rebuild the client"
    );
    // Off without a key: the document is still there, every other route says why not.
    let (status, _, answer) = call(
        &ws,
        "GET",
        "/api/v1/users/alice/sandbox",
        Some(KEY),
        None,
        None,
    );
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("SHMASTRA_API_KEY"),
        "{answer}"
    );
}

#[test]
fn a_bad_key_setting_stops_serve_naming_the_key_by_position() {
    let out = Command::new(env!("CARGO_BIN_EXE_shmastra-cloud"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--upstream-dir",
            "/nonexistent",
        ])
        .env_clear()
        .env("SHMASTRA_TOKEN_SECRET", common::workspace::SECRET)
        .env("SHMASTRA_API_KEY", format!("{KEY},short-key-123"))
        .output()
        .expect("serve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("key 2 is 13 bytes"), "{stderr}");
    assert!(
        !stderr.contains("short-key-123") && !stderr.contains(KEY),
        "{stderr}"
    );
}

/// With neither a database nor `SHMASTRA_TOKEN_STATE` nothing durable records a link's use,
/// so the page signs no one in: the API makes no link either (503, saying why) rather than one
/// nobody can use.
#[test]
fn no_sign_in_link_is_made_that_nothing_durable_would_record() {
    let dir = tempfile::tempdir().expect("tempdir");
    let upstream = dir.path().join("upstream").display().to_string();
    let serve = common::Serve::start(
        common::workspace::SECRET,
        &["--upstream-dir", &upstream],
        &[("SHMASTRA_API_KEY", KEY)],
        "true",
    );
    let (status, body) = block(async {
        let response = reqwest::Client::new()
            .post(serve.url("/api/v1/users/alice/login-links"))
            .bearer_auth(KEY)
            .json(&json!({}))
            .send()
            .await
            .expect("request");
        (response.status(), response.text().await.expect("body"))
    });
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains("SHMASTRA_TOKEN_STATE"), "{body}");
}

/// The TypeScript client's directory.
fn client_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../clients/typescript")
}

/// The README's snippet between its markers, in `text`.
fn snippet(text: &str, start: &str, end: &str) -> String {
    let from = text.find(start).unwrap_or_else(|| panic!("no {start:?}")) + start.len();
    let to = from
        + text[from..]
            .find(end)
            .unwrap_or_else(|| panic!("no {end:?}"));
    text[from..to]
        .trim_end()
        .trim_start_matches('\n')
        .to_owned()
}

#[test]
fn the_readme_shows_the_snippet_the_client_suite_runs() {
    let test =
        std::fs::read_to_string(client_dir().join("test/client.test.ts")).expect("test file");
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
            .expect("README");
    let tested = snippet(&test, "// README snippet start\n", "// README snippet end");
    let tested: String = tested
        .lines()
        .map(|line| line.strip_prefix("  ").unwrap_or(line))
        .collect::<Vec<_>>()
        .join("\n");
    let shown = snippet(&readme, "```ts\n", "```");
    assert_eq!(
        shown, tested,
        "README's \"Calling it from your backend\" differs from the tested code"
    );
}

#[test]
fn the_typescript_client_suite_passes_against_serve() {
    let (ws, _state) = start(&[]);
    let dir = client_dir();
    let npm = |args: &[&str]| {
        let out = Command::new("npm")
            .args(args)
            .current_dir(&dir)
            .env("npm_config_audit", "false")
            .env("npm_config_fund", "false")
            .env("npm_config_update_notifier", "false")
            .output()
            .expect("npm");
        assert!(
            out.status.success(),
            "npm {args:?} failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    npm(&["ci", "--ignore-scripts", "--prefer-offline"]);
    npm(&["run", "build"]);
    let home = ws.serve.tmp.path().join("node-home");
    std::fs::create_dir_all(&home).expect("home");
    let out = Command::new("node")
        .args(["--test", "--test-reporter=spec", "dist/test/"])
        .current_dir(&dir)
        .env("SHMASTRA_URL", ws.serve.url(""))
        .env("SHMASTRA_API_KEY", KEY)
        .env("SHMASTRA_SANDBOXES_DIR", &ws.sandboxes)
        .env("SHMASTRA_PATIENCE_MS", PATIENCE.as_millis().to_string())
        .envs(testkit::git::hermetic_env(&home))
        .output()
        .expect("node --test");
    let report = String::from_utf8_lossy(&out.stdout);
    println!("{report}");
    assert!(
        out.status.success(),
        "the TypeScript client's suite failed:\n{report}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        ws.serve.logs()
    );
    let count = |word: &str| {
        report
            .lines()
            .find_map(|line| line.strip_prefix(&format!("ℹ {word} ")))
            .and_then(|n| n.trim().parse::<u32>().ok())
    };
    assert_eq!(
        (count("pass"), count("fail")),
        (Some(3), Some(0)),
        "{report}"
    );
}

#[test]
fn a_sync_under_way_says_since_when_and_its_step_and_a_ready_sandbox_says_neither() {
    let (ws, _state) = start(&[]);
    let sandbox = "/api/v1/users/grace/sandbox";
    let (status, _, op) = call(&ws, "POST", sandbox, Some(KEY), Some(json!({})), None);
    assert_eq!(status, StatusCode::ACCEPTED, "{op}");
    assert_eq!(finished(&ws, &op)["state"], "succeeded");
    // A push that changes the dependencies syncs the sandbox, and its install step waits
    // while the sandbox holds `hold-install`.
    let hold = ws.sandboxes.join("grace/hold-install");
    std::fs::write(&hold, "").expect("hold the install");
    let pushed = std::time::SystemTime::now();
    push_saved(&ws, "grace", &[("package.json", "{}\n")]);
    let syncing = testkit::wait::until_seen(PATIENCE, "the sync in its install step", || {
        let (_, _, view) = call(&ws, "GET", sandbox, Some(KEY), None, None);
        let status = &view["status"];
        match (status["state"].as_str(), status["step"].as_str()) {
            (Some("syncing"), Some("install")) => Ok(view),
            _ => Err(view),
        }
    });
    let since = syncing["status"]["since"]
        .as_str()
        .unwrap_or_else(|| panic!("no since: {syncing}"));
    let began = humantime::parse_rfc3339(since).expect("RFC 3339 UTC");
    // RFC 3339 here is to the second.
    let second = std::time::Duration::from_secs(1);
    assert!(
        began + second >= pushed && began <= std::time::SystemTime::now(),
        "{since} is not when the sync began"
    );
    std::fs::remove_file(&hold).expect("let the install go on");
    testkit::wait::until_seen(PATIENCE, "ready after the sync", || {
        let (_, _, view) = call(&ws, "GET", sandbox, Some(KEY), None, None);
        (view["status"] == json!({"state": "ready"}))
            .then_some(())
            .ok_or(view)
    });
}
