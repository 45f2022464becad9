//! `Lifecycle` on tokio's paused clock with testkit's in-memory provider, whose sandbox can be
//! lost at any moment: the wait before a recovery, the recovery budget, which failures are
//! recovered, the watcher stopped around an update, concurrent reprovisions and losses. The
//! real watcher, git and `LocalProvider` are exercised by `tests/tests/lifecycle.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use cloud_core::{
    EmbeddedUpstream, Exec, Lifecycle, OrchestrateError, Orchestrator, Persistence, ProvisionStep,
    Provisioned, RecoveryPolicy, Reprovisioned, Sandbox, SandboxError, SandboxLayout,
    SandboxStatus, SyncFailure, TokenSigner, UserId,
};
use testkit::sandbox::{FakeProvider, FakeSandbox, FakeWorld};
use testkit::statuses::Statuses;
use tokio::time::Instant;

fn alice() -> UserId {
    UserId::parse("alice").unwrap()
}

/// The feature off (no persistence): re-provisioning is create, then start the dev server.
fn lifecycle(
    world: &Arc<FakeWorld>,
    policy: RecoveryPolicy,
) -> (Lifecycle<FakeProvider, EmbeddedUpstream>, Arc<Statuses>) {
    let statuses = Arc::new(Statuses::only_for("alice"));
    let orchestrator = Orchestrator::new(None, SandboxLayout::shmastra());
    let lifecycle = Lifecycle::new(
        FakeProvider(Arc::clone(world)),
        orchestrator,
        statuses.clone(),
    )
    .with_policy(policy);
    (lifecycle, statuses)
}

/// An operation that runs one command named `op`, after losing the sandbox when `lose`
/// says so for this call (counted from 1).
async fn op(
    world: &FakeWorld,
    calls: &AtomicU32,
    lose: impl Fn(u32) -> bool,
    sandbox: FakeSandbox,
) -> Result<(), OrchestrateError> {
    let call = calls.fetch_add(1, Ordering::SeqCst) + 1;
    if lose(call) {
        world.lose();
    }
    sandbox
        .exec(&Exec::new("op", Duration::from_secs(1)))
        .await?;
    Ok(())
}

fn started() -> Vec<SandboxStatus> {
    vec![
        SandboxStatus::Provisioning {
            step: ProvisionStep::Creating,
        },
        SandboxStatus::Provisioning {
            step: ProvisionStep::Restoring,
        },
        SandboxStatus::Provisioning {
            step: ProvisionStep::Starting,
        },
        // Ready only once the dev server answers its health check.
        SandboxStatus::Starting {
            url: "http://localhost:4111/health".into(),
        },
        SandboxStatus::Ready,
    ]
}

/// A sandbox lost during the operation's first call: `create` runs exactly `wait` after
/// the loss, and the operation runs once more, on the new sandbox.
async fn check_wait(policy: RecoveryPolicy, expected_wait: Duration) {
    let world = FakeWorld::new(false);
    let (lifecycle, statuses) = lifecycle(&world, policy);
    lifecycle.reprovision(&alice(), Vec::new()).await.unwrap();
    statuses.take();
    tokio::time::advance(Duration::from_secs(10)).await;
    let calls = AtomicU32::new(0);

    lifecycle
        .run(&alice(), |sandbox| op(&world, &calls, |n| n == 1, sandbox))
        .await
        .unwrap();

    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let lost_at = world.times_of("exec op")[0];
    let creates = world.times_of("create");
    assert_eq!(creates.len(), 2, "the first reprovision and the recovery");
    assert_eq!(creates[1] - lost_at, expected_wait);
    assert_eq!(world.times_of("exec op")[1], creates[1]);
    assert_eq!(statuses.all(), started());
}

#[tokio::test(start_paused = true)]
async fn a_lost_sandbox_waits_1_5_s_then_is_reprovisioned_and_the_operation_retried() {
    check_wait(RecoveryPolicy::default(), Duration::from_millis(1500)).await;
}

#[tokio::test(start_paused = true)]
async fn the_wait_is_configurable() {
    let policy = RecoveryPolicy {
        wait: Duration::from_millis(250),
        ..RecoveryPolicy::default()
    };
    check_wait(policy, Duration::from_millis(250)).await;
}

