//! Orchestration over a [`Sandbox`]: provision the watcher, restore a fresh sandbox, sync a
//! running one after an external push, pause the watcher around an update, back-fill.
//!
//! Everything here talks to the sandbox only through commands and files, so the same code
//! drives an E2B sandbox in production and a [`crate::sandbox::LocalSandbox`] in tests.
//! [`lifecycle::Lifecycle`] adds where sandboxes come from: re-provisioning a lost one and
//! bounded recovery around every step.

pub mod coalesce;
pub mod error;
pub mod history;
pub mod layout;
pub mod lifecycle;
pub mod provision;
pub mod queued;
pub mod recovery;
pub mod sync;

use shmastra_contract::SyncFailure;
use shmastra_contract::failure::OutputLines;

use crate::host::ProjectHost;
use crate::sandbox::{Exec, ExecOutput, Sandbox, SandboxError};
use crate::status::{SandboxStatus, StatusSink, SyncOutcome};
use crate::token::TokenSigner;
use crate::user::UserId;
use coalesce::Coalescer;
pub use error::OrchestrateError;
pub use layout::{HealthCheck, SandboxLayout};

/// How many lines of a failed command's output an error carries.
const TAIL_LINES: usize = 50;
/// The step a failed health check is reported as.
pub const HEALTH_STEP: &str = "dev server health";

/// What the feature needs when it is on: somewhere to create projects, the token signer, and
/// the proxy's git URL (`https://cloud.example/api/git`), under which each user's project is
/// `<git_url>/<user>.git`.
pub struct Persistence<H> {
    /// Where projects are created.
    pub host: H,
    /// Mints each user's `PROJECT_TOKEN`.
    pub signer: TokenSigner,
    /// The proxy's git URL.
    pub git_url: String,
}

impl<H> Persistence<H> {
    fn remote_url(&self, user: &UserId) -> String {
        format!("{}/{user}.git", self.git_url.trim_end_matches('/'))
    }

    /// The user's `PROJECT_TOKEN` at their current generation (after a rotation, the new
    /// one); generation 0's when the generations cannot be read, with a warning.
    fn token(&self, user: &UserId) -> String {
        self.signer.mint_current(user).unwrap_or_else(|e| {
            tracing::warn!(user = %user, error = %e, "cannot read the token generation; the sandbox gets generation 0's token");
            self.signer.mint(user)
        })
    }
}

/// The orchestration entry points. `persistence` is `None` when the feature is off: then
/// there is no watcher, no remote and no manifest check.
pub struct Orchestrator<H> {
    persistence: Option<Persistence<H>>,
    layout: SandboxLayout,
    /// Per sandbox; `None` is a run that found the sandbox gone.
    syncs: Coalescer<Option<SyncOutcome>>,
}

impl<H: ProjectHost> Orchestrator<H> {
    /// Orchestration over sandboxes laid out as `layout`; `persistence` `None` turns the
    /// feature off.
    pub fn new(persistence: Option<Persistence<H>>, layout: SandboxLayout) -> Self {
        Self {
            persistence,
            layout,
            syncs: Coalescer::new(),
        }
    }

    /// Where things are in the sandboxes.
    pub fn layout(&self) -> &SandboxLayout {
        &self.layout
    }

    /// Whether project persistence is on.
    pub fn is_enabled(&self) -> bool {
        self.persistence.is_some()
    }

    /// Where projects are created, when the feature is on.
    pub fn host(&self) -> Option<&H> {
        self.persistence.as_ref().map(|p| &p.host)
    }

    async fn shell<S: Sandbox>(
        &self,
        sandbox: &S,
        command: &str,
    ) -> Result<ExecOutput, OrchestrateError> {
        self.in_project(sandbox, Exec::new(command, self.layout.command_timeout))
            .await
    }

    async fn checked<S: Sandbox>(
        &self,
        sandbox: &S,
        step: &'static str,
        command: &str,
    ) -> Result<ExecOutput, OrchestrateError> {
        self.expect_ok(
            sandbox,
            step,
            Exec::new(command, self.layout.command_timeout),
        )
        .await
    }

    async fn expect_ok<S: Sandbox>(
        &self,
        sandbox: &S,
        step: &'static str,
        exec: Exec,
    ) -> Result<ExecOutput, OrchestrateError> {
        let out = self.in_project(sandbox, exec).await?;
        if out.success() {
            return Ok(out);
        }
        Err(OrchestrateError::Command {
            sandbox: sandbox.id().to_owned(),
            step,
            exit: exit_text(&out),
            tail: tail(&out),
        })
    }

    /// Waits until the dev server answers the layout's health check (at once without one),
    /// status `Starting` meanwhile. `Ok(Some(failure))`: it did not come up in time (the
    /// probe's last answer and the dev server's log tail in the failure); `Err` only when the
    /// sandbox is gone.
    pub(crate) async fn wait_until_up<S: Sandbox>(
        &self,
        sandbox: &S,
        status: &impl StatusSink,
    ) -> Result<Option<SyncFailure>, SandboxError> {
        let Some(health) = &self.layout.health else {
            return Ok(None);
        };
        status.set_status(
            sandbox.id(),
            SandboxStatus::Starting {
                url: health.url.clone(),
            },
        );
        let exec = Exec::new(
            health.command(sandbox.home()),
            health.timeout + self.layout.command_timeout,
        );
        let message = || {
            format!(
                "the dev server did not answer {} within {}",
                health.url,
                shmastra_contract::duration::short_duration(health.timeout)
            )
        };
        Ok(match self.in_project(sandbox, exec).await {
            Ok(out) if out.success() => None,
            Ok(out) => Some(failure_of(HEALTH_STEP, message(), &out)),
            Err(OrchestrateError::Sandbox(e)) if e.is_gone() => return Err(e),
            Err(e) => Some(SyncFailure::new(HEALTH_STEP, format!("{}: {e}", message()))),
        })
    }

    /// Runs in the project directory unless `exec` names another.
    async fn in_project<S: Sandbox>(
        &self,
        sandbox: &S,
        exec: Exec,
    ) -> Result<ExecOutput, OrchestrateError> {
        let exec = match exec.cwd {
            Some(_) => exec,
            None => exec.cwd(sandbox.home().join(&self.layout.project_dir)),
        };
        Ok(sandbox.exec(&exec).await?)
    }
}

fn exit_text(out: &ExecOutput) -> String {
    match out.exit_code {
        Some(code) => format!("exit code {code}"),
        None => "killed by a signal".to_owned(),
    }
}

/// The stderr of a command, or its stdout when stderr is empty.
fn output_of(out: &ExecOutput) -> &str {
    if out.stderr.trim().is_empty() {
        &out.stdout
    } else {
        &out.stderr
    }
}

/// The last lines of stderr, or of stdout when stderr is empty.
fn tail(out: &ExecOutput) -> String {
    let lines: Vec<&str> = output_of(out).lines().collect();
    lines[lines.len().saturating_sub(TAIL_LINES)..].join("\n")
}

/// The failure of `step` with `message`, and the output's first error lines and tail, as the
/// watcher's failure file would hold them.
fn failure_of(step: &str, message: String, out: &ExecOutput) -> SyncFailure {
    let mut lines = OutputLines::default();
    output_of(out).lines().for_each(|line| lines.push(line));
    lines.failure(step, message)
}
