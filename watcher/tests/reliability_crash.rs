//! Reliability: `kill -9` of the real watcher, restarted each time, while numbered edits keep
//! coming. Each kill is aimed (start-up, a random moment, inside a save, inside a push, after a
//! calm spell); the watcher is frozen with SIGSTOP first, so the phase the kill hit is read from
//! its own files (status, work markers, git's lock files) and recorded. At that frozen moment,
//! every edit older than debounce + max-delay + a push (counted from when this watcher became
//! ready, for edits made before) must already be on the remote. After every kill `git fsck
//! --full --strict` is clean in the working repository and the remote; at the end the remote
//! holds every edit's final content and a new watcher starts and saves.
//!
//! `RELIABILITY_ROUNDS` (default 12) sets the kills; `RELIABILITY_SEED` replays a run;
//! `RELIABILITY_PUSH_MS` is what "a push" may take on this machine: by default it is measured
//! first with real git (three times the slowest of three pushes to the same server, at least
//! 2 s), so a loaded machine widens the promise instead of failing it.

mod support;

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use project_watcher::status::State;
use support::{PATIENCE, Project, Rng, Watcher, knob, report};
use testkit::git::git;

const DEBOUNCE: Duration = Duration::from_millis(30);
const MAX_DELAY: Duration = Duration::from_millis(300);
const ARGS: [&str; 4] = ["--debounce", "30ms", "--max-delay", "300ms"];

/// Every edited path: its final content (`None`: deleted) and when it was written.
struct Edits {
    expected: BTreeMap<String, (Option<String>, Instant)>,
    made: u64,
}

impl Edits {
    fn edit(&mut self, project: &Project, rng: &mut Rng) {
        self.made += 1;
        let n = self.made;
        let dir = ["", "src/", "src/deep/er/", "docs/"][rng.below(4) as usize];
        let rel = match rng.below(10) {
            // A new directory, created with its file at once.
            0 => format!("new-{n}/file.txt"),
            // Deleting something that exists.
            1 => {
                let present: Vec<String> = self
                    .expected
                    .iter()
                    .filter(|(_, (body, _))| body.is_some())
                    .map(|(k, _)| k.clone())
                    .collect();
                if !present.is_empty() {
                    let victim = present[rng.below(present.len() as u64) as usize].clone();
                    fs::remove_file(project.path(&victim)).unwrap();
                    self.expected.insert(victim, (None, Instant::now()));
                    return;
                }
                format!("{dir}f{}.txt", rng.below(8))
            }
            _ => format!("{dir}f{}.txt", rng.below(8)),
        };
        let body = format!("edit {n}\n{}", "x".repeat(rng.below(3000) as usize));
        if rng.below(2) == 0 {
            project.write(&rel, &body);
        } else {
            // As editors save: a temp file renamed over the old one.
            let tmp = format!("{rel}.tmp~");
            project.write(&tmp, &body);
            fs::rename(project.path(&tmp), project.path(&rel)).unwrap();
        }
        self.expected.insert(rel, (Some(body), Instant::now()));
    }

    /// A burst of files in one new directory (`npm run build` writing its output): a save
    /// long enough to be caught inside.
    fn burst(&mut self, project: &Project) {
        self.made += 1;
        let n = self.made;
        for i in 0..150 {
            let rel = format!("burst-{n}/part-{i}.txt");
            let body = format!("burst {n} part {i}\n");
            project.write(&rel, &body);
            self.expected.insert(rel, (Some(body), Instant::now()));
        }
    }
}

/// Where a kill landed, read from the frozen watcher's files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    /// Before its first status: the start-up full pass and first commit.
    StartUp,
    /// A change seen, the debounce running.
    Debounce,
    /// Inside a save, staging (the save marker is there, no git lock yet).
    Stage,
    /// Inside a save, writing the index (`index.lock`).
    IndexWrite,
    /// Inside a save, moving the branch (`HEAD.lock` or the branch's lock).
    Commit,
    /// Inside a push (the push marker).
    Push,
    /// Waiting to retry a failed push.
    Backoff,
    Idle,
}

/// How a round chooses its moment.
#[derive(Debug, Clone, Copy)]
enum Aim {
    StartUp,
    Random,
    Save,
    Push,
    Calm,
}

/// One watcher's life, from spawn to kill.
struct Life<'a> {
    project: &'a Project,
    watcher: Watcher,
    spawned: SystemTime,
    ready_at: Option<Instant>,
}

