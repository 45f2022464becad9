//! One test suite for both state stores: every case runs against the in-process store and
//! against a real PostgreSQL (started by `testkit::postgres`), each as two "replicas" (the
//! same store twice in-process; two stores on two pools over one database).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use cloud_core::ExternalPush;
use cloud_core::StatusSink;
use cloud_core::UserId;
use cloud_core::store::memory::MemoryStore;
use cloud_core::store::postgres::{PostgresStore, pool};
use cloud_core::store::{
    FinishedRun, REMEMBERED_PUSHES_PER_USER, Store, StoreStatusSink, USED_NONCE_MARGIN,
};
use cloud_core::{ProvisionStep, SandboxStatus, SyncFailure, SyncOutcome};
use testkit::postgres::Postgres;
use testkit::wait::until_async;

struct Replicas {
    a: Arc<dyn Store>,
    b: Arc<dyn Store>,
    _db: Option<Postgres>,
}

fn memory() -> Replicas {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    Replicas {
        a: store.clone(),
        b: store,
        _db: None,
    }
}

async fn postgres() -> Replicas {
    let db = tokio::task::spawn_blocking(Postgres::start)
        .await
        .expect("PostgreSQL starts");
    let a = PostgresStore::connect(pool(&db.url()).expect("a pool"))
        .await
        .expect("replica a connects and migrates");
    let b = PostgresStore::connect(pool(&db.url()).expect("a pool"))
        .await
        .expect("replica b connects (migrations already applied)");
    Replicas {
        a,
        b,
        _db: Some(db),
    }
}

fn user(name: &str) -> UserId {
    UserId::parse(name).expect("valid user id")
}

fn push(name: &str, n: u32) -> ExternalPush {
    ExternalPush {
        user: user(name),
        refname: "refs/heads/main".into(),
        new_oid: format!("{n:040x}"),
    }
}

const LEASE: Duration = Duration::from_secs(30);

fn synced() -> SyncOutcome {
    SyncOutcome::Synced { commit: None }
}

macro_rules! suite {
    ($($case:ident),* $(,)?) => {
        mod in_process {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(super::memory()).await;
                }
            )*
        }
        mod postgresql {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(super::postgres().await).await;
                }
            )*
        }
    };
}

suite!(
    events_during_a_run_give_exactly_one_more_run_with_the_newest_push,
    a_lost_lease_lets_another_replica_run_the_job,
    one_users_volume_never_starves_another,
    concurrent_claimers_never_hold_one_user_twice,
    recent_pushes_are_bounded_per_user,
    a_webhook_delivery_is_handled_once,
    statuses_are_read_and_followed_from_every_replica,
    token_generations_move_forward_per_user,
    a_status_sink_writes_every_change_in_order,
    a_sign_in_nonce_is_spent_once_across_replicas,
    a_users_sandbox_is_created_by_one_claim_and_found_by_every_replica,
    a_dead_creators_lease_passes_the_create_on,
);

