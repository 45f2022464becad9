//! Where the page reads sandbox statuses and learns of changes: [`StatusBoard`], kept small so
//! the shared state store can stand behind it; [`LocalStatuses`] is the in-process one (a
//! [`StatusSink`] that remembers the latest status per sandbox and broadcasts each change).

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::broadcast;

use crate::orchestrate::{SandboxStatus, StatusSink};

/// One status change: the sandbox (named after its user) and its new status.
pub type StatusChange = (String, SandboxStatus);

/// Read a user's status, and follow every change.
pub trait StatusBoard: StatusSink {
    /// The latest status of `sandbox`, `None` when nothing happened to it since start.
    fn status(&self, sandbox: &str) -> Option<SandboxStatus>;

    /// Every change from now on. A slow reader that falls behind gets `Lagged` and must read
    /// [`StatusBoard::status`] again.
    fn subscribe(&self) -> broadcast::Receiver<StatusChange>;
}

/// Statuses in this process.
pub struct LocalStatuses {
    latest: Mutex<HashMap<String, SandboxStatus>>,
    changes: broadcast::Sender<StatusChange>,
}

impl Default for LocalStatuses {
    fn default() -> Self {
        Self {
            latest: Mutex::new(HashMap::new()),
            changes: broadcast::channel(256).0,
        }
    }
}

impl StatusSink for LocalStatuses {
    fn set_status(&self, sandbox: &str, status: SandboxStatus) {
        self.latest
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(sandbox.to_owned(), status.clone());
        // No subscriber is not an error: nobody has the page open.
        let _ = self.changes.send((sandbox.to_owned(), status));
    }
}

impl StatusBoard for LocalStatuses {
    fn status(&self, sandbox: &str) -> Option<SandboxStatus> {
        self.latest
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(sandbox)
            .cloned()
    }

    fn subscribe(&self) -> broadcast::Receiver<StatusChange> {
        self.changes.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_change_is_remembered_and_broadcast() {
        let board = LocalStatuses::default();
        let mut changes = board.subscribe();
        assert_eq!(board.status("alice"), None);
        board.set_status("alice", SandboxStatus::Syncing);
        board.set_status("bob", SandboxStatus::Ready);
        assert_eq!(board.status("alice"), Some(SandboxStatus::Syncing));
        assert_eq!(
            changes.recv().await.unwrap(),
            ("alice".to_owned(), SandboxStatus::Syncing)
        );
        assert_eq!(
            changes.recv().await.unwrap(),
            ("bob".to_owned(), SandboxStatus::Ready)
        );
    }
}
