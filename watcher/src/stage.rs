//! The stage: brings the index in line with the working tree for the paths that changed, so
//! that writing the index as a tree gives what `git add -A` would commit.
//!
//! As git does, what the index already holds decides as much as the ignore rules: a tracked
//! path is updated even when a rule matches it, skip-worktree and assume-unchanged entries are
//! left alone, a gitlink stays when its submodule is not checked out, and a directory with
//! tracked paths below it is walked even when it holds a repository of its own. Untracked
//! paths pass the filter (`Index::add_path` knows nothing of `.gitignore`). Paths that changed
//! cost one `lstat` and one hash each; only subtrees (start-up, rescans, new directories, rule
//! edits) are walked.
//!
//! The ignore rules are the batch's own snapshot, as the watch stage had them when it sent the
//! batch; the tracked paths they ignore, which the stage finds, go back to the watch stage over
//! a channel. At start-up the stage's walk is also the watch stage's ([`Stager::stage`] with its
//! walker): one walk watches every kept directory and compares every kept file.
//!
//! The `Index` lives in memory between batches and is the stat cache; the new tree is the
//! previous one plus the paths this batch touched (`TreeUpdateBuilder`: only the trees on those
//! paths are read and written). The index file is written off the critical path
//! ([`Stager::write_index`]: when the watcher is quiet, and at stop). Whenever the file is not
//! what the watcher last read or wrote (a `git` command, `restore`, `sync`, a kill before the
//! write), it is read again and wins: the paths the watcher changed in memory but never wrote
//! are staged again on top of it, as `git add -A` on those paths would.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::ffi::OsStr;
use std::fs::{self, Metadata};
use std::hash::BuildHasher;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use git2::build::TreeUpdateBuilder;
use git2::{FileMode, Index, IndexEntry, IndexEntryExtendedFlag, IndexEntryFlag, Oid, Repository};
use tokio::sync::watch;

use crate::changes::Changes;
use crate::filter::{self, Filter, TrackedIgnored};
use crate::scan::{self, DirInIndex, Dirs, Entries, EntryKind};
use crate::sparse;

#[derive(Debug, thiserror::Error)]
pub enum StageError {
    /// The index could not be read or written (locked by a live git command, disk full):
    /// the batch is kept and tried again.
    #[error("cannot update the git index in {dir}: {source}")]
    Index { dir: PathBuf, source: git2::Error },
    /// A readable file could not be stored (disk full, read-only `.git`): the batch is kept
    /// and tried again, never committed without it.
    #[error("cannot store {path} in the git object database of {dir}: {source}")]
    Store {
        dir: PathBuf,
        path: PathBuf,
        source: git2::Error,
    },
}

/// A file left out of the commits, with its size in bytes.
pub type Skipped = BTreeMap<PathBuf, u64>;

pub struct Stager {
    workdir: PathBuf,
    index: Index,
    /// The rules of the latest batch that carried them.
    rules: Arc<Filter>,
    max_file_size: u64,
    skipped: Skipped,
    /// The index file as the watcher last read or wrote it; anything else there is someone
    /// else's write, which is read again.
    on_disk: Option<FileStamp>,
    /// When the index file was last written (seconds, nanoseconds), for git's racy check.
    index_written: Option<(i64, i64)>,
    /// The tree the in-memory index described at the last save, when known: the in-memory
    /// index is always this tree plus `touched`.
    tree: Option<Oid>,
    /// Paths whose index entry changed since `tree` was made.
    touched: BTreeSet<PathBuf>,
    /// Paths whose index entry changed since the index file was last written by the watcher.
    unwritten: BTreeSet<PathBuf>,
    /// The first readable file of this batch that could not be stored.
    store_failure: Option<(PathBuf, git2::Error)>,
    /// Tracked ignored paths found by this batch, by the scope they replace in the set.
    tracked_ignored_found: Vec<(PathBuf, Vec<PathBuf>)>,
    /// Tracked paths the rules ignore, as of the latest batch.
    tracked_ignored: TrackedIgnored,
    /// Each new set of them goes to the watch stage, which watches their directories.
    tracked_ignored_tx: watch::Sender<Arc<TrackedIgnored>>,
    /// For attribute lookups ([`Stager::needs_git`]).
    attrs: Option<Repository>,
    /// Filter drivers configured with a `clean` or `process` command, re-read each batch.
    drivers: Vec<String>,
}