async fn a_users_sandbox_is_created_by_one_claim_and_found_by_every_replica(r: Replicas) {
    use cloud_core::store::SandboxClaim;
    assert_eq!(r.a.sandbox_of(user("alice")).await.unwrap(), None);
    // Sixteen claims at once from both replicas: exactly one may create.
    let claims = futures_util::future::join_all((0..16).map(|n| {
        let store = if n % 2 == 0 { r.a.clone() } else { r.b.clone() };
        async move {
            store
                .claim_sandbox(user("alice"), format!("r#{n}"), LEASE)
                .await
                .unwrap()
        }
    }))
    .await;
    let granted: Vec<usize> = claims
        .iter()
        .enumerate()
        .filter(|(_, c)| **c == SandboxClaim::Create)
        .map(|(n, _)| n)
        .collect();
    assert_eq!(granted.len(), 1, "{claims:?}");
    assert!(
        claims
            .iter()
            .all(|c| matches!(c, SandboxClaim::Create | SandboxClaim::Creating))
    );
    let owner = format!("r#{}", granted[0]);
    assert!(
        !r.b.set_sandbox(user("alice"), "r#other".into(), "i-forged".into())
            .await
            .unwrap(),
        "only the claim records"
    );
    assert!(
        r.b.set_sandbox(user("alice"), owner.clone(), "i-1".into())
            .await
            .unwrap()
    );
    assert!(
        !r.a.set_sandbox(user("alice"), owner, "i-2".into())
            .await
            .unwrap(),
        "the claim ended"
    );
    assert_eq!(
        r.a.sandbox_of(user("alice")).await.unwrap().as_deref(),
        Some("i-1")
    );
    assert_eq!(
        r.a.claim_sandbox(user("alice"), "r#late".into(), LEASE)
            .await
            .unwrap(),
        SandboxClaim::Known("i-1".into())
    );
    assert_eq!(
        r.b.user_sandboxes().await.unwrap(),
        vec![(user("alice"), "i-1".to_owned())]
    );

    assert!(
        !r.a.forget_sandbox(user("alice"), "i-0".into())
            .await
            .unwrap(),
        "not the known one"
    );
    assert!(
        r.a.forget_sandbox(user("alice"), "i-1".into())
            .await
            .unwrap()
    );
    assert_eq!(r.b.sandbox_of(user("alice")).await.unwrap(), None);
    assert_eq!(
        r.b.claim_sandbox(user("alice"), "r#next".into(), LEASE)
            .await
            .unwrap(),
        SandboxClaim::Create,
        "a forgotten sandbox is created again"
    );
    assert!(r.b.user_sandboxes().await.unwrap().is_empty());
}

async fn a_dead_creators_lease_passes_the_create_on(r: Replicas) {
    use cloud_core::store::SandboxClaim;
    let short = Duration::from_millis(400);
    let claim = |store: Arc<dyn Store>, owner: &'static str, lease| async move {
        store
            .claim_sandbox(user("bob"), owner.into(), lease)
            .await
            .unwrap()
    };
    assert_eq!(claim(r.a.clone(), "a#1", short).await, SandboxClaim::Create);
    assert_eq!(
        claim(r.b.clone(), "b#1", LEASE).await,
        SandboxClaim::Creating
    );
    assert_eq!(
        claim(r.a.clone(), "a#1", short).await,
        SandboxClaim::Create,
        "renewed by its owner"
    );
    // a dies: its lease runs out and b may create.
    until_async(
        Duration::from_secs(10),
        "b to be granted the create",
        || {
            let b = r.b.clone();
            async move { (claim(b, "b#1", LEASE).await == SandboxClaim::Create).then_some(()) }
        },
    )
    .await;
    assert!(
        !r.a.set_sandbox(user("bob"), "a#1".into(), "i-a".into())
            .await
            .unwrap()
    );
    assert!(
        r.b.set_sandbox(user("bob"), "b#1".into(), "i-b".into())
            .await
            .unwrap()
    );
    assert_eq!(
        r.a.sandbox_of(user("bob")).await.unwrap().as_deref(),
        Some("i-b")
    );
}

async fn events_during_a_run_give_exactly_one_more_run_with_the_newest_push(r: Replicas) {
    assert_eq!(r.a.enqueue(push("alice", 1)).await.unwrap(), 1, "event 1");
    let first =
        r.a.claim("a#1".into(), LEASE)
            .await
            .unwrap()
            .expect("a job");
    assert_eq!(first.push, push("alice", 1));
    assert_eq!(first.seq, 1, "the run covers event 1");
    for n in 2..=5 {
        assert_eq!(r.b.enqueue(push("alice", n)).await.unwrap(), u64::from(n));
    }
    assert_eq!(
        r.b.claim("b#1".into(), LEASE).await.unwrap(),
        None,
        "alice's job is held by a's run"
    );
    assert_eq!(r.b.last_run(user("alice")).await.unwrap(), None);
    let failed = SyncOutcome::Failed {
        failure: SyncFailure::new("install", "`npm ci` failed").with_tail(["npm ERR! 404"]),
    };
    assert!(r.a.finish(first, failed.clone()).await.unwrap());
    assert_eq!(
        r.b.last_run(user("alice")).await.unwrap(),
        Some(FinishedRun {
            seq: 1,
            outcome: failed
        }),
        "a's run, read by b"
    );
    let second =
        r.b.claim("b#2".into(), LEASE)
            .await
            .unwrap()
            .expect("one more run");
    assert_eq!(second.push, push("alice", 5), "the newest push");
    assert_eq!(second.seq, 5, "the second run covers events 2 to 5");
    let reached = SyncOutcome::Synced {
        commit: Some(format!("{:040x}", 5)),
    };
    assert!(r.b.finish(second, reached.clone()).await.unwrap());
    assert_eq!(
        r.a.last_run(user("alice")).await.unwrap(),
        Some(FinishedRun {
            seq: 5,
            outcome: reached
        })
    );
    assert_eq!(
        r.a.claim("a#2".into(), LEASE).await.unwrap(),
        None,
        "exactly one more"
    );
}

