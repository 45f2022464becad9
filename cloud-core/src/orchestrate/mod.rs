//! Orchestration over a [`Sandbox`]: provision the watcher, restore a fresh sandbox, sync a
//! running one after an external push, pause the watcher around an update, back-fill.
//!
//! Everything here talks to the sandbox only through commands and files, so the same code
//! drives an E2B sandbox in production and a [`crate::sandbox::LocalSandbox`] in tests.
//! [`lifecycle::Lifecycle`] adds where sandboxes come from: re-provisioning a lost one and
//! bounded recovery around every step.

pub mod coalesce;
pub mod history;
pub mod lifecycle;
pub mod queued;
pub mod recovery;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::time::Duration;

use futures_util::FutureExt;
use shmastra_contract::env::{self, DEFAULT_BRANCH, DEFAULT_REMOTE};
use shmastra_contract::failure::DEFAULT_FAILURE_FILE;
use shmastra_contract::manifest::{MANIFEST_FILE, Manifest, ManifestError};
use shmastra_contract::{RestoreCommand, SyncCommand, SyncFailure};

use crate::UserId;
use crate::gitlab::{GitLab, GitLabError};
use crate::sandbox::{Exec, ExecOutput, Sandbox, SandboxError};
use crate::secrets::{RestoreForm, RestoreFormError, SecretValue, render_env, render_env_file};
use crate::token::TokenSigner;
use coalesce::Coalescer;

/// How many lines of a failed command's output an error carries.
const TAIL_LINES: usize = 50;

/// Where things are inside a sandbox, and the commands that control its processes. Every
/// command runs with `sh -c` in the project directory. Relative paths are taken from the
/// sandbox's home directory.
#[derive(Debug, Clone)]
pub struct SandboxLayout {
    /// The project the watcher saves (`/home/user/shmastra`).
    pub project_dir: PathBuf,
    /// The watcher's environment (`PROJECT_TOKEN` and friends), read by the PM2 ecosystem
    /// file. Named `.env` because it holds a secret, and secrets live only in `.env` files.
    pub watcher_env_file: PathBuf,
    /// The `project-watcher` executable.
    pub watcher_bin: String,
    pub start_watcher: String,
    pub stop_watcher: String,
    /// Exits 0 when the watcher is running.
    pub watcher_running: String,
    pub start_dev_server: String,
    pub stop_dev_server: String,
    /// Overrides the lock file's own package manager during a sync.
    pub install_cmd: Option<String>,
    /// Where `project-watcher sync` leaves the failed step's output.
    pub failure_file: PathBuf,
    /// The limit for short commands (git setup, PM2 control).
    pub command_timeout: Duration,
    /// The limit for a whole restore or sync, dependency install included.
    pub sync_timeout: Duration,
}

impl SandboxLayout {
    /// The Shmastra sandbox template: the project in `/home/user/shmastra`, PM2 running the
    /// dev server as `dev-server` and the watcher as `project-watcher`.
    pub fn shmastra() -> Self {
        Self {
            project_dir: "/home/user/shmastra".into(),
            watcher_env_file: "/home/user/.project-watcher/.env".into(),
            watcher_bin: "project-watcher".into(),
            start_watcher: "pm2 start /home/user/ecosystem.config.js --only project-watcher".into(),
            stop_watcher: "pm2 stop project-watcher".into(),
            watcher_running: "pm2 pid project-watcher | grep -q '^[1-9]'".into(),
            start_dev_server: "pm2 start /home/user/ecosystem.config.js --only dev-server".into(),
            stop_dev_server: "pm2 stop dev-server".into(),
            install_cmd: None,
            failure_file: DEFAULT_FAILURE_FILE.into(),
            command_timeout: Duration::from_secs(60),
            sync_timeout: Duration::from_secs(15 * 60),
        }
    }
}

/// Where user projects are created: GitLab in production, the embedded upstream on one
/// machine (which implements this beside its proxy code: orchestration never imports the
/// proxy).
pub trait ProjectHost: Send + Sync {
    type Error: std::error::Error + Send + Sync + 'static;

