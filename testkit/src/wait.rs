//! Waiting for a condition with a deadline: end-to-end tests poll, they never sleep blindly.

use std::fmt::Debug;
use std::time::{Duration, Instant};

const POLL: Duration = Duration::from_millis(25);

/// How long an end-to-end test waits for what a real process does (a save, a push, a sync):
/// far beyond the seconds it takes on a loaded 2-core machine, so running out of it means it
/// never happened.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Polls `check` every 25 ms until it returns `Some`, or panics with `what` after `timeout`.
pub fn until<T>(timeout: Duration, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    poll(timeout, what, || check().ok_or(None::<()>))
}

/// Polls `check` every 25 ms until it returns `Ok`, or panics after `timeout` with `what` and
/// the last `Err` it returned, so a timeout shows what was seen, not only what was awaited.
pub fn until_seen<T, S: Debug>(
    timeout: Duration,
    what: &str,
    mut check: impl FnMut() -> Result<T, S>,
) -> T {
    poll(timeout, what, || check().map_err(Some))
}

fn poll<T, S: Debug>(
    timeout: Duration,
    what: &str,
    mut check: impl FnMut() -> Result<T, Option<S>>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        let last = match check() {
            Ok(v) => return v,
            Err(last) => last,
        };
        if Instant::now() >= deadline {
            match last {
                Some(seen) => {
                    panic!("timed out after {timeout:?} waiting for {what}; last seen: {seen:#?}")
                }
                None => panic!("timed out after {timeout:?} waiting for {what}"),
            }
        }
        std::thread::sleep(POLL);
    }
}

/// The async form of [`until`].
pub async fn until_async<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn until_seen_returns_the_first_ok() {
        let mut n = 0;
        let got = until_seen(Duration::from_secs(5), "n to reach 3", || {
            n += 1;
            if n == 3 { Ok(n) } else { Err(n) }
        });
        assert_eq!(got, 3);
    }

    #[test]
    #[should_panic(expected = "waiting for the answer; last seen: 41")]
    fn until_seen_panics_with_the_last_observation() {
        until_seen(Duration::ZERO, "the answer", || Err::<(), _>(41));
    }

    #[test]
    #[should_panic(expected = "waiting for nothing")]
    fn until_panics_after_its_deadline() {
        until(Duration::ZERO, "nothing", || None::<()>);
    }
}
