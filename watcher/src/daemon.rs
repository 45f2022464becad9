//! The wiring of `watch` and `once`: opens the repository, takes the locks, starts the
//! stages, keeps the status file true, writes the index when quiet, and saves what is pending
//! on shutdown.

use shmastra_contract::duration::short_duration;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use git2::Repository;
use shmastra_contract::MANIFEST_FILE;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::changes::Changes;
use crate::config::Config;
use crate::debounce::{self, Debounce, Debounced};
use crate::filter::{Filter, TrackedIgnored};
use crate::index_write::IndexWrite;
use crate::layout;
use crate::lock::{InstanceLock, LockError, RepoLock};
use crate::manifest;
use crate::project_dir::{self, OpenError};
use crate::push::{Head, PushEvent, PushHandle};
use crate::remote::RemoteSettings;
use crate::save::{IndexOutcome, SaveError, SaveRetry, SaveWorker};
use crate::scan;
use crate::stage::OwnIndex;
use crate::status::State;
use crate::status_book::{SaveOutcome, StatusBook, head_of, log_commit};
use crate::watch::{self as watch_stage, TreeWatcher, WalkAhead, WatchError};

/// While a git lock exists or a git command runs in the repository, how often the watcher
/// looks again (a process ending shows in no file event; the look is a read of `/proc`).
const PAUSE_POLL: Duration = Duration::from_secs(1);

/// How long the loop has had nothing to do before the watcher hands back the memory its last
/// piece of work left ([`crate::resources::release_free_memory`]): long enough that a burst
/// of work is one release, short enough that the quiet watcher is small at once.
const SETTLED: Duration = Duration::from_millis(250);
/// How long a stop waits for a git command holding the index before leaving it unwritten.
const INDEX_BUSY_WAIT: Duration = Duration::from_secs(2);

/// Why `watch` or `once` stopped; [`DaemonError::exit_code`] says how the process exits.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// `--dir` is not the top of a non-bare working tree.
    #[error(transparent)]
    NotARepo(#[from] OpenError),
    /// A lock could not be taken (another watcher holds `instance.lock`: exit 3).
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The async runtime or the signal handlers could not start.
    #[error("cannot start the async runtime: {0}")]
    Runtime(io::Error),
    /// The watch stage could not start (inotify).
    #[error(transparent)]
    Watch(#[from] WatchError),
    /// The last save (at stop, or `once`'s) failed.
    #[error(transparent)]
    Save(SaveError),
    /// A file of the watcher's own could not be written.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The env files could not be added to `.git/info/exclude`.
    #[error(transparent)]
    Exclude(#[from] crate::restore::RestoreError),
    /// `once`'s push failed.
    #[error("push to {remote} failed: {error}")]
    Push {
        /// The remote's name.
        remote: String,
        /// What went wrong, without credentials.
        error: String,
    },
    /// The repository, or the project directory, was deleted under the watcher (exit 2).
    #[error(
        "the project's repository {git_dir} is gone (the project directory was deleted?); stopping without writing anything there"
    )]
    Gone {
        /// The repository's `.git`.
        git_dir: PathBuf,
    },
}

impl From<SaveError> for DaemonError {
    fn from(e: SaveError) -> Self {
        match e {
            SaveError::Gone { git_dir } => Self::Gone { git_dir },
            e => Self::Save(e),
        }
    }
}

impl DaemonError {
    /// 2 for what the user must fix in the command or the directory (or a project that is
    /// gone), 3 for a lock held by another watcher, 1 for everything that went wrong at run time.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::NotARepo(_) | Self::Gone { .. } => 2,
            Self::Lock(LockError::Held { .. }) => 3,
            _ => 1,
        }
    }
}

/// The repository's `.git` directory for `dir`, or a clear error saying how to fix it.
pub fn git_dir_of(dir: &Path) -> Result<PathBuf, DaemonError> {
    Ok(open(dir)?.2)
}

