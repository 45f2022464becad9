//! The push worker: which head to push when, the backoff between attempts, and the
//! recovery-branch policy. It talks to the server only through [`Remote`].

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use git2::Oid;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::{GitRemote, PushEvent, PushFailure, Remote, recovery_ref_name};
use crate::remote::RemoteSettings;
use crate::retry::{self, Backoff, FailureKind};

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
        Self::spawn_with(Arc::new(GitRemote::new(settings)), heads, events)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::sync::Mutex;

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
