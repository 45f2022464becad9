//! Secret values, the service token and the signing secret never reach a log line, an error
//! message, a `Debug` rendering, a response, a redirect target or the environment of the
//! commands the cloud runs. The library's logs are captured at TRACE level while every path
//! that handles them runs, successes and failures alike; the real `shmastra-cloud serve` is
//! driven through its upstream failures (502, 504) and a redirect with its log at TRACE.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cloud_core::Config;
use cloud_core::EmbeddedUpstream;
use cloud_core::LocalSandbox;
use cloud_core::Manifest;
use cloud_core::TokenSigner;
use cloud_core::UserId;
use cloud_core::{GitLab, RetryPolicy};
use cloud_core::{Orchestrator, Persistence, SandboxLayout, SandboxStatus};
use cloud_core::{RestoreForm, SecretValue, render_env};
use secrecy::SecretString;
use testkit::fake_gitlab::{FakeGitLab, Fault, GROUP_ID, GROUP_PATH, SERVICE_TOKEN};
use testkit::git::{git, hermetic_env, init_repo};
use testkit::git_server::{Fault as GitFault, GitServer};
use testkit::statuses::Statuses;
use testkit::wait;

const WRONG_TOKEN: &str = "glpat-LEAK-wrong-token";
const SIGNING_SECRET: &str = "LEAK-signing-secret-0123456789abcdef";
const WEBHOOK_SECRET: &str = "LEAK-webhook-secret";
const VALUES: [&str; 3] = ["LEAK-value-one", "LEAK-value-two", "LEAK-value-extra"];

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

fn assert_clean(what: &str, text: &str) {
    for secret in [SERVICE_TOKEN, WRONG_TOKEN, SIGNING_SECRET, WEBHOOK_SECRET]
        .iter()
        .chain(VALUES.iter())
    {
        assert!(!text.contains(secret), "{what} shows {secret:?}:\n{text}");
    }
}

fn client(fake: &FakeGitLab, token: &str) -> GitLab {
    let mut config = Config::new(&fake.api_url(), GROUP_ID, SecretString::from(token)).unwrap();
    config.token_secret = Some(SecretString::from(SIGNING_SECRET));
    assert_clean("Config's Debug", &format!("{config:?}"));
    let retry = RetryPolicy {
        initial_backoff: Duration::from_millis(5),
        ..RetryPolicy::default()
    };
    GitLab::with_retry_policy(&config, retry).unwrap()
}

#[tokio::test]
async fn no_secret_in_logs_errors_or_debug() {
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let mut rendered = Vec::new();

    let fake = FakeGitLab::start().await;
    let err = client(&fake, WRONG_TOKEN).check().await.unwrap_err();
    rendered.push(format!("{err} {err:?}"));

    fake.push_fault(Fault::ServerError);
    fake.push_fault(Fault::TooManyRequests {
        retry_after_secs: 0,
    });
    let gitlab = client(&fake, SERVICE_TOKEN);
    let project = gitlab
        .ensure_user_project(&UserId::parse("alice").unwrap())
        .await
        .unwrap();
    rendered.push(format!("{project:?} {gitlab:?}"));

    let manifest = Manifest::new(["ONE", "TWO"]).unwrap();
    let bad = vec![
        (
            "ONE".to_owned(),
            SecretValue::from(format!("{}\0", VALUES[0])),
        ),
        ("EXTRA".to_owned(), SecretValue::from(VALUES[2])),
        ("ONE".to_owned(), SecretValue::from(VALUES[1])),
    ];
    let err = RestoreForm::validate(&manifest, bad).unwrap_err();
    rendered.push(format!("{err} {err:?}"));

    let good = vec![
        ("ONE".to_owned(), SecretValue::from(VALUES[0])),
        ("TWO".to_owned(), SecretValue::from(VALUES[1])),
    ];
    let form = RestoreForm::validate(&manifest, good).unwrap();
    let env = render_env(&form);
    assert!(
        env.expose().contains(VALUES[0]),
        "the .env text itself must hold the value"
    );
    rendered.push(format!("{form:?} {env:?} {env}"));

    let logs = logs.text();
    for expected in [
        "rejected the service token",
        "retrying",
        "created GitLab project",
        "secrets form rejected",
        "secrets form accepted",
    ] {
        assert!(
            logs.contains(expected),
            "the capture missed {expected:?}:\n{logs}"
        );
    }
    assert_clean("the logs", &logs);
    for text in rendered {
        assert_clean("an error or Debug rendering", &text);
    }
    let sent = fake.requests();
    assert!(
        sent.iter()
            .any(|r| r.private_token.as_deref() == Some(SERVICE_TOKEN)),
        "the token must still reach GitLab"
    );
}