async fn a_lost_lease_lets_another_replica_run_the_job(r: Replicas) {
    let short = Duration::from_millis(400);
    r.a.enqueue(push("alice", 1)).await.unwrap();
    let dead =
        r.a.claim("a#1".into(), short)
            .await
            .unwrap()
            .expect("a job");
    assert_eq!(r.b.claim("b#1".into(), LEASE).await.unwrap(), None);
    // Replica a dies here: no renewal, no finish.
    let taken = until_async(Duration::from_secs(10), "b to take the job a owed", || {
        let b = r.b.clone();
        async move { b.claim("b#2".into(), LEASE).await.unwrap() }
    })
    .await;
    assert_eq!(taken.push, push("alice", 1), "the job a owed is run by b");
    assert!(!r.a.renew(dead.clone(), LEASE).await.unwrap(), "a lost it");
    let lost = SyncOutcome::Failed {
        failure: SyncFailure::new("sync", "a's run, finished after its lease"),
    };
    assert!(
        !r.a.finish(dead, lost).await.unwrap(),
        "a's finish changes nothing"
    );
    assert_eq!(
        r.b.last_run(user("alice")).await.unwrap(),
        None,
        "a lost claim records no outcome"
    );
    assert_eq!(
        r.a.claim("a#2".into(), LEASE).await.unwrap(),
        None,
        "b holds it"
    );
    assert!(r.b.renew(taken.clone(), LEASE).await.unwrap());
    assert!(r.b.finish(taken, synced()).await.unwrap());
}

async fn one_users_volume_never_starves_another(r: Replicas) {
    r.a.enqueue(push("alice", 0)).await.unwrap();
    r.b.enqueue(push("bob", 0)).await.unwrap();
    let alice =
        r.a.claim("a#1".into(), LEASE)
            .await
            .unwrap()
            .expect("a job");
    assert_eq!(alice.push.user, user("alice"), "the oldest first");
    assert!(r.a.finish(alice, synced()).await.unwrap());
    for n in 1..200 {
        r.a.enqueue(push("alice", n)).await.unwrap();
    }
    let next =
        r.b.claim("b#1".into(), LEASE)
            .await
            .unwrap()
            .expect("a job");
    assert_eq!(
        next.push.user,
        user("bob"),
        "bob asked before alice's burst"
    );
    let only_alice =
        r.a.claim_user(user("alice"), "a#2".into(), LEASE)
            .await
            .unwrap()
            .expect("alice's job");
    assert_eq!(only_alice.push, push("alice", 199));
    assert_eq!(
        r.a.claim_user(user("bob"), "a#3".into(), LEASE)
            .await
            .unwrap(),
        None,
        "bob's job is held"
    );
}

