//! Sandboxes that come and go: re-provisioning a user's lost sandbox in one idempotent call,
//! and bounded recovery around every orchestration step (on "gone": wait, re-provision, retry
//! once; after too many recoveries in a window, a hard error and status `NeedsAttention`).
//!
//! What a loss can cost: the new sandbox is restored from the saved branch, so the only work
//! lost is what the watcher had not pushed when the sandbox vanished: edits younger than the
//! debounce (or, under continuous editing, than `--max-delay`) plus the push in flight.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use shmastra_contract::SyncFailure;
use tokio::time::Instant;

use super::provision::Provisioned;
use super::recovery::{RecoveryBudget, RecoveryPolicy};
use super::{OrchestrateError, Orchestrator};
use crate::host::ProjectHost;
use crate::provider::SandboxProvider;
use crate::sandbox::Sandbox;
use crate::secrets::SecretValue;
use crate::status::{ProvisionStep, SandboxStatus, StatusSink, SyncOutcome};
use crate::user::UserId;

/// The marker's content while a restore has not finished, and after.
const RESTORE_PENDING: &[u8] = b"pending\n";
const RESTORE_DONE: &[u8] = b"done\n";
/// The marker's name, beside the watcher's environment file.
const RESTORE_MARKER: &str = "restore-state";

/// Where recovery finds the values of the secrets the saved project's `shmastra.json` names
/// (the cloud never saved them; a closure over the backend's own store, or nothing). It is
/// asked for exactly those `names`; whatever else it returns is left out.
pub trait SecretSource: Send + Sync {
    /// The values of `names` for `user` that the backend has.
    fn secrets(&self, user: &UserId, names: &[String]) -> Vec<(String, SecretValue)>;
}

impl<F> SecretSource for F
where
    F: Fn(&UserId, &[String]) -> Vec<(String, SecretValue)> + Send + Sync,
{
    fn secrets(&self, user: &UserId, names: &[String]) -> Vec<(String, SecretValue)> {
        self(user, names)
    }
}

/// The restore form: submitted by the user (checked strictly against the manifest), or, in
/// recovery, taken from the [`SecretSource`].
enum Form {
    Submitted(Vec<(String, SecretValue)>),
    FromSource,
}

/// What [`Lifecycle::reprovision`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reprovisioned {
    /// The user had no sandbox: a new one from the template, restored, watcher started.
    Created,
    /// The sandbox existed but its restore had not finished (an earlier call failed or was
    /// cut off): restored and started now.
    Restored,
    /// The sandbox was there and restored; `provision` made sure of the watcher (all `false`:
    /// nothing changed).
    Present(Provisioned),
}

/// Per user: the lock that makes re-provisioning one-at-a-time, guarding how many sandboxes
/// were created so far (an operation that lost its sandbox while another caller re-created it
/// uses that one instead of recovering again).
type Slot = Arc<tokio::sync::Mutex<u64>>;

/// Orchestration over sandboxes a [`SandboxProvider`] creates and loses.
pub struct Lifecycle<P, H> {
    provider: P,
    orchestrator: Orchestrator<H>,
    policy: RecoveryPolicy,
    status: Arc<dyn StatusSink>,
    secrets: Box<dyn SecretSource>,
    slots: Mutex<HashMap<UserId, Slot>>,
    budget: RecoveryBudget,
}

impl<P: SandboxProvider, H: ProjectHost> Lifecycle<P, H> {
    /// Statuses (each re-provisioning step, syncs, `NeedsAttention`) go to `status`, keyed by
    /// the user id. The default policy waits 1.5 s and allows 3 recoveries per 15 minutes; no
    /// secrets are known until [`Lifecycle::with_secrets`].
    pub fn new(provider: P, orchestrator: Orchestrator<H>, status: Arc<dyn StatusSink>) -> Self {
        Self {
            provider,
            orchestrator,
            policy: RecoveryPolicy::default(),
            status,
            secrets: Box::new(|_: &UserId, _: &[String]| Vec::new()),
            slots: Mutex::new(HashMap::new()),
            budget: RecoveryBudget::default(),
        }
    }