#[tokio::test(start_paused = true)]
async fn losing_the_sandbox_on_every_call_makes_three_recoveries_then_a_hard_error() {
    let world = FakeWorld::new(false);
    let (lifecycle, statuses) = lifecycle(&world, RecoveryPolicy::default());
    let calls = AtomicU32::new(0);
    let start = Instant::now();

    let mut results = Vec::new();
    for _ in 0..6 {
        results.push(
            lifecycle
                .run(&alice(), |sandbox| op(&world, &calls, |_| true, sandbox))
                .await,
        );
    }

    let shown: Vec<String> = results
        .iter()
        .map(|r| r.as_ref().unwrap_err().to_string())
        .collect();
    for (i, shown) in shown.iter().enumerate() {
        if i < 3 {
            assert_eq!(shown, "sandbox alice is gone", "call {i}");
        } else {
            assert_eq!(
                shown,
                "the sandbox of user alice was lost and re-created 3 times within 15m; recovery stopped, it needs attention",
                "call {i}"
            );
        }
    }
    assert_eq!(world.count("create"), 3, "one sandbox per recovery");
    let mut first = started();
    first.push(SandboxStatus::Broken {
        failure: SyncFailure::new("retry after recovery", "sandbox alice is gone"),
    });
    assert_eq!(statuses.all()[..first.len()], first);
    // Each of the first three found the sandbox gone, recovered, and lost it again on its
    // one retry (no second recovery within one operation); the rest stopped at once.
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(world.count("connect"), 6 + 3);
    assert_eq!(start.elapsed(), Duration::from_millis(3 * 1500));
    assert_eq!(
        statuses.last().as_ref(),
        Some(&SandboxStatus::NeedsAttention {
            reason: shown[3].clone()
        })
    );
}

#[tokio::test(start_paused = true)]
async fn a_provider_whose_new_sandboxes_vanish_at_once_gets_three_creates() {
    let world = FakeWorld::new(true);
    let (lifecycle, _) = lifecycle(&world, RecoveryPolicy::default());
    let calls = AtomicU32::new(0);

    for _ in 0..5 {
        lifecycle
            .run(&alice(), |sandbox| op(&world, &calls, |_| false, sandbox))
            .await
            .unwrap_err();
    }
    let last = lifecycle
        .run(&alice(), |sandbox| op(&world, &calls, |_| false, sandbox))
        .await
        .unwrap_err();

    assert!(
        matches!(last, OrchestrateError::NeedsAttention { count: 3, .. }),
        "{last}"
    );
    assert_eq!(world.count("create"), 3);
    assert_eq!(calls.load(Ordering::SeqCst), 0, "never a sandbox to run on");
}

#[tokio::test(start_paused = true)]
async fn recoveries_are_allowed_again_once_the_window_has_passed() {
    let world = FakeWorld::new(false);
    let (lifecycle, _) = lifecycle(&world, RecoveryPolicy::default());
    let calls = AtomicU32::new(0);
    for _ in 0..3 {
        lifecycle
            .run(&alice(), |sandbox| op(&world, &calls, |_| true, sandbox))
            .await
            .unwrap_err();
    }
    let stopped = lifecycle
        .run(&alice(), |sandbox| op(&world, &calls, |_| true, sandbox))
        .await
        .unwrap_err();
    assert!(matches!(stopped, OrchestrateError::NeedsAttention { .. }));

    tokio::time::advance(Duration::from_secs(15 * 60)).await;
    lifecycle
        .run(&alice(), |sandbox| op(&world, &calls, |_| false, sandbox))
        .await
        .unwrap();
    assert_eq!(world.count("create"), 4);
}

#[tokio::test(start_paused = true)]
async fn failures_other_than_gone_are_not_recovered() {
    let world = FakeWorld::new(false);
    let (lifecycle, _) = lifecycle(&world, RecoveryPolicy::default());
    lifecycle.reprovision(&alice(), Vec::new()).await.unwrap();
    let failures = [
        OrchestrateError::Command {
            sandbox: "alice".into(),
            step: "install",
            exit: "exit code 1".into(),
            tail: String::new(),
        },
        OrchestrateError::Sandbox(SandboxError::Timeout {
            sandbox: "alice".into(),
            command: "npm ci".into(),
            timeout: Duration::from_secs(1),
        }),
    ];
    for failure in failures {
        let shown = failure.to_string();
        let mut failure = Some(failure);
        let err = lifecycle
            .run(&alice(), |_| {
                let failure = failure.take();
                async move { Err::<(), _>(failure.expect("called once")) }
            })
            .await
            .unwrap_err();
        assert_eq!(err.to_string(), shown);
    }
    assert_eq!(world.count("create"), 1);
}