async fn concurrent_claimers_never_hold_one_user_twice(r: Replicas) {
    let users = ["alice", "bob", "carol"];
    for (n, name) in users.iter().enumerate() {
        r.a.enqueue(push(name, n as u32)).await.unwrap();
    }
    let holding: Arc<Mutex<HashSet<UserId>>> = Arc::default();
    let runs = Arc::new(Mutex::new(0u32));
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..6 {
        let store = if w % 2 == 0 { r.a.clone() } else { r.b.clone() };
        let (holding, runs) = (holding.clone(), runs.clone());
        workers.spawn(async move {
            for i in 0..40 {
                let owner = format!("w{w}#{i}");
                let Some(claim) = store.claim(owner, LEASE).await.unwrap() else {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    continue;
                };
                assert!(
                    holding.lock().unwrap().insert(claim.push.user.clone()),
                    "two runners hold {} at once",
                    claim.push.user
                );
                *runs.lock().unwrap() += 1;
                tokio::time::sleep(Duration::from_millis(3)).await;
                holding.lock().unwrap().remove(&claim.push.user);
                // Another event for this user while it ran: it is owed once more.
                store.enqueue(claim.push.clone()).await.unwrap();
                assert!(store.finish(claim, synced()).await.unwrap());
            }
        });
    }
    while let Some(done) = workers.join_next().await {
        done.expect("no worker saw a double claim");
    }
    let runs = *runs.lock().unwrap();
    assert!(runs >= 20, "the claims reached the assertion {runs} times");
}

async fn recent_pushes_are_bounded_per_user(r: Replicas) {
    r.a.record_push(push("bob", 7)).await.unwrap();
    let total = REMEMBERED_PUSHES_PER_USER as u32 + 10;
    for n in 0..total {
        r.a.record_push(push("alice", n)).await.unwrap();
    }
    assert!(
        !r.b.push_seen(push("alice", 0)).await.unwrap(),
        "oldest forgotten"
    );
    assert!(!r.b.push_seen(push("alice", 9)).await.unwrap());
    assert!(r.b.push_seen(push("alice", 10)).await.unwrap());
    assert!(r.b.push_seen(push("alice", total - 1)).await.unwrap());
    assert!(
        !r.b.push_seen(push("alice", total)).await.unwrap(),
        "never seen"
    );
    assert!(
        r.b.push_seen(push("bob", 7)).await.unwrap(),
        "alice's volume never evicts bob's"
    );
    r.b.record_push(push("alice", 10)).await.unwrap();
    assert!(
        r.a.push_seen(push("alice", 10)).await.unwrap(),
        "recording again refreshes"
    );
}

async fn a_webhook_delivery_is_handled_once(r: Replicas) {
    let ids = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert!(r.a.first_delivery(ids(&["key-1", "uuid-1"])).await.unwrap());
    assert!(
        !r.b.first_delivery(ids(&["key-1"])).await.unwrap(),
        "a retry"
    );
    assert!(
        !r.b.first_delivery(ids(&["key-2", "uuid-1"])).await.unwrap(),
        "another hook of the event"
    );
    assert!(r.a.first_delivery(ids(&["key-3"])).await.unwrap());
}

async fn statuses_are_read_and_followed_from_every_replica(r: Replicas) {
    let mut follow = r.b.status_changes();
    assert_eq!(r.b.status("sb-1".into()).await.unwrap(), None);
    let before = SystemTime::now() - Duration::from_secs(1);
    r.a.set_status(
        "sb-1".into(),
        SandboxStatus::Syncing {
            since: None,
            step: None,
        },
    )
    .await
    .unwrap();
    let broken = SandboxStatus::Broken {
        failure: cloud_core::SyncFailure::new("install", "`npm ci` failed").with_tail(["npm ERR!"]),
    };
    r.a.set_status("sb-1".into(), broken.clone()).await.unwrap();
    r.a.set_status(
        "sb-2".into(),
        SandboxStatus::Provisioning {
            step: ProvisionStep::Restoring,
        },
    )
    .await
    .unwrap();
    let (status, changed_at) = r.b.status("sb-1".into()).await.unwrap().expect("a status");
    assert_eq!(status, broken);
    let syncing = SandboxStatus::Syncing {
        since: Some("2026-12-02T14:00:00Z".into()),
        step: Some("install".into()),
    };
    r.a.set_status("sb-3".into(), syncing.clone())
        .await
        .unwrap();
    assert_eq!(
        r.b.status("sb-3".into()).await.unwrap().map(|(s, _)| s),
        Some(syncing),
        "when a sync began and its step are kept"
    );
    assert!(changed_at >= before && changed_at <= SystemTime::now() + Duration::from_secs(1));
    // A follower hears the newest status of each sandbox, in the order they were made (an
    // intermediate one may be superseded before a poll reads it).
    let provisioning = SandboxStatus::Provisioning {
        step: ProvisionStep::Restoring,
    };
    let mut newest = std::collections::HashMap::new();
    while newest.get("sb-1") != Some(&broken) || newest.get("sb-2") != Some(&provisioning) {
        let change = tokio::time::timeout(Duration::from_secs(5), follow.recv())
            .await
            .expect("the follower hears every change within seconds")
            .expect("not lagging");
        assert!(
            !(change.sandbox == "sb-1" && newest.get("sb-1") == Some(&broken)),
            "nothing about sb-1 after its newest status: {change:?}"
        );
        newest.insert(change.sandbox, change.status);
    }
}

