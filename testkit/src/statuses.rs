//! A [`StatusSink`] that records every status it is given, for tests to assert on.

use std::sync::{Mutex, MutexGuard};

use cloud_core::{SandboxStatus, StatusSink};

/// Every `(sandbox, status)` set, in order.
#[derive(Default)]
pub struct Statuses {
    /// The one sandbox statuses may be set for (another's panics), when given.
    only: Option<String>,
    recorded: Mutex<Vec<(String, SandboxStatus)>>,
}

impl StatusSink for Statuses {
    fn set_status(&self, sandbox: &str, status: SandboxStatus) {
        if let Some(only) = &self.only {
            assert_eq!(sandbox, only, "a status for another sandbox: {status:?}");
        }
        self.lock().push((sandbox.to_owned(), status));
    }
}

impl Statuses {
    /// A sink for `sandbox`'s statuses only: a status for any other sandbox panics.
    pub fn only_for(sandbox: &str) -> Statuses {
        Statuses {
            only: Some(sandbox.to_owned()),
            recorded: Mutex::default(),
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

    /// The status set last, if any.
    pub fn last(&self) -> Option<SandboxStatus> {
        self.lock().last().map(|(_, s)| s.clone())
    }
}