impl Life<'_> {
    fn state_dir(&self) -> PathBuf {
        self.project.git_dir().join("project-watcher")
    }

    /// Notes the moment the watcher's first status appears (its start-up pass is done).
    fn observe(&mut self) {
        if self.ready_at.is_none()
            && self
                .project
                .status()
                .is_some_and(|s| s.pid == self.watcher.pid())
        {
            self.ready_at = Some(Instant::now());
        }
    }

    /// Sleeps `d`, watching for readiness.
    fn pause(&mut self, d: Duration) {
        let until = Instant::now() + d;
        loop {
            self.observe();
            let now = Instant::now();
            if now >= until {
                return;
            }
            std::thread::sleep((until - now).min(Duration::from_millis(5)));
        }
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + PATIENCE;
        while self.ready_at.is_none() {
            assert!(Instant::now() < deadline, "{}", self.watcher.logs());
            self.pause(Duration::from_millis(5));
        }
    }

    /// A work marker (`saving`, `pushing`) this watcher created: its predecessor's, left by a
    /// kill, is older than this spawn (each `begin` rewrites it, which sets its mtime).
    fn marker(&self, work: &str) -> bool {
        fs::metadata(self.state_dir().join(work))
            .and_then(|m| m.modified())
            .is_ok_and(|at| at >= self.spawned)
    }

    /// Spins until this watcher's `work` marker appears (at most 5 s); whether it did.
    fn catch(&mut self, work: &str) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if self.marker(work) {
                return true;
            }
            self.observe();
        }
        false
    }

    /// What the frozen watcher was doing.
    fn phases(&mut self) -> Vec<Phase> {
        self.observe();
        let git = self.project.git_dir();
        let mut phases = Vec::new();
        if self.marker("saving") {
            phases.push(if git.join("index.lock").exists() {
                Phase::IndexWrite
            } else if git.join("HEAD.lock").exists() || git.join("refs/heads/main.lock").exists() {
                Phase::Commit
            } else {
                Phase::Stage
            });
        }
        if self.marker("pushing") {
            phases.push(Phase::Push);
        }
        if self.ready_at.is_none() {
            phases.insert(0, Phase::StartUp);
        } else if phases.is_empty() {
            phases.push(match self.project.status().map(|s| s.state) {
                Some(State::Pending) => Phase::Debounce,
                Some(State::Committing) => Phase::Stage,
                Some(State::Pushing) => Phase::Push,
                Some(State::Backoff) => Phase::Backoff,
                _ => Phase::Idle,
            });
        }
        phases
    }
}

/// What "a push" may take: `RELIABILITY_PUSH_MS` when set, else measured on this machine now,
/// without the watcher (a slow watcher must not widen its own promise): three times the
/// slowest of three pushes real git makes of a commit like the test's edits to the same
/// server (to a scratch branch, deleted afterwards), and never under 2 s. Returns it and the
/// slowest push.
fn push_allowance(project: &Project) -> (Duration, Duration) {
    let scratch = project.root.join("measure");
    testkit::git::init_repo(&scratch);
    let url = git(&project.work, ["remote", "get-url", "project"]);
    let url = url.trim();
    let mut slowest = Duration::ZERO;
    for i in 0..3 {
        fs::write(
            scratch.join("f.txt"),
            format!("push {i}\n{}", "x".repeat(3000)),
        )
        .unwrap();
        git(&scratch, ["add", "-A"]);
        git(&scratch, ["commit", "-qm", "measure"]);
        let started = Instant::now();
        git(
            &scratch,
            ["push", "-q", "-f", url, "HEAD:refs/heads/measure"],
        );
        slowest = slowest.max(started.elapsed());
    }
    git(&scratch, ["push", "-q", url, "--delete", "measure"]);
    let allowance = match std::env::var("RELIABILITY_PUSH_MS") {
        Ok(_) => Duration::from_millis(knob("RELIABILITY_PUSH_MS", 2000)),
        Err(_) => (3 * slowest).max(Duration::from_secs(2)),
    };
    (allowance, slowest)
}

