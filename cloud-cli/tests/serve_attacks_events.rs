//! `shmastra-cloud serve`'s external-push events attacked: push volume that starves other
//! users' syncs, echoes and retried webhook deliveries across replicas, pushes that evict other
//! users' memory, refused commands, deliveries from outside the group; the real binary with
//! real git, the GitLab double and one PostgreSQL.

mod common;

use std::time::{Duration, Instant};

use testkit::fake_gitlab::GROUP_PATH;
use testkit::git::git;
use testkit::wait;

use common::attack::*;
use common::{PATIENCE, work_tree};

/// Every pushed branch was one run of the sync command, in one global queue run one at a
/// time: one user's big push starved everyone's sync. Runs are now coalesced per user, and
/// one user's volume never delays another's: bob's sync runs while alice's first run is held
/// (it waits for a gate the test opens only afterwards), so no clock is needed.
#[test]
fn one_users_push_volume_never_delays_another_users_sync() {
    let up = tempfile::tempdir().expect("tempdir");
    let gate = up.path().join("alice-may-finish");
    let serve = serve_with(
        &["--upstream-dir", up.path().to_str().expect("utf-8")],
        &[],
        &format!(
            "if [ \"$SHMASTRA_USER\" = alice ]; then while [ ! -e '{}' ]; do sleep 0.05; done; fi",
            gate.display()
        ),
    );
    let alice = serve.tmp.path().join("alice");
    work_tree(&alice, &serve.remote_url("alice"));
    let refspecs: Vec<String> = (0..30)
        .map(|n| format!("main:refs/heads/b{n:02}"))
        .collect();
    let mut args = vec!["push", "-q", "origin"];
    args.extend(refspecs.iter().map(String::as_str));
    git(&alice, args);
    let bob = serve.tmp.path().join("bob");
    let bob_head = work_tree(&bob, &serve.remote_url("bob"));
    wait::until_seen(PATIENCE, "alice's first run, held at the gate", || {
        let events = serve.events();
        if events.iter().any(|e| e.starts_with("alice ")) {
            Ok(())
        } else {
            Err(events)
        }
    });
    git(&bob, ["push", "-q", "origin", "main"]);
    wait::until_seen(PATIENCE, "bob's sync while alice's is held", || {
        let events = serve.events();
        if events.contains(&format!("bob refs/heads/main {bob_head}")) {
            Ok(())
        } else {
            Err(events)
        }
    });
    std::fs::write(&gate, "").expect("open the gate");
    // Alice's 30 branches: one run going on, then at most one more, the last with the newest
    // (one run in all when the pushes were queued before a worker claimed the first).
    let finished = |user: &str| {
        serve
            .logs()
            .lines()
            .filter(|l| {
                l.contains("sync command finished") && l.contains(&format!("\"user\":\"{user}\""))
            })
            .count()
    };
    let alice_runs = || -> Vec<String> {
        serve
            .events()
            .into_iter()
            .filter(|e| e.starts_with("alice "))
            .collect()
    };
    wait::until_seen(
        PATIENCE,
        "alice's runs to finish with the newest push",
        || {
            let runs = alice_runs();
            if finished("alice") == runs.len()
                && runs
                    .last()
                    .is_some_and(|r| r.starts_with("alice refs/heads/b29 "))
            {
                Ok(())
            } else {
                Err(runs)
            }
        },
    );
    let runs = alice_runs();
    assert!((1..=2).contains(&runs.len()), "{runs:?}");
}

