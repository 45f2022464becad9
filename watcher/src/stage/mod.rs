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
//! paths are read and written). The index file is written by [`Stager::write_index`]: by the
//! save before it moves `HEAD`, else when the watcher is quiet, and at stop. Whenever the file
//! is not what the watcher last read or wrote (a `git` command, `restore`, `sync`, a kill
//! before the write), it is read again and wins: the paths the watcher changed in memory but
//! never wrote, and those whose entries the other writer changed, are staged again on top of
//! it, as `git add -A` on those paths would.
//!
//! The parts: [`decide`] says what `git add -A` does with one path (pure), [`index_file`]
//! knows whether `.git/index` is still the watcher's, [`tree`] builds the tree, [`content`]
//! hashes what libgit2 cannot filter itself; this module walks and keeps the in-memory index.

mod content;
mod decide;
mod index_file;
mod tree;

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::ffi::OsStr;
use std::fs::{self, Metadata};
use std::hash::BuildHasher;
use std::io::Read;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::Receiver;

use git2::{Index, IndexEntry, Oid, Repository};
use tokio::sync::watch;

use crate::changes::Changes;
use crate::filter::{self, Filter, TrackedIgnored};
use crate::scan::{self, DirInIndex, Dirs, Entries, EntryKind, Listing};
use crate::sparse;
use content::{Filters, Store};
use decide::{Action, GITLINK_MODE, Held, OnDisk, Via, is_frozen, is_intent_to_add};
pub(crate) use index_file::OwnIndex;
use index_file::{IndexFile, stat_matches};

/// What hashing one file again costs its next reader beyond its bytes (the open, the read,
/// the object lookup), counted as bytes of index file written instead.
const REHASH_OVERHEAD: u64 = 4096;

#[derive(Debug, thiserror::Error)]
pub enum StageError {
    /// The index could not be read or written (locked by a live git command, disk full):
    /// the batch is kept and tried again.
    #[error("cannot update the git index in {}: {}", .dir.display(), .source.message())]
    Index { dir: PathBuf, source: git2::Error },
    /// A readable file could not be stored (disk full, read-only `.git`): the batch is kept
    /// and tried again, never committed without it.
    #[error("cannot store {path} in the git object database of {}: {}", .dir.display(), .source.message())]
    Store {
        dir: PathBuf,
        path: PathBuf,
        source: git2::Error,
    },
    /// The index holds unmerged entries (a conflict the user resolves): nothing is staged.
    #[error("the git index in {dir} has unmerged paths")]
    Unmerged { dir: PathBuf },
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
    index_file: IndexFile,
    /// The tree the in-memory index described at the last save, when known: the in-memory
    /// index is always this tree plus `touched`.
    tree: Option<Oid>,
    /// Paths whose index entry changed since `tree` was made.
    touched: BTreeSet<PathBuf>,
    /// Paths whose index entry changed since the index file was last written by the watcher.
    unwritten: BTreeSet<PathBuf>,
    /// Entries refreshed since the index file was last written or read whose content did not
    /// change, only their stat data (a copied project; a file written in the index file's own
    /// second, which git's racy-clean rule hashes again): not `unwritten`, the file names the
    /// same content. What the next reader of the file pays to hash them again: their sizes,
    /// plus [`REHASH_OVERHEAD`] each. The quiet write writes the file for them only once that
    /// is at least the file's own size, what writing it costs.
    stat_refreshed: u64,
    /// The index file was last written by a save, with its tree cache invalidated on the
    /// changed paths (valid everywhere else, which git reads as it is): the quiet write makes
    /// it whole.
    cache_partial: bool,
    /// The first readable file of this batch that could not be stored.
    store_failure: Option<(PathBuf, git2::Error)>,
    /// Tracked ignored paths found by this batch, by the scope they replace in the set.
    tracked_ignored_found: Vec<(PathBuf, Vec<PathBuf>)>,
    /// Tracked paths the rules ignore, as of the latest batch.
    tracked_ignored: TrackedIgnored,
    /// Each new set of them goes to the watch stage, which watches their directories.
    tracked_ignored_tx: watch::Sender<Arc<TrackedIgnored>>,
    /// Which paths git converts with what libgit2 does not run.
    filters: Filters,
}

