//! The debounce: a batch is saved once no relevant change arrived for the settle time, or once
//! the cap has passed since its first change, whichever comes first.
//!
//! [`Debounce`] is the pure state machine; [`run`] is the task around it.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::changes::Changes;

#[derive(Debug, Clone)]
pub struct Debounce {
    settle: Duration,
    cap: Duration,
    first: Option<Instant>,
    last: Option<Instant>,
}

impl Debounce {
    pub fn new(settle: Duration, cap: Duration) -> Self {
        Self {
            settle,
            cap,
            first: None,
            last: None,
        }
    }

    /// Records a change at `now`; returns whether it opened a new batch.
    pub fn record(&mut self, now: Instant) -> bool {
        let opened = self.first.is_none();
        self.first.get_or_insert(now);
        self.last = Some(now);
        opened
    }

    /// When the open batch is due, if there is one.
    pub fn deadline(&self) -> Option<Instant> {
        let (first, last) = (self.first?, self.last?);
        Some((last + self.settle).min(first + self.cap))
    }

    /// Closes the batch after it was handed on.
    pub fn reset(&mut self) {
        self.first = None;
        self.last = None;
    }
}

/// What the debounce tells the commit loop.
#[derive(Debug, PartialEq, Eq)]
pub enum Debounced {
    /// The first change of a new batch arrived (the status becomes `pending`).
    Pending,
    /// The batch is due.
    Ready(Changes),
}

/// Collects changes from `input` and hands each due batch to `output`. Ends when `input`
/// closes; what is still open then is dropped, since the shutdown saves with a full pass.
pub async fn run(
    mut debounce: Debounce,
    mut input: mpsc::Receiver<Changes>,
    output: mpsc::Sender<Debounced>,
) {
    let mut batch = Changes::default();
    loop {
        let deadline = debounce.deadline();
        tokio::select! {
            received = input.recv() => {
                let Some(changes) = received else { return };
                if changes.is_empty() {
                    continue;
                }
                batch.merge(changes);
                if debounce.record(Instant::now()) && output.send(Debounced::Pending).await.is_err() {
                    return;
                }
            }
            () = sleep_until(deadline), if deadline.is_some() => {
                debounce.reset();
                if output.send(Debounced::Ready(std::mem::take(&mut batch))).await.is_err() {
                    return;
                }
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SETTLE: Duration = Duration::from_secs(3);
    const CAP: Duration = Duration::from_secs(30);

    fn one(path: &str) -> Changes {
        let mut c = Changes::default();
        c.paths.insert(path.into());
        c
    }

    #[test]
    fn state_machine_settles_and_caps() {
        let t0 = Instant::now();
        let mut d = Debounce::new(SETTLE, CAP);
        assert_eq!(d.deadline(), None);
        assert!(d.record(t0));
        assert_eq!(d.deadline(), Some(t0 + SETTLE));
        assert!(!d.record(t0 + Duration::from_secs(2)));
        assert_eq!(d.deadline(), Some(t0 + Duration::from_secs(5)));
        assert!(!d.record(t0 + Duration::from_secs(29)));
        assert_eq!(d.deadline(), Some(t0 + CAP));
        d.reset();
        assert_eq!(d.deadline(), None);
    }

    struct Harness {
        input: mpsc::Sender<Changes>,
        output: mpsc::Receiver<Debounced>,
    }

    fn start() -> Harness {
        let (input, input_rx) = mpsc::channel(16);
        let (output_tx, output) = mpsc::channel(16);
        tokio::spawn(run(Debounce::new(SETTLE, CAP), input_rx, output_tx));
        Harness { input, output }
    }

    /// Lets the spawned task run everything that is ready at the current paused instant.
    async fn settle_tasks() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_single_change_is_ready_after_the_settle_time() {
        let mut h = start();
        h.input.send(one("a")).await.unwrap();
        settle_tasks().await;
        assert_eq!(h.output.try_recv().unwrap(), Debounced::Pending);
        tokio::time::advance(SETTLE - Duration::from_millis(1)).await;
        settle_tasks().await;
        assert!(h.output.try_recv().is_err(), "fired before the settle time");
        tokio::time::advance(Duration::from_millis(1)).await;
        settle_tasks().await;
        assert_eq!(h.output.try_recv().unwrap(), Debounced::Ready(one("a")));
    }

    #[tokio::test(start_paused = true)]
    async fn a_steady_stream_is_cut_at_the_cap_into_one_batch() {
        let mut h = start();
        let started = Instant::now();
        let mut sent = Changes::default();
        let ready = loop {
            let name = format!("f{}", sent.paths.len());
            h.input.send(one(&name)).await.unwrap();
            sent.merge(one(&name));
            settle_tasks().await;
            tokio::time::advance(Duration::from_secs(1)).await;
            settle_tasks().await;
            if let Ok(Debounced::Ready(batch)) = h.output.try_recv() {
                break batch;
            }
            while let Ok(msg) = h.output.try_recv() {
                if let Debounced::Ready(batch) = msg {
                    panic!("early batch {batch:?}");
                }
            }
            assert!(
                started.elapsed() <= CAP + Duration::from_secs(1),
                "never capped"
            );
        };
        assert_eq!(started.elapsed(), CAP);
        assert_eq!(ready, sent);
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_happens_without_changes() {
        let mut h = start();
        h.input.send(Changes::default()).await.unwrap();
        tokio::time::advance(CAP * 2).await;
        settle_tasks().await;
        assert!(h.output.try_recv().is_err());
    }
}
