//! Sync jobs run through the [`Store`]: events go into the store's queue (or, while the
//! database is down, into a local buffer written when it is back), and workers claim jobs,
//! run them under a renewed lease, and release them. Whichever replica claims a job runs it;
//! a claim is held by one runner at a time across all replicas.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{Claim, Store, StoreError, claim_owner, run_holding};
use crate::event::ExternalPush;
use crate::status::SyncOutcome;

/// How often a worker with nothing to do looks for jobs (other replicas' events, leases that
/// ran out), and how often the local buffer is retried while the database is down.
pub const JOBS_POLL: Duration = Duration::from_millis(500);

/// The job queue of one replica. Share it behind an `Arc`.
pub struct SyncJobs {
    store: Arc<dyn Store>,
    replica: String,
    lease: Duration,
    /// Events not yet in the store, oldest first, the newest only per user.
    buffer: Mutex<VecDeque<ExternalPush>>,
    database_error: Mutex<Option<String>>,
    buffered: Notify,
    work: Notify,
}

impl SyncJobs {
    /// A queue over `store` whose claims hold for `lease` (renewed every third of it while a
    /// run goes on). `replica` names this process in the claims it takes.
    pub fn new(store: Arc<dyn Store>, replica: String, lease: Duration) -> Arc<SyncJobs> {
        Arc::new(SyncJobs {
            store,
            replica,
            lease,
            buffer: Mutex::default(),
            database_error: Mutex::default(),
            buffered: Notify::new(),
            work: Notify::new(),
        })
    }

    /// Queues a sync for `push`'s user. Never waits: the write happens in the background, and
    /// is retried until the database takes it.
    pub fn submit(&self, push: ExternalPush) {
        let mut buffer = self.buffer.lock().unwrap_or_else(|p| p.into_inner());
        match buffer.iter_mut().find(|p| p.user == push.user) {
            Some(older) => *older = push,
            None => buffer.push_back(push),
        }
        drop(buffer);
        self.buffered.notify_one();
    }

    /// `None` when the database answers; else what is wrong and how many events wait.
    pub fn degraded(&self) -> Option<String> {
        let error = self
            .database_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()?;
        let waiting = self.buffer.lock().unwrap_or_else(|p| p.into_inner()).len();
        Some(format!(
            "{error}; {waiting} sync request(s) buffered in memory until it is back"
        ))
    }

    fn database(&self, result: Result<(), &StoreError>) {
        let mut state = self
            .database_error
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match result {
            Ok(()) => {
                if state.take().is_some() {
                    tracing::info!("the database answers again");
                }
            }
            Err(e) => {
                if state.is_none() {
                    tracing::error!(error = %e, "the database does not answer; sync requests wait in memory");
                }
                *state = Some(e.to_string());
            }
        }
    }

    /// Starts the buffer's writer and `parallel` workers, each running `run` for one claimed
    /// job at a time and recording its outcome. Dropping the returned set stops them (a run in flight is dropped, and
    /// its lease runs out for another replica to take the job).
    pub fn start<F, Fut>(self: &Arc<Self>, parallel: usize, run: F) -> JoinSet<()>
    where
        F: Fn(ExternalPush) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = SyncOutcome> + Send + 'static,
    {
        let mut tasks = JoinSet::new();
        tasks.spawn(self.clone().write_buffer());
        let run = Arc::new(run);
        for _ in 0..parallel.max(1) {
            let (jobs, run) = (self.clone(), run.clone());
            tasks.spawn(async move { jobs.work(&*run).await });
        }
        tasks
    }

    async fn write_buffer(self: Arc<Self>) {
        loop {
            tokio::select! {
                () = self.buffered.notified() => {}
                () = tokio::time::sleep(JOBS_POLL) => {}
            }
            loop {
                let Some(next) = self
                    .buffer
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .front()
                    .cloned()
                else {
                    break;
                };
                match self.store.enqueue(next.clone()).await {
                    Ok(_) => {
                        self.database(Ok(()));
                        let mut buffer = self.buffer.lock().unwrap_or_else(|p| p.into_inner());
                        if buffer.front() == Some(&next) {
                            buffer.pop_front();
                        }
                        drop(buffer);
                        self.work.notify_waiters();
                    }
                    Err(e) => {
                        self.database(Err(&e));
                        break;
                    }
                }
            }
        }
    }

    async fn work<F, Fut>(&self, run: &F)
    where
        F: Fn(ExternalPush) -> Fut,
        Fut: Future<Output = SyncOutcome>,
    {
        loop {
            let notified = self.work.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self
                .store
                .claim(claim_owner(&self.replica), self.lease)
                .await
            {
                Ok(Some(claim)) => {
                    self.database(Ok(()));
                    self.run_claim(claim, run).await;
                }
                Ok(None) => {
                    self.database(Ok(()));
                    tokio::select! {
                        () = notified => {}
                        () = tokio::time::sleep(JOBS_POLL) => {}
                    }
                }
                Err(e) => {
                    self.database(Err(&e));
                    tokio::time::sleep(JOBS_POLL).await;
                }
            }
        }
    }