/// Opens `dir` as the top of a non-bare working tree: (workdir, git dir).
fn open(dir: &Path) -> Result<(Repository, PathBuf, PathBuf), DaemonError> {
    let repo = project_dir::open(dir)?;
    let workdir = repo
        .workdir()
        .expect("project_dir::open refuses a bare repository")
        .to_owned();
    let workdir = workdir.canonicalize().unwrap_or(workdir);
    let git_dir = repo
        .path()
        .canonicalize()
        .unwrap_or_else(|_| repo.path().to_owned());
    Ok((repo, workdir, git_dir))
}

/// `core.excludesFile`, or git's default `$XDG_CONFIG_HOME/git/ignore`. A relative path is
/// relative to the top of the working tree, where `git add` reads it from (git moves there
/// before it reads the file).
fn excludes_file(repo: &Repository, workdir: &Path) -> Option<PathBuf> {
    if let Ok(path) = repo.config().and_then(|c| c.get_path("core.excludesFile")) {
        return Some(workdir.join(path));
    }
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("git").join("ignore"))
}

/// Brings `shmastra.json` in line with `.env` under the repo lock.
async fn sync_manifest(workdir: &Path, git_dir: &Path) -> Result<(), DaemonError> {
    let (workdir, git_dir) = (workdir.to_owned(), git_dir.to_owned());
    tokio::task::spawn_blocking(move || {
        let _lock = RepoLock::acquire(&git_dir)?;
        if let Err(e) = manifest::sync(&workdir) {
            tracing::warn!("cannot update {MANIFEST_FILE}: {e}");
        }
        Ok(())
    })
    .await
    .expect("the manifest task does not panic")
}

struct Setup {
    reader: Repository,
    workdir: PathBuf,
    git_dir: PathBuf,
    filter: Filter,
}

fn setup(config: &Config) -> Result<Setup, DaemonError> {
    let (reader, workdir, git_dir) = open(&config.dir)?;
    crate::restore::exclude_env_files(&git_dir)?;
    // Its absence later means the repository is being deleted (see `repository_gone`).
    layout::create_state_dir(&git_dir).map_err(|source| DaemonError::Io {
        path: layout::state_dir(&git_dir),
        source,
    })?;
    let ignore_case = reader
        .config()
        .and_then(|c| c.get_bool("core.ignoreCase"))
        .unwrap_or(false);
    let (filter, warnings) = Filter::new(
        &workdir,
        &git_dir,
        excludes_file(&reader, &workdir),
        ignore_case,
    );
    watch_stage::report_rule_warnings(&warnings);
    Ok(Setup {
        reader,
        workdir,
        git_dir,
        filter,
    })
}

/// The pusher, when there is a remote to push to.
fn start_push(config: &Config, repo: &Repository, workdir: &Path) -> Option<Pusher> {
    if !config.push {
        tracing::info!("--no-push: commits stay local");
        return None;
    }
    if repo.find_remote(&config.remote).is_err() {
        tracing::warn!(
            remote = %config.remote,
            "no remote named {:?}: commits stay local",
            config.remote
        );
        return None;
    }
    let (heads, heads_rx) = watch::channel(None);
    let (events_tx, events) = mpsc::channel(64);
    let settings = RemoteSettings {
        workdir: workdir.to_owned(),
        remote: config.remote.clone(),
        branch: config.branch.clone(),
        token: config.token.clone(),
    };
    Some(Pusher {
        handle: PushHandle::spawn(settings, heads_rx, events_tx),
        heads,
        events,
    })
}

struct Pusher {
    handle: PushHandle,
    heads: watch::Sender<Option<Head>>,
    events: mpsc::Receiver<PushEvent>,
}

