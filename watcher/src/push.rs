//! The push stage: sends the newest commit of the branch to the remote in the background.
//!
//! This is the seam between the commit loop and the network. The daemon publishes every new
//! head on a `watch` channel (a newer head replaces a queued one) and reads [`PushEvent`]s
//! back to keep the status file true. A slow or failing push never delays a commit: git2 runs
//! on the blocking pool, and failures wait out the backoff of [`crate::retry`].
//!
//! Never force: when the remote branch moved on, the local commits go to
//! `refs/heads/recovery/<UTC timestamp>` and later heads follow them there, until the local
//! branch contains the remote one again (after a sync); then normal pushes resume.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use git2::{Oid, PushOptions, Repository};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::lock::{self, WorkMarker};
use crate::remote::RemoteSettings;
use crate::retry::{self, Backoff, FailureKind};

/// What the pusher tells the daemon. Messages never contain the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushEvent {
    /// An attempt started.
    Started,
    /// The remote branch now holds `oid`.
    Pushed { oid: git2::Oid, at: SystemTime },
    /// An attempt failed; the next one starts after `retry_in`.
    Failed { error: String, retry_in: Duration },
    /// The remote moved on: the local commits went to `recovery_ref` instead.
    Diverged { recovery_ref: String },
}

/// While diverged, how often the pusher looks (locally, no network) whether a sync has made
/// the local branch contain the remote one again.
const DIVERGED_RECHECK: Duration = Duration::from_secs(15);

/// The running pusher.
#[derive(Debug)]
pub struct PushHandle {
    task: tokio::task::JoinHandle<()>,
    shutdown: oneshot::Sender<()>,
}

impl PushHandle {
    /// Starts the pusher. It pushes whatever head `heads` holds whenever that changes; before
    /// the first head arrives it pushes the local branch if the remote lacks it (commits left
    /// unpushed by an earlier run).
    pub fn spawn(
        settings: RemoteSettings,
        heads: watch::Receiver<Option<git2::Oid>>,
        events: mpsc::Sender<PushEvent>,
    ) -> Self {
        crate::transport::init(crate::transport::DEFAULT_NETWORK_TIMEOUT);
        Self::spawn_with(Arc::new(GitRemote { settings }), heads, events)
    }

    pub(crate) fn spawn_with<R: Remote>(
        remote: Arc<R>,
        heads: watch::Receiver<Option<git2::Oid>>,
        events: mpsc::Sender<PushEvent>,
    ) -> Self {
        let (shutdown, shutdown_rx) = oneshot::channel();
        let worker = Worker {
            remote,
            events,
            backoff: Backoff::default(),
            diverged: None,
            done: None,
        };
        let task = tokio::spawn(worker.run(heads, shutdown_rx));
        Self { task, shutdown }
    }

    /// Shutdown: one last attempt for the newest head, bounded by `deadline`.
    pub async fn shutdown(self, deadline: Duration) {
        let _ = self.shutdown.send(());
        let mut task = self.task;
        if tokio::time::timeout(deadline, &mut task).await.is_err() {
            tracing::warn!(
                ?deadline,
                "the last push did not finish within the shutdown timeout; the commits stay local and the next start pushes them"
            );
            task.abort();
        }
    }
}

/// A failed push: what kind, and a message for people (no token, no URL credentials).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PushFailure {
    pub kind: FailureKind,
    pub message: String,
}

/// The pusher's view of git: blocking calls, run on the blocking pool. A seam, so the
/// scheduling below is tested with a paused clock and no network.
pub(crate) trait Remote: Send + Sync + 'static {
    /// Pushes `head` to `dst` (a full ref name) without force.
    fn push(&self, head: Oid, dst: &str) -> Result<(), PushFailure>;
    /// Fetches the remote branch and returns its tip.
    fn fetch_branch_tip(&self) -> Result<Oid, PushFailure>;
    /// Whether `head` is `tip` or has it in its history.
    fn contains(&self, head: Oid, tip: Oid) -> bool;
    /// The local branch tip, if the branch exists.
    fn local_head(&self) -> Option<Oid>;
    /// The local branch tip when the remote-tracking ref does not hold it.
    fn unpushed_head(&self) -> Option<Oid>;
    fn branch(&self) -> &str;
}

