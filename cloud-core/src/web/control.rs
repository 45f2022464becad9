//! The page's state as the control API's [`Control`]: the API's provision is the page's
//! "restore the project" (`Lifecycle::reprovision`), its sync the one after an external push
//! (`Lifecycle::sync`), its restore the page's "Restore this version" (`Web::restore_to`), its
//! statuses the page's board and its sign-in links the page's, so neither has a second path.

use std::time::Duration;

use futures_util::future::BoxFuture;
use shmastra_contract::Manifest;
use tokio::sync::broadcast;

use super::Web;
use super::signin::MintLinkError;
use crate::api::{Control, LinkRefused};
use crate::host::ProjectPages;
use crate::orchestrate::OrchestrateError;
use crate::orchestrate::history::{
    HistoryError, RestoreToError, RestoredTo, Save, SaveHistory, SavedManifestError,
};
use crate::orchestrate::lifecycle::Reprovisioned;
use crate::orchestrate::provision::Provisioned;
use crate::provider::SandboxProvider;
use crate::sandbox::SandboxError;
use crate::secrets::SecretValue;
use crate::status::{SandboxStatus, SyncOutcome};
use crate::store::StatusChange;
use crate::user::UserId;

/// The error of an operation asked of a server that runs no sandboxes (the API refuses those
/// before asking).
fn no_sandboxes(user: &UserId) -> OrchestrateError {
    OrchestrateError::Sandbox(SandboxError::Gone {
        sandbox: user.to_string(),
    })
}

impl<H: ProjectPages + SaveHistory, P: SandboxProvider + 'static> Control for Web<H, P> {
    fn runs_sandboxes(&self) -> bool {
        self.backend.lifecycle().is_some()
    }

    fn status(&self, user: &UserId) -> BoxFuture<'_, Option<SandboxStatus>> {
        let user = user.clone();
        Box::pin(async move { self.statuses.status(user.as_str()).await })
    }

    fn status_changes(&self) -> broadcast::Receiver<StatusChange> {
        self.statuses.subscribe()
    }

    fn has_sandbox(&self, user: &UserId) -> BoxFuture<'_, bool> {
        let user = user.clone();
        Box::pin(async move {
            match self.backend.lifecycle() {
                Some(lifecycle) => lifecycle.provider().connect(&user).await.is_ok(),
                None => false,
            }
        })
    }

    fn reprovision(
        &self,
        user: UserId,
        secrets: Vec<(String, SecretValue)>,
    ) -> BoxFuture<'_, Result<Reprovisioned, OrchestrateError>> {
        Box::pin(async move {
            let lifecycle = self
                .backend
                .lifecycle()
                .ok_or_else(|| no_sandboxes(&user))?;
            lifecycle.reprovision(&user, secrets).await
        })
    }

    fn provision(&self, user: UserId) -> BoxFuture<'_, Result<Provisioned, OrchestrateError>> {
        Box::pin(async move {
            let lifecycle = self
                .backend
                .lifecycle()
                .ok_or_else(|| no_sandboxes(&user))?;
            lifecycle.provision(&user).await
        })
    }

    fn sync(&self, user: UserId) -> BoxFuture<'_, Result<SyncOutcome, OrchestrateError>> {
        Box::pin(async move {
            let lifecycle = self
                .backend
                .lifecycle()
                .ok_or_else(|| no_sandboxes(&user))?;
            lifecycle.sync(&user).await
        })
    }

    fn restore(
        &self,
        user: UserId,
        at: String,
        paths: Vec<String>,
    ) -> BoxFuture<'_, Result<RestoredTo, RestoreToError>> {
        Box::pin(async move { self.restore_to(&user, &at, &paths).await })
    }

    fn history(
        &self,
        user: UserId,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<Save>, HistoryError>> {
        Box::pin(async move { self.backend.orchestrator().history(&user, limit).await })
    }

    fn manifest(
        &self,
        user: UserId,
    ) -> BoxFuture<'_, Result<Option<Manifest>, SavedManifestError>> {
        Box::pin(async move { self.backend.orchestrator().saved_manifest(&user).await })
    }

    fn login_link(&self, user: &UserId, ttl: Duration, base: &str) -> Result<String, LinkRefused> {
        if self.nonces.is_none() {
            return Err(LinkRefused::Unavailable(
                "neither --database-url nor SHMASTRA_TOKEN_STATE is set: nothing durable would record the link's use, so the page signs no one in".to_owned(),
            ));
        }
        let link = self.sign_in.link(user, ttl).map_err(|e| match e {
            MintLinkError::TtlTooLong(e) => LinkRefused::Ttl(e.to_string()),
            MintLinkError::Generation(e) => LinkRefused::Unavailable(e.to_string()),
        })?;
        let base = self.public_url.as_deref().unwrap_or(base);
        Ok(format!("{base}/login?t={link}"))
    }
}
