//! The operator's view of every user's sandbox at E2B (`shmastra-cloud sandboxes ...`):
//! provision one, back-fill all (the source document's back-fill of sandboxes that predate
//! persistence: each one's repository, its `PROJECT_TOKEN` in the watcher's environment, the
//! `project` remote, the watcher started; idempotent), and the status of all (E2B's state, the
//! watcher's last push and unpushed commits).
//!
//! The sandboxes are those the store records and those E2B lists with a user in their
//! metadata (under `shmastraUser`, or the key the sandboxes of an earlier system use).

use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::e2b::provider::USER_METADATA;
use crate::e2b::{E2bProvider, E2bSandbox, SandboxState};
use crate::host::ProjectHost;
use crate::orchestrate::Orchestrator;
use crate::orchestrate::error::OrchestrateError;
use crate::orchestrate::history::unix_seconds;
use crate::orchestrate::provision::{BackfillEntry, BackfillOutcome, Provisioned};
use crate::sandbox::{Exec, Sandbox, SandboxError};
use crate::user::UserId;

/// One sandbox of the fleet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FleetSandbox {
    /// Its user.
    #[serde(serialize_with = "user_id")]
    pub user: UserId,
    /// Its id at E2B.
    pub sandbox_id: String,
    /// What E2B says of it; `None`: recorded, but E2B lists no such sandbox.
    pub state: Option<SandboxState>,
}

/// What the watcher in a running sandbox reports (`project-watcher status --json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WatcherReport {
    /// A watcher holds the project's instance lock.
    pub running: bool,
    /// Its state (`idle`, `pending`, `pushing`, ...), as it last wrote it.
    pub state: String,
    /// When a push last succeeded.
    pub last_push_at: Option<String>,
    /// How long ago that was.
    pub last_push_age_secs: Option<u64>,
    /// Commits on `HEAD` the remote branch lacks.
    pub unpushed_commits: u64,
    /// Why the last push failed, until one succeeds.
    pub last_push_error: Option<String>,
}

/// One line of `sandboxes status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SandboxReport {
    /// The sandbox.
    #[serde(flatten)]
    pub sandbox: FleetSandbox,
    /// The watcher's report, for a running sandbox whose watcher wrote one.
    pub watcher: Option<WatcherReport>,
    /// Why there is no report (paused, gone, no status file, unreachable).
    pub note: Option<String>,
}

/// The operator's commands over the E2B sandboxes.
pub struct Fleet<H> {
    provider: E2bProvider,
    orchestrator: Orchestrator<H>,
    user_key: String,
}

impl<H: ProjectHost> Fleet<H> {
    /// The fleet of `provider`'s sandboxes, provisioned by `orchestrator`.
    pub fn new(provider: E2bProvider, orchestrator: Orchestrator<H>) -> Fleet<H> {
        Fleet {
            provider,
            orchestrator,
            user_key: USER_METADATA.to_owned(),
        }
    }

    /// Finds a listed sandbox's user under metadata `key` instead of `shmastraUser`.
    pub fn with_user_key(mut self, key: &str) -> Fleet<H> {
        self.user_key = key.to_owned();
        self
    }

    /// Every sandbox, by user: the ones E2B lists with a user, and the ones only the store
    /// records.
    pub async fn sandboxes(&self) -> Result<Vec<FleetSandbox>, SandboxError> {
        let listed = self
            .provider
            .listed_sandboxes(&self.user_key)
            .await
            .map_err(|e| unavailable("E2B", e))?;
        let recorded = self
            .provider
            .recorded_sandboxes()
            .await
            .map_err(|e| unavailable("the store", e))?;
        let mut all: Vec<FleetSandbox> = listed
            .into_iter()
            .map(|(user, info)| FleetSandbox {
                user,
                sandbox_id: info.sandbox_id,
                state: Some(info.state),
            })
            .collect();
        for (user, sandbox_id) in recorded {
            if !all.iter().any(|s| s.sandbox_id == sandbox_id) {
                all.push(FleetSandbox {
                    user,
                    sandbox_id,
                    state: None,
                });
            }
        }
        all.sort_by(|a, b| (&a.user, &a.sandbox_id).cmp(&(&b.user, &b.sandbox_id)));
        Ok(all)
    }

    /// Provisions the user's sandbox (resumed when paused), found as [`Fleet::sandboxes`]
    /// finds them. A user without one is [`SandboxError::Gone`]: nothing is created.
    pub async fn provision(&self, user: &UserId) -> Result<Provisioned, OrchestrateError> {
        let found = self
            .sandboxes()
            .await?
            .into_iter()
            .find(|s| s.user == *user)
            .ok_or_else(|| SandboxError::Gone {
                sandbox: user.to_string(),
            })?;
        self.provision_one(&found).await
    }

