//! What a sandbox's state is and how a sync ended: the words orchestration reports, the store
//! keeps for every replica, and the page shows.

use shmastra_contract::SyncFailure;

/// A sandbox's state as the workspace page shows it. Stored as JSON tagged by `state`:
/// `{"state": "broken", "failure": {"step": ..., "message": ..., "first": ..., "tail": ...}}`
/// (`first` left out when empty). `syncing` and `restoring` carry `since`, when they began
/// (RFC 3339); JSON stored before it existed reads as `since: None`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum SandboxStatus {
    /// Bringing the sandbox to a pushed branch (`project-watcher sync`), since then.
    Syncing {
        /// When the sync began, RFC 3339 (`None` in statuses stored without it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        since: Option<String>,
        /// The step under way, one of [`shmastra_contract::failure::SYNC_STEPS`], once the
        /// sandbox's watcher has told it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        step: Option<String>,
    },
    /// Going back to an earlier save (`Orchestrator::restore_to`), since then.
    Restoring {
        /// When the restore began, RFC 3339 (`None` in statuses stored without it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        since: Option<String>,
    },
    /// The project is up and saved.
    Ready,
    /// The dev server was started (after re-provisioning, the restore form or a sync) and
    /// the sandbox waits for its health check to answer before it is `Ready`.
    Starting {
        /// The health URL asked, inside the sandbox.
        url: String,
    },
    /// The sync (or a restore) failed: the step, the message and the output tail.
    Broken {
        /// What failed, as the sync failure file (or the cloud itself) says it.
        failure: SyncFailure,
    },
    /// Re-provisioning a lost sandbox, at this step.
    Provisioning {
        /// The step under way.
        step: ProvisionStep,
    },
    /// The saved project needs these secrets (`shmastra.json`) before the new sandbox can
    /// start: the restore form must ask the user for them.
    NeedsSecrets {
        /// The names the form asks for (`NAME`, or `FILE:NAME` for other env files).
        names: Vec<String>,
    },
    /// Recovery stopped after losing the sandbox too often; `reason` says how often.
    NeedsAttention {
        /// The message of the recovery that gave up.
        reason: String,
    },
}

/// How a sync ended for the caller's event: the outcome of the run that covered it (the
/// caller's own run, or the run its trigger coalesced into). Stored as JSON tagged by
/// `outcome`: `{"outcome": "failed", "failure": {"step": ..., "message": ..., "tail": ...}}`
/// (and `first`, as in [`SandboxStatus`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum SyncOutcome {
    /// The sandbox holds the saved branch; `commit` is its `HEAD` after the sync, when the
    /// sandbox could tell (`None` with the feature off or before the first save).
    Synced {
        /// The project's `HEAD` after the sync.
        commit: Option<String>,
    },
    /// The sync failed (the sandbox's status is `Broken` with the same failure).
    Failed {
        /// The step, message and output tail of the failure.
        failure: SyncFailure,
    },
}

impl SandboxStatus {
    /// `Syncing`, begun now.
    pub fn syncing_now() -> SandboxStatus {
        SandboxStatus::Syncing {
            since: Some(now()),
            step: None,
        }
    }

    /// `Restoring`, begun now.
    pub fn restoring_now() -> SandboxStatus {
        SandboxStatus::Restoring { since: Some(now()) }
    }

    /// When a `Syncing` or `Restoring` status began, if it says.
    pub fn since(&self) -> Option<&str> {
        match self {
            SandboxStatus::Syncing { since, .. } | SandboxStatus::Restoring { since } => {
                since.as_deref()
            }
            _ => None,
        }
    }
}

fn now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

impl SyncOutcome {
    /// The sandbox's status after a run that ended so.
    pub(crate) fn status(&self) -> SandboxStatus {
        match self {
            SyncOutcome::Synced { .. } => SandboxStatus::Ready,
            SyncOutcome::Failed { failure } => SandboxStatus::Broken {
                failure: failure.clone(),
            },
        }
    }
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
    /// Records `status` as `sandbox`'s current one. Must return quickly: it is called from
    /// inside a sync.
    fn set_status(&self, sandbox: &str, status: SandboxStatus);
}

impl<T: StatusSink + ?Sized> StatusSink for std::sync::Arc<T> {
    fn set_status(&self, sandbox: &str, status: SandboxStatus) {
        (**self).set_status(sandbox, status);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_round_trip_through_json() {
        for status in [
            SandboxStatus::Ready,
            SandboxStatus::syncing_now(),
            SandboxStatus::Restoring { since: None },
            SandboxStatus::Broken {
                failure: SyncFailure::new("install", "`npm ci` failed").with_tail(["npm ERR!"]),
            },
            SandboxStatus::Provisioning {
                step: ProvisionStep::Restoring,
            },
            SandboxStatus::NeedsSecrets {
                names: vec!["API_KEY".into()],
            },
            SandboxStatus::Starting {
                url: "http://localhost:4111/health".into(),
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
        assert_eq!(
            serde_json::from_str::<SandboxStatus>(r#"{"state": "syncing"}"#).unwrap(),
            SandboxStatus::Syncing {
                since: None,
                step: None
            },
            "a status stored before `since` still reads"
        );
        let since = SandboxStatus::restoring_now()
            .since()
            .map(str::to_owned)
            .unwrap();
        let began = humantime::parse_rfc3339(&since).unwrap();
        assert!(began.elapsed().unwrap_or_default() < std::time::Duration::from_secs(60));
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