/// `project-watcher watch`: saves changes until `shutdown` resolves, then saves what is
/// pending, tries one last push within `--shutdown-timeout`, and returns.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), DaemonError> {
    let Setup {
        reader,
        workdir,
        git_dir,
        filter,
    } = setup(&config)?;
    let _instance = InstanceLock::try_acquire(&git_dir)?;
    let project = DirIdentity::of(&workdir).map_err(|source| DaemonError::Io {
        path: workdir.clone(),
        source,
    })?;
    // libgit2's object cache keeps every tree and commit a save or a push read until the
    // process ends: an idle watcher would hold the peak of its largest batch. A save reads a
    // handful of objects, so reading them again costs less than keeping them.
    git2::opts::enable_caching(false);
    // libgit2 hashes every object it reads again to check its id (git does not, outside
    // `fsck`): at 100k files that was a seventh of a save's and the quiet index write's CPU.
    git2::opts::strict_hash_verification(false);
    // Nor look up every entry of a tree it writes: the save wrote or read each one just before.
    git2::opts::strict_object_creation(false);
    // Written before the watches exist, so the watcher does not see its own write as a change.
    sync_manifest(&workdir, &git_dir).await?;
    let (problems_tx, mut problems) = watch::channel(None);
    let (tracked_ignored_tx, tracked_ignored) = watch::channel(Arc::new(TrackedIgnored::default()));
    // The index file as the save stage last read or wrote it: the watch stage tells the user's
    // writes of it from the watcher's own by it.
    let own_index = OwnIndex::default();
    let watcher = TreeWatcher::new(
        &workdir,
        &git_dir,
        filter,
        problems_tx,
        tracked_ignored,
        config.event_buffer,
        own_index.clone(),
    )?;
    let rules = watcher.rules().filter;
    // One walk sets every watch and compares every kept file with the index: it starts now,
    // on a thread of its own, while the save thread reads the index.
    let walk = WalkAhead::start(Box::new(watcher));
    let saver = SaveWorker::spawn(
        &workdir,
        &git_dir,
        rules,
        tracked_ignored_tx,
        config.max_file_size,
        own_index,
    )?;
    let pusher = start_push(&config, &reader, &workdir);
    let mut book = StatusBook::new(&git_dir, &reader, &config.remote, problems.borrow().clone());
    let mut retry = SaveRetry::default();
    // A batch that failed or was paused, and when it is tried again (`None`: with the next
    // batch, for a pause that ends with a change of the git directory).
    let mut failed: Option<(Changes, Option<Instant>)> = None;
    // When the index file is written: once the watcher has been quiet, or at the latest
    // `IndexWrite::cap` after the first save it lacks, however busy the project is.
    let mut index_write = IndexWrite::new(config.index_quiet, config.max_delay);
    // A failed first pass (a stale lock, a full disk, a read-only `.git`) is retried like any
    // other save: exiting would only make the supervisor restart us into the same fault.
    let (watcher, first) = saver.start(walk).await?;
    let watched = watcher.watched_dirs();
    match book.record_save(first, &reader, pusher.as_ref().map(|p| &p.heads)) {
        SaveOutcome::Done { index_unwritten } => index_write.saved(index_unwritten),
        SaveOutcome::Paused { look_again } => {
            failed = Some((
                Changes::everything(),
                look_again.then(|| Instant::now() + PAUSE_POLL),
            ));
        }
        SaveOutcome::Failed(e) => {
            let wait = retry.next_delay();
            tracing::error!(retry_in = %short_duration(wait), "saving failed, trying again: {e}");
            failed = Some((Changes::everything(), Some(Instant::now() + wait)));
        }
        SaveOutcome::Gone { git_dir } => return Err(DaemonError::Gone { git_dir }),
    }
    if let Some(p) = &pusher {
        p.heads.send_replace(head_of(&reader));
    }
    book.write();
    tracing::info!(dir = %workdir.display(), watched_dirs = watched, "ready");

    let (changes_tx, changes_rx) = mpsc::channel(256);
    let (debounced_tx, mut debounced) = mpsc::channel(4);
    let (stop_watch, stop_watch_rx) = oneshot::channel();
    let watch_task = tokio::spawn(watcher.run(changes_tx, stop_watch_rx));
    let debounce_task = tokio::spawn(debounce::run(
        Debounce::new(config.debounce, config.max_delay),
        changes_rx,
        debounced_tx,
    ));

    let mut pusher = pusher;
    tokio::pin!(shutdown);
    let mut gone = None;
    // The start-up pass, and later each piece of work, leaves memory and code pages the quiet
    // watcher does not need: handed back once the loop has had nothing to do for `SETTLED`.
    // Every turn of the loop but the one that released is work done.
    let mut released = false;
    let mut release_at = None;
    loop {
        let retry_at = failed.as_ref().and_then(|f| f.1);
        let write_index_at = index_write.at;
        if !std::mem::take(&mut released) {
            release_at = Some(Instant::now() + SETTLED);
        }
        let mut changes = tokio::select! {
            () = &mut shutdown => break,
            () = sleep_until(release_at), if release_at.is_some() => {
                crate::resources::release_free_memory();
                release_at = None;
                released = true;
                continue;
            }
            msg = debounced.recv() => match msg {
                Some(Debounced::Pending) => {
                    index_write.pending();
                    book.pending = true;
                    book.write();
                    continue;
                }
                Some(Debounced::Ready(changes)) => changes,
                None => break,
            },
            Some(event) = recv_push(&mut pusher) => {
                book.push_event(event, &reader);
                book.write();
                continue;
            }
            Ok(()) = problems.changed() => {
                book.watch_problem = problems.borrow().clone();
                book.write();
                continue;
            }
            () = sleep_until(write_index_at), if write_index_at.is_some() => {
                match saver.write_index().await {
                    Ok(IndexOutcome::Done) => index_write.written(),
                    Ok(IndexOutcome::Busy(pause)) => {
                        tracing::debug!("the git index is written later: {pause}");
                        index_write.failed();
                    }
                    Err(e @ SaveError::Gone { .. }) => {
                        gone = Some(e.into());
                        break;
                    }
                    Err(e) => {
                        tracing::warn!("cannot write the git index yet, trying again: {e}");
                        index_write.failed();
                    }
                }
                continue;
            }
            () = sleep_until(retry_at), if retry_at.is_some() => Changes::default(),
        };
        if !project.is_still(&workdir) {
            // Removed and made again (a re-created sandbox): the git markers may all be there,
            // but they are not ours, and saving would write into the new project.
            gone = Some(project_gone(&git_dir));
            break;
        }
        if let Some((earlier, _)) = failed.take() {
            changes.merge(earlier);
        }
        book.begin_save();
        let result = saver.save(changes.clone()).await;
        match book.record_save(result, &reader, pusher.as_ref().map(|p| &p.heads)) {
            SaveOutcome::Done { index_unwritten } => {
                retry.reset();
                index_write.saved(index_unwritten);
            }
            SaveOutcome::Paused { look_again } => {
                // Looked at again at the git directory's next change (or soon); once the
                // user's git is done, one full pass saves what it left (and what changed
                // meanwhile).
                changes.merge(Changes::everything());
                failed = Some((changes, look_again.then(|| Instant::now() + PAUSE_POLL)));
            }
            SaveOutcome::Failed(e) => {
                let wait = retry.next_delay();
                tracing::error!(retry_in = %short_duration(wait), "saving failed, trying again: {e}");
                // A full pass on retry also repairs whatever state made this one fail.
                changes.merge(Changes::everything());
                failed = Some((changes, Some(Instant::now() + wait)));
            }
            SaveOutcome::Gone { git_dir } => {
                gone = Some(DaemonError::Gone { git_dir });
                break;
            }
        }
        book.write();
    }

    let _ = stop_watch.send(());
    // The last save is judged by the rules as they are now (a rule edit may be in no batch).
    let rules = watch_task.await.ok();
    debounce_task.abort();
    if let Some(gone) = gone {
        return Err(gone);
    }
    if !project.is_still(&workdir) {
        return Err(project_gone(&git_dir));
    }
    tracing::info!("stopping: saving what is pending");
    let result = saver
        .save(Changes {
            rules,
            ..Changes::everything()
        })
        .await;
    let outcome = match book.record_save(result, &reader, pusher.as_ref().map(|p| &p.heads)) {
        SaveOutcome::Done { .. } => write_index_now(&saver).await,
        SaveOutcome::Paused { .. } => Ok(()),
        SaveOutcome::Failed(e) => Err(e.into()),
        SaveOutcome::Gone { git_dir } => Err(DaemonError::Gone { git_dir }),
    };
    if let Some(mut p) = pusher {
        p.handle.shutdown(config.shutdown_timeout).await;
        // The last attempt's result belongs in the status the watcher leaves behind.
        while let Ok(event) = p.events.try_recv() {
            book.push_event(event, &reader);
        }
    }
    if book.push_state != Some(State::Diverged) {
        book.push_state = None;
    }
    book.write();
    outcome
}

