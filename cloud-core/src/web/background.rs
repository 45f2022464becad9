//! What the page starts and does not wait for: bringing a user's sandbox up on their
//! visits, the sync after an external push, and a restore to an earlier save. Each reports
//! through the sandbox's status (and a restore also through the next page load's notice).

use std::sync::Arc;

use super::flash::Flash;
use super::{PageEvent, Web};
use crate::host::ProjectPages;
use crate::orchestrate::OrchestrateError;
use crate::orchestrate::history::{RestoreToError, RestoredTo, SaveHistory};
use crate::orchestrate::lifecycle::Reprovisioned;
use crate::provider::SandboxProvider;
use crate::sandbox::SandboxError;
use crate::status::{SandboxStatus, StatusSink};
use crate::user::UserId;

impl<H: ProjectPages + SaveHistory, P: SandboxProvider + 'static> Web<H, P> {
    /// Brings the user's sandbox up (created and restored when there is none, the watcher
    /// started; at E2B a connect, which resumes a paused one and extends its timeout), in the
    /// background, at most one at a time per user; the status shows each step. Every visit
    /// of the page asks, so a sandbox lost since the last one is brought back; except while
    /// the page asks for the secrets (`NeedsSecrets`): the restore is done and waits for the
    /// form, whose submission brings the sandbox up (made again if it was lost meanwhile), so
    /// a visit does not restore the project again under the user's eyes.
    pub(super) fn ensure_sandbox(self: &Arc<Self>, user: &UserId) {
        if self.backend.lifecycle().is_none()
            || !self
                .starting
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(user.clone())
        {
            return;
        }
        let web = self.clone();
        let user = user.clone();
        tokio::spawn(async move {
            let waits_for_form = matches!(
                web.statuses.status(user.as_str()).await,
                Some(SandboxStatus::NeedsSecrets { .. })
            );
            if let Some(lifecycle) = web.backend.lifecycle().filter(|_| !waits_for_form) {
                match lifecycle.reprovision(&user, Vec::new()).await {
                    Ok(Reprovisioned::Present(_)) => {
                        if web.statuses.status(user.as_str()).await.is_none() {
                            web.statuses.set_status(user.as_str(), SandboxStatus::Ready);
                        }
                    }
                    Ok(_) => {}
                    // The status says it (NeedsSecrets, Broken): the page shows it.
                    Err(e) => {
                        tracing::info!(user = %user, error = %e, "the sandbox is not up yet")
                    }
                }
            }
            web.starting
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&user);
        });
    }

    /// After an external push: syncs the user's sandbox when it exists here.
    pub(super) async fn sync_after_push(&self, user: UserId) {
        let Some(lifecycle) = self.backend.lifecycle() else {
            return;
        };
        if lifecycle.provider().connect(&user).await.is_err() {
            return;
        }
        // A failed sync is in the status (the page shows it); only a lost sandbox is more.
        if let Err(e) = lifecycle.sync(&user).await {
            tracing::warn!(user = %user, error = %e, "sync after an external push failed");
        }
    }

    /// Restores the user's sandbox to `rev` (only `paths`, when given): the page's "Restore this
    /// version" and the control API's restore.
    pub(super) async fn restore_to(
        &self,
        user: &UserId,
        rev: &str,
        paths: &[String],
    ) -> Result<RestoredTo, RestoreToError> {
        let Some(lifecycle) = self.backend.lifecycle() else {
            return Err(RestoreToError::Orchestrate(OrchestrateError::Sandbox(
                SandboxError::Gone {
                    sandbox: user.to_string(),
                },
            )));
        };
        match lifecycle.provider().connect(user).await {
            Ok(sandbox) => {
                lifecycle
                    .orchestrator()
                    .restore_to(&sandbox, user, rev, paths, &self.statuses)
                    .await
            }
            Err(e) => Err(RestoreToError::Orchestrate(OrchestrateError::Sandbox(e))),
        }
    }

    /// Restores the user's sandbox (only `paths`, when given) to `commit` in the background;
    /// the user's open page, else their next page load, says how it went.
    pub(super) fn restore_in_background(
        self: Arc<Self>,
        user: UserId,
        commit: String,
        paths: Vec<String>,
    ) {
        tokio::spawn(async move {
            if self.backend.lifecycle().is_none() {
                return;
            }
            let outcome = self
                .restore_to(&user, &commit, &paths)
                .await
                .map(|done| done.from);
            let notice = match (outcome, paths.as_slice()) {
                (Ok(from), [path]) => {
                    format!("Restored {path} as in {}.", &from[..from.len().min(12)])
                }
                (Ok(from), _) => format!("Restored the version {}.", &from[..from.len().min(12)]),
                (Err(e), _) => {
                    tracing::warn!(user = %user, error = %e, "restore to an earlier save failed");
                    e.to_string()
                }
            };
            self.flashes.put(&user, Flash::notice(notice.clone()));
            let _ = self.page_events.send(PageEvent::Notice(user, notice));
        });
    }
}
