//! Three `shmastra-cloud serve` replicas (the real binary) over one real PostgreSQL and one
//! embedded upstream: real git pushes spread across them, a kill -9 of the replica running a
//! sync, a database restart in the middle. The sync command records each run's start (with the
//! upstream's `main` it saw) and end, with timestamps, into one file; the assertions read it.

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use testkit::git::{git, init_repo};
use testkit::postgres::Postgres;
use testkit::wait;

use common::{PATIENCE, Serve};

const SECRET: &str = "replicas-test-secret-0123456789abcdef";

/// Longer than one try of a replica's job claim with the database down: the store's 3 s pool
/// wait and the jobs' 0.5 s poll.
const CLAIM_CYCLE: Duration = Duration::from_secs(4);

/// One run of the sync command, from the shared record.
#[derive(Debug, Clone)]
struct Run {
    user: String,
    /// The upstream's `main` when the run started.
    saw: String,
    /// The replica (serve's pid) that ran it.
    replica: u32,
    start: u128,
    /// `None` while running; `Some((time, true))` when its replica died under it.
    end: Option<(u128, bool)>,
}

/// The sync command: records `start USER SAW_HEAD SERVE_PID TIME SHELL_PID`, works for
/// `RUN_SECONDS` (abandoning the run if its serve dies), then records `end TIME SHELL_PID`.
fn sync_script(runs: &Path, upstream: &Path) -> String {
    format!(
        r#"runs='{runs}'; head=$(git --git-dir='{up}'/"$SHMASTRA_USER".git rev-parse -q --verify refs/heads/main || echo none)
echo "start $SHMASTRA_USER $head $PPID $(date +%s%N) $$" >> "$runs"
steps=$(cat '{up}'/run-steps 2>/dev/null || echo 15); i=0
while [ $i -lt $steps ]; do
  sleep 0.1
  if ! kill -0 $PPID 2>/dev/null; then echo "abandoned $(date +%s%N) $$" >> "$runs"; exit 1; fi
  i=$((i+1))
done
echo "end $(date +%s%N) $$" >> "$runs""#,
        runs = runs.display(),
        up = upstream.display(),
    )
}

fn read_runs(path: &Path) -> Vec<Run> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut runs: Vec<Run> = Vec::new();
    let mut by_shell: HashMap<String, usize> = HashMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        match f.as_slice() {
            ["start", user, saw, replica, time, shell] => {
                by_shell.insert(shell.to_string(), runs.len());
                runs.push(Run {
                    user: user.to_string(),
                    saw: saw.to_string(),
                    replica: replica.parse().expect("pid"),
                    start: time.parse().expect("time"),
                    end: None,
                });
            }
            [kind @ ("end" | "abandoned"), time, shell] => {
                let i = by_shell[*shell];
                runs[i].end = Some((time.parse().expect("time"), *kind == "abandoned"));
            }
            _ => panic!("unreadable run record: {line:?}"),
        }
    }
    runs
}

fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos()
}

struct Cluster {
    db: Postgres,
    up: tempfile::TempDir,
    runs: PathBuf,
    replicas: Vec<Serve>,
    work: tempfile::TempDir,
}

impl Cluster {
    fn replica(&self) -> Serve {
        let script = sync_script(&self.runs, self.up.path());
        Serve::start(
            SECRET,
            &[
                "--upstream-dir",
                self.up.path().to_str().expect("utf-8"),
                "--sync-lease",
                "1500ms",
            ],
            &[("DATABASE_URL", &self.db.url())],
            &script,
        )
    }

    fn runs(&self) -> Vec<Run> {
        read_runs(&self.runs)
    }

    fn runs_of(&self, user: &str) -> Vec<Run> {
        self.runs().into_iter().filter(|r| r.user == user).collect()
    }

