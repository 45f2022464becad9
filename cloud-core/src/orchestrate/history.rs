//! Time travel for the cloud: [`Orchestrator::history`] lists a user's saves from the upstream
//! (GitLab's API, or the embedded bare repository) without touching the sandbox, so it works
//! for a sandbox that is paused or gone; [`Orchestrator::restore_to`] runs the watcher's
//! `restore --at` in the sandbox, with the status showing it, and reports what it did.

use std::future::Future;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use shmastra_contract::{RestoreCommand, SyncFailure};

use super::{
    OrchestrateError, Orchestrator, ProjectHost, SandboxStatus, StatusSink, exit_text, tail,
};
use crate::UserId;
use crate::gitlab::{GitLab, GitLabError};
use crate::sandbox::{Exec, Sandbox};

/// What made a save, read from the watcher's commit trailers (`Saved-by:
/// project-watcher/<version>`, `Save-kind: <kind>`) by the same rules as `project-watcher
/// history`. The upstream cannot know which commits a sandbox synced to, so a person's commit
/// is always `other` here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SaveKind {
    Autosave,
    Restore,
    Sync,
    Backup,
    Other,
}

/// One save in the upstream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Save {
    /// The full commit id.
    pub commit: String,
    /// The commit time, RFC 3339 UTC.
    pub time: String,
    pub kind: SaveKind,
    /// The subject line.
    pub subject: String,
}

#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("project persistence is off: there is no saved history")]
    Off,
    #[error(transparent)]
    GitLab(#[from] GitLabError),
    #[error("cannot read the saved history of user {user}: {reason}")]
    Embedded { user: UserId, reason: String },
    #[error("the upstream answered a commit time that is not ISO 8601: {0}")]
    BadTime(String),
}