async fn token_generations_move_forward_per_user(r: Replicas) {
    assert_eq!(r.a.token_generation(user("alice")).await.unwrap(), 0);
    assert_eq!(r.a.bump_token_generation(user("alice")).await.unwrap(), 1);
    assert_eq!(r.b.bump_token_generation(user("alice")).await.unwrap(), 2);
    assert_eq!(r.b.token_generation(user("alice")).await.unwrap(), 2);
    assert_eq!(r.b.token_generation(user("bob")).await.unwrap(), 0);
    let all = r.b.token_generations_since(0).await.unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!((all[0].0.clone(), all[0].1), (user("alice"), 2));
    assert!(
        r.a.token_generations_since(all[0].2)
            .await
            .unwrap()
            .is_empty()
    );
}

async fn a_status_sink_writes_every_change_in_order(r: Replicas) {
    let sink = StoreStatusSink::new(r.a.clone());
    sink.set_status(
        "sb-9",
        SandboxStatus::Syncing {
            since: None,
            step: None,
        },
    );
    let needs = SandboxStatus::NeedsSecrets {
        names: vec!["API_KEY".into()],
    };
    sink.set_status("sb-9", needs.clone());
    sink.set_status("sb-8", SandboxStatus::Ready);
    until_async(
        Duration::from_secs(10),
        "the sink's writes on the other replica",
        || {
            let b = r.b.clone();
            let needs = needs.clone();
            async move {
                let nine = b.status("sb-9".into()).await.unwrap().map(|(s, _)| s);
                let eight = b.status("sb-8".into()).await.unwrap().map(|(s, _)| s);
                (nine == Some(needs) && eight == Some(SandboxStatus::Ready)).then_some(())
            }
        },
    )
    .await;
}

async fn a_sign_in_nonce_is_spent_once_across_replicas(r: Replicas) {
    let now = SystemTime::now();
    let later = now + Duration::from_secs(900);
    assert!(r.a.spend_link_nonce("n1".into(), later).await.unwrap());
    assert!(
        !r.b.spend_link_nonce("n1".into(), later).await.unwrap(),
        "spent on a"
    );
    assert!(!r.a.spend_link_nonce("n1".into(), later).await.unwrap());
    assert!(r.b.spend_link_nonce("n2".into(), later).await.unwrap());
    // A link that expired longer than the margin ago is forgotten (it is refused as expired
    // before its nonce is asked for); one within the margin is kept.
    let long_ago = now - USED_NONCE_MARGIN - Duration::from_secs(60);
    let lately = now - Duration::from_secs(60);
    assert!(r.a.spend_link_nonce("old".into(), long_ago).await.unwrap());
    assert!(r.a.spend_link_nonce("recent".into(), lately).await.unwrap());
    assert!(r.b.spend_link_nonce("n3".into(), later).await.unwrap());
    assert!(
        r.b.spend_link_nonce("old".into(), long_ago).await.unwrap(),
        "forgotten"
    );
    assert!(
        !r.b.spend_link_nonce("recent".into(), lately).await.unwrap(),
        "kept until the margin passed"
    );
    assert!(!r.a.spend_link_nonce("n2".into(), later).await.unwrap());
}