    fn ensure_project(&self, user: &UserId)
    -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Whether the same call may succeed later without anyone changing the setup.
    fn is_transient(error: &Self::Error) -> bool;
}

impl ProjectHost for GitLab {
    type Error = GitLabError;

    async fn ensure_project(&self, user: &UserId) -> Result<(), GitLabError> {
        self.ensure_user_project(user).await.map(|_| ())
    }

    fn is_transient(error: &GitLabError) -> bool {
        error.is_transient()
    }
}

/// What the feature needs when it is on: somewhere to create projects, the token signer, and
/// the proxy's git URL (`https://cloud.example/api/git`), under which each user's project is
/// `<git_url>/<user>.git`.
pub struct Persistence<H> {
    pub host: H,
    pub signer: TokenSigner,
    pub git_url: String,
}

impl<H> Persistence<H> {
    fn remote_url(&self, user: &UserId) -> String {
        format!("{}/{user}.git", self.git_url.trim_end_matches('/'))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OrchestrateError {
    #[error("cannot create the project of user {user}: {source}")]
    Host {
        user: UserId,
        transient: bool,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error("the saved project of user {user} has a bad {MANIFEST_FILE}: {source}")]
    Manifest { user: UserId, source: ManifestError },
    #[error(transparent)]
    Form(#[from] RestoreFormError),
    #[error("sandbox {sandbox}: {step} failed ({exit}): {tail}")]
    Command {
        sandbox: String,
        step: &'static str,
        exit: String,
        tail: String,
    },
    /// Recovery gave up: the user's sandbox was lost again and again. Someone has to look.
    #[error(
        "the sandbox of user {user} was lost and re-created {count} times within {}; recovery stopped, it needs attention",
        short_duration(*window)
    )]
    NeedsAttention {
        user: UserId,
        count: u32,
        window: Duration,
    },
}

impl OrchestrateError {
    /// Whether trying again later may succeed without anyone changing the setup.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Host { transient, .. } => *transient,
            Self::Sandbox(SandboxError::Timeout { .. }) => true,
            Self::Sandbox(_)
            | Self::Command { .. }
            | Self::Manifest { .. }
            | Self::Form(_)
            | Self::NeedsAttention { .. } => false,
        }
    }

    /// Whether the sandbox itself is gone (recovery re-provisions it), as opposed to a step
    /// failing inside it.
    pub fn is_gone(&self) -> bool {
        matches!(self, Self::Sandbox(e) if e.is_gone())
    }
}

/// What `provision` changed. All `false`: the sandbox was already provisioned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Provisioned {
    pub repository_created: bool,
    pub env_written: bool,
    pub remote_configured: bool,
    pub watcher_started: bool,
}

impl Provisioned {
    pub fn changed_anything(&self) -> bool {
        self.repository_created
            || self.env_written
            || self.remote_configured
            || self.watcher_started
    }
}

/// A sandbox's state as the workspace page shows it. Stored as JSON tagged by `state`:
/// `{"state": "broken", "failure": {"step": ..., "message": ..., "tail": ...}}`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum SandboxStatus {
    Syncing,
    /// Going back to an earlier save ([`Orchestrator::restore_to`]).
    Restoring,
    Ready,
    /// The sync (or a restore) failed: the step, the message and the output tail.
    Broken {
        failure: SyncFailure,
    },
    /// Re-provisioning a lost sandbox, at this step.
    Provisioning {
        step: ProvisionStep,
    },
    /// The saved project needs these secrets (`shmastra.json`) before the new sandbox can
    /// start: the restore form must ask the user for them.
    NeedsSecrets {
        names: Vec<String>,
    },
    /// Recovery stopped after losing the sandbox too often; `reason` says how often.
    NeedsAttention {
        reason: String,
    },
}

/// How a sync ended for the caller's event: the outcome of the run that covered it (the
/// caller's own run, or the run its trigger coalesced into). Stored as JSON tagged by
/// `outcome`: `{"outcome": "failed", "failure": {"step": ..., "message": ..., "tail": ...}}`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum SyncOutcome {
    /// The sandbox holds the saved branch; `commit` is its `HEAD` after the sync, when the
    /// sandbox could tell (`None` with the feature off or before the first save).
    Synced { commit: Option<String> },
    /// The sync failed (the sandbox's status is `Broken` with the same failure).
    Failed { failure: SyncFailure },
}