impl Stager {
    pub fn new(
        repo: &Repository,
        workdir: &Path,
        rules: Arc<Filter>,
        tracked_ignored_tx: watch::Sender<Arc<TrackedIgnored>>,
        max_file_size: u64,
    ) -> Result<Self, StageError> {
        let on_disk = repo.path().join("index");
        let on_disk = FileStamp::of(&on_disk);
        let mut index = match repo.index() {
            Ok(index) => Ok(index),
            Err(e) if sparse::expand(workdir) => repo.index().map_err(|_| e),
            Err(e) => Err(e),
        }
        .map_err(|source| StageError::Index {
            dir: workdir.to_owned(),
            source,
        })?;
        // Attribute lookups that fall back to the index (`.gitattributes` not on disk) see the
        // index being staged, as git's do, rather than the file as it was at their first use,
        // which they would read a second time (10 MB at 100k files: a third of the first edit).
        let attrs = Repository::open(workdir)
            .ok()
            .filter(|attrs| attrs.set_index(&mut index).is_ok());
        Ok(Self {
            workdir: workdir.to_owned(),
            index,
            rules,
            max_file_size,
            skipped: Skipped::new(),
            index_written: on_disk.as_ref().map(|s| s.mtime),
            on_disk,
            tree: None,
            touched: BTreeSet::new(),
            unwritten: BTreeSet::new(),
            store_failure: None,
            tracked_ignored_found: Vec::new(),
            tracked_ignored: TrackedIgnored::default(),
            tracked_ignored_tx,
            attrs,
            drivers: Vec::new(),
        })
    }

    /// Files over the size limit, as of the latest batch.
    pub fn skipped(&self) -> &Skipped {
        &self.skipped
    }

    /// The rules of the batches that carry none, until one does.
    pub fn set_rules(&mut self, rules: Arc<Filter>) {
        self.rules = rules;
    }

    /// Applies `changes` to the in-memory index and returns the tree it describes, judging
    /// paths by the batch's rules (else the latest batch's). With `walker`, subtrees are walked
    /// with it instead (the start-up pass: it watches each directory and loads its rules on the
    /// way down). The index file is not written ([`Stager::write_index`] does). Call it with the
    /// repo lock held.
    pub fn stage(
        &mut self,
        repo: &Repository,
        changes: &Changes,
        walker: Option<&mut dyn Dirs>,
    ) -> Result<Oid, StageError> {
        let again = self.read_if_written_elsewhere()?;
        if self.tree.is_none() && !self.index.has_conflicts() {
            // The index's own tree cache (git keeps it whole) makes this cheap; the batch is
            // then built on it as on any saved tree.
            self.tree = self.index.write_tree().ok();
        }
        self.drivers = self.filter_drivers();
        if let Some(rules) = &changes.rules {
            self.rules = Arc::clone(&rules.filter);
        }
        let rules = Arc::clone(&self.rules);
        let mut snapshot = scan::Snapshot(&rules);
        let dirs: &mut dyn Dirs = match walker {
            Some(walker) => walker,
            None => &mut snapshot,
        };
        let (subtrees, paths) = changes.minimal();
        for dir in subtrees {
            self.stage_subtree(dir, dirs);
        }
        for path in paths.into_iter().chain(again.iter().map(PathBuf::as_path)) {
            self.stage_path(path, dirs);
        }
        let mut changed = false;
        for (scope, paths) in std::mem::take(&mut self.tracked_ignored_found) {
            changed |= self.tracked_ignored.set(&scope, paths);
        }
        if changed {
            self.tracked_ignored_tx
                .send_replace(Arc::new(self.tracked_ignored.clone()));
        }
        if let Some((path, source)) = self.store_failure.take() {
            return Err(StageError::Store {
                dir: self.workdir.clone(),
                path,
                source,
            });
        }
        let tree = self.build_tree(repo).map_err(|source| StageError::Index {
            dir: self.workdir.clone(),
            source,
        })?;
        self.tree = Some(tree);
        self.touched.clear();
        Ok(tree)
    }

