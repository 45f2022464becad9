//! The save stage: a batch of changes staged into the in-memory index, its tree, the commit;
//! and the index file written when the daemon says the watcher is quiet. It runs on a thread
//! of its own (libgit2's index cannot move between threads) and takes jobs through a channel.
//!
//! What is on disk when: a save writes the new blobs and the trees on the changed paths into
//! the object store; when the tree differs from `HEAD`'s, the index file, then the commit,
//! then the branch moves; only then is the save reported. So when `HEAD` moves, the index
//! already names what it does (a user's `git add; git commit` right after keeps the save).
//! A save that changed only entries' stat data leaves the file to the quiet write
//! ([`SaveWorker::write_index`]), which writes it for stat data alone only when hashing those
//! files again would cost the next reader more than the write. A kill before the branch
//! moves leaves an index ahead of `HEAD`, which the next start reads: its pass commits the
//! same tree.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::Receiver;
use std::time::Duration;

use git2::Repository;
use shmastra_contract::MANIFEST_FILE;
use tokio::sync::{oneshot, watch};

use crate::changes::Changes;
use crate::commit::{self, Committed};
use crate::filter::{Filter, TrackedIgnored};
use crate::layout;
use crate::lock::{self, LockError, RepoLock};
use crate::manifest;
use crate::retry::{self, Backoff};
use crate::scan::Listing;
use crate::stage::{OwnIndex, StageError, Stager};
use crate::status::SkippedFile;
use crate::user_git::{self, GitProcess, Pause, RepoPlaces};
use crate::watch::{TreeWatcher, WalkAhead};

#[derive(Debug, thiserror::Error)]
pub enum SaveError {
    /// The repository is being deleted under the watcher: nothing may be written there.
    #[error(
        "the project's repository {git_dir} is gone (the project directory was deleted?); stopping without writing anything there"
    )]
    Gone { git_dir: PathBuf },
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(transparent)]
    Stage(#[from] StageError),
    #[error("git failed in {}: {}", .dir.display(), .source.message())]
    Git { dir: PathBuf, source: git2::Error },
    #[error("cannot write {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("the save thread cannot run: {0}")]
    Thread(io::Error),
}

/// What one save did.
pub struct Saved {
    /// The commit it made, if the tree changed.
    pub committed: Option<Committed>,
    /// Files left out of the commits.
    pub skipped: Vec<SkippedFile>,
    /// The in-memory index holds changes the index file does not yet.
    pub index_unwritten: bool,
    /// Why nothing was saved: the user's git is in the middle of something.
    pub paused: Option<Pause>,
}

/// What a save did to the repository.
enum Done {
    Committed(Option<Committed>),
    Paused(Pause),
}

/// Whether the repository is being deleted under us: a part git needs to call it one (`HEAD`,
/// `objects/`, `refs/`) or the watcher's own folder (made at start, never removed by the
/// watcher, `restore` or `sync`) has gone. Writing anything then would recreate folders inside
/// a tree `rm -rf` is deleting, and make it fail.
/// In a linked worktree, `git_dir` holds `HEAD` and the rest is in the common directory.
pub fn repository_gone(git_dir: &Path) -> bool {
    let common = layout::common_dir(git_dir);
    !git_dir.join("HEAD").exists()
        || !common.join("config").exists()
        || !common.join("objects").is_dir()
        || !common.join("refs").is_dir()
        || !layout::state_dir(git_dir).is_dir()
}

/// The blocking half: stage and commit under the repo lock. It owns the `Repository` and the
/// `Index` between batches.
struct Saver {
    repo: Repository,
    stager: Stager,
    git_dir: PathBuf,
    workdir: PathBuf,
    /// Where the user's git commands run, to find them in `/proc`.
    places: RepoPlaces,
}

/// The watch stage and the first save's result, back from the start-up pass.
type Started = (Box<TreeWatcher>, Result<Saved, SaveError>);

enum Job {
    /// The start-up pass: one walk for the watches and the first save.
    Start(WalkAhead, oneshot::Sender<Started>),
    Save(Changes, oneshot::Sender<Result<Saved, SaveError>>),
    WriteIndex(oneshot::Sender<Result<IndexOutcome, SaveError>>),
}

