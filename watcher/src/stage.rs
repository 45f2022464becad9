//! The stage: brings the index in line with the working tree for the paths that changed, so
//! that writing the index as a tree gives what `git add -A` would commit.
//!
//! `Index::add_path` ignores `.gitignore`, so every path passes the filter first. Paths that
//! changed cost one `lstat` and one hash each; only subtrees (start-up, rescans, new
//! directories, rule edits) are walked. The `Index` is kept between batches and re-read
//! only when someone else (a `git` command, `restore`, `sync`) wrote it.

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsStr;
use std::fs::{self, Metadata};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use git2::{Index, IndexEntry, Oid, Repository};

use crate::changes::Changes;
use crate::filter::Filter;
use crate::scan::{self, EntryKind};

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
    filter: Arc<RwLock<Filter>>,
    max_file_size: u64,
    skipped: Skipped,
    dirty: bool,
    /// When the index file was last written (seconds, nanoseconds), for git's racy check.
    index_written: Option<(i64, i64)>,
    /// The first readable file of this batch that could not be stored.
    store_failure: Option<(PathBuf, git2::Error)>,
}

impl Stager {
    pub fn new(
        repo: &Repository,
        workdir: &Path,
        filter: Arc<RwLock<Filter>>,
        max_file_size: u64,
    ) -> Result<Self, StageError> {
        let index = repo.index().map_err(|source| StageError::Index {
            dir: workdir.to_owned(),
            source,
        })?;
        Ok(Self {
            workdir: workdir.to_owned(),
            index,
            filter,
            max_file_size,
            skipped: Skipped::new(),
            dirty: false,
            store_failure: None,
            index_written: None,
        })
    }

    /// Files over the size limit, as of the latest batch.
    pub fn skipped(&self) -> &Skipped {
        &self.skipped
    }

    /// Applies `changes` to the index, writes it, and returns the tree it describes.
    /// Call it with the repo lock held.
    pub fn stage(&mut self, changes: &Changes) -> Result<Oid, StageError> {
        let err = |source| StageError::Index {
            dir: self.workdir.clone(),
            source,
        };
        self.index.read(false).map_err(err)?;
        self.index_written = self
            .index
            .path()
            .and_then(|p| fs::metadata(p).ok())
            .map(|m| (m.mtime(), m.mtime_nsec()));
        let filter = Arc::clone(&self.filter);
        let filter = filter.read().unwrap_or_else(|e| e.into_inner());
        let (subtrees, paths) = changes.minimal();
        for dir in subtrees {
            self.stage_subtree(dir, &filter);
        }
        for path in paths {
            self.stage_path(path, &filter);
        }
        if let Some((path, source)) = self.store_failure.take() {
            return Err(StageError::Store {
                dir: self.workdir.clone(),
                path,
                source,
            });
        }
        if self.dirty {
            self.index.write().map_err(|source| StageError::Index {
                dir: self.workdir.clone(),
                source,
            })?;
            self.dirty = false;
        }
        self.index.write_tree().map_err(|source| StageError::Index {
            dir: self.workdir.clone(),
            source,
        })
    }

    fn stage_path(&mut self, rel: &Path, filter: &Filter) {
        let abs = self.workdir.join(rel);
        let meta = match fs::symlink_metadata(&abs) {
            Ok(meta) => meta,
            Err(e) if is_gone(&e) => return self.remove(rel),
            Err(e) => {
                tracing::warn!(path = %rel.display(), "cannot inspect, the saved version is kept: {e}");
                return;
            }
        };
        if !filter.is_kept(rel, meta.is_dir()) {
            return self.remove(rel);
        }
        match scan::entry_kind(&abs, &meta) {
            Some(EntryKind::File) => self.add_file(rel, &meta, false),
            Some(EntryKind::NestedRepo) => self.add_nested_repo(rel),
            None if meta.is_dir() => self.stage_subtree(rel, filter),
            None => self.remove(rel),
        }
    }

