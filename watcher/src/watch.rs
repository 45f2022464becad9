//! The watch stage: one non-recursive inotify watch per kept directory, turned into
//! [`Changes`] for the debounce.
//!
//! Ignored directories are never watched, so `npm install` into `node_modules` costs nothing.
//! A new directory is watched first and scanned after (by the stage), so a file created in it
//! before the watch is not missed. A queue overflow, a full channel or an unexpected error
//! asks for a full rescan: a change may be seen twice, never lost. When the kernel runs out
//! of watches, the directories left over are rescanned periodically instead.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use notify::event::{EventKind, ModifyKind, RenameMode};
use notify::{Event, INotifyWatcher, RecursiveMode, Watcher};
use shmastra_contract::MANIFEST_FILE;
use shmastra_contract::manifest::is_env_file_name;
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
    Start(notify::Error),
}

pub struct TreeWatcher {
    workdir: PathBuf,
    git_dir: PathBuf,
    filter: Arc<RwLock<Filter>>,
    watcher: INotifyWatcher,
    raw: mpsc::Receiver<notify::Result<Event>>,
    overflowed: Arc<AtomicBool>,
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
        let (tx, raw) = mpsc::channel(event_buffer.max(1));
        let overflowed = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&overflowed);
        let watcher = INotifyWatcher::new(
            move |event: notify::Result<Event>| {
                if let Ok(e) = &event
                    && matches!(e.kind, EventKind::Access(_))
                {
                    return;
                }
                if tx.try_send(event).is_err() {
                    flag.store(true, Ordering::SeqCst);
                }
            },
            notify::Config::default(),
        )
        .map_err(WatchError::Start)?;
        let mut this = Self {
            workdir: workdir.to_owned(),
            git_dir: git_dir.to_owned(),
            filter,
            watcher,
            raw,
            overflowed,
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
        let mut rescan = tokio::time::interval(UNWATCHED_RESCAN_EVERY);
        rescan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        rescan.reset();
        loop {
            let mut changes = Changes::default();
            tokio::select! {
                _ = &mut stop => return,
                event = self.raw.recv() => {
                    let Some(event) = event else { return };
                    self.handle(event, &mut changes);
                    while let Ok(event) = self.raw.try_recv() {
                        self.handle(event, &mut changes);
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
            if self.overflowed.swap(false, Ordering::SeqCst) {
                tracing::warn!("too many events at once; rescanning the whole project");
                self.rescan_all(&mut changes);
            }
            if !changes.is_empty() && out.send(changes).await.is_err() {
                return;
            }
        }
    }

    fn handle(&mut self, event: notify::Result<Event>, changes: &mut Changes) {
        let event = match event {
            Ok(event) => event,
            Err(e) => {
                if matches!(e.kind, notify::ErrorKind::MaxFilesWatch) {
                    self.watch_limit_reached(e.paths.first().map(PathBuf::as_path));
                } else {
                    tracing::warn!("file watching reported a problem, rescanning: {e}");
                    self.rescan_all(changes);
                }
                return;
            }
        };
        if event.need_rescan() {
            tracing::warn!("the kernel dropped file events; rescanning the whole project");
            return self.rescan_all(changes);
        }
        // A rename also arrives as its `From` and `To` halves, handled one by one.
        if matches!(
            event.kind,
            EventKind::Access(_) | EventKind::Modify(ModifyKind::Name(RenameMode::Both))
        ) {
            return;
        }
        // notify drops its watch of a directory that is removed or renamed away, even when
        // a new directory of the same name appears before this stage sees the event.
        let gone = matches!(
            event.kind,
            EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(RenameMode::From))
        );
        for path in &event.paths {
            self.handle_path(path, gone, changes);
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
                    let _ = self
                        .watcher
                        .watch(&self.workdir.join(rel), RecursiveMode::NonRecursive);
                    visited.push(rel.to_owned());
                }
                return;
            }
            self.unwatched.remove(rel);
            let capped = self
                .max_watches
                .is_some_and(|cap| self.watched.len() >= cap);
            let watched = if capped {
                Err(notify::Error::new(notify::ErrorKind::MaxFilesWatch))
            } else {
                self.watcher
                    .watch(&self.workdir.join(rel), RecursiveMode::NonRecursive)
            };
            match watched {
                Ok(()) => {
                    self.watched.insert(rel.to_owned());
                    added.push(rel.to_owned());
                    visited.push(rel.to_owned());
                }
                Err(e) if matches!(e.kind, notify::ErrorKind::MaxFilesWatch) => {
                    self.unwatched.insert(rel.to_owned());
                    limit_hit.get_or_insert_with(|| rel.to_owned());
                }
                Err(e) if matches!(e.kind, notify::ErrorKind::PathNotFound) => {}
                Err(e) => {
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
                let _ = self
                    .watcher
                    .watch(&self.workdir.join(rel), RecursiveMode::NonRecursive);
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
            let _ = self.watcher.unwatch(&self.workdir.join(rel));
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
                let _ = self.watcher.unwatch(&path);
                if let Err(e) = self.watcher.watch(&path, RecursiveMode::NonRecursive) {
                    tracing::warn!(path = %path.display(), "cannot watch ignore rules file; edits to it apply at the next rescan: {e}");
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
