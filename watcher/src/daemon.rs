//! The wiring of `watch` and `once`: opens the repository, takes the locks, starts the
//! stages, keeps the status file true, and saves what is pending on shutdown.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use git2::{Oid, Repository};
use shmastra_contract::MANIFEST_FILE;
use tokio::sync::{Notify, mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::changes::Changes;
use crate::commit::{self, Committed};
use crate::config::Config;
use crate::debounce::{self, Debounce, Debounced};
use crate::filter::Filter;
use crate::lock::{self, InstanceLock, LockError, RepoLock};
use crate::manifest;
use crate::push::{PushEvent, PushHandle};
use crate::remote::RemoteSettings;
use crate::stage::{StageError, Stager};
use crate::status::{self, SkippedFile, State, Status};
use crate::watch::{self as watch_stage, TreeWatcher, WatchError};

/// First wait before a failed save is tried again; doubles up to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(
        "{dir} is not the top of a git working tree ({reason}); run `git init` there, or pass --dir with the project's top directory"
    )]
    NotARepo { dir: PathBuf, reason: String },
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error("cannot start the async runtime: {0}")]
    Runtime(io::Error),
    #[error(transparent)]
    Watch(#[from] WatchError),
    #[error(transparent)]
    Stage(#[from] StageError),
    #[error("git failed in {dir}: {source}")]
    Git { dir: PathBuf, source: git2::Error },
    #[error("cannot write {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error(transparent)]
    Exclude(#[from] crate::restore::RestoreError),
    #[error("push to {remote} failed: {error}")]
    Push { remote: String, error: String },
    #[error(
        "the project's repository {git_dir} is gone (the project directory was deleted?); stopping without writing anything there"
    )]
    Gone { git_dir: PathBuf },
}

impl DaemonError {
    /// 2 for what the user must fix in the command or the directory (or a project that is
    /// gone), 3 for a lock held by another watcher, 1 for everything that went wrong at run time.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::NotARepo { .. } | Self::Gone { .. } => 2,
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
    let not_a_repo = |reason: String| DaemonError::NotARepo {
        dir: dir.to_owned(),
        reason,
    };
    let repo = Repository::open(dir).map_err(|e| not_a_repo(e.message().to_owned()))?;
    let workdir = repo
        .workdir()
        .ok_or_else(|| not_a_repo("it is a bare repository".to_owned()))?
        .to_owned();
    let workdir = workdir.canonicalize().unwrap_or(workdir);
    let git_dir = repo
        .path()
        .canonicalize()
        .unwrap_or_else(|_| repo.path().to_owned());
    Ok((repo, workdir, git_dir))
}

/// `core.excludesFile`, or git's default `$XDG_CONFIG_HOME/git/ignore`.
fn excludes_file(repo: &Repository) -> Option<PathBuf> {
    if let Ok(path) = repo.config().and_then(|c| c.get_path("core.excludesFile")) {
        return Some(path);
    }
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("git").join("ignore"))
}

/// The blocking half: stage and commit under the repo lock. It owns the `Repository` and the
/// `Index` between batches; libgit2's index cannot move between threads, so it lives on a
/// thread of its own and takes batches through a channel.
struct Saver {
    repo: Repository,
    stager: Stager,
    git_dir: PathBuf,
    workdir: PathBuf,
}

/// What one save did.
struct Saved {
    committed: Option<Committed>,
    skipped: Vec<SkippedFile>,
}

type SaveJob = (Changes, oneshot::Sender<Result<Saved, DaemonError>>);

/// Whether the repository is being deleted under us: a part git needs to call it one (`HEAD`,
/// `objects/`, `refs/`) or the watcher's own folder (made at start, never removed by the
/// watcher, `restore` or `sync`) has gone. Writing anything then would recreate folders inside
/// a tree `rm -rf` is deleting, and make it fail.
fn repository_gone(git_dir: &Path) -> bool {
    !git_dir.join("HEAD").exists()
        || !git_dir.join("config").exists()
        || !git_dir.join("objects").is_dir()
        || !git_dir.join("refs").is_dir()
        || !lock::state_dir(git_dir).is_dir()
}

impl Saver {
    /// One save; a failure caused by the repository vanishing mid-save is [`DaemonError::Gone`].
    fn save(&mut self, changes: &Changes) -> Result<Option<Committed>, DaemonError> {
        let git_dir = self.git_dir.clone();
        let gone = || DaemonError::Gone {
            git_dir: git_dir.clone(),
        };
        if repository_gone(&git_dir) {
            return Err(gone());
        }
        match self.save_in_repository(changes) {
            Err(_) if repository_gone(&git_dir) => Err(gone()),
            result => result,
        }
    }