/// The steps of re-provisioning, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProvisionStep {
    /// A new sandbox from the template.
    Creating,
    /// The saved branch into the new sandbox (`project-watcher restore`).
    Restoring,
    /// `.env` from the restore form, the dev server, the watcher.
    Starting,
}

/// Where sync status changes go (the cloud's database; a list in tests).
pub trait StatusSink: Send + Sync {
    fn set_status(&self, sandbox: &str, status: SandboxStatus);
}

impl<T: StatusSink + ?Sized> StatusSink for std::sync::Arc<T> {
    fn set_status(&self, sandbox: &str, status: SandboxStatus) {
        (**self).set_status(sandbox, status);
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
    pub fn new(persistence: Option<Persistence<H>>, layout: SandboxLayout) -> Self {
        Self {
            persistence,
            layout,
            syncs: Coalescer::new(),
        }
    }

    pub fn layout(&self) -> &SandboxLayout {
        &self.layout
    }

    pub fn is_enabled(&self) -> bool {
        self.persistence.is_some()
    }

    /// Where projects are created, when the feature is on.
    pub fn host(&self) -> Option<&H> {
        self.persistence.as_ref().map(|p| &p.host)
    }

    /// Ensures the user's project, writes the watcher's environment, points the `project`
    /// remote at the proxy and starts the watcher. Running it again changes nothing.
    /// With the feature off it does nothing. This is for a sandbox that already holds the
    /// user's work (back-fill); a fresh one goes through [`Orchestrator::begin_restore`] first,
    /// or the watcher would save the template over the saved project.
    pub async fn provision<S: Sandbox>(
        &self,
        sandbox: &S,
        user: &UserId,
    ) -> Result<Provisioned, OrchestrateError> {
        let Some(persistence) = &self.persistence else {
            return Ok(Provisioned::default());
        };
        let mut done = self.prepare(persistence, sandbox, user).await?;
        let running = self
            .shell(sandbox, &self.layout.watcher_running)
            .await?
            .success();
        if running && done.env_written {
            // PM2 reads the environment at start: a new token needs a restart.
            self.checked(sandbox, "stop the watcher", &self.layout.stop_watcher)
                .await?;
        }
        if !running || done.env_written {
            self.checked(sandbox, "start the watcher", &self.layout.start_watcher)
                .await?;
            done.watcher_started = true;
        }
        Ok(done)
    }

    /// Everything `provision` does except starting the watcher.
    async fn prepare<S: Sandbox>(
        &self,
        persistence: &Persistence<H>,
        sandbox: &S,
        user: &UserId,
    ) -> Result<Provisioned, OrchestrateError> {
        persistence
            .host
            .ensure_project(user)
            .await
            .map_err(|source| OrchestrateError::Host {
                user: user.clone(),
                transient: H::is_transient(&source),
                source: Box::new(source),
            })?;
        let mut done = Provisioned::default();
        let dir = sandbox.home().join(&self.layout.project_dir);
        let init = Exec::new(
            "mkdir -p \"$PROJECT_DIR\" && cd \"$PROJECT_DIR\" && if [ -d .git ]; then echo exists; else git init -q -b \"$BRANCH\"; fi",
            self.layout.command_timeout,
        )
        .env("PROJECT_DIR", dir.display().to_string())
        .env("BRANCH", DEFAULT_BRANCH)
        .cwd("/");
        done.repository_created = self
            .expect_ok(sandbox, "create the repository", init)
            .await?
            .stdout
            .trim()
            != "exists";

        let env = env::watcher_env_file(
            &dir,
            DEFAULT_REMOTE,
            DEFAULT_BRANCH,
            &persistence.signer.mint(user),
        );
        let env_file = sandbox.home().join(&self.layout.watcher_env_file);
        let current = sandbox.read_file(&env_file).await?;
        if current.as_deref() != Some(env.as_bytes()) {
            sandbox.write_file(&env_file, env.as_bytes()).await?;
            done.env_written = true;
        }

        let url = persistence.remote_url(user);
        let current = self
            .in_project(
                sandbox,
                Exec::new(
                    format!("git remote get-url {DEFAULT_REMOTE}"),
                    self.layout.command_timeout,
                ),
            )
            .await?;
        if !current.success() || current.stdout.trim() != url {
            let verb = if current.success() { "set-url" } else { "add" };
            let set = Exec::new(
                format!("git remote {verb} {DEFAULT_REMOTE} \"$REMOTE_URL\""),
                self.layout.command_timeout,
            )
            .env("REMOTE_URL", url);
            self.expect_ok(sandbox, "configure the project remote", set)
                .await?;
            done.remote_configured = true;
        }
        Ok(done)
    }

    /// The first half of restoring a fresh sandbox: sets up the remote and the watcher's
    /// environment, restores the saved tree (`project-watcher restore`), and reads
    /// `shmastra.json` from it to learn which secrets the restore form must ask for. The dev
    /// server and the watcher are not started yet. With the feature off nothing happens and
    /// no secret is asked for.
    pub async fn begin_restore<S: Sandbox>(
        &self,
        sandbox: &S,
        user: &UserId,
    ) -> Result<RestorePlan, OrchestrateError> {
        let Some(persistence) = &self.persistence else {
            return Ok(RestorePlan {
                manifest: Manifest::default(),
                enabled: false,
            });
        };
        self.prepare(persistence, sandbox, user).await?;
        if self
            .shell(sandbox, &self.layout.watcher_running)
            .await?
            .success()
        {
            // Restoring under a running watcher would save the template over the user's work.
            self.checked(sandbox, "stop the watcher", &self.layout.stop_watcher)
                .await?;
        }
        let dir = sandbox.home().join(&self.layout.project_dir);
        let restore = Exec::new(
            RestoreCommand::new(dir.display().to_string()).shell(&self.layout.watcher_bin),
            self.layout.sync_timeout,
        )
        .env(env::PROJECT_TOKEN, persistence.signer.mint(user));
        self.expect_ok(sandbox, "restore the project", restore)
            .await?;
        let manifest = match sandbox.read_file(&dir.join(MANIFEST_FILE)).await? {
            None => Manifest::default(),
            Some(bytes) => Manifest::parse(&String::from_utf8_lossy(&bytes)).map_err(|source| {
                OrchestrateError::Manifest {
                    user: user.clone(),
                    source,
                }
            })?,
        };
        Ok(RestorePlan {
            manifest,
            enabled: true,
        })
    }

    /// The second half: checks the submitted secrets against the manifest, writes `.env`,
    /// starts the dev server and then the watcher. A rejected form changes nothing and can be
    /// submitted again.
    pub async fn finish_restore<S: Sandbox>(
        &self,
        sandbox: &S,
        plan: &RestorePlan,
        submitted: impl IntoIterator<Item = (String, SecretValue)>,
    ) -> Result<(), OrchestrateError> {
        if plan.enabled {
            let form = RestoreForm::validate(&plan.manifest, submitted)?;
            let project = sandbox.home().join(&self.layout.project_dir);
            if !plan.manifest.env().is_empty() {
                sandbox
                    .write_file(&project.join(".env"), render_env(&form).expose().as_bytes())
                    .await?;
            }
            for file in plan.manifest.env_files().keys() {
                sandbox
                    .write_file(
                        &project.join(file),
                        render_env_file(&form, file).expose().as_bytes(),
                    )
                    .await?;
            }
        }
        self.checked(
            sandbox,
            "start the dev server",
            &self.layout.start_dev_server,
        )
        .await?;
        if plan.enabled {
            self.checked(sandbox, "start the watcher", &self.layout.start_watcher)
                .await?;
        }
        Ok(())
    }

    /// Stops the watcher, runs `f`, and starts the watcher again whether `f` succeeded,
    /// failed or panicked (the panic continues after the restart). A failed restart is
    /// reported only when `f` itself succeeded, so `f`'s own error is never hidden.
    pub async fn with_watcher_stopped<S, F, Fut, T, E>(
        &self,
        sandbox: &S,
        f: F,
    ) -> Result<Result<T, E>, OrchestrateError>
    where
        S: Sandbox,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        if self.persistence.is_none() {
            return Ok(f().await);
        }
        self.checked(sandbox, "stop the watcher", &self.layout.stop_watcher)
            .await?;
        let outcome = AssertUnwindSafe(f()).catch_unwind().await;
        let restarted = self
            .checked(sandbox, "start the watcher", &self.layout.start_watcher)
            .await;
        match outcome {
            Err(panic) => {
                if let Err(e) = &restarted {
                    tracing::error!(sandbox = sandbox.id(), error = %e, "watcher restart after a panic failed");
                }
                std::panic::resume_unwind(panic)
            }
            Ok(Err(e)) => {
                if let Err(restart) = &restarted {
                    tracing::error!(sandbox = sandbox.id(), error = %restart, "watcher restart after a failure failed");
                }
                Ok(Err(e))
            }
            Ok(Ok(v)) => restarted.map(|_| Ok(v)),
        }
    }

