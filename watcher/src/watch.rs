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
//! and events are read from the descriptor by the stage's task.

use std::collections::{BTreeSet, HashMap};
use std::ffi::OsStr;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustix::fs::inotify::{self, ReadFlags, WatchFlags};
use shmastra_contract::MANIFEST_FILE;
use shmastra_contract::manifest::is_env_file_name;
use tokio::io::unix::AsyncFd;
use tokio::sync::{Notify, mpsc, oneshot, watch};

use crate::changes::Changes;
use crate::filter::{ENV_FILE, Filter, RulesFile};
use crate::scan;

/// How often directories that could not be watched are scanned instead.
pub const UNWATCHED_RESCAN_EVERY: Duration = Duration::from_secs(10);
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

/// One inotify instance and the names its watches were added under. inotify watches inodes:
/// adding a watch on an inode already watched returns its descriptor, which then maps to
/// the newest name (as a rename needs).
struct Inotify {
    fd: AsyncFd<OwnedFd>,
    names: HashMap<i32, PathBuf>,
    watches: HashMap<PathBuf, i32>,
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

    fn watch(&mut self, abs: &Path) -> Result<(), WatchFailure> {
        match inotify::add_watch(self.fd.get_ref(), abs, watch_mask()) {
            Ok(wd) => {
                self.names.insert(wd, abs.to_owned());
                self.watches.insert(abs.to_owned(), wd);
                Ok(())
            }
            Err(rustix::io::Errno::NOSPC) => Err(WatchFailure::Limit),
            Err(rustix::io::Errno::NOENT) => Err(WatchFailure::NotFound),
            Err(e) => Err(WatchFailure::Other(e.into())),
        }
    }

