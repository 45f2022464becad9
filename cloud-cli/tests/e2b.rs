//! `serve` driving E2B sandboxes (E2B_API_KEY set) through the fake E2B, with the workspace
//! page as people use it over HTTP: the first visit creates and restores the sandbox and asks
//! for the saved project's secrets, the form starts it (real PM2 and the real watcher in the
//! fake sandbox's home), a killed sandbox is brought back by the next visit (the saved tree,
//! the form again, a watcher pushing), an external push is synced into it, "Restore this
//! version" restores an earlier save in it; and the settings refused at start when half of
//! them are there.

mod common;

use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use reqwest::StatusCode;
use testkit::fake_e2b::{self, FakeE2b};
use testkit::git::{git, tree_of, tree_of_add_all};
use testkit::net::free_port;
use testkit::template::{ShmastraE2b, TEMPLATE_NAME};
use testkit::wait::until_seen;

use cloud_core::TOKEN_STATE_ENV as TOKEN_STATE;
use common::Serve;
use common::workspace::{SECRET, csrf_of};

fn block<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

fn get(url: &str, cookie: &str) -> (StatusCode, String) {
    block(async {
        let response = reqwest::Client::new()
            .get(url)
            .header("cookie", format!("shmastra_session={cookie}"))
            .send()
            .await
            .expect("GET");
        (response.status(), response.text().await.expect("body"))
    })
}

/// A POST as the browser sends the form; the answer must come within a minute.
fn post(url: &str, cookie: &str, form: &[(&str, &str)]) -> StatusCode {
    block(async {
        reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap()
            .post(url)
            .header("cookie", format!("shmastra_session={cookie}"))
            .form(form)
            .send()
            .await
            .expect("POST")
            .status()
    })
}

fn serve_without_sandboxes(env: &[(&str, &str)], args: &[&str]) -> (Option<i32>, String) {
    let tmp = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shmastra-cloud"))
        .args(["serve", "--listen", "127.0.0.1:0", "--upstream-dir"])
        .arg(tmp.path().join("up"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("SHMASTRA_TOKEN_SECRET", SECRET)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn half_the_e2b_settings_are_refused_at_start() {
    let (code, stderr) = serve_without_sandboxes(&[("E2B_API_KEY", "e2b_x")], &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("E2B_API_KEY is set but E2B_TEMPLATE is not"),
        "{stderr}"
    );
    let (code, stderr) = serve_without_sandboxes(&[("E2B_TEMPLATE", "t")], &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("E2B_TEMPLATE is set but E2B_API_KEY is not"),
        "{stderr}"
    );
    let both = [("E2B_API_KEY", "e2b_x"), ("E2B_TEMPLATE", "t")];
    let (code, stderr) = serve_without_sandboxes(&both, &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("SHMASTRA_PUBLIC_URL"), "{stderr}");
    let tmp = tempfile::tempdir().unwrap();
    let sandboxes = tmp.path().join("sb").display().to_string();
    let (code, stderr) = serve_without_sandboxes(
        &both,
        &[
            "--sandboxes-dir",
            &sandboxes,
            "--watcher-bin",
            "/bin/true",
            "--public-url",
            "https://x",
        ],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("either on this machine or at E2B"),
        "{stderr}"
    );
}

/// alice's saved project in the embedded upstream, with a manifest that names one secret.
fn save_project(upstream: &Path) {
    let saved = upstream.join("../saved");
    testkit::git::init_repo(&saved);
    std::fs::create_dir_all(saved.join("src")).unwrap();
    std::fs::write(saved.join(".gitignore"), "node_modules/\n").unwrap();
    std::fs::write(saved.join("src/index.ts"), "export const agent = 'mine';\n").unwrap();
    std::fs::write(
        saved.join("shmastra.json"),
        "{\n  \"version\": 1,\n  \"env\": [\n    \"OPENAI_API_KEY\"\n  ]\n}\n",
    )
    .unwrap();
    git(&saved, ["add", "-A"]);
    git(&saved, ["commit", "-qm", "saved"]);
    let bare = upstream.join("alice.git");
    git(
        upstream,
        ["init", "-q", "--bare", "-b", "main", "alice.git"],
    );
    git(&saved, ["push", "-q", bare.to_str().unwrap(), "HEAD:main"]);
}

/// The dev server's health URL as the sandboxes' health checks ask it: 200 while open, 503
/// while closed (a dev server still compiling).
struct HealthGate {
    url: String,
    open: Arc<AtomicBool>,
}

impl HealthGate {
    fn start() -> HealthGate {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/health", listener.local_addr().unwrap());
        let open = Arc::new(AtomicBool::new(true));
        let answers = open.clone();
        std::thread::spawn(move || {
            for mut stream in listener.incoming().flatten() {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
                    head.push(byte[0]);
                }
                let status = if answers.load(Ordering::SeqCst) {
                    "200 OK"
                } else {
                    "503 Service Unavailable"
                };
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status}\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok"
                );
            }
        });
        HealthGate { url, open }
    }

    fn set_open(&self, open: bool) {
        self.open.store(open, Ordering::SeqCst);
    }
}

