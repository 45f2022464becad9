//! Time travel for the cloud: [`Orchestrator::history`] lists a user's saves from the upstream
//! (GitLab's API, or the embedded bare repository) without touching the sandbox, so it works
//! for a sandbox that is paused or gone; [`Orchestrator::restore_to`] runs the watcher's
//! `restore --at` in the sandbox, with the status showing it, and reports what it did.

use std::future::Future;

use serde::{Deserialize, Serialize};
use shmastra_contract::manifest::{MANIFEST_FILE, Manifest, ManifestError};
use shmastra_contract::save_message;
use shmastra_contract::{RestoreCommand, SyncFailure};

use super::{
    OrchestrateError, Orchestrator, ProjectHost, SandboxStatus, StatusSink, exit_text, failure_of,
    tail,
};
use crate::gitlab::GitLabError;
use crate::sandbox::{Exec, Sandbox};
use crate::user::UserId;

/// What made a save, read from the watcher's commit trailers by the contract's rules
/// ([`shmastra_contract::save_message::classify`], the same as `project-watcher history`'s).
/// The upstream cannot know which commits a sandbox synced to, so a person's commit is always
/// `other` here.
pub use shmastra_contract::SaveKind;

/// One save in the upstream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Save {
    /// The full commit id.
    pub commit: String,
    /// The commit time, RFC 3339 UTC.
    pub time: String,
    /// What made it.
    pub kind: SaveKind,
    /// The subject line without the `<kind>: ` the watcher starts it with (the kind is
    /// [`Save::kind`]), at most 300 characters, then `…`.
    pub subject: String,
    /// Who made it (the commit's author name, at most 300 characters).
    #[serde(default)]
    pub author: String,
    /// The paths the save changed, as the watcher lists them in its message body (at most 20,
    /// then `... and N more`); empty for a commit the watcher did not make.
    #[serde(default)]
    pub files: Vec<String>,
}

/// Why the history cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// Project persistence is off.
    #[error("project persistence is off: there is no saved history")]
    Off,
    /// GitLab's commits API failed.
    #[error(transparent)]
    GitLab(#[from] GitLabError),
    /// `git log` in the embedded repository failed.
    #[error("cannot read the saved history of user {user}: {reason}")]
    Embedded {
        /// Whose history.
        user: UserId,
        /// What git said.
        reason: String,
    },
    /// A commit time that is not ISO 8601.
    #[error("the upstream answered a commit time that is not ISO 8601: {0}")]
    BadTime(String),
}

/// One commit as a host lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedCommit {
    /// The full commit id.
    pub id: String,
    /// The commit time, ISO 8601.
    pub time: String,
    /// The author's name.
    pub author: String,
    /// The whole message, trailers included.
    pub message: String,
}

