//! Property: whatever history the watcher, `restore --at` and the user make, every push that
//! lands leaves the remote whole, and its first pack is never refused.
//!
//! Generated histories: writes from a small set of contents (so files and saves repeat each
//! other), deletions, renames there and back, a folder deleted and made again with its old
//! content, a folder copied (one tree at two paths), large files (a pack past 64 KiB), saves
//! that are not pushed (an outage), `restore --at` an earlier save, the user's own commits and
//! merges (of a side branch, and of an unrelated root), another clone pushing to the remote
//! (the next push goes to a recovery branch, then the user merges the remote). Pushes are the
//! watcher's own (`daemon::once`: a save and one push, its refusal handling included), and some
//! fail (HTTP 500, connections refused, the path remote gone for a moment) or are cut off
//! mid-pack (`Fault::StallMidPack`) and are retried later. Each case goes through one
//! transport, in turn: `git http-backend` behind testkit's server, `shmastra-cloud serve` with
//! its embedded upstream (no faults there), a path remote (no cut-off).
//!
//! After every push that landed: `git fsck --full --strict` on the remote is clean, a fresh
//! clone (through upload-pack) of the pushed branch holds the local `HEAD`'s tree, and the
//! watcher logged no refusal for missing objects (its first pack was complete). The run
//! counts the cases where one push sent a revert (two of its commits with one tree, the newer
//! bringing it back), a repeated tree (one subtree introduced twice among its commits) and a
//! root commit with others (the root's tree sent whole): the shapes where "already in the pack"
//! must mean "complete". It fails when any share is under 20 %.
//!
//! `WHOLE_REMOTE_CASES` (default 24) sets the cases of one run; `WHOLE_REMOTE_SECS` (default 0)
//! runs batches of that many until so many seconds have passed (the soak: 600).

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use git2::{ObjectType, Oid, Repository};
use project_watcher::config::Config;
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestCaseError, TestRunner};
use testkit::git::{git, git_output, init_bare, init_repo};
use testkit::git_server::{Fault, GitServer};

/// Files the writes choose from, at several depths.
const PATHS: [&str; 7] = [
    "a.txt",
    "src/main.ts",
    "src/lib/util.ts",
    "src/lib/deep/x.ts",
    "docs/guide.md",
    "docs/more/faq.md",
    "b.txt",
];
/// Few contents, so files and saves repeat each other.
const CONTENTS: [&str; 3] = ["one\n", "two\n", "three\n"];
/// The folders that are deleted, made again and copied.
const DIRS: [&str; 3] = ["src/lib", "docs", "src"];

#[derive(Debug, Clone, Copy)]
enum Outcome {
    Lands,
    Fails,
    CutOff,
}

#[derive(Debug, Clone)]
enum Op {
    Write(usize, usize),
    Delete(usize),
    /// `p` to `p.renamed`, or back.
    Rename(usize),
    DropDir(usize),
    /// The folder's content when it was last dropped, written again.
    RestoreDir(usize),
    /// The folder copied under `copy/`.
    CopyDir(usize),
    /// 100 KiB that do not compress.
    Big(u64),
    /// A save that is not pushed.
    Save,
    Push(Outcome),
    /// `restore --at HEAD~n`.
    RestoreAt(usize),
    UserCommit,
    /// A side branch from `HEAD~n` with its own commit, merged with `--no-ff`.
    UserMerge(usize),
    /// An unrelated root commit, merged with `--allow-unrelated-histories`.
    UnrelatedMerge,
    /// Another clone pushes a commit to the remote's `main`.
    RemoteMoved,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..PATHS.len(), 0..CONTENTS.len()).prop_map(|(p, c)| Op::Write(p, c)),
        1 => (0..PATHS.len()).prop_map(Op::Delete),
        1 => (0..PATHS.len()).prop_map(Op::Rename),
        1 => (0..DIRS.len()).prop_map(Op::DropDir),
        1 => (0..DIRS.len()).prop_map(Op::RestoreDir),
        1 => (0..DIRS.len()).prop_map(Op::CopyDir),
        1 => any::<u64>().prop_map(Op::Big),
        5 => Just(Op::Save),
        2 => Just(Op::Push(Outcome::Lands)),
        1 => Just(Op::Push(Outcome::Fails)),
        1 => Just(Op::Push(Outcome::CutOff)),
        3 => (1..4usize).prop_map(Op::RestoreAt),
        1 => Just(Op::UserCommit),
        1 => (0..3usize).prop_map(Op::UserMerge),
        1 => Just(Op::UnrelatedMerge),
        1 => Just(Op::RemoteMoved),
    ]
}

