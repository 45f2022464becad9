//! `Orchestrator::sync_queued` on two "replicas" (two orchestrators, each with its own handle
//! on one sandbox) over one store, in-process and PostgreSQL: triggers from both during a run
//! give one more run, never two at once, and each caller gets the outcome of the run that
//! covered its trigger, whichever replica ran it; a caller never waits forever for a runner
//! elsewhere, and runs a dead runner's job itself. The sandbox's `project-watcher sync` is a
//! script that records when each run starts and ends, and fails at `install` when `fail`
//! existed as it started.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cloud_core::EmbeddedUpstream;
use cloud_core::ExternalPush;
use cloud_core::LocalSandbox;
use cloud_core::TokenSigner;
use cloud_core::UserId;
use cloud_core::store::Store;
use cloud_core::store::memory::MemoryStore;
use cloud_core::store::postgres::{PostgresStore, pool};
use cloud_core::{
    Orchestrator, Persistence, QueuedSyncError, SandboxLayout, SandboxStatus, SyncFailure,
    SyncOutcome,
};
use testkit::git::{git, hermetic_env, init_repo};
use testkit::postgres::Postgres;
use testkit::statuses::Statuses;

const LEASE: Duration = Duration::from_secs(5);

/// What the script writes into the failure file.
fn install_failure() -> SyncFailure {
    SyncFailure::new("install", "`npm ci` failed (exit status: 1)").with_tail(["npm ERR! ETARGET"])
}

fn orchestrator(upstream: &Path, home: &Path) -> Orchestrator<EmbeddedUpstream> {
    orchestrator_with(upstream, home, |_| {})
}

