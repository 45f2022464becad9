//! One sync at a time per sandbox: triggers that arrive while a sync runs coalesce into
//! exactly one more run, which starts after the current one and sees every push before it.
//! Each trigger gets the outcome of the run that covered it: the caller that ran, its own
//! first run; a coalesced caller, the run that started after its trigger.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;

use tokio::sync::oneshot;

/// The callers waiting for the next run of one sandbox (the slot exists while a run goes on).
type Waiting<T> = Vec<oneshot::Sender<T>>;

/// The per-sandbox bookkeeping. Share one instance across all triggers.
pub struct Coalescer<T> {
    running: Mutex<HashMap<String, Waiting<T>>>,
}

impl<T> Default for Coalescer<T> {
    fn default() -> Self {
        Self {
            running: Mutex::new(HashMap::new()),
        }
    }
}

impl<T: Clone> Coalescer<T> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `run` for `key` unless a run for `key` is in progress; then the running caller
    /// repeats it once more after its current run, and this caller waits for that run and
    /// returns its outcome. The running caller returns the outcome of its first run (its own
    /// trigger's), after the runs it owes the others. A run that panics or is cancelled frees
    /// the slot, and the callers waiting for it run it themselves.
    pub async fn trigger<F, Fut>(&self, key: &str, mut run: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = T>,
    {
        loop {
            let waiting = {
                let mut running = self.lock();
                match running.get_mut(key) {
                    Some(waiting) => {
                        let (tx, rx) = oneshot::channel();
                        waiting.push(tx);
                        Some(rx)
                    }
                    None => {
                        running.insert(key.to_owned(), Vec::new());
                        None
                    }
                }
            };
            match waiting {
                None => break,
                Some(rx) => match rx.await {
                    Ok(outcome) => return outcome,
                    // The runner stopped before the run that covers this trigger.
                    Err(_) => continue,
                },
            }
        }
        let release = Release { owner: self, key };
        let own = run().await;
        while let Some(covered) = self.next_round(key) {
            let outcome = run().await;
            for waiter in covered {
                let _ = waiter.send(outcome.clone());
            }
        }
        std::mem::forget(release);
        own
    }

    /// The callers the next run covers, or `None` (and the slot freed) when nobody triggered
    /// during the last one.
    fn next_round(&self, key: &str) -> Option<Waiting<T>> {
        let mut running = self.lock();
        let waiting = running.get_mut(key).map(std::mem::take).unwrap_or_default();
        if waiting.is_empty() {
            running.remove(key);
            None
        } else {
            Some(waiting)
        }
    }

    /// Whether a sync for `key` is running now.
    #[cfg(test)]
    pub fn is_running(&self, key: &str) -> bool {
        self.lock().contains_key(key)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Waiting<T>>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Frees the slot if the running caller unwinds or is dropped mid-run, so a panicked or
/// cancelled sync never blocks every later one (its waiters see their channel close).
struct Release<'a, T> {
    owner: &'a Coalescer<T>,
    key: &'a str,
}

impl<T> Drop for Release<'_, T> {
    fn drop(&mut self) {
        self.owner
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    /// A sync that takes `secs` and returns its number (1 for the first run).
    fn numbered(
        runs: &Arc<AtomicU32>,
        secs: u64,
    ) -> impl FnMut() -> std::pin::Pin<Box<dyn Future<Output = u32> + Send>> + Clone + Send + 'static
    {
        let runs = runs.clone();
        move || {
            let runs = runs.clone();
            Box::pin(async move {
                let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                tokio::time::sleep(Duration::from_secs(secs)).await;
                n
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn three_triggers_during_a_run_make_exactly_two_runs_and_get_the_second() {
        let coalescer = Arc::new(Coalescer::new());
        let runs = Arc::new(AtomicU32::new(0));
        let sync = numbered(&runs, 60);
        let first = tokio::spawn({
            let (coalescer, sync) = (coalescer.clone(), sync.clone());
            async move { coalescer.trigger("sbx", sync).await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(coalescer.is_running("sbx"));
        let mut later = Vec::new();
        for _ in 0..3 {
            let (coalescer, sync) = (coalescer.clone(), sync.clone());
            later.push(tokio::spawn(
                async move { coalescer.trigger("sbx", sync).await },
            ));
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        assert_eq!(first.await.unwrap(), 1, "the first caller's own run");
        for caller in later {
            assert_eq!(caller.await.unwrap(), 2, "the run that covered the trigger");
        }
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        assert!(!coalescer.is_running("sbx"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_trigger_during_the_second_run_makes_a_third_and_gets_it() {
        let coalescer = Arc::new(Coalescer::new());
        let runs = Arc::new(AtomicU32::new(0));
        let sync = numbered(&runs, 10);
        let spawn = |coalescer: &Arc<Coalescer<u32>>| {
            let (coalescer, sync) = (coalescer.clone(), sync.clone());
            tokio::spawn(async move { coalescer.trigger("sbx", sync).await })
        };
        let first = spawn(&coalescer);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let second = spawn(&coalescer);
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 2, "the second run started");
        let third = spawn(&coalescer);
        assert_eq!(first.await.unwrap(), 1);
        assert_eq!(second.await.unwrap(), 2);
        assert_eq!(third.await.unwrap(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn sandboxes_do_not_wait_for_each_other() {
        let coalescer = Arc::new(Coalescer::new());
        let blocked = tokio::spawn({
            let coalescer = coalescer.clone();
            async move {
                coalescer
                    .trigger("a", || tokio::time::sleep(Duration::from_secs(600)))
                    .await
            }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        coalescer.trigger("b", || async {}).await;
        assert!(!coalescer.is_running("b"));
        assert!(coalescer.is_running("a"));
        blocked.abort();
    }

    #[tokio::test]
    async fn a_panicking_run_frees_the_slot() {
        let coalescer = Arc::new(Coalescer::new());
        let panicked = tokio::spawn({
            let coalescer = coalescer.clone();
            async move {
                coalescer
                    .trigger("sbx", || async { panic!("sync blew up") })
                    .await
            }
        })
        .await;
        assert!(panicked.is_err());
        assert!(!coalescer.is_running("sbx"));
        assert_eq!(coalescer.trigger("sbx", || async { 7 }).await, 7);
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_whose_runner_was_cancelled_runs_the_sync_itself() {
        let coalescer = Arc::new(Coalescer::new());
        let runs = Arc::new(AtomicU32::new(0));
        let sync = numbered(&runs, 10);
        let first = tokio::spawn({
            let (coalescer, sync) = (coalescer.clone(), sync.clone());
            async move { coalescer.trigger("sbx", sync).await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        let second = tokio::spawn({
            let (coalescer, sync) = (coalescer.clone(), sync.clone());
            async move { coalescer.trigger("sbx", sync).await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        first.abort();
        assert_eq!(second.await.unwrap(), 2, "it ran the second run itself");
        assert!(!coalescer.is_running("sbx"));
    }
}
