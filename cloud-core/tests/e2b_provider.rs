//! `E2bProvider` and `E2bSandbox` against the fake E2B: the `Sandbox` trait over a real
//! sandbox home on this machine, what a pause (the proxy's 502 and 409 included), a kill, an
//! expired snapshot and a broken stream each become, what the quota and an outage cost the
//! lifecycle above it, and one create per user across calls and replicas sharing a store (in
//! memory and in a real PostgreSQL).

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::Duration;

use cloud_core::e2b::{E2bLifecycle, E2bProvider};
use cloud_core::store::Store;
use cloud_core::store::memory::MemoryStore;
use cloud_core::store::postgres::{PostgresStore, pool};
use cloud_core::{
    EmbeddedUpstream, Exec, Lifecycle, Orchestrator, ProvisionStep, RecoveryPolicy, Sandbox,
    SandboxError, SandboxLayout, SandboxProvider, SandboxStatus, UserId,
};
use testkit::fake_e2b::{FakeE2b, Fault, Route, State};

struct World {
    _tmp: tempfile::TempDir,
    fake: FakeE2b,
}

fn world() -> World {
    let tmp = tempfile::tempdir().unwrap();
    let template = tmp.path().join("template");
    std::fs::create_dir_all(template.join("shmastra")).unwrap();
    std::fs::write(template.join("shmastra/package.json"), "{}\n").unwrap();
    let fake = FakeE2b::start(&tmp.path().join("sandboxes"), &[("shmastra", &template)]);
    World { _tmp: tmp, fake }
}

impl World {
    fn provider(&self, store: Arc<dyn Store>) -> E2bProvider {
        self.provider_with(store, E2bLifecycle::default())
    }

    fn provider_with(&self, store: Arc<dyn Store>, lifecycle: E2bLifecycle) -> E2bProvider {
        E2bProvider::new(self.fake.settings("shmastra"), store, lifecycle).unwrap()
    }

    /// How many `POST /sandboxes` (creates) the fake got.
    fn creates(&self) -> usize {
        self.fake
            .requests()
            .iter()
            .filter(|r| r.method == "POST" && r.path == "/sandboxes")
            .count()
    }

    /// The requests since the `before`th, as `(method, path, status)`.
    fn since(&self, before: usize) -> Vec<(String, String, u16)> {
        self.fake.requests()[before..]
            .iter()
            .map(|r| (r.method.clone(), r.path.clone(), r.status))
            .collect()
    }
}

fn alice() -> UserId {
    UserId::parse("alice").unwrap()
}

fn exec(line: &str) -> Exec {
    Exec::new(line, Duration::from_secs(30))
}