struct Diverged {
    /// The remote branch tip that the local branch did not contain.
    remote_tip: Oid,
    /// Where the local commits went, once a recovery push succeeded.
    recovery_ref: Option<String>,
}

enum Outcome {
    Pushed(Oid),
    Recovered(String),
}

struct Worker<R> {
    remote: Arc<R>,
    events: mpsc::Sender<PushEvent>,
    backoff: Backoff,
    diverged: Option<Diverged>,
    /// The last head that was pushed, to the branch or to the recovery branch.
    done: Option<Oid>,
}

impl<R: Remote> Worker<R> {
    async fn run(
        mut self,
        mut heads: watch::Receiver<Option<Oid>>,
        mut shutdown: oneshot::Receiver<()>,
    ) {
        let published = *heads.borrow_and_update();
        let mut target = match published {
            Some(head) => Some(head),
            None => self.blocking(|r| r.unpushed_head()).await.flatten(),
        };
        let mut retry_at: Option<Instant> = None;
        let mut heads_open = true;
        loop {
            let pending = target.is_some() && target != self.done;
            if pending && retry_at.is_none_or(|at| at <= Instant::now()) {
                if let Some(head) = target {
                    retry_at = self.attempt(head).await;
                }
                // Shutdown came during that attempt. If it failed, it was the last one: the
                // server is failing and the deadline is short. If it succeeded, the newest
                // head (the shutdown's own commit) still gets its attempt below.
                if shutdown_requested(&mut shutdown) {
                    if retry_at.is_some() {
                        return;
                    }
                    break;
                }
                continue;
            }
            tokio::select! {
                biased;
                _ = &mut shutdown => break,
                changed = heads.changed(), if heads_open => match changed {
                    Ok(()) => {
                        let published = *heads.borrow_and_update();
                        target = published.or(target);
                    }
                    Err(_) => heads_open = false,
                },
                _ = sleep_until(retry_at), if pending => retry_at = None,
                _ = tokio::time::sleep(DIVERGED_RECHECK), if self.diverged.is_some() && !pending => {
                    if let Some(local) = self.synced_local_head().await {
                        target = Some(local);
                    }
                }
            }
        }
        // Shutdown: the daemon committed what was pending and published it; one attempt for
        // the newest head, whatever the backoff says.
        let published = *heads.borrow();
        let newest = published.or(target);
        if let Some(head) = newest.filter(|h| Some(*h) != self.done) {
            self.attempt(head).await;
        }
    }

    /// The local branch tip, when it contains the remote tip we diverged from (a sync ran).
    async fn synced_local_head(&self) -> Option<Oid> {
        let tip = self.diverged.as_ref()?.remote_tip;
        self.blocking(move |r| r.local_head().filter(|local| r.contains(*local, tip)))
            .await
            .flatten()
    }

    /// One attempt for `head`; returns when the next one may start, if it failed.
    async fn attempt(&mut self, head: Oid) -> Option<Instant> {
        self.emit(PushEvent::Started).await;
        match self.push(head).await {
            Ok(outcome) => {
                self.done = Some(head);
                self.backoff.reset();
                let event = match outcome {
                    Outcome::Pushed(oid) => PushEvent::Pushed {
                        oid,
                        at: SystemTime::now(),
                    },
                    Outcome::Recovered(recovery_ref) => PushEvent::Diverged { recovery_ref },
                };
                self.emit(event).await;
                None
            }
            Err(failure) => {
                let retry_in = self
                    .backoff
                    .next_delay(failure.kind, retry::random_jitter());
                tracing::debug!(kind = ?failure.kind, ?retry_in, "push failed");
                self.emit(PushEvent::Failed {
                    error: failure.message,
                    retry_in,
                })
                .await;
                Some(Instant::now() + retry_in)
            }
        }
    }

