//! A [`StatusSink`] that records every status it is given, for tests to assert on.

use std::sync::{Mutex, MutexGuard};

use cloud_core::{SandboxStatus, StatusSink};

/// `status` with the start time of a `Syncing` or `Restoring` checked (set, RFC 3339, within the
/// last minute; a minute ahead allowed for a clock's seconds) and left out, and a sync's step
/// left out, so tests compare sequences of statuses without a clock.
pub fn timeless(status: SandboxStatus) -> SandboxStatus {
    let check = |since: Option<String>| {
        let since = since.expect("a syncing or restoring status says when it began");
        let began = humantime::parse_rfc3339(&since).expect("since is RFC 3339");
        let minute = std::time::Duration::from_secs(60);
        let now = std::time::SystemTime::now();
        assert!(
            began + minute >= now && began <= now + minute,
            "began now: {since}"
        );
    };
    match status {
        SandboxStatus::Syncing { since, .. } => {
            check(since);
            SandboxStatus::Syncing {
                since: None,
                step: None,
            }
        }
        SandboxStatus::Restoring { since } => {
            check(since);
            SandboxStatus::Restoring { since: None }
        }
        other => other,
    }
}

/// Every `(sandbox, status)` set, in order, [`timeless`]; a sync's steps (how many a sync
/// shows depends on how long each takes) apart, in [`Statuses::steps`].
#[derive(Default)]
pub struct Statuses {
    /// The one sandbox statuses may be set for (another's panics), when given.
    only: Option<String>,
    recorded: Mutex<Vec<(String, SandboxStatus)>>,
    steps: Mutex<Vec<String>>,
}

impl StatusSink for Statuses {
    fn set_status(&self, sandbox: &str, status: SandboxStatus) {
        if let Some(only) = &self.only {
            assert_eq!(sandbox, only, "a status for another sandbox: {status:?}");
        }
        if let SandboxStatus::Syncing {
            step: Some(step), ..
        } = &status
        {
            let step = step.clone();
            timeless(status);
            self.steps
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(step);
            return;
        }
        self.lock().push((sandbox.to_owned(), timeless(status)));
    }
}

impl Statuses {
    /// A sink for `sandbox`'s statuses only: a status for any other sandbox panics.
    pub fn only_for(sandbox: &str) -> Statuses {
        Statuses {
            only: Some(sandbox.to_owned()),
            recorded: Mutex::default(),
            steps: Mutex::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<(String, SandboxStatus)>> {
        self.recorded.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every status set so far, whichever sandbox it was for.
    pub fn all(&self) -> Vec<SandboxStatus> {
        self.lock().iter().map(|(_, s)| s.clone()).collect()
    }

    /// Every status set for `sandbox`.
    pub fn of(&self, sandbox: &str) -> Vec<SandboxStatus> {
        self.lock()
            .iter()
            .filter(|(s, _)| s == sandbox)
            .map(|(_, st)| st.clone())
            .collect()
    }

    /// Every status set so far, forgotten here.
    pub fn take(&self) -> Vec<SandboxStatus> {
        std::mem::take(&mut *self.lock())
            .into_iter()
            .map(|(_, s)| s)
            .collect()
    }

    /// The steps syncs have shown, in order.
    pub fn steps(&self) -> Vec<String> {
        self.steps.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The status set last, if any.
    pub fn last(&self) -> Option<SandboxStatus> {
        self.lock().last().map(|(_, s)| s.clone())
    }
}