    fn unwatch(&mut self, abs: &Path) {
        if let Some(wd) = self.watches.remove(abs) {
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
    filter: Arc<RwLock<Filter>>,
    inotify: Inotify,
    /// Raw events handled one by one per read; more than this at once is a forced rescan.
    event_buffer: usize,
    /// Kept directories with a live watch, relative to the working tree.
    watched: BTreeSet<PathBuf>,
    /// Kept directories the kernel refused a watch for.
    unwatched: BTreeSet<PathBuf>,
    limit_reported: bool,
    /// From [`MAX_WATCHES_ENV`].
    max_watches: Option<usize>,
    problems: watch::Sender<Option<String>>,
    /// The stage found tracked ignored paths appear or go: their directories are re-watched.
    tracked_ignored_changed: Arc<Notify>,
    /// Where `.env` points when it is a symlink: edits there are edits to `.env`.
    env_target: Option<PathBuf>,
    /// `.git/info` or `core.excludesFile` did not exist when last watched.
    rule_files_absent: bool,
}

impl TreeWatcher {
    /// Watches every kept directory (loading the ignore rules on the way down) plus the
    /// repository's exclude files. Blocking: call it from `spawn_blocking`.
    pub fn start(
        workdir: &Path,
        git_dir: &Path,
        filter: Arc<RwLock<Filter>>,
        problems: watch::Sender<Option<String>>,
        tracked_ignored_changed: Arc<Notify>,
        event_buffer: usize,
    ) -> Result<Self, WatchError> {
        let mut this = Self {
            workdir: workdir.to_owned(),
            git_dir: git_dir.to_owned(),
            filter,
            inotify: Inotify::new().map_err(WatchError::Start)?,
            event_buffer: event_buffer.max(1),
            watched: BTreeSet::new(),
            unwatched: BTreeSet::new(),
            limit_reported: false,
            max_watches: std::env::var(MAX_WATCHES_ENV)
                .ok()
                .and_then(|v| v.trim().parse().ok()),
            problems,
            tracked_ignored_changed,
            env_target: None,
            rule_files_absent: false,
        };
        this.watch_rule_files();
        this.reconcile(Path::new(""));
        Ok(this)
    }

    /// How many directories have a watch (not counting the rule files').
    pub fn watched_dirs(&self) -> usize {
        self.watched.len()
    }

    /// Forwards changes until `stop` fires or `out` closes, then drops every watch.
    pub async fn run(mut self, out: mpsc::Sender<Changes>, mut stop: oneshot::Receiver<()>) {
        let mut buf = vec![MaybeUninit::<u8>::uninit(); 64 * 1024];
        let mut rescan = tokio::time::interval(UNWATCHED_RESCAN_EVERY);
        rescan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        rescan.reset();
        loop {
            let mut changes = Changes::default();
            tokio::select! {
                _ = &mut stop => return,
                ready = self.inotify.fd.readable() => {
                    let Ok(mut guard) = ready else { return };
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
                _ = rescan.tick(), if !self.unwatched.is_empty() || self.rule_files_absent => {
                    if self.rule_files_absent && !self.rule_files_missing() {
                        tracing::info!("an ignore rules file appeared; rescanning the whole project");
                        self.watch_rule_files();
                        self.rescan_all(&mut changes);
                    }
                    let dirs = std::mem::take(&mut self.unwatched);
                    for dir in dirs {
                        self.reconcile(&dir);
                        changes.subtrees.insert(dir);
                    }
                }
                () = self.tracked_ignored_changed.notified() => {
                    changes.subtrees.extend(self.reconcile(Path::new("")));
                }
            }
            if !changes.is_empty() && out.send(changes).await.is_err() {
                return;
            }
        }
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
            let abs = match name {
                Some(name) => dir.join(name),
                None => dir.clone(),
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
        let rel = abs.strip_prefix(&self.workdir).ok();
        if self.env_target.as_deref() == Some(abs) {
            changes.env_changed = true;
            // An editor may have replaced the file: watch the new one.
            self.watch_rule_files();
            if rel.is_none() {
                return;
            }
        }
        let rules = self.read_filter().rules_file(rel, abs);
        match rules {
            Some(RulesFile::Repo) => {
                let warnings = self.write_filter().reload_repo_rules();
                report_rule_warnings(&warnings);
                self.watch_rule_files();
                return self.rescan_all(changes);
            }
            Some(RulesFile::Dir(dir)) => {
                if self.watched.contains(&dir) || self.unwatched.contains(&dir) {
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
            if rel.parent() == Some(repo.as_path()) && self.watched.contains(&repo) {
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
        let (kept, watch_it) = {
            let filter = self.read_filter();
            let kept = filter.is_kept(rel, is_dir || was_watched) || filter.is_tracked_ignored(rel);
            (kept, kept || filter.holds_tracked_ignored(rel))
        };
        if is_dir && watch_it {
            if !self.watched.contains(rel) {
                self.reconcile(rel);
                changes.subtrees.insert(rel.to_owned());
            }
            return;
        }
        if self.watched.contains(rel) || meta.is_none() {
            self.forget_below(rel);
        }
        if kept || self.read_filter().holds_tracked_ignored(rel) {
            changes.paths.insert(rel.to_owned());
        }
    }

    /// Re-reads rules and watches every kept directory again, then asks for a full pass.
    /// After an overflow the events that moved directories are lost, so every directory is
    /// watched again by name (see [`TreeWatcher::reconcile_with`]).
    fn rescan_all(&mut self, changes: &mut Changes) {
        let warnings = self.write_filter().reload_repo_rules();
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
    /// inotify watches inodes, and notify maps each watch to the name it was added under:
    /// `again` re-adds the watch of every directory (a directory whose inode moved to another
    /// name gets its name right). Removing the watch of a name that is gone may remove the
    /// watch its inode has under a new name too, so the directories watched in this pass are
    /// watched once more after that.
    fn reconcile_with(&mut self, dir: &Path, again: bool) -> Vec<PathBuf> {
        let mut added = Vec::new();
        let mut visited = Vec::new();
        let mut warnings = Vec::new();
        let filter = Arc::clone(&self.filter);
        let mut filter = filter.write().unwrap_or_else(|e| e.into_inner());
        let mut limit_hit = None;
        let kept = scan::kept_dirs(&self.workdir, dir, &mut filter, &mut warnings, |rel| {
            if self.watched.contains(rel) {
                if again {
                    let _ = self.inotify.watch(&self.workdir.join(rel));
                    visited.push(rel.to_owned());
                }
                return;
            }
            self.unwatched.remove(rel);
            let capped = self
                .max_watches
                .is_some_and(|cap| self.watched.len() >= cap);
            let watched = if capped {
                Err(WatchFailure::Limit)
            } else {
                self.inotify.watch(&self.workdir.join(rel))
            };
            match watched {
                Ok(()) => {
                    self.watched.insert(rel.to_owned());
                    added.push(rel.to_owned());
                    visited.push(rel.to_owned());
                }
                Err(WatchFailure::Limit) => {
                    self.unwatched.insert(rel.to_owned());
                    limit_hit.get_or_insert_with(|| rel.to_owned());
                }
                Err(WatchFailure::NotFound) => {}
                Err(WatchFailure::Other(e)) => {
                    tracing::warn!(dir = %rel.display(), "cannot watch directory, it is rescanned periodically instead: {e}");
                    self.unwatched.insert(rel.to_owned());
                }
            }
        });
        let kept: BTreeSet<PathBuf> = kept.into_iter().collect();
        let gone: Vec<PathBuf> = self.subtree_of(dir).filter(|w| !kept.contains(w)).collect();
        for path in &gone {
            self.unwatch(path);
            filter.forget_below(path);
        }
        if !gone.is_empty() {
            for rel in &visited {
                let _ = self.inotify.watch(&self.workdir.join(rel));
            }
        }
        drop(filter);
        report_rule_warnings(&warnings);
        if let Some(first) = limit_hit {
            self.watch_limit_reached(Some(&self.workdir.join(first)));
        }
        added
    }

    /// A directory that was removed, renamed away or became ignored: drop its watches and
    /// those of everything under it (inotify already dropped the ones of removed inodes).
    fn forget_below(&mut self, rel: &Path) {
        let below: Vec<PathBuf> = self.subtree_of(rel).collect();
        for path in below {
            self.unwatch(&path);
        }
        self.write_filter().forget_below(rel);
    }

    /// Watched and unwatched directories at or below `dir`. Paths order by components, so a
    /// subtree is one contiguous range of each set: no walk over every watch.
    fn subtree_of<'a>(&'a self, dir: &'a Path) -> impl Iterator<Item = PathBuf> + 'a {
        [&self.watched, &self.unwatched]
            .into_iter()
            .flat_map(move |set| {
                set.range(dir.to_owned()..)
                    .take_while(move |w| w.starts_with(dir))
                    .cloned()
            })
    }

    fn unwatch(&mut self, rel: &Path) {
        if self.watched.remove(rel) {
            self.inotify.unwatch(&self.workdir.join(rel));
        }
        self.unwatched.remove(rel);
    }

    /// Whether `.git/info` or `core.excludesFile` does not exist (yet): checked again at
    /// every periodic rescan, so one created after start applies.
    fn rule_files_missing(&self) -> bool {
        !self.git_dir.join("info").is_dir()
            || self
                .read_filter()
                .excludes_file()
                .is_some_and(|f| !f.exists())
    }

    /// `.git/info` (for `exclude`), `core.excludesFile` and the target of a symlinked `.env`:
    /// a change re-reads the rules (or the manifest).
    fn watch_rule_files(&mut self) {
        let info = self.git_dir.join("info");
        let excludes = self.read_filter().excludes_file().map(Path::to_owned);
        let env = self.workdir.join(ENV_FILE);
        self.env_target = std::fs::symlink_metadata(&env)
            .is_ok_and(|m| m.file_type().is_symlink())
            .then(|| env.canonicalize().ok())
            .flatten();
        let env_target = self.env_target.clone();
        self.rule_files_absent = self.rule_files_missing();
        for path in std::iter::once(info).chain(excludes).chain(env_target) {
            if path.exists() {
                self.inotify.unwatch(&path);
                match self.inotify.watch(&path) {
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
        if let Some(path) = at
            && let Ok(rel) = path.strip_prefix(&self.workdir)
            && !self.watched.contains(rel)
        {
            self.unwatched.insert(rel.to_owned());
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

    fn read_filter(&self) -> std::sync::RwLockReadGuard<'_, Filter> {
        self.filter.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_filter(&self) -> std::sync::RwLockWriteGuard<'_, Filter> {
        self.filter.write().unwrap_or_else(|e| e.into_inner())
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
