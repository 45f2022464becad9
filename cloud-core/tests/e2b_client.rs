//! The E2B client against the fake E2B (`testkit::fake_e2b`): the control plane's calls and
//! paging, commands through envd's Connect stream (output, exit codes, keepalives, a dropped
//! stream followed again by pid, a pause in the middle), files, and each error class with the
//! number of requests it cost.

use std::collections::BTreeMap;
use std::time::Duration;

use cloud_core::RetryPolicy;
use cloud_core::e2b::envd::{Collected, Command, Interrupted};
use cloud_core::e2b::{
    Connected, ControlPlane, E2bError, Envd, NewSandbox, SandboxAccess, SandboxState,
    StreamTimeouts,
};
use reqwest::Url;
use secrecy::SecretString;
use testkit::fake_e2b::{self, FakeE2b, Fault, Route, State};
use tokio::time::Instant;

struct World {
    _tmp: tempfile::TempDir,
    fake: FakeE2b,
    api: ControlPlane,
}

fn retry() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 3,
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(50),
        max_retry_after: Duration::from_secs(5),
    }
}

fn world() -> World {
    let tmp = tempfile::tempdir().unwrap();
    let template = tmp.path().join("template");
    std::fs::create_dir_all(template.join("shmastra")).unwrap();
    std::fs::write(template.join("shmastra/package.json"), "{}\n").unwrap();
    let fake = FakeE2b::start(&tmp.path().join("sandboxes"), &[("shmastra", &template)]);
    let api = ControlPlane::new(
        Url::parse(&fake.api_url()).unwrap(),
        &SecretString::from(fake_e2b::API_KEY),
        Duration::from_secs(10),
        retry(),
    )
    .unwrap();
    World {
        _tmp: tmp,
        fake,
        api,
    }
}

fn new_sandbox(user: &str) -> NewSandbox {
    NewSandbox {
        template: "shmastra".into(),
        timeout: Duration::from_secs(600),
        auto_pause: true,
        auto_resume: false,
        metadata: BTreeMap::from([("shmastraUser".to_owned(), user.to_owned())]),
        env_vars: BTreeMap::from([("SANDBOX_WIDE".to_owned(), "yes".to_owned())]),
    }
}

fn timeouts() -> StreamTimeouts {
    StreamTimeouts {
        keepalive: Duration::from_secs(1),
        idle: Duration::from_millis(2500),
        request: Duration::from_secs(10),
    }
}

impl World {
    fn envd(&self, access: &SandboxAccess) -> Envd {
        self.envd_with(access, timeouts())
    }

    fn envd_with(&self, access: &SandboxAccess, timeouts: StreamTimeouts) -> Envd {
        Envd::new(
            Url::parse(&self.fake.sandbox_url()).unwrap(),
            &access.sandbox_id,
            access.envd_access_token.as_ref(),
            "user",
            timeouts,
            retry(),
        )
        .unwrap()
    }
}

fn command(line: &str) -> Command<'_> {
    Command {
        line,
        envs: BTreeMap::new(),
        cwd: None,
        timeout: Duration::from_secs(30),
    }
}

async fn run(
    envd: &Envd,
    command: &Command<'_>,
) -> (Collected, Result<cloud_core::e2b::rpc::End, Interrupted>) {
    let mut collected = Collected::default();
    let deadline = Instant::now() + command.timeout;
    let ended = match envd.start(command).await {
        Ok(mut stream) => stream.wait(&mut collected, deadline).await,
        Err(e) => Err(Interrupted::Broken(e)),
    };
    (collected, ended)
}

