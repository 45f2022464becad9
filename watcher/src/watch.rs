//! The watch stage: one non-recursive inotify watch per kept directory, turned into
//! [`Changes`] for the debounce.
//!
//! Ignored directories are never watched, so `npm install` into `node_modules` costs nothing.
//! A new directory is watched first and scanned after (by the stage), so a file created in it
//! before the watch is not missed. A queue overflow, a full channel or an unexpected error
//! asks for a full rescan: a change may be seen twice, never lost. When the kernel runs out
//! of watches, the directories left over are rescanned periodically instead.
//!
//! The inotify instance is the stage's own (`rustix`): a watch is one `inotify_add_watch`
//! made on the walking thread, with no event-loop thread to ask and wait for per directory,
//! and events are read from the descriptor by the stage's task. At start-up the walk that
//! watches is the first save's own ([`TreeWatcher::walker`], run by the save stage).
//!
//! The stage owns the ignore rules: each batch carries an immutable snapshot of them
//! ([`Rules`]), taken after the events that changed them were handled.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::ffi::OsStr;
use std::io;
use std::mem::MaybeUninit;
use std::ops::Bound;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::Receiver;
use std::time::Duration;

use rustix::fs::inotify::{self, ReadFlags, WatchFlags};
use shmastra_contract::MANIFEST_FILE;
use shmastra_contract::manifest::is_env_file_name;
use tokio::io::unix::AsyncFd;
use tokio::sync::{mpsc, oneshot, watch};

use crate::changes::Changes;
use crate::filter::{ENV_FILE, Filter, Listed, RuleWarning, Rules, RulesFile, TrackedIgnored};
use crate::scan;
use crate::stage::OwnIndex;

/// How often directories that could not be watched are scanned instead.
pub const UNWATCHED_RESCAN_EVERY: Duration = Duration::from_secs(10);

/// The files of the git directory whose change means the user's git moved `HEAD`, wrote the
/// index (a commit, a reset, `git rm --cached`: [`OwnIndex`] tells the watcher's own writes
/// apart) or began or ended an operation (see `user_git.rs`): a batch, so the watcher looks
/// again whether to pause, or saves what git left.
const GIT_STATE_FILES: &[&str] = &[
    "HEAD",
    INDEX_FILE,
    "MERGE_HEAD",
    "CHERRY_PICK_HEAD",
    "REVERT_HEAD",
    "BISECT_LOG",
    "rebase-merge",
    "rebase-apply",
    "sequencer",
];
/// The index file, in the git directory.
const INDEX_FILE: &str = "index";
/// A cap on directory watches below the kernel's `fs.inotify.max_user_watches`, so that the
/// fallback to periodic rescans can be exercised by tests (or inotify use bounded on a shared
/// host). It can only lower the limit: the kernel's still applies.
pub const MAX_WATCHES_ENV: &str = "PROJECT_WATCHER_MAX_WATCHES";

#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("cannot start inotify: {0}")]
    Start(io::Error),
}

/// Why a watch could not be added.
enum WatchFailure {
    /// The kernel's (or [`MAX_WATCHES_ENV`]'s) limit on watches.
    Limit,
    /// The path is gone.
    NotFound,
    Other(io::Error),
}

/// What a directory is watched for (a rules file: the same, on the file itself). `MODIFY`
/// already reports every write, so `CLOSE_WRITE` would only double the events.
fn watch_mask() -> WatchFlags {
    WatchFlags::ATTRIB
        | WatchFlags::CREATE
        | WatchFlags::DELETE
        | WatchFlags::MODIFY
        | WatchFlags::MOVED_FROM
        | WatchFlags::MOVED_TO
        | WatchFlags::DELETE_SELF
        | WatchFlags::MOVE_SELF
}

/// One inotify instance and the names its watches were added under: a directory of the
/// working tree by its relative path, a rules file outside it by its absolute path (one
/// allocation per name, shared by both maps and the stage's set). inotify watches inodes:
/// adding a watch on an inode already watched returns its descriptor, which then maps to
/// the newest name (as a rename needs).
struct Inotify {
    fd: AsyncFd<OwnedFd>,
    names: HashMap<i32, Arc<Path>>,
    watches: HashMap<Arc<Path>, i32>,
}

