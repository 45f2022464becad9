//! The control API's request and response bodies: its own types, converted from the
//! orchestration's, so the wire format (and the OpenAPI document generated from these types)
//! changes only when this file does.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use shmastra_contract::{Manifest, SyncFailure};
use utoipa::ToSchema;

use crate::orchestrate::history::{RestoredTo, Save};
use crate::orchestrate::lifecycle::Reprovisioned;
use crate::secrets::SecretValue;
use crate::status::{ProvisionStep, SandboxStatus, SyncOutcome};

/// `POST /users/{user}/sandbox`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProvisionRequest {
    /// The restore form: each name the manifest lists (`GET .../manifest`) with its value.
    /// Checked as the workspace page checks its form (every name, nothing else, no NUL byte,
    /// 64 KiB a value, 1 MiB in all); the values go to the sandbox's env files only, never
    /// stored or logged. Leave it out when the project needs no secrets or the sandbox exists;
    /// a project that needs them then ends in `needs_secrets`.
    #[schema(value_type = Option<BTreeMap<String, String>>)]
    #[serde(default)]
    pub secrets: Option<Secrets>,
}

/// The restore form's fields, in the order sent, duplicates kept (so they can be refused).
/// `Debug` shows the names only.
#[derive(Default)]
pub struct Secrets(pub Vec<(String, SecretValue)>);

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(name, _)| name))
            .finish()
    }
}

impl<'de> Deserialize<'de> for Secrets {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Secrets, D::Error> {
        struct Fields;
        impl<'de> Visitor<'de> for Fields {
            type Value = Secrets;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of secret names and their string values")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Secrets, A::Error> {
                let mut fields = Vec::new();
                while let Some((name, value)) = map.next_entry::<String, String>()? {
                    fields.push((name, SecretValue::new(value)));
                }
                Ok(Secrets(fields))
            }
        }
        deserializer.deserialize_map(Fields)
    }
}

/// What a provision did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProvisionOutcome {
    /// A new sandbox, restored from the saved branch, the watcher started.
    Created,
    /// The sandbox's unfinished restore was finished.
    Restored,
    /// The sandbox was there; the watcher was checked (`watcher_started` says whether it had to
    /// be started).
    Present,
}

/// A provision's result.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ProvisionResult {
    /// What it did.
    pub outcome: ProvisionOutcome,
    /// Whether the watcher was (re)started.
    pub watcher_started: bool,
}

impl From<Reprovisioned> for ProvisionResult {
    fn from(done: Reprovisioned) -> Self {
        match done {
            Reprovisioned::Created => ProvisionResult {
                outcome: ProvisionOutcome::Created,
                watcher_started: true,
            },
            Reprovisioned::Restored => ProvisionResult {
                outcome: ProvisionOutcome::Restored,
                watcher_started: true,
            },
            Reprovisioned::Present(done) => ProvisionResult {
                outcome: ProvisionOutcome::Present,
                watcher_started: done.watcher_started,
            },
        }
    }
}

/// A failed step: what failed, why, and the end of its output.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Failure {
    /// The step (`fetch`, `install`, `restore`, ...).
    pub step: String,
    /// What went wrong.
    pub message: String,
    /// The first lines of the step's output that read as errors, at most 8 (may be empty):
    /// the cause a long tail pushes out, such as npm's `Missing: ... from lock file`.
    pub first: String,
    /// The last lines of the step's output (may be empty).
    pub tail: String,
}

impl From<SyncFailure> for Failure {
    fn from(f: SyncFailure) -> Self {
        Failure {
            step: f.step,
            message: f.message,
            first: f.first,
            tail: f.tail,
        }
    }
}

/// How a sync ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SyncOutcomeWord {
    /// The sandbox holds the saved branch.
    Synced,
    /// The sync failed (`failure` says where); the sandbox's status is `broken`.
    Failed,
}

/// A sync's result: the run that covered the request.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SyncResult {
    /// How it ended.
    pub outcome: SyncOutcomeWord,
    /// The project's `HEAD` after the sync, when the sandbox could tell.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// With `failed`: the step, message and output tail.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
}

impl From<SyncOutcome> for SyncResult {
    fn from(outcome: SyncOutcome) -> Self {
        match outcome {
            SyncOutcome::Synced { commit } => SyncResult {
                outcome: SyncOutcomeWord::Synced,
                commit,
                failure: None,
            },
            SyncOutcome::Failed { failure } => SyncResult {
                outcome: SyncOutcomeWord::Failed,
                commit: None,
                failure: Some(failure.into()),
            },
        }
    }
}

/// `POST /users/{user}/restore`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RestoreRequest {
    /// The save to go back to: a commit id or unique prefix, an RFC 3339 time, or a duration
    /// ago (`10m`, `2h`): the newest save at or before it (as `project-watcher restore --at`).
    pub at: String,
    /// Only these paths (relative to the project) go back; empty: the whole project.
    #[serde(default)]
    pub paths: Vec<String>,
}

/// A restore's result, as the watcher reports it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RestoreResult {
    /// The save the tree (or the paths) came from.
    pub from: String,
    /// Its time (RFC 3339 UTC).
    pub from_time: String,
    /// The autosave of unsaved edits made first.
    pub saved_first: Option<String>,
    /// The new save of kind `restore`; `null` when the project already was as at `from`.
    pub commit: Option<String>,
    /// The paths the restore changed.
    pub files: Vec<String>,
    /// Whether the sandbox's watcher runs, and so pushes the new save.
    pub watcher_running: bool,
}