/// What a write of the index file came to.
#[derive(Debug, PartialEq, Eq)]
pub enum IndexOutcome {
    /// Written, or nothing was left to write: the file is as the saves left it, or a
    /// half-done operation of the user's git owns it and the save at its end reads theirs.
    Done,
    /// A git command holds a lock (a `git status` refreshing the index, say) or may move
    /// `HEAD`: it may end without writing the index, so the write is tried again later.
    Busy(Pause),
}

impl Saver {
    /// One save; a failure caused by the repository vanishing mid-save is [`SaveError::Gone`].
    fn save(
        &mut self,
        changes: &Changes,
        listings: Option<Receiver<Vec<Listing>>>,
    ) -> Result<Done, SaveError> {
        self.guarded(|saver| saver.save_in_repository(changes, listings))
    }

    /// The start-up pass: a full save staged from the listings of the walk that sets every
    /// watch on its own thread (a save that stops before staging leaves the walk to set the
    /// watches alone); the save stage keeps the rules that walk loaded.
    fn start(&mut self, walk: WalkAhead) -> Started {
        let WalkAhead { listings, walking } = walk;
        let result = self.save(&Changes::everything(), Some(listings));
        let watcher = walking.finish();
        self.stager.set_rules(watcher.rules().filter);
        (watcher, result.map(|done| self.saved(done)))
    }

    fn saved(&self, done: Done) -> Saved {
        let (committed, paused) = match done {
            Done::Committed(committed) => (committed, None),
            Done::Paused(pause) => (None, Some(pause)),
        };
        Saved {
            committed,
            skipped: self.skipped(),
            index_unwritten: self.stager.wants_write(),
            paused,
        }
    }

    /// Writes the index file when it is behind the in-memory index.
    fn write_index(&mut self) -> Result<IndexOutcome, SaveError> {
        if !self.stager.wants_write() {
            return Ok(IndexOutcome::Done);
        }
        self.guarded(|saver| {
            let _lock = RepoLock::acquire(&saver.git_dir)?;
            let gits = saver.git_processes();
            match saver.pause(&gits) {
                Some(pause @ (Pause::Locked(_) | Pause::Command { .. })) => {
                    return Ok(IndexOutcome::Busy(pause));
                }
                Some(_) => return Ok(IndexOutcome::Done),
                None => {}
            }
            let _marker = saver.marker()?;
            match saver.stager.write_index(&saver.repo, true) {
                Err(StageError::Unmerged { .. }) => {}
                result => {
                    result?;
                }
            }
            saver.mark_unwritten();
            Ok(IndexOutcome::Done)
        })
    }

    /// Runs `work` unless the repository is gone, and calls a failure that came from it going
    /// away mid-work [`SaveError::Gone`].
    fn guarded<T>(
        &mut self,
        work: impl FnOnce(&mut Self) -> Result<T, SaveError>,
    ) -> Result<T, SaveError> {
        let gone = |git_dir: &Path| SaveError::Gone {
            git_dir: git_dir.to_owned(),
        };
        if repository_gone(&self.git_dir) {
            return Err(gone(&self.git_dir));
        }
        match work(self) {
            Err(_) if repository_gone(&self.git_dir) => Err(gone(&self.git_dir)),
            result => result,
        }
    }

    /// The `saving` work marker: a watcher killed while it exists left git lock files behind.
    fn marker(&self) -> Result<lock::WorkMarker, SaveError> {
        lock::WorkMarker::begin(&self.git_dir, lock::WorkMarker::SAVING).map_err(|source| {
            SaveError::Io {
                path: layout::state_dir(&self.git_dir),
                source,
            }
        })
    }