    /// Provisions every sandbox (paused ones are resumed for it), one after the other; one
    /// failure does not stop the rest. `progress` hears of each as it is done, with its place
    /// and the count.
    pub async fn backfill(
        &self,
        mut progress: impl FnMut(usize, usize, &BackfillEntry),
    ) -> Result<Vec<BackfillEntry>, SandboxError> {
        let sandboxes = self.sandboxes().await?;
        let count = sandboxes.len();
        let mut report = Vec::with_capacity(count);
        for (n, found) in sandboxes.into_iter().enumerate() {
            let outcome = match self.provision_one(&found).await {
                Ok(done) if done.changed_anything() => BackfillOutcome::Provisioned(done),
                Ok(_) => BackfillOutcome::AlreadyDone,
                Err(e) => {
                    tracing::warn!(user = %found.user, sandbox = %found.sandbox_id, error = %e, "back-fill failed for this sandbox");
                    BackfillOutcome::Failed(e.to_string())
                }
            };
            let entry = BackfillEntry {
                sandbox: found.sandbox_id,
                user: found.user,
                outcome,
            };
            progress(n + 1, count, &entry);
            report.push(entry);
        }
        Ok(report)
    }

    async fn provision_one(&self, found: &FleetSandbox) -> Result<Provisioned, OrchestrateError> {
        let id = self.provider.adopt(&found.user, &found.sandbox_id).await?;
        if id != found.sandbox_id {
            return Err(OrchestrateError::Sandbox(SandboxError::Refused {
                sandbox: found.user.to_string(),
                source: format!(
                    "sandbox {} is not {}'s recorded sandbox ({id}): left alone",
                    found.sandbox_id, found.user
                )
                .into(),
            }));
        }
        let sandbox = self.provider.open_sandbox(&found.user, &id).await?;
        self.orchestrator.provision(&sandbox, &found.user).await
    }

    /// Every sandbox's state, and for a running one its watcher's report. A paused sandbox is
    /// left paused.
    pub async fn status(&self) -> Result<Vec<SandboxReport>, SandboxError> {
        let mut reports = Vec::new();
        for sandbox in self.sandboxes().await? {
            let (watcher, note) = match sandbox.state {
                Some(SandboxState::Running) => {
                    match self
                        .provider
                        .open_sandbox(&sandbox.user, &sandbox.sandbox_id)
                        .await
                    {
                        Ok(open) => match self.watcher_report(&open).await {
                            Ok(report) => (Some(report), None),
                            Err(why) => (None, Some(why)),
                        },
                        Err(e) => (None, Some(e.to_string())),
                    }
                }
                Some(SandboxState::Paused) => (None, Some("paused: not resumed to look".into())),
                None => (None, Some("recorded, but E2B does not list it".into())),
            };
            reports.push(SandboxReport {
                sandbox,
                watcher,
                note,
            });
        }
        Ok(reports)
    }

    async fn watcher_report(&self, sandbox: &E2bSandbox) -> Result<WatcherReport, String> {
        let layout = self.orchestrator.layout();
        let dir = sandbox.home().join(&layout.project_dir);
        let exec = Exec::new(
            format!(
                "{} status --json --dir '{}'",
                layout.watcher_bin,
                dir.display().to_string().replace('\'', "'\\''")
            ),
            layout.command_timeout,
        );
        let out = sandbox.exec(&exec).await.map_err(|e| e.to_string())?;
        let running = out.success();
        let status: serde_json::Value = serde_json::from_str(&out.stdout).map_err(|_| {
            let said = out.stderr.trim();
            if said.is_empty() {
                format!(
                    "the watcher's status is not readable: {}",
                    out.stdout.trim()
                )
            } else {
                said.to_owned()
            }
        })?;
        let text = |field: &str| status[field].as_str().map(str::to_owned);
        let last_push_at = text("last_push_at");
        Ok(WatcherReport {
            running,
            state: text("state").unwrap_or_default(),
            last_push_age_secs: last_push_at.as_deref().and_then(age_secs),
            last_push_at,
            unpushed_commits: status["unpushed_commits"].as_u64().unwrap_or_default(),
            last_push_error: text("last_push_error"),
        })
    }
}

/// Seconds from an RFC 3339 time until now (zero for one in the future).
fn age_secs(at: &str) -> Option<u64> {
    let then = unix_seconds(at)?;
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs();
    Some(now.saturating_sub(u64::try_from(then).ok()?))
}

fn user_id<S: serde::Serializer>(user: &UserId, out: S) -> Result<S::Ok, S::Error> {
    out.serialize_str(user.as_str())
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> SandboxError {
    SandboxError::Unavailable {
        sandbox: "every sandbox".into(),
        source: format!("cannot list the sandboxes from {what}: {e}").into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_count_from_now() {
        assert_eq!(age_secs("2999-01-01T00:00:00Z"), Some(0));
        assert!(age_secs("1970-01-01T00:00:00Z").unwrap() > 1_700_000_000);
        assert_eq!(age_secs("yesterday"), None);
    }
}