/// Where saves are read from: implemented by GitLab and by the embedded upstream (both in
/// `hosts/`).
pub trait SaveHistory: Send + Sync {
    /// The newest `limit` commits of `user`'s project, newest first.
    fn recent_commits(
        &self,
        user: &UserId,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<LoggedCommit>, HistoryError>> + Send;

    /// The bytes of `path` on the saved branch (`main`), `None` when the user has no project,
    /// no saved branch, or no such file there. Never creates anything.
    fn saved_file(
        &self,
        user: &UserId,
        path: &str,
    ) -> impl Future<Output = Result<Option<Vec<u8>>, HistoryError>> + Send;
}

/// Why the saved manifest cannot be told.
#[derive(Debug, thiserror::Error)]
pub enum SavedManifestError {
    /// The upstream cannot be read (or persistence is off).
    #[error(transparent)]
    History(#[from] HistoryError),
    /// The saved `shmastra.json` is not one the cloud accepts.
    #[error("the saved {MANIFEST_FILE} is not valid: {0}")]
    Invalid(#[from] ManifestError),
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

/// Why a restore to an earlier save did not happen (or cannot be told).
#[derive(Debug, thiserror::Error)]
pub enum RestoreToError {
    /// Project persistence is off.
    #[error("project persistence is off: there are no saves to go back to")]
    Off,
    /// The revision, time or path was refused (the watcher's exit 2); nothing changed.
    #[error("cannot restore: {message}")]
    Refused {
        /// The watcher's message.
        message: String,
    },
    /// The restore failed in the sandbox.
    #[error(transparent)]
    Orchestrate(#[from] OrchestrateError),
    /// The watcher's report is not its JSON.
    #[error("the watcher's restore answered something that is not its JSON report: {0}")]
    BadReport(String),
}

/// The most of a subject and of a listed path a [`Save`] carries (the page shows them).
const MAX_SHOWN_SUBJECT: usize = 300;
const MAX_SHOWN_PATH: usize = 500;

/// `text`, cut to `max` characters with `…` when longer.
fn clipped(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
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
            .map(|commit| {
                let LoggedCommit {
                    id,
                    time,
                    author,
                    message,
                } = commit;
                let kind = save_message::classify(&message).unwrap_or(SaveKind::Other);
                let line = message.lines().next().unwrap_or_default();
                Ok(Save {
                    time: utc(&time).ok_or_else(|| HistoryError::BadTime(clipped(&time, 64)))?,
                    kind,
                    files: save_message::listed_files(&message)
                        .iter()
                        .map(|file| clipped(file, MAX_SHOWN_PATH))
                        .collect(),
                    subject: clipped(
                        save_message::subject_without_kind(line, kind),
                        MAX_SHOWN_SUBJECT,
                    ),
                    author: clipped(&author, MAX_SHOWN_SUBJECT),
                    commit: clipped(&id, 64),
                })
            })
            .collect()
    }

    /// The saved branch's `shmastra.json`, read from the upstream before any sandbox exists
    /// (the names the restore form must ask for); `None` when nothing is saved yet.
    pub async fn saved_manifest(
        &self,
        user: &UserId,
    ) -> Result<Option<Manifest>, SavedManifestError> {
        let Some(persistence) = &self.persistence else {
            return Err(HistoryError::Off.into());
        };
        match persistence.host.saved_file(user, MANIFEST_FILE).await? {
            None => Ok(None),
            Some(bytes) => Ok(Some(Manifest::parse(&String::from_utf8_lossy(&bytes))?)),
        }
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
        status.set_status(sandbox.id(), SandboxStatus::restoring_now());
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
                let failure = failure_of(
                    "restore",
                    format!(
                        "project-watcher restore --at exited with {}",
                        exit_text(&out)
                    ),
                    &out,
                );
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

/// An ISO 8601 time with `Z` or an offset, fractions allowed, as RFC 3339 UTC seconds.
/// `at` as RFC 3339 UTC to the second (`2026-11-30T13:05:12Z`), as the history's times read.
pub(crate) fn rfc3339(at: std::time::SystemTime) -> String {
    let seconds = at
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let (year, month, day) = civil_from_days(seconds.div_euclid(86_400));
    let of_day = seconds.rem_euclid(86_400);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60
    )
}

fn utc(text: &str) -> Option<String> {
    let seconds = unix_seconds(text)?;
    let (year, month, day) = civil_from_days(seconds.div_euclid(86_400));
    if !(1970..=9999).contains(&year) {
        return None;
    }
    let of_day = seconds.rem_euclid(86_400);
    Some(format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60
    ))
}

/// An ISO 8601 time with `Z` or an offset, fractions allowed, as seconds since the Unix epoch.
pub(crate) fn unix_seconds(text: &str) -> Option<i64> {
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
    let at = local.split('.').next()?;
    let b = at.as_bytes();
    if b.len() != 19
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let num = |range: std::ops::Range<usize>| -> Option<i64> {
        let digits = at.get(range)?;
        digits.bytes().all(|c| c.is_ascii_digit()).then_some(())?;
        digits.parse().ok()
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month)
        || !(1..=days_in_month(year, month)).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    Some(
        days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second
            - offset_secs,
    )
}

fn days_in_month(year: i64, month: i64) -> i64 {
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The inverse of [`days_from_civil`].
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let days = days + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    (year_of_era + era * 400 + i64::from(month <= 2), month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

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
        check("2024-02-29T23:30:00-01:00", Some("2024-03-01T00:30:00Z"));
        check("2023-02-29T00:00:00Z", None);
        check("2026-13-01T00:00:00Z", None);
        check("2026-11-30T24:00:00Z", None);
        check("2026-11-3XT00:00:00Z", None);
    }

    proptest::proptest! {
        /// humantime (a dev-dependency here) is the oracle: any instant, written with any
        /// offset, comes back as humantime writes it in UTC.
        #[test]
        fn any_time_with_any_offset_becomes_humantimes_utc(
            at in 86_400u64..253_402_200_000,
            offset_minutes in -(23i64 * 60 + 59)..=(23 * 60 + 59),
            fraction in proptest::option::of("[0-9]{1,9}"),
        ) {
            let instant = SystemTime::UNIX_EPOCH + Duration::from_secs(at);
            let expected = humantime::format_rfc3339_seconds(instant).to_string();
            let local = SystemTime::UNIX_EPOCH
                + Duration::from_secs(at.checked_add_signed(offset_minutes * 60).unwrap());
            let local = humantime::format_rfc3339_seconds(local).to_string();
            let sign = if offset_minutes < 0 { '-' } else { '+' };
            let text = format!(
                "{}{}{sign}{:02}:{:02}",
                local.trim_end_matches('Z'),
                fraction.map(|f| format!(".{f}")).unwrap_or_default(),
                offset_minutes.abs() / 60,
                offset_minutes.abs() % 60
            );
            proptest::prop_assert_eq!(utc(&text), Some(expected.clone()), "{}", text);
            proptest::prop_assert_eq!(rfc3339(instant), expected);
        }
    }
}
