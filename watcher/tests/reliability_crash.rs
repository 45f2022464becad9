//! Reliability: `kill -9` of the real watcher at random moments (starting up, staging,
//! committing, writing the index, pushing over HTTP), restarted each time, while numbered
//! edits keep coming. Afterwards the remote holds every edit's final content, `git fsck` is
//! clean, and a new watcher starts and saves (no lock blocks work).
//!
//! `RELIABILITY_ROUNDS` (default 12) sets the kills; `RELIABILITY_SEED` replays a run.

mod support;

use std::collections::BTreeMap;
use std::fs;
use std::time::{Duration, Instant};

use support::{PATIENCE, Project, Rng, knob, report};

/// Every edit's path and its final content (`None`: deleted).
struct Edits {
    expected: BTreeMap<String, Option<String>>,
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
                if let Some(victim) = self
                    .expected
                    .iter()
                    .filter(|(_, v)| v.is_some())
                    .map(|(k, _)| k.clone())
                    .nth(rng.below(self.expected.len() as u64) as usize)
                {
                    fs::remove_file(project.path(&victim)).unwrap();
                    self.expected.insert(victim, None);
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
        self.expected.insert(rel, Some(body));
    }
}

#[test]
fn kill_9_at_random_moments_loses_no_edit() {
    let rounds = knob("RELIABILITY_ROUNDS", 12);
    let mut rng = Rng::from_env("kill_9_at_random_moments_loses_no_edit");
    let tmp = tempfile::tempdir().unwrap();
    let project = Project::served(tmp.path());
    fs::write(project.path(".gitignore"), "*.tmp~\nnode_modules/\n").unwrap();
    let mut edits = Edits {
        expected: BTreeMap::new(),
        made: 0,
    };
    let args = ["--debounce", "30ms", "--max-delay", "300ms"];
    let started = Instant::now();
    let mut kills_while_running = 0;
    for _ in 0..rounds {
        let watcher = project.spawn(&args, &[]);
        match rng.below(5) {
            // Killed while starting: the full pass, the first commit, the first push.
            0 => std::thread::sleep(rng.millis(150)),
            _ => {
                for _ in 0..=rng.below(6) {
                    edits.edit(&project, &mut rng);
                    std::thread::sleep(rng.millis(80));
                }
                // Somewhere in debounce, stage, commit, index write or push.
                std::thread::sleep(rng.millis(400));
                kills_while_running += 1;
            }
        }
        watcher.kill9();
        // Edits made while no watcher runs are saved by the next one's full pass.
        if rng.below(3) == 0 {
            edits.edit(&project, &mut rng);
        }
    }

    // A stale index.lock from a kill mid-write is removed after 60 s, so allow for that.
    let watcher = project.start(&args, &[]);
    project.wait_pushed(Duration::from_secs(180));
    let lost: Vec<&String> = edits
        .expected
        .iter()
        .filter(|(rel, body)| {
            project.remote_file(rel).as_deref() != body.as_deref().map(str::as_bytes)
        })
        .map(|(rel, _)| rel)
        .collect();
    report(
        "crash",
        &format!(
            "rounds={rounds} kills={rounds} kills_mid_work={kills_while_running} edits={} lost={} seconds={}",
            edits.made,
            lost.len(),
            started.elapsed().as_secs()
        ),
    );
    assert!(lost.is_empty(), "edits missing from the remote: {lost:?}");
    project.assert_fsck_clean();
    let (exit, logs) = watcher.stop();
    assert_eq!(exit.code(), Some(0), "{logs}");

    // No lock or leftover blocks the next watcher: it starts, commits and pushes.
    let watcher = project.start(&args, &[]);
    project.write("after-the-storm.txt", "calm\n");
    project.wait_pushed(PATIENCE);
    assert_eq!(
        project.remote_file("after-the-storm.txt").as_deref(),
        Some(&b"calm\n"[..])
    );
    let (exit, logs) = watcher.stop();
    assert_eq!(exit.code(), Some(0), "{logs}");
}