    /// Runs one claimed job, renewing its lease; stops the run if the lease is lost (another
    /// runner may have the job now), then releases the claim.
    async fn run_claim<F, Fut>(&self, claim: Claim, run: &F)
    where
        F: Fn(ExternalPush) -> Fut,
        Fut: Future<Output = SyncOutcome>,
    {
        let user = claim.push.user.clone();
        tracing::info!(%user, owner = %claim.owner, new_oid = %claim.push.new_oid, "sync job claimed");
        let Some(outcome) =
            run_holding(&*self.store, &claim, self.lease, run(claim.push.clone())).await
        else {
            return;
        };
        let held_until = Instant::now() + self.lease;
        loop {
            match self.store.finish(claim.clone(), outcome.clone()).await {
                Ok(true) => return,
                Ok(false) => {
                    tracing::warn!(%user, "the sync job's lease ran out before the run ended; another run may follow");
                    return;
                }
                Err(e) if Instant::now() >= held_until => {
                    tracing::warn!(%user, error = %e, "cannot release the sync job; its lease runs out instead");
                    return;
                }
                Err(_) => tokio::time::sleep(JOBS_POLL / 5).await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;
    use crate::user::UserId;

    fn push(user: &str, n: u32) -> ExternalPush {
        ExternalPush {
            user: UserId::parse(user).expect("valid"),
            refname: "refs/heads/main".into(),
            new_oid: format!("{n:040x}"),
        }
    }

    fn synced() -> SyncOutcome {
        SyncOutcome::Synced { commit: None }
    }

    /// Starts `jobs` with runs of 10 s that record `user oid` when they start.
    fn start(jobs: &Arc<SyncJobs>, parallel: usize) -> (JoinSet<()>, Arc<Mutex<Vec<String>>>) {
        let started: Arc<Mutex<Vec<String>>> = Arc::default();
        let record = started.clone();
        let tasks = jobs.start(parallel, move |push: ExternalPush| {
            let record = record.clone();
            async move {
                record
                    .lock()
                    .unwrap()
                    .push(format!("{} {}", push.user, &push.new_oid[38..]));
                tokio::time::sleep(Duration::from_secs(10)).await;
                synced()
            }
        });
        (tasks, started)
    }

    async fn until_started(started: &Mutex<Vec<String>>, n: usize) {
        while started.lock().unwrap().len() < n {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn events_during_a_run_give_exactly_one_more_run_with_the_newest() {
        let jobs = SyncJobs::new(
            Arc::new(MemoryStore::new()),
            "r".into(),
            Duration::from_secs(3),
        );
        let (_tasks, started) = start(&jobs, 2);
        jobs.submit(push("alice", 1));
        until_started(&started, 1).await;
        for n in 2..=5 {
            jobs.submit(push("alice", n));
        }
        jobs.submit(push("bob", 7));
        tokio::time::sleep(Duration::from_secs(60)).await;
        let mut runs = started.lock().unwrap().clone();
        runs.sort();
        assert_eq!(runs, ["alice 01", "alice 05", "bob 07"]);
        assert_eq!(jobs.degraded(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_run_longer_than_its_lease_keeps_it_and_a_lost_lease_stops_the_run() {
        let store = Arc::new(MemoryStore::new());
        let lease = Duration::from_secs(3);
        store.enqueue(push("alice", 1)).await.unwrap();
        let claim = store.claim("a#1".into(), lease).await.unwrap().unwrap();
        let long = tokio::time::sleep(Duration::from_secs(10));
        let checker = async {
            for _ in 0..3 {
                tokio::time::sleep(Duration::from_secs(3)).await;
                assert_eq!(store.claim("b#1".into(), lease).await.unwrap(), None);
            }
        };
        let (held, ()) = tokio::join!(run_holding(&*store, &claim, lease, long), checker);
        assert!(held.is_some(), "renewed past three leases");
        assert!(store.finish(claim, synced()).await.unwrap());

        store.enqueue(push("alice", 2)).await.unwrap();
        let claim = store.claim("a#2".into(), lease).await.unwrap().unwrap();
        let start = Instant::now();
        let taken = async {
            tokio::time::sleep(Duration::from_secs(4)).await;
            // Another runner takes the job (as after a lease ran out).
            assert!(store.finish(claim.clone(), synced()).await.unwrap());
            store.enqueue(push("alice", 3)).await.unwrap();
            store.claim("b#2".into(), lease).await.unwrap().unwrap()
        };
        let forever = tokio::time::sleep(Duration::from_secs(3600));
        let (held, _) = tokio::join!(run_holding(&*store, &claim, lease, forever), taken);
        assert!(held.is_none(), "the lost lease stopped the run");
        assert!(start.elapsed() <= Duration::from_secs(4) + lease / 3);
    }
}
