//! `Orchestrator::sync_queued` on two "replicas" (two orchestrators, each with its own handle
//! on one sandbox) over one store, in-process and PostgreSQL: triggers from both during a run
//! give one more run, never two at once. The sandbox's `project-watcher sync` is a script that
//! records when each run starts and ends.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cloud_core::EmbeddedUpstream;
use cloud_core::ExternalPush;
use cloud_core::LocalSandbox;
use cloud_core::TokenSigner;
use cloud_core::Triggered;
use cloud_core::UserId;
use cloud_core::store::Store;
use cloud_core::store::memory::MemoryStore;
use cloud_core::store::postgres::{PostgresStore, pool};
use cloud_core::{Orchestrator, Persistence, SandboxLayout, SandboxStatus, StatusSink};
use testkit::postgres::Postgres;

const LEASE: Duration = Duration::from_secs(5);

#[derive(Default)]
struct Statuses(std::sync::Mutex<Vec<SandboxStatus>>);

impl StatusSink for Statuses {
    fn set_status(&self, _sandbox: &str, status: SandboxStatus) {
        self.0.lock().unwrap().push(status);
    }
}

fn orchestrator(upstream: &Path, home: &Path) -> Orchestrator<EmbeddedUpstream> {
    let script = home.join("fake-watcher");
    std::fs::write(
        &script,
        "#!/bin/sh\necho \"start $(date +%s%N)\" >> \"$HOME/runs\"\nsleep 0.6\necho \"end $(date +%s%N)\" >> \"$HOME/runs\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut layout = SandboxLayout::shmastra();
    layout.project_dir = "project".into();
    layout.watcher_bin = script.display().to_string();
    std::fs::create_dir_all(home.join("project")).unwrap();
    Orchestrator::new(
        Some(Persistence {
            host: EmbeddedUpstream::with_protection(upstream, true).unwrap(),
            signer: TokenSigner::new(b"0123456789abcdef0123456789abcdef").unwrap(),
            git_url: "http://127.0.0.1:9/api/git".into(),
        }),
        layout,
    )
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
    let sandbox = LocalSandbox::new("sbx-alice", home.path());
    let statuses = Statuses::default();
    let first = a.sync_queued(&*store_a, &sandbox, push(1), &statuses, LEASE);
    let others = async {
        // Wait for the first run to start, then trigger from both replicas during it.
        let runs = home.path().join("runs");
        testkit::wait::until_async(Duration::from_secs(10), "the first run", || {
            let started = std::fs::read_to_string(&runs)
                .unwrap_or_default()
                .contains("start");
            async move { started.then_some(()) }
        })
        .await;
        let b1 = b
            .sync_queued(&*store_b, &sandbox, push(2), &statuses, LEASE)
            .await;
        let a2 = a
            .sync_queued(&*store_a, &sandbox, push(3), &statuses, LEASE)
            .await;
        (b1.unwrap(), a2.unwrap())
    };
    let (first, (b1, a2)) = tokio::join!(first, others);
    assert_eq!(first.unwrap(), Triggered::Ran { runs: 2 });
    assert_eq!((b1, a2), (Triggered::Coalesced, Triggered::Coalesced));
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
    assert_eq!(
        statuses.0.lock().unwrap().clone(),
        [
            SandboxStatus::Syncing,
            SandboxStatus::Ready,
            SandboxStatus::Syncing,
            SandboxStatus::Ready
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    triggers_from_two_replicas_coalesce(store.clone(), store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgresql() {
    let db = tokio::task::spawn_blocking(Postgres::start).await.unwrap();
    let a: Arc<dyn Store> = PostgresStore::connect(pool(&db.url()).unwrap())
        .await
        .unwrap();
    let b: Arc<dyn Store> = PostgresStore::connect(pool(&db.url()).unwrap())
        .await
        .unwrap();
    triggers_from_two_replicas_coalesce(a, b).await;
}