    /// Whether the in-memory index holds changes the index file does not.
    pub fn has_unwritten(&self) -> bool {
        !self.unwritten.is_empty()
    }

    /// Writes the in-memory index to `.git/index` when it holds changes the file does not.
    /// When someone else wrote the file since the watcher last read it, theirs is read first
    /// and the watcher's unwritten paths are staged again on top. Call it with the repo lock
    /// held. Returns whether it wrote.
    pub fn write_index(&mut self, repo: &Repository) -> Result<bool, StageError> {
        if self.unwritten.is_empty() {
            return Ok(false);
        }
        if self.written_elsewhere() {
            self.stage(repo, &Changes::default(), None)?;
        }
        let err = |source| StageError::Index {
            dir: self.workdir.clone(),
            source,
        };
        // Makes the tree cache whole again (the saves only invalidated it), so git, and the
        // next start, find every tree of the index without computing it.
        let tree = self.index.write_tree().map_err(err)?;
        if self.touched.is_empty() {
            self.tree = Some(tree);
        }
        self.index.write().map_err(err)?;
        self.on_disk = self.index.path().and_then(FileStamp::of);
        self.index_written = self.on_disk.as_ref().map(|s| s.mtime);
        self.unwritten.clear();
        Ok(true)
    }

    /// The index file is not what the watcher last read or wrote.
    fn written_elsewhere(&self) -> bool {
        self.index.path().and_then(FileStamp::of) != self.on_disk
    }

    /// Reads the index file again when someone else wrote it (their index wins) and returns
    /// the paths the watcher had changed in memory and never written, to be staged again.
    fn read_if_written_elsewhere(&mut self) -> Result<Vec<PathBuf>, StageError> {
        let err = |source| StageError::Index {
            dir: self.workdir.clone(),
            source,
        };
        let path = self.index.path().map(Path::to_owned);
        let stamp = path.as_deref().and_then(FileStamp::of);
        if stamp != self.on_disk {
            // Stamped before reading: a write racing the read shows as a change next time.
            if let Err(e) = self.index.read(true) {
                // A sparse index (`sdir`) is something libgit2 cannot read: have git write
                // the same index in full, then read again.
                if !sparse::expand(&self.workdir) {
                    return Err(err(e));
                }
                self.on_disk = path.as_deref().and_then(FileStamp::of);
                self.index.read(true).map_err(err)?;
            } else {
                self.on_disk = stamp;
            }
            self.index_written = self.on_disk.as_ref().map(|s| s.mtime);
            self.tree = None;
            self.touched.clear();
            return Ok(std::mem::take(&mut self.unwritten).into_iter().collect());
        }
        Ok(Vec::new())
    }

    /// The tree of the in-memory index: the last save's tree with the touched paths updated
    /// (only the trees on those paths are read and written), or, when that tree is unknown
    /// (the index was just read) or the update cannot be made that way (a file became a
    /// directory, conflicts), libgit2's full `write_tree`.
    fn build_tree(&mut self, repo: &Repository) -> Result<Oid, git2::Error> {
        if let Some(base) = self.tree
            && !self.index.has_conflicts()
            && let Ok(base) = repo.find_tree(base)
        {
            let mut update = TreeUpdateBuilder::new();
            for path in &self.touched {
                match self.index.get_path(path, 0) {
                    Some(entry) => {
                        update.upsert(path.as_os_str().as_bytes(), entry.id, file_mode(entry.mode));
                    }
                    None if base.get_path(path).is_ok() => {
                        update.remove(path.as_os_str().as_bytes());
                    }
                    None => {}
                }
            }
            if let Ok(tree) = update.create_updated(repo, &base) {
                return Ok(tree);
            }
        }
        self.index.write_tree()
    }

    /// Records that the index entry of `rel` changed.
    fn touch(&mut self, rel: &Path) {
        self.touched.insert(rel.to_owned());
        self.unwritten.insert(rel.to_owned());
    }

