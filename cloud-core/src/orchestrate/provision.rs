//! Provisioning a sandbox that holds the user's work (back-fill), restoring a fresh one in two
//! halves around the restore form, and pausing the watcher around an update.

use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures_util::FutureExt;
use shmastra_contract::RestoreCommand;
use shmastra_contract::env::{self, DEFAULT_BRANCH, DEFAULT_REMOTE};
use shmastra_contract::manifest::{MANIFEST_FILE, Manifest};

use super::{OrchestrateError, Orchestrator, Persistence};
use crate::host::ProjectHost;
use crate::sandbox::{Exec, Sandbox};
use crate::secrets::{RestoreForm, SecretValue, render_env, render_env_file};
use crate::user::UserId;

/// What `provision` changed. All `false`: the sandbox was already provisioned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Provisioned {
    /// The project directory had no git repository.
    pub repository_created: bool,
    /// The watcher's environment file was new or different (a new token).
    pub env_written: bool,
    /// The `project` remote was added or pointed at the proxy.
    pub remote_configured: bool,
    /// The watcher was started (or restarted for a new environment).
    pub watcher_started: bool,
}

impl Provisioned {
    /// Whether anything was done.
    pub fn changed_anything(&self) -> bool {
        self.repository_created
            || self.env_written
            || self.remote_configured
            || self.watcher_started
    }
}

impl<H: ProjectHost> Orchestrator<H> {
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
        if !self.layout.exclude.is_empty() {
            // Each pattern once, added by line; what is there already stays.
            let exclude = Exec::new(
                "mkdir -p .git/info && touch .git/info/exclude && \
                 if [ -n \"$(tail -c 1 .git/info/exclude)\" ]; then echo >> .git/info/exclude; fi && \
                 printf '%s\\n' \"$PATTERNS\" | while IFS= read -r p; do \
                 grep -qxF -- \"$p\" .git/info/exclude || printf '%s\\n' \"$p\" >> .git/info/exclude; done",
                self.layout.command_timeout,
            )
            .env("PATTERNS", self.layout.exclude.join("\n"));
            self.expect_ok(sandbox, "exclude the sandbox's own files", exclude)
                .await?;
        }

        let env = env::watcher_env_file(
            &dir,
            DEFAULT_REMOTE,
            DEFAULT_BRANCH,
            &persistence.token(user),
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
        .env(env::PROJECT_TOKEN, persistence.token(user));
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
    /// The sandbox's id.
    pub sandbox: String,
    /// Its user.
    pub user: UserId,
    /// What provisioning it did.
    pub outcome: BackfillOutcome,
}

/// How one sandbox's back-fill ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackfillOutcome {
    /// Provisioned now: what changed.
    Provisioned(Provisioned),
    /// Nothing to do.
    AlreadyDone,
    /// Provisioning failed: why.
    Failed(String),
}
