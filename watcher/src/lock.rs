//! The watcher's two advisory locks: one watcher per repository, one git mutation at a time.
//!
//! Both live in `.git/project-watcher/` and use `flock`, so a killed holder releases them
//! with its file descriptors: a lock file left on disk never blocks anyone.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::layout::{self, INDEX_UNWRITTEN, INSTANCE_LOCK, REPO_LOCK, state_file};

/// A lock that could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another watcher runs on this repository.
    #[error(
        "another project-watcher (pid {holder}) is already watching this repository; lock file {path}"
    )]
    Held {
        /// The lock file.
        path: PathBuf,
        /// The pid the holder wrote into it (`unknown` when unreadable).
        holder: String,
    },
    /// The lock file could not be opened or locked.
    #[error("cannot open lock file {path}: {source}")]
    Io {
        /// The lock file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
}

/// Held for the life of a `watch`: a second watcher on the same repository exits with code 3.
#[derive(Debug)]
pub struct InstanceLock {
    _file: File,
}

impl InstanceLock {
    /// Takes the lock without waiting and records our pid in it for the error message of the
    /// next contender. A corrupt or stale pid in the file is simply overwritten.
    pub fn try_acquire(git_dir: &Path) -> Result<Self, LockError> {
        let path = state_file(git_dir, INSTANCE_LOCK);
        let mut file = open_lock_file(git_dir, &path)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                let holder = if holder.is_empty() || holder.len() > 20 {
                    "unknown".to_owned()
                } else {
                    holder.to_owned()
                };
                return Err(LockError::Held { path, holder });
            }
            Err(TryLockError::Error(source)) => return Err(LockError::Io { path, source }),
        }
        let write_pid = |file: &mut File| -> io::Result<()> {
            file.set_len(0)?;
            file.seek(SeekFrom::Start(0))?;
            writeln!(file, "{}", std::process::id())
        };
        write_pid(&mut file).map_err(|source| LockError::Io { path, source })?;
        Ok(Self { _file: file })
    }
}

/// Whether a watcher holds the instance lock of this repository. Probes with a shared lock,
/// which a watcher starting at that instant would see as held for a moment only.
pub fn watcher_running(git_dir: &Path) -> bool {
    let path = state_file(git_dir, INSTANCE_LOCK);
    let Ok(file) = File::open(&path) else {
        return false;
    };
    matches!(file.try_lock_shared(), Err(TryLockError::WouldBlock))
}

/// Held around every git mutation (stage + commit, restore, sync). Released on drop.
#[derive(Debug)]
pub struct RepoLock {
    _file: File,
}

impl RepoLock {
    /// Blocks until the lock is free. Call it from a blocking context (`spawn_blocking`).
    pub fn acquire(git_dir: &Path) -> Result<Self, LockError> {
        let path = state_file(git_dir, REPO_LOCK);
        let file = open_lock_file(git_dir, &path)?;
        file.lock()
            .map_err(|source| LockError::Io { path, source })?;
        Ok(Self { _file: file })
    }