    fn stage_path(&mut self, rel: &Path, dirs: &mut dyn Dirs) {
        if let Some(repo) = self.enclosing_repo(rel) {
            return self.stage_path(&repo, dirs);
        }
        let held = self.held(rel);
        if held == Held::Frozen {
            return;
        }
        let abs = self.workdir.join(rel);
        let meta = match fs::symlink_metadata(&abs) {
            Ok(meta) => Some(meta),
            Err(e) if is_gone(&e) => None,
            Err(e) => {
                tracing::warn!(path = %rel.display(), "cannot inspect, the saved version is kept: {e}");
                return;
            }
        };
        if meta.as_ref().is_some_and(Metadata::is_dir) {
            return match held {
                Held::Gitlink => self.stage_gitlink(rel),
                _ => self.stage_subtree(rel, dirs),
            };
        }
        let filter = dirs.rules();
        let kept = filter.is_kept(rel, false) && !filter.outside_sparse(rel, false);
        // Tracked files stay tracked and are updated even when an ignore rule matches them.
        let tracked = held != Held::No && !filter::is_always_ignored(rel);
        match meta {
            Some(meta)
                if (kept || tracked)
                    && (meta.file_type().is_file() || meta.file_type().is_symlink()) =>
            {
                self.add_file(rel, &meta, false);
            }
            _ => self.remove(rel),
        }
        if tracked || self.tracked_ignored.holds(rel) {
            let still = !kept && self.index_has(rel);
            self.tracked_ignored_found.push((
                rel.to_owned(),
                still.then(|| rel.to_owned()).into_iter().collect(),
            ));
        }
    }

    /// Makes the index under `dir` what `git add -A` makes it: kept entries added or updated,
    /// tracked ones refreshed (ignored or not), the rest removed.
    fn stage_subtree(&mut self, dir: &Path, dirs: &mut dyn Dirs) {
        let top = dir.as_os_str().is_empty();
        if !top {
            if let Some(repo) = self.enclosing_repo(dir) {
                return self.stage_path(&repo, dirs);
            }
            let abs = self.workdir.join(dir);
            match fs::symlink_metadata(&abs) {
                Ok(meta) if meta.is_dir() => {}
                _ => return self.stage_path_not_dir(dir, dirs),
            }
            match self.held(dir) {
                Held::Frozen => return,
                Held::Gitlink => return self.stage_gitlink(dir),
                Held::File => self.remove_entry(dir),
                Held::No => {}
            }
            if !dirs.rules().is_kept(dir, true) {
                return self.refresh_tracked_under(dir);
            }
            if self.dir_in_index(dir) == DirInIndex::Untracked && scan::is_nested_repo(&abs) {
                if dirs.rules().outside_sparse(dir, true) {
                    return;
                }
                return self.add_nested_repo(dir);
            }
        }
        let workdir = self.workdir.clone();
        let mut found = Found {
            stager: self,
            kept: Reached::default(),
            unreadable: Vec::new(),
        };
        scan::walk(&workdir, dir, true, dirs, &mut found);
        let Found {
            mut kept,
            unreadable,
            ..
        } = found;
        let in_scope = |path: &Path| {
            (top || path.starts_with(dir)) && !unreadable.iter().any(|u| path.starts_with(u))
        };
        let rest = self.entries_under_where(dir, |path| in_scope(path) && !kept.contains(path));
        for path in &rest {
            self.refresh_entry(path);
            kept.insert(path);
        }
        self.note_tracked_ignored(dir, rest);
        self.skipped
            .retain(|path, _| !in_scope(path) || kept.contains(path));
    }

    /// `candidates` are the tracked paths under `scope` no walk reached: those still tracked
    /// (and not frozen) are the ignored ones git keeps updating.
    fn note_tracked_ignored(&mut self, scope: &Path, candidates: Vec<PathBuf>) {
        let still: Vec<PathBuf> = candidates
            .into_iter()
            .filter(|p| matches!(self.held(p), Held::File | Held::Gitlink))
            .collect();
        self.tracked_ignored_found.push((scope.to_owned(), still));
    }

    /// An ignored directory: nothing new is added from it, but what is tracked in it is
    /// updated or removed as git does.
    fn refresh_tracked_under(&mut self, dir: &Path) {
        let tracked = self.entries_under(dir);
        for path in &tracked {
            self.refresh_entry(path);
        }
        let reached: HashSet<PathBuf> = tracked.iter().cloned().collect();
        self.note_tracked_ignored(dir, tracked);
        self.skipped
            .retain(|path, _| !path.starts_with(dir) || reached.contains(path));
    }

