//! Who wrote `.git/index`: the watcher keeps the stamp of the file as it last read or wrote
//! it, and any other stamp is someone else's write (a `git` command, `restore`, `sync`, a kill
//! before the watcher's own write), which is read again and wins. The stamp's time is also the
//! index's time for git's racy-clean rule. The stamp is shared with the watch stage
//! ([`OwnIndex`]), which tells the user's writes of the file from the watcher's own by it.

use std::fs::{self, Metadata};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, TryLockError};

use git2::{Index, IndexEntry};

use crate::sparse;

/// The stamp of the index file as the watcher last read or wrote it, shared between the
/// save thread and the watch stage: an inotify event on `.git/index` is the user's git (a
/// `git reset`, a `git rm --cached`, a commit) only when the file is another version.
#[derive(Clone, Default)]
pub struct OwnIndex(Arc<Mutex<Option<FileStamp>>>);

impl OwnIndex {
    /// Whether the index file at `path` is not the watcher's version. While the watcher is
    /// writing it, the event is its own write (never blocks: it runs on the async runtime).
    pub fn written_elsewhere(&self, path: &Path) -> bool {
        match self.0.try_lock() {
            Ok(own) => FileStamp::of(path) != *own,
            Err(TryLockError::WouldBlock) => false,
            Err(TryLockError::Poisoned(own)) => FileStamp::of(path) != *own.into_inner(),
        }
    }
}

/// The index file and the version of it the watcher last read or wrote.
pub(crate) struct IndexFile {
    path: PathBuf,
    stamp: Option<FileStamp>,
    /// `stamp`, for the watch stage.
    shared: OwnIndex,
}

impl IndexFile {
    /// The file at `path`, as it is now (the watcher is about to read it); its stamp is kept
    /// in `shared` too.
    pub(crate) fn new(path: PathBuf, shared: OwnIndex) -> Self {
        let stamp = FileStamp::of(&path);
        *shared.0.lock().unwrap_or_else(PoisonError::into_inner) = stamp.clone();
        Self {
            path,
            stamp,
            shared,
        }
    }

    /// The size of the file as the watcher last read or wrote it (0 if there was none).
    pub(crate) fn len(&self) -> u64 {
        self.stamp.as_ref().map_or(0, |stamp| stamp.size)
    }

    /// The file is not what the watcher last read or wrote.
    pub(crate) fn written_elsewhere(&self) -> bool {
        FileStamp::of(&self.path) != self.stamp
    }

    /// Reads the file into `index`. A sparse index (`sdir`), which libgit2 cannot read, is
    /// first written in full by git (`sparse::expand`), then read.
    pub(crate) fn read(&mut self, index: &mut Index, workdir: &Path) -> Result<(), git2::Error> {
        // Stamped before reading: a write racing the read shows as a change next time.
        let stamp = FileStamp::of(&self.path);
        match index.read(true) {
            Ok(()) => self.set_stamp(stamp),
            Err(e) => {
                if !sparse::expand(workdir) {
                    return Err(e);
                }
                self.set_stamp(FileStamp::of(&self.path));
                index.read(true)?;
            }
        }
        Ok(())
    }

    /// Writes `index` to the file (libgit2: `index.lock`, then a rename) and keeps its stamp;
    /// the shared stamp stays locked meanwhile, so the event of the rename is known as the
    /// watcher's.
    pub(crate) fn write(&mut self, index: &mut Index) -> Result<(), git2::Error> {
        let mut shared = self.shared.0.lock().unwrap_or_else(PoisonError::into_inner);
        let written = index.write();
        self.stamp = FileStamp::of(&self.path);
        shared.clone_from(&self.stamp);
        written
    }

    fn set_stamp(&mut self, stamp: Option<FileStamp>) {
        *self.shared.0.lock().unwrap_or_else(PoisonError::into_inner) = stamp.clone();
        self.stamp = stamp;
    }

    /// Git's "racily clean" rule: a file modified in the same clock tick as the index was
    /// written may have changed without its stat data showing it, so only files modified
    /// strictly before the index may skip hashing. The tick is a whole second, as git built
    /// without `USE_NSEC` (the common build) counts it: a file written in the index's second
    /// is hashed again by git, so it is here too (with changed attributes, that gives a new
    /// blob).
    pub(crate) fn modified_before(&self, meta: &Metadata) -> bool {
        self.stamp
            .as_ref()
            .is_some_and(|stamp| meta.mtime() < stamp.mtime.0)
    }
}

/// Git's own shortcut: an entry whose stat data still matches the file is not hashed again.
pub(crate) fn stat_matches(entry: &IndexEntry, meta: &Metadata) -> bool {
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