    /// Recovery waits and budgets by `policy` instead of the default.
    pub fn with_policy(mut self, policy: RecoveryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Where recovery finds secret values for the restore form it cannot show anyone.
    pub fn with_secrets(mut self, secrets: impl SecretSource + 'static) -> Self {
        self.secrets = Box::new(secrets);
        self
    }

    /// Where sandboxes come from.
    pub fn provider(&self) -> &P {
        &self.provider
    }

    /// The orchestration every step goes through.
    pub fn orchestrator(&self) -> &Orchestrator<H> {
        &self.orchestrator
    }

    /// Makes sure `user` has a sandbox holding the saved project with the watcher running: a
    /// user without one gets a new sandbox from the template, restored from the saved branch,
    /// `.env` from `submitted` (checked against `shmastra.json`; a missing secret sets status
    /// `NeedsSecrets` and fails without starting anything, and a later call with the form
    /// carries on), the dev server and the watcher started; the status shows each step. A
    /// concurrent call waits for this one; a call on a restored sandbox only checks the
    /// watcher, and changes nothing when it runs.
    pub async fn reprovision(
        &self,
        user: &UserId,
        submitted: Vec<(String, SecretValue)>,
    ) -> Result<Reprovisioned, OrchestrateError> {
        let slot = self.slot(user);
        let mut created = slot.lock().await;
        self.reprovision_locked(user, &mut created, Form::Submitted(submitted))
            .await
            .map(|(_, done)| done)
    }

    /// Runs `op` on the user's sandbox. When the sandbox is gone (before or during `op`):
    /// waits `policy.wait`, re-provisions, and runs `op` once more on the new sandbox, whose
    /// result is final. When the user already had `policy.max_recoveries` recoveries within
    /// `policy.window`, a loss is [`OrchestrateError::NeedsAttention`] (status
    /// `NeedsAttention`) and nothing is re-created. Other failures are returned as they are.
    pub async fn run<T, F, Fut>(&self, user: &UserId, mut op: F) -> Result<T, OrchestrateError>
    where
        F: FnMut(P::Sandbox) -> Fut,
        Fut: Future<Output = Result<T, OrchestrateError>>,
    {
        let slot = self.slot(user);
        let created_before = *slot.lock().await;
        let first = match self.provider.connect(user).await {
            Ok(sandbox) => op(sandbox).await,
            Err(e) => Err(e.into()),
        };
        match first {
            Err(e) if e.is_gone() => {}
            other => return other,
        }
        let sandbox = self.recover(user, &slot, created_before).await?;
        let retried = op(sandbox).await;
        if let Err(e) = &retried
            && e.is_gone()
        {
            // Lost again at once: the next operation recovers (budget permitting); until
            // then the status must not stay at whatever the retry had set.
            self.status.set_status(
                user.as_str(),
                SandboxStatus::Broken {
                    failure: SyncFailure::new("retry after recovery", e.to_string()),
                },
            );
        }
        retried
    }

    /// [`Orchestrator::try_sync`] with recovery: a sandbox lost before or during the sync is
    /// re-provisioned (which restores the saved branch) and synced once more. `Ok` says how the
    /// run that covered this call ended (a failed install is `Ok(SyncOutcome::Failed)`).
    pub async fn sync(&self, user: &UserId) -> Result<SyncOutcome, OrchestrateError> {
        self.run(user, |sandbox| async move {
            self.orchestrator
                .try_sync(&sandbox, user, &self.status)
                .await
        })
        .await
    }

    /// [`Orchestrator::provision`] with recovery.
    pub async fn provision(&self, user: &UserId) -> Result<Provisioned, OrchestrateError> {
        self.run(user, |sandbox| async move {
            self.orchestrator.provision(&sandbox, user).await
        })
        .await
    }

    /// [`Orchestrator::with_watcher_stopped`] with recovery: a sandbox lost while the watcher
    /// is stopped or started again is re-provisioned and the whole thing runs once more, `f`
    /// included, on the new sandbox (which `f` is given), so `f` must be safe to repeat. `f`'s
    /// own error is returned as it is, never recovered from.
    pub async fn with_watcher_stopped<F, Fut, T, E>(
        &self,
        user: &UserId,
        mut f: F,
    ) -> Result<Result<T, E>, OrchestrateError>
    where
        F: FnMut(P::Sandbox) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.run(user, |sandbox| {
            let work = f(sandbox.clone());
            async move {
                self.orchestrator
                    .with_watcher_stopped(&sandbox, || work)
                    .await
            }
        })
        .await
    }

    fn slot(&self, user: &UserId) -> Slot {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(slots.entry(user.clone()).or_default())
    }

    async fn recover(
        &self,
        user: &UserId,
        slot: &Slot,
        created_before: u64,
    ) -> Result<P::Sandbox, OrchestrateError> {
        let mut created = slot.lock().await;
        if *created != created_before {
            // Another caller re-created the sandbox while this operation ran: one loss, one
            // recovery.
            return Ok(self.provider.connect(user).await?);
        }
        let nth = self
            .budget
            .take(user, Instant::now(), &self.policy)
            .map_err(|count| {
                let err = OrchestrateError::NeedsAttention {
                    user: user.clone(),
                    count,
                    window: self.policy.window,
                };
                tracing::error!(user = %user, recoveries = count, "sandbox lost too often; recovery stopped");
                self.status.set_status(
                    user.as_str(),
                    SandboxStatus::NeedsAttention {
                        reason: err.to_string(),
                    },
                );
                err
            })?;
        tracing::warn!(user = %user, recovery = nth, wait = %shmastra_contract::duration::short_duration(self.policy.wait), "sandbox gone; re-provisioning it");
        tokio::time::sleep(self.policy.wait).await;
        let (sandbox, _) = self
            .reprovision_locked(user, &mut created, Form::FromSource)
            .await?;
        Ok(sandbox)
    }

