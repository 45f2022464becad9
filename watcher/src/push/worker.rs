//! The push worker: which head to push when, the backoff between attempts, the pack each
//! attempt sends (larger after a refusal for missing objects), and the recovery-branch
//! policy. It talks to the server only through [`Remote`].

use shmastra_contract::duration::short_duration;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use git2::Oid;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::{
    GitRemote, Head, Pack, PushEvent, PushFailure, Remote, recovery_ref_name, refusal_words,
};
use crate::remote::RemoteSettings;
use crate::retry::{self, Backoff, FailureKind};

/// While diverged, how often the pusher looks whether the local branch contains the remote
/// one again: locally (a sync reset the branch to the remote's), then with a fetch (the user
/// force-pushed the remote back to an ancestor of the local branch, or to it).
const DIVERGED_RECHECK: Duration = Duration::from_secs(15);

/// The running pusher.
#[derive(Debug)]
pub struct PushHandle {
    task: tokio::task::JoinHandle<()>,
    shutdown: oneshot::Sender<()>,
}

impl PushHandle {
    /// Starts the pusher. It pushes whatever head `heads` holds whenever that changes, to the
    /// remote branch of the head's branch; before the first head arrives it pushes the
    /// checked-out branch if the remote lacks it (commits left unpushed by an earlier run).
    pub fn spawn(
        settings: RemoteSettings,
        heads: watch::Receiver<Option<Head>>,
        events: mpsc::Sender<PushEvent>,
    ) -> Self {
        crate::transport::init(crate::transport::DEFAULT_NETWORK_TIMEOUT);
        Self::spawn_with(Arc::new(GitRemote::new(settings)), heads, events)
    }