    async fn push(&mut self, head: Oid) -> Result<Outcome, PushFailure> {
        if let Some(tip) = self.diverged.as_ref().map(|d| d.remote_tip)
            && self
                .blocking(move |r| r.contains(head, tip))
                .await
                .unwrap_or(false)
        {
            tracing::info!("the local branch contains the remote one again; normal pushes resume");
            self.diverged = None;
        }
        if self.diverged.is_none() {
            let branch_ref = format!("refs/heads/{}", self.remote.branch());
            match self.blocking_push(head, branch_ref).await {
                Ok(()) => return Ok(Outcome::Pushed(head)),
                Err(f) if f.kind == FailureKind::NonFastForward => {
                    let remote_tip = self
                        .blocking(|r| r.fetch_branch_tip())
                        .await
                        .unwrap_or_else(|| Err(panicked()))?;
                    tracing::warn!(
                        remote_tip = %remote_tip,
                        "the remote branch has commits this one lacks; pushing to a recovery branch instead (never forcing)"
                    );
                    self.diverged = Some(Diverged {
                        remote_tip,
                        recovery_ref: None,
                    });
                }
                Err(f) => return Err(f),
            }
        }
        self.push_recovery(head).await
    }

    async fn push_recovery(&mut self, head: Oid) -> Result<Outcome, PushFailure> {
        let name = self
            .diverged
            .as_ref()
            .and_then(|d| d.recovery_ref.clone())
            .unwrap_or_else(|| recovery_ref_name(SystemTime::now()));
        let result = self.blocking_push(head, name.clone()).await;
        let diverged = self.diverged.as_mut();
        match result {
            Ok(()) => {
                if let Some(d) = diverged {
                    d.recovery_ref = Some(name.clone());
                }
                Ok(Outcome::Recovered(name))
            }
            Err(f) => {
                // A recovery branch that moved (a sync reset the branch under it) is left as
                // it is; the next attempt starts a new one.
                if f.kind == FailureKind::NonFastForward
                    && let Some(d) = diverged
                {
                    d.recovery_ref = None;
                }
                Err(f)
            }
        }
    }

    async fn blocking_push(&self, head: Oid, dst: String) -> Result<(), PushFailure> {
        self.blocking(move |r| r.push(head, &dst))
            .await
            .unwrap_or_else(|| Err(panicked()))
    }

    /// Runs `f` on the blocking pool; `None` if it panicked.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&R) -> T + Send + 'static,
    ) -> Option<T> {
        let remote = Arc::clone(&self.remote);
        tokio::task::spawn_blocking(move || f(&remote)).await.ok()
    }

    async fn emit(&self, event: PushEvent) {
        // The daemon stops reading during shutdown; a closed channel is not an error.
        let _ = self.events.send(event).await;
    }
}

fn panicked() -> PushFailure {
    PushFailure {
        kind: FailureKind::Local,
        message: "the push task panicked".to_owned(),
    }
}