    /// Makes the index under `dir` exactly the kept entries under it.
    fn stage_subtree(&mut self, dir: &Path, filter: &Filter) {
        let top = dir.as_os_str().is_empty();
        if !top {
            let abs = self.workdir.join(dir);
            match fs::symlink_metadata(&abs) {
                Ok(meta) if meta.is_dir() && filter.is_kept(dir, true) => {
                    if scan::is_nested_repo(&abs) {
                        return self.add_nested_repo(dir);
                    }
                }
                _ => return self.stage_path_not_dir(dir, filter),
            }
        }
        let (entries, unreadable) = scan::kept_entries(&self.workdir, dir, filter);
        let in_scope = |path: &Path| {
            (top || path.starts_with(dir)) && !unreadable.iter().any(|u| path.starts_with(u))
        };
        let mut kept: HashSet<PathBuf> = HashSet::with_capacity(entries.len());
        for (rel, kind, meta) in entries {
            match kind {
                EntryKind::File => self.add_file(&rel, &meta, true),
                EntryKind::NestedRepo => self.add_nested_repo(&rel),
            }
            kept.insert(rel);
        }
        let stale: Vec<PathBuf> = self
            .entries_under(dir)
            .into_iter()
            .filter(|path| in_scope(path) && !kept.contains(path))
            .collect();
        for path in stale {
            self.remove_entry(&path);
        }
        self.skipped
            .retain(|path, _| !in_scope(path) || kept.contains(path));
    }

    /// Index paths under `dir` (all of them for the top), found by binary search: many small
    /// subtrees in one batch must not each cost a pass over the whole index.
    fn entries_under(&self, dir: &Path) -> Vec<PathBuf> {
        let to_path = |entry: IndexEntry| PathBuf::from(OsStr::from_bytes(&entry.path));
        if dir.as_os_str().is_empty() {
            return self.index.iter().map(to_path).collect();
        }
        let mut prefix = dir.as_os_str().as_bytes().to_vec();
        prefix.push(b'/');
        let Ok(start) = self.index.find_prefix(OsStr::from_bytes(&prefix)) else {
            return Vec::new();
        };
        (start..self.index.len())
            .map_while(|i| self.index.get(i))
            .take_while(|entry| entry.path.starts_with(&prefix))
            .map(to_path)
            .collect()
    }

    /// A subtree root that is no longer a kept directory: stage it as a single path.
    fn stage_path_not_dir(&mut self, rel: &Path, filter: &Filter) {
        self.remove_dir_entries(rel);
        match fs::symlink_metadata(self.workdir.join(rel)) {
            Ok(meta) if !meta.is_dir() => self.stage_path(rel, filter),
            _ => self.remove(rel),
        }
    }

    fn add_file(&mut self, rel: &Path, meta: &Metadata, skip_unchanged: bool) {
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
            && self
                .index
                .get_path(rel, 0)
                .is_some_and(|entry| stat_matches(&entry, meta))
            && self.modified_before_the_index(meta)
        {
            return;
        }
        self.clear_the_way(rel);
        match self.index.add_path(rel) {
            Ok(()) => self.dirty = true,
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

    /// A nested repository is recorded as a gitlink to its `HEAD`, as `git add -A` does.
    /// Without a commit `git add -A` refuses the whole add; here only that directory is left out.
    fn add_nested_repo(&mut self, rel: &Path) {
        self.clear_the_way(rel);
        match self.index.add_path(rel) {
            Ok(()) => self.dirty = true,
            Err(e) => tracing::warn!(
                path = %rel.display(),
                "nested git repository is not saved (it needs a commit checked out): {}",
                e.message()
            ),
        }
    }

    /// Git's "racily clean" rule: a file modified in the same clock tick as the index was
    /// written may have changed without its stat data showing it, so only files modified
    /// strictly before the index may skip hashing.
    fn modified_before_the_index(&self, meta: &Metadata) -> bool {
        self.index_written
            .is_some_and(|written| (meta.mtime(), meta.mtime_nsec()) < written)
    }

    /// A file where a directory was (or the other way round) must not leave the old entries
    /// behind: an index with both `a` and `a/b` cannot be written as a tree.
    fn clear_the_way(&mut self, rel: &Path) {
        self.remove_dir_entries(rel);
        for ancestor in rel.ancestors().skip(1) {
            if ancestor.as_os_str().is_empty() {
                break;
            }
            self.remove_entry(ancestor);
        }
    }

    fn remove(&mut self, rel: &Path) {
        self.remove_entry(rel);
        self.remove_dir_entries(rel);
        self.skipped.retain(|path, _| !path.starts_with(rel));
    }

    fn remove_entry(&mut self, rel: &Path) {
        if self.index.get_path(rel, 0).is_some() && self.index.remove_path(rel).is_ok() {
            self.dirty = true;
        }
    }

    fn remove_dir_entries(&mut self, rel: &Path) {
        let before = self.index.len();
        if self.index.remove_dir(rel, 0).is_ok() && self.index.len() != before {
            self.dirty = true;
        }
    }
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