    /// A tracked entry no walk reached (it is ignored, or under an ignored directory): updated
    /// from the file, kept when frozen or a submodule that is not checked out, else removed.
    fn refresh_entry(&mut self, rel: &Path) {
        let held = self.held(rel);
        if held == Held::Frozen {
            return;
        }
        if filter::is_always_ignored(rel) {
            return self.remove_entry(rel);
        }
        match fs::symlink_metadata(self.workdir.join(rel)) {
            Ok(meta) if meta.file_type().is_file() || meta.file_type().is_symlink() => {
                self.add_file(rel, &meta, true);
            }
            Ok(meta) if meta.is_dir() && held == Held::Gitlink => self.stage_gitlink(rel),
            Ok(_) => self.remove_entry(rel),
            Err(e) if is_gone(&e) => self.remove_entry(rel),
            Err(e) => {
                tracing::warn!(path = %rel.display(), "cannot inspect, the saved version is kept: {e}");
            }
        }
    }

    /// How the index holds `rel`.
    fn held(&self, rel: &Path) -> Held {
        match self.index.get_path(rel, 0) {
            None => Held::No,
            Some(entry) if is_frozen(&entry) => Held::Frozen,
            Some(entry) if entry.mode == GITLINK_MODE => Held::Gitlink,
            Some(_) => Held::File,
        }
    }

    fn index_has(&self, rel: &Path) -> bool {
        self.index.get_path(rel, 0).is_some()
    }

    /// What the index holds at or below the directory `rel`.
    fn dir_in_index(&self, rel: &Path) -> DirInIndex {
        if self
            .index
            .get_path(rel, 0)
            .is_some_and(|e| e.mode == GITLINK_MODE)
        {
            return DirInIndex::Gitlink;
        }
        let mut prefix = rel.as_os_str().as_bytes().to_vec();
        prefix.push(b'/');
        let tracked = self
            .index
            .find_prefix(OsStr::from_bytes(&prefix))
            .is_ok_and(|i| {
                self.index
                    .get(i)
                    .is_some_and(|e| e.path.starts_with(&prefix))
            });
        if tracked {
            DirInIndex::Tracked
        } else {
            DirInIndex::Untracked
        }
    }

    /// The outermost directory above `rel` that git treats as one entry: a gitlink in the
    /// index, or a repository of its own under which nothing is tracked.
    fn enclosing_repo(&self, rel: &Path) -> Option<PathBuf> {
        let mut above: Vec<&Path> = rel
            .ancestors()
            .skip(1)
            .filter(|a| !a.as_os_str().is_empty())
            .collect();
        above.reverse();
        above
            .into_iter()
            .find_map(|dir| match self.dir_in_index(dir) {
                DirInIndex::Gitlink => Some(dir.to_owned()),
                DirInIndex::Untracked if scan::is_nested_repo(&self.workdir.join(dir)) => {
                    Some(dir.to_owned())
                }
                _ => None,
            })
    }

    /// Index paths under `dir` (all of them for the top), found by binary search: many small
    /// subtrees in one batch must not each cost a pass over the whole index.
    fn entries_under(&self, dir: &Path) -> Vec<PathBuf> {
        self.entries_under_where(dir, |_| true)
    }

    /// The index paths under `dir` that `wanted` picks (only those are collected: a full
    /// pass over 100k entries keeps none of the others).
    fn entries_under_where(
        &self,
        dir: &Path,
        mut wanted: impl FnMut(&Path) -> bool,
    ) -> Vec<PathBuf> {
        let picked = |entry: IndexEntry| {
            let path = Path::new(OsStr::from_bytes(&entry.path));
            wanted(path).then(|| path.to_owned())
        };
        if dir.as_os_str().is_empty() {
            return self.index.iter().filter_map(picked).collect();
        }
        let mut prefix = dir.as_os_str().as_bytes().to_vec();
        prefix.push(b'/');
        let Ok(start) = self.index.find_prefix(OsStr::from_bytes(&prefix)) else {
            return Vec::new();
        };
        (start..self.index.len())
            .map_while(|i| self.index.get(i))
            .take_while(|entry| entry.path.starts_with(&prefix))
            .filter_map(picked)
            .collect()
    }