impl Inotify {
    /// Call it inside the tokio runtime (its reactor reads the descriptor).
    fn new() -> io::Result<Self> {
        let fd = inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK)?;
        // `AsyncFd::new` is deprecated for types whose descriptor safe code could close while
        // registered; an `OwnedFd` moved into the `AsyncFd` cannot be.
        #[allow(deprecated)]
        let fd = AsyncFd::new(fd)?;
        Ok(Self {
            fd,
            names: HashMap::new(),
            watches: HashMap::new(),
        })
    }

    fn watch(&mut self, name: &Arc<Path>, abs: &Path) -> Result<(), WatchFailure> {
        match inotify::add_watch(self.fd.get_ref(), abs, watch_mask()) {
            Ok(wd) => {
                self.names.insert(wd, Arc::clone(name));
                self.watches.insert(Arc::clone(name), wd);
                Ok(())
            }
            Err(rustix::io::Errno::NOSPC) => Err(WatchFailure::Limit),
            Err(rustix::io::Errno::NOENT) => Err(WatchFailure::NotFound),
            Err(e) => Err(WatchFailure::Other(e.into())),
        }
    }

    fn unwatch(&mut self, name: &Path) {
        if let Some(wd) = self.watches.remove(name) {
            self.names.remove(&wd);
            let _ = inotify::remove_watch(self.fd.get_ref(), wd);
        }
    }

    /// The kernel dropped a watch (its directory was deleted, or it was removed).
    fn forget(&mut self, wd: i32) {
        if let Some(name) = self.names.remove(&wd)
            && self.watches.get(&name) == Some(&wd)
        {
            self.watches.remove(&name);
        }
    }
}

/// One event as the kernel gives it.
struct Read {
    wd: i32,
    flags: ReadFlags,
    name: Option<PathBuf>,
}

/// Every event the kernel has queued (`EAGAIN` ends the read); a read error is an overflow
/// (a rescan).
fn read_events(fd: &OwnedFd, buf: &mut [MaybeUninit<u8>]) -> Vec<Read> {
    let mut events = Vec::new();
    let mut reader = inotify::Reader::new(fd, buf);
    loop {
        match reader.next() {
            Ok(event) => events.push(Read {
                wd: event.wd(),
                flags: event.events(),
                name: event
                    .file_name()
                    .map(|n| PathBuf::from(OsStr::from_bytes(n.to_bytes()))),
            }),
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => break,
            Err(e) => {
                tracing::warn!("reading file events failed, rescanning: {e}");
                events.push(Read {
                    wd: -1,
                    flags: ReadFlags::QUEUE_OVERFLOW,
                    name: None,
                });
                break;
            }
        }
    }
    events
}

/// One event as the stage reads it: a path, and whether it is gone from there.
enum Raw {
    Path { abs: PathBuf, gone: bool },
    Overflow,
}

pub struct TreeWatcher {
    workdir: PathBuf,
    git_dir: PathBuf,
    /// The ignore rules, owned here; a batch carries a snapshot.
    rules: Rules,
    inotify: Inotify,
    /// Raw events handled one by one per read; more than this at once is a forced rescan.
    event_buffer: usize,
    /// Kept directories with a live watch, relative to the working tree.
    watched: BTreeSet<Arc<Path>>,
    /// Kept directories the kernel refused a watch for.
    unwatched: BTreeSet<Arc<Path>>,
    limit_reported: bool,
    /// From [`MAX_WATCHES_ENV`].
    max_watches: Option<usize>,
    problems: watch::Sender<Option<String>>,
    /// Tracked paths the rules ignore, as the save stage last found them: their directories
    /// are watched too.
    tracked_ignored: Arc<TrackedIgnored>,
    tracked_ignored_rx: watch::Receiver<Arc<TrackedIgnored>>,
    /// Where `.env` points when it is a symlink: edits there are edits to `.env`.
    env_target: Option<PathBuf>,
    /// `.git/info` or `core.excludesFile` did not exist when last watched.
    rule_files_absent: bool,
    /// The index file as the save stage last read or wrote it.
    own_index: OwnIndex,
}