#[test]
fn kill_9_at_every_phase_loses_no_edit_older_than_a_save_and_a_push() {
    let rounds = knob("RELIABILITY_ROUNDS", 12);
    let mut rng = Rng::from_env("kill_9_at_every_phase_loses_no_edit_older_than_a_save_and_a_push");
    let tmp = tempfile::tempdir().unwrap();
    let project = Project::served(tmp.path());
    fs::write(project.path(".gitignore"), "*.tmp~\nnode_modules/\n").unwrap();
    let (push, measured) = push_allowance(&project);
    let promise = DEBOUNCE + MAX_DELAY + push;
    let mut edits = Edits {
        expected: BTreeMap::new(),
        made: 0,
    };
    let started = Instant::now();
    let mut phases: BTreeMap<Phase, u64> = BTreeMap::new();
    let (mut checked, mut kills_checked) = (0u64, 0u64);
    for round in 0..rounds {
        let aim =
            [Aim::StartUp, Aim::Random, Aim::Save, Aim::Push, Aim::Calm][(round % 5) as usize];
        let spawned = SystemTime::now();
        let mut life = Life {
            project: &project,
            watcher: project.spawn(&ARGS, &[]),
            spawned,
            ready_at: None,
        };
        match aim {
            Aim::StartUp => life.pause(rng.millis(150)),
            Aim::Random => {
                for _ in 0..=rng.below(6) {
                    edits.edit(&project, &mut rng);
                    life.pause(rng.millis(80));
                }
                life.pause(rng.millis(400));
            }
            Aim::Save => {
                life.wait_ready();
                edits.burst(&project);
                if life.catch("saving") {
                    life.pause(rng.millis(30));
                }
            }
            Aim::Push => {
                life.wait_ready();
                edits.edit(&project, &mut rng);
                if life.catch("pushing") {
                    life.pause(rng.millis(60));
                }
            }
            Aim::Calm => {
                life.wait_ready();
                for _ in 0..=rng.below(3) {
                    edits.edit(&project, &mut rng);
                    life.pause(rng.millis(80));
                }
                life.pause(promise + rng.millis(500));
            }
        }
        life.watcher.freeze();
        let hit = life.phases();
        for phase in &hit {
            *phases.entry(*phase).or_default() += 1;
        }
        // The promise at this frozen moment.
        let now = Instant::now();
        let mut late = Vec::new();
        let mut checked_here = 0;
        if let Some(ready) = life.ready_at {
            for (rel, (body, at)) in &edits.expected {
                let age = now - (*at).max(ready);
                if age <= promise {
                    continue;
                }
                checked_here += 1;
                if project.remote_file(rel).as_deref() != body.as_deref().map(str::as_bytes) {
                    late.push(format!("{rel} ({} ms old)", age.as_millis()));
                }
            }
        }
        assert!(
            late.is_empty(),
            "round {round} ({aim:?}), kill hit {hit:?}: edits older than {} ms not on the remote: {late:?}\n{}",
            promise.as_millis(),
            life.watcher.logs()
        );
        checked += checked_here;
        kills_checked += u64::from(checked_here > 0);
        life.watcher.kill9();
        // Whatever the kill interrupted, git finds both repositories whole.
        project.assert_fsck_clean();
        // Edits made while no watcher runs are saved by the next one's full pass.
        if rng.below(3) == 0 {
            edits.edit(&project, &mut rng);
        }
    }

    let watcher = project.start(&ARGS, &[]);
    project.wait_pushed(Duration::from_secs(180));
    let lost: Vec<&String> = edits
        .expected
        .iter()
        .filter(|(rel, (body, _))| {
            project.remote_file(rel).as_deref() != body.as_deref().map(str::as_bytes)
        })
        .map(|(rel, _)| rel)
        .collect();
    let hits: Vec<String> = phases.iter().map(|(p, n)| format!("{p:?}:{n}")).collect();
    report(
        "crash",
        &format!(
            "rounds={rounds} kills={rounds} push_ms={} git_push_ms={} phases={} checked_at_kills={checked} kills_checked={kills_checked} edits={} lost={} seconds={}",
            push.as_millis(),
            measured.as_millis(),
            hits.join(","),
            edits.made,
            lost.len(),
            started.elapsed().as_secs()
        ),
    );
    assert!(lost.is_empty(), "edits missing from the remote: {lost:?}");
    if rounds >= 5 {
        // Every fifth round is calm: the promise must have been checked, and kills must have
        // landed inside a save and inside a push, or this test proved less than it says.
        assert!(
            kills_checked > 0,
            "no kill came late enough to check the promise"
        );
        let inside_save = [Phase::Stage, Phase::IndexWrite, Phase::Commit]
            .iter()
            .any(|p| phases.contains_key(p));
        assert!(inside_save, "no kill landed inside a save: {hits:?}");
        assert!(
            phases.contains_key(&Phase::Push),
            "no kill landed inside a push: {hits:?}"
        );
    }
    project.assert_fsck_clean();
    let (exit, logs) = watcher.stop();
    assert_eq!(exit.code(), Some(0), "{logs}");

    // No lock or leftover blocks the next watcher: it starts, commits and pushes.
    let watcher = project.start(&ARGS, &[]);
    project.write("after-the-storm.txt", "calm\n");
    project.wait_pushed(PATIENCE);
    assert_eq!(
        project.remote_file("after-the-storm.txt").as_deref(),
        Some(&b"calm\n"[..])
    );
    let (exit, logs) = watcher.stop();
    assert_eq!(exit.code(), Some(0), "{logs}");
}
