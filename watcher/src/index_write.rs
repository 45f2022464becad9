//! When the daemon writes `.git/index` after saves: the saves keep the index in memory and
//! the file is written off their path, once the watcher is quiet, with a cap for a project
//! that never is. Pure: the daemon asks [`IndexWrite::at`] and tells it what happened.

use std::time::Duration;

use tokio::time::Instant;

/// When the index file is written: `index_quiet` after the latest save when no batch is
/// pending (the write then delays no save), but never later than `cap` (`--max-delay`, as the
/// debounce caps a batch) after the first save the file lacks, so a project that is never
/// quiet (a nested repository's `.git` touched by every `git status`) still gets it.
pub(crate) struct IndexWrite {
    quiet: Duration,
    cap: Duration,
    /// The first save the index file lacks.
    since: Option<Instant>,
    /// When the write is due, if one is.
    pub(crate) at: Option<Instant>,
}

impl IndexWrite {
    /// Writes `quiet` after a save, and at the latest `cap` after the first save the file
    /// lacks (never sooner than `quiet`).
    pub(crate) fn new(quiet: Duration, cap: Duration) -> Self {
        Self {
            quiet,
            cap: cap.max(quiet),
            since: None,
            at: None,
        }
    }

    /// A save is done; `unwritten`: the index file lacks it.
    pub(crate) fn saved(&mut self, unwritten: bool) {
        if !unwritten {
            return self.written();
        }
        let now = Instant::now();
        let since = *self.since.get_or_insert(now);
        self.at = Some((now + self.quiet).min(since + self.cap));
    }

    /// A batch is coming: the write waits for its save, unless it is due by the cap.
    pub(crate) fn pending(&mut self) {
        if self
            .since
            .is_some_and(|since| Instant::now() < since + self.cap)
        {
            self.at = None;
        }
    }

    /// The file was written.
    pub(crate) fn written(&mut self) {
        self.since = None;
        self.at = None;
    }

    /// The write failed: tried again `quiet` from now.
    pub(crate) fn failed(&mut self) {
        self.at = Some(Instant::now() + self.quiet);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUIET: Duration = Duration::from_secs(2);
    const CAP: Duration = Duration::from_secs(30);

    fn after(d: Duration) -> Option<Instant> {
        Some(Instant::now() + d)
    }

    #[tokio::test(start_paused = true)]
    async fn the_file_is_written_once_quiet_and_no_later_than_the_cap() {
        let mut write = IndexWrite::new(QUIET, CAP);
        write.saved(false);
        assert_eq!(write.at, None, "a save the file already has needs no write");
        write.saved(true);
        assert_eq!(write.at, after(QUIET));
        write.pending();
        assert_eq!(write.at, None, "a coming batch delays the write");
        tokio::time::advance(Duration::from_secs(29)).await;
        write.saved(true);
        assert_eq!(
            write.at,
            after(Duration::from_secs(1)),
            "capped at 30 s after the first"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        write.pending();
        assert_eq!(
            write.at,
            after(Duration::ZERO),
            "a batch never delays a write that is due"
        );
        write.failed();
        assert_eq!(write.at, after(QUIET));
        write.written();
        assert_eq!(write.at, None);
        write.saved(true);
        assert_eq!(
            write.at,
            after(QUIET),
            "the cap counts from the first unwritten save again"
        );
    }

    #[test]
    fn the_cap_is_never_shorter_than_the_quiet_time() {
        let write = IndexWrite::new(QUIET, Duration::from_millis(500));
        assert_eq!(write.cap, QUIET);
    }
}
