//! The `--on-external-push` runs, coalesced per user: at most one run per user at a time, and
//! pushes that arrive during it become exactly one more run with the newest push. Users never
//! wait behind each other's volume: each has its own slot, and the runs of different users
//! share only a cap on how many run at once (a fair, first-come semaphore).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;

use crate::UserId;
use crate::proxy::ExternalPush;

/// What became of one push handed to [`SyncQueue::push`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queued {
    /// No run for this user was going on: one starts now (or when a slot frees up).
    Started,
    /// A run for this user is going on: one more runs after it, with the newest push.
    Coalesced,
}

/// Runs `run` per push, coalesced per user. Cheap to clone.
pub struct SyncQueue<F> {
    inner: Arc<Inner<F>>,
}

impl<F> Clone for SyncQueue<F> {
    fn clone(&self) -> Self {
        SyncQueue {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<F> {
    run: F,
    parallel: Semaphore,
    /// Users with a run going on (or waiting for a slot), and the push to run next, if any.
    users: Mutex<HashMap<UserId, Option<ExternalPush>>>,
}

impl<F, Fut> SyncQueue<F>
where
    F: Fn(ExternalPush) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    /// At most `parallel` runs at once (for different users; at least 1).
    pub fn new(parallel: usize, run: F) -> SyncQueue<F> {
        SyncQueue {
            inner: Arc::new(Inner {
                run,
                parallel: Semaphore::new(parallel.max(1)),
                users: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Queues a run for `push`. Never blocks and never drops a user's newest push.
    pub fn push(&self, push: ExternalPush) -> Queued {
        {
            let mut users = self.inner.lock();
            if let Some(next) = users.get_mut(&push.user) {
                *next = Some(push);
                return Queued::Coalesced;
            }
            users.insert(push.user.clone(), None);
        }
        let inner = self.inner.clone();
        tokio::spawn(async move { inner.drain(push).await });
        Queued::Started
    }

    /// Users with a run going on or waiting.
    #[cfg(test)]
    pub fn busy_users(&self) -> usize {
        self.inner.lock().len()
    }
}

impl<F, Fut> Inner<F>
where
    F: Fn(ExternalPush) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    async fn drain(self: Arc<Self>, mut push: ExternalPush) {
        loop {
            {
                let Ok(_slot) = self.parallel.acquire().await else {
                    return;
                };
                (self.run)(push.clone()).await;
            }
            let mut users = self.lock();
            match users.get_mut(&push.user).and_then(Option::take) {
                Some(next) => push = next,
                None => {
                    users.remove(&push.user);
                    return;
                }
            }
        }
    }
}

impl<F> Inner<F> {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<UserId, Option<ExternalPush>>> {
        self.users.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn push(user: &str, n: u32) -> ExternalPush {
        ExternalPush {
            user: UserId::parse(user).expect("user id"),
            refname: "refs/heads/main".into(),
            new_oid: format!("{n:040x}"),
        }
    }

    type Log = Arc<Mutex<Vec<(String, String)>>>;

    /// A queue whose runs take `run_for` (on the paused clock) and are logged as they start.
    fn queue(
        parallel: usize,
        run_for: Duration,
    ) -> (
        SyncQueue<impl Fn(ExternalPush) -> futures_util::future::BoxFuture<'static, ()>>,
        Log,
    ) {
        let log: Log = Arc::default();
        let sink = log.clone();
        let queue = SyncQueue::new(parallel, move |push: ExternalPush| {
            sink.lock()
                .unwrap()
                .push((push.user.to_string(), push.new_oid));
            Box::pin(tokio::time::sleep(run_for)) as futures_util::future::BoxFuture<'static, ()>
        });
        (queue, log)
    }

    #[tokio::test(start_paused = true)]
    async fn a_users_pushes_during_a_run_coalesce_into_one_more_run_with_the_newest() {
        let (queue, log) = queue(4, Duration::from_secs(10));
        assert_eq!(queue.push(push("alice", 1)), Queued::Started);
        tokio::time::sleep(Duration::from_secs(1)).await;
        for n in 2..=1000 {
            assert_eq!(queue.push(push("alice", n)), Queued::Coalesced);
        }
        tokio::time::sleep(Duration::from_secs(60)).await;
        let runs: Vec<String> = log.lock().unwrap().iter().map(|r| r.1.clone()).collect();
        assert_eq!(runs, [format!("{:040x}", 1), format!("{:040x}", 1000)]);
        assert_eq!(queue.busy_users(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn one_users_volume_never_delays_another() {
        let (queue, log) = queue(2, Duration::from_secs(10));
        for n in 0..500 {
            queue.push(push("alice", n));
            tokio::task::yield_now().await;
        }
        queue.push(push("bob", 1));
        // Bob's run starts at once: alice holds at most one slot.
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(
            log.lock().unwrap().iter().any(|(user, _)| user == "bob"),
            "{:?}",
            log.lock().unwrap()
        );
    }
}