/// A server that answers every request with a redirect to [`Trap`], as a hijacked or
/// misconfigured upstream would.
fn redirector(to: &str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let answer = format!(
        "HTTP/1.1 302 Found\r\nLocation: {to}/stolen\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(&stream);
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                line.clear();
            }
            let _ = (&stream).write_all(answer.as_bytes());
        }
    });
    base
}

/// Where a redirect points: records every request that arrives, with its headers.
struct Trap {
    base: String,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Trap {
    fn start() -> Trap {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = Arc::clone(&seen);
        std::thread::spawn(move || {
            for mut stream in listener.incoming().flatten() {
                stream
                    .set_read_timeout(Some(Duration::from_millis(500)))
                    .unwrap();
                let mut head = vec![0; 4096];
                let n = stream.read(&mut head).unwrap_or(0);
                record
                    .lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&head[..n]).into_owned());
            }
        });
        Trap { base, seen }
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

/// `shmastra-cloud serve` on a GitLab upstream, logging at TRACE to a file.
struct Serve {
    child: std::process::Child,
    _stdout: BufReader<std::process::ChildStdout>,
    addr: String,
    log: std::path::PathBuf,
}

impl Serve {
    fn start(dir: &Path, gitlab: &FakeGitLab, on_push: &str) -> Serve {
        let log = dir.join("serve.log");
        let mut child = Command::new(env!("CARGO_BIN_EXE_shmastra-cloud"))
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--on-external-push",
                on_push,
            ])
            .args(["--upstream-timeout", "2s", "--idle-timeout", "2s"])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(hermetic_env(dir))
            .env("SHMASTRA_TOKEN_SECRET", SIGNING_SECRET)
            .env("GITLAB_WEBHOOK_SECRET", WEBHOOK_SECRET)
            .env("GITLAB_SERVICE_TOKEN", SERVICE_TOKEN)
            .env("GITLAB_GROUP_ID", GROUP_ID.to_string())
            .env("GITLAB_API_URL", gitlab.api_url())
            .env("RUST_LOG", "trace")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start shmastra-cloud serve");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        stdout.read_line(&mut first).unwrap();
        let addr = first
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("serve did not start: {first:?}"))
            .to_owned();
        Serve {
            child,
            _stdout: stdout,
            addr,
            log,
        }
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET info/refs` through the proxy as `user`: status and body.
fn advertise(runtime: &tokio::runtime::Runtime, serve: &Serve, user: &str) -> (u16, String) {
    let token = TokenSigner::new(SIGNING_SECRET.as_bytes())
        .unwrap()
        .mint(&UserId::parse(user).unwrap());
    runtime.block_on(async {
        let response = reqwest::Client::new()
            .get(format!(
                "http://{}/api/git/{user}.git/info/refs?service=git-upload-pack",
                serve.addr
            ))
            .basic_auth("x", Some(token))
            .send()
            .await
            .expect("the proxy answers");
        let status = response.status().as_u16();
        (status, response.text().await.unwrap_or_default())
    })
}

#[test]
fn the_service_token_stays_out_of_failure_logs_redirects_and_the_push_command() {
    let tmp = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let server = GitServer::start(&tmp.path().join("repos"));
    server.create_bare(&format!("{GROUP_PATH}/alice.git"));
    server.require_password(SERVICE_TOKEN);
    let gitlab = runtime.block_on(FakeGitLab::start());
    gitlab.set_repo_base(&server.base_url());
    gitlab.add_project("alice");
    let hook_env = tmp.path().join("hook-env");
    let on_push = format!("env >> '{}'", hook_env.display());
    let serve = Serve::start(tmp.path(), &gitlab, &on_push);

    // An external push runs the command: its environment holds the event, no secret.
    let work = tmp.path().join("work");
    init_repo(&work);
    std::fs::write(work.join("a.txt"), "a\n").unwrap();
    git(&work, ["add", "-A"]);
    git(&work, ["commit", "-qm", "first"]);
    let token = TokenSigner::new(SIGNING_SECRET.as_bytes())
        .unwrap()
        .mint(&UserId::parse("alice").unwrap());
    let url = format!("http://x:{token}@{}/api/git/alice.git", serve.addr);
    git(&work, ["push", "-q", &url, "main"]);
    let env = wait::until(wait::PATIENCE, "the push command's env", || {
        std::fs::read_to_string(&hook_env)
            .ok()
            .filter(|e| e.contains("SHMASTRA_USER=alice"))
    });
    assert_clean("the --on-external-push environment", &env);

    // Upstream failures: 500 and 403 are 502, a stall is 504.
    for (fault, expected) in [
        (GitFault::Status500, 502),
        (GitFault::Status403, 502),
        (GitFault::Stall, 504),
    ] {
        server.set_fault(fault);
        let (status, body) = advertise(&runtime, &serve, "alice");
        assert_eq!(status, expected, "{fault:?}: {body}");
        assert_clean(&format!("the {status} body"), &body);
    }
    server.set_fault(GitFault::None);
    // A repository on a host that refuses connections (a new user: the proxy's pooled
    // connection to the git server would survive the server refusing new ones): 502.
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    gitlab.set_repo_base(&format!("http://{}", closed.local_addr().unwrap()));
    drop(closed);
    gitlab.add_project("carol");
    let (status, body) = advertise(&runtime, &serve, "carol");
    assert_eq!(status, 502, "refused: {body}");
    assert_clean("the refused 502 body", &body);

    // An upstream that redirects: the proxy does not follow, nothing reaches the target.
    let trap = Trap::start();
    gitlab.set_repo_base(&redirector(&trap.base));
    gitlab.add_project("bob");
    let (status, body) = advertise(&runtime, &serve, "bob");
    assert!(!(200..300).contains(&status), "{status}: {body}");
    assert_clean("the redirected answer", &body);

    // The GitLab API itself redirecting: refused, the token not sent on.
    let api = format!("{}/api/v4", redirector(&trap.base));
    let check = Command::new(env!("CARGO_BIN_EXE_shmastra-cloud"))
        .args(["gitlab", "check"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("GITLAB_SERVICE_TOKEN", SERVICE_TOKEN)
        .env("GITLAB_GROUP_ID", GROUP_ID.to_string())
        .env("GITLAB_API_URL", &api)
        .env("RUST_LOG", "trace")
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(!check.status.success(), "{said}");
    assert!(said.contains("redirect"), "{said}");
    assert_clean("gitlab check's output", &said);
    assert!(
        trap.seen().is_empty(),
        "a redirect was followed: {:?}",
        trap.seen()
    );

    let logs = serve.logs();
    for expected in ["\"status\":502", "\"status\":504", "sync command finished"] {
        assert!(
            logs.contains(expected),
            "the log missed {expected}:\n{logs}"
        );
    }
    assert_clean("serve's log", &logs);
}

/// The child half of the next test: run by it in a process whose environment holds the
/// server's secrets, as the cloud's own process does.
const CHILD: &str = "NO_SECRET_LEAKS_SYNC_HOME";

#[tokio::test]
async fn sync_commands_in_a_sandbox_never_see_the_servers_secrets() {
    if let Some(home) = std::env::var_os(CHILD) {
        let home = std::path::PathBuf::from(home);
        let project = home.join("project");
        std::fs::create_dir_all(&project).unwrap();
        // Stands in for `project-watcher sync`: records the environment it and its child
        // commands (--stop-cmd, --install-cmd, --start-cmd) get.
        let watcher = home.join("fake-watcher");
        std::fs::write(&watcher, "#!/bin/sh\nenv > \"$HOME/sync-env\"\n").unwrap();
        std::fs::set_permissions(
            &watcher,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let signer = TokenSigner::new(SIGNING_SECRET.as_bytes()).unwrap();
        let orchestrator = Orchestrator::new(
            Some(Persistence {
                host: EmbeddedUpstream::new(home.join("upstream")).unwrap(),
                signer,
                git_url: "http://127.0.0.1:9/api/git".into(),
            }),
            SandboxLayout {
                project_dir: "project".into(),
                watcher_env_file: ".project-watcher/.env".into(),
                watcher_bin: watcher.display().to_string(),
                start_watcher: "true".into(),
                stop_watcher: "true".into(),
                watcher_running: "false".into(),
                start_dev_server: "true".into(),
                stop_dev_server: "true".into(),
                install_cmd: None,
                failure_file: "sync-failure".into(),
                command_timeout: Duration::from_secs(30),
                sync_timeout: Duration::from_secs(30),
                health: None,
                exclude: Vec::new(),
            },
        );
        let sandbox = LocalSandbox::new("sbx", &home);
        let statuses = Statuses::default();
        orchestrator
            .sync(&sandbox, &UserId::parse("alice").unwrap(), &statuses)
            .await;
        assert_eq!(
            statuses.all(),
            [
                SandboxStatus::Syncing {
                    since: None,
                    step: None
                },
                SandboxStatus::Ready
            ]
        );
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let out = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "sync_commands_in_a_sandbox_never_see_the_servers_secrets",
            "--nocapture",
        ])
        .env(CHILD, home.path())
        .env("GITLAB_SERVICE_TOKEN", SERVICE_TOKEN)
        .env("SHMASTRA_TOKEN_SECRET", SIGNING_SECRET)
        .env("GITLAB_WEBHOOK_SECRET", WEBHOOK_SECRET)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let env = std::fs::read_to_string(home.path().join("sync-env")).unwrap();
    assert!(
        env.contains("PROJECT_TOKEN=v1."),
        "not the sync's env: {env}"
    );
    assert_clean("the environment of sync's commands", &env);
}