    async fn reprovision_locked(
        &self,
        user: &UserId,
        created: &mut u64,
        form: Form,
    ) -> Result<(P::Sandbox, Reprovisioned), OrchestrateError> {
        let mut step = ProvisionStep::Creating;
        let outcome = self.reprovision_steps(user, created, form, &mut step).await;
        match &outcome {
            Ok(_) => {}
            Err(OrchestrateError::Form(_)) => {}
            Err(OrchestrateError::DevServerDown { failure }) => {
                tracing::warn!(user = %user, error = %failure.message, "the dev server did not come up");
                self.status.set_status(
                    user.as_str(),
                    SandboxStatus::Broken {
                        failure: failure.clone(),
                    },
                );
            }
            Err(e) => {
                tracing::warn!(user = %user, step = step_name(step), error = %e, "re-provisioning failed");
                self.status.set_status(
                    user.as_str(),
                    SandboxStatus::Broken {
                        failure: SyncFailure::new(step_name(step), e.to_string()),
                    },
                );
            }
        }
        outcome
    }

    async fn reprovision_steps(
        &self,
        user: &UserId,
        created: &mut u64,
        form: Form,
        step: &mut ProvisionStep,
    ) -> Result<(P::Sandbox, Reprovisioned), OrchestrateError> {
        let key = user.as_str();
        let (sandbox, fresh) = match self.provider.connect(user).await {
            Ok(sandbox) => (sandbox, false),
            Err(e) if e.is_gone() => {
                self.status
                    .set_status(key, SandboxStatus::Provisioning { step: *step });
                let sandbox = self.provider.create(user).await?;
                *created += 1;
                (sandbox, true)
            }
            Err(e) => return Err(e.into()),
        };
        let marker = self.marker(&sandbox);
        if !fresh && !self.restore_pending(&sandbox, &marker).await? {
            let done = self.orchestrator.provision(&sandbox, user).await?;
            return Ok((sandbox, Reprovisioned::Present(done)));
        }
        // Written before anything else, so a call cut off from here on restores again rather
        // than letting the watcher save the template over the user's work.
        sandbox.write_file(&marker, RESTORE_PENDING).await?;
        *step = ProvisionStep::Restoring;
        self.status
            .set_status(key, SandboxStatus::Provisioning { step: *step });
        let plan = self.orchestrator.begin_restore(&sandbox, user).await?;
        let names = plan.secret_names();
        let submitted = match form {
            Form::Submitted(submitted) => submitted,
            Form::FromSource => self
                .secrets
                .secrets(user, &names)
                .into_iter()
                .filter(|(name, _)| names.contains(name))
                .collect(),
        };
        *step = ProvisionStep::Starting;
        self.status
            .set_status(key, SandboxStatus::Provisioning { step: *step });
        if let Err(e) = self
            .orchestrator
            .finish_restore(&sandbox, &plan, submitted)
            .await
        {
            if matches!(e, OrchestrateError::Form(_)) {
                self.status
                    .set_status(key, SandboxStatus::NeedsSecrets { names });
            }
            return Err(e);
        }
        sandbox.write_file(&marker, RESTORE_DONE).await?;
        if let Some(failure) = self
            .orchestrator
            .wait_until_up(&sandbox, &self.status)
            .await?
        {
            return Err(OrchestrateError::DevServerDown { failure });
        }
        self.status.set_status(key, SandboxStatus::Ready);
        let done = if fresh {
            Reprovisioned::Created
        } else {
            Reprovisioned::Restored
        };
        Ok((sandbox, done))
    }

    fn marker(&self, sandbox: &P::Sandbox) -> PathBuf {
        let env_file = sandbox
            .home()
            .join(&self.orchestrator.layout().watcher_env_file);
        env_file
            .parent()
            .unwrap_or(sandbox.home())
            .join(RESTORE_MARKER)
    }

    /// A restore started and did not finish, or (with the feature on) the project is not a
    /// repository yet: a sandbox the provider created whose restore never began.
    async fn restore_pending(
        &self,
        sandbox: &P::Sandbox,
        marker: &std::path::Path,
    ) -> Result<bool, OrchestrateError> {
        if sandbox.read_file(marker).await?.as_deref() == Some(RESTORE_PENDING) {
            return Ok(true);
        }
        if !self.orchestrator.is_enabled() {
            return Ok(false);
        }
        let head = sandbox
            .home()
            .join(&self.orchestrator.layout().project_dir)
            .join(".git/HEAD");
        Ok(sandbox.read_file(&head).await?.is_none())
    }
}

fn step_name(step: ProvisionStep) -> &'static str {
    match step {
        ProvisionStep::Creating => "create",
        ProvisionStep::Restoring => "restore",
        ProvisionStep::Starting => "start",
    }
}