    /// A subtree root that is no longer a directory: stage it as a single path.
    fn stage_path_not_dir(&mut self, rel: &Path, dirs: &mut dyn Dirs) {
        self.remove_dir_entries(rel);
        match fs::symlink_metadata(self.workdir.join(rel)) {
            Ok(meta) if !meta.is_dir() => self.stage_path(rel, dirs),
            _ => self.remove(rel),
        }
    }

    fn add_file(&mut self, rel: &Path, meta: &Metadata, skip_unchanged: bool) {
        let entry = self.index.get_path(rel, 0);
        if entry.as_ref().is_some_and(is_frozen) {
            return;
        }
        if meta.is_file() && meta.len() > self.max_file_size {
            if self.skipped.insert(rel.to_owned(), meta.len()).is_none() {
                tracing::warn!(
                    path = %rel.display(),
                    size = meta.len(),
                    limit = self.max_file_size,
                    "file is larger than --max-file-size and is not saved"
                );
            }
            self.remove_entry(rel);
            return;
        }
        self.skipped.remove(rel);
        if skip_unchanged
            && entry.is_some_and(|entry| !is_intent_to_add(&entry) && stat_matches(&entry, meta))
            && self.modified_before_the_index(meta)
        {
            return;
        }
        self.clear_the_way(rel);
        match self.index.add_path(rel) {
            Ok(()) if self.needs_git(rel) => {
                self.touch(rel);
                self.hash_with_git(rel);
            }
            Ok(()) => self.touch(rel),
            // A readable file the file system refused to store: the whole batch waits for it.
            Err(e) if is_store_failure(&e, &self.workdir.join(rel), meta) => {
                self.store_failure.get_or_insert((rel.to_owned(), e));
            }
            Err(e) => tracing::warn!(
                path = %rel.display(),
                "cannot save this file, its last saved version is kept: {}",
                e.message()
            ),
        }
    }

    /// Filter drivers with a `clean` or `process` command in the repository's configuration.
    fn filter_drivers(&self) -> Vec<String> {
        let Some(mut config) = self.attrs.as_ref().and_then(|r| r.config().ok()) else {
            return Vec::new();
        };
        let Ok(config) = config.snapshot() else {
            return Vec::new();
        };
        let Ok(entries) = config.entries(Some(r"^filter\..*\.(clean|process)$")) else {
            return Vec::new();
        };
        let mut drivers = Vec::new();
        let _ = entries.for_each(|entry| {
            if let Some((driver, _)) = entry
                .name()
                .ok()
                .and_then(|n| n.strip_prefix("filter."))
                .and_then(|n| n.rsplit_once('.'))
            {
                drivers.push(driver.to_owned());
            }
        });
        drivers
    }

    /// Whether git converts this path with something libgit2 does not run: a filter driver's
    /// command (git-lfs is one) or `working-tree-encoding`.
    fn needs_git(&self, rel: &Path) -> bool {
        let Some(repo) = &self.attrs else {
            return false;
        };
        let flags = git2::AttrCheckFlags::FILE_THEN_INDEX;
        let attr = |name: &str| match git2::AttrValue::from_string(
            repo.get_attr(rel, name, flags).ok().flatten(),
        ) {
            git2::AttrValue::String(value) => Some(value.to_owned()),
            _ => None,
        };
        // With no driver configured, no `filter` attribute can name one: one lookup, not two.
        attr("working-tree-encoding").is_some()
            || (!self.drivers.is_empty()
                && attr("filter").is_some_and(|driver| self.drivers.contains(&driver)))
    }