    fn save_in_repository(&mut self, changes: &Changes) -> Result<Option<Committed>, DaemonError> {
        let _lock = RepoLock::acquire(&self.git_dir)?;
        self.remove_stale_locks();
        let _marker =
            lock::WorkMarker::begin(&self.git_dir, lock::WorkMarker::SAVING).map_err(|source| {
                DaemonError::Io {
                    path: lock::state_dir(&self.git_dir),
                    source,
                }
            })?;
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
        let tree = self.stager.stage(&changes)?;
        commit::commit_tree(&self.repo, tree).map_err(|source| DaemonError::Git {
            dir: self.workdir.clone(),
            source,
        })
    }

    /// Git lock files a save needs (`index.lock`, `HEAD`'s and its branch's) that no process
    /// holds: removed once 60 s old, or at once when a watcher died inside a save.
    fn remove_stale_locks(&self) {
        let branch = self
            .repo
            .find_reference("HEAD")
            .ok()
            .and_then(|head| head.symbolic_target().ok().flatten().map(str::to_owned));
        let paths = ["index", "HEAD"]
            .into_iter()
            .map(str::to_owned)
            .chain(branch)
            .map(|name| self.git_dir.join(format!("{name}.lock")));
        let died = lock::WorkMarker::left_behind(&self.git_dir, lock::WorkMarker::SAVING);
        lock::clear_stale_locks(paths, died);
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

    /// Starts the saver thread; it ends when the returned sender is dropped.
    fn spawn(
        workdir: &Path,
        git_dir: &Path,
        filter: Arc<RwLock<Filter>>,
        tracked_ignored_changed: Arc<Notify>,
        max_file_size: u64,
    ) -> Result<SaveWorker, DaemonError> {
        let (jobs, rx) = std::sync::mpsc::channel::<SaveJob>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (workdir, git_dir) = (workdir.to_owned(), git_dir.to_owned());
        std::thread::Builder::new()
            .name("project-watcher save".to_owned())
            .spawn(move || {
                let opened = Repository::open(&workdir)
                    .map_err(|source| DaemonError::Git {
                        dir: workdir.clone(),
                        source,
                    })
                    .and_then(|repo| {
                        let stager = Stager::new(
                            &repo,
                            &workdir,
                            filter,
                            tracked_ignored_changed,
                            max_file_size,
                        )?;
                        Ok(Saver {
                            repo,
                            stager,
                            git_dir,
                            workdir,
                        })
                    });
                let mut saver = match opened {
                    Ok(saver) => {
                        let _ = ready_tx.send(Ok(()));
                        saver
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                for (changes, reply) in rx {
                    let result = saver.save(&changes).map(|committed| Saved {
                        committed,
                        skipped: saver.skipped(),
                    });
                    let _ = reply.send(result);
                }
            })
            .map_err(DaemonError::Runtime)?;
        ready_rx
            .recv()
            .map_err(|_| DaemonError::Runtime(io::Error::other("the save thread died")))??;
        Ok(SaveWorker { jobs })
    }
}

struct SaveWorker {
    jobs: std::sync::mpsc::Sender<SaveJob>,
}

impl SaveWorker {
    async fn save(&self, changes: Changes) -> Result<Saved, DaemonError> {
        let (reply, answer) = oneshot::channel();
        let died = || DaemonError::Runtime(io::Error::other("the save thread died"));
        self.jobs.send((changes, reply)).map_err(|_| died())?;
        answer.await.map_err(|_| died())?
    }
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
    filter: Arc<RwLock<Filter>>,
}

fn setup(config: &Config) -> Result<Setup, DaemonError> {
    let (reader, workdir, git_dir) = open(&config.dir)?;
    crate::restore::exclude_env_files(&git_dir)?;
    // Its absence later means the repository is being deleted (see `repository_gone`).
    let state = lock::state_dir(&git_dir);
    match std::fs::create_dir(&state) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
            return Err(DaemonError::Io {
                path: state,
                source: e,
            });
        }
        _ => {}
    }
    let ignore_case = reader
        .config()
        .and_then(|c| c.get_bool("core.ignoreCase"))
        .unwrap_or(false);
    let (filter, warnings) = Filter::new(&workdir, &git_dir, excludes_file(&reader), ignore_case);
    watch_stage::report_rule_warnings(&warnings);
    Ok(Setup {
        reader,
        workdir,
        git_dir,
        filter: Arc::new(RwLock::new(filter)),
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
    heads: watch::Sender<Option<Oid>>,
    events: mpsc::Receiver<PushEvent>,
}

/// `HEAD`'s id, if it has one.
fn head_of(repo: &Repository) -> Option<Oid> {
    repo.head().ok().and_then(|h| h.target())
}

/// Commits on `HEAD` that the remote branch does not have (all of them when it has none).
fn count_unpushed(repo: &Repository, remote: &str, branch: &str, pushed: Option<Oid>) -> u64 {
    let Some(head) = head_of(repo) else { return 0 };
    let Ok(mut walk) = repo.revwalk() else {
        return 0;
    };
    if walk.push(head).is_err() {
        return 0;
    }
    let tracking = format!("refs/remotes/{remote}/{branch}");
    if let Ok(oid) = repo.refname_to_id(&tracking) {
        let _ = walk.hide(oid);
    }
    if let Some(oid) = pushed {
        let _ = walk.hide(oid);
    }
    walk.count() as u64
}

/// What the status file says, kept in one place so every writer agrees.
struct StatusBook {
    git_dir: PathBuf,
    status: Status,
    pending: bool,
    committing: bool,
    save_failed: bool,
    push_state: Option<State>,
}

impl StatusBook {
    fn write(&mut self) {
        if repository_gone(&self.git_dir) {
            return;
        }
        self.status.state = if self.committing {
            State::Committing
        } else if self.save_failed {
            State::Error
        } else if self.pending {
            State::Pending
        } else {
            self.push_state.unwrap_or(State::Idle)
        };
        if let Err(e) = status::write(&self.git_dir, &self.status) {
            tracing::warn!("cannot write the status file: {e}");
        }
    }

    fn push_event(&mut self, event: PushEvent, reader: &Repository, config: &Config) {
        // A push moves refs/remotes/<remote>/<branch>; a divergence fetches the remote tip.
        let pushed = match &event {
            PushEvent::Pushed { oid, .. } => Some(Some(*oid)),
            PushEvent::Diverged { .. } => Some(None),
            PushEvent::Started | PushEvent::Failed { .. } => None,
        };
        if let Some(pushed) = pushed {
            self.status.unpushed_commits =
                count_unpushed(reader, &config.remote, &config.branch, pushed);
        }
        match event {
            // Diverged stays shown while the commits follow to the recovery branch.
            PushEvent::Started if self.push_state == Some(State::Diverged) => {}
            PushEvent::Started => self.push_state = Some(State::Pushing),
            PushEvent::Pushed { at, .. } => {
                self.push_state = None;
                self.status.last_push_at = Some(status::timestamp(at));
                self.status.last_push_error = None;
                self.status.recovery_ref = None;
            }
            PushEvent::Failed { error, retry_in } => {
                tracing::warn!(retry_in = ?retry_in, "push failed: {error}");
                self.push_state = Some(State::Backoff);
                self.status.last_push_error = Some(error);
            }
            PushEvent::Diverged { recovery_ref } => {
                tracing::warn!(recovery_ref = %recovery_ref, "the remote branch moved on; local commits were pushed to a recovery branch, run `project-watcher sync`");
                self.push_state = Some(State::Diverged);
                self.status.recovery_ref = Some(recovery_ref);
            }
        }
    }
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
    // Written before the watches exist, so the watcher does not see its own write as a change.
    sync_manifest(&workdir, &git_dir).await?;
    let (problems_tx, mut problems) = watch::channel(None);
    let tracked_ignored_changed = Arc::new(Notify::new());
    let watcher = {
        let (workdir, git_dir, filter) = (workdir.clone(), git_dir.clone(), Arc::clone(&filter));
        let tracked_ignored_changed = Arc::clone(&tracked_ignored_changed);
        let event_buffer = config.event_buffer;
        tokio::task::spawn_blocking(move || {
            TreeWatcher::start(
                &workdir,
                &git_dir,
                filter,
                problems_tx,
                tracked_ignored_changed,
                event_buffer,
            )
        })
        .await
        .expect("starting the watches does not panic")?
    };
    let watched = watcher.watched_dirs();
    let saver = Saver::spawn(
        &workdir,
        &git_dir,
        Arc::clone(&filter),
        tracked_ignored_changed,
        config.max_file_size,
    )?;
    // A failed first pass (a stale lock, a full disk, a read-only `.git`) is retried like any
    // other save: exiting would only make the supervisor restart us into the same fault.
    let first = saver.save(Changes::everything()).await;
    let mut pusher = start_push(&config, &reader, &workdir);
    let mut book = StatusBook {
        git_dir: git_dir.clone(),
        status: Status {
            unpushed_commits: count_unpushed(&reader, &config.remote, &config.branch, None),
            last_error: problems.borrow().clone(),
            ..Status::default()
        },
        pending: false,
        committing: false,
        save_failed: false,
        push_state: None,
    };
    book.status.head = head_of(&reader).map(|h| h.to_string());
    let mut retry: Option<(Changes, Instant, Duration)> = None;
    match first {
        Ok(first) => {
            book.status.skipped_files = first.skipped;
            if let Some(c) = &first.committed {
                log_commit(c);
                book.status.last_commit_at = Some(status::timestamp(SystemTime::now()));
            }
        }
        Err(e) => {
            tracing::error!(retry_in = ?FIRST_RETRY, "saving failed, trying again: {e}");
            book.save_failed = true;
            book.status.last_error = Some(format!("saving failed: {e}"));
            retry = Some((
                Changes::everything(),
                Instant::now() + FIRST_RETRY,
                FIRST_RETRY,
            ));
        }
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

    tokio::pin!(shutdown);
    let mut gone = None;
    loop {
        let retry_at = retry.as_ref().map(|r| r.1);
        let mut changes = tokio::select! {
            () = &mut shutdown => break,
            msg = debounced.recv() => match msg {
                Some(Debounced::Pending) => {
                    book.pending = true;
                    book.write();
                    continue;
                }
                Some(Debounced::Ready(changes)) => changes,
                None => break,
            },
            Some(event) = recv_push(&mut pusher) => {
                book.push_event(event, &reader, &config);
                book.write();
                continue;
            }
            Ok(()) = problems.changed() => {
                book.status.last_error = problems.borrow().clone();
                book.write();
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
        let mut wait = FIRST_RETRY;
        if let Some((earlier, _, last_wait)) = retry.take() {
            changes.merge(earlier);
            wait = (last_wait * 2).min(MAX_RETRY);
        }
        book.committing = true;
        book.write();
        let result = saver.save(changes.clone()).await;
        book.committing = false;
        book.pending = false;
        match result {
            Ok(saved) => {
                book.save_failed = false;
                book.status.skipped_files = saved.skipped;
                record_commit(&mut book, &reader, saved.committed, pusher.as_ref());
            }
            Err(e @ DaemonError::Gone { .. }) => {
                gone = Some(e);
                break;
            }
            Err(e) => {
                tracing::error!(retry_in = ?wait, "saving failed, trying again: {e}");
                book.save_failed = true;
                book.status.last_error = Some(format!("saving failed: {e}"));
                // A full pass on retry also repairs whatever state made this one fail.
                changes.merge(Changes::everything());
                retry = Some((changes, Instant::now() + wait, wait));
            }
        }
        book.write();
    }

    let _ = stop_watch.send(());
    let _ = watch_task.await;
    debounce_task.abort();
    if let Some(gone) = gone {
        return Err(gone);
    }
    if !project.is_still(&workdir) {
        return Err(project_gone(&git_dir));
    }
    tracing::info!("stopping: saving what is pending");
    let result = saver.save(Changes::everything()).await;
    book.committing = false;
    book.pending = false;
    let outcome = match result {
        Ok(saved) => {
            book.save_failed = false;
            book.status.skipped_files = saved.skipped;
            record_commit(&mut book, &reader, saved.committed, pusher.as_ref());
            Ok(())
        }
        Err(e) => Err(e),
    };
    if let Some(mut p) = pusher {
        p.handle.shutdown(config.shutdown_timeout).await;
        // The last attempt's result belongs in the status the watcher leaves behind.
        while let Ok(event) = p.events.try_recv() {
            book.push_event(event, &reader, &config);
        }
    }
    if book.push_state != Some(State::Diverged) {
        book.push_state = None;
    }
    book.write();
    outcome
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

fn log_commit(c: &Committed) {
    tracing::info!(commit = %c.id, files = c.files_changed, "saved");
}

fn record_commit(
    book: &mut StatusBook,
    reader: &Repository,
    committed: Option<Committed>,
    pusher: Option<&Pusher>,
) {
    if book
        .status
        .last_error
        .as_deref()
        .is_some_and(|e| e.starts_with("saving failed"))
    {
        book.status.last_error = None;
    }
    let Some(c) = committed else {
        // A `restore --at` moved HEAD under the repo lock; its commit goes out like our own.
        let head = head_of(reader);
        if let Some(p) = pusher
            && head.is_some()
            && p.heads
                .send_if_modified(|h| std::mem::replace(h, head) != head)
        {
            book.status.head = head.map(|h| h.to_string());
        }
        return;
    };
    log_commit(&c);
    book.status.head = Some(c.id.to_string());
    book.status.last_commit_at = Some(status::timestamp(SystemTime::now()));
    book.status.unpushed_commits += 1;
    if let Some(p) = pusher {
        p.heads.send_replace(head_of(reader).or(Some(c.id)));
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
    {
        let mut filter = filter.write().unwrap_or_else(|e| e.into_inner());
        let mut warnings = Vec::new();
        crate::scan::kept_dirs(&workdir, Path::new(""), &mut filter, &mut warnings, |_| {});
        watch_stage::report_rule_warnings(&warnings);
    }
    let saver = Saver::spawn(
        &workdir,
        &git_dir,
        filter,
        Arc::new(Notify::new()),
        config.max_file_size,
    )?;
    let saved = saver.save(Changes::everything()).await?;
    match saved.committed {
        Some(c) => log_commit(&c),
        None => tracing::info!("nothing to save"),
    }
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