#[tokio::test]
async fn a_created_sandbox_runs_commands_and_keeps_files_private() {
    let w = world();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let provider = w.provider(store.clone());
    let err = provider.connect(&alice()).await.unwrap_err();
    assert!(err.is_gone(), "{err}");

    let sandbox = provider.create(&alice()).await.unwrap();
    let view = w.fake.sandbox(sandbox.sandbox_id()).unwrap();
    assert_eq!(sandbox.id(), "alice");
    assert_eq!(
        sandbox.home(),
        view.home,
        "learned from $HOME in the sandbox"
    );
    assert_eq!(view.metadata["shmastraUser"], "alice");
    assert!(view.auto_pause && view.auto_resume, "{view:?}");
    assert_eq!(
        store.sandbox_of(alice()).await.unwrap().as_deref(),
        Some(sandbox.sandbox_id())
    );

    let out = sandbox
        .exec(
            &exec("echo \"$SECRET\"; exit 2")
                .env("SECRET", "s3")
                .cwd(view.home.join("shmastra")),
        )
        .await
        .unwrap();
    assert_eq!((out.exit_code, out.stdout.as_str()), (Some(2), "s3\n"));

    let env = view.home.join(".project-watcher/.env");
    sandbox
        .write_file(&env, b"PROJECT_TOKEN=v1.x\n")
        .await
        .unwrap();
    sandbox
        .write_file(&env, b"PROJECT_TOKEN=v1.y\n")
        .await
        .unwrap();
    assert_eq!(std::fs::read(&env).unwrap(), b"PROJECT_TOKEN=v1.y\n");
    assert_eq!(
        std::fs::metadata(&env).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let leftovers: Vec<_> = std::fs::read_dir(env.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers, [".env"], "no temporary file is left");
    assert_eq!(
        sandbox.read_file(&env).await.unwrap().unwrap(),
        b"PROJECT_TOKEN=v1.y\n"
    );
    assert_eq!(
        sandbox.read_file(&view.home.join("nope")).await.unwrap(),
        None
    );

    // Another provider over the same store (a second replica) finds the same sandbox.
    let again = w.provider(store).connect(&alice()).await.unwrap();
    assert_eq!(again.sandbox_id(), sandbox.sandbox_id());
    assert_eq!(
        w.fake.count("POST", "/sandboxes"),
        1 + 1,
        "one create, one connect"
    );
}

#[tokio::test]
async fn a_paused_sandbox_is_resumed_not_lost() {
    let w = world();
    let provider = w.provider(Arc::new(MemoryStore::new()));
    let sandbox = provider.create(&alice()).await.unwrap();
    let id = sandbox.sandbox_id().to_owned();

    // Paused between calls. Created with autoResume (the default), the proxy resumes it for
    // the call.
    w.fake.pause(&id);
    let before = w.fake.requests().len();
    let out = sandbox.exec(&exec("echo hi")).await.unwrap();
    assert_eq!(out.stdout, "hi\n");
    assert_eq!(w.fake.sandbox(&id).unwrap().state, State::Running);
    let calls = w.since(before);
    assert!(
        calls.iter().all(|(_, _, status)| *status < 300),
        "{calls:?}"
    );

    // Without autoResume: the proxy's 502, confirmed paused with GET, resumed by connect, run.
    let manual = w.provider_with(
        Arc::new(MemoryStore::new()),
        E2bLifecycle {
            auto_resume: false,
            ..E2bLifecycle::default()
        },
    );
    let bob = manual.create(&UserId::parse("bob").unwrap()).await.unwrap();
    let bob_id = bob.sandbox_id().to_owned();
    w.fake.pause(&bob_id);
    // A peek (the sync's step file, read beside its command) neither resumes nor waits: the
    // proxy's 502 is its answer, and the sandbox stays paused for the command to resume.
    let before = w.fake.requests().len();
    let err = bob
        .peek_file(&bob.home().join("shmastra/package.json"))
        .await
        .unwrap_err();
    assert!(!err.is_gone(), "paused is not gone: {err}");
    let calls: Vec<(String, u16)> = w
        .since(before)
        .into_iter()
        .map(|(method, path, status)| {
            (
                format!("{method} {}", path.split('?').next().unwrap()),
                status,
            )
        })
        .collect();
    assert_eq!(calls, [("GET /files".to_owned(), 502)]);
    assert_eq!(w.fake.sandbox(&bob_id).unwrap().state, State::Paused);
    let before = w.fake.requests().len();
    let out = bob.exec(&exec("echo hi")).await.unwrap();
    assert_eq!(out.stdout, "hi\n");
    let calls: Vec<(String, u16)> = w
        .since(before)
        .into_iter()
        .map(|(method, path, status)| (format!("{method} {path}"), status))
        .collect();
    let start = "POST /process.Process/Start".to_owned();
    assert_eq!(
        calls,
        [
            (start.clone(), 502),
            (format!("GET /sandboxes/{bob_id}"), 200),
            (format!("POST /sandboxes/{bob_id}/connect"), 201),
            (start, 200),
        ]
    );

    // Paused in the middle of a command: the stream breaks, the command is frozen, resumed,
    // and followed to its end by pid; it ran once.
    w.fake.push_fault(
        Route::Start,
        Fault::PauseDuringCommand {
            after: Duration::from_millis(300),
        },
    );
    let out = sandbox
        .exec(&exec("echo run >> runs; sleep 1; echo done"))
        .await
        .unwrap();
    assert_eq!(out.stdout, "done\n");
    let runs = std::fs::read_to_string(sandbox.home().join("runs")).unwrap();
    assert_eq!(runs, "run\n");
    assert_eq!(
        sandbox
            .peek_file(&sandbox.home().join("runs"))
            .await
            .unwrap()
            .as_deref(),
        Some(&b"run\n"[..]),
        "a running sandbox's file, peeked"
    );
    assert_eq!(
        sandbox
            .peek_file(&sandbox.home().join("nope"))
            .await
            .unwrap(),
        None
    );

    // Caught while it is being paused or resumed: the proxy's 409, confirmed, tried again.
    w.fake
        .push_fault(Route::Start, Fault::still_transitioning(&id));
    let before = w.fake.requests().len();
    let out = sandbox.exec(&exec("echo again")).await.unwrap();
    assert_eq!(out.stdout, "again\n");
    let statuses: Vec<u16> = w.since(before).iter().map(|(_, _, s)| *s).collect();
    assert_eq!(statuses, [409, 200, 200], "start, get, start");

    // A connect of a paused sandbox resumes it (the page visit after the timeout paused it).
    w.fake.expire(&id);
    assert_eq!(w.fake.sandbox(&id).unwrap().state, State::Paused);
    let connected = provider.connect(&alice()).await.unwrap();
    assert_eq!(connected.sandbox_id(), id);
    assert_eq!(w.fake.sandbox(&id).unwrap().state, State::Running);
    assert_eq!(w.creates(), 2, "alice's and bob's: nothing re-created");
}

#[tokio::test]
async fn a_dropped_stream_is_followed_again_and_a_kill_is_gone() {
    let w = world();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let provider = w.provider(store.clone());
    let sandbox = provider.create(&alice()).await.unwrap();
    let id = sandbox.sandbox_id().to_owned();
    w.fake.push_fault(
        Route::Start,
        Fault::DropStream {
            after: Duration::from_millis(200),
        },
    );
    let out = sandbox
        .exec(&exec("echo a; sleep 1; echo b; exit 5"))
        .await
        .unwrap();
    assert_eq!((out.exit_code, out.stdout.as_str()), (Some(5), "a\nb\n"));

    w.fake.push_fault(
        Route::Start,
        Fault::KillDuringCommand {
            after: Duration::from_millis(200),
        },
    );
    let err = sandbox.exec(&exec("sleep 5")).await.unwrap_err();
    assert!(err.is_gone(), "{err}");
    let err = sandbox
        .read_file(&sandbox.home().join("x"))
        .await
        .unwrap_err();
    assert!(err.is_gone(), "{err}");
    let err = provider.connect(&alice()).await.unwrap_err();
    assert!(err.is_gone(), "{err}");
    assert_eq!(store.sandbox_of(alice()).await.unwrap(), None, "forgotten");
    let fresh = provider.create(&alice()).await.unwrap();
    assert_ne!(fresh.sandbox_id(), id);
    assert!(
        !fresh.home().join("runs").exists() && fresh.home().join("shmastra/package.json").exists(),
        "fresh from the template"
    );
}

#[tokio::test]
async fn an_expired_snapshot_is_gone_and_an_old_envd_is_refused() {
    let w = world();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let provider = w.provider(store.clone());
    let sandbox = provider.create(&alice()).await.unwrap();
    let id = sandbox.sandbox_id().to_owned();
    w.fake.expire(&id);
    w.fake.expire_snapshot(&id);
    let err = provider.connect(&alice()).await.unwrap_err();
    assert!(err.is_gone(), "{err}");
    assert_eq!(store.sandbox_of(alice()).await.unwrap(), None, "forgotten");

    // A template whose envd predates raw uploads: refused with what to do, not retried.
    w.fake.set_envd_version("0.5.6");
    let err = provider.create(&alice()).await.unwrap_err();
    assert!(matches!(err, SandboxError::Refused { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("envd 0.5.6, older than 0.5.7") && text.contains("rebuild the template"),
        "{text}"
    );
    assert_eq!(w.creates(), 2, "one create each");
}

#[tokio::test]
async fn storms_are_bounded_and_surface_as_unavailable_then_pass() {
    let w = world();
    let provider = w.provider(Arc::new(MemoryStore::new()));
    let sandbox = provider.create(&alice()).await.unwrap();
    for _ in 0..3 {
        w.fake
            .push_fault(Route::Start, Fault::text_gateway_timeout());
    }
    let before = w.fake.count("POST", "/process.Process/Start");
    let err = sandbox.exec(&exec("true")).await.unwrap_err();
    assert!(matches!(err, SandboxError::Unavailable { .. }), "{err}");
    assert!(err.is_transient() && !err.is_gone());
    assert_eq!(w.fake.count("POST", "/process.Process/Start") - before, 3);
    assert!(sandbox.exec(&exec("true")).await.unwrap().success());
}

#[tokio::test]
async fn the_quota_is_refused_once() {
    let w = world();
    w.fake.set_concurrency_limit(Some(0));
    let provider = w.provider(Arc::new(MemoryStore::new()));
    let err = provider.create(&alice()).await.unwrap_err();
    assert!(matches!(err, SandboxError::Refused { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("maximum number of concurrent E2B sandboxes"),
        "{err}"
    );
    assert_eq!(w.fake.count("POST", "/sandboxes"), 1);
}

#[tokio::test]
async fn a_sandbox_made_before_the_store_knew_it_is_found_by_its_metadata() {
    let w = world();
    let first = w.provider(Arc::new(MemoryStore::new()));
    let made = first.create(&alice()).await.unwrap();
    // A new store (reset, or a deployment that predates it): the sandbox is found by listing.
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let found = w.provider(store.clone()).connect(&alice()).await.unwrap();
    assert_eq!(found.sandbox_id(), made.sandbox_id());
    assert_eq!(
        store.sandbox_of(alice()).await.unwrap().as_deref(),
        Some(made.sandbox_id())
    );
    assert_eq!(
        w.fake.count("POST", "/sandboxes"),
        2,
        "one create, one connect"
    );
    assert_eq!(w.fake.count("GET", "/v2/sandboxes"), 1);
}

/// The cloud's lifecycle over `provider`, the feature off (the sandbox only has to be there),
/// recovering at once.
fn lifecycle(
    provider: E2bProvider,
) -> (
    Lifecycle<E2bProvider, EmbeddedUpstream>,
    Arc<testkit::statuses::Statuses>,
) {
    let statuses = Arc::new(testkit::statuses::Statuses::only_for("alice"));
    let layout = SandboxLayout {
        start_dev_server: "true".into(),
        stop_dev_server: "true".into(),
        health: None,
        ..SandboxLayout::shmastra()
    };
    let lifecycle = Lifecycle::new(provider, Orchestrator::new(None, layout), statuses.clone())
        .with_policy(RecoveryPolicy {
            wait: Duration::ZERO,
            ..RecoveryPolicy::default()
        });
    (lifecycle, statuses)
}

#[tokio::test]
async fn the_quota_reaches_the_user_once_and_an_outage_is_not_a_loss() {
    let w = world();
    let (lifecycle, statuses) = lifecycle(w.provider(Arc::new(MemoryStore::new())));

    // The team's sandboxes are all running: the create is refused once, and the status says
    // why, at its step.
    w.fake.set_concurrency_limit(Some(0));
    let err = lifecycle.provision(&alice()).await.unwrap_err();
    assert!(!err.is_transient(), "{err}");
    assert_eq!(w.creates(), 1);
    let all = statuses.take();
    let [
        SandboxStatus::Provisioning {
            step: ProvisionStep::Creating,
        },
        SandboxStatus::Broken { failure },
    ] = all.as_slice()
    else {
        panic!("{all:?}");
    };
    assert_eq!(failure.step, "create");
    assert!(
        failure
            .message
            .contains("maximum number of concurrent E2B sandboxes"),
        "{failure:?}"
    );

    // Room again: created. Then an outage of the control plane (every connect a 503): bounded
    // retries, a transient error, nothing re-created and no status changed.
    w.fake.set_concurrency_limit(None);
    lifecycle.provision(&alice()).await.unwrap();
    assert_eq!(w.creates(), 2);
    statuses.take();
    for _ in 0..3 {
        w.fake.push_fault(Route::Api, Fault::text_unavailable());
    }
    let connects = || {
        w.fake
            .requests()
            .iter()
            .filter(|r| r.path.ends_with("/connect"))
            .count()
    };
    let before = connects();
    let err = lifecycle.provision(&alice()).await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert_eq!(connects() - before, 3, "the policy's three attempts");
    assert_eq!(w.creates(), 2, "an outage is not a loss");
    assert_eq!(statuses.take(), []);
    lifecycle.provision(&alice()).await.unwrap();
    assert_eq!(w.creates(), 2);
}

async fn two_replicas_create_once(a: Arc<dyn Store>, b: Arc<dyn Store>) {
    let w = world();
    // Both stores answer already (a pool's first connection takes its time), and a create
    // takes half a second, as booting a VM does: the two asks overlap.
    for store in [&a, &b] {
        assert_eq!(store.sandbox_of(alice()).await.unwrap(), None);
    }
    w.fake.push_fault(
        Route::Create,
        Fault::Slow {
            delay: Duration::from_millis(500),
        },
    );
    let (ra, rb) = (w.provider(a), w.provider(b));
    let user = alice();
    let (x, y) = tokio::join!(ra.create(&user), rb.create(&user));
    let (x, y) = (x.unwrap(), y.unwrap());
    assert_eq!(x.sandbox_id(), y.sandbox_id());
    assert_eq!(w.fake.sandboxes().len(), 1);
    let creates = w
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST" && r.path == "/sandboxes")
        .count();
    assert_eq!(creates, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_asked_twice_at_once_creates_once() {
    let w = world();
    let provider = w.provider(Arc::new(MemoryStore::new()));
    let user = alice();
    let (x, y) = tokio::join!(provider.create(&user), provider.create(&user));
    assert_eq!(x.unwrap().sandbox_id(), y.unwrap().sandbox_id());
    assert_eq!(w.creates(), 1);
    assert_eq!(w.fake.sandboxes().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_create_one_sandbox_in_memory() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    two_replicas_create_once(store.clone(), store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_create_one_sandbox_on_postgresql() {
    let db = tokio::task::spawn_blocking(testkit::postgres::Postgres::start)
        .await
        .unwrap();
    let a = PostgresStore::connect(pool(&db.url()).unwrap())
        .await
        .unwrap();
    let b = PostgresStore::connect(pool(&db.url()).unwrap())
        .await
        .unwrap();
    two_replicas_create_once(a, b).await;
}