/// serve with E2B against the fake (with its template made by the recipe, real PM2 and the
/// watcher in its sandboxes), over the embedded upstream, at a public URL it really answers.
struct World {
    tmp: tempfile::TempDir,
    e2b: ShmastraE2b,
    upstream: std::path::PathBuf,
    public: String,
    serve: Serve,
    health: HealthGate,
}

impl World {
    fn start() -> World {
        let tmp = tempfile::tempdir().unwrap();
        let e2b = ShmastraE2b::start(tmp.path());
        let upstream = tmp.path().join("upstream");
        std::fs::create_dir_all(&upstream).unwrap();
        save_project(&upstream);
        let port = free_port();
        let public = format!("http://127.0.0.1:{port}");
        let listen = format!("127.0.0.1:{port}");
        let mut env = e2b.fake.env(TEMPLATE_NAME);
        let state = tmp.path().join("token-state");
        env.push((TOKEN_STATE, state.display().to_string()));
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let health = HealthGate::start();
        let serve = Serve::start(
            SECRET,
            &[
                "--listen",
                &listen,
                "--upstream-dir",
                upstream.to_str().unwrap(),
                "--public-url",
                &public,
                "--health-url",
                &health.url,
            ],
            &env,
            "true",
        );
        World {
            tmp,
            e2b,
            upstream,
            public,
            serve,
            health,
        }
    }
}

