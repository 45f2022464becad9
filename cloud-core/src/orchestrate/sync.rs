//! Bringing a running sandbox to the pushed branch: one run at a time per sandbox, the status
//! on the way, and the outcome of the run that covered each call.

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use shmastra_contract::env;
use shmastra_contract::failure::SYNC_STEPS;
use shmastra_contract::{SyncCommand, SyncFailure};

use super::{OrchestrateError, Orchestrator, exit_text, failure_of};
use crate::host::ProjectHost;
use crate::sandbox::{Exec, Sandbox, SandboxError};
use crate::status::{SandboxStatus, StatusSink, SyncOutcome};
use crate::user::UserId;

impl<H: ProjectHost> Orchestrator<H> {
    /// Brings a running sandbox to the pushed branch: status `syncing`, then `starting` while
    /// the restarted dev server's health check has not answered, then `ready`, or `broken`
    /// with the failure file (also when the sandbox is gone, or when the dev server did not
    /// come up: step [`super::HEALTH_STEP`]), and returns how the run
    /// that covered this call ended. Calls that arrive during a run coalesce into one more
    /// run, and each of them waits for that run and gets its outcome. With the feature off
    /// there is nothing to sync from: `Synced` with no commit.
    pub async fn sync<S: Sandbox>(
        &self,
        sandbox: &S,
        user: &UserId,
        status: &impl StatusSink,
    ) -> SyncOutcome {
        let outcome = self
            .syncs
            .trigger(sandbox.id(), || async {
                Some(match self.sync_once(sandbox, user, status).await {
                    Ok(outcome) => outcome,
                    Err(gone) => gone_failure(sandbox.id(), &gone, status),
                })
            })
            .await;
        // Covered by a `try_sync` run that lost the sandbox: its caller recovers it.
        outcome.unwrap_or_else(|| SyncOutcome::Failed {
            failure: SyncFailure::new("sync", gone(sandbox).to_string()),
        })
    }

    /// [`Orchestrator::sync`] for callers that recover lost sandboxes: a sandbox that is gone
    /// is an error (the status stays `syncing`), everything else ends as in `sync`.
    pub async fn try_sync<S: Sandbox>(
        &self,
        sandbox: &S,
        user: &UserId,
        status: &impl StatusSink,
    ) -> Result<SyncOutcome, OrchestrateError> {
        self.syncs
            .trigger(sandbox.id(), || async {
                self.sync_once(sandbox, user, status).await.ok()
            })
            .await
            .ok_or_else(|| gone(sandbox).into())
    }

    /// One sync run. `Err` only when the sandbox is gone; every other outcome is returned, and
    /// set as the status.
    pub(super) async fn sync_once<S: Sandbox>(
        &self,
        sandbox: &S,
        user: &UserId,
        status: &impl StatusSink,
    ) -> Result<SyncOutcome, SandboxError> {
        let Some(persistence) = &self.persistence else {
            return Ok(SyncOutcome::Synced { commit: None });
        };
        let syncing = SandboxStatus::syncing_now();
        let since = syncing.since().map(str::to_owned);
        status.set_status(sandbox.id(), syncing);
        let layout = &self.layout;
        let failure_file = sandbox.home().join(&layout.failure_file);
        let step_file = sandbox.home().join(layout.step_file());
        let command = SyncCommand {
            failure_file: failure_file.display().to_string(),
            stop_cmd: Some(layout.stop_dev_server.clone()),
            install_cmd: layout.install_cmd.clone(),
            start_cmd: Some(layout.start_dev_server.clone()),
            ..SyncCommand::new(
                sandbox
                    .home()
                    .join(&layout.project_dir)
                    .display()
                    .to_string(),
            )
        };
        // The step file by the environment: a watcher that predates it runs all the same.
        let exec = Exec::new(command.shell(&layout.watcher_bin), layout.sync_timeout)
            .env(env::PROJECT_TOKEN, persistence.token(user))
            .env(env::WATCHER_SYNC_STEP_FILE, step_file.display().to_string());
        let run = self.in_project(sandbox, exec);
        let ran = showing_steps(sandbox, &step_file, since, status, run).await;
        let failure = match ran {
            Ok(out) if out.success() => None,
            Ok(out) => Some(match sandbox.read_file(&failure_file).await {
                Ok(Some(bytes)) => SyncFailure::parse(&bytes),
                Err(e) if e.is_gone() => return Err(e),
                _ => failure_of(
                    "sync",
                    format!("project-watcher sync exited with {}", exit_text(&out)),
                    &out,
                ),
            }),
            Err(OrchestrateError::Sandbox(e)) if e.is_gone() => return Err(e),
            Err(e) => Some(SyncFailure::new("sync", e.to_string())),
        };
        // The sync restarted the dev server: the sandbox is ready once it answers.
        let failure = match failure {
            None => self.wait_until_up(sandbox, status).await?,
            failure => failure,
        };
        let outcome = match failure {
            None => SyncOutcome::Synced {
                commit: self.head(sandbox).await,
            },
            Some(failure) => {
                tracing::warn!(sandbox = sandbox.id(), step = %failure.step, message = %failure.message, "sync failed");
                SyncOutcome::Failed { failure }
            }
        };
        status.set_status(sandbox.id(), outcome.status());
        Ok(outcome)
    }