#[tokio::test(start_paused = true)]
async fn an_update_whose_sandbox_is_lost_runs_again_with_the_watcher_stopped_around_it() {
    let world = FakeWorld::new(false);
    world.state().alive = Some(0);
    let upstream = tempfile::tempdir().unwrap();
    let orchestrator = Orchestrator::new(
        Some(Persistence {
            host: EmbeddedUpstream::new(upstream.path()).unwrap(),
            signer: TokenSigner::new(&[1u8; 32]).unwrap(),
            git_url: "http://127.0.0.1:1/api/git".into(),
        }),
        SandboxLayout::shmastra(),
    );
    let lifecycle = Lifecycle::new(
        FakeProvider(Arc::clone(&world)),
        orchestrator,
        Arc::new(Statuses::only_for("alice")),
    );
    let calls = AtomicU32::new(0);

    let updated = lifecycle
        .with_watcher_stopped(&alice(), |sandbox| {
            let (world, calls) = (&world, &calls);
            async move {
                let call = calls.fetch_add(1, Ordering::SeqCst) + 1;
                world.record(format!("update {call} in sandbox {}", sandbox.generation));
                if call == 1 {
                    world.lose();
                }
                Ok::<_, String>(call)
            }
        })
        .await
        .unwrap();

    assert_eq!(updated, Ok(2));
    let steps: Vec<String> = world
        .log()
        .into_iter()
        .filter(|what| {
            what.starts_with("update")
                || what.contains("project-watcher")
                || what.contains(" restore ")
        })
        .collect();
    assert_eq!(
        steps,
        [
            "exec pm2 stop project-watcher",
            "update 1 in sandbox 0",
            "exec pm2 start \"$HOME/ecosystem.config.js\" --only project-watcher",
            // Re-provisioning: stop a running watcher, restore, start the watcher.
            "exec pm2 pid project-watcher | grep -q '^[1-9]'",
            "exec pm2 stop project-watcher",
            "exec project-watcher restore --dir /sandboxes/alice/shmastra --remote project --branch main",
            "exec pm2 start \"$HOME/ecosystem.config.js\" --only project-watcher",
            "exec pm2 stop project-watcher",
            "update 2 in sandbox 1",
            "exec pm2 start \"$HOME/ecosystem.config.js\" --only project-watcher",
        ]
    );
    assert_eq!(world.count("create"), 1);
}

#[tokio::test(start_paused = true)]
async fn two_reprovisions_at_once_make_one_sandbox() {
    let world = FakeWorld::creating_in(Duration::from_secs(5));
    let (lifecycle, statuses) = lifecycle(&world, RecoveryPolicy::default());

    let user = alice();
    let (a, b) = tokio::join!(
        lifecycle.reprovision(&user, Vec::new()),
        lifecycle.reprovision(&user, Vec::new())
    );

    let mut outcomes = [a.unwrap(), b.unwrap()];
    outcomes.sort_by_key(|o| matches!(o, Reprovisioned::Present(_)));
    assert_eq!(
        outcomes,
        [
            Reprovisioned::Created,
            Reprovisioned::Present(Provisioned::default())
        ]
    );
    assert_eq!(world.count("create"), 1);
    assert_eq!(
        world.count("exec pm2 start"),
        1,
        "the dev server started once"
    );
    assert_eq!(statuses.all(), started());
    assert_eq!(
        lifecycle.reprovision(&alice(), Vec::new()).await.unwrap(),
        Reprovisioned::Present(Provisioned::default())
    );
    assert_eq!(world.count("create"), 1);
}

#[tokio::test(start_paused = true)]
async fn operations_that_lose_the_same_sandbox_together_recover_it_once() {
    let world = FakeWorld::new(false);
    let (lifecycle, _) = lifecycle(&world, RecoveryPolicy::default());
    lifecycle.reprovision(&alice(), Vec::new()).await.unwrap();
    let calls = AtomicU32::new(0);
    // Both operations are inside their sandbox when it goes.
    let slow_op = |sandbox: FakeSandbox| {
        let (world, calls) = (&world, &calls);
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_secs(1)).await;
            sandbox
                .exec(&Exec::new("op", Duration::from_secs(1)))
                .await?;
            Ok::<_, OrchestrateError>(world.state().alive)
        }
    };

    let user = alice();
    let (a, b, ()) = tokio::join!(
        lifecycle.run(&user, slow_op),
        lifecycle.run(&user, slow_op),
        async {
            tokio::time::sleep(Duration::from_millis(500)).await;
            world.lose();
        }
    );

    assert_eq!(a.unwrap(), Some(2));
    assert_eq!(b.unwrap(), Some(2));
    assert_eq!(
        world.count("create"),
        2,
        "the first reprovision and one recovery"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    assert_eq!(
        world.times_of("create")[1],
        Duration::from_millis(1000 + 1500),
        "one wait, from the moment both lost it"
    );
    for _ in 0..2 {
        let recovered = lifecycle
            .run(&alice(), |sandbox| op(&world, &calls, |_| true, sandbox))
            .await
            .unwrap_err();
        assert!(recovered.is_gone(), "{recovered}");
    }
    let stopped = lifecycle
        .run(&alice(), |sandbox| op(&world, &calls, |_| true, sandbox))
        .await
        .unwrap_err();
    assert!(
        matches!(stopped, OrchestrateError::NeedsAttention { count: 3, .. }),
        "the shared loss counted once: {stopped}"
    );
}