/// Where saves are read from: implemented by [`GitLab`] and by the embedded upstream
/// (`proxy/embedded.rs`).
pub trait SaveHistory: Send + Sync {
    /// The newest `limit` commits of `user`'s project, newest first: `(id, ISO 8601 time,
    /// message)`.
    fn recent_commits(
        &self,
        user: &UserId,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<(String, String, String)>, HistoryError>> + Send;
}

impl SaveHistory for GitLab {
    async fn recent_commits(
        &self,
        user: &UserId,
        limit: usize,
    ) -> Result<Vec<(String, String, String)>, HistoryError> {
        Ok(GitLab::recent_commits(self, user, limit)
            .await?
            .into_iter()
            .map(|c| (c.id, c.committed_date, c.message))
            .collect())
    }
}

/// What `restore_to` did, as the watcher's `restore --at --json` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoredTo {
    /// The save the tree (or the paths) came from.
    pub from: String,
    /// Its time, RFC 3339 UTC.
    pub from_time: String,
    /// The autosave of edits that were not saved yet, made first.
    pub saved_first: Option<String>,
    /// The new save of kind `restore`; `None` when the tree already was as at `from`.
    pub commit: Option<String>,
    /// The paths the restore changed.
    pub files: Vec<String>,
    /// Whether the sandbox's watcher was running, and so pushes the new save.
    pub watcher_running: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum RestoreToError {
    #[error("project persistence is off: there are no saves to go back to")]
    Off,
    /// The revision, time or path was refused (the watcher's exit 2); nothing changed.
    #[error("cannot restore: {message}")]
    Refused { message: String },
    #[error(transparent)]
    Orchestrate(#[from] OrchestrateError),
    #[error("the watcher's restore answered something that is not its JSON report: {0}")]
    BadReport(String),
}

impl<H: ProjectHost + SaveHistory> Orchestrator<H> {
    /// The newest `limit` saves of `user`'s project, newest first, from the upstream alone.
    pub async fn history(&self, user: &UserId, limit: usize) -> Result<Vec<Save>, HistoryError> {
        let Some(persistence) = &self.persistence else {
            return Err(HistoryError::Off);
        };
        persistence
            .host
            .recent_commits(user, limit)
            .await?
            .into_iter()
            .map(|(commit, time, message)| {
                Ok(Save {
                    time: utc(&time).ok_or_else(|| HistoryError::BadTime(time.clone()))?,
                    kind: classify(&message),
                    subject: message.lines().next().unwrap_or_default().to_owned(),
                    commit,
                })
            })
            .collect()
    }
}

impl<H: ProjectHost> Orchestrator<H> {
    /// Runs `project-watcher restore --at REV [--path P ...]` in the sandbox: the tree (or the
    /// paths) becomes what it was at that save, as a new save that the running watcher pushes.
    /// The status shows `restoring`, then `ready`; `broken` only when the restore failed
    /// after it began (a refused revision or path changes nothing and leaves it `ready`).
    pub async fn restore_to<S: Sandbox>(
        &self,
        sandbox: &S,
        user: &UserId,
        rev: &str,
        paths: &[String],
        status: &impl StatusSink,
    ) -> Result<RestoredTo, RestoreToError> {
        if self.persistence.is_none() {
            return Err(RestoreToError::Off);
        }
        status.set_status(sandbox.id(), SandboxStatus::Restoring);
        let dir = sandbox.home().join(&self.layout.project_dir);
        let command = RestoreCommand::new(dir.display().to_string()).at(rev, paths);
        let exec = Exec::new(
            command.shell(&self.layout.watcher_bin),
            self.layout.sync_timeout,
        );
        let out = match self.in_project(sandbox, exec).await {
            Ok(out) => out,
            Err(e) => {
                status.set_status(
                    sandbox.id(),
                    SandboxStatus::Broken {
                        failure: SyncFailure::new("restore", e.to_string()),
                    },
                );
                return Err(e.into());
            }
        };
        match out.exit_code {
            Some(0) => {
                status.set_status(sandbox.id(), SandboxStatus::Ready);
                tracing::info!(sandbox = sandbox.id(), user = %user, rev, "restored to an earlier save");
                serde_json::from_str(&out.stdout)
                    .map_err(|e| RestoreToError::BadReport(format!("{e}: {}", out.stdout.trim())))
            }
            Some(2) => {
                status.set_status(sandbox.id(), SandboxStatus::Ready);
                Err(RestoreToError::Refused {
                    message: out
                        .stderr
                        .trim()
                        .trim_start_matches("project-watcher: ")
                        .to_owned(),
                })
            }
            _ => {
                let failure = SyncFailure {
                    step: "restore".to_owned(),
                    message: format!(
                        "project-watcher restore --at exited with {}",
                        exit_text(&out)
                    ),
                    tail: tail(&out),
                };
                status.set_status(sandbox.id(), SandboxStatus::Broken { failure });
                Err(OrchestrateError::Command {
                    sandbox: sandbox.id().to_owned(),
                    step: "restore to an earlier save",
                    exit: exit_text(&out),
                    tail: tail(&out),
                }
                .into())
            }
        }
    }
}

/// The kind of a save from its message, as `project-watcher history` reads it: the watcher's
/// trailers in the last paragraph; older saves without `Save-kind` by their subject.
pub fn classify(message: &str) -> SaveKind {
    let last_paragraph = message.trim_end().rsplit("\n\n").next().unwrap_or_default();
    let mut by_watcher = false;
    let mut kind = None;
    for line in last_paragraph.lines() {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("Saved-by") && value.starts_with("project-watcher/") {
            by_watcher = true;
        } else if name.eq_ignore_ascii_case("Save-kind") {
            kind = match value {
                "autosave" => Some(SaveKind::Autosave),
                "restore" => Some(SaveKind::Restore),
                "backup" => Some(SaveKind::Backup),
                "sync" => Some(SaveKind::Sync),
                "other" => Some(SaveKind::Other),
                _ => None,
            };
        }
    }
    if !by_watcher {
        return SaveKind::Other;
    }
    kind.unwrap_or(if message.starts_with("backup:") {
        SaveKind::Backup
    } else {
        SaveKind::Autosave
    })
}

/// An ISO 8601 time with `Z` or an offset, fractions allowed, as RFC 3339 UTC seconds.
fn utc(text: &str) -> Option<String> {
    let text = text.trim();
    let (local, offset_secs) = if let Some(local) = text.strip_suffix('Z') {
        (local, 0i64)
    } else {
        let (local, tz) = text.split_at(text.len().checked_sub(6)?);
        let sign = match tz.as_bytes().first()? {
            b'+' => 1,
            b'-' => -1,
            _ => return None,
        };
        let hours: i64 = tz.get(1..3)?.parse().ok()?;
        let minutes: i64 = tz.get(4..6)?.parse().ok()?;
        (local, sign * (hours * 3600 + minutes * 60))
    };
    let seconds_part = local.split('.').next()?;
    let parsed = humantime::parse_rfc3339(&format!("{seconds_part}Z")).ok()?;
    let shift = Duration::from_secs(offset_secs.unsigned_abs());
    let at: SystemTime = if offset_secs >= 0 {
        parsed.checked_sub(shift)?
    } else {
        parsed.checked_add(shift)?
    };
    Some(humantime::format_rfc3339_seconds(at).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_become_utc() {
        let check = |input: &str, expected: Option<&str>| {
            assert_eq!(utc(input).as_deref(), expected, "{input}");
        };
        check("2026-11-30T13:05:12Z", Some("2026-11-30T13:05:12Z"));
        check("2026-11-30T14:05:12+01:00", Some("2026-11-30T13:05:12Z"));
        check(
            "2026-11-30T14:05:12.000+01:00",
            Some("2026-11-30T13:05:12Z"),
        );
        check("2026-11-30T08:35:12-04:30", Some("2026-11-30T13:05:12Z"));
        check("yesterday", None);
        check("2026-11-30T14:05:12", None);
    }

    #[test]
    fn kinds_follow_the_watcher_trailers() {
        let check = |message: &str, expected: SaveKind| {
            assert_eq!(classify(message), expected, "{message:?}");
        };
        check(
            "autosave: a.ts\n\na.ts\n\nSaved-by: project-watcher/0.1.0\nSave-kind: autosave\n",
            SaveKind::Autosave,
        );
        check(
            "restore: the project as at 1a2b3c4 (2026-11-30T13:05:12Z)\n\na.ts\n\nSaved-by: project-watcher/0.1.0\nSave-kind: restore\nRestored-from: 1a2b\n",
            SaveKind::Restore,
        );
        check(
            "backup: unsaved work before sync\n\nSaved-by: project-watcher/0.1.0\n",
            SaveKind::Backup,
        );
        check(
            "autosave: 1 files changed\n\na.ts\n\nSaved-by: project-watcher/0.1.0\n",
            SaveKind::Autosave,
        );
        check("fix the weather tool\n", SaveKind::Other);
        check(
            "Saved-by: project-watcher/1\n\nthe trailer is not in the last paragraph\n",
            SaveKind::Other,
        );
    }
}
