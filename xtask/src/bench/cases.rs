//! The measured cases. Each one starts its side fresh on a clean fixture, acts on the project
//! as a user or a package manager would, reads the remote and `/proc`, and ends by checking
//! that the remote holds exactly what `git add -A` would commit: a lost change is a failure,
//! never a slow figure.

use std::collections::HashMap;
use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;

use super::fixture::{self, BURST_PREFIX, Fixture, TreeWriter};
use super::side::{Programs, Running, Side};

/// How often the remote's ref is read while a case waits for a commit.
const REMOTE_POLL: Duration = Duration::from_millis(2);
/// Time given to a side to finish what follows a push (status files, logs) before its CPU
/// is read, and between two edits so each one starts from a quiet watcher.
const QUIET: Duration = Duration::from_secs(1);
/// How long past the settle time a change may take to reach the remote before it counts as
/// lost.
const LOST_AFTER: Duration = Duration::from_secs(90);

#[derive(Debug, Clone, Serialize)]
pub struct Startup {
    pub case: String,
    pub ready_s: f64,
    /// Read one second after ready, once start-up work is over.
    pub watches: u64,
    pub rss_kib: u64,
    pub rss_anon_kib: u64,
    pub cpu_s: f64,
    pub processes: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct OneEdit {
    /// Per edit: from the write to the commit on the remote, less the settle time.
    pub beyond_settle_ms: Vec<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct NodeModulesBurst {
    pub files: usize,
    pub cpu_s: f64,
    pub commits: u64,
    pub watches_before: u64,
    pub watches_after: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct TrackedBurst {
    pub files: usize,
    /// From the last write to all of them on the remote, less the settle time.
    pub beyond_settle_s: f64,
    pub commits: u64,
    /// From the first write until a second after the remote has them all.
    pub cpu_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Idle {
    pub seconds: f64,
    pub cpu_s: f64,
    pub rss_kib: u64,
    pub rss_anon_kib: u64,
}

/// Everything one side did on one fixture.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SideResults {
    pub startups: Vec<Startup>,
    pub one_edit: Option<OneEdit>,
    pub node_modules_burst: Option<NodeModulesBurst>,
    pub tracked_burst: Option<TrackedBurst>,
    pub idle: Option<Idle>,
}

/// State shared by the cases of one bench run.
pub struct Session {
    pub programs: Programs,
    pub settle: Duration,
    pub scratch: PathBuf,
    /// Makes every edit's content new, also across runs on a reused fixture.
    pub run_tag: String,
    edits: u64,
    pub failures: Vec<String>,
}

impl Session {
    pub fn new(programs: Programs, settle: Duration, scratch: PathBuf, run_tag: String) -> Self {
        Self {
            programs,
            settle,
            scratch,
            run_tag,
            edits: 0,
            failures: Vec::new(),
        }
    }

    /// Starts `side` fresh, records its start-up figures, runs `case` and checks the remote.
    fn with_side<T>(
        &mut self,
        side: Side,
        fixture: &Fixture,
        results: &mut SideResults,
        case: &str,
        body: impl FnOnce(&mut Self, &Running) -> Result<T>,
    ) -> Result<Option<T>> {
        let running = Running::start(side, &self.programs, fixture, self.settle, case)?;
        std::thread::sleep(QUIET);
        let at_rest = running.sample()?;
        results.startups.push(Startup {
            case: case.to_owned(),
            ready_s: running.ready_after.as_secs_f64(),
            watches: at_rest.watches,
            rss_kib: at_rest.rss_kib,
            rss_anon_kib: at_rest.rss_anon_kib,
            cpu_s: at_rest.cpu_s,
            processes: at_rest.processes,
        });
        let outcome = body(self, &running);
        let checked = outcome.is_ok() && self.check_saved(fixture, side, case, &running)?;
        let tail = running.log_tail();
        running.stop()?;
        match outcome {
            Ok(v) if checked => Ok(Some(v)),
            Ok(_) => {
                self.resync(fixture)?;
                Ok(None)
            }
            Err(e) => {
                self.failures.push(format!(
                    "{} / {case} / {} tracked: {e:#}\nlast log lines:\n{tail}",
                    side.name(),
                    fixture.spec.tracked_files
                ));
                self.resync(fixture)?;
                Ok(None)
            }
        }
    }

    /// Start-up alone: ready, watches and RSS are recorded by `with_side`.
    pub fn startup(&mut self, side: Side, fx: &Fixture, results: &mut SideResults) -> Result<()> {
        self.with_side(side, fx, results, "startup", |_, _| Ok(()))
            .map(drop)
    }

    /// `reps` single edits, each from a quiet watcher: the write to the commit on the remote.
    pub fn one_edit(
        &mut self,
        side: Side,
        fx: &Fixture,
        results: &mut SideResults,
        reps: usize,
    ) -> Result<()> {
        let n = fx.spec.tracked_files;
        let found = self.with_side(side, fx, results, "one-edit", |s, _| {
            let mut beyond = Vec::with_capacity(reps);
            for rep in 0..reps {
                let index = (rep * 7919 + 13) % n;
                let edits = s.prepare_edits(fx, &[index])?;
                let old = fx.remote_head()?;
                let written = s.write_edits(fx, &edits)?;
                let (done, _) = s.wait_for_remote(fx, old.as_deref(), &edits, written.1)?;
                beyond.push(
                    (done.duration_since(written.1).as_secs_f64() - s.settle.as_secs_f64())
                        * 1000.0,
                );
                std::thread::sleep(QUIET);
            }
            Ok(OneEdit {
                beyond_settle_ms: beyond,
            })
        })?;
        results.one_edit = found;
        Ok(())
    }

    /// A package manager writes `files` new files into `node_modules/`: nothing may be
    /// committed, and the CPU spent on it is the cost of ignoring it.
    pub fn node_modules_burst(
        &mut self,
        side: Side,
        fx: &Fixture,
        results: &mut SideResults,
        files: usize,
    ) -> Result<()> {
        let found = self.with_side(side, fx, results, "node-modules-burst", |s, running| {
            let remote_before = fx.remote_head()?;
            let local_before = local_head(fx)?;
            let before = running.sample()?;
            let mut writer = TreeWriter::new(&fx.project);
            let written = fixture::write_packages(&mut writer, BURST_PREFIX, files)?;
            std::thread::sleep(s.settle + QUIET * 2);
            let after = running.sample()?;
            let commits = count_commits(fx, remote_before.as_deref(), fx.remote_head()?)?
                + u64::from(local_head(fx)? != local_before);
            Ok(NodeModulesBurst {
                files: written,
                cpu_s: after.cpu_s - before.cpu_s,
                commits,
                watches_before: before.watches,
                watches_after: after.watches,
            })
        })?;
        fixture::remove_bursts(&fx.project)?;
        results.node_modules_burst = found;
        Ok(())
    }

    /// `files` tracked files edited at once, spread over the tree.
    pub fn tracked_burst(
        &mut self,
        side: Side,
        fx: &Fixture,
        results: &mut SideResults,
        files: usize,
    ) -> Result<()> {
        let n = fx.spec.tracked_files;
        let files = files.min(n);
        let found = self.with_side(side, fx, results, "tracked-burst", |s, running| {
            let indexes: Vec<usize> = (0..files).map(|k| k * n / files).collect();
            let edits = s.prepare_edits(fx, &indexes)?;
            let old = fx.remote_head()?;
            let before = running.sample()?;
            let (_, last_write) = s.write_edits(fx, &edits)?;
            let (done, new) = s.wait_for_remote(fx, old.as_deref(), &edits, last_write)?;
            std::thread::sleep(QUIET);
            let after = running.sample()?;
            Ok(TrackedBurst {
                files,
                beyond_settle_s: done.duration_since(last_write).as_secs_f64()
                    - s.settle.as_secs_f64(),
                commits: count_commits(fx, old.as_deref(), Some(new))?,
                cpu_s: after.cpu_s - before.cpu_s,
            })
        })?;
        results.tracked_burst = found;
        Ok(())
    }

    /// Nothing happens for `seconds`: any CPU spent is polling.
    pub fn idle(
        &mut self,
        side: Side,
        fx: &Fixture,
        results: &mut SideResults,
        seconds: Duration,
    ) -> Result<()> {
        let found = self.with_side(side, fx, results, "idle", |_, running| {
            let before = running.sample()?;
            std::thread::sleep(seconds);
            let after = running.sample()?;
            Ok(Idle {
                seconds: seconds.as_secs_f64(),
                cpu_s: after.cpu_s - before.cpu_s,
                rss_kib: after.rss_kib,
                rss_anon_kib: after.rss_anon_kib,
            })
        })?;
        results.idle = found;
        Ok(())
    }

    /// New content for tracked files `indexes`, with the blob ids git will give it, computed
    /// before anything is written so that waiting for the remote costs no hashing.
    fn prepare_edits(&mut self, fx: &Fixture, indexes: &[usize]) -> Result<Vec<Edit>> {
        let dir = self.scratch.join("edits");
        fs::create_dir_all(&dir)?;
        let mut edits = Vec::with_capacity(indexes.len());
        let mut list = String::new();
        for (k, &i) in indexes.iter().enumerate() {
            self.edits += 1;
            let content =
                fixture::src_content(i, Some(&format!("{} #{}", self.run_tag, self.edits)));
            let scratch_file = dir.join(format!("{k}"));
            fs::write(&scratch_file, &content)?;
            list.push_str(scratch_file.to_str().context("scratch path is not UTF-8")?);
            list.push('\n');
            edits.push(Edit {
                path: fixture::src_path(i, fx.spec.tracked_files),
                content,
                blob: String::new(),
            });
        }
        let ids = fx.git.run_with(
            fx.git
                .command(&fx.project)
                .args(["hash-object", "--stdin-paths"]),
            Some(list.as_bytes()),
        )?;
        for (edit, id) in edits.iter_mut().zip(ids.lines()) {
            edit.blob = id.to_owned();
        }
        fs::remove_dir_all(&dir)?;
        Ok(edits)
    }

    /// Writes the edits into the project; returns when the first and the last write ended.
    fn write_edits(&self, fx: &Fixture, edits: &[Edit]) -> Result<(Instant, Instant)> {
        let mut first = None;
        for edit in edits {
            let path = fx.project.join(&edit.path);
            fs::write(&path, &edit.content)
                .with_context(|| format!("writing {}", path.display()))?;
            first.get_or_insert_with(Instant::now);
        }
        let last = Instant::now();
        Ok((first.unwrap_or(last), last))
    }

    /// Polls the remote until its `main` moved past `old` to a commit holding every edit.
    /// Returns when that commit was first seen, and its id.
    fn wait_for_remote(
        &self,
        fx: &Fixture,
        old: Option<&str>,
        edits: &[Edit],
        since: Instant,
    ) -> Result<(Instant, String)> {
        let deadline = since + self.settle + LOST_AFTER;
        let mut seen = old.map(str::to_owned);
        loop {
            let head = fx.remote_head()?;
            let now = Instant::now();
            if head != seen {
                seen = head.clone();
                if let Some(head) = head
                    && remote_holds(fx, &head, edits)?
                {
                    return Ok((now, head));
                }
            }
            if now > deadline {
                anyhow::bail!(
                    "LOST CHANGE: {} edited file(s) (first: {}) not on the remote {:?} after the settle time",
                    edits.len(),
                    edits.first().map_or("", |e| e.path.as_str()),
                    LOST_AFTER
                );
            }
            std::thread::sleep(REMOTE_POLL);
        }
    }

    /// Compares the remote's tree with what `git add -A` would commit now; a difference is
    /// recorded as a lost change.
    fn check_saved(
        &mut self,
        fx: &Fixture,
        side: Side,
        case: &str,
        running: &Running,
    ) -> Result<bool> {
        let expected = fx.git.tree_of_add_all(&fx.project, &self.scratch)?;
        let actual = fx.git.tree_of(&fx.remote, "main")?;
        if expected == actual {
            return Ok(true);
        }
        let diff = fx
            .git
            .run(&fx.project, ["diff", "--stat", &actual, &expected])
            .unwrap_or_else(|e| format!("(cannot diff: {e:#})"));
        self.failures.push(format!(
            "LOST CHANGE: {} / {case} / {} tracked: the remote's tree {actual} is not what `git add -A` commits ({expected}):\n{}\nlast log lines:\n{}",
            side.name(),
            fx.spec.tracked_files,
            diff.lines().take(20).collect::<Vec<_>>().join("\n"),
            running.log_tail()
        ));
        Ok(false)
    }

    /// After a failed case, commits and pushes what is left so the next case starts clean.
    fn resync(&self, fx: &Fixture) -> Result<()> {
        let p = &fx.project;
        fx.git.run(p, ["add", "-A"])?;
        if !fx.git.run(p, ["status", "--porcelain"])?.is_empty() {
            fx.git.run(p, ["commit", "-q", "-m", "bench: resync"])?;
        }
        fx.git.run(p, ["push", "-q", "project", "main"])?;
        Ok(())
    }
}

struct Edit {
    path: String,
    content: Vec<u8>,
    blob: String,
}

fn remote_holds(fx: &Fixture, commit: &str, edits: &[Edit]) -> Result<bool> {
    let mut cmd = fx.git.command(&fx.remote);
    cmd.args(["ls-tree", "-r", commit, "--"]);
    cmd.args(edits.iter().map(|e| &e.path));
    let listing = fx.git.run_with(&mut cmd, None)?;
    let found: HashMap<&str, &str> = listing
        .lines()
        .filter_map(|l| {
            let (meta, path) = l.split_once('\t')?;
            Some((path, meta.split_whitespace().nth(2)?))
        })
        .collect();
    Ok(edits
        .iter()
        .all(|e| found.get(e.path.as_str()) == Some(&e.blob.as_str())))
}

fn local_head(fx: &Fixture) -> Result<String> {
    Ok(fx
        .git
        .run(&fx.project, ["rev-parse", "HEAD"])?
        .trim()
        .to_owned())
}

fn count_commits(fx: &Fixture, old: Option<&str>, new: Option<String>) -> Result<u64> {
    let Some(new) = new else { return Ok(0) };
    let range = match old {
        Some(old) if old == new => return Ok(0),
        Some(old) => format!("{old}..{new}"),
        None => new,
    };
    Ok(fx
        .git
        .run(&fx.remote, ["rev-list", "--count", &range])?
        .trim()
        .parse()?)
}