    /// For `sync`, `restore` and `restore --at`: takes the lock once a running watcher has
    /// written the changes it holds for `.git/index` only in memory (its
    /// [`INDEX_UNWRITTEN`] marker, made and removed under this lock), waiting at most
    /// [`INDEX_WRITE_WAIT`]; after that, or with no watcher running, it goes on (their trees
    /// come out the same from an older index).
    pub(crate) fn acquire_after_watcher_index(git_dir: &Path) -> Result<Self, LockError> {
        let marker = state_file(git_dir, INDEX_UNWRITTEN);
        let deadline = std::time::Instant::now() + INDEX_WRITE_WAIT;
        loop {
            let lock = Self::acquire(git_dir)?;
            if !marker.exists()
                || std::time::Instant::now() >= deadline
                || !watcher_running(git_dir)
            {
                return Ok(lock);
            }
            drop(lock);
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Takes the lock if it is free, else `None`.
    pub fn try_acquire(git_dir: &Path) -> Result<Option<Self>, LockError> {
        let path = state_file(git_dir, REPO_LOCK);
        let file = open_lock_file(git_dir, &path)?;
        match file.try_lock() {
            Ok(()) => Ok(Some(Self { _file: file })),
            Err(TryLockError::WouldBlock) => Ok(None),
            Err(TryLockError::Error(source)) => Err(LockError::Io { path, source }),
        }
    }
}

fn open_lock_file(git_dir: &Path, path: &Path) -> Result<File, LockError> {
    let io_err = |source| LockError::Io {
        path: path.to_owned(),
        source,
    };
    // Only the watcher's own folder is made, never `.git` itself: a repository deleted
    // under a running watcher must not come back as an empty `.git`.
    layout::create_state_dir(git_dir).map_err(io_err)?;
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(io_err)
}

/// How long `sync`, `restore` and `restore --at` wait for a running watcher's index write.
pub(crate) const INDEX_WRITE_WAIT: Duration = Duration::from_secs(5);

/// How old an `index.lock` must be before it counts as left behind by a dead process.
pub(crate) const STALE_INDEX_LOCK_AGE: Duration = Duration::from_secs(60);

/// Removes a git lock file (`index.lock`, `refs/heads/main.lock`, ...) when no process has it
/// open and it is older than `max_age`. Returns whether it removed it. Call it with the repo
/// lock held.
pub(crate) fn remove_stale_lock_file(path: &Path, max_age: Duration) -> io::Result<bool> {
    let path = path.to_owned();
    let meta = match fs::symlink_metadata(&path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    let age = meta
        .modified()
        .ok()
        .and_then(|m| SystemTime::now().duration_since(m).ok())
        .unwrap_or_default();
    if age < max_age || is_open_by_any_process(&path) {
        return Ok(false);
    }
    match fs::remove_file(&path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// The lock files under `.git/refs/remotes/` (the pusher records each confirmed push there;
/// a lock left by a kill in that moment would fail every later push).
pub(crate) fn remote_ref_lock_files(git_dir: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            match entry.file_type() {
                Ok(t) if t.is_dir() => walk(&path, found),
                Ok(_) if path.extension().is_some_and(|e| e == "lock") => found.push(path),
                _ => {}
            }
        }
    }
    let mut found = Vec::new();
    walk(&git_dir.join("refs/remotes"), &mut found);
    found
}

/// Present while a watcher saves (stage, index write, commit: [`Self::SAVING`]) or pushes
/// ([`Self::PUSHING`]). A watcher killed inside one leaves it behind, which tells the next
/// one that the git lock files it finds are its predecessor's, not a live `git` command's, so
/// they need not age 60 s before removal.
pub(crate) struct WorkMarker {
    path: PathBuf,
}

impl WorkMarker {
    pub(crate) const SAVING: &str = layout::SAVING;
    pub(crate) const PUSHING: &str = layout::PUSHING;

    /// Whether the previous run of `work` ended without removing its marker (its process died).
    pub(crate) fn left_behind(git_dir: &Path, work: &str) -> bool {
        state_file(git_dir, work).exists()
    }

    /// Marks `work` as started; the marker goes when this is dropped.
    pub(crate) fn begin(git_dir: &Path, work: &str) -> io::Result<Self> {
        let path = state_file(git_dir, work);
        File::create(&path)?;
        Ok(Self { path })
    }
}

impl Drop for WorkMarker {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// Removes each of `paths` that is a stale lock file (see [`remove_stale_lock_file`]),
/// at once when `predecessor_died`, else once 60 s old; each removal is a warning.
pub(crate) fn clear_stale_locks(paths: impl IntoIterator<Item = PathBuf>, predecessor_died: bool) {
    let max_age = if predecessor_died {
        Duration::ZERO
    } else {
        STALE_INDEX_LOCK_AGE
    };
    for path in paths {
        match remove_stale_lock_file(&path, max_age) {
            Ok(true) => tracing::warn!(
                path = %path.display(),
                "removed a stale git lock file left by a dead process"
            ),
            Ok(false) => {}
            Err(e) => tracing::warn!(path = %path.display(), "cannot check a git lock file: {e}"),
        }
    }
}

/// Looks through `/proc/*/fd` for a descriptor pointing at `path`. Processes we cannot
/// inspect are skipped: age is then the only evidence, as in git itself.
fn is_open_by_any_process(path: &Path) -> bool {
    let Ok(target) = fs::canonicalize(path) else {
        return false;
    };
    let Ok(procs) = fs::read_dir("/proc") else {
        return false;
    };
    procs
        .flatten()
        .filter(|p| {
            p.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|p| fs::read_dir(p.path().join("fd")).ok())
        .flat_map(|fds| fds.flatten())
        .any(|fd| fs::read_link(fd.path()).is_ok_and(|l| l == target))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_instance_lock_is_refused_with_holder_pid() {
        let dir = tempfile::tempdir().unwrap();
        let _first = InstanceLock::try_acquire(dir.path()).unwrap();
        let err = InstanceLock::try_acquire(dir.path()).unwrap_err();
        match err {
            LockError::Held { holder, .. } => assert_eq!(holder, std::process::id().to_string()),
            other => panic!("expected Held, got {other}"),
        }
    }

    #[test]
    fn instance_lock_is_free_again_after_drop_even_with_garbage_in_file() {
        let dir = tempfile::tempdir().unwrap();
        layout::create_state_dir(dir.path()).unwrap();
        fs::write(state_file(dir.path(), INSTANCE_LOCK), b"\xff\x00garbage").unwrap();
        drop(InstanceLock::try_acquire(dir.path()).unwrap());
        InstanceLock::try_acquire(dir.path()).unwrap();
    }

    #[test]
    fn repo_lock_excludes_a_second_holder_until_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let held = RepoLock::acquire(dir.path()).unwrap();
        assert!(RepoLock::try_acquire(dir.path()).unwrap().is_none());
        drop(held);
        assert!(RepoLock::try_acquire(dir.path()).unwrap().is_some());
    }

    #[test]
    fn stale_index_lock_is_removed_only_when_old() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("index.lock");
        fs::write(&lock, b"").unwrap();
        assert!(!remove_stale_lock_file(&lock, Duration::from_secs(60)).unwrap());
        assert!(lock.exists());
        assert!(remove_stale_lock_file(&lock, Duration::ZERO).unwrap());
        assert!(!lock.exists());
    }

    #[test]
    fn a_work_marker_outlives_only_a_process_that_died_inside_the_work() {
        let dir = tempfile::tempdir().unwrap();
        layout::create_state_dir(dir.path()).unwrap();
        let saving = WorkMarker::SAVING;
        assert!(!WorkMarker::left_behind(dir.path(), saving));
        let marker = WorkMarker::begin(dir.path(), saving).unwrap();
        assert!(WorkMarker::left_behind(dir.path(), saving));
        assert!(!WorkMarker::left_behind(dir.path(), WorkMarker::PUSHING));
        drop(marker);
        assert!(!WorkMarker::left_behind(dir.path(), saving));
        std::mem::forget(WorkMarker::begin(dir.path(), saving).unwrap());
        assert!(WorkMarker::left_behind(dir.path(), saving));
    }

    #[test]
    fn index_lock_held_open_by_a_process_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("index.lock");
        let _open = File::create(&lock).unwrap();
        assert!(!remove_stale_lock_file(&lock, Duration::ZERO).unwrap());
        assert!(lock.exists());
    }
}