#[tokio::test]
async fn create_connect_get_list_pause_and_kill() {
    let w = world();
    let access = w.api.create(&new_sandbox("alice")).await.unwrap();
    let id = access.sandbox_id.clone();
    let view = w.fake.sandbox(&id).unwrap();
    assert_eq!(view.metadata["shmastraUser"], "alice");
    assert!(view.auto_pause && !view.auto_resume);
    assert!(view.remaining > Duration::from_secs(590), "{view:?}");
    assert!(access.envd_access_token.is_some());

    let info = w.api.get(&id).await.unwrap().unwrap();
    assert_eq!(info.state, SandboxState::Running);
    let (connected, _) = w.api.connect(&id, Duration::from_secs(60)).await.unwrap();
    assert_eq!(connected, Connected::Running);
    assert!(
        w.fake.sandbox(&id).unwrap().remaining > Duration::from_secs(590),
        "connect only extends the timeout"
    );
    w.api
        .set_timeout(&id, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(w.fake.sandbox(&id).unwrap().remaining <= Duration::from_secs(30));

    assert!(w.api.pause(&id).await.unwrap());
    assert!(!w.api.pause(&id).await.unwrap(), "paused already: 409");
    assert_eq!(
        w.api.get(&id).await.unwrap().unwrap().state,
        SandboxState::Paused
    );
    let (connected, _) = w.api.connect(&id, Duration::from_secs(60)).await.unwrap();
    assert_eq!(connected, Connected::Resumed);
    assert_eq!(w.fake.sandbox(&id).unwrap().state, State::Running);

    assert!(w.api.kill(&id).await.unwrap());
    assert!(!w.api.kill(&id).await.unwrap());
    assert!(w.api.get(&id).await.unwrap().is_none());
    let err = w
        .api
        .connect(&id, Duration::from_secs(60))
        .await
        .unwrap_err();
    assert!(matches!(err, E2bError::NotFound { .. }), "{err}");
    assert!(!view.home.exists(), "a kill takes the files");
}

#[tokio::test]
async fn list_pages_through_every_sandbox_matching_the_metadata() {
    let w = world();
    let mut bob = Vec::new();
    for n in 0..105 {
        let user = if n % 21 == 0 { "alice" } else { "bob" };
        let access = w.api.create(&new_sandbox(user)).await.unwrap();
        if user == "bob" {
            bob.push(access.sandbox_id);
        }
    }
    let filter = |user: &str| BTreeMap::from([("shmastraUser".to_owned(), user.to_owned())]);
    let alice = w.api.list(&filter("alice")).await.unwrap();
    assert_eq!(alice.len(), 5);
    let mut listed: Vec<String> = w
        .api
        .list(&filter("bob"))
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.sandbox_id)
        .collect();
    assert_eq!(listed.len(), 100);
    listed.sort();
    bob.sort();
    assert_eq!(listed, bob);
    assert_eq!(w.api.list(&BTreeMap::new()).await.unwrap().len(), 105);
    let pages = w.fake.count("GET", "/v2/sandboxes");
    assert_eq!(
        pages,
        1 + 1 + 2,
        "one page each for alice and bob, two for everyone"
    );
}

