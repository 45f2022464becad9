//! The wiring of `watch` and `once`: opens the repository, takes the locks, starts the
//! stages, keeps the status file true, writes the index when quiet, and saves what is pending
//! on shutdown.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use git2::{Oid, Repository};
use shmastra_contract::MANIFEST_FILE;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::changes::Changes;
use crate::commit::Committed;
use crate::config::Config;
use crate::debounce::{self, Debounce, Debounced};
use crate::filter::{Filter, TrackedIgnored};
use crate::lock::{self, InstanceLock, LockError, RepoLock};
use crate::manifest;
use crate::push::{PushEvent, PushHandle};
use crate::remote::RemoteSettings;
use crate::save::{SaveError, SaveRetry, SaveWorker, Saved, repository_gone};
use crate::scan;
use crate::status::{self, State, Status};
use crate::watch::{self as watch_stage, TreeWatcher, WatchError};

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
    Save(SaveError),
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
    /// The latest save's failure, until a save succeeds.
    save_error: Option<String>,
    /// The watch stage's latest problem (watch limit, unreadable rules).
    watch_problem: Option<String>,
    push_state: Option<State>,
}

/// What the daemon does after a save.
enum SaveOutcome {
    Done { index_unwritten: bool },
    Failed(SaveError),
    Gone(DaemonError),
}

impl StatusBook {
    fn write(&mut self) {
        if repository_gone(&self.git_dir) {
            return;
        }
        self.status.state = if self.committing {
            State::Committing
        } else if self.save_error.is_some() {
            State::Error
        } else if self.pending {
            State::Pending
        } else {
            self.push_state.unwrap_or(State::Idle)
        };
        self.status.last_error = self.save_error.clone().or(self.watch_problem.clone());
        let was_low = self.status.disk_warning.is_some();
        self.status.measure(&self.git_dir);
        match &self.status.disk_warning {
            Some(warning) if !was_low => tracing::warn!("{warning}"),
            None if was_low => tracing::info!("the project's file system has room again"),
            _ => {}
        }
        if let Err(e) = status::write(&self.git_dir, &self.status) {
            tracing::warn!("cannot write the status file: {e}");
        }
    }

    /// The one place a save's result is handled: the status, the log, the pusher's head.
    fn record_save(
        &mut self,
        result: Result<Saved, SaveError>,
        reader: &Repository,
        pusher: Option<&Pusher>,
    ) -> SaveOutcome {
        self.committing = false;
        self.pending = false;
        match result {
            Ok(saved) => {
                self.save_error = None;
                self.status.skipped_files = saved.skipped;
                self.record_commit(reader, saved.committed, pusher);
                SaveOutcome::Done {
                    index_unwritten: saved.index_unwritten,
                }
            }
            Err(SaveError::Gone { git_dir }) => SaveOutcome::Gone(DaemonError::Gone { git_dir }),
            Err(e) => {
                self.save_error = Some(format!("saving failed: {e}"));
                SaveOutcome::Failed(e)
            }
        }
    }