impl TreeWatcher {
    /// The stage with the repository's exclude files watched and no directory yet: the first
    /// save's walk ([`TreeWatcher::start_walker`]) watches them.
    /// Call it inside the tokio runtime (its reactor reads the inotify descriptor).
    pub fn new(
        workdir: &Path,
        git_dir: &Path,
        filter: Filter,
        problems: watch::Sender<Option<String>>,
        tracked_ignored: watch::Receiver<Arc<TrackedIgnored>>,
        event_buffer: usize,
        own_index: OwnIndex,
    ) -> Result<Self, WatchError> {
        let tracked_now = Arc::clone(&*tracked_ignored.borrow());
        let mut this = Self {
            workdir: workdir.to_owned(),
            git_dir: git_dir.to_owned(),
            rules: Rules::new(filter),
            inotify: Inotify::new().map_err(WatchError::Start)?,
            event_buffer: event_buffer.max(1),
            watched: BTreeSet::new(),
            unwatched: BTreeSet::new(),
            limit_reported: false,
            max_watches: std::env::var(MAX_WATCHES_ENV)
                .ok()
                .and_then(|v| v.trim().parse().ok()),
            problems,
            tracked_ignored: tracked_now,
            tracked_ignored_rx: tracked_ignored,
            env_target: None,
            rule_files_absent: false,
            own_index,
        };
        this.watch_rule_files();
        Ok(this)
    }

    /// How many directories have a watch (not counting the rule files').
    pub fn watched_dirs(&self) -> usize {
        self.watched.len()
    }

    /// The rules as they are now.
    pub fn rules(&self) -> Rules {
        self.rules.clone()
    }

    /// Forwards changes until `stop` fires or `out` closes, then drops every watch. Returns
    /// the rules as they are at the end (the last save's).
    pub async fn run(
        mut self,
        out: mpsc::Sender<Changes>,
        mut stop: oneshot::Receiver<()>,
    ) -> Rules {
        let mut buf = vec![MaybeUninit::<u8>::uninit(); 64 * 1024];
        let mut rescan = tokio::time::interval(UNWATCHED_RESCAN_EVERY);
        rescan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        rescan.reset();
        let mut tracked_open = true;
        loop {
            let mut changes = Changes::default();
            tokio::select! {
                _ = &mut stop => return self.final_rules(),
                ready = self.inotify.fd.readable() => {
                    let Ok(mut guard) = ready else { return self.rules };
                    let read = read_events(guard.get_inner(), &mut buf);
                    guard.clear_ready();
                    let events = self.resolve(read);
                    if events.len() > self.event_buffer {
                        tracing::warn!("too many events at once; rescanning the whole project");
                        self.rescan_all(&mut changes);
                    } else {
                        for event in events {
                            self.handle(event, &mut changes);
                        }
                    }
                }
                _ = rescan.tick(), if !self.unwatched.is_empty() => {
                    let dirs = std::mem::take(&mut self.unwatched);
                    for dir in dirs {
                        self.reconcile(&dir);
                        changes.subtrees.insert(dir.to_path_buf());
                    }
                }
                changed = self.tracked_ignored_rx.changed(), if tracked_open => {
                    match changed {
                        Ok(()) => {
                            self.tracked_ignored = Arc::clone(&self.tracked_ignored_rx.borrow_and_update());
                            changes.subtrees.extend(self.reconcile(Path::new("")));
                        }
                        Err(_) => tracked_open = false,
                    }
                }
            }
            if !changes.is_empty() {
                // A rules file that did not exist is looked for with each batch, not on a
                // timer (an idle watcher wakes for nothing): it matters only to a save. What
                // can be missing is `core.excludesFile` (the watcher makes `info/` at start),
                // last in git's order: it can ignore more, but un-ignore no directory that
                // would then lack a watch.
                if self.rule_files_absent && !self.rule_files_missing() {
                    // Created since it was last looked for: this batch is judged by it already.
                    tracing::info!("an ignore rules file appeared; rescanning the whole project");
                    self.watch_rule_files();
                    self.rescan_all(&mut changes);
                }
                changes.rules = Some(self.rules.clone());
                if out.send(changes).await.is_err() {
                    return self.rules;
                }
            }
        }
    }