#[tokio::test]
async fn commands_stream_their_output_and_exit_code() {
    let w = world();
    let access = w.api.create(&new_sandbox("alice")).await.unwrap();
    let envd = w.envd(&access);
    let home = w.fake.sandbox(&access.sandbox_id).unwrap().home;

    let mut cmd = command("echo \"$HOME|$(pwd)|$SANDBOX_WIDE|$ONE\"; echo oops >&2; exit 3");
    cmd.envs.insert("ONE", "1");
    cmd.cwd = Some("shmastra");
    let shmastra = home.join("shmastra");
    cmd.cwd = Some(shmastra.to_str().unwrap());
    let (out, end) = run(&envd, &cmd).await;
    let end = end.unwrap();
    assert_eq!(end.code(), Some(3));
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        format!("{}|{}|yes|1\n", home.display(), shmastra.display())
    );
    assert_eq!(out.stderr, b"oops\n");
    assert!(out.pid.is_some());

    let (_, end) = run(&envd, &command("kill -9 $$")).await;
    assert_eq!(end.unwrap().code(), None, "a signal is no exit code");

    // Silent for longer than the idle limit, kept alive by envd's keepalives.
    let (out, end) = run(&envd, &command("sleep 4; echo late")).await;
    assert_eq!(end.unwrap().code(), Some(0));
    assert_eq!(out.stdout, b"late\n");

    // Without keepalives often enough, the same silence is a broken stream.
    let rare = StreamTimeouts {
        keepalive: Duration::from_secs(30),
        idle: Duration::from_millis(800),
        ..timeouts()
    };
    let (_, end) = run(&w.envd_with(&access, rare), &command("sleep 3")).await;
    assert!(
        matches!(end, Err(Interrupted::Broken(E2bError::StreamIdle { .. }))),
        "{end:?}"
    );

    let mut quick = command("sleep 20");
    quick.timeout = Duration::from_millis(500);
    let started = std::time::Instant::now();
    let (_, end) = run(&envd, &quick).await;
    assert!(matches!(end, Err(Interrupted::Deadline)), "{end:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn a_dropped_stream_is_followed_again_by_pid() {
    let w = world();
    let access = w.api.create(&new_sandbox("alice")).await.unwrap();
    let envd = w.envd(&access);
    w.fake.push_fault(
        Route::Start,
        Fault::DropStream {
            after: Duration::from_millis(300),
        },
    );
    let cmd = command("echo before; sleep 1; echo after; exit 4");
    let (mut out, end) = run(&envd, &cmd).await;
    let Err(Interrupted::Broken(E2bError::StreamBroken { .. })) = end else {
        panic!("{end:?}");
    };
    assert_eq!(out.stdout, b"before\n");
    let pid = out.pid.unwrap();
    let mut stream = envd.reconnect(pid, cmd.line).await.unwrap();
    let end = stream
        .wait(&mut out, Instant::now() + Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(end.code(), Some(4));
    assert_eq!(out.stdout, b"before\nafter\n");

    // The end stays known after the process is gone.
    let mut again = Collected::default();
    let end = envd
        .reconnect(pid, cmd.line)
        .await
        .unwrap()
        .wait(&mut again, Instant::now() + Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(end.code(), Some(4));
    let err = envd
        .reconnect(999_999, "x")
        .await
        .unwrap()
        .wait(&mut again, Instant::now() + Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Interrupted::Broken(E2bError::Rpc { code, .. }) if code == "not_found"),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_pause_breaks_the_stream_freezes_the_command_and_a_resume_lets_it_finish() {
    let w = world();
    let access = w.api.create(&new_sandbox("alice")).await.unwrap();
    let id = access.sandbox_id.clone();
    let envd = w.envd(&access);
    w.fake.push_fault(
        Route::Start,
        Fault::PauseDuringCommand {
            after: Duration::from_millis(300),
        },
    );
    let cmd = command("echo before; sleep 1; echo after");
    let (mut out, end) = run(&envd, &cmd).await;
    assert!(matches!(end, Err(Interrupted::Broken(_))), "{end:?}");
    assert_eq!(
        w.api.get(&id).await.unwrap().unwrap().state,
        SandboxState::Paused
    );

    // While paused, envd is unreachable: the proxy's 502, to be confirmed.
    let (_, refused) = run(&envd, &command("true")).await;
    assert!(
        matches!(
            refused,
            Err(Interrupted::Broken(E2bError::NotRunning { .. }))
        ),
        "{refused:?}"
    );
    let err = envd.read("shmastra/package.json").await.unwrap_err();
    assert!(matches!(err, E2bError::NotRunning { .. }), "{err}");

    let (connected, _) = w.api.connect(&id, Duration::from_secs(60)).await.unwrap();
    assert_eq!(connected, Connected::Resumed);
    let end = envd
        .reconnect(out.pid.unwrap(), cmd.line)
        .await
        .unwrap()
        .wait(&mut out, Instant::now() + Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(end.code(), Some(0));
    assert_eq!(out.stdout, b"before\nafter\n");
}

#[tokio::test]
async fn files_round_trip_and_the_access_token_is_checked() {
    let w = world();
    let access = w.api.create(&new_sandbox("alice")).await.unwrap();
    let envd = w.envd(&access);
    let home = w.fake.sandbox(&access.sandbox_id).unwrap().home;
    let path = home.join("a/b/.env");
    let path = path.to_str().unwrap();
    assert_eq!(envd.read(path).await.unwrap(), None);
    envd.write(path, b"KEY=1\n").await.unwrap();
    envd.write(path, b"KEY=2\n").await.unwrap();
    assert_eq!(envd.read(path).await.unwrap().unwrap(), b"KEY=2\n");
    assert_eq!(
        envd.read("shmastra/package.json").await.unwrap().unwrap(),
        b"{}\n",
        "relative to the home"
    );

    let forged = SandboxAccess {
        envd_access_token: Some(SecretString::from("forged")),
        ..access.clone()
    };
    let err = w.envd(&forged).read(path).await.unwrap_err();
    assert!(matches!(err, E2bError::EnvdUnauthorized { .. }), "{err}");
    let (_, end) = run(&w.envd(&forged), &command("true")).await;
    assert!(
        matches!(
            end,
            Err(Interrupted::Broken(E2bError::EnvdUnauthorized { .. }))
        ),
        "{end:?}"
    );
}

#[tokio::test]
async fn rate_limits_are_retried_after_retry_after_and_storms_end_bounded() {
    let w = world();
    w.fake.push_fault(Route::Api, Fault::rate_limited(1));
    let started = std::time::Instant::now();
    let access = w.api.create(&new_sandbox("alice")).await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "Retry-After honoured"
    );
    assert_eq!(w.fake.count("POST", "/sandboxes"), 2);
    assert_eq!(w.fake.sandboxes().len(), 1);

    // A storm of 5xx, HTML and plain text: bounded by the policy, then transient.
    let id = access.sandbox_id.clone();
    for fault in [
        Fault::html_bad_gateway(),
        Fault::text_gateway_timeout(),
        Fault::text_unavailable(),
    ] {
        w.fake.push_fault(Route::Api, fault);
    }
    let before = w.fake.count("GET", "/sandboxes/");
    let err = w.api.get(&id).await.unwrap_err();
    assert!(
        matches!(
            err,
            E2bError::Unavailable {
                status: 503,
                attempts: 3,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.is_transient());
    assert_eq!(w.fake.count("GET", "/sandboxes/") - before, 3);
    // The storm is over: the next call works.
    assert!(w.api.get(&id).await.unwrap().is_some());

    // envd behind the proxy: the same retries for a command that never started.
    let envd = w.envd(&access);
    w.fake.push_fault(Route::Start, Fault::html_bad_gateway());
    w.fake.push_fault(Route::Start, Fault::rate_limited(0));
    let (out, end) = run(&envd, &command("echo ran")).await;
    assert_eq!(end.unwrap().code(), Some(0));
    assert_eq!(out.stdout, b"ran\n");
    assert_eq!(w.fake.count("POST", "/process.Process/Start"), 3);
}

#[tokio::test]
async fn a_request_never_answered_ends_at_the_request_limit() {
    let w = world();
    let access = w.api.create(&new_sandbox("alice")).await.unwrap();
    // Long enough for an answer on a loaded machine, short enough to wait out three times.
    let limit = Duration::from_secs(2);
    let quick = ControlPlane::new(
        Url::parse(&w.fake.api_url()).unwrap(),
        &SecretString::from(fake_e2b::API_KEY),
        limit,
        retry(),
    )
    .unwrap();

    // A read is asked again.
    w.fake.push_fault(Route::Api, Fault::Hang);
    let before = w.fake.count("GET", "/sandboxes/");
    assert!(quick.get(&access.sandbox_id).await.unwrap().is_some());
    assert_eq!(w.fake.count("GET", "/sandboxes/") - before, 2);

    // envd: a file read is asked again; a command's start is not (it may be running), and
    // its stream's first answer does not wait for ever.
    let envd = w.envd_with(
        &access,
        StreamTimeouts {
            request: limit,
            ..timeouts()
        },
    );
    w.fake.push_fault(Route::Files, Fault::Hang);
    assert_eq!(
        envd.read("shmastra/package.json").await.unwrap().unwrap(),
        b"{}\n"
    );
    assert_eq!(w.fake.count("GET", "/files"), 2);
    w.fake.push_fault(Route::Start, Fault::Hang);
    let (_, end) =
        tokio::time::timeout(testkit::wait::PATIENCE, run(&envd, &command("echo never")))
            .await
            .expect("no answer ends the start at the request limit");
    assert!(
        matches!(
            end,
            Err(Interrupted::Broken(E2bError::Timeout { attempts: 1, .. }))
        ),
        "{end:?}"
    );
    assert_eq!(w.fake.count("POST", "/process.Process/Start"), 1);
}

#[tokio::test]
async fn the_concurrency_quota_is_surfaced_once_not_retried() {
    let w = world();
    w.fake.set_concurrency_limit(Some(1));
    w.api.create(&new_sandbox("alice")).await.unwrap();
    let err = w.api.create(&new_sandbox("bob")).await.unwrap_err();
    assert!(matches!(err, E2bError::Quota { .. }), "{err}");
    assert!(err.is_setup() && !err.is_transient());
    assert!(
        err.to_string().contains("maximum number of concurrent"),
        "{err}"
    );
    assert_eq!(w.fake.count("POST", "/sandboxes"), 2, "one call each");
}

#[tokio::test]
async fn a_create_whose_answer_was_lost_finds_its_sandbox_instead_of_making_another() {
    let w = world();
    w.fake.push_fault(Route::Create, Fault::AnswerLost);
    let access = w.api.create(&new_sandbox("alice")).await.unwrap();
    let sandboxes = w.fake.sandboxes();
    assert_eq!(sandboxes.len(), 1, "{sandboxes:?}");
    assert_eq!(sandboxes[0].id, access.sandbox_id);
    assert!(access.envd_access_token.is_some(), "from connect");
    let requests = w.fake.requests();
    assert_eq!(
        w.fake.count("POST", "/sandboxes"),
        2,
        "create, then connect: {requests:#?}"
    );

    // Refused without effect (a 500 before anything was made): looked for, then tried again.
    w.fake.push_fault(Route::Create, Fault::server_error());
    w.api.create(&new_sandbox("bob")).await.unwrap();
    assert_eq!(w.fake.sandboxes().len(), 2);
}

#[tokio::test]
async fn setup_errors_say_what_to_fix() {
    let w = world();
    let wrong = ControlPlane::new(
        Url::parse(&w.fake.api_url()).unwrap(),
        &SecretString::from("e2b_wrong"),
        Duration::from_secs(10),
        retry(),
    )
    .unwrap();
    let err = wrong.create(&new_sandbox("alice")).await.unwrap_err();
    assert!(
        matches!(err, E2bError::Unauthorized { status: 401, .. }),
        "{err}"
    );
    assert_eq!(
        w.fake.count("POST", "/sandboxes"),
        1,
        "a refused key is not sent again"
    );

    let mut missing = new_sandbox("alice");
    missing.template = "nope".into();
    let err = w.api.create(&missing).await.unwrap_err();
    assert!(matches!(err, E2bError::TemplateNotFound { .. }), "{err}");
    assert!(err.to_string().contains("E2B_TEMPLATE"), "{err}");
}