fn shutdown_requested(shutdown: &mut oneshot::Receiver<()>) -> bool {
    !matches!(
        shutdown.try_recv(),
        Err(oneshot::error::TryRecvError::Empty)
    )
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// One push of `head` to `dst` (a full ref name), without retries or force: `sync` sends its
/// backups this way. The error is a message for people (no token, no URL credentials).
pub fn push_once(settings: &RemoteSettings, head: Oid, dst: &str) -> Result<(), String> {
    crate::transport::init(crate::transport::DEFAULT_NETWORK_TIMEOUT);
    GitRemote {
        settings: settings.clone(),
    }
    .push(head, dst)
    .map_err(|f| f.message)
}

/// `refs/heads/recovery/20261129T231500Z`: a valid ref name (no `:`), sortable by time.
pub fn recovery_ref_name(at: SystemTime) -> String {
    let stamp: String = humantime::format_rfc3339_seconds(at)
        .to_string()
        .chars()
        .filter(|c| !matches!(c, '-' | ':'))
        .collect();
    format!("refs/heads/recovery/{stamp}")
}

/// `url` with any user name and password replaced by `***`, fit for messages and logs.
pub fn redact_url(url: &str) -> String {
    match url_userinfo(url) {
        Some(userinfo) => url.replacen(&format!("{userinfo}@"), "***@", 1),
        None => url.to_owned(),
    }
}

/// The `user:password` part of a URL, if it has one.
fn url_userinfo(url: &str) -> Option<&str> {
    let (_, rest) = url.split_once("://")?;
    let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
    authority.rfind('@').map(|at| &authority[..at])
}

/// The real remote: libgit2 against the repository's configured remote.
struct GitRemote {
    settings: RemoteSettings,
}

impl GitRemote {
    fn open(&self) -> Result<Repository, PushFailure> {
        Repository::open(&self.settings.workdir).map_err(|e| PushFailure {
            kind: FailureKind::Local,
            message: format!(
                "cannot open the repository at {}: {}",
                self.settings.workdir.display(),
                e.message()
            ),
        })
    }

    fn find_remote<'r>(&self, repo: &'r Repository) -> Result<git2::Remote<'r>, PushFailure> {
        repo.find_remote(&self.settings.remote)
            .map_err(|e| PushFailure {
                kind: FailureKind::Local,
                message: format!(
                    "no usable remote named `{}`: {}",
                    self.settings.remote,
                    e.message()
                ),
            })
    }

    /// Clears the lock files under `refs/remotes/` that libgit2 or this pusher left when a
    /// watcher was killed while recording a push or a fetch (they would fail every later
    /// attempt), then marks the network operation as started.
    fn begin(&self, repo: &Repository) -> Option<WorkMarker> {
        let git_dir = repo.path();
        let died = WorkMarker::left_behind(git_dir, WorkMarker::PUSHING);
        lock::clear_stale_locks(lock::remote_ref_lock_files(git_dir), died);
        WorkMarker::begin(git_dir, WorkMarker::PUSHING).ok()
    }

    fn tracking_ref(&self) -> String {
        format!(
            "refs/remotes/{}/{}",
            self.settings.remote, self.settings.branch
        )
    }

    /// Removes secrets from a message that may quote libgit2 or the server.
    fn scrub(&self, message: &str, url: &str) -> String {
        let mut text = message.replace(url, &redact_url(url));
        // The secret part of `user:secret@` (or a bare token used as the user name), wherever
        // libgit2 or the server quoted it; too short a string would mangle ordinary words.
        let secret = url_userinfo(url).map(|u| u.split_once(':').map_or(u, |(_, pw)| pw));
        if let Some(secret) = secret.filter(|s| s.len() >= 6) {
            text = text.replace(secret, "***");
        }
        if let Some(token) = self.settings.token.as_deref().filter(|t| !t.is_empty()) {
            text = text.replace(token, "[redacted]");
        }
        text
    }

    /// A failed fetch or push, classified. A 401 with no token to send means the token is
    /// missing, not refused.
    fn network_failure(&self, url: &str, e: &git2::Error) -> PushFailure {
        let status = retry::http_status_in(e.message());
        let no_token = self.settings.token.is_none() && status == Some(401);
        let kind = retry::classify_git_error(e.code(), e.class(), e.message());
        PushFailure {
            kind,
            message: self.describe(kind, url, e.message(), no_token),
        }
    }

    /// A failure message that says what happened and what to do.
    fn describe(&self, kind: FailureKind, url: &str, detail: &str, no_token: bool) -> String {
        let remote = &self.settings.remote;
        let at = redact_url(url);
        let text = match kind {
            FailureKind::Auth if no_token => format!(
                "remote `{remote}` ({at}) asks for credentials and PROJECT_TOKEN is not set"
            ),
            FailureKind::Auth if retry::http_status_in(detail) == Some(403) => format!(
                "remote `{remote}` ({at}) denied access (HTTP 403): PROJECT_TOKEN may not push to this repository"
            ),
            FailureKind::Auth => format!(
                "remote `{remote}` ({at}) refused PROJECT_TOKEN (HTTP 401, authentication failed): check the token"
            ),
            FailureKind::Server => {
                format!("remote `{remote}` ({at}) had a server error: {detail}")
            }
            FailureKind::Network => format!("cannot reach remote `{remote}` ({at}): {detail}"),
            FailureKind::Rejected | FailureKind::NonFastForward | FailureKind::Local => {
                format!("push to remote `{remote}` ({at}) failed: {detail}")
            }
        };
        self.scrub(&text, url)
    }
}