/// Two replicas behind a load balancer kept their webhook memories apart: a push through one
/// and GitLab's echo of it to the other started a second sync, and a delivery retried to the
/// other replica fired again. With one database both are known to every replica.
#[test]
fn replicas_on_one_database_share_the_echo_and_delivery_memory() {
    let db = testkit::postgres::Postgres::start();
    let setup = GitLabSetup::start();
    setup.project("alice");
    let url = db.url();
    let a = setup.serve(&[("DATABASE_URL", url.as_str())]);
    let b = setup.serve(&[("DATABASE_URL", url.as_str())]);
    // Each replica's sync command records a run as it starts, `user ref oid`.
    let events = || {
        let mut all = a.events();
        all.extend(b.events());
        all
    };
    let finished = || {
        [&a, &b]
            .iter()
            .map(|s| s.logs().matches("sync command finished").count())
            .sum::<usize>()
    };
    let run_of = |oid: &str| format!("alice refs/heads/main {oid}");
    // Waits for the run of `oid` and for every run so far to finish: runs never coalesce
    // across the steps below, so a spurious one shows as a run of its own.
    let ran = |oid: &str| {
        wait::until_seen(PATIENCE, "a run of the push, finished", || {
            let all = events();
            if all.contains(&run_of(oid)) && finished() == all.len() {
                Ok(())
            } else {
                Err(all)
            }
        });
    };
    let work = a.tmp.path().join("alice");
    let head = work_tree(&work, &a.remote_url("alice"));
    let pushed = Instant::now();
    git(&work, ["push", "-q", "origin", "main"]);
    ran(&head);
    // What a spurious run would need to show itself: three times this push's way to its run.
    let window = (3 * pushed.elapsed()).max(Duration::from_secs(1));
    let quiet = |what: &str| {
        let before = events();
        let from = Instant::now();
        while from.elapsed() < window {
            assert_eq!(events(), before, "{what} made a run");
            std::thread::sleep(Duration::from_millis(100));
        }
    };

    let echo = push_payload(&format!("{GROUP_PATH}/alice"), "refs/heads/main", &head);
    assert_eq!(
        post_webhook(&b, &[], echo).1.trim(),
        "seen by the proxy",
        "replica b knows the push replica a proxied"
    );
    quiet("the echo");
    let other = "6".repeat(40);
    let payload = push_payload(&format!("{GROUP_PATH}/alice"), "refs/heads/main", &other);
    let delivery = [("idempotency-key", "7d1f0a9e-3333-4f5e-9b8e-1a2b3c4d5e6f")];
    assert_eq!(
        post_webhook(&a, &delivery, payload.clone()).1.trim(),
        "external push"
    );
    ran(&other);
    assert_eq!(
        post_webhook(&b, &delivery, payload).1.trim(),
        "already handled",
        "a retry of the delivery to replica b"
    );
    quiet("the retried delivery");
    // The sentinel: a new delivery to replica b runs once.
    let sentinel = "7".repeat(40);
    let payload = push_payload(&format!("{GROUP_PATH}/alice"), "refs/heads/main", &sentinel);
    let delivery = [("idempotency-key", "7d1f0a9e-4444-4f5e-9b8e-1a2b3c4d5e6f")];
    assert_eq!(
        post_webhook(&b, &delivery, payload).1.trim(),
        "external push"
    );
    ran(&sentinel);
    // The runs, on whichever replica claimed them: the proxied push, the direct delivery and the
    // sentinel, never the echo or the retry.
    let mut all = events();
    all.sort();
    let mut expected = vec![run_of(&head), run_of(&other), run_of(&sentinel)];
    expected.sort();
    assert_eq!(all, expected);
}

/// The de-duplication memory was one global list of 4096 updates, recorded when the commands
/// were read: a push of thousands of refs (or a failed request naming them) evicted other
/// users' pushes, and GitLab's echo of those then started a spurious sync; a refused update
/// counted as seen. The memory is per user now, and holds only what the server stored.
#[test]
fn the_push_memory_is_per_user_and_holds_only_stored_pushes() {
    let setup = GitLabSetup::start();
    setup.project("alice");
    setup.project("bob");
    let serve = setup.serve(&[]);
    let work = serve.tmp.path().join("alice");
    let head = work_tree(&work, &serve.remote_url("alice"));
    git(&work, ["push", "-q", "origin", "main"]);
    serve.wait_for_events(1);

    // Bob: ref updates with a pack that does not unpack; nothing is stored.
    let fake_oid = "ab".repeat(20);
    let mut body = Vec::new();
    for n in 0..5 {
        let caps = if n == 0 {
            "\0report-status side-band-64k"
        } else {
            ""
        };
        body.extend(pkt(&format!("{ZERO} {fake_oid} refs/heads/b{n}{caps}\n")));
    }
    body.extend_from_slice(b"0000PACK\0\0\0\x02\0\0\0\x01not a pack at all");
    let mut s = serve.connect();
    send_raw(
        &mut s,
        &receive_pack_head("bob", &token("bob", &[]), body.len(), ""),
        &body,
    );
    let response = read_response(&mut s);
    assert!(response.contains("unpack "), "{response}");
    assert!(!response.contains("ok refs/heads/b0"), "{response}");
    // The same update made directly at GitLab is external: the proxy never stored it.
    let (status, answer) = post_webhook(
        &serve,
        &[],
        push_payload(&format!("{GROUP_PATH}/bob"), "refs/heads/b0", &fake_oid),
    );
    assert_eq!((status, answer.trim()), (200, "external push"));

    // Bob: one push of 5000 branches (more than the old global memory of 4096), all stored.
    let bob = serve.tmp.path().join("bob");
    work_tree(&bob, &serve.remote_url("bob"));
    let refspecs: Vec<String> = (0..5000)
        .map(|n| format!("main:refs/heads/many/{n}"))
        .collect();
    let mut args = vec!["push", "-q", "origin"];
    args.extend(refspecs.iter().map(String::as_str));
    git(&bob, args);

    // GitLab's echo of alice's proxied push: still recognised, no second sync for alice.
    let (status, answer) = post_webhook(
        &serve,
        &[],
        push_payload(&format!("{GROUP_PATH}/alice"), "refs/heads/main", &head),
    );
    assert_eq!((status, answer.trim()), (200, "seen by the proxy"));
    let events = serve.wait_for_events(3);
    assert_eq!(
        events[..2],
        [
            format!("alice refs/heads/main {head}"),
            format!("bob refs/heads/b0 {fake_oid}")
        ]
    );
    assert_eq!(
        events.iter().filter(|e| e.starts_with("alice ")).count(),
        1,
        "{events:?}"
    );
}