    /// Brings a running sandbox to the pushed branch: status `syncing`, then `ready`, or
    /// `broken` with the failure file (also when the sandbox is gone), and returns how the run
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
    async fn sync_once<S: Sandbox>(
        &self,
        sandbox: &S,
        user: &UserId,
        status: &impl StatusSink,
    ) -> Result<SyncOutcome, SandboxError> {
        let Some(persistence) = &self.persistence else {
            return Ok(SyncOutcome::Synced { commit: None });
        };
        status.set_status(sandbox.id(), SandboxStatus::Syncing);
        let layout = &self.layout;
        let failure_file = sandbox.home().join(&layout.failure_file);
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
        let exec = Exec::new(command.shell(&layout.watcher_bin), layout.sync_timeout)
            .env(env::PROJECT_TOKEN, persistence.signer.mint(user));
        let failure = match self.in_project(sandbox, exec).await {
            Ok(out) if out.success() => None,
            Ok(out) => Some(match sandbox.read_file(&failure_file).await {
                Ok(Some(bytes)) => SyncFailure::parse(&bytes),
                Err(e) if e.is_gone() => return Err(e),
                _ => SyncFailure {
                    step: "sync".to_owned(),
                    message: format!("project-watcher sync exited with {}", exit_text(&out)),
                    tail: tail(&out),
                },
            }),
            Err(OrchestrateError::Sandbox(e)) if e.is_gone() => return Err(e),
            Err(e) => Some(SyncFailure::new("sync", e.to_string())),
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

    /// Provisions every existing sandbox; one failure does not stop the rest. A second run
    /// reports every sandbox as already done.
    pub async fn backfill<S: Sandbox>(&self, sandboxes: &[(UserId, S)]) -> Vec<BackfillEntry> {
        let mut report = Vec::with_capacity(sandboxes.len());
        for (user, sandbox) in sandboxes {
            let outcome = match self.provision(sandbox, user).await {
                Ok(done) if done.changed_anything() => BackfillOutcome::Provisioned(done),
                Ok(_) => BackfillOutcome::AlreadyDone,
                Err(e) => {
                    tracing::warn!(sandbox = sandbox.id(), user = %user, error = %e, "back-fill failed for this sandbox");
                    BackfillOutcome::Failed(e.to_string())
                }
            };
            report.push(BackfillEntry {
                sandbox: sandbox.id().to_owned(),
                user: user.clone(),
                outcome,
            });
        }
        report
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

/// What the restore form must ask for, between [`Orchestrator::begin_restore`] and
/// [`Orchestrator::finish_restore`].
#[derive(Debug, Clone)]
pub struct RestorePlan {
    manifest: Manifest,
    enabled: bool,
}

impl RestorePlan {
    /// The names of the secrets to ask for (never their values: those were never saved): the
    /// `.env` names, then `FILE:NAME` for the other env files (`.env.local:API_KEY`).
    /// Empty: no form is needed.
    pub fn secret_names(&self) -> Vec<String> {
        self.manifest.form_names()
    }
}

/// One line of the back-fill report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackfillEntry {
    pub sandbox: String,
    pub user: UserId,
    pub outcome: BackfillOutcome,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackfillOutcome {
    Provisioned(Provisioned),
    AlreadyDone,
    Failed(String),
}

/// A duration as people write it: `15m`, `1h 30m`, `1s 500ms`, `2days` (whole
/// milliseconds), as humantime writes it.
pub(crate) fn short_duration(duration: Duration) -> String {
    let mut rest = duration.as_millis();
    let mut parts = Vec::new();
    for (unit, name) in [
        (86_400_000, "day"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
        (1, "ms"),
    ] {
        if rest >= unit {
            let n = rest / unit;
            let plural = if name == "day" && n > 1 { "s" } else { "" };
            parts.push(format!("{n}{name}{plural}"));
            rest %= unit;
        }
    }
    if parts.is_empty() {
        "0s".to_owned()
    } else {
        parts.join(" ")
    }
}

impl SyncOutcome {
    /// The sandbox's status after a run that ended so.
    fn status(&self) -> SandboxStatus {
        match self {
            SyncOutcome::Synced { .. } => SandboxStatus::Ready,
            SyncOutcome::Failed { failure } => SandboxStatus::Broken {
                failure: failure.clone(),
            },
        }
    }
}

fn gone<S: Sandbox>(sandbox: &S) -> SandboxError {
    SandboxError::Gone {
        sandbox: sandbox.id().to_owned(),
    }
}

/// A run of [`Orchestrator::sync`] that lost the sandbox: `broken`, and that failure.
fn gone_failure(sandbox: &str, gone: &SandboxError, status: &impl StatusSink) -> SyncOutcome {
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

fn exit_text(out: &ExecOutput) -> String {
    match out.exit_code {
        Some(code) => format!("exit code {code}"),
        None => "killed by a signal".to_owned(),
    }
}

/// The last lines of stderr, or of stdout when stderr is empty.
fn tail(out: &ExecOutput) -> String {
    let text = if out.stderr.trim().is_empty() {
        &out.stdout
    } else {
        &out.stderr
    };
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(TAIL_LINES)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_write_them() {
        for (duration, text) in [
            (Duration::ZERO, "0s"),
            (Duration::from_secs(15 * 60), "15m"),
            (Duration::from_secs(5400), "1h 30m"),
            (Duration::from_millis(1500), "1s 500ms"),
            (Duration::from_secs(2 * 86_400 + 1), "2days 1s"),
            (Duration::from_secs(86_400), "1day"),
        ] {
            assert_eq!(short_duration(duration), text);
            assert_eq!(
                short_duration(duration),
                humantime::format_duration(duration).to_string()
            );
        }
    }

    #[test]
    fn statuses_round_trip_through_json() {
        for status in [
            SandboxStatus::Ready,
            SandboxStatus::Broken {
                failure: SyncFailure::new("install", "`npm ci` failed").with_tail(["npm ERR!"]),
            },
            SandboxStatus::Provisioning {
                step: ProvisionStep::Restoring,
            },
            SandboxStatus::NeedsSecrets {
                names: vec!["API_KEY".into()],
            },
        ] {
            let json = serde_json::to_string(&status).unwrap();
            assert_eq!(
                serde_json::from_str::<SandboxStatus>(&json).unwrap(),
                status
            );
        }
        assert_eq!(
            serde_json::to_value(SandboxStatus::Provisioning {
                step: ProvisionStep::Creating
            })
            .unwrap(),
            serde_json::json!({"state": "provisioning", "step": "creating"})
        );
        let failed = SyncOutcome::Failed {
            failure: SyncFailure::new("install", "`npm ci` failed"),
        };
        assert_eq!(
            serde_json::to_value(&failed).unwrap(),
            serde_json::json!({"outcome": "failed", "failure": {"step": "install", "message": "`npm ci` failed", "tail": ""}})
        );
        for outcome in [failed, SyncOutcome::Synced { commit: None }] {
            let json = serde_json::to_string(&outcome).unwrap();
            assert_eq!(serde_json::from_str::<SyncOutcome>(&json).unwrap(), outcome);
        }
    }
}