impl Remote for GitRemote {
    fn push(&self, head: Oid, dst: &str) -> Result<(), PushFailure> {
        let repo = self.open()?;
        let _marker = self.begin(&repo);
        let mut remote = self.find_remote(&repo)?;
        let url = remote
            .pushurl()
            .ok()
            .flatten()
            .or_else(|| remote.url().ok())
            .unwrap_or("")
            .to_owned();
        let refused: RefCell<Vec<(String, String)>> = RefCell::new(Vec::new());
        let said = RefCell::new(String::new());
        let result = {
            let mut callbacks = git2::RemoteCallbacks::new();
            callbacks.push_update_reference(|refname, status| {
                if let Some(message) = status {
                    refused
                        .borrow_mut()
                        .push((refname.to_owned(), message.to_owned()));
                }
                Ok(())
            });
            callbacks.sideband_progress(|data| {
                let mut said = said.borrow_mut();
                if said.len() < 2048 {
                    said.push_str(&String::from_utf8_lossy(data));
                }
                true
            });
            let mut options = PushOptions::new();
            options.remote_callbacks(callbacks);
            crate::transport::with_token(self.settings.token.as_deref(), || {
                remote.push(&[format!("{head}:{dst}")], Some(&mut options))
            })
        };
        if let Err(e) = result {
            return Err(self.network_failure(&url, &e));
        }
        if let Some((refname, message)) = refused.into_inner().into_iter().next() {
            let kind = retry::classify_ref_rejection(&message);
            let remote_said = said
                .into_inner()
                .lines()
                .map(|l| l.trim().trim_start_matches("remote:").trim())
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join("; ");
            let detail = if remote_said.is_empty() {
                format!("the server rejected {refname}: {message}")
            } else {
                format!("the server rejected {refname}: {message} (remote said: {remote_said})")
            };
            return Err(PushFailure {
                kind,
                message: self.describe(kind, &url, &detail, false),
            });
        }
        if dst == format!("refs/heads/{}", self.settings.branch) {
            // The daemon counts unpushed commits against this ref. The pusher writes only this
            // confirmed fact, never the branch, index or tree, so it does not take repo.lock.
            repo.reference(&self.tracking_ref(), head, true, "project-watcher: push")
                .map_err(|e| PushFailure {
                    kind: FailureKind::Local,
                    message: format!("pushed, but cannot record it locally: {}", e.message()),
                })?;
        }
        Ok(())
    }

    fn fetch_branch_tip(&self) -> Result<Oid, PushFailure> {
        let repo = self.open()?;
        let _marker = self.begin(&repo);
        let url = self.find_remote(&repo)?.url().unwrap_or("").to_owned();
        let tip = crate::restore::fetch_branch(&repo, &self.settings).map_err(|e| match e {
            crate::restore::RestoreError::Fetch { source, .. } => {
                self.network_failure(&url, &source)
            }
            other => PushFailure {
                kind: FailureKind::Local,
                message: other.to_string(),
            },
        })?;
        tip.ok_or_else(|| PushFailure {
            kind: FailureKind::Local,
            message: "the remote branch vanished after a rejected push".to_owned(),
        })
    }

    fn contains(&self, head: Oid, tip: Oid) -> bool {
        head == tip
            || self
                .open()
                .ok()
                .and_then(|repo| repo.graph_descendant_of(head, tip).ok())
                .unwrap_or(false)
    }

    fn local_head(&self) -> Option<Oid> {
        let repo = self.open().ok()?;
        repo.refname_to_id(&format!("refs/heads/{}", self.settings.branch))
            .ok()
    }

    fn unpushed_head(&self) -> Option<Oid> {
        let local = self.local_head()?;
        let repo = self.open().ok()?;
        let tracking = repo.refname_to_id(&self.tracking_ref()).ok();
        (tracking != Some(local)).then_some(local)
    }