    /// The rules for the last save: the repository's files read again, so one created or
    /// edited since the last event (or the last periodic look) applies too.
    fn final_rules(mut self) -> Rules {
        let warnings = self.rules.make_mut().reload_repo_rules();
        report_rule_warnings(&warnings);
        self.rules
    }

    /// Events as paths, from the names their watches were added under.
    fn resolve(&mut self, read: Vec<Read>) -> Vec<Raw> {
        let mut events = Vec::with_capacity(read.len());
        for Read { wd, flags, name } in read {
            if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
                events.push(Raw::Overflow);
                continue;
            }
            if flags.contains(ReadFlags::IGNORED) {
                self.inotify.forget(wd);
                continue;
            }
            let Some(dir) = self.inotify.names.get(&wd) else {
                continue;
            };
            // A relative name is a directory of the working tree.
            let dir = self.workdir.join(dir);
            let abs = match name {
                Some(name) => dir.join(name),
                None => dir,
            };
            // A directory removed or renamed away, or a name in a directory gone or moved.
            let gone = flags.intersects(
                ReadFlags::DELETE
                    | ReadFlags::MOVED_FROM
                    | ReadFlags::DELETE_SELF
                    | ReadFlags::MOVE_SELF,
            );
            events.push(Raw::Path { abs, gone });
        }
        events
    }

    fn handle(&mut self, event: Raw, changes: &mut Changes) {
        match event {
            Raw::Overflow => {
                tracing::warn!("the kernel dropped file events; rescanning the whole project");
                self.rescan_all(changes);
            }
            Raw::Path { abs, gone } => self.handle_path(&abs, gone, changes),
        }
    }

    fn handle_path(&mut self, abs: &Path, gone: bool, changes: &mut Changes) {
        if abs.parent() == Some(self.git_dir.as_path()) {
            let name = abs.file_name().and_then(|n| n.to_str());
            if name.is_some_and(|n| GIT_STATE_FILES.contains(&n))
                && (name != Some(INDEX_FILE) || self.own_index.written_elsewhere(abs))
            {
                changes.git_state = true;
            }
            return;
        }
        let rel = abs.strip_prefix(&self.workdir).ok();
        if self.env_target.as_deref() == Some(abs) {
            changes.env_changed = true;
            // An editor may have replaced the file: watch the new one.
            self.watch_rule_files();
            if rel.is_none() {
                return;
            }
        }
        let rules = self.rules.filter.rules_file(rel, abs);
        match rules {
            Some(RulesFile::Repo) => {
                let warnings = self.rules.make_mut().reload_repo_rules();
                report_rule_warnings(&warnings);
                self.watch_rule_files();
                return self.rescan_all(changes);
            }
            Some(RulesFile::Dir(dir)) => {
                if self.watched.contains(dir.as_path()) || self.unwatched.contains(dir.as_path()) {
                    self.reconcile(&dir);
                    changes.subtrees.insert(dir);
                }
                return;
            }
            None => {}
        }
        let Some(rel) = rel else { return };
        if rel.starts_with(".git") {
            return;
        }
        if let Some(repo) = nested_repo_of(rel) {
            // A commit, checkout or clone in a nested repository, or its `.git` appearing or
            // going: the stage decides what the directory is now (gitlink or loose files).
            if rel.parent() == Some(repo.as_path()) && self.watched.contains(repo.as_path()) {
                self.reconcile(&repo);
                changes.subtrees.insert(repo);
            } else {
                changes.paths.insert(repo);
            }
            return;
        }
        if rel.parent() == Some(Path::new("")) && rel.to_str().is_some_and(is_env_file_name) {
            changes.env_changed = true;
            if rel == Path::new(ENV_FILE) {
                self.watch_rule_files();
            }
            return;
        }
        if rel == Path::new(MANIFEST_FILE) {
            // Deleted or edited by hand: rewritten from `.env` (only when it differs).
            changes.env_changed = true;
        }
        let was_watched = self.watched.contains(rel);
        if gone {
            self.forget_below(rel);
        }
        let meta = std::fs::symlink_metadata(abs).ok();
        let is_dir = meta.as_ref().is_some_and(|m| m.is_dir());
        let filter = &self.rules.filter;
        let kept = filter.is_kept(rel, is_dir || was_watched) || self.tracked_ignored.contains(rel);
        let holds_tracked = self.tracked_ignored.holds(rel);
        if is_dir && (kept || holds_tracked) {
            if !self.watched.contains(rel) {
                self.reconcile(rel);
                changes.subtrees.insert(rel.to_owned());
            }
            return;
        }
        if self.watched.contains(rel) || meta.is_none() {
            self.forget_below(rel);
        }
        if kept || holds_tracked {
            changes.paths.insert(rel.to_owned());
        }
    }

    /// Re-reads rules and watches every kept directory again, then asks for a full pass.
    /// After an overflow the events that moved directories are lost, so every directory is
    /// watched again by name (see [`TreeWatcher::reconcile_with`]).
    fn rescan_all(&mut self, changes: &mut Changes) {
        let warnings = self.rules.make_mut().reload_repo_rules();
        report_rule_warnings(&warnings);
        self.reconcile_with(Path::new(""), true);
        changes.merge(Changes::everything());
    }

    fn reconcile(&mut self, dir: &Path) -> Vec<PathBuf> {
        self.reconcile_with(dir, false)
    }

    /// Makes the watches under `dir` exactly its kept directories, loading their rules.
    /// Each directory is watched before it is read, so nothing created meanwhile is missed.
    /// Returns the directories that got a watch they did not have.
    ///
    /// inotify watches inodes, and a watch maps to the name it was added under: `again`
    /// re-adds the watch of every directory (a directory whose inode moved to another name
    /// gets its name right).
    fn reconcile_with(&mut self, dir: &Path, again: bool) -> Vec<PathBuf> {
        let workdir = self.workdir.clone();
        let mut walker = self.walker(dir, again);
        scan::walk(&workdir, dir, false, &mut walker, &mut scan::NoEntries);
        walker.finish()
    }

    /// The directory side of a walk from `dir` that makes the watches under it exactly its
    /// kept directories and loads their rules ([`scan::walk`], then [`Walker::finish`]); the
    /// start-up save walks with [`TreeWatcher::start_walker`].
    fn walker(&mut self, dir: &Path, again: bool) -> Walker<'_> {
        self.walker_with(dir, again, true)
    }

    /// Makes the tables of watched directories again, every name a new allocation of the
    /// calling thread. The start-up walk made them on its own thread among its listings, which
    /// the stage frees: as long as any of the walk's allocations lives among that freed
    /// memory, the allocator cannot hand the pages back (a quiet watcher at 100k tracked
    /// files measured 7.7 MiB more anonymous memory).
    fn rebuild_tables(&mut self) {
        let mut renewed: HashMap<Arc<Path>, Arc<Path>> = HashMap::new();
        let mut renew = |name: &Arc<Path>| {
            Arc::clone(
                renewed
                    .entry(Arc::clone(name))
                    .or_insert_with(|| Arc::from(&**name)),
            )
        };
        self.watched = self.watched.iter().map(&mut renew).collect();
        self.unwatched = self.unwatched.iter().map(&mut renew).collect();
        self.inotify.names = (self.inotify.names.iter())
            .map(|(wd, name)| (*wd, renew(name)))
            .collect();
        self.inotify.watches = (self.inotify.watches.iter())
            .map(|(name, wd)| (renew(name), *wd))
            .collect();
    }

    /// The walker of the start-up pass (every watch is new: none is reported as added).
    pub fn start_walker(&mut self) -> Walker<'_> {
        self.walker_with(Path::new(""), false, false)
    }

    fn walker_with(&mut self, dir: &Path, again: bool, report_added: bool) -> Walker<'_> {
        // One new version of the rules for the whole walk.
        self.rules.make_mut();
        Walker {
            watcher: self,
            start: dir.to_owned(),
            again,
            kept: HashSet::new(),
            state: WalkState {
                report_added,
                added: Vec::new(),
                visited: Vec::new(),
                limit_hit: None,
            },
            warnings: Vec::new(),
        }
    }

    /// Watches one kept directory (or re-adds its watch, `again`); returns the name it is
    /// known by when it is watched or waits for a watch.
    fn watch_dir(&mut self, rel: &Path, again: bool, walk: &mut WalkState) -> Option<Arc<Path>> {
        if let Some(name) = self.watched.get(rel).cloned() {
            if again {
                let _ = self.inotify.watch(&name, &self.workdir.join(rel));
                walk.visited.push(Arc::clone(&name));
            }
            return Some(name);
        }
        self.unwatched.remove(rel);
        let name: Arc<Path> = Arc::from(rel);
        let capped = self
            .max_watches
            .is_some_and(|cap| self.watched.len() >= cap);
        let watched = if capped {
            Err(WatchFailure::Limit)
        } else {
            self.inotify.watch(&name, &self.workdir.join(rel))
        };
        match watched {
            Ok(()) => {
                self.watched.insert(Arc::clone(&name));
                if walk.report_added {
                    walk.added.push(rel.to_owned());
                }
                walk.visited.push(Arc::clone(&name));
            }
            Err(WatchFailure::Limit) => {
                self.unwatched.insert(Arc::clone(&name));
                walk.limit_hit.get_or_insert_with(|| rel.to_owned());
            }
            Err(WatchFailure::NotFound) => return None,
            Err(WatchFailure::Other(e)) => {
                tracing::warn!(dir = %rel.display(), "cannot watch directory, it is rescanned periodically instead: {e}");
                self.unwatched.insert(Arc::clone(&name));
            }
        }
        Some(name)
    }

    /// A directory that was removed, renamed away or became ignored: drop its watches and
    /// those of everything under it (inotify already dropped the ones of removed inodes).
    fn forget_below(&mut self, rel: &Path) {
        let below: Vec<Arc<Path>> = self.subtree_of(rel).collect();
        for path in below {
            self.unwatch(&path);
        }
        if self.rules.filter.has_rules_below(rel) {
            self.rules.make_mut().forget_below(rel);
        }
    }

    /// Watched and unwatched directories at or below `dir`. Paths order by components, so a
    /// subtree is one contiguous range of each set: no walk over every watch.
    fn subtree_of<'a>(&'a self, dir: &'a Path) -> impl Iterator<Item = Arc<Path>> + 'a {
        [&self.watched, &self.unwatched]
            .into_iter()
            .flat_map(move |set| {
                set.range::<Path, _>((Bound::Included(dir), Bound::Unbounded))
                    .take_while(move |w| w.starts_with(dir))
                    .cloned()
            })
    }

    fn unwatch(&mut self, rel: &Path) {
        if self.watched.remove(rel) {
            self.inotify.unwatch(rel);
        }
        self.unwatched.remove(rel);
    }

    /// Whether `.git/info` or `core.excludesFile` does not exist (yet): checked again with
    /// every batch, so one created after start applies.
    fn rule_files_missing(&self) -> bool {
        !self.info_dir().is_dir()
            || self
                .rules
                .filter
                .excludes_file()
                .is_some_and(|f| !f.exists())
    }

    /// The folder of `info/exclude` (in the common directory, for a linked worktree).
    fn info_dir(&self) -> PathBuf {
        let exclude = crate::layout::info_exclude(&self.git_dir);
        exclude.parent().map(Path::to_owned).unwrap_or(exclude)
    }

    /// `.git/info` (for `exclude`), `core.excludesFile` and the target of a symlinked `.env`:
    /// a change re-reads the rules (or the manifest); the git directory itself, for the
    /// user's git ([`GIT_STATE_FILES`]).
    fn watch_rule_files(&mut self) {
        let info = self.info_dir();
        let excludes = self.rules.filter.excludes_file().map(Path::to_owned);
        let env = self.workdir.join(ENV_FILE);
        self.env_target = std::fs::symlink_metadata(&env)
            .is_ok_and(|m| m.file_type().is_symlink())
            .then(|| env.canonicalize().ok())
            .flatten();
        let env_target = self.env_target.clone();
        self.rule_files_absent = self.rule_files_missing();
        let git_dir = self.git_dir.clone();
        for path in [git_dir, info]
            .into_iter()
            .chain(excludes)
            .chain(env_target)
        {
            if path.exists() {
                self.inotify.unwatch(&path);
                match self.inotify.watch(&Arc::from(path.as_path()), &path) {
                    Ok(()) => {}
                    Err(WatchFailure::Limit) => {
                        tracing::warn!(path = %path.display(), "cannot watch ignore rules file (the watch limit is reached); edits to it apply at the next rescan")
                    }
                    Err(WatchFailure::NotFound) => {}
                    Err(WatchFailure::Other(e)) => {
                        tracing::warn!(path = %path.display(), "cannot watch ignore rules file; edits to it apply at the next rescan: {e}")
                    }
                }
            }
        }
    }

    fn watch_limit_reached(&mut self, at: Option<&Path>) {
        if let Some(rel) = at
            && !self.watched.contains(rel)
        {
            self.unwatched.insert(Arc::from(rel));
        }
        if self.limit_reported {
            return;
        }
        self.limit_reported = true;
        let limit = std::fs::read_to_string("/proc/sys/fs/inotify/max_user_watches")
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| "unknown".to_owned());
        let limit = match self.max_watches {
            Some(cap) => {
                format!("{MAX_WATCHES_ENV} = {cap}, fs.inotify.max_user_watches = {limit}")
            }
            None => format!("fs.inotify.max_user_watches = {limit}"),
        };
        let message = format!(
            "the kernel's inotify watch limit ({limit}) is reached: \
             directories without a watch are rescanned every {}s instead; raise the limit \
             (sysctl fs.inotify.max_user_watches=...) to save changes at once",
            UNWATCHED_RESCAN_EVERY.as_secs()
        );
        tracing::error!("{message}");
        self.problems.send_replace(Some(message));
    }
}