/// A case: saves made before the remote exists, then the operations.
fn case() -> impl Strategy<Value = (Vec<Op>, Vec<Op>)> {
    (
        prop::collection::vec(
            (0..PATHS.len(), 0..CONTENTS.len()).prop_map(|(p, c)| Op::Write(p, c)),
            0..5,
        ),
        prop::collection::vec(op(), 4..18),
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Transport {
    Http,
    Serve,
    Path,
}

/// `shmastra-cloud serve` with an embedded upstream, for the whole run; killed on drop.
struct Serve {
    child: Child,
    addr: String,
    upstream: PathBuf,
    _tmp: tempfile::TempDir,
}

const SERVE_SECRET: &str = "whole-remote-property-secret-0123456789";

impl Serve {
    fn start() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let upstream = tmp.path().join("upstream");
        let mut child = Command::new(testkit::cargo_bin::shmastra_cloud())
            .args(["serve", "--listen", "127.0.0.1:0", "--upstream-dir"])
            .arg(&upstream)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("SHMASTRA_TOKEN_SECRET", SERVE_SECRET)
            .envs(testkit::git::hermetic_env(tmp.path()))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("shmastra-cloud serve starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("serve did not start: {line:?}"))
            .to_owned();
        Self {
            child,
            addr,
            upstream,
            _tmp: tmp,
        }
    }

    fn token(&self, user: &str) -> String {
        let out = Command::new(testkit::cargo_bin::shmastra_cloud())
            .args(["token", "mint", "--user", user])
            .env_clear()
            .env("SHMASTRA_TOKEN_SECRET", SERVE_SECRET)
            .output()
            .unwrap();
        assert!(out.status.success(), "token mint");
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The watcher's log lines, captured for the whole test process.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Log {
    fn take(&self) -> String {
        String::from_utf8_lossy(&std::mem::take(&mut *self.0.lock().unwrap())).into_owned()
    }
}

/// One case's project and remote.
struct World<'a> {
    tmp: tempfile::TempDir,
    work: PathBuf,
    /// The remote's bare repository on disk (for the serve upstream, once it exists).
    bare: PathBuf,
    url: String,
    token: Option<String>,
    transport: Transport,
    server: Option<GitServer>,
    runtime: &'a tokio::runtime::Runtime,
    dropped: HashMap<usize, Vec<(PathBuf, Vec<u8>)>>,
    remote_added: bool,
    /// Another clone pushed to `main`: the next push goes to a recovery branch.
    moved: bool,
    made: u64,
    figures: Figures,
}

/// What one case reached.
#[derive(Debug, Default, Clone, Copy)]
struct Figures {
    pushes: u64,
    failed: u64,
    cut_off: u64,
    recovered: u64,
    /// Some push that landed sent...
    /// ... two commits with one tree, the newer one bringing it back (a revert);
    revert: bool,
    /// ... one subtree introduced twice (by two of its commits, or at two paths);
    repeated_tree: bool,
    /// ... a root commit with others.
    root_with_more: bool,
}

/// The shapes of the commits one push sends (see [`Figures`]).
#[derive(Debug, Default, Clone, Copy)]
struct Sending {
    revert: bool,
    repeated_tree: bool,
    root_with_more: bool,
}

impl<'a> World<'a> {
    fn new(
        transport: Transport,
        serve: &Serve,
        case: usize,
        runtime: &'a tokio::runtime::Runtime,
    ) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let work = tmp.path().join("project");
        init_repo(&work);
        let (bare, url, token, server) = match transport {
            Transport::Http => {
                let server = GitServer::start(&tmp.path().join("srv"));
                let bare = server.create_bare("r.git");
                (bare, server.url("r.git"), None, Some(server))
            }
            Transport::Serve => {
                // One repository per world: a failing case runs again while it shrinks.
                static WORLDS: std::sync::atomic::AtomicUsize =
                    std::sync::atomic::AtomicUsize::new(0);
                let world = WORLDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let user = format!("u{case}-{world}");
                let token = serve.token(&user);
                (
                    serve.upstream.join(format!("{user}.git")),
                    format!("http://{}/api/git/{user}.git", serve.addr),
                    Some(token),
                    None,
                )
            }
            Transport::Path => {
                let bare = tmp.path().join("remote.git");
                init_bare(&bare);
                (bare.clone(), bare.to_str().unwrap().to_owned(), None, None)
            }
        };
        Self {
            tmp,
            work,
            bare,
            url,
            token,
            transport,
            server,
            runtime,
            dropped: HashMap::new(),
            remote_added: false,
            moved: false,
            made: 0,
            figures: Figures::default(),
        }
    }

    /// The URL git itself uses (the token in it for serve).
    fn git_url(&self) -> String {
        match &self.token {
            Some(token) => self
                .url
                .replacen("http://", &format!("http://x:{token}@"), 1),
            None => self.url.clone(),
        }
    }

    fn write(&self, rel: &str, body: &[u8]) {
        let path = self.work.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, body).unwrap();
    }

    fn has_head(&self) -> bool {
        git_output(&self.work, ["rev-parse", "--verify", "-q", "HEAD"])
            .status
            .success()
    }

    /// The watcher's `once`: a save, then (with `push`) one push.
    fn once(&self, push: bool) -> Result<(), String> {
        let mut config = Config::new(&self.work);
        config.push = push && self.remote_added;
        config.token = self.token.clone();
        config.shutdown_timeout = Duration::from_secs(30);
        self.runtime
            .block_on(project_watcher::daemon::once(config))
            .map_err(|e| e.to_string())
    }

    /// The user merges `what` (a history unrelated to `HEAD`'s too) with a merge commit. Each
    /// side adds files of its own, so nothing conflicts unless git guesses a rename (a folder
    /// "moved" to one of similar content), which is turned off.
    fn merge(&self, what: &str) {
        let merge = [
            "-c",
            "merge.directoryRenames=false",
            "merge",
            "-q",
            "--no-ff",
            "--no-edit",
            "-X",
            "no-renames",
            "--allow-unrelated-histories",
            what,
        ];
        git(&self.work, merge);
    }

    fn user_commit(&self, message: &str) {
        git(&self.work, ["add", "-A"]);
        git(&self.work, ["commit", "-q", "--allow-empty", "-m", message]);
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        self.made += 1;
        let n = self.made;
        match op {
            Op::Write(p, c) => self.write(PATHS[*p], CONTENTS[*c].as_bytes()),
            Op::Delete(p) => {
                let _ = std::fs::remove_file(self.work.join(PATHS[*p]));
            }
            Op::Rename(p) => {
                let (there, back) = (
                    self.work.join(PATHS[*p]),
                    self.work.join(format!("{}.renamed", PATHS[*p])),
                );
                if there.exists() {
                    std::fs::rename(&there, &back).unwrap();
                } else if back.exists() {
                    std::fs::rename(&back, &there).unwrap();
                }
            }
            Op::DropDir(d) => {
                let dir = self.work.join(DIRS[*d]);
                let files = files_under(&dir);
                if !files.is_empty() {
                    self.dropped.insert(*d, files);
                    std::fs::remove_dir_all(&dir).unwrap();
                }
            }
            Op::RestoreDir(d) => {
                for (path, body) in self.dropped.get(d).cloned().unwrap_or_default() {
                    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                    std::fs::write(path, body).unwrap();
                }
            }
            Op::CopyDir(d) => {
                let dir = self.work.join(DIRS[*d]);
                for (path, body) in files_under(&dir) {
                    let rel = path.strip_prefix(&self.work).unwrap();
                    self.write(&format!("copy/{}", rel.display()), &body);
                }
            }
            Op::Big(seed) => {
                let mut x = *seed | 1;
                let body: Vec<u8> = (0..100 * 1024)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x as u8
                    })
                    .collect();
                self.write(&format!("big/{n}.bin"), &body);
            }
            Op::Save => {
                self.once(false).map_err(TestCaseError::fail)?;
            }
            Op::Push(outcome) => self.push(*outcome)?,
            Op::RestoreAt(back) => {
                if self.has_head() {
                    let rev = format!("HEAD~{back}");
                    // A history shorter than that is refused as input; nothing changes.
                    let _ = project_watcher::restore_at::restore_at(
                        &self.work,
                        &rev,
                        &[],
                        50 << 20,
                        SystemTime::now(),
                    );
                }
            }
            Op::UserCommit => self.user_commit("the user's own commit"),
            Op::UserMerge(back) => {
                if !self.has_head() {
                    return Ok(());
                }
                self.user_commit("before a side branch");
                let depth: usize = git(
                    &self.work,
                    ["rev-list", "--count", "--first-parent", "HEAD"],
                )
                .trim()
                .parse()
                .unwrap();
                let base = format!("HEAD~{}", (*back).min(depth - 1));
                git(&self.work, ["checkout", "-q", "-B", "side", &base]);
                self.write(
                    &format!("side/{n}.txt"),
                    CONTENTS[n as usize % 3].as_bytes(),
                );
                self.user_commit("on a side branch");
                git(&self.work, ["checkout", "-q", "main"]);
                self.merge("side");
            }
            Op::UnrelatedMerge => {
                if !self.has_head() {
                    return Ok(());
                }
                self.user_commit("before an unrelated root");
                let branch = format!("root-{n}");
                git(&self.work, ["checkout", "-q", "--orphan", &branch]);
                git(&self.work, ["read-tree", "--empty"]);
                self.write(&format!("roots/{n}.txt"), b"another root\n");
                git(&self.work, ["add", &format!("roots/{n}.txt")]);
                git(&self.work, ["commit", "-q", "-m", "an unrelated root"]);
                git(&self.work, ["checkout", "-q", "-f", "main"]);
                self.merge(&branch);
            }
            Op::RemoteMoved => {
                if !self.remote_added {
                    return Ok(());
                }
                let other = self.tmp.path().join(format!("other-{n}"));
                git(
                    self.tmp.path(),
                    ["clone", "-q", &self.git_url(), other.to_str().unwrap()],
                );
                std::fs::write(other.join(format!("theirs-{n}.txt")), "theirs\n").unwrap();
                git(&other, ["add", "-A"]);
                git(
                    &other,
                    [
                        "-c",
                        "user.name=o",
                        "-c",
                        "user.email=o@o",
                        "commit",
                        "-q",
                        "-m",
                        "theirs",
                    ],
                );
                git(&other, ["push", "-q", "origin", "HEAD:refs/heads/main"]);
                self.moved = true;
            }
        }
        Ok(())
    }

    /// Turns the fault on for one push: whether the push may fail.
    fn fault(&self, outcome: Outcome) -> Option<Fault> {
        match (outcome, self.transport, &self.server) {
            (Outcome::Lands, ..) | (_, Transport::Serve, _) => None,
            (Outcome::CutOff, Transport::Http, Some(server)) => {
                server.set_fault(Fault::StallMidPack);
                Some(Fault::StallMidPack)
            }
            (_, Transport::Http, Some(server)) => {
                let fault = if self.made.is_multiple_of(2) {
                    Fault::Status500
                } else {
                    Fault::RefuseConnections
                };
                server.set_fault(fault);
                Some(fault)
            }
            (_, Transport::Path, _) => {
                std::fs::rename(&self.bare, self.bare.with_extension("away")).unwrap();
                Some(Fault::RefuseConnections)
            }
            _ => None,
        }
    }

    fn clear_fault(&self) {
        match (&self.server, self.transport) {
            (Some(server), _) => server.set_fault(Fault::None),
            (None, Transport::Path) => {
                let away = self.bare.with_extension("away");
                if away.exists() {
                    std::fs::rename(away, &self.bare).unwrap();
                }
            }
            _ => {}
        }
    }

    fn push(&mut self, outcome: Outcome) -> Result<(), TestCaseError> {
        if !self.remote_added {
            git(&self.work, ["remote", "add", "project", &self.url]);
            self.remote_added = true;
        }
        let sending = self.to_send();
        let fault = self.fault(outcome);
        let result = self.once(true);
        self.clear_fault();
        match (fault, result) {
            (None, Err(e)) if self.moved && e.contains("recovery/") => {
                self.check_recovery()?;
                self.figures.recovered += 1;
                self.moved = false;
                // The user brings the remote's commits in: the next push is a fast-forward.
                git(&self.work, ["fetch", "-q", &self.git_url(), "main"]);
                self.merge("FETCH_HEAD");
                Ok(())
            }
            (None, Err(e)) => Err(TestCaseError::fail(format!("the push failed: {e}"))),
            (None, Ok(())) => {
                self.landed(sending)?;
                Ok(())
            }
            (Some(fault), result) => {
                // The fault may not have bitten (a pack under 64 KiB is read whole); either way
                // the remote is still whole.
                if result.is_err() {
                    self.figures.failed += 1;
                    self.figures.cut_off += u64::from(fault == Fault::StallMidPack);
                } else if !self.moved {
                    self.landed(sending)?;
                }
                self.check_fsck()?;
                Ok(())
            }
        }
    }

    /// The shapes of the commits the next push sends, as git sees them (the head's commits
    /// that no ref of the remote reaches).
    fn to_send(&self) -> Sending {
        let repo = Repository::open(&self.work).unwrap();
        let Ok(head) = repo.head().and_then(|h| h.peel_to_commit()) else {
            return Sending::default();
        };
        let mut walk = repo.revwalk().unwrap();
        walk.push(head.id()).unwrap();
        if let Ok(remote) = Repository::open_bare(&self.bare) {
            for reference in remote.references().unwrap().flatten() {
                if let Some(tip) = reference.target()
                    && repo.find_commit(tip).is_ok()
                {
                    walk.hide(tip).unwrap();
                }
            }
        }
        let commits: Vec<git2::Commit<'_>> = walk
            .map(|c| repo.find_commit(c.unwrap()).unwrap())
            .collect();
        shapes(&repo, &commits)
    }

    fn landed(&mut self, sent: Sending) -> Result<(), TestCaseError> {
        self.figures.pushes += 1;
        self.figures.revert |= sent.revert;
        self.figures.repeated_tree |= sent.repeated_tree;
        self.figures.root_with_more |= sent.root_with_more;
        self.check_fsck()?;
        self.check_clone("main")
    }

    fn check_recovery(&self) -> Result<(), TestCaseError> {
        self.check_fsck()?;
        let head = git(&self.work, ["rev-parse", "HEAD"]);
        let refs = git(
            &self.bare,
            [
                "for-each-ref",
                "--format=%(objectname) %(refname)",
                "refs/heads/recovery/",
            ],
        );
        let Some(branch) = refs
            .lines()
            .find(|l| l.starts_with(head.trim()))
            .and_then(|l| l.split(' ').nth(1))
        else {
            return Err(TestCaseError::fail(format!(
                "no recovery branch on the remote holds HEAD {head}: {refs}"
            )));
        };
        self.check_clone(branch.trim_start_matches("refs/heads/"))
    }

    fn check_fsck(&self) -> Result<(), TestCaseError> {
        if !self.bare.exists() {
            return Ok(());
        }
        let out = git_output(&self.bare, ["fsck", "--full", "--strict", "--no-progress"]);
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success() && !said.contains("missing") && !said.contains("broken") {
            Ok(())
        } else {
            Err(TestCaseError::fail(format!(
                "git fsck on the remote:\n{said}"
            )))
        }
    }

    /// A fresh clone of `branch` (through upload-pack) holds the local `HEAD`'s tree.
    fn check_clone(&self, branch: &str) -> Result<(), TestCaseError> {
        let dir = self.tmp.path().join(format!("clone-{}", self.made));
        let out = git_output(
            self.tmp.path(),
            [
                "clone",
                "-q",
                "--no-local",
                "-b",
                branch,
                &format!("file://{}", self.bare.display()),
                dir.to_str().unwrap(),
            ],
        );
        if !out.status.success() {
            return Err(TestCaseError::fail(format!(
                "a fresh clone of {branch}: {}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        let theirs = git(&dir, ["rev-parse", "HEAD^{tree}"]);
        let ours = git(&self.work, ["rev-parse", "HEAD^{tree}"]);
        std::fs::remove_dir_all(&dir).unwrap();
        if theirs == ours {
            Ok(())
        } else {
            Err(TestCaseError::fail(format!(
                "the clone's tree {theirs} is not HEAD's {ours}"
            )))
        }
    }
}

/// Every file below `dir` with its bytes.
fn files_under(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return files;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(files_under(&path));
        } else if let Ok(body) = std::fs::read(&path) {
            files.push((path, body));
        }
    }
    files
}

/// What a set of commits holds: one bringing back a tree another of them has (a revert), a
/// subtree introduced twice (by two of them, or at two paths), a root among others.
fn shapes(repo: &Repository, commits: &[git2::Commit<'_>]) -> Sending {
    let mut trees: BTreeMap<Oid, usize> = BTreeMap::new();
    for c in commits {
        *trees.entry(c.tree_id()).or_default() += 1;
    }
    let revert = commits.iter().any(|c| {
        let introduced = c.parent(0).map_or(true, |p| p.tree_id() != c.tree_id());
        introduced && trees[&c.tree_id()] > 1
    });
    let mut introduced: BTreeMap<Oid, usize> = BTreeMap::new();
    for c in commits {
        let parent = c.parent(0).ok().map(|p| p.tree().unwrap());
        count_new_subtrees(repo, &c.tree().unwrap(), parent.as_ref(), &mut introduced);
    }
    Sending {
        revert,
        repeated_tree: introduced.values().any(|n| *n > 1),
        root_with_more: commits.len() > 1 && commits.iter().any(|c| c.parent_count() == 0),
    }
}

/// Counts the subtrees of `new` whose id differs from `old`'s entry of the same name.
fn count_new_subtrees(
    repo: &Repository,
    new: &git2::Tree<'_>,
    old: Option<&git2::Tree<'_>>,
    out: &mut BTreeMap<Oid, usize>,
) {
    for entry in new.iter() {
        if entry.kind() != Some(ObjectType::Tree) {
            continue;
        }
        let before = old.and_then(|o| o.get_name_bytes(entry.name_bytes()));
        if before.as_ref().is_some_and(|b| b.id() == entry.id()) {
            continue;
        }
        *out.entry(entry.id()).or_default() += 1;
        let subtree = repo.find_tree(entry.id()).unwrap();
        let old_subtree = before
            .filter(|b| b.kind() == Some(ObjectType::Tree))
            .map(|b| repo.find_tree(b.id()).unwrap());
        count_new_subtrees(repo, &subtree, old_subtree.as_ref(), out);
    }
}

fn knob(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn every_history_reaches_every_transport_whole() {
    project_watcher::transport::init(Duration::from_secs(5));
    let log = Log::default();
    let writer = log.clone();
    tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .init();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let serve = Serve::start();
    let cases = knob("WHOLE_REMOTE_CASES", 24) as u32;
    let for_secs = Duration::from_secs(knob("WHOLE_REMOTE_SECS", 0));
    let started = Instant::now();
    #[derive(Default)]
    struct Counts {
        cases: u64,
        reverts: u64,
        repeated: u64,
        roots: u64,
        pushes: u64,
        failed: u64,
        cut_off: u64,
        recovered: u64,
        transports: BTreeMap<String, u64>,
    }
    let counts = std::cell::RefCell::new(Counts::default());
    loop {
        let mut runner = TestRunner::new(ProptestConfig {
            cases,
            failure_persistence: None,
            ..ProptestConfig::default()
        });
        let outcome = runner.run(&case(), |(before, ops)| {
            let n = counts.borrow().cases as usize;
            let transport = [Transport::Http, Transport::Serve, Transport::Path][n % 3];
            let mut w = World::new(transport, &serve, n, &runtime);
            log.take();
            // Saves while there is no remote yet.
            for op in &before {
                w.apply(op)?;
                w.once(false).map_err(TestCaseError::fail)?;
            }
            for op in ops.iter().chain([Op::Push(Outcome::Lands)].iter()) {
                w.apply(op)?;
            }
            let said = log.take();
            let refused: Vec<&str> = said
                .lines()
                .filter(|l| l.contains("missing objects"))
                .collect();
            prop_assert!(
                refused.is_empty(),
                "a push was refused for missing objects: {refused:?}"
            );
            let f = w.figures;
            let mut c = counts.borrow_mut();
            c.cases += 1;
            c.reverts += u64::from(f.revert);
            c.repeated += u64::from(f.repeated_tree);
            c.roots += u64::from(f.root_with_more);
            c.pushes += f.pushes;
            c.failed += f.failed;
            c.cut_off += f.cut_off;
            c.recovered += f.recovered;
            *c.transports
                .entry(format!("{transport:?}").to_lowercase())
                .or_default() += 1;
            Ok(())
        });
        if let Err(e) = outcome {
            panic!("{e}");
        }
        if started.elapsed() >= for_secs {
            break;
        }
    }
    let c = counts.into_inner();
    let transports: Vec<String> = c
        .transports
        .iter()
        .map(|(t, n)| format!("{t}:{n}"))
        .collect();
    let report = format!(
        "RELIABILITY whole-remote: cases={} pushes_landed={} failed_pushes={} cut_off_mid_pack={} recovery_pushes={} cases_pushing_a_revert={} a_repeated_tree={} a_root_with_others={} transports={} seconds={}",
        c.cases,
        c.pushes,
        c.failed,
        c.cut_off,
        c.recovered,
        c.reverts,
        c.repeated,
        c.roots,
        transports.join(","),
        started.elapsed().as_secs()
    );
    println!("{report}");
    for (name, n) in [
        ("a revert", c.reverts),
        ("a repeated tree", c.repeated),
        ("a root commit pushed with others", c.roots),
    ] {
        assert!(
            n * 5 >= c.cases,
            "only {n} of {} cases had {name} (want 20 %)",
            c.cases
        );
    }
}