    /// A work tree for `user` with one commit, its `origin` through replica `via`.
    fn work_tree(&self, user: &str, via: usize) -> PathBuf {
        let dir = self.work.path().join(user);
        init_repo(&dir);
        std::fs::write(dir.join("a.txt"), "init\n").expect("write");
        git(&dir, ["add", "-A"]);
        git(&dir, ["commit", "-qm", "first"]);
        git(
            &dir,
            [
                "remote",
                "add",
                "origin",
                &self.replicas[via].remote_url(user),
            ],
        );
        dir
    }

    /// Commits a change in `dir` and pushes it through replica `via`; returns the commit.
    fn push(&self, dir: &Path, user: &str, via: usize, n: u32) -> String {
        std::fs::write(dir.join("a.txt"), format!("{n}\n")).expect("write");
        git(dir, ["commit", "-qam", &format!("change {n}")]);
        let url = self.replicas[via].remote_url(user);
        git(dir, ["push", "-q", &url, "HEAD:main"]);
        git(dir, ["rev-parse", "HEAD"]).trim().to_owned()
    }

    /// Waits until no run is going on and none starts for a while (every owed run ran).
    fn settle(&self) {
        let mut quiet_since = None;
        wait::until_seen(PATIENCE, "the runs to settle", || {
            let runs = self.runs();
            let count = runs.len();
            let running = runs.iter().filter(|r| r.end.is_none()).count();
            match quiet_since {
                Some((n, at)) if n == count && running == 0 => {
                    if std::time::Instant::now().duration_since(at) > Duration::from_secs(3) {
                        return Ok(());
                    }
                }
                _ => quiet_since = Some((count, std::time::Instant::now())),
            }
            Err(runs)
        });
    }

    /// The body of `/healthz` on one replica.
    fn healthz(&self, replica: usize) -> String {
        let mut stream = self.replicas[replica].connect();
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .expect("send");
        let mut response = String::new();
        stream.read_to_string(&mut response).expect("read");
        response
            .split_once("\r\n\r\n")
            .map(|(_, body)| body.to_owned())
            .unwrap_or(response)
    }
}

fn is_ancestor(repo: &Path, ancestor: &str, of: &str) -> bool {
    of != "none"
        && testkit::git::git_output(repo, ["merge-base", "--is-ancestor", ancestor, of])
            .status
            .success()
}