impl Stager {
    pub fn new(
        repo: &Repository,
        workdir: &Path,
        rules: Arc<Filter>,
        tracked_ignored_tx: watch::Sender<Arc<TrackedIgnored>>,
        max_file_size: u64,
        own_index: OwnIndex,
    ) -> Result<Self, StageError> {
        let index_file = IndexFile::new(repo.path().join("index"), own_index);
        let mut index = match repo.index() {
            Ok(index) => Ok(index),
            Err(e) if sparse::expand(workdir) => repo.index().map_err(|_| e),
            Err(e) => Err(e),
        }
        .map_err(|source| StageError::Index {
            dir: workdir.to_owned(),
            source,
        })?;
        let filters = Filters::new(workdir, &mut index, repo);
        Ok(Self {
            workdir: workdir.to_owned(),
            index,
            rules,
            max_file_size,
            skipped: Skipped::new(),
            index_file,
            tree: None,
            touched: BTreeSet::new(),
            unwritten: BTreeSet::new(),
            stat_refreshed: 0,
            cache_partial: false,
            store_failure: None,
            tracked_ignored_found: Vec::new(),
            tracked_ignored: TrackedIgnored::default(),
            tracked_ignored_tx,
            filters,
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
    /// paths by the batch's rules (else the latest batch's). With `listings`, the whole tree
    /// is staged from them instead of a walk of its own (the start-up pass: another thread
    /// walks, watching each directory and loading its rules on the way down). The index file
    /// is not written ([`Stager::write_index`] does). Call it with the repo lock held.
    pub fn stage(
        &mut self,
        repo: &Repository,
        changes: &Changes,
        mut listings: Option<Receiver<Vec<Listing>>>,
    ) -> Result<Oid, StageError> {
        let again = self.read_if_written_elsewhere()?;
        if self.index.has_conflicts() {
            return Err(StageError::Unmerged {
                dir: self.workdir.clone(),
            });
        }
        if self.tree.is_none() {
            // The index's own tree cache (git keeps it whole) makes this cheap; the batch is
            // then built on it as on any saved tree.
            self.tree = self.index.write_tree().ok();
        }
        self.filters.reload(&mut self.index, repo);
        if let Some(rules) = &changes.rules {
            self.rules = Arc::clone(&rules.filter);
        }
        let mut fresh = scan::Fresh(Arc::clone(&self.rules));
        let dirs: &mut dyn Dirs = &mut fresh;
        let (subtrees, paths) = changes.minimal();
        self.remove_gone_attributes(
            &subtrees,
            paths
                .iter()
                .copied()
                .chain(again.iter().map(PathBuf::as_path)),
        );
        for dir in subtrees {
            let listed = if dir.as_os_str().is_empty() {
                listings.take()
            } else {
                None
            };
            self.stage_subtree(dir, dirs, listed);
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
        let tree =
            tree::build(repo, &mut self.index, self.tree, &self.touched).map_err(|source| {
                StageError::Index {
                    dir: self.workdir.clone(),
                    source,
                }
            })?;
        self.tree = Some(tree);
        self.touched.clear();
        Ok(tree)
    }

    /// Whether the in-memory index holds changes the index file does not.
    pub fn has_unwritten(&self) -> bool {
        !self.unwritten.is_empty()
    }

    /// Whether the quiet write has work: changes the file lacks, its tree cache to make whole
    /// after a save wrote it, or stat data refreshed that would cost more to hash again than
    /// to write.
    pub fn wants_write(&self) -> bool {
        self.has_unwritten() || self.cache_partial || self.stat_refresh_pays()
    }

    /// Whether writing the index file costs less than the next reader's hashing again the
    /// files whose stat data alone the watcher refreshed.
    fn stat_refresh_pays(&self) -> bool {
        self.stat_refreshed > 0 && self.stat_refreshed >= self.index_file.len()
    }

    /// Writes the in-memory index to `.git/index` when it holds changes the file does not
    /// (or, with `whole`, when its tree cache is not whole). When someone else wrote the file
    /// since the watcher last read it, theirs is read first and the watcher's unwritten paths
    /// are staged again on top. Call it with the repo lock held. Returns whether it wrote.
    ///
    /// `whole`: the tree cache is made whole first (libgit2's `write_tree` reads every tree
    /// of the index back to rebuild it, O(tree)), so git, and the next start, find every tree
    /// without computing it: the quiet write. Without it (a save, before `HEAD` moves) the
    /// cache is written as the saves left it, invalid on the changed paths only, which git
    /// reads and recomputes as it needs.
    pub fn write_index(&mut self, repo: &Repository, whole: bool) -> Result<bool, StageError> {
        if self.unwritten.is_empty() && !(whole && (self.cache_partial || self.stat_refresh_pays()))
        {
            return Ok(false);
        }
        if self.index_file.written_elsewhere() {
            self.stage(repo, &Changes::default(), None)?;
        }
        let err = |source| StageError::Index {
            dir: self.workdir.clone(),
            source,
        };
        if whole {
            let tree = self.index.write_tree().map_err(err)?;
            if self.touched.is_empty() {
                self.tree = Some(tree);
            }
        }
        self.index_file.write(&mut self.index).map_err(err)?;
        self.unwritten.clear();
        self.stat_refreshed = 0;
        self.cache_partial = !whole;
        Ok(true)
    }

    /// Reads the index file again when someone else wrote it (their index wins) and returns
    /// the paths to stage again on top of it, as `git add -A` run now would: those the
    /// watcher had changed in memory and never written, and those whose entry the other
    /// writer changed (a `git reset HEAD~1`, a `git rm --cached`, a checkout), which the disk
    /// may hold otherwise.
    fn read_if_written_elsewhere(&mut self) -> Result<Vec<PathBuf>, StageError> {
        if !self.index_file.written_elsewhere() {
            return Ok(Vec::new());
        }
        let before = entry_ids(&self.index);
        self.index_file
            .read(&mut self.index, &self.workdir)
            .map_err(|source| StageError::Index {
                dir: self.workdir.clone(),
                source,
            })?;
        let mut again = std::mem::take(&mut self.unwritten);
        self.stat_refreshed = 0;
        again.extend(changed_entries(before, entry_ids(&self.index)));
        self.tree = None;
        self.touched.clear();
        Ok(again.into_iter().collect())
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
        let lstat = fs::symlink_metadata(self.workdir.join(rel));
        let filter = dirs.rules();
        let kept = filter.is_kept(rel, false) && !filter.outside_sparse(rel, false);
        let always_ignored = filter::is_always_ignored(rel);
        match decide::decide(Via::Changed, held, OnDisk::of(&lstat), kept, always_ignored) {
            Action::Leave => return,
            Action::KeepSaved => return warn_unreadable(rel, &lstat),
            Action::Gitlink => return self.stage_gitlink(rel),
            Action::Walk => return self.stage_subtree(rel, dirs, None),
            Action::Add => self.add_file(rel, lstat.as_ref().expect("a file"), false),
            Action::Remove => self.remove(rel),
        }
        if decide::is_tracked(held, always_ignored) || self.tracked_ignored.holds(rel) {
            let still = !kept && self.index_has(rel);
            self.tracked_ignored_found.push((
                rel.to_owned(),
                still.then(|| rel.to_owned()).into_iter().collect(),
            ));
        }
    }

    /// Tracked `.gitattributes` files gone from the disk leave the index before anything is
    /// hashed, so that no file of this batch is converted by them: git's `add -A` removes
    /// them in index order, where `.gitattributes` comes before the names people use, and
    /// reads attributes from the index only for a file that is not on disk.
    fn remove_gone_attributes<'p>(
        &mut self,
        subtrees: &[&Path],
        paths: impl Iterator<Item = &'p Path>,
    ) {
        let is_attributes = |p: &Path| p.file_name() == Some(OsStr::new(".gitattributes"));
        let mut gone: Vec<PathBuf> = paths
            .filter(|p| is_attributes(p))
            .map(Path::to_owned)
            .collect();
        for dir in subtrees {
            gone.extend(self.entries_under_where(dir, is_attributes));
        }
        for path in gone {
            let missing = matches!(
                fs::symlink_metadata(self.workdir.join(&path)),
                Err(e) if decide::is_gone(&e)
            );
            if missing {
                self.remove_entry(&path);
            }
        }
    }

    /// Makes the index under `dir` what `git add -A` makes it: kept entries added or updated,
    /// tracked ones refreshed (ignored or not), the rest removed. The entries come from a walk
    /// of its own, or for the top, from `listings` when given.
    fn stage_subtree(
        &mut self,
        dir: &Path,
        dirs: &mut dyn Dirs,
        listings: Option<Receiver<Vec<Listing>>>,
    ) {
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
        let rules = Arc::clone(&self.rules);
        let mut found = Found {
            stager: self,
            kept: Reached::default(),
            unreadable: Vec::new(),
        };
        match listings {
            Some(listings) => scan::stage_listings(&workdir, listings, &rules, &mut found),
            None => scan::walk(&workdir, dir, true, dirs, &mut found),
        }
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
        let always_ignored = filter::is_always_ignored(rel);
        let lstat = fs::symlink_metadata(self.workdir.join(rel));
        match decide::decide(
            Via::Unreached,
            held,
            OnDisk::of(&lstat),
            false,
            always_ignored,
        ) {
            Action::Leave => {}
            Action::KeepSaved => warn_unreadable(rel, &lstat),
            Action::Add => self.add_file(rel, lstat.as_ref().expect("a file"), true),
            Action::Gitlink => self.stage_gitlink(rel),
            Action::Walk | Action::Remove => self.remove_entry(rel),
        }
    }

    /// How the index holds `rel`.
    fn held(&self, rel: &Path) -> Held {
        Held::of(self.index.get_path(rel, 0).as_ref(), |entry| {
            self.frozen(rel, entry)
        })
    }

    /// Whether `git add -A` leaves the entry of `rel` as it is: skip-worktree or
    /// assume-unchanged, or outside the sparse checkout, where it updates no entry
    /// (`update_callback` in git's `read-cache.c`, without `--sparse`).
    fn frozen(&self, rel: &Path, entry: &IndexEntry) -> bool {
        is_frozen(entry) || self.rules.outside_sparse(rel, false)
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
        if entry.as_ref().is_some_and(|entry| self.frozen(rel, entry)) {
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
        let before = entry
            .as_ref()
            .filter(|entry| !is_intent_to_add(entry))
            .map(|entry| (entry.id, entry.mode));
        if skip_unchanged
            && entry.is_some_and(|entry| !is_intent_to_add(&entry) && stat_matches(&entry, meta))
            && self.index_file.modified_before(meta)
        {
            return;
        }
        self.clear_the_way(rel);
        let indexed = self.index.get_path(rel, 0).map(|e| e.id);
        // A symbolic link's blob is its target, which no filter touches.
        let store = if meta.is_file() {
            self.filters.store(rel, indexed, &self.index)
        } else {
            Store::Filtered
        };
        let added = match store {
            Store::Raw => self.add_raw(rel, meta),
            Store::Filtered | Store::Git => self.index.add_path(rel),
        };
        match added {
            Ok(()) => {
                if store == Store::Git {
                    self.hash_with_git(rel);
                }
                self.added(rel, before, meta.len());
            }
            // A readable file the file system refused to store: the whole batch waits for it.
            Err(e) if content::is_store_failure(&e, &self.workdir.join(rel), meta) => {
                self.store_failure.get_or_insert((rel.to_owned(), e));
            }
            Err(e) => tracing::warn!(
                path = %rel.display(),
                "cannot save this file, its last saved version is kept: {}",
                e.message()
            ),
        }
    }

    /// Adds the regular file `rel` as `git_index_add_bypath` does where no filter applies
    /// (`Store::Raw`), without its filter lookups: the bytes read, the entry made from `meta`,
    /// the lstat taken before the read (a write in between leaves the entry's stat data older
    /// than its content, so the next look hashes the file again; never the reverse), with
    /// libgit2's fields (`dev` is `st_rdev`, the mode from the owner-execute bit). A file over
    /// 1 MiB, one that is no longer a regular file, or a read or insert that fails, goes to
    /// `add_bypath`, which says why.
    fn add_raw(&mut self, rel: &Path, meta: &Metadata) -> Result<(), git2::Error> {
        let bytes = (meta.len() <= RAW_MAX)
            .then(|| read_regular(&self.workdir.join(rel)))
            .flatten();
        let Some(bytes) = bytes else {
            return self.index.add_path(rel);
        };
        self.index
            .add_frombuffer(&raw_entry(rel, meta), &bytes)
            .or_else(|_| self.index.add_path(rel))
    }

    /// Records the entry `add_file` made for `rel`: a change, unless it names the content and
    /// mode it did before (`before`) and only its stat data moved.
    fn added(&mut self, rel: &Path, before: Option<(Oid, u32)>, size: u64) {
        let after = self
            .index
            .get_path(rel, 0)
            .map(|entry| (entry.id, entry.mode));
        if before.is_some() && after == before {
            self.stat_refreshed = self
                .stat_refreshed
                .saturating_add(size.saturating_add(REHASH_OVERHEAD));
        } else {
            self.touch(rel);
        }
    }

    /// Stores what `git hash-object` stores for this path as the entry's content. If git
    /// cannot, the raw bytes stay (with a warning naming the path).
    fn hash_with_git(&mut self, rel: &Path) {
        let Some(id) = content::hash_with_git(&self.workdir, rel) else {
            return;
        };
        if let Some(mut entry) = self.index.get_path(rel, 0) {
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
        match self.add_gitlink(rel) {
            Ok(()) => self.touch(rel),
            Err(e) => tracing::warn!(
                path = %rel.display(),
                "nested git repository is not saved (it needs a commit checked out): {}",
                e.message()
            ),
        }
    }

    /// The gitlink entry of the repository at `rel`: its `HEAD` commit, with the directory's
    /// stat data, as git's `add_to_index` makes it (built here: libgit2's `add_path` looks the
    /// path up as a submodule, through a configuration key that cannot hold every name, one
    /// with a newline for one).
    fn add_gitlink(&mut self, rel: &Path) -> Result<(), git2::Error> {
        let abs = self.workdir.join(rel);
        let nested = Repository::open_ext(
            &abs,
            git2::RepositoryOpenFlags::NO_SEARCH,
            std::iter::empty::<&std::ffi::OsStr>(),
        )?;
        let id = nested
            .head()?
            .target()
            .ok_or_else(|| git2::Error::from_str("HEAD names no commit"))?;
        let meta = fs::symlink_metadata(&abs).map_err(|e| git2::Error::from_str(&e.to_string()))?;
        let time = |secs: i64, nanos: i64| git2::IndexTime::new(secs as i32, nanos as u32);
        self.index.add(&IndexEntry {
            ctime: time(meta.ctime(), meta.ctime_nsec()),
            mtime: time(meta.mtime(), meta.mtime_nsec()),
            dev: meta.dev() as u32,
            ino: meta.ino() as u32,
            mode: GITLINK_MODE,
            uid: meta.uid(),
            gid: meta.gid(),
            file_size: 0,
            id,
            flags: 0,
            flags_extended: 0,
            path: rel.as_os_str().as_bytes().to_vec(),
        })
    }

    /// A gitlink the index holds: moved to the submodule's `HEAD` when it is checked out; kept
    /// as it is when not (a clone without `--recursive`, a restore), as git keeps it, and when
    /// git leaves the entry as it is ([`Stager::frozen`]).
    fn stage_gitlink(&mut self, rel: &Path) {
        if self
            .index
            .get_path(rel, 0)
            .is_some_and(|e| self.frozen(rel, &e))
            || !scan::is_nested_repo(&self.workdir.join(rel))
        {
            return;
        }
        match self.add_gitlink(rel) {
            Ok(()) => self.touch(rel),
            Err(e) => tracing::warn!(
                path = %rel.display(),
                "submodule has no commit checked out, its saved commit is kept: {}",
                e.message()
            ),
        }
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
        if !self.frozen(rel, &entry) && self.index.remove_path(rel).is_ok() {
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

/// Each entry of `index` as `(path, stage, mode, id)`, in the index's order.
fn entry_ids(index: &Index) -> Vec<(Vec<u8>, u16, u32, Oid)> {
    index
        .iter()
        .map(|e| (e.path, (e.flags >> 12) & 3, e.mode, e.id))
        .collect()
}

/// The paths whose entries differ between two lists of [`entry_ids`].
fn changed_entries(
    before: Vec<(Vec<u8>, u16, u32, Oid)>,
    after: Vec<(Vec<u8>, u16, u32, Oid)>,
) -> BTreeSet<PathBuf> {
    let path = |bytes: Vec<u8>| PathBuf::from(std::ffi::OsString::from_vec(bytes));
    let (mut before, mut after) = (before.into_iter().peekable(), after.into_iter().peekable());
    let mut changed = BTreeSet::new();
    loop {
        let order = match (before.peek(), after.peek()) {
            (None, None) => return changed,
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (Some(b), Some(a)) => (&b.0, b.1).cmp(&(&a.0, a.1)),
        };
        match order {
            std::cmp::Ordering::Less => {
                changed.insert(path(before.next().expect("peeked").0));
            }
            std::cmp::Ordering::Greater => {
                changed.insert(path(after.next().expect("peeked").0));
            }
            std::cmp::Ordering::Equal => {
                let (b, a) = (
                    before.next().expect("peeked"),
                    after.next().expect("peeked"),
                );
                if (b.2, b.3) != (a.2, a.3) {
                    changed.insert(path(a.0));
                }
            }
        }
    }
}

/// The entry `git_index_add_bypath` makes for the regular file `rel` from its lstat, where
/// `core.fileMode` is on (its id and size are the bytes' `add_frombuffer` writes).
fn raw_entry(rel: &Path, meta: &Metadata) -> IndexEntry {
    let time = |secs: i64, nanos: i64| git2::IndexTime::new(secs as i32, nanos as u32);
    IndexEntry {
        ctime: time(meta.ctime(), meta.ctime_nsec()),
        mtime: time(meta.mtime(), meta.mtime_nsec()),
        dev: meta.rdev() as u32,
        ino: meta.ino() as u32,
        mode: if meta.mode() & 0o100 != 0 {
            0o100755
        } else {
            0o100644
        },
        uid: meta.uid(),
        gid: meta.gid(),
        file_size: meta.len() as u32,
        id: Oid::ZERO_SHA1,
        flags: 0,
        flags_extended: 0,
        path: rel.as_os_str().as_bytes().to_vec(),
    }
}

/// The largest file `Stager::add_raw` reads itself.
const RAW_MAX: u64 = 1 << 20;

/// The bytes of the regular file at `abs`, opened without following a symbolic link or
/// waiting on a FIFO; `None` if it is no longer a regular file, is over `RAW_MAX` by now, or
/// cannot be read.
fn read_regular(abs: &Path) -> Option<Vec<u8>> {
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(abs)
        .ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() {
        return None;
    }
    let mut bytes = Vec::with_capacity(meta.len().min(RAW_MAX) as usize);
    file.take(RAW_MAX + 1).read_to_end(&mut bytes).ok()?;
    (bytes.len() as u64 <= RAW_MAX).then_some(bytes)
}

/// A path the disk would not describe (permissions): its saved version stays.
fn warn_unreadable(rel: &Path, lstat: &std::io::Result<Metadata>) {
    if let Err(e) = lstat {
        tracing::warn!(path = %rel.display(), "cannot inspect, the saved version is kept: {e}");
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// libgit2 is the oracle: for files of every permission class, empty ones and ones in
    /// folders, the entry `add_raw` inserts is the one `git_index_add_bypath` inserts, field by
    /// field.
    #[test]
    fn a_raw_entry_is_the_one_add_bypath_makes() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        let other = Repository::open(dir.path()).unwrap();
        let (mut by_libgit2, mut raw) = (repo.index().unwrap(), other.index().unwrap());
        let files: &[(&str, &[u8], u32)] = &[
            ("a.txt", b"one\n", 0o644),
            ("bin/run", b"#!/bin/sh\n", 0o755),
            ("empty", b"", 0o600),
            ("d/e/f.ts", b"crlf\r\n", 0o744),
            ("g", b"\0bin", 0o654),
            ("h", b"x", 0o711),
        ];
        let fields = |e: IndexEntry| {
            (
                (e.ctime.seconds(), e.ctime.nanoseconds()),
                (e.mtime.seconds(), e.mtime.nanoseconds()),
                (e.dev, e.ino, e.mode, e.uid, e.gid, e.file_size),
                (e.id, e.flags, e.flags_extended, e.path),
            )
        };
        for (rel, body, mode) in files {
            let abs = dir.path().join(rel);
            fs::create_dir_all(abs.parent().unwrap()).unwrap();
            fs::write(&abs, body).unwrap();
            fs::set_permissions(&abs, fs::Permissions::from_mode(*mode)).unwrap();
            let rel = Path::new(rel);
            by_libgit2.add_path(rel).unwrap();
            let meta = fs::symlink_metadata(&abs).unwrap();
            let bytes = read_regular(&abs).unwrap();
            raw.add_frombuffer(&raw_entry(rel, &meta), &bytes).unwrap();
            assert_eq!(
                fields(raw.get_path(rel, 0).unwrap()),
                fields(by_libgit2.get_path(rel, 0).unwrap()),
                "{}",
                rel.display()
            );
        }
    }

    #[test]
    fn what_is_no_longer_a_small_regular_file_is_not_read_raw() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        fs::write(&file, b"x").unwrap();
        assert_eq!(read_regular(&file).as_deref(), Some(&b"x"[..]));
        std::os::unix::fs::symlink(&file, dir.path().join("link")).unwrap();
        assert_eq!(read_regular(&dir.path().join("link")), None);
        rustix::fs::mknodat(
            rustix::fs::CWD,
            dir.path().join("fifo"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        assert_eq!(read_regular(&dir.path().join("fifo")), None);
        fs::write(&file, vec![b'x'; RAW_MAX as usize + 1]).unwrap();
        assert_eq!(read_regular(&file), None);
        assert_eq!(read_regular(&dir.path().join("gone")), None);
    }
}