    pub(crate) fn spawn_with<R: Remote>(
        remote: Arc<R>,
        heads: watch::Receiver<Option<Head>>,
        events: mpsc::Sender<PushEvent>,
    ) -> Self {
        let (shutdown, shutdown_rx) = oneshot::channel();
        let worker = Worker {
            remote,
            events,
            backoff: Backoff::default(),
            diverged: None,
            done: None,
            pack: Pack::Changes,
            escalated: false,
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
    /// The branch whose remote moved on.
    branch: String,
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
    done: Option<Head>,
    /// What the next attempt sends: changes, or after a refusal for missing objects a larger
    /// pack until one lands.
    pack: Pack,
    /// The last attempt was refused for missing objects and `pack` grew: the next attempt is
    /// owed even at shutdown.
    escalated: bool,
}

impl<R: Remote> Worker<R> {
    async fn run(
        mut self,
        mut heads: watch::Receiver<Option<Head>>,
        mut shutdown: oneshot::Receiver<()>,
    ) {
        // A remote that cannot be opened now fails the push too, which says why.
        if let Some(Err(failure)) = self.blocking(|r| r.repair()).await {
            tracing::debug!("cannot check the remote's objects: {}", failure.message);
        }
        let published = heads.borrow_and_update().clone();
        let mut target = match published {
            Some(head) => Some(head),
            None => self.blocking(|r| r.unpushed_head()).await.flatten(),
        };
        let mut retry_at: Option<Instant> = None;
        // A deadline, not a sleep per turn: saves more often than the recheck must not put it off.
        let mut recheck_at = Instant::now() + DIVERGED_RECHECK;
        let mut heads_open = true;
        loop {
            let pending = target.is_some() && target != self.done;
            if pending && retry_at.is_none_or(|at| at <= Instant::now()) {
                if let Some(head) = target.clone() {
                    retry_at = self.attempt(head).await;
                }
                // Shutdown came during that attempt. If it failed, it was the last one: the
                // server is failing and the deadline is short (but a refusal for missing
                // objects is answered with the larger packs at once). If it succeeded, the
                // newest head (the shutdown's own commit) still gets its attempt below.
                if shutdown_requested(&mut shutdown) {
                    if retry_at.is_some() {
                        if let Some(head) = target {
                            self.owed(head).await;
                        }
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
                        let published = heads.borrow_and_update().clone();
                        target = published.or(target);
                    }
                    Err(_) => heads_open = false,
                },
                _ = sleep_until(retry_at), if pending => retry_at = None,
                () = tokio::time::sleep_until(recheck_at), if self.diverged.is_some() && !pending => {
                    recheck_at = Instant::now() + DIVERGED_RECHECK;
                    if let Some(local) = self.no_longer_diverged().await {
                        // Pushed again even when it went to the recovery branch already.
                        self.done = None;
                        target = Some(local);
                    }
                }
            }
        }
        // Shutdown: the daemon committed what was pending and published it; one attempt for
        // the newest head, whatever the backoff says.
        let published = heads.borrow().clone();
        let newest = published.or(target);
        if let Some(head) = newest.filter(|h| Some(h) != self.done.as_ref()) {
            self.attempt(head.clone()).await;
            self.owed(head).await;
        }
    }

    /// The larger packs a refusal for missing objects owes, without waiting (at most two).
    async fn owed(&mut self, head: Head) {
        while self.escalated {
            self.attempt(head.clone()).await;
        }
    }

    /// The local branch's head, when it contains the remote tip again: the one we diverged
    /// from (a sync ran), or the remote's tip now (the user pushed the remote back). Then the
    /// divergence is over.
    async fn no_longer_diverged(&mut self) -> Option<Head> {
        let (branch, tip) = self
            .diverged
            .as_ref()
            .map(|d| (d.branch.clone(), d.remote_tip))?;
        let name = branch.clone();
        let local = self
            .blocking(move |r| {
                r.local_head(&name)
                    .map(|local| (local, r.contains(local, tip)))
            })
            .await
            .flatten()?;
        let contained = local.1 || {
            let name = branch.clone();
            let head = local.0;
            self.blocking(move |r| {
                r.fetch_branch_tip(&name)
                    .is_ok_and(|now| r.contains(head, now))
            })
            .await
            .unwrap_or(false)
        };
        if !contained {
            return None;
        }
        tracing::info!(%branch, "the local branch contains the remote one again; normal pushes resume");
        self.diverged = None;
        Some(Head {
            oid: local.0,
            branch,
        })
    }

    /// One attempt for `head`; returns when the next one may start, if it failed.
    async fn attempt(&mut self, head: Head) -> Option<Instant> {
        self.emit(PushEvent::Started).await;
        match self.push(&head).await {
            Ok(outcome) => {
                self.done = Some(head);
                self.backoff.reset();
                self.pack = Pack::Changes;
                self.escalated = false;
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
                let missing = failure.kind == FailureKind::MissingObjects;
                let larger = self.pack.larger().filter(|_| missing);
                let error = refusal_words(&failure, larger);
                self.escalated = larger.is_some();
                let retry_in = if missing && larger.is_none() {
                    // Even every object was refused: a person has to act; the next attempt
                    // starts over with changes, slowly.
                    self.pack = Pack::Changes;
                    self.backoff
                        .next_delay_in(retry::SLOW, retry::random_jitter())
                } else {
                    self.backoff
                        .next_delay(failure.kind, retry::random_jitter())
                };
                if let Some(larger) = larger {
                    tracing::warn!("{error}");
                    self.pack = larger;
                }
                tracing::debug!(kind = %failure.kind, retry_in = %short_duration(retry_in), "push failed");
                self.emit(PushEvent::Failed {
                    error,
                    kind: failure.kind,
                    retry_in,
                })
                .await;
                Some(Instant::now() + retry_in)
            }
        }
    }

    async fn push(&mut self, head: &Head) -> Result<Outcome, PushFailure> {
        let oid = head.oid;
        if self
            .diverged
            .as_ref()
            .is_some_and(|d| d.branch != head.branch)
        {
            // Another branch: its remote branch is judged afresh.
            self.diverged = None;
        }
        if let Some(tip) = self.diverged.as_ref().map(|d| d.remote_tip)
            && self
                .blocking(move |r| r.contains(oid, tip))
                .await
                .unwrap_or(false)
        {
            tracing::info!("the local branch contains the remote one again; normal pushes resume");
            self.diverged = None;
        }
        if self.diverged.is_none() {
            let branch_ref = format!("refs/heads/{}", head.branch);
            match self.blocking_push(oid, branch_ref).await {
                Ok(()) => return Ok(Outcome::Pushed(oid)),
                Err(f) if f.kind == FailureKind::NonFastForward => {
                    let branch = head.branch.clone();
                    let remote_tip = self
                        .blocking(move |r| r.fetch_branch_tip(&branch))
                        .await
                        .unwrap_or_else(|| Err(panicked()))?;
                    tracing::warn!(
                        remote_tip = %remote_tip,
                        "the remote branch has commits this one lacks; pushing to a recovery branch instead (never forcing)"
                    );
                    self.diverged = Some(Diverged {
                        branch: head.branch.clone(),
                        remote_tip,
                        recovery_ref: None,
                    });
                }
                Err(f) => return Err(f),
            }
        }
        self.push_recovery(oid).await
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
        let pack = self.pack;
        self.blocking(move |r| r.push(head, &dst, pack))
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
        /// What a fetch of the remote branch finds.
        remote_tip: Mutex<Oid>,
        /// The local branch's tip.
        local: Mutex<Option<Oid>>,
        packs: Mutex<Vec<Pack>>,
    }

    impl Script {
        fn new(results: Vec<Result<(), PushFailure>>) -> Arc<Self> {
            Arc::new(Self {
                results: Mutex::new(results.into()),
                pushes: Mutex::new(Vec::new()),
                remote_tip: Mutex::new(oid(99)),
                local: Mutex::new(None),
                packs: Mutex::new(Vec::new()),
            })
        }
        fn pushes(&self) -> Vec<(Oid, String)> {
            self.pushes.lock().unwrap().clone()
        }
        fn packs(&self) -> Vec<Pack> {
            self.packs.lock().unwrap().clone()
        }
    }

    impl Remote for Script {
        fn push(&self, head: Oid, dst: &str, pack: Pack) -> Result<(), PushFailure> {
            self.pushes.lock().unwrap().push((head, dst.to_owned()));
            self.packs.lock().unwrap().push(pack);
            self.results.lock().unwrap().pop_front().unwrap_or(Ok(()))
        }
        fn fetch_branch_tip(&self, _branch: &str) -> Result<Oid, PushFailure> {
            Ok(*self.remote_tip.lock().unwrap())
        }
        fn contains(&self, head: Oid, tip: Oid) -> bool {
            head == tip
        }
        fn local_head(&self, _branch: &str) -> Option<Oid> {
            *self.local.lock().unwrap()
        }
        fn unpushed_head(&self) -> Option<Head> {
            None
        }
    }

    fn oid(n: u8) -> Oid {
        Oid::from_bytes(&[n; 20]).unwrap()
    }

    /// `oid(n)` on `main`.
    fn head(n: u8) -> Option<Head> {
        Some(Head {
            oid: oid(n),
            branch: "main".to_owned(),
        })
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

        heads_tx.send_replace(head(1));
        let PushEvent::Failed { retry_in, .. } = next(&mut events).await else {
            panic!("first push fails")
        };
        assert!((Duration::from_millis(500)..=Duration::from_secs(1)).contains(&retry_in));

        // Two newer heads during the backoff: no attempt before it ends, then only the newest.
        heads_tx.send_replace(head(2));
        heads_tx.send_replace(head(3));
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
        heads_tx.send_replace(head(1));
        let PushEvent::Failed { retry_in, .. } = next(&mut events).await else {
            panic!("auth failure")
        };
        assert!(retry_in >= Duration::from_secs(150), "{retry_in:?}");
        heads_tx.send_replace(head(2));
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
        heads_tx.send_replace(head(1));
        let PushEvent::Diverged { recovery_ref } = next(&mut events).await else {
            panic!("diverged")
        };
        assert!(
            recovery_ref.starts_with("refs/heads/recovery/"),
            "{recovery_ref}"
        );
        heads_tx.send_replace(head(2));
        assert_eq!(
            next(&mut events).await,
            PushEvent::Diverged {
                recovery_ref: recovery_ref.clone()
            }
        );
        // The remote tip itself (what a sync resets to) resumes normal pushes.
        heads_tx.send_replace(head(99));
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

    #[tokio::test(start_paused = true)]
    async fn a_remote_pushed_back_to_the_local_branch_ends_the_divergence_by_itself() {
        let script = Script::new(vec![fail(FailureKind::NonFastForward)]);
        let (heads_tx, heads) = watch::channel(None);
        let (tx, mut events) = mpsc::channel(16);
        let handle = PushHandle::spawn_with(Arc::clone(&script), heads, tx);
        heads_tx.send_replace(head(1));
        assert!(matches!(
            next(&mut events).await,
            PushEvent::Diverged { .. }
        ));
        // The user force-pushes the remote branch back to an ancestor of the local tip, and
        // saves keep coming, more often than the recheck.
        *script.local.lock().unwrap() = Some(oid(7));
        *script.remote_tip.lock().unwrap() = oid(7);
        let start = Instant::now();
        let ended = loop {
            heads_tx.send_replace(head(7));
            match tokio::time::timeout(Duration::from_secs(5), next(&mut events)).await {
                Ok(PushEvent::Diverged { .. }) | Err(_) => {}
                Ok(other) => break other,
            }
            assert!(start.elapsed() < DIVERGED_RECHECK * 3, "still diverged");
        };
        assert!(
            matches!(ended, PushEvent::Pushed { oid: o, .. } if o == oid(7)),
            "{ended:?}"
        );
        assert_eq!(script.pushes().last().unwrap().1, "refs/heads/main");
        handle.shutdown(Duration::from_secs(1)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn each_branch_goes_to_the_remote_branch_of_its_name() {
        let script = Script::new(vec![]);
        let (heads_tx, heads) = watch::channel(None);
        let (tx, mut events) = mpsc::channel(16);
        let handle = PushHandle::spawn_with(Arc::clone(&script), heads, tx);
        for (n, branch) in [(1, "feature"), (2, "main"), (3, "feature")] {
            heads_tx.send_replace(Some(Head {
                oid: oid(n),
                branch: branch.to_owned(),
            }));
            assert!(
                matches!(next(&mut events).await, PushEvent::Pushed { oid: o, .. } if o == oid(n))
            );
        }
        assert_eq!(
            script.pushes(),
            [
                (oid(1), "refs/heads/feature".to_owned()),
                (oid(2), "refs/heads/main".to_owned()),
                (oid(3), "refs/heads/feature".to_owned()),
            ]
        );
        handle.shutdown(Duration::from_secs(1)).await;
    }

    /// A remote whose pushes take a while, so shutdown arrives while one is in flight.
    struct Slow {
        inner: Arc<Script>,
    }

    impl Remote for Slow {
        fn push(&self, head: Oid, dst: &str, pack: Pack) -> Result<(), PushFailure> {
            std::thread::sleep(Duration::from_millis(300));
            self.inner.push(head, dst, pack)
        }
        fn fetch_branch_tip(&self, branch: &str) -> Result<Oid, PushFailure> {
            self.inner.fetch_branch_tip(branch)
        }
        fn contains(&self, head: Oid, tip: Oid) -> bool {
            self.inner.contains(head, tip)
        }
        fn local_head(&self, _branch: &str) -> Option<Oid> {
            None
        }
        fn unpushed_head(&self) -> Option<Head> {
            None
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
            heads_tx.send_replace(head(1));
            assert_eq!(events.recv().await, Some(PushEvent::Started));
            if newer {
                heads_tx.send_replace(head(2));
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
        heads_tx.send_replace(head(1));
        assert!(matches!(next(&mut events).await, PushEvent::Pushed { .. }));
        handle.shutdown(Duration::from_secs(1)).await;
        assert_eq!(script.pushes().len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_for_missing_objects_sends_larger_packs_soon_then_changes_again() {
        let script = Script::new(vec![
            fail(FailureKind::MissingObjects),
            fail(FailureKind::MissingObjects),
            Ok(()),
        ]);
        let (heads_tx, heads) = watch::channel(None);
        let (tx, mut events) = mpsc::channel(16);
        let handle = PushHandle::spawn_with(Arc::clone(&script), heads, tx);
        heads_tx.send_replace(head(1));
        for sending in ["sending a full pack", "sending every object of the branch"] {
            let PushEvent::Failed {
                error,
                kind,
                retry_in,
            } = next(&mut events).await
            else {
                panic!("refused")
            };
            assert_eq!(kind, FailureKind::MissingObjects);
            assert!(
                error.starts_with("the remote refused the push: missing objects; ")
                    && error.contains(sending),
                "{error}"
            );
            assert!(retry_in <= Duration::from_secs(2), "soon: {retry_in:?}");
        }
        assert!(matches!(next(&mut events).await, PushEvent::Pushed { .. }));
        heads_tx.send_replace(head(2));
        assert!(matches!(next(&mut events).await, PushEvent::Pushed { .. }));
        assert_eq!(
            script.packs(),
            [Pack::Changes, Pack::Full, Pack::Everything, Pack::Changes]
        );
        handle.shutdown(Duration::from_secs(1)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn when_every_object_is_refused_the_pusher_waits_long_and_starts_over() {
        let refused = || fail(FailureKind::MissingObjects);
        let script = Script::new(vec![refused(), refused(), refused(), Ok(())]);
        let (heads_tx, heads) = watch::channel(None);
        let (tx, mut events) = mpsc::channel(16);
        let handle = PushHandle::spawn_with(Arc::clone(&script), heads, tx);
        heads_tx.send_replace(head(1));
        let mut last = None;
        for _ in 0..3 {
            last = Some(next(&mut events).await);
        }
        let Some(PushEvent::Failed {
            error, retry_in, ..
        }) = last
        else {
            panic!("refused three times")
        };
        assert!(
            error.contains("a person has to look at the remote"),
            "{error}"
        );
        assert!(retry_in >= Duration::from_secs(15), "slow: {retry_in:?}");
        assert!(matches!(next(&mut events).await, PushEvent::Pushed { .. }));
        assert_eq!(
            script.packs(),
            [Pack::Changes, Pack::Full, Pack::Everything, Pack::Changes]
        );
        handle.shutdown(Duration::from_secs(1)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn at_shutdown_a_refusal_for_missing_objects_still_gets_its_larger_packs() {
        let refused = || fail(FailureKind::MissingObjects);
        let script = Script::new(vec![refused(), refused(), Ok(())]);
        let (heads_tx, heads) = watch::channel(None);
        let (tx, mut events) = mpsc::channel(16);
        let handle = PushHandle::spawn_with(Arc::clone(&script), heads, tx);
        // As `once` does: a head, then shutdown at once.
        heads_tx.send_replace(head(1));
        handle.shutdown(Duration::from_secs(10)).await;
        assert_eq!(
            script.packs(),
            [Pack::Changes, Pack::Full, Pack::Everything]
        );
        let mut last = None;
        while let Ok(event) = events.try_recv() {
            last = Some(event);
        }
        assert!(matches!(last, Some(PushEvent::Pushed { .. })), "{last:?}");
    }
}