/// Writes the index file now (at stop, and after `once`): a failure is a warning, the saves
/// are in the object store and the branch, and the next start corrects the index. A git
/// command holding the index (a `git status`) is waited for a moment.
async fn write_index_now(saver: &SaveWorker) -> Result<(), DaemonError> {
    let give_up = Instant::now() + INDEX_BUSY_WAIT;
    loop {
        match saver.write_index().await {
            Ok(IndexOutcome::Done) => return Ok(()),
            Ok(IndexOutcome::Busy(_)) if Instant::now() < give_up => {
                tokio::time::sleep(INDEX_BUSY_WAIT / 20).await;
            }
            Ok(IndexOutcome::Busy(pause)) => {
                tracing::warn!(
                    "the git index is not written ({pause}); the next start corrects it"
                );
                return Ok(());
            }
            Err(e @ SaveError::Gone { .. }) => return Err(e.into()),
            Err(e) => {
                tracing::warn!("cannot write the git index; the next start corrects it: {e}");
                return Ok(());
            }
        }
    }
}

/// Which directory the watcher started in (device and inode), to notice the project being
/// removed, or removed and made again, under it: paths alone would lead it into the new one.
struct DirIdentity {
    dev: u64,
    ino: u64,
}

impl DirIdentity {
    fn of(dir: &Path) -> io::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(dir)?;
        Ok(Self {
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }

    fn is_still(&self, dir: &Path) -> bool {
        Self::of(dir).is_ok_and(|now| now.dev == self.dev && now.ino == self.ino)
    }
}

fn project_gone(git_dir: &Path) -> DaemonError {
    DaemonError::Gone {
        git_dir: git_dir.to_owned(),
    }
}

async fn recv_push(pusher: &mut Option<Pusher>) -> Option<PushEvent> {
    match pusher {
        Some(p) => p.events.recv().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// `project-watcher once`: a full pass, one commit if anything changed, one push attempt.
pub async fn once(config: Config) -> Result<(), DaemonError> {
    let Setup {
        reader,
        workdir,
        git_dir,
        filter,
    } = setup(&config)?;
    let mut filter = filter;
    let mut load = scan::LoadRules {
        filter: &mut filter,
        warnings: Vec::new(),
    };
    scan::walk(
        &workdir,
        Path::new(""),
        false,
        &mut load,
        &mut scan::NoEntries,
    );
    watch_stage::report_rule_warnings(&load.warnings);
    let (tracked_ignored, _) = watch::channel(Arc::new(TrackedIgnored::default()));
    let saver = SaveWorker::spawn(
        &workdir,
        &git_dir,
        Arc::new(filter),
        tracked_ignored,
        config.max_file_size,
        OwnIndex::default(),
    )?;
    let saved = saver.save(Changes::everything()).await?;
    if let Some(pause) = &saved.paused {
        tracing::warn!("paused: {pause}; nothing saved");
        return Ok(());
    }
    match saved.committed {
        Some(c) => log_commit(&c),
        None => tracing::info!("nothing to save"),
    }
    write_index_now(&saver).await?;
    let Some(mut pusher) = start_push(&config, &reader, &workdir) else {
        return Ok(());
    };
    pusher.heads.send_replace(head_of(&reader));
    pusher.handle.shutdown(config.shutdown_timeout).await;
    let mut last = None;
    while let Ok(event) = pusher.events.try_recv() {
        if !matches!(event, PushEvent::Started) {
            last = Some(event);
        }
    }
    match last {
        Some(PushEvent::Failed { error, .. }) => Err(DaemonError::Push {
            remote: config.remote,
            error,
        }),
        Some(PushEvent::Diverged { recovery_ref }) => Err(DaemonError::Push {
            remote: config.remote,
            error: format!(
                "the remote branch moved on; the local commits are on {recovery_ref}; run `project-watcher sync`"
            ),
        }),
        _ => Ok(()),
    }
}
