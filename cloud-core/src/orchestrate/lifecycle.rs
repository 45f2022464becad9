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

use super::recovery::{RecoveryBudget, RecoveryPolicy};
use super::{
    OrchestrateError, Orchestrator, ProjectHost, ProvisionStep, Provisioned, SandboxStatus,
    StatusSink, SyncOutcome,
};
use crate::UserId;
use crate::provider::SandboxProvider;
use crate::sandbox::Sandbox;
use crate::secrets::SecretValue;

/// The marker's content while a restore has not finished, and after.
const RESTORE_PENDING: &[u8] = b"pending\n";
const RESTORE_DONE: &[u8] = b"done\n";
/// The marker's name, beside the watcher's environment file.
const RESTORE_MARKER: &str = "restore-state";

/// Where recovery finds the values of the secrets the saved project's `shmastra.json` names
/// (the cloud never saved them; a closure over the backend's own store, or nothing). It is
/// asked for exactly those `names`; whatever else it returns is left out.
pub trait SecretSource: Send + Sync {
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

    pub fn with_policy(mut self, policy: RecoveryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Where recovery finds secret values for the restore form it cannot show anyone.
    pub fn with_secrets(mut self, secrets: impl SecretSource + 'static) -> Self {
        self.secrets = Box::new(secrets);
        self
    }

    pub fn provider(&self) -> &P {
        &self.provider
    }

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
        tracing::warn!(user = %user, recovery = nth, wait = ?self.policy.wait, "sandbox gone; re-provisioning it");
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
            Err(e) => {
                tracing::warn!(user = %user, ?step, error = %e, "re-provisioning failed");
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

#[cfg(test)]
mod tests {
    //! Timing and counting on tokio's paused clock, with an in-memory provider whose
    //! sandboxes can be lost at any moment. The real watcher, git and `LocalProvider` are
    //! exercised by `tests/tests/lifecycle.rs`.

    use super::*;
    use crate::orchestrate::SandboxLayout;
    use crate::proxy::embedded::EmbeddedUpstream;
    use crate::sandbox::{Exec, ExecOutput, SandboxError};
    use std::path::Path;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    /// The provider's whole world: which sandbox generation is alive, its files, and a log of
    /// every call with the (paused) time it happened at.
    #[derive(Default)]
    struct World {
        state: Mutex<State>,
        /// Sandboxes vanish as soon as they are created.
        lose_on_create: bool,
        /// How long `create` takes.
        create_takes: Duration,
    }

    #[derive(Default)]
    struct State {
        alive: Option<u64>,
        generations: u64,
        files: HashMap<PathBuf, Vec<u8>>,
        log: Vec<(Duration, String)>,
        start: Option<Instant>,
    }

    impl World {
        fn new(lose_on_create: bool) -> Arc<World> {
            let world = World {
                lose_on_create,
                ..World::default()
            };
            world.state().start = Some(Instant::now());
            Arc::new(world)
        }

        fn state(&self) -> std::sync::MutexGuard<'_, State> {
            self.state.lock().unwrap()
        }

        fn record(&self, what: String) {
            let mut state = self.state();
            let at = state.start.unwrap().elapsed();
            state.log.push((at, what));
        }

        fn lose(&self) {
            let mut state = self.state();
            state.alive = None;
            state.files.clear();
        }

        /// When each call whose log line starts with `prefix` happened.
        fn times_of(&self, prefix: &str) -> Vec<Duration> {
            self.state()
                .log
                .iter()
                .filter(|(_, what)| what.starts_with(prefix))
                .map(|(at, _)| *at)
                .collect()
        }

        fn count(&self, prefix: &str) -> usize {
            self.times_of(prefix).len()
        }
    }

    #[derive(Clone)]
    struct FakeSandbox {
        world: Arc<World>,
        generation: u64,
        home: PathBuf,
    }

    impl FakeSandbox {
        fn present(&self) -> Result<(), SandboxError> {
            if self.world.state().alive == Some(self.generation) {
                Ok(())
            } else {
                Err(SandboxError::Gone {
                    sandbox: "alice".into(),
                })
            }
        }
    }

    impl Sandbox for FakeSandbox {
        fn id(&self) -> &str {
            "alice"
        }

        fn home(&self) -> &Path {
            &self.home
        }

        async fn exec(&self, exec: &Exec) -> Result<ExecOutput, SandboxError> {
            self.world.record(format!("exec {}", exec.command));
            self.present()?;
            Ok(ExecOutput {
                exit_code: Some(0),
                stdout: String::new(),
                stderr: String::new(),
            })
        }

        async fn read_file(&self, path: &Path) -> Result<Option<Vec<u8>>, SandboxError> {
            self.present()?;
            Ok(self.world.state().files.get(path).cloned())
        }

        async fn write_file(&self, path: &Path, contents: &[u8]) -> Result<(), SandboxError> {
            self.present()?;
            self.world
                .state()
                .files
                .insert(path.to_owned(), contents.to_vec());
            Ok(())
        }
    }

    struct FakeProvider(Arc<World>);

    impl SandboxProvider for FakeProvider {
        type Sandbox = FakeSandbox;

        async fn connect(&self, _user: &UserId) -> Result<FakeSandbox, SandboxError> {
            self.0.record("connect".into());
            let alive = self.0.state().alive;
            match alive {
                Some(generation) => Ok(self.sandbox(generation)),
                None => Err(SandboxError::Gone {
                    sandbox: "alice".into(),
                }),
            }
        }

        async fn create(&self, _user: &UserId) -> Result<FakeSandbox, SandboxError> {
            self.0.record("create".into());
            tokio::time::sleep(self.0.create_takes).await;
            let generation = {
                let mut state = self.0.state();
                state.generations += 1;
                state.alive = (!self.0.lose_on_create).then_some(state.generations);
                state.generations
            };
            Ok(self.sandbox(generation))
        }
    }

    impl FakeProvider {
        fn sandbox(&self, generation: u64) -> FakeSandbox {
            FakeSandbox {
                world: Arc::clone(&self.0),
                generation,
                home: "/sandboxes/alice".into(),
            }
        }
    }

    #[derive(Default)]
    struct Statuses(Mutex<Vec<SandboxStatus>>);

    impl StatusSink for Statuses {
        fn set_status(&self, sandbox: &str, status: SandboxStatus) {
            assert_eq!(sandbox, "alice");
            self.0.lock().unwrap().push(status);
        }
    }

    impl Statuses {
        fn all(&self) -> Vec<SandboxStatus> {
            self.0.lock().unwrap().clone()
        }
    }

    fn alice() -> UserId {
        UserId::parse("alice").unwrap()
    }

    /// The feature off (no persistence): re-provisioning is create, then start the dev server.
    fn lifecycle(
        world: &Arc<World>,
        policy: RecoveryPolicy,
    ) -> (Lifecycle<FakeProvider, EmbeddedUpstream>, Arc<Statuses>) {
        let statuses = Arc::new(Statuses::default());
        let orchestrator = Orchestrator::new(None, SandboxLayout::shmastra());
        let lifecycle = Lifecycle::new(
            FakeProvider(Arc::clone(world)),
            orchestrator,
            statuses.clone(),
        )
        .with_policy(policy);
        (lifecycle, statuses)
    }

    /// An operation that runs one command named `op`, after losing the sandbox when `lose`
    /// says so for this call (counted from 1).
    async fn op(
        world: &World,
        calls: &AtomicU32,
        lose: impl Fn(u32) -> bool,
        sandbox: FakeSandbox,
    ) -> Result<(), OrchestrateError> {
        let call = calls.fetch_add(1, Ordering::SeqCst) + 1;
        if lose(call) {
            world.lose();
        }
        sandbox
            .exec(&Exec::new("op", Duration::from_secs(1)))
            .await?;
        Ok(())
    }

    fn started() -> Vec<SandboxStatus> {
        vec![
            SandboxStatus::Provisioning {
                step: ProvisionStep::Creating,
            },
            SandboxStatus::Provisioning {
                step: ProvisionStep::Restoring,
            },
            SandboxStatus::Provisioning {
                step: ProvisionStep::Starting,
            },
            SandboxStatus::Ready,
        ]
    }

    /// A sandbox lost during the operation's first call: `create` runs exactly `wait` after
    /// the loss, and the operation runs once more, on the new sandbox.
    async fn check_wait(policy: RecoveryPolicy, expected_wait: Duration) {
        let world = World::new(false);
        let (lifecycle, statuses) = lifecycle(&world, policy);
        lifecycle.reprovision(&alice(), Vec::new()).await.unwrap();
        statuses.0.lock().unwrap().clear();
        tokio::time::advance(Duration::from_secs(10)).await;
        let calls = AtomicU32::new(0);

        lifecycle
            .run(&alice(), |sandbox| op(&world, &calls, |n| n == 1, sandbox))
            .await
            .unwrap();

        assert_eq!(calls.load(Ordering::SeqCst), 2);
        let lost_at = world.times_of("exec op")[0];
        let creates = world.times_of("create");
        assert_eq!(creates.len(), 2, "the first reprovision and the recovery");
        assert_eq!(creates[1] - lost_at, expected_wait);
        assert_eq!(world.times_of("exec op")[1], creates[1]);
        assert_eq!(statuses.all(), started());
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_sandbox_waits_1_5_s_then_is_reprovisioned_and_the_operation_retried() {
        check_wait(RecoveryPolicy::default(), Duration::from_millis(1500)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_is_configurable() {
        let policy = RecoveryPolicy {
            wait: Duration::from_millis(250),
            ..RecoveryPolicy::default()
        };
        check_wait(policy, Duration::from_millis(250)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn losing_the_sandbox_on_every_call_makes_three_recoveries_then_a_hard_error() {
        let world = World::new(false);
        let (lifecycle, statuses) = lifecycle(&world, RecoveryPolicy::default());
        let calls = AtomicU32::new(0);
        let start = Instant::now();

        let mut results = Vec::new();
        for _ in 0..6 {
            results.push(
                lifecycle
                    .run(&alice(), |sandbox| op(&world, &calls, |_| true, sandbox))
                    .await,
            );
        }

        let shown: Vec<String> = results
            .iter()
            .map(|r| r.as_ref().unwrap_err().to_string())
            .collect();
        for (i, shown) in shown.iter().enumerate() {
            if i < 3 {
                assert_eq!(shown, "sandbox alice is gone", "call {i}");
            } else {
                assert_eq!(
                    shown,
                    "the sandbox of user alice was lost and re-created 3 times within 15m; recovery stopped, it needs attention",
                    "call {i}"
                );
            }
        }
        assert_eq!(world.count("create"), 3, "one sandbox per recovery");
        let mut first = started();
        first.push(SandboxStatus::Broken {
            failure: SyncFailure::new("retry after recovery", "sandbox alice is gone"),
        });
        assert_eq!(statuses.all()[..5], first);
        // Each of the first three found the sandbox gone, recovered, and lost it again on its
        // one retry (no second recovery within one operation); the rest stopped at once.
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        assert_eq!(world.count("connect"), 6 + 3);
        assert_eq!(start.elapsed(), Duration::from_millis(3 * 1500));
        assert_eq!(
            statuses.all().last(),
            Some(&SandboxStatus::NeedsAttention {
                reason: shown[3].clone()
            })
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_provider_whose_new_sandboxes_vanish_at_once_gets_three_creates() {
        let world = World::new(true);
        let (lifecycle, _) = lifecycle(&world, RecoveryPolicy::default());
        let calls = AtomicU32::new(0);

        for _ in 0..5 {
            lifecycle
                .run(&alice(), |sandbox| op(&world, &calls, |_| false, sandbox))
                .await
                .unwrap_err();
        }
        let last = lifecycle
            .run(&alice(), |sandbox| op(&world, &calls, |_| false, sandbox))
            .await
            .unwrap_err();

        assert!(
            matches!(last, OrchestrateError::NeedsAttention { count: 3, .. }),
            "{last}"
        );
        assert_eq!(world.count("create"), 3);
        assert_eq!(calls.load(Ordering::SeqCst), 0, "never a sandbox to run on");
    }

    #[tokio::test(start_paused = true)]
    async fn recoveries_are_allowed_again_once_the_window_has_passed() {
        let world = World::new(false);
        let (lifecycle, _) = lifecycle(&world, RecoveryPolicy::default());
        let calls = AtomicU32::new(0);
        for _ in 0..3 {
            lifecycle
                .run(&alice(), |sandbox| op(&world, &calls, |_| true, sandbox))
                .await
                .unwrap_err();
        }
        let stopped = lifecycle
            .run(&alice(), |sandbox| op(&world, &calls, |_| true, sandbox))
            .await
            .unwrap_err();
        assert!(matches!(stopped, OrchestrateError::NeedsAttention { .. }));

        tokio::time::advance(Duration::from_secs(15 * 60)).await;
        lifecycle
            .run(&alice(), |sandbox| op(&world, &calls, |_| false, sandbox))
            .await
            .unwrap();
        assert_eq!(world.count("create"), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn failures_other_than_gone_are_not_recovered() {
        let world = World::new(false);
        let (lifecycle, _) = lifecycle(&world, RecoveryPolicy::default());
        lifecycle.reprovision(&alice(), Vec::new()).await.unwrap();
        let failures = [
            OrchestrateError::Command {
                sandbox: "alice".into(),
                step: "install",
                exit: "exit code 1".into(),
                tail: String::new(),
            },
            OrchestrateError::Sandbox(SandboxError::Timeout {
                sandbox: "alice".into(),
                command: "npm ci".into(),
                timeout: Duration::from_secs(1),
            }),
        ];
        for failure in failures {
            let shown = failure.to_string();
            let mut failure = Some(failure);
            let err = lifecycle
                .run(&alice(), |_| {
                    let failure = failure.take();
                    async move { Err::<(), _>(failure.expect("called once")) }
                })
                .await
                .unwrap_err();
            assert_eq!(err.to_string(), shown);
        }
        assert_eq!(world.count("create"), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_update_whose_sandbox_is_lost_runs_again_with_the_watcher_stopped_around_it() {
        let world = World::new(false);
        world.state().alive = Some(0);
        let upstream = tempfile::tempdir().unwrap();
        let orchestrator = Orchestrator::new(
            Some(crate::orchestrate::Persistence {
                host: EmbeddedUpstream::new(upstream.path()).unwrap(),
                signer: crate::token::TokenSigner::new(&[1u8; 32]).unwrap(),
                git_url: "http://127.0.0.1:1/api/git".into(),
            }),
            SandboxLayout::shmastra(),
        );
        let lifecycle = Lifecycle::new(
            FakeProvider(Arc::clone(&world)),
            orchestrator,
            Arc::new(Statuses::default()),
        );
        let calls = AtomicU32::new(0);

        let updated = lifecycle
            .with_watcher_stopped(&alice(), |sandbox| {
                let (world, calls) = (&world, &calls);
                async move {
                    let call = calls.fetch_add(1, Ordering::SeqCst) + 1;
                    world.record(format!("update {call} in sandbox {}", sandbox.generation));
                    if call == 1 {
                        world.lose();
                    }
                    Ok::<_, String>(call)
                }
            })
            .await
            .unwrap();

        assert_eq!(updated, Ok(2));
        let steps: Vec<String> = world
            .state()
            .log
            .iter()
            .map(|(_, what)| what.clone())
            .filter(|what| {
                what.starts_with("update")
                    || what.contains("project-watcher")
                    || what.contains(" restore ")
            })
            .collect();
        assert_eq!(
            steps,
            [
                "exec pm2 stop project-watcher",
                "update 1 in sandbox 0",
                "exec pm2 start /home/user/ecosystem.config.js --only project-watcher",
                // Re-provisioning: stop a running watcher, restore, start the watcher.
                "exec pm2 pid project-watcher | grep -q '^[1-9]'",
                "exec pm2 stop project-watcher",
                "exec project-watcher restore --dir /home/user/shmastra --remote project --branch main",
                "exec pm2 start /home/user/ecosystem.config.js --only project-watcher",
                "exec pm2 stop project-watcher",
                "update 2 in sandbox 1",
                "exec pm2 start /home/user/ecosystem.config.js --only project-watcher",
            ]
        );
        assert_eq!(world.count("create"), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn two_reprovisions_at_once_make_one_sandbox() {
        let world = Arc::new(World {
            create_takes: Duration::from_secs(5),
            ..World::default()
        });
        world.state().start = Some(Instant::now());
        let (lifecycle, statuses) = lifecycle(&world, RecoveryPolicy::default());

        let user = alice();
        let (a, b) = tokio::join!(
            lifecycle.reprovision(&user, Vec::new()),
            lifecycle.reprovision(&user, Vec::new())
        );

        let mut outcomes = [a.unwrap(), b.unwrap()];
        outcomes.sort_by_key(|o| matches!(o, Reprovisioned::Present(_)));
        assert_eq!(
            outcomes,
            [
                Reprovisioned::Created,
                Reprovisioned::Present(Provisioned::default())
            ]
        );
        assert_eq!(world.count("create"), 1);
        assert_eq!(
            world.count("exec pm2 start"),
            1,
            "the dev server started once"
        );
        assert_eq!(statuses.all(), started());
        assert_eq!(
            lifecycle.reprovision(&alice(), Vec::new()).await.unwrap(),
            Reprovisioned::Present(Provisioned::default())
        );
        assert_eq!(world.count("create"), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn operations_that_lose_the_same_sandbox_together_recover_it_once() {
        let world = World::new(false);
        let (lifecycle, _) = lifecycle(&world, RecoveryPolicy::default());
        lifecycle.reprovision(&alice(), Vec::new()).await.unwrap();
        let calls = AtomicU32::new(0);
        // Both operations are inside their sandbox when it goes.
        let slow_op = |sandbox: FakeSandbox| {
            let (world, calls) = (&world, &calls);
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(1)).await;
                sandbox
                    .exec(&Exec::new("op", Duration::from_secs(1)))
                    .await?;
                Ok::<_, OrchestrateError>(world.state().alive)
            }
        };

        let user = alice();
        let (a, b, ()) = tokio::join!(
            lifecycle.run(&user, slow_op),
            lifecycle.run(&user, slow_op),
            async {
                tokio::time::sleep(Duration::from_millis(500)).await;
                world.lose();
            }
        );

        assert_eq!(a.unwrap(), Some(2));
        assert_eq!(b.unwrap(), Some(2));
        assert_eq!(
            world.count("create"),
            2,
            "the first reprovision and one recovery"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 4);
        assert_eq!(
            world.times_of("create")[1],
            Duration::from_millis(1000 + 1500),
            "one wait, from the moment both lost it"
        );
        for _ in 0..2 {
            let recovered = lifecycle
                .run(&alice(), |sandbox| op(&world, &calls, |_| true, sandbox))
                .await
                .unwrap_err();
            assert!(recovered.is_gone(), "{recovered}");
        }
        let stopped = lifecycle
            .run(&alice(), |sandbox| op(&world, &calls, |_| true, sandbox))
            .await
            .unwrap_err();
        assert!(
            matches!(stopped, OrchestrateError::NeedsAttention { count: 3, .. }),
            "the shared loss counted once: {stopped}"
        );
    }
}