fn orchestrator_with(
    upstream: &Path,
    home: &Path,
    tune: impl FnOnce(&mut SandboxLayout),
) -> Orchestrator<EmbeddedUpstream> {
    let script = home.join("fake-watcher");
    std::fs::write(
        &script,
        r#"#!/bin/sh
fail=; [ -f "$HOME/fail" ] && fail=1
echo "start $(date +%s%N)" >> "$HOME/runs"
sleep 0.6
echo "end $(date +%s%N)" >> "$HOME/runs"
if [ -n "$fail" ]; then
  while [ $# -gt 0 ]; do [ "$1" = --failure-file ] && ff="$2"; shift; done
  printf 'step: install\nerror: `npm ci` failed (exit status: 1)\nnpm ERR! ETARGET\n' > "$ff"
  exit 1
fi
"#,
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut layout = SandboxLayout::shmastra();
    layout.project_dir = "project".into();
    // No dev server here to answer the template's health check.
    layout.health = None;
    layout.watcher_bin = script.display().to_string();
    tune(&mut layout);
    Orchestrator::new(
        Some(Persistence {
            host: EmbeddedUpstream::with_protection(upstream, true).unwrap(),
            signer: TokenSigner::new(b"0123456789abcdef0123456789abcdef").unwrap(),
            git_url: "http://127.0.0.1:9/api/git".into(),
        }),
        layout,
    )
}

/// The sandbox: its project a repository with one commit (returned).
fn sandbox(home: &Path) -> (LocalSandbox, String) {
    let project = home.join("project");
    init_repo(&project);
    std::fs::write(project.join("a.txt"), "saved\n").unwrap();
    git(&project, ["add", "-A"]);
    git(&project, ["commit", "-qm", "saved"]);
    let head = git(&project, ["rev-parse", "HEAD"]).trim().to_owned();
    let mut sandbox = LocalSandbox::new("sbx-alice", home);
    for (name, value) in hermetic_env(home) {
        if name != "HOME" {
            sandbox = sandbox.with_env(name, value.display().to_string());
        }
    }
    (sandbox, head)
}

fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn push(n: u32) -> ExternalPush {
    ExternalPush {
        user: UserId::parse("alice").unwrap(),
        refname: "refs/heads/main".into(),
        new_oid: format!("{n:040x}"),
    }
}

async fn triggers_from_two_replicas_coalesce(store_a: Arc<dyn Store>, store_b: Arc<dyn Store>) {
    let upstream = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let (a, b) = (
        orchestrator(upstream.path(), home.path()),
        orchestrator(upstream.path(), home.path()),
    );
    let (sandbox, head) = sandbox(home.path());
    let statuses = Statuses::default();
    let first = a.sync_queued(&*store_a, &sandbox, push(1), &statuses, LEASE);
    let others = async {
        // Wait for the first run to start, then trigger from both replicas during it; the
        // run after it fails.
        let runs = home.path().join("runs");
        testkit::wait::until_async(Duration::from_secs(10), "the first run", || {
            let started = std::fs::read_to_string(&runs)
                .unwrap_or_default()
                .contains("start");
            async move { started.then_some(()) }
        })
        .await;
        std::fs::write(home.path().join("fail"), "").unwrap();
        tokio::join!(
            async {
                let outcome = b
                    .sync_queued(&*store_b, &sandbox, push(2), &statuses, LEASE)
                    .await;
                (outcome, now_ns())
            },
            a.sync_queued(&*store_a, &sandbox, push(3), &statuses, LEASE)
        )
    };
    let (first, ((b1, b1_returned), a2)) = tokio::join!(first, others);
    assert_eq!(
        first.unwrap(),
        SyncOutcome::Synced { commit: Some(head) },
        "the first caller's own run"
    );
    let failed = SyncOutcome::Failed {
        failure: install_failure(),
    };
    assert_eq!(
        b1.unwrap(),
        failed,
        "b's trigger, covered by the second run"
    );
    assert_eq!(
        a2.unwrap(),
        failed,
        "a's second trigger, covered by the same run"
    );
    let runs = std::fs::read_to_string(home.path().join("runs")).unwrap();
    let times: Vec<(&str, u128)> = runs
        .lines()
        .map(|l| {
            let (kind, t) = l.split_once(' ').unwrap();
            (kind, t.parse().unwrap())
        })
        .collect();
    assert_eq!(
        times.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
        ["start", "end", "start", "end"],
        "two runs, one after the other: {runs}"
    );
    assert!(times.windows(2).all(|w| w[0].1 <= w[1].1));
    // b learns the outcome from the store: within a poll (200 ms) and a query of the run's end.
    let learned = Duration::from_nanos((b1_returned - times[3].1) as u64);
    eprintln!("b had the outcome of the run that covered its trigger {learned:?} after it ended");
    assert!(learned < Duration::from_secs(2), "{learned:?}");
    assert_eq!(
        statuses.all(),
        [
            SandboxStatus::Syncing {
                since: None,
                step: None
            },
            SandboxStatus::Ready,
            SandboxStatus::Syncing {
                since: None,
                step: None
            },
            SandboxStatus::Broken {
                failure: install_failure()
            }
        ]
    );
}

/// A runner elsewhere that holds the job and never finishes: the caller gives up after two
/// syncs, two commands and a lease. One that died (its lease ran out): the caller runs the job.
async fn a_caller_never_waits_forever_for_a_runner_elsewhere(store: Arc<dyn Store>) {
    let upstream = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let (sandbox, head) = sandbox(home.path());
    let orchestrator = orchestrator_with(upstream.path(), home.path(), |layout| {
        layout.sync_timeout = Duration::from_secs(2);
        layout.command_timeout = Duration::from_millis(500);
    });
    let lease = Duration::from_secs(1);
    let statuses = Statuses::default();

    store.enqueue(push(1)).await.unwrap();
    let held = store
        .claim("elsewhere#1".into(), Duration::from_secs(3600))
        .await
        .unwrap()
        .expect("the job");
    let started = std::time::Instant::now();
    let outcome = orchestrator
        .sync_queued(&*store, &sandbox, push(2), &statuses, lease)
        .await;
    let waited = started.elapsed();
    let deadline = match outcome {
        Err(QueuedSyncError::NotFinished { waited: w, .. }) => w,
        other => panic!("expected NotFinished, got {other:?}"),
    };
    assert_eq!(
        deadline,
        Duration::from_secs(6),
        "two syncs, two commands, a lease"
    );
    // It waited its whole deadline, and gave up well within a second one (a caller that
    // waited again, or forever, fails; a loaded machine's slow polls do not).
    assert!(
        (deadline..2 * deadline).contains(&waited),
        "gave up after {waited:?} with a deadline of {deadline:?}"
    );
    assert!(!home.path().join("runs").exists(), "nothing ran here");

    // The runner dies: it neither renews nor finishes, and its (short) lease runs out.
    assert!(
        store
            .finish(held, SyncOutcome::Synced { commit: None })
            .await
            .unwrap()
    );
    store.enqueue(push(3)).await.unwrap();
    let _dead = store
        .claim("elsewhere#2".into(), Duration::from_secs(2))
        .await
        .unwrap()
        .expect("the job");
    let outcome = orchestrator
        .sync_queued(&*store, &sandbox, push(4), &statuses, lease)
        .await
        .unwrap();
    assert_eq!(outcome, SyncOutcome::Synced { commit: Some(head) });
    let runs = std::fs::read_to_string(home.path().join("runs")).unwrap();
    assert_eq!(runs.lines().count(), 2, "one run, here: {runs}");
}

async fn postgres_replicas() -> (Postgres, Arc<dyn Store>, Arc<dyn Store>) {
    let db = tokio::task::spawn_blocking(Postgres::start).await.unwrap();
    let a: Arc<dyn Store> = PostgresStore::connect(pool(&db.url()).unwrap())
        .await
        .unwrap();
    let b: Arc<dyn Store> = PostgresStore::connect(pool(&db.url()).unwrap())
        .await
        .unwrap();
    (db, a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    triggers_from_two_replicas_coalesce(store.clone(), store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgresql() {
    let (_db, a, b) = postgres_replicas().await;
    triggers_from_two_replicas_coalesce(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_deadline() {
    a_caller_never_waits_forever_for_a_runner_elsewhere(Arc::new(MemoryStore::new())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgresql_deadline() {
    let (_db, a, _) = postgres_replicas().await;
    a_caller_never_waits_forever_for_a_runner_elsewhere(a).await;
}
