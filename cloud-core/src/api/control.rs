//! What the control API asks of the server's sandboxes: the seam the workspace page's state
//! implements (`web/control.rs`), so the API and the page go through one `Lifecycle`, one
//! `Orchestrator`, one status board and one sign-in, and no behaviour has a second path.

use std::time::Duration;

use futures_util::future::BoxFuture;
use shmastra_contract::Manifest;
use tokio::sync::broadcast;

use crate::orchestrate::OrchestrateError;
use crate::orchestrate::history::{
    HistoryError, RestoreToError, RestoredTo, Save, SavedManifestError,
};
use crate::orchestrate::lifecycle::Reprovisioned;
use crate::orchestrate::provision::Provisioned;
use crate::secrets::SecretValue;
use crate::status::{SandboxStatus, SyncOutcome};
use crate::store::StatusChange;
use crate::user::UserId;

/// Why no sign-in link was made.
#[derive(Debug, thiserror::Error)]
pub enum LinkRefused {
    /// A lifetime the links do not allow.
    #[error("{0}")]
    Ttl(String),
    /// No link can be made now, or none could be used: the user's token generation cannot be
    /// read, or nothing durable records a link's use.
    #[error("{0}")]
    Unavailable(String),
}

/// The server's sandboxes and saves, as the API uses them.
pub trait Control: Send + Sync + 'static {
    /// Whether this server runs sandboxes (`--sandboxes-dir`); without, only saves, the
    /// manifest, sign-in links and tokens are served.
    fn runs_sandboxes(&self) -> bool;

    /// The sandbox's status as the page shows it; `None` before anything happened to it.
    fn status(&self, user: &UserId) -> BoxFuture<'_, Option<SandboxStatus>>;

    /// Every status change, any user's, from now on (the page's event streams follow the same).
    fn status_changes(&self) -> broadcast::Receiver<StatusChange>;

    /// Whether the user has a sandbox now.
    fn has_sandbox(&self, user: &UserId) -> BoxFuture<'_, bool>;

    /// The page's "restore the project": a sandbox made (or finished, or checked) with the
    /// restore form's secrets, validated against the saved manifest.
    fn reprovision(
        &self,
        user: UserId,
        secrets: Vec<(String, SecretValue)>,
    ) -> BoxFuture<'_, Result<Reprovisioned, OrchestrateError>>;

    /// `provision` with recovery (the watcher's environment written again, e.g. a new token).
    fn provision(&self, user: UserId) -> BoxFuture<'_, Result<Provisioned, OrchestrateError>>;

    /// The sync the page runs after an external push.
    fn sync(&self, user: UserId) -> BoxFuture<'_, Result<SyncOutcome, OrchestrateError>>;

    /// The page's "restore this version", with paths.
    fn restore(
        &self,
        user: UserId,
        at: String,
        paths: Vec<String>,
    ) -> BoxFuture<'_, Result<RestoredTo, RestoreToError>>;

    /// The newest `limit` saves, from the upstream.
    fn history(&self, user: UserId, limit: usize)
    -> BoxFuture<'_, Result<Vec<Save>, HistoryError>>;

    /// The saved branch's `shmastra.json`; `None` when nothing is saved yet.
    fn manifest(&self, user: UserId)
    -> BoxFuture<'_, Result<Option<Manifest>, SavedManifestError>>;

    /// A one-use sign-in link to the user's workspace page, `ttl` long, under `base` when the
    /// server knows no public URL.
    fn login_link(&self, user: &UserId, ttl: Duration, base: &str) -> Result<String, LinkRefused>;
}