    fn branch(&self) -> &str {
        &self.settings.branch
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::sync::Mutex;

    #[test]
    fn recovery_names_are_valid_ref_names() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_994_100);
        let name = recovery_ref_name(at);
        assert_eq!(name, "refs/heads/recovery/20261129T231500Z");
        assert!(git2::Reference::is_valid_name(&name));
    }

    #[test]
    fn urls_lose_their_credentials() {
        for (url, expected) in [
            (
                "https://u:tok@h.example/a.git",
                "https://***@h.example/a.git",
            ),
            ("https://tok@h.example/a.git", "https://***@h.example/a.git"),
            ("https://h.example/a@b.git", "https://h.example/a@b.git"),
            ("http://127.0.0.1:8/x", "http://127.0.0.1:8/x"),
            ("/srv/git/a.git", "/srv/git/a.git"),
            ("file:///srv/a.git", "file:///srv/a.git"),
        ] {
            assert_eq!(redact_url(url), expected, "{url}");
        }
    }

    /// A scripted remote: each push takes the next result; the branch tip is tracked.
    struct Script {
        results: Mutex<VecDeque<Result<(), PushFailure>>>,
        pushes: Mutex<Vec<(Oid, String)>>,
    }

    impl Script {
        fn new(results: Vec<Result<(), PushFailure>>) -> Arc<Self> {
            Arc::new(Self {
                results: Mutex::new(results.into()),
                pushes: Mutex::new(Vec::new()),
            })
        }
        fn pushes(&self) -> Vec<(Oid, String)> {
            self.pushes.lock().unwrap().clone()
        }
    }

    impl Remote for Script {
        fn push(&self, head: Oid, dst: &str) -> Result<(), PushFailure> {
            self.pushes.lock().unwrap().push((head, dst.to_owned()));
            self.results.lock().unwrap().pop_front().unwrap_or(Ok(()))
        }
        fn fetch_branch_tip(&self) -> Result<Oid, PushFailure> {
            Ok(oid(99))
        }
        fn contains(&self, head: Oid, tip: Oid) -> bool {
            head == tip
        }
        fn local_head(&self) -> Option<Oid> {
            None
        }
        fn unpushed_head(&self) -> Option<Oid> {
            None
        }
        fn branch(&self) -> &str {
            "main"
        }
    }

    fn oid(n: u8) -> Oid {
        Oid::from_bytes(&[n; 20]).unwrap()
    }

    fn fail(kind: FailureKind) -> Result<(), PushFailure> {
        Err(PushFailure {
            kind,
            message: format!("{kind:?}"),
        })
    }

    async fn next(events: &mut mpsc::Receiver<PushEvent>) -> PushEvent {
        loop {
            match events.recv().await.expect("pusher alive") {
                PushEvent::Started => continue,
                e => return e,
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn failures_wait_out_the_backoff_and_the_newest_head_wins() {
        let script = Script::new(vec![fail(FailureKind::Server), fail(FailureKind::Network)]);
        let (heads_tx, heads) = watch::channel(None);
        let (tx, mut events) = mpsc::channel(16);
        let handle = PushHandle::spawn_with(Arc::clone(&script), heads, tx);
        let start = Instant::now();

        heads_tx.send_replace(Some(oid(1)));
        let PushEvent::Failed { retry_in, .. } = next(&mut events).await else {
            panic!("first push fails")
        };
        assert!((Duration::from_millis(500)..=Duration::from_secs(1)).contains(&retry_in));

        // Two newer heads during the backoff: no attempt before it ends, then only the newest.
        heads_tx.send_replace(Some(oid(2)));
        heads_tx.send_replace(Some(oid(3)));
        let PushEvent::Failed {
            retry_in: second, ..
        } = next(&mut events).await
        else {
            panic!("second push fails")
        };
        assert!(start.elapsed() >= retry_in, "waited out the first backoff");
        assert!((Duration::from_secs(1)..=Duration::from_secs(2)).contains(&second));

        let before = Instant::now();
        assert!(matches!(next(&mut events).await, PushEvent::Pushed { oid: o, .. } if o == oid(3)));
        assert!(before.elapsed() >= second);
        let main = "refs/heads/main".to_owned();
        assert_eq!(
            script.pushes(),
            [
                (oid(1), main.clone()),
                (oid(3), main.clone()),
                (oid(3), main)
            ]
        );
        handle.shutdown(Duration::from_secs(1)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn an_auth_failure_waits_minutes_not_seconds() {
        let script = Script::new(vec![fail(FailureKind::Auth)]);
        let (heads_tx, heads) = watch::channel(None);
        let (tx, mut events) = mpsc::channel(16);
        let handle = PushHandle::spawn_with(Arc::clone(&script), heads, tx);
        heads_tx.send_replace(Some(oid(1)));
        let PushEvent::Failed { retry_in, .. } = next(&mut events).await else {
            panic!("auth failure")
        };
        assert!(retry_in >= Duration::from_secs(150), "{retry_in:?}");
        heads_tx.send_replace(Some(oid(2)));
        tokio::time::sleep(Duration::from_secs(120)).await;
        assert_eq!(script.pushes().len(), 1, "no retry within two minutes");
        handle.shutdown(Duration::from_secs(1)).await;
        assert_eq!(script.pushes().len(), 2, "shutdown makes one last attempt");
        assert_eq!(script.pushes()[1].0, oid(2));
    }

    #[tokio::test(start_paused = true)]
    async fn non_fast_forward_goes_to_a_recovery_branch_and_later_heads_follow() {
        let script = Script::new(vec![fail(FailureKind::NonFastForward)]);
        let (heads_tx, heads) = watch::channel(None);
        let (tx, mut events) = mpsc::channel(16);
        let handle = PushHandle::spawn_with(Arc::clone(&script), heads, tx);
        heads_tx.send_replace(Some(oid(1)));
        let PushEvent::Diverged { recovery_ref } = next(&mut events).await else {
            panic!("diverged")
        };
        assert!(
            recovery_ref.starts_with("refs/heads/recovery/"),
            "{recovery_ref}"
        );
        heads_tx.send_replace(Some(oid(2)));
        assert_eq!(
            next(&mut events).await,
            PushEvent::Diverged {
                recovery_ref: recovery_ref.clone()
            }
        );
        // The remote tip itself (what a sync resets to) resumes normal pushes.
        heads_tx.send_replace(Some(oid(99)));
        assert!(
            matches!(next(&mut events).await, PushEvent::Pushed { oid: o, .. } if o == oid(99))
        );
        let dsts: Vec<_> = script.pushes().into_iter().map(|(_, d)| d).collect();
        assert_eq!(
            dsts,
            [
                "refs/heads/main".to_owned(),
                recovery_ref.clone(),
                recovery_ref,
                "refs/heads/main".to_owned()
            ]
        );
        handle.shutdown(Duration::from_secs(1)).await;
    }

    /// A remote whose pushes take a while, so shutdown arrives while one is in flight.
    struct Slow {
        inner: Arc<Script>,
    }

    impl Remote for Slow {
        fn push(&self, head: Oid, dst: &str) -> Result<(), PushFailure> {
            std::thread::sleep(Duration::from_millis(300));
            self.inner.push(head, dst)
        }
        fn fetch_branch_tip(&self) -> Result<Oid, PushFailure> {
            self.inner.fetch_branch_tip()
        }
        fn contains(&self, head: Oid, tip: Oid) -> bool {
            self.inner.contains(head, tip)
        }
        fn local_head(&self) -> Option<Oid> {
            None
        }
        fn unpushed_head(&self) -> Option<Oid> {
            None
        }
        fn branch(&self) -> &str {
            "main"
        }
    }

    #[tokio::test]
    async fn shutdown_during_an_attempt_adds_one_only_for_a_newer_head_after_a_success() {
        for (first, newer, expected) in [
            (fail(FailureKind::Network), true, vec![oid(1)]),
            (Ok(()), true, vec![oid(1), oid(2)]),
            (Ok(()), false, vec![oid(1)]),
        ] {
            let script = Script::new(vec![first.clone(), fail(FailureKind::Network)]);
            let slow = Arc::new(Slow {
                inner: Arc::clone(&script),
            });
            let (heads_tx, heads) = watch::channel(None);
            let (tx, mut events) = mpsc::channel(16);
            let handle = PushHandle::spawn_with(slow, heads, tx);
            heads_tx.send_replace(Some(oid(1)));
            assert_eq!(events.recv().await, Some(PushEvent::Started));
            if newer {
                heads_tx.send_replace(Some(oid(2)));
            }
            handle.shutdown(Duration::from_secs(10)).await;
            let pushed: Vec<_> = script.pushes().into_iter().map(|(o, _)| o).collect();
            assert_eq!(pushed, expected, "first {first:?}, newer head {newer}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_with_nothing_new_pushes_nothing() {
        let script = Script::new(vec![]);
        let (heads_tx, heads) = watch::channel(None);
        let (tx, mut events) = mpsc::channel(16);
        let handle = PushHandle::spawn_with(Arc::clone(&script), heads, tx);
        heads_tx.send_replace(Some(oid(1)));
        assert!(matches!(next(&mut events).await, PushEvent::Pushed { .. }));
        handle.shutdown(Duration::from_secs(1)).await;
        assert_eq!(script.pushes().len(), 1);
    }
}