/// What one watching walk has done so far.
struct WalkState {
    /// Whether `added` is wanted (not at start-up, where every watch is new).
    report_added: bool,
    added: Vec<PathBuf>,
    visited: Vec<Arc<Path>>,
    limit_hit: Option<PathBuf>,
}

/// The start-up walk on a thread of its own ([`scan::walk_listings`]): it watches every
/// directory and loads the rules on the way down, sending each listing to the save thread,
/// which reads the index meanwhile and then compares the listings with it
/// ([`scan::stage_listings`]). Every watch is set whatever the save does with the listings.
pub struct WalkAhead {
    /// Each directory's listing, as the walk reads it.
    pub listings: Receiver<Vec<scan::Listing>>,
    /// The walk itself.
    pub walking: Walking,
}

/// The start-up walk under way, holding the watcher.
pub struct Walking(Receiver<Box<TreeWatcher>>);

impl WalkAhead {
    /// Starts the walk with `watcher`, which comes back from [`Walking::finish`], on the
    /// runtime's blocking pool: its thread is already there (the manifest's write started it),
    /// where a thread of its own would run glibc's thread start and exit and a new arena, code
    /// a quiet watcher keeps resident (0.6 MiB at 2k tracked files). Call it inside the
    /// tokio runtime.
    pub fn start(mut watcher: Box<TreeWatcher>) -> Self {
        let (sender, listings) = scan::listings_channel();
        let (done, walking) = std::sync::mpsc::sync_channel(1);
        tokio::task::spawn_blocking(move || {
            let workdir = watcher.workdir.clone();
            let mut walker = watcher.start_walker();
            scan::walk_listings(&workdir, &mut walker, &sender);
            walker.finish();
            let _ = done.send(watcher);
        });
        Self {
            listings,
            walking: Walking(walking),
        }
    }
}

