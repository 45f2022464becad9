//! Where the page reads sandbox statuses and learns of changes: [`StatusBoard`]. With a
//! database, [`StoreStatuses`] reads and follows the state store, so every replica's page shows
//! a status any replica set; on one replica, [`LocalStatuses`] keeps them in this process (a
//! [`StatusSink`] that remembers the latest status per sandbox and broadcasts each change).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use futures_util::future::BoxFuture;
use tokio::sync::broadcast;

use crate::status::{SandboxStatus, StatusSink};
use crate::store::{StatusChange, Store, StoreStatusSink};

/// Read a user's status, and follow every change.
pub trait StatusBoard: StatusSink {
    /// The latest status of `sandbox`, `None` when nothing happened to it yet (or the store
    /// cannot be read now).
    fn status<'a>(&'a self, sandbox: &'a str) -> BoxFuture<'a, Option<SandboxStatus>>;

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
        let _ = self.changes.send(StatusChange {
            sandbox: sandbox.to_owned(),
            status,
            changed_at: SystemTime::now(),
        });
    }
}

impl StatusBoard for LocalStatuses {
    fn status<'a>(&'a self, sandbox: &'a str) -> BoxFuture<'a, Option<SandboxStatus>> {
        let status = self
            .latest
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(sandbox)
            .cloned();
        Box::pin(std::future::ready(status))
    }

    fn subscribe(&self) -> broadcast::Receiver<StatusChange> {
        self.changes.subscribe()
    }
}

/// Statuses in the state store, shared by every replica: changes are written in order without
/// waiting ([`StoreStatusSink`]), reads ask the store, and followers see changes any replica
/// made ([`Store::status_changes`]; PostgreSQL: within its poll interval).
pub struct StoreStatuses {
    store: Arc<dyn Store>,
    sink: StoreStatusSink,
}

impl StoreStatuses {
    /// Spawns the sink's writer task: call within the runtime.
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self {
            sink: StoreStatusSink::new(store.clone()),
            store,
        }
    }
}

impl StatusSink for StoreStatuses {
    fn set_status(&self, sandbox: &str, status: SandboxStatus) {
        self.sink.set_status(sandbox, status);
    }
}

impl StatusBoard for StoreStatuses {
    fn status<'a>(&'a self, sandbox: &'a str) -> BoxFuture<'a, Option<SandboxStatus>> {
        Box::pin(async move {
            match self.store.status(sandbox.to_owned()).await {
                Ok(status) => status.map(|(status, _)| status),
                Err(e) => {
                    tracing::warn!(%sandbox, error = %e, "cannot read the sandbox status");
                    None
                }
            }
        })
    }

    fn subscribe(&self) -> broadcast::Receiver<StatusChange> {
        self.store.status_changes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;

    async fn check_remembered_and_broadcast(board: &dyn StatusBoard) {
        let mut changes = board.subscribe();
        assert_eq!(board.status("alice").await, None);
        board.set_status(
            "alice",
            SandboxStatus::Syncing {
                since: None,
                step: None,
            },
        );
        board.set_status("bob", SandboxStatus::Ready);
        let seen = |change: StatusChange| (change.sandbox, change.status);
        assert_eq!(
            seen(changes.recv().await.unwrap()),
            (
                "alice".to_owned(),
                SandboxStatus::Syncing {
                    since: None,
                    step: None
                }
            )
        );
        assert_eq!(
            seen(changes.recv().await.unwrap()),
            ("bob".to_owned(), SandboxStatus::Ready)
        );
        assert_eq!(
            board.status("alice").await,
            Some(SandboxStatus::Syncing {
                since: None,
                step: None
            })
        );
    }

    #[tokio::test]
    async fn a_change_is_remembered_and_broadcast() {
        check_remembered_and_broadcast(&LocalStatuses::default()).await;
        check_remembered_and_broadcast(&StoreStatuses::new(Arc::new(MemoryStore::new()))).await;
    }
}