    /// The project's `HEAD` commit, when git in the sandbox can tell.
    async fn head<S: Sandbox>(&self, sandbox: &S) -> Option<String> {
        let out = self
            .in_project(
                sandbox,
                Exec::new(
                    "git rev-parse --verify --quiet HEAD",
                    self.layout.command_timeout,
                ),
            )
            .await
            .ok()?;
        let commit = out.stdout.trim();
        (out.success() && is_object_id(commit)).then(|| commit.to_owned())
    }
}

/// How often the step file is read while a sync runs.
const STEP_POLL: Duration = Duration::from_secs(1);

/// Runs `run`, peeking at the sandbox's step file every [`STEP_POLL`] meanwhile: each new
/// step it names (one of [`SYNC_STEPS`]; anything else the sandbox writes there is not shown)
/// becomes the `syncing` status's step. The first peek that fails ends the peeking (the step
/// shown stays): a sandbox that does not answer is the command's to recover, not the reader's.
async fn showing_steps<S: Sandbox, T>(
    sandbox: &S,
    step_file: &Path,
    since: Option<String>,
    status: &impl StatusSink,
    run: impl Future<Output = T>,
) -> T {
    let mut run = std::pin::pin!(run);
    let mut tick = tokio::time::interval(STEP_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut shown: Option<String> = None;
    let mut peeking = true;
    loop {
        tokio::select! {
            ran = &mut run => return ran,
            _ = tick.tick(), if peeking => {
                let bytes = match sandbox.peek_file(step_file).await {
                    Ok(Some(bytes)) => bytes,
                    Ok(None) => continue,
                    Err(error) => {
                        tracing::debug!(sandbox = %sandbox.id(), %error, "the sync's step is no longer read");
                        peeking = false;
                        continue;
                    }
                };
                let text = String::from_utf8_lossy(&bytes);
                let Some(step) = SYNC_STEPS.into_iter().find(|s| *s == text.trim_end()) else {
                    continue;
                };
                if shown.as_deref() != Some(step) {
                    shown = Some(step.to_owned());
                    let step = shown.clone();
                    status.set_status(sandbox.id(), SandboxStatus::Syncing { since: since.clone(), step });
                }
            }
        }
    }
}

fn gone<S: Sandbox>(sandbox: &S) -> SandboxError {
    SandboxError::Gone {
        sandbox: sandbox.id().to_owned(),
    }
}

/// A run of [`Orchestrator::sync`] that lost the sandbox: `broken`, and that failure.
pub(super) fn gone_failure(
    sandbox: &str,
    gone: &SandboxError,
    status: &impl StatusSink,
) -> SyncOutcome {
    let failure = SyncFailure::new("sync", gone.to_string());
    status.set_status(
        sandbox,
        SandboxStatus::Broken {
            failure: failure.clone(),
        },
    );
    SyncOutcome::Failed { failure }
}

/// A full SHA-1 or SHA-256 object id in hex.
fn is_object_id(text: &str) -> bool {
    matches!(text.len(), 40 | 64) && text.bytes().all(|b| b.is_ascii_hexdigit())
}