#[test]
fn replicas_share_one_queue_through_crashes_and_a_database_restart() {
    let db = Postgres::start();
    let up = tempfile::tempdir().expect("tempdir");
    let work = tempfile::tempdir().expect("tempdir");
    let runs = work.path().join("runs");
    let mut cluster = Cluster {
        db,
        up,
        runs,
        replicas: Vec::new(),
        work,
    };
    for _ in 0..3 {
        let replica = cluster.replica();
        cluster.replicas.push(replica);
    }
    let mut pushed: Vec<(String, String)> = Vec::new();

    // Pushes of three users spread across the replicas, each user's through several.
    let users = ["alice", "bob", "carol"];
    let trees: Vec<PathBuf> = users
        .iter()
        .enumerate()
        .map(|(i, u)| cluster.work_tree(u, i % 3))
        .collect();
    for round in 0..3u32 {
        if round == 1 {
            // The next pushes arrive while each user's first run goes on.
            wait::until(PATIENCE, "every user's first run to start", || {
                users
                    .iter()
                    .all(|u| !cluster.runs_of(u).is_empty())
                    .then_some(())
            });
        }
        for (i, user) in users.iter().enumerate() {
            let via = (i + round as usize) % 3;
            let oid = cluster.push(&trees[i], user, via, round);
            pushed.push((user.to_string(), oid));
        }
    }

    // A burst: eight pushes of dave's at once through all three replicas.
    let dave = cluster.work_tree("dave", 0);
    let dave_head = cluster.push(&dave, "dave", 0, 0);
    pushed.push(("dave".into(), dave_head));
    cluster.settle();
    let dave_before = cluster.runs_of("dave").len();
    std::thread::scope(|s| {
        for k in 0..8 {
            let (cluster, dave) = (&cluster, &dave);
            s.spawn(move || {
                let url = cluster.replicas[k % 3].remote_url("dave");
                git(
                    dave,
                    ["push", "-q", &url, &format!("HEAD:refs/heads/burst-{k}")],
                );
            });
        }
    });

    // The watcher's own push (its User-Agent tag): no run for it.
    let erin = cluster.work_tree("erin", 1);
    std::fs::write(erin.join("a.txt"), "watcher\n").expect("write");
    git(&erin, ["commit", "-qam", "autosave"]);
    let url = cluster.replicas[1].remote_url("erin");
    git(
        &erin,
        [
            "-c",
            "http.userAgent=git/2 project-watcher/0.1.0",
            "push",
            "-q",
            &url,
            "HEAD:main",
        ],
    );
    cluster.settle();
    let dave_burst = cluster.runs_of("dave").len() - dave_before;
    assert!(
        (1..=2).contains(&dave_burst),
        "a burst of 8 pushes gives one or two runs, not {dave_burst}"
    );
    // The sentinel: a push of erin's from an ordinary client, through the same replica, must
    // make exactly one run, and that run must be all erin has had.
    let sentinel_at = now_ns();
    let erin_head = cluster.push(&erin, "erin", 1, 1);
    pushed.push(("erin".into(), erin_head.clone()));
    wait::until_seen(PATIENCE, "the run of erin's ordinary push", || {
        let runs = cluster.runs_of("erin");
        runs.iter()
            .any(|r| r.end.is_some())
            .then_some(())
            .ok_or(runs)
    });
    cluster.settle();
    let erin_runs = cluster.runs_of("erin");
    assert!(
        erin_runs.len() == 1 && erin_runs[0].start > sentinel_at && erin_runs[0].saw == erin_head,
        "no run for the watcher's own push, one for the ordinary push after it: {erin_runs:?}"
    );

    // kill -9 of the replica running frank's (long) sync: another replica runs it.
    std::fs::write(cluster.up.path().join("run-steps"), "40").expect("write");
    let frank = cluster.work_tree("frank", 2);
    let frank_head = cluster.push(&frank, "frank", 2, 1);
    pushed.push(("frank".into(), frank_head.clone()));
    let victim = wait::until(PATIENCE, "frank's run to start", || {
        cluster.runs_of("frank").first().map(|r| r.replica)
    });
    let killed_at = now_ns();
    let index = cluster
        .replicas
        .iter()
        .position(|r| r.pid() == victim)
        .expect("the runner is one of the replicas");
    let status = Command::new("kill")
        .args(["-KILL", &victim.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let mut dead = cluster.replicas.remove(index);
    dead.child.wait().expect("reap the killed replica");
    std::fs::write(cluster.up.path().join("run-steps"), "15").expect("write");
    let rerun = wait::until_seen(PATIENCE, "another replica to run frank's job", || {
        let runs = cluster.runs_of("frank");
        runs.iter()
            .find(|r| r.replica != victim && r.end.is_some_and(|(_, abandoned)| !abandoned))
            .cloned()
            .ok_or(runs)
    });
    assert!(rerun.start > killed_at, "{rerun:?}");
    assert_eq!(rerun.saw, frank_head, "the rerun saw frank's push");
    cluster.settle();

    // The database goes down: git keeps working, events wait in memory, /healthz says so.
    cluster.db.stop();
    let gina = cluster.work_tree("gina", 0);
    let gina_head = cluster.push(&gina, "gina", 0, 1);
    pushed.push(("gina".into(), gina_head.clone()));
    wait::until_seen(
        PATIENCE,
        "/healthz to report the database and gina's request",
        || {
            let health = cluster.healthz(0);
            if health.starts_with("degraded: database")
                && health.contains("1 sync request(s) buffered")
            {
                Ok(())
            } else {
                Err(health)
            }
        },
    );
    // The outage lasts a whole claim cycle of every replica (each waits up to the pool's 3 s for
    // a connection, then polls again after 0.5 s), so a replica that ran a job without the
    // database has had its chance before the sentinel below.
    let outage_from = std::time::Instant::now();
    while outage_from.elapsed() < CLAIM_CYCLE {
        let health = cluster.healthz(0);
        assert!(health.starts_with("degraded: database"), "{health}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let database_back_at = now_ns();
    cluster.db.start_server();
    let gina_run = wait::until_seen(PATIENCE, "gina's run once the database is back", || {
        let runs = cluster.runs_of("gina");
        runs.iter().find(|r| r.end.is_some()).cloned().ok_or(runs)
    });
    assert_eq!(gina_run.saw, gina_head);
    wait::until_seen(PATIENCE, "/healthz to be ok again", || {
        let health = cluster.healthz(0);
        if health == "ok\n" {
            Ok(())
        } else {
            Err(health)
        }
    });
    cluster.settle();
    // The database's return is the sentinel: it made gina's one run, and none ran before it.
    let gina_runs = cluster.runs_of("gina");
    assert!(
        gina_runs.len() == 1 && gina_runs[0].start > database_back_at,
        "no run without the database, one once it is back: {gina_runs:?}"
    );

    // Across everything: runs of one user never overlap, every run ended (or its replica
    // died under it), and every push was followed by a completed run that saw it.
    let all = cluster.runs();
    let mut by_user: HashMap<&str, Vec<&Run>> = HashMap::new();
    for run in &all {
        by_user.entry(&run.user).or_default().push(run);
    }
    let mut compared = 0;
    for (user, mut runs) in by_user {
        runs.sort_by_key(|r| r.start);
        for pair in runs.windows(2) {
            let (end, _) = pair[0].end.expect("every run ended");
            assert!(
                end <= pair[1].start,
                "runs of {user} overlap: {:?} and {:?}",
                pair[0],
                pair[1]
            );
            compared += 1;
        }
    }
    // At least: alice, bob and carol two runs each, dave's burst after his first, frank's
    // rerun after the killed run.
    assert!(compared >= 5, "the overlap check compared {compared} pairs");
    let upstream_of = |user: &str| cluster.up.path().join(format!("{user}.git"));
    for (user, oid) in &pushed {
        assert!(
            all.iter().any(|r| r.user == *user
                && r.end.is_some_and(|(_, abandoned)| !abandoned)
                && is_ancestor(&upstream_of(user), oid, &r.saw)),
            "no completed run of {user} saw {oid}: {all:#?}"
        );
    }
}

/// `token revoke` against the database: every replica refuses the old token within seconds,
/// and `token rotate`'s new one works on every replica.
#[test]
fn a_revocation_reaches_every_replica_within_seconds() {
    let db = Postgres::start();
    let up = tempfile::tempdir().expect("tempdir");
    let work = tempfile::tempdir().expect("tempdir");
    let runs = work.path().join("runs");
    let mut cluster = Cluster {
        db,
        up,
        runs,
        replicas: Vec::new(),
        work,
    };
    for _ in 0..2 {
        let replica = cluster.replica();
        cluster.replicas.push(replica);
    }
    let token = |action: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_shmastra-cloud"))
            .args(["token", action, "--user", "alice"])
            .env_clear()
            .env("SHMASTRA_TOKEN_SECRET", SECRET)
            .env("DATABASE_URL", cluster.db.url())
            .output()
            .expect("shmastra-cloud token");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let first = token("mint");
    let ls_remote = |replica: usize, token: &str| {
        let url = format!(
            "http://x:{token}@{}/api/git/alice.git",
            cluster.replicas[replica].addr
        );
        testkit::git::git_output(cluster.work.path(), ["ls-remote", &url])
            .status
            .success()
    };
    assert!(ls_remote(0, &first) && ls_remote(1, &first));
    let second = token("rotate");
    assert_ne!(first, second);
    for replica in 0..2 {
        wait::until(Duration::from_secs(5), "the old token refused", || {
            (!ls_remote(replica, &first)).then_some(())
        });
        assert!(
            ls_remote(replica, &second),
            "the new token works on replica {replica}"
        );
    }
    assert_eq!(token("mint"), second, "mint prints the current generation");
}