    /// Stores what `git hash-object` stores for this path (it runs the filters git would) as
    /// the entry's content. If git cannot, the raw bytes stay, with a warning naming the path.
    fn hash_with_git(&mut self, rel: &Path) {
        let output = std::process::Command::new("git")
            .arg("-C")
            .arg(&self.workdir)
            .args(["hash-object", "-w", "--"])
            .arg(rel)
            .output();
        let id = match output {
            Ok(out) if out.status.success() => {
                Oid::from_str(String::from_utf8_lossy(&out.stdout).trim()).ok()
            }
            Ok(out) => {
                tracing::warn!(
                    path = %rel.display(),
                    "git could not run the content filter for this file, its raw bytes are saved: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
                None
            }
            Err(e) => {
                tracing::warn!(
                    path = %rel.display(),
                    "this file needs git's content filters and git could not run, its raw bytes are saved: {e}"
                );
                None
            }
        };
        if let (Some(id), Some(mut entry)) = (id, self.index.get_path(rel, 0)) {
            entry.id = id;
            if let Err(e) = self.index.add(&entry) {
                tracing::warn!(path = %rel.display(), "cannot store the filtered content, its raw bytes are saved: {}", e.message());
            }
        }
    }

    /// A new nested repository is recorded as a gitlink to its `HEAD`, as `git add -A` does.
    /// Without a commit `git add -A` refuses the whole add; here only that directory is left out.
    fn add_nested_repo(&mut self, rel: &Path) {
        self.clear_the_way(rel);
        match self.index.add_path(rel) {
            Ok(()) => self.touch(rel),
            Err(e) => tracing::warn!(
                path = %rel.display(),
                "nested git repository is not saved (it needs a commit checked out): {}",
                e.message()
            ),
        }
    }

    /// A gitlink the index holds: moved to the submodule's `HEAD` when it is checked out; kept
    /// as it is when not (a clone without `--recursive`, a restore), as git keeps it.
    fn stage_gitlink(&mut self, rel: &Path) {
        if !scan::is_nested_repo(&self.workdir.join(rel)) {
            return;
        }
        match self.index.add_path(rel) {
            Ok(()) => self.touch(rel),
            Err(e) => tracing::warn!(
                path = %rel.display(),
                "submodule has no commit checked out, its saved commit is kept: {}",
                e.message()
            ),
        }
    }

    /// Git's "racily clean" rule: a file modified in the same clock tick as the index was
    /// written may have changed without its stat data showing it, so only files modified
    /// strictly before the index may skip hashing. The tick is a whole second, as git built
    /// without `USE_NSEC` (the common build) counts it: a file written in the index's second
    /// is hashed again by git, so it is here too (with changed attributes, that gives a new
    /// blob).
    fn modified_before_the_index(&self, meta: &Metadata) -> bool {
        self.index_written
            .is_some_and(|(seconds, _)| meta.mtime() < seconds)
    }

    /// A file where a directory was (or the other way round) must not leave the old entries
    /// behind: an index with both `a` and `a/b` cannot be written as a tree.
    fn clear_the_way(&mut self, rel: &Path) {
        let below = self.entries_under(rel);
        if !below.is_empty() && self.index.remove_dir(rel, 0).is_ok() {
            for path in &below {
                self.touch(path);
            }
        }
        for ancestor in rel.ancestors().skip(1) {
            if ancestor.as_os_str().is_empty() {
                break;
            }
            if self.index_has(ancestor) && self.index.remove_path(ancestor).is_ok() {
                self.touch(ancestor);
            }
        }
    }

    /// A path gone from the working tree: its entries go, except frozen ones (git keeps a
    /// skip-worktree or assume-unchanged entry whatever the disk holds).
    fn remove(&mut self, rel: &Path) {
        self.remove_entry(rel);
        self.remove_dir_entries(rel);
        self.skipped.retain(|path, _| !path.starts_with(rel));
    }

    fn remove_entry(&mut self, rel: &Path) {
        let Some(entry) = self.index.get_path(rel, 0) else {
            let conflicted = self.index.has_conflicts() && self.index.conflict_get(rel).is_ok();
            if conflicted && self.index.remove_path(rel).is_ok() {
                self.touch(rel);
            }
            return;
        };
        if !is_frozen(&entry) && self.index.remove_path(rel).is_ok() {
            self.touch(rel);
        }
    }

    fn remove_dir_entries(&mut self, rel: &Path) {
        for path in self.entries_under(rel) {
            self.remove_entry(&path);
        }
    }
}

/// The stage's side of a subtree walk: each kept entry is staged as the walk finds it (nothing
/// per file is held but a hash of its path, to find the tracked paths the walk did not reach).
struct Found<'a> {
    stager: &'a mut Stager,
    kept: Reached,
    unreadable: Vec<PathBuf>,
}

/// The paths a walk reached, each as a 128-bit keyed hash (16 bytes a path instead of a
/// path: 100k of them cost 2 MiB in one allocation). Taking an unreached path for a reached
/// one needs two independently keyed SipHashes to collide at once.
#[derive(Default)]
struct Reached {
    keys: (RandomState, RandomState),
    seen: HashSet<u128>,
}