impl From<RestoredTo> for RestoreResult {
    fn from(done: RestoredTo) -> Self {
        RestoreResult {
            from: done.from,
            from_time: done.from_time,
            saved_first: done.saved_first,
            commit: done.commit,
            files: done.files,
            watcher_running: done.watcher_running,
        }
    }
}

/// A sandbox's state, as the workspace page shows it.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum SandboxState {
    /// Bringing the sandbox to a pushed branch.
    Syncing {
        /// When the sync began, RFC 3339 UTC (absent in statuses stored before it was kept).
        #[serde(skip_serializing_if = "Option::is_none")]
        since: Option<String>,
        /// The step under way (`fetch`, `install`, ...), once the sandbox has told it.
        #[serde(skip_serializing_if = "Option::is_none")]
        step: Option<String>,
    },
    /// Going back to an earlier save.
    Restoring {
        /// When the restore began, RFC 3339 UTC (absent in statuses stored before it was kept).
        #[serde(skip_serializing_if = "Option::is_none")]
        since: Option<String>,
    },
    /// The project is up and saved.
    Ready,
    /// The dev server was started and its health check has not answered yet.
    Starting {
        /// The health URL asked, inside the sandbox.
        url: String,
    },
    /// The sync or a restore failed.
    Broken {
        /// Where and why.
        failure: Failure,
    },
    /// Making the sandbox, at this step.
    Provisioning {
        /// `creating`, `restoring` or `starting`.
        step: String,
    },
    /// The saved project needs these secrets: provision again with them.
    NeedsSecrets {
        /// The restore form's names.
        names: Vec<String>,
    },
    /// Recovery stopped after losing the sandbox too often.
    NeedsAttention {
        /// How often.
        reason: String,
    },
}

impl From<SandboxStatus> for SandboxState {
    fn from(status: SandboxStatus) -> Self {
        match status {
            SandboxStatus::Syncing { since, step } => SandboxState::Syncing { since, step },
            SandboxStatus::Restoring { since } => SandboxState::Restoring { since },
            SandboxStatus::Ready => SandboxState::Ready,
            SandboxStatus::Starting { url } => SandboxState::Starting { url },
            SandboxStatus::Broken { failure } => SandboxState::Broken {
                failure: failure.into(),
            },
            SandboxStatus::Provisioning { step } => SandboxState::Provisioning {
                step: match step {
                    ProvisionStep::Creating => "creating",
                    ProvisionStep::Restoring => "restoring",
                    ProvisionStep::Starting => "starting",
                }
                .to_owned(),
            },
            SandboxStatus::NeedsSecrets { names } => SandboxState::NeedsSecrets { names },
            SandboxStatus::NeedsAttention { reason } => SandboxState::NeedsAttention { reason },
        }
    }
}

/// `GET /users/{user}/sandbox`, and each event of `.../sandbox/events`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SandboxView {
    /// Whose.
    pub user: String,
    /// Whether this server runs sandboxes at all.
    pub sandboxes: bool,
    /// The latest state; `null` before anything happened to the sandbox on this server.
    pub status: Option<SandboxState>,
}

/// One save, newest first in a history.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SaveView {
    /// The full commit id.
    pub commit: String,
    /// The commit time (RFC 3339 UTC).
    pub time: String,
    /// `autosave`, `restore`, `backup`, `sync` or `other` (a commit the watcher did not make).
    pub kind: String,
    /// The subject line.
    pub subject: String,
    /// The paths it changed, as the watcher lists them (at most 20, then `... and N more`).
    pub files: Vec<String>,
}

impl From<Save> for SaveView {
    fn from(save: Save) -> Self {
        SaveView {
            kind: serde_json::to_value(save.kind)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            commit: save.commit,
            time: save.time,
            subject: save.subject,
            files: save.files,
        }
    }
}

/// `GET /users/{user}/history`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct HistoryView {
    /// The newest saves first.
    pub saves: Vec<SaveView>,
}

/// `GET /users/{user}/manifest`: what the restore form must ask for, from the saved branch.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ManifestView {
    /// Whether the saved branch holds a `shmastra.json` (false for a new user).
    pub saved: bool,
    /// The form's names: the `.env` names, then `FILE:NAME` for each other env file's.
    pub names: Vec<String>,
    /// The `.env` names.
    pub env: Vec<String>,
    /// The other root env files' names, by file.
    pub env_files: BTreeMap<String, Vec<String>>,
}

impl ManifestView {
    /// The view of `manifest` (`None`: nothing saved).
    pub fn of(manifest: Option<Manifest>) -> ManifestView {
        let saved = manifest.is_some();
        let manifest = manifest.unwrap_or_default();
        ManifestView {
            saved,
            names: manifest.form_names(),
            env: manifest.env().to_vec(),
            env_files: manifest.env_files().clone(),
        }
    }
}

/// `POST /users/{user}/login-links`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LoginLinkRequest {
    /// How long the link may wait to be opened, in seconds (default 900, at most 86400).
    #[serde(default)]
    pub ttl_seconds: Option<u64>,
}

/// A one-use sign-in link to the user's workspace page.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LoginLink {
    /// Open it once, within the lifetime.
    pub url: String,
    /// When it stops working (RFC 3339 UTC).
    pub expires_at: String,
}

/// `POST /users/{user}/token/rotate`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RotatedToken {
    /// The user's new token generation: every earlier token is refused from now on.
    pub generation: u64,
    /// The new `PROJECT_TOKEN` (the git password of the user's project through this server).
    pub token: String,
    /// The provision that gives the sandbox's watcher the new token; `null` without a sandbox.
    pub operation: Option<super::operations::Operation>,
}