    fn save_in_repository(
        &mut self,
        changes: &Changes,
        listings: Option<Receiver<Vec<Listing>>>,
    ) -> Result<Done, SaveError> {
        let _lock = RepoLock::acquire(&self.git_dir)?;
        let gits = self.git_processes();
        self.remove_stale_locks(&gits);
        if let Some(pause) = self.pause(&gits) {
            return Ok(Done::Paused(pause));
        }
        let _marker = self.marker()?;
        let mut changes = changes.clone();
        if changes.env_changed {
            match manifest::sync(&self.workdir) {
                Ok(true) => {
                    changes.paths.insert(PathBuf::from(MANIFEST_FILE));
                }
                Ok(false) => {}
                Err(e) => tracing::warn!("cannot update {MANIFEST_FILE}: {e}"),
            }
        }
        let git = |source| SaveError::Git {
            dir: self.workdir.clone(),
            source,
        };
        let tree = match self.stager.stage(&self.repo, &changes, listings) {
            Ok(tree) => tree,
            Err(StageError::Unmerged { .. }) => return Ok(Done::Paused(Pause::Unmerged)),
            Err(e) => {
                self.mark_unwritten();
                return Err(e.into());
            }
        };
        // When HEAD moves, the index file holds what it names: a user's `git add; git commit`
        // right after never reverts the save.
        if commit::head_tree(&self.repo).map_err(git)? != Some(tree) {
            self.stager.write_index(&self.repo, false)?;
        }
        self.mark_unwritten();
        commit::commit_tree(&self.repo, tree)
            .map(Done::Committed)
            .map_err(git)
    }

    /// The git processes running in this repository.
    fn git_processes(&self) -> Vec<GitProcess> {
        let config = self.repo.config().ok();
        self.places.git_processes(config.as_ref())
    }

    /// Why the user's git must not be saved into now (call it with `repo.lock` held, after
    /// the stale locks went): an operation half done, a detached `HEAD`, a git lock file, a
    /// git command that may move `HEAD`.
    fn pause(&self, gits: &[GitProcess]) -> Option<Pause> {
        if let Some(op) = user_git::operation_in_progress(&self.git_dir) {
            return Some(Pause::Operation(op));
        }
        if self.repo.head_detached().unwrap_or(false) {
            return Some(Pause::Detached);
        }
        if let Some(lock) = self.git_locks().into_iter().find(|p| p.exists()) {
            return Some(Pause::Locked(lock));
        }
        gits.iter()
            .find(|g| g.moves_head())
            .map(|g| Pause::Command {
                pid: g.pid,
                subcommand: g.subcommand.clone(),
            })
    }

    /// Keeps [`layout::INDEX_UNWRITTEN`] true (under `repo.lock`), so `sync`, `restore` and
    /// `restore --at` wait for the index write rather than read an older index.
    fn mark_unwritten(&self) {
        let marker = layout::state_file(&self.git_dir, layout::INDEX_UNWRITTEN);
        let result = if self.stager.has_unwritten() {
            match std::fs::symlink_metadata(&marker) {
                Ok(_) => Ok(()),
                Err(_) => std::fs::File::create(&marker).map(drop),
            }
        } else {
            match std::fs::remove_file(&marker) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                result => result,
            }
        };
        if let Err(e) = result {
            tracing::debug!(path = %marker.display(), "cannot update the unwritten-index marker: {e}");
        }
    }

    /// The git lock files a save needs free: `index.lock`, `HEAD`'s and its branch's (in the
    /// common directory, for a linked worktree).
    fn git_locks(&self) -> Vec<PathBuf> {
        let branch = self
            .repo
            .find_reference("HEAD")
            .ok()
            .and_then(|head| head.symbolic_target().ok().flatten().map(str::to_owned));
        let mut locks = vec![
            self.git_dir.join("index.lock"),
            self.git_dir.join("HEAD.lock"),
        ];
        locks.extend(branch.map(|b| self.repo.commondir().join(format!("{b}.lock"))));
        locks
    }

    /// Git lock files no process holds and no git command in the repository may hold (one that
    /// only reads, or works on another index, cannot): removed
    /// once 60 s old, or at once when a watcher died inside a save.
    fn remove_stale_locks(&self, gits: &[GitProcess]) {
        if let Some(git) = gits.iter().find(|g| g.may_hold_locks()) {
            tracing::debug!(
                pid = git.pid,
                "a git command runs here: its lock files stay"
            );
            return;
        }
        let died = lock::WorkMarker::left_behind(&self.git_dir, lock::WorkMarker::SAVING);
        lock::clear_stale_locks(self.git_locks(), died);
    }

    fn skipped(&self) -> Vec<SkippedFile> {
        self.stager
            .skipped()
            .iter()
            .map(|(path, size)| SkippedFile {
                path: path.to_string_lossy().into_owned(),
                size: *size,
                reason: "larger than --max-file-size".to_owned(),
            })
            .collect()
    }

    fn run(mut self, jobs: std::sync::mpsc::Receiver<Job>) {
        for job in jobs {
            match job {
                Job::Start(walk, reply) => {
                    let _ = reply.send(self.start(walk));
                }
                Job::Save(changes, reply) => {
                    let result = self.save(&changes, None).map(|done| self.saved(done));
                    let _ = reply.send(result);
                }
                Job::WriteIndex(reply) => {
                    let _ = reply.send(self.write_index());
                }
            }
        }
    }
}