impl Walking {
    /// Waits for the walk to end (every watch set) and returns the watcher, its rules loaded
    /// and its tables of watched directories made again on the calling thread.
    pub fn finish(self) -> Box<TreeWatcher> {
        let mut watcher = self.0.recv().expect("the start-up walk does not panic");
        watcher.rebuild_tables();
        watcher
    }
}

/// The watch stage's side of a walk ([`scan::Dirs`]): each directory is watched before it is
/// read, and its `.gitignore` loaded once it is.
pub struct Walker<'a> {
    watcher: &'a mut TreeWatcher,
    start: PathBuf,
    again: bool,
    /// Directories the walk entered (and nested repositories' `.git`) that are watched or
    /// wait for a watch, by the name the stage keeps (no copy of the path).
    kept: HashSet<Arc<Path>>,
    state: WalkState,
    warnings: Vec<RuleWarning>,
}

impl scan::Dirs for Walker<'_> {
    fn rules(&self) -> &Filter {
        &self.watcher.rules.filter
    }

    fn enter(&mut self, dir: &Path) {
        if let Some(name) = self.watcher.watch_dir(dir, self.again, &mut self.state) {
            self.kept.insert(name);
        }
    }

    fn load_rules(&mut self, dir: &Path, gitignore: Listed) {
        // `walker` made the rules this stage's own for the walk: no copy here.
        let filter = Arc::make_mut(&mut self.watcher.rules.filter);
        self.warnings.extend(filter.load_listed(dir, gitignore));
    }

    fn watching(&self) -> bool {
        true
    }

    fn holds_tracked_ignored(&self, dir: &Path) -> bool {
        self.watcher.tracked_ignored.holds(dir)
    }
}

