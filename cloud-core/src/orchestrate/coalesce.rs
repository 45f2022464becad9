//! One sync at a time per sandbox: triggers that arrive while a sync runs coalesce into
//! exactly one more run, which starts after the current one and sees every push before it.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;

/// What happened to a trigger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Triggered {
    /// This caller ran the sync, `runs` times in a row (more than once when triggers arrived
    /// meanwhile).
    Ran { runs: u32 },
    /// A sync was already running; it will run once more when it ends.
    Coalesced,
}

#[derive(Debug, Default)]
struct Slot {
    rerun: bool,
}

/// The per-sandbox bookkeeping. Share one instance across all triggers.
#[derive(Debug, Default)]
pub struct Coalescer {
    running: Mutex<HashMap<String, Slot>>,
}

impl Coalescer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `run` for `key` unless a run for `key` is in progress, in which case the running
    /// caller repeats it once more after its current run. A panic in `run` releases the slot.
    pub async fn trigger<F, Fut>(&self, key: &str, mut run: F) -> Triggered
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = ()>,
    {
        {
            let mut running = self.lock();
            if let Some(slot) = running.get_mut(key) {
                slot.rerun = true;
                return Triggered::Coalesced;
            }
            running.insert(key.to_owned(), Slot::default());
        }
        let release = Release { owner: self, key };
        let mut runs = 0;
        loop {
            run().await;
            runs += 1;
            let mut running = self.lock();
            let slot = running
                .get_mut(key)
                .expect("the running caller owns the slot");
            if !std::mem::take(&mut slot.rerun) {
                running.remove(key);
                std::mem::forget(release);
                return Triggered::Ran { runs };
            }
        }
    }

    /// Whether a sync for `key` is running now.
    #[cfg(test)]
    pub fn is_running(&self, key: &str) -> bool {
        self.lock().contains_key(key)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Frees the slot if the running caller unwinds or is dropped mid-run, so a panicked or
/// cancelled sync never blocks every later one.
struct Release<'a> {
    owner: &'a Coalescer,
    key: &'a str,
}

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.owner.lock().remove(self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn three_triggers_during_a_run_make_exactly_two_runs() {
        let coalescer = Arc::new(Coalescer::new());
        let runs = Arc::new(AtomicU32::new(0));
        let slow_sync = {
            let runs = runs.clone();
            move || {
                let runs = runs.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_secs(60)).await;
                }
            }
        };
        let first = tokio::spawn({
            let coalescer = coalescer.clone();
            let slow_sync = slow_sync.clone();
            async move { coalescer.trigger("sbx", slow_sync).await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(coalescer.is_running("sbx"));
        for _ in 0..3 {
            assert_eq!(
                coalescer.trigger("sbx", slow_sync.clone()).await,
                Triggered::Coalesced
            );
        }
        assert_eq!(first.await.unwrap(), Triggered::Ran { runs: 2 });
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        assert!(!coalescer.is_running("sbx"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_trigger_during_the_second_run_makes_a_third() {
        let coalescer = Arc::new(Coalescer::new());
        let runs = Arc::new(AtomicU32::new(0));
        let sync = {
            let runs = runs.clone();
            move || {
                let runs = runs.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_secs(10)).await;
                }
            }
        };
        let first = tokio::spawn({
            let (coalescer, sync) = (coalescer.clone(), sync.clone());
            async move { coalescer.trigger("sbx", sync).await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        coalescer.trigger("sbx", sync.clone()).await;
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 2, "the second run started");
        coalescer.trigger("sbx", sync.clone()).await;
        assert_eq!(first.await.unwrap(), Triggered::Ran { runs: 3 });
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
        assert_eq!(
            coalescer.trigger("b", || async {}).await,
            Triggered::Ran { runs: 1 }
        );
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
        assert_eq!(
            coalescer.trigger("sbx", || async {}).await,
            Triggered::Ran { runs: 1 }
        );
    }
}