/// A command the server reported `ng` (the same ref listed twice: one stored, one refused)
/// fired an event, one of them for an object id that was never stored. Only commands reported
/// `ok`, and unambiguous, fire.
#[test]
fn a_command_reported_ng_fires_no_event() {
    let (serve, up_dir) = embedded(&[]);
    let up = up_dir.path();
    let work = serve.tmp.path().join("work");
    let first = work_tree(&work, &serve.remote_url("alice"));
    std::fs::write(work.join("b.txt"), "b\n").expect("write");
    git(&work, ["add", "-A"]);
    git(&work, ["commit", "-qm", "second"]);
    let second = git(&work, ["rev-parse", "HEAD"]).trim().to_owned();
    let body = push_body(
        &work,
        &[
            (ZERO, &first, "refs/heads/main"),
            (ZERO, &second, "refs/heads/main"),
        ],
        &second,
    );
    let mut s = serve.connect();
    send_raw(
        &mut s,
        &receive_pack_head("alice", &token("alice", &[]), body.len(), ""),
        &body,
    );
    let response = read_response(&mut s);
    assert!(response.contains("ng refs/heads/main"), "{response}");
    let stored = git(&up.join("alice.git"), ["rev-parse", "main"])
        .trim()
        .to_owned();
    assert!(stored == first || stored == second);

    // A later push of another branch is the first and only event.
    git(&work, ["push", "-q", "origin", "main:refs/heads/later"]);
    assert_eq!(
        serve.wait_for_events(1),
        [format!("alice refs/heads/later {second}")]
    );
}

/// The webhook took the user from the last path segment of any project, so a project in
/// another namespace could trigger a user's sync, and a replayed delivery fired again.
#[test]
fn the_webhook_accepts_only_the_group_and_fires_once_per_delivery() {
    let setup = GitLabSetup::start();
    let serve = setup.serve(&[]);
    let oid = "4".repeat(40);
    for elsewhere in [
        "attacker/alice",
        "shmastra-users/sub/alice",
        "Shmastra-Users/alice",
        "shmastra-usersx/alice",
    ] {
        let (status, answer) = post_webhook(
            &serve,
            &[],
            push_payload(elsewhere, "refs/heads/main", &oid),
        );
        assert_eq!(status, 200);
        assert_eq!(
            answer.trim(),
            "ignored: project is no user's (not in the group, or not at a path the project path template gives)",
            "{elsewhere}"
        );
    }
    let delivery = [(
        "x-gitlab-event-uuid",
        "0d6c3b1e-7f0a-4f5e-9b8e-1a2b3c4d5e6f",
    )];
    let payload = push_payload(&format!("{GROUP_PATH}/alice"), "refs/heads/main", &oid);
    assert_eq!(
        post_webhook(&serve, &delivery, payload.clone()).1.trim(),
        "external push"
    );
    assert_eq!(
        post_webhook(&serve, &delivery, payload.clone()).1.trim(),
        "already handled"
    );
    let retry = [("idempotency-key", "5c1f0a9e-2222-4f5e-9b8e-1a2b3c4d5e6f")];
    let other = "5".repeat(40);
    let payload = push_payload(&format!("{GROUP_PATH}/alice"), "refs/heads/main", &other);
    assert_eq!(
        post_webhook(&serve, &retry, payload.clone()).1.trim(),
        "external push"
    );
    assert_eq!(
        post_webhook(&serve, &retry, payload).1.trim(),
        "already handled"
    );
    assert_eq!(
        serve.wait_for_events(2),
        [
            format!("alice refs/heads/main {oid}"),
            format!("alice refs/heads/main {other}")
        ]
    );
    // Refusals name the client.
    let (runtime, client) = http();
    let status = runtime.block_on(async {
        client
            .post(serve.url("/api/gitlab/webhook"))
            .header("x-gitlab-token", "wrong")
            .body("{}")
            .send()
            .await
            .expect("answer")
            .status()
            .as_u16()
    });
    assert_eq!(status, 401);
    assert!(
        serve
            .logs()
            .lines()
            .any(|l| l.contains("\"status\":401") && l.contains("\"client\":\"127.0.0.1:"))
    );
}