/// The async handle of the save thread; the thread ends when this is dropped.
pub struct SaveWorker {
    jobs: std::sync::mpsc::Sender<Job>,
}

impl SaveWorker {
    /// Starts the save thread on the repository at `workdir`, with the rules batches that
    /// carry none are judged by until one does; the tracked paths the rules ignore go to
    /// `tracked_ignored`; the stamp of the index file as the watcher last read or wrote it is
    /// kept in `own_index`.
    pub fn spawn(
        workdir: &Path,
        git_dir: &Path,
        rules: Arc<Filter>,
        tracked_ignored: watch::Sender<Arc<TrackedIgnored>>,
        max_file_size: u64,
        own_index: OwnIndex,
    ) -> Result<Self, SaveError> {
        let (jobs, rx) = std::sync::mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (workdir, git_dir) = (workdir.to_owned(), git_dir.to_owned());
        std::thread::Builder::new()
            .name("project-watcher save".to_owned())
            .spawn(move || {
                let opened = Repository::open(&workdir)
                    .map_err(|source| SaveError::Git {
                        dir: workdir.clone(),
                        source,
                    })
                    .and_then(|repo| {
                        let stager = Stager::new(
                            &repo,
                            &workdir,
                            rules,
                            tracked_ignored,
                            max_file_size,
                            own_index,
                        )?;
                        Ok(Saver {
                            places: RepoPlaces::of(&repo),
                            repo,
                            stager,
                            git_dir,
                            workdir,
                        })
                    });
                match opened {
                    Ok(saver) => {
                        let _ = ready_tx.send(Ok(()));
                        saver.run(rx);
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            })
            .map_err(SaveError::Thread)?;
        ready_rx.recv().map_err(|_| died())??;
        Ok(Self { jobs })
    }

    /// The start-up pass on the save thread: the first save staged from `walk`'s listings
    /// while that walk sets every watch; the watcher comes back with its rules loaded.
    pub async fn start(&self, walk: WalkAhead) -> Result<Started, SaveError> {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(Job::Start(walk, reply))
            .map_err(|_| died())?;
        answer.await.map_err(|_| died())
    }

    /// Stages `changes`, builds the tree and commits it when it differs from `HEAD`'s.
    pub async fn save(&self, changes: Changes) -> Result<Saved, SaveError> {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(Job::Save(changes, reply))
            .map_err(|_| died())?;
        answer.await.map_err(|_| died())?
    }

    /// Writes the index file if the in-memory index is ahead of it.
    pub async fn write_index(&self) -> Result<IndexOutcome, SaveError> {
        let (reply, answer) = oneshot::channel();
        self.jobs.send(Job::WriteIndex(reply)).map_err(|_| died())?;
        answer.await.map_err(|_| died())?
    }
}

fn died() -> SaveError {
    SaveError::Thread(io::Error::other("the save thread died"))
}

/// When a failed save is tried again: `retry.rs`'s backoff over [`retry::SAVE`].
#[derive(Debug, Default)]
pub struct SaveRetry {
    backoff: Backoff,
}

impl SaveRetry {
    /// The wait before the next attempt after another failure.
    pub fn next_delay(&mut self) -> Duration {
        self.backoff
            .next_delay_in(retry::SAVE, retry::random_jitter())
    }

    pub fn reset(&mut self) {
        self.backoff.reset();
    }
}