#[test]
fn the_page_brings_e2b_sandboxes_up_and_back() {
    let World {
        tmp,
        e2b,
        upstream,
        public,
        mut serve,
        health,
    } = World::start();
    let fake = &e2b.fake;
    let link = {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_shmastra-cloud"))
            .args(["login-link", "--user", "alice", "--public-url", &public])
            .env_clear()
            .env("SHMASTRA_TOKEN_SECRET", SECRET)
            .env(TOKEN_STATE, tmp.path().join("token-state"))
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    let (cookie, _) = common::page::sign_in(&link);
    let page = serve.url("/u/alice");
    // A visit waits for a create, a restore and a health check in turn.
    let patience = testkit::wait::PATIENCE * 2;
    // The status label the page shows.
    let wait_for = |label: &str| {
        let shown = format!("<strong id=\"status-label\">{label}</strong>");
        until_seen(patience, label, || {
            let (status, body) = get(&page, &cookie);
            (status == StatusCode::OK && body.contains(&shown))
                .then_some(body.clone())
                .ok_or(body)
        })
    };
    let fill_form = |body: &str| {
        let csrf = csrf_of(body);
        let status = post(
            &serve.url("/u/alice/restore-project"),
            &cookie,
            &[("csrf", &csrf), ("env.OPENAI_API_KEY", "sk-from-the-form")],
        );
        assert_eq!(status, StatusCode::SEE_OTHER);
    };

    // The first visit: a sandbox at E2B, restored, the saved manifest's secret asked for.
    let body = wait_for("Needs your secrets");
    let sandboxes = fake.sandboxes();
    assert_eq!(sandboxes.len(), 1, "{sandboxes:?}");
    let first = sandboxes[0].clone();
    assert_eq!(first.metadata["shmastraUser"], "alice");
    // The form is answered once the dev server is starting, not once its health check
    // passes (up to minutes): here it passes only after the answer came.
    health.set_open(false);
    fill_form(&body);
    wait_for("Starting the dev server");
    health.set_open(true);
    wait_for("Ready");
    let project = first.home.join("shmastra");
    assert_eq!(
        std::fs::read_to_string(project.join(".env")).unwrap(),
        "OPENAI_API_KEY='sk-from-the-form'\n"
    );
    let saved = upstream.join("alice.git");

    // Killed at E2B: the next visit brings it back from the saved branch, and asks again.
    fake.kill(&first.id);
    let body = wait_for("Needs your secrets");
    let second = fake.sandboxes();
    assert_eq!(second.len(), 1, "{second:?}");
    assert_ne!(second[0].id, first.id);
    let project = second[0].home.join("shmastra");
    assert_eq!(tree_of_add_all(&project), tree_of(&saved, "main").unwrap());
    fill_form(&body);
    wait_for("Ready");
    assert_eq!(
        std::fs::read_to_string(project.join(".env")).unwrap(),
        "OPENAI_API_KEY='sk-from-the-form'\n"
    );
    // Its watcher (under PM2 in the new sandbox) saves and pushes.
    std::fs::write(project.join("src/after.ts"), "after the kill\n").unwrap();
    until_seen(patience, "the new sandbox's edit on the upstream", || {
        let out = testkit::git::git_output(&saved, ["cat-file", "-e", "main:src/after.ts"]);
        out.status.success().then_some(()).ok_or(out)
    });

    // An external push reaches the sandbox through the sync serve runs.
    let laptop = tmp.path().join("laptop");
    let remote = serve.remote_url("alice");
    git(tmp.path(), ["clone", "-q", &remote, "laptop"]);
    testkit::git::init_repo(&laptop);
    std::fs::write(laptop.join("src/laptop.ts"), "from the laptop\n").unwrap();
    git(&laptop, ["add", "-A"]);
    git(&laptop, ["commit", "-qm", "laptop"]);
    for _ in 0..10 {
        if testkit::git::git_output(&laptop, ["push", "-q", "origin", "HEAD:main"])
            .status
            .success()
        {
            break;
        }
        git(&laptop, ["pull", "-q", "--rebase", "origin", "main"]);
    }
    until_seen(patience, "the laptop's file in the sandbox", || {
        std::fs::read_to_string(project.join("src/laptop.ts")).map_err(|e| e.to_string())
    });

    // "Restore this version" of the first save, listed on the page: the E2B sandbox's tree
    // becomes it, saved as a new version.
    let first_save = git(&saved, ["rev-list", "--max-parents=0", "main"]);
    let first_save = first_save.trim();
    let body = wait_for("Ready");
    assert!(body.contains(first_save), "the page lists the first save");
    let status = post(
        &serve.url("/u/alice/restore-version"),
        &cookie,
        &[("csrf", &csrf_of(&body)), ("commit", first_save)],
    );
    assert_eq!(status, StatusCode::SEE_OTHER);
    let restored = tree_of(&saved, first_save).unwrap();
    until_seen(
        patience,
        "the first save's tree in the sandbox and upstream",
        || {
            let now = (tree_of_add_all(&project), tree_of(&saved, "main").unwrap());
            (now == (restored.clone(), restored.clone()))
                .then_some(())
                .ok_or(now)
        },
    );

    let status = serve.stop();
    assert!(status.success(), "{status}");
}

/// `shmastra-cloud sandboxes ...` with the world's settings; its exit code, stdout and stderr.
fn sandboxes(world: &World, args: &[&str]) -> (Option<i32>, String, String) {
    let bin = env!("CARGO_BIN_EXE_shmastra-cloud");
    let out = run_sandboxes(world, &[bin, "--json"], args);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `shmastra-cloud sandboxes ...` as an operator runs it at a terminal (a pseudo-terminal
/// from Python's `pty`): its exit status and everything it printed there.
fn sandboxes_at_a_terminal(world: &World, args: &[&str]) -> (Option<i32>, String) {
    let pty = "import os, pty, sys; sys.exit(os.waitstatus_to_exitcode(pty.spawn(sys.argv[1:])))";
    let bin = env!("CARGO_BIN_EXE_shmastra-cloud");
    let out = run_sandboxes(world, &["python3", "-c", pty, bin], args);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).replace("\r\n", "\n"),
    )
}

/// `<launch...> sandboxes --upstream-dir ... --public-url ... <args>`: `launch` is the binary
/// with its global flags, or a program that runs it.
fn run_sandboxes(world: &World, launch: &[&str], args: &[&str]) -> std::process::Output {
    let (program, before) = launch.split_first().expect("a program");
    std::process::Command::new(program)
        .args(before)
        .args([
            "sandboxes",
            "--upstream-dir",
            world.upstream.to_str().unwrap(),
            "--public-url",
            &world.public,
        ])
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("SHMASTRA_TOKEN_SECRET", SECRET)
        .envs(world.e2b.fake.env(TEMPLATE_NAME))
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

/// A sandbox the cloud did not make: created at E2B by an earlier system, its user under
/// `userId`, its project the template's, no repository, no watcher.
fn earlier_sandbox(fake: &FakeE2b, user: &str) -> String {
    block(async {
        let body: serde_json::Value = reqwest::Client::new()
            .post(format!("{}/sandboxes", fake.api_url()))
            .header("X-API-Key", fake_e2b::API_KEY)
            .json(&serde_json::json!({
                "templateID": TEMPLATE_NAME,
                "timeout": 600,
                "secure": true,
                "metadata": {"userId": user},
            }))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        body["sandboxID"].as_str().unwrap().to_owned()
    })
}

#[test]
fn backfill_provisions_every_existing_sandbox_once_and_status_reports_them() {
    let world = World::start();
    let bob = earlier_sandbox(&world.e2b.fake, "bob");
    let carol = earlier_sandbox(&world.e2b.fake, "carol");
    let json = |stdout: &str| -> serde_json::Value {
        serde_json::from_str(stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
    };

    let (code, stdout, stderr) = sandboxes(&world, &["backfill", "--user-key", "userId"]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(
        !stderr.contains("[1/2]"),
        "no progress lines off a terminal: {stderr}"
    );
    let report = json(&stdout);
    let outcomes: Vec<(&str, &str, &str)> = report["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["user"].as_str().unwrap(),
                e["sandbox"].as_str().unwrap(),
                e["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        outcomes,
        [
            ("bob", bob.as_str(), "provisioned"),
            ("carol", carol.as_str(), "provisioned")
        ]
    );
    for (user, id) in [("bob", &bob), ("carol", &carol)] {
        let home = world.e2b.fake.sandbox(id).unwrap().home;
        let env = std::fs::read_to_string(home.join(".project-watcher/.env")).unwrap();
        assert!(
            env.contains(&format!("PROJECT_TOKEN={}", world.serve.token(user))),
            "{env}"
        );
        // Its watcher (under PM2) saves the project to the user's new repository (which the
        // embedded upstream makes at that first push).
        let repo = world.upstream.join(format!("{user}.git"));
        until_seen(
            testkit::wait::PATIENCE * 2,
            "the project on the upstream",
            || {
                if !repo.exists() {
                    return Err("no repository yet".to_owned());
                }
                let out = testkit::git::git_output(&repo, ["cat-file", "-e", "main:package.json"]);
                out.status
                    .success()
                    .then_some(())
                    .ok_or_else(|| format!("{out:?}"))
            },
        );
    }

    // Again, at a terminal: nothing to do, a progress line per sandbox, then the report.
    let (code, shown) = sandboxes_at_a_terminal(&world, &["backfill", "--user-key", "userId"]);
    assert_eq!(code, Some(0), "{shown}");
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(
        lines,
        [
            format!("[1/2] bob ({bob}): already done"),
            format!("[2/2] carol ({carol}): already done"),
            format!("bob ({bob}): already done"),
            format!("carol ({carol}): already done"),
            "2 sandboxes: 0 provisioned, 2 already done, 0 failed".to_owned(),
        ],
        "{shown}"
    );

    // The status: both running with a watcher that pushed; a paused one is left paused.
    world.e2b.fake.pause(&carol);
    let (code, stdout, stderr) = sandboxes(&world, &["status", "--user-key", "userId"]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let status = json(&stdout);
    let all = status["sandboxes"].as_array().unwrap();
    assert_eq!(all.len(), 2, "{status}");
    assert_eq!(all[0]["user"], "bob");
    assert_eq!(all[0]["state"], "running");
    assert_eq!(all[0]["watcher"]["running"], true, "{status}");
    assert!(
        all[0]["watcher"]["last_push_age_secs"].as_u64().is_some(),
        "{status}"
    );
    assert_eq!(all[0]["watcher"]["unpushed_commits"], 0, "{status}");
    assert_eq!(all[1]["user"], "carol");
    assert_eq!(all[1]["state"], "paused");
    assert!(
        all[1]["note"].as_str().unwrap().contains("paused"),
        "{status}"
    );
    assert_eq!(
        world.e2b.fake.sandbox(&carol).unwrap().state,
        testkit::fake_e2b::State::Paused,
        "not resumed to look"
    );

    // One user: nothing is created for a user without a sandbox.
    let (code, stdout, stderr) = sandboxes(
        &world,
        &["provision", "--user", "dave", "--user-key", "userId"],
    );
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert!(stderr.contains("sandbox dave is gone"), "{stderr}");
    assert_eq!(world.e2b.fake.sandboxes().len(), 2);
    let (code, stdout, stderr) = sandboxes(
        &world,
        &["provision", "--user", "bob", "--user-key", "userId"],
    );
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert_eq!(
        json(&stdout)["provisioned"]["watcher_started"],
        false,
        "{stdout}"
    );
}