impl Reached {
    fn hash(&self, path: &Path) -> u128 {
        let bytes = path.as_os_str().as_bytes();
        (u128::from(self.keys.0.hash_one(bytes)) << 64) | u128::from(self.keys.1.hash_one(bytes))
    }

    fn insert(&mut self, path: &Path) {
        self.seen.insert(self.hash(path));
    }

    fn contains(&self, path: &Path) -> bool {
        self.seen.contains(&self.hash(path))
    }
}

impl Entries for Found<'_> {
    fn in_index(&self, dir: &Path) -> DirInIndex {
        self.stager.dir_in_index(dir)
    }

    fn found(&mut self, rel: PathBuf, kind: EntryKind) {
        match kind {
            EntryKind::File(meta) => self.stager.add_file(&rel, &meta, true),
            EntryKind::NestedRepo => self.stager.add_nested_repo(&rel),
            EntryKind::Gitlink => self.stager.stage_gitlink(&rel),
        }
        self.kept.insert(&rel);
    }

    fn unreadable(&mut self, dir: PathBuf) {
        self.unreadable.push(dir);
    }
}

/// How the index holds one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    No,
    /// skip-worktree (sparse checkouts) or assume-unchanged: git leaves the entry as it is.
    Frozen,
    /// A submodule.
    Gitlink,
    /// A file or a symlink.
    File,
}

const GITLINK_MODE: u32 = 0o160000;

fn is_frozen(entry: &IndexEntry) -> bool {
    entry.flags & IndexEntryFlag::VALID.bits() != 0
        || entry.flags_extended & IndexEntryExtendedFlag::SKIP_WORKTREE.bits() != 0
}

/// `git add -N`: an entry with no content yet, always hashed.
fn is_intent_to_add(entry: &IndexEntry) -> bool {
    entry.flags_extended & IndexEntryExtendedFlag::INTENT_TO_ADD.bits() != 0
}

/// Disk full, read-only `.git`, ...: not the file's fault (it is readable), and not a path
/// git refuses (those are left out with a warning, or they would block every later save).
fn is_store_failure(e: &git2::Error, abs: &Path, meta: &Metadata) -> bool {
    matches!(
        e.class(),
        git2::ErrorClass::Os | git2::ErrorClass::Odb | git2::ErrorClass::Filesystem
    ) && (!meta.is_file() || fs::File::open(abs).is_ok())
}

fn is_gone(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
    )
}

/// Git's own shortcut: an entry whose stat data still matches the file is not hashed again.
fn stat_matches(entry: &IndexEntry, meta: &Metadata) -> bool {
    let mode = if meta.file_type().is_symlink() {
        0o120000
    } else if meta.mode() & 0o111 != 0 {
        0o100755
    } else {
        0o100644
    };
    entry.mode == mode
        && entry.file_size == meta.size() as u32
        && entry.ino == meta.ino() as u32
        && entry.mtime.seconds() == meta.mtime() as i32
        && entry.mtime.nanoseconds() == meta.mtime_nsec() as u32
        && entry.ctime.seconds() == meta.ctime() as i32
        && entry.ctime.nanoseconds() == meta.ctime_nsec() as u32
}

/// What identifies one version of the index file: git replaces it by rename (a new inode),
/// and its last 20 bytes are the checksum of its content.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileStamp {
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    checksum: [u8; 20],
}

impl FileStamp {
    fn of(path: &Path) -> Option<Self> {
        let mut file = fs::File::open(path).ok()?;
        let meta = file.metadata().ok()?;
        let mut checksum = [0; 20];
        if meta.len() >= 20 {
            file.seek(SeekFrom::End(-20)).ok()?;
            file.read_exact(&mut checksum).ok()?;
        }
        Some(Self {
            ino: meta.ino(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
            checksum,
        })
    }
}

/// The tree entry mode of an index entry's mode.
fn file_mode(mode: u32) -> FileMode {
    match mode {
        0o100755 => FileMode::BlobExecutable,
        0o120000 => FileMode::Link,
        GITLINK_MODE => FileMode::Commit,
        _ => FileMode::Blob,
    }
}