    fn record_commit(
        &mut self,
        reader: &Repository,
        committed: Option<Committed>,
        pusher: Option<&Pusher>,
    ) {
        let Some(c) = committed else {
            // A `restore --at` moved HEAD under the repo lock; its commit goes out like our own.
            let head = head_of(reader);
            if let Some(p) = pusher
                && head.is_some()
                && p.heads
                    .send_if_modified(|h| std::mem::replace(h, head) != head)
            {
                self.status.head = head.map(|h| h.to_string());
            }
            return;
        };
        log_commit(&c);
        self.status.head = Some(c.id.to_string());
        self.status.last_commit_at = Some(status::timestamp(SystemTime::now()));
        self.status.unpushed_commits += 1;
        if let Some(p) = pusher {
            p.heads.send_replace(head_of(reader).or(Some(c.id)));
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
    // libgit2 hashes every object it reads again to check its id (git does not, outside
    // `fsck`): at 100k files that was a seventh of a save's and the quiet index write's CPU.
    git2::opts::strict_hash_verification(false);
    // Nor look up every entry of a tree it writes: the save wrote or read each one just before.
    git2::opts::strict_object_creation(false);
    // Written before the watches exist, so the watcher does not see its own write as a change.
    sync_manifest(&workdir, &git_dir).await?;
    let (problems_tx, mut problems) = watch::channel(None);
    let (tracked_ignored_tx, tracked_ignored) = watch::channel(Arc::new(TrackedIgnored::default()));
    let watcher = TreeWatcher::new(
        &workdir,
        &git_dir,
        filter,
        problems_tx,
        tracked_ignored,
        config.event_buffer,
    )?;
    let saver = SaveWorker::spawn(
        &workdir,
        &git_dir,
        watcher.rules().filter,
        tracked_ignored_tx,
        config.max_file_size,
    )?;
    let pusher = start_push(&config, &reader, &workdir);
    let mut book = StatusBook {
        git_dir: git_dir.clone(),
        status: Status {
            unpushed_commits: count_unpushed(&reader, &config.remote, &config.branch, None),
            head: head_of(&reader).map(|h| h.to_string()),
            ..Status::default()
        },
        pending: false,
        committing: false,
        save_error: None,
        watch_problem: problems.borrow().clone(),
        push_state: None,
    };
    let mut retry = SaveRetry::default();
    // A batch that failed, and when it is tried again.
    let mut failed: Option<(Changes, Instant)> = None;
    // When the index file is written: once the watcher has been quiet, or at the latest
    // `IndexWrite::cap` after the first save it lacks, however busy the project is.
    let mut index_write = IndexWrite::new(&config);
    // One walk sets every watch and compares every kept file with the index. A failed first
    // pass (a stale lock, a full disk, a read-only `.git`) is retried like any other save:
    // exiting would only make the supervisor restart us into the same fault.
    let (watcher, first) = saver.start(watcher).await?;
    crate::resources::release_free_memory();
    let watched = watcher.watched_dirs();
    match book.record_save(first, &reader, pusher.as_ref()) {
        SaveOutcome::Done { index_unwritten } => index_write.saved(index_unwritten),
        SaveOutcome::Failed(e) => {
            let wait = retry.next_delay();
            tracing::error!(retry_in = ?wait, "saving failed, trying again: {e}");
            failed = Some((Changes::everything(), Instant::now() + wait));
        }
        SaveOutcome::Gone(e) => return Err(e),
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
    loop {
        let retry_at = failed.as_ref().map(|f| f.1);
        let write_index_at = index_write.at;
        let mut changes = tokio::select! {
            () = &mut shutdown => break,
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
                book.push_event(event, &reader, &config);
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
                    Ok(_) => {
                        index_write.written();
                        crate::resources::release_free_memory();
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
        book.committing = true;
        book.write();
        let result = saver.save(changes.clone()).await;
        match book.record_save(result, &reader, pusher.as_ref()) {
            SaveOutcome::Done { index_unwritten } => {
                retry.reset();
                index_write.saved(index_unwritten);
            }
            SaveOutcome::Failed(e) => {
                let wait = retry.next_delay();
                tracing::error!(retry_in = ?wait, "saving failed, trying again: {e}");
                // A full pass on retry also repairs whatever state made this one fail.
                changes.merge(Changes::everything());
                failed = Some((changes, Instant::now() + wait));
            }
            SaveOutcome::Gone(e) => {
                gone = Some(e);
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
    let outcome = match book.record_save(result, &reader, pusher.as_ref()) {
        SaveOutcome::Done { .. } => write_index_now(&saver).await,
        SaveOutcome::Failed(e) => Err(e.into()),
        SaveOutcome::Gone(e) => Err(e),
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

/// When the index file is written: `index_quiet` after the latest save when no batch is
/// pending (the write then delays no save), but never later than `cap` (`--max-delay`, as the
/// debounce caps a batch) after the first save the file lacks, so a project that is never
/// quiet (a nested repository's `.git` touched by every `git status`) still gets it.
struct IndexWrite {
    quiet: Duration,
    cap: Duration,
    /// The first save the index file lacks.
    since: Option<Instant>,
    at: Option<Instant>,
}

impl IndexWrite {
    fn new(config: &Config) -> Self {
        Self {
            quiet: config.index_quiet,
            cap: config.max_delay.max(config.index_quiet),
            since: None,
            at: None,
        }
    }

    fn saved(&mut self, unwritten: bool) {
        if !unwritten {
            return self.written();
        }
        let now = Instant::now();
        let since = *self.since.get_or_insert(now);
        self.at = Some((now + self.quiet).min(since + self.cap));
    }

    /// A batch is coming: the write waits for its save, unless it is due by the cap.
    fn pending(&mut self) {
        if self
            .since
            .is_some_and(|since| Instant::now() < since + self.cap)
        {
            self.at = None;
        }
    }

    fn written(&mut self) {
        self.since = None;
        self.at = None;
    }

    fn failed(&mut self) {
        self.at = Some(Instant::now() + self.quiet);
    }
}

/// Writes the index file now (at stop, and after `once`): a failure is a warning, the saves
/// are in the object store and the branch, and the next start corrects the index.
async fn write_index_now(saver: &SaveWorker) -> Result<(), DaemonError> {
    match saver.write_index().await {
        Ok(_) => Ok(()),
        Err(e @ SaveError::Gone { .. }) => Err(e.into()),
        Err(e) => {
            tracing::warn!("cannot write the git index; the next start corrects it: {e}");
            Ok(())
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

fn log_commit(c: &Committed) {
    tracing::info!(commit = %c.id, files = c.files_changed, "saved");
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
    )?;
    let saved = saver.save(Changes::everything()).await?;
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