impl Walker<'_> {
    /// Drops the watches of directories under the walk's start that it no longer found kept,
    /// and reports what the walk met. Returns the directories that got a watch they did not
    /// have.
    ///
    /// Removing the watch of a name that is gone may remove the watch its inode has under a
    /// new name too, so the directories watched in this walk are watched once more after that.
    pub fn finish(self) -> Vec<PathBuf> {
        let Walker {
            watcher,
            start,
            kept,
            state:
                WalkState {
                    added,
                    visited,
                    limit_hit,
                    ..
                },
            warnings,
            ..
        } = self;
        let gone: Vec<Arc<Path>> = watcher
            .subtree_of(&start)
            .filter(|w| !kept.contains(w))
            .collect();
        for path in &gone {
            watcher.unwatch(path);
        }
        if !gone.is_empty() {
            let filter = Arc::make_mut(&mut watcher.rules.filter);
            for path in &gone {
                filter.forget_below(path);
            }
            for name in &visited {
                let _ = watcher.inotify.watch(name, &watcher.workdir.join(name));
            }
        }
        report_rule_warnings(&warnings);
        if let Some(first) = limit_hit {
            watcher.watch_limit_reached(Some(&first));
        }
        added
    }
}

/// The nested repository a path in its `.git` belongs to: `a/b` for `a/b/.git/HEAD`.
fn nested_repo_of(rel: &Path) -> Option<PathBuf> {
    let mut repo = PathBuf::new();
    for component in rel.components() {
        if component.as_os_str() == ".git" {
            return (!repo.as_os_str().is_empty()).then_some(repo);
        }
        repo.push(component);
    }
    None
}

pub fn report_rule_warnings(warnings: &[crate::filter::RuleWarning]) {
    for w in warnings {
        tracing::warn!("ignore rules: {}", w.0);
    }
}
