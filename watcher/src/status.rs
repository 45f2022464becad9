//! The status file `.git/project-watcher/status.json`: what the watcher is doing, written
//! atomically so a reader never sees half a file.

use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::layout::{self, STATUS, STATUS_RESERVE, state_dir, state_file};
use crate::resources::{self, human_bytes};
/// The kind of a push failure, as `last_push_failure` holds it.
pub use crate::retry::FailureKind;

/// The version every status file and commit trailer carries.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// What the watcher is doing, as the status file's `state` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Everything is saved (and pushed, when there is a remote).
    #[default]
    Idle,
    /// Changes are waiting for the debounce.
    Pending,
    /// A save is running.
    Committing,
    /// A push is running.
    Pushing,
    /// A push failed; the next attempt waits (`last_push_error` says why).
    Backoff,
    /// The remote branch moved on; the saves go to `recovery_ref`.
    Diverged,
    /// A save failed; it is tried again (`last_error` says why).
    Error,
    /// Nothing is saved while the user's git is in the middle of something
    /// (`paused_reason` says what); saving resumes by itself when it is done.
    Paused,
    /// No watcher is running: only `status` says it, of the file a stopped one left.
    Stopped,
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        f.write_str(&s)
    }
}

/// A file left out of the commits, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedFile {
    /// Relative to the project's top.
    pub path: String,
    /// In bytes.
    pub size: u64,
    /// Why it is left out.
    pub reason: String,
}

/// The whole status file. Timestamps are RFC 3339 UTC strings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// Whether a watcher is running on the project (`false` only in what `status` prints).
    #[serde(default = "yes")]
    pub running: bool,
    /// What the watcher is doing.
    pub state: State,
    /// The commit `HEAD` names, as the watcher last saw it.
    pub head: Option<String>,
    /// The branch `HEAD` is on (`None`: detached); its saves go to the remote branch of the
    /// same name.
    #[serde(default)]
    pub branch: Option<String>,
    /// While `state` is `paused`: why (`merge in progress`, `HEAD is detached ...`).
    #[serde(default)]
    pub paused_reason: Option<String>,
    /// When the watcher last made a commit.
    pub last_commit_at: Option<String>,
    /// When a push last succeeded.
    pub last_push_at: Option<String>,
    /// Why the last push failed, until one succeeds.
    pub last_push_error: Option<String>,
    /// What kind of failure `last_push_error` is (`"missing_objects"`, `"network"`, ...).
    #[serde(default)]
    pub last_push_failure: Option<FailureKind>,
    /// Commits on `HEAD` the remote branch lacks.
    pub unpushed_commits: u64,
    /// Files left out of the commits.
    pub skipped_files: Vec<SkippedFile>,
    /// The branch the watcher pushed its commits to after a non-fast-forward rejection.
    #[serde(default)]
    pub recovery_ref: Option<String>,
    /// The latest problem that is not about pushing (watch limit, disk full, ...).
    #[serde(default)]
    pub last_error: Option<String>,
    /// The watcher's process id.
    pub pid: u32,
    /// The watcher's version.
    pub version: String,
    /// The watcher's resident memory, in bytes (`VmRSS`).
    #[serde(default)]
    pub rss_bytes: Option<u64>,
    /// The CPU time the watcher used so far (user + system), in milliseconds.
    #[serde(default)]
    pub cpu_ms: Option<u64>,
    /// Free space on the project's file system, in bytes (what an unprivileged writer can use).
    #[serde(default)]
    pub disk_free_bytes: Option<u64>,
    /// The size of the project's file system, in bytes.
    #[serde(default)]
    pub disk_total_bytes: Option<u64>,
    /// Set while the free space is below the threshold ([`crate::resources::min_free`]),
    /// before the disk is full and saves fail.
    #[serde(default)]
    pub disk_warning: Option<String>,
}

impl Default for Status {
    fn default() -> Self {
        Self {
            running: true,
            state: State::Idle,
            head: None,
            branch: None,
            paused_reason: None,
            last_commit_at: None,
            last_push_at: None,
            last_push_error: None,
            last_push_failure: None,
            unpushed_commits: 0,
            skipped_files: Vec::new(),
            recovery_ref: None,
            last_error: None,
            pid: std::process::id(),
            version: VERSION.to_owned(),
            rss_bytes: None,
            cpu_ms: None,
            disk_free_bytes: None,
            disk_total_bytes: None,
            disk_warning: None,
        }
    }
}

impl Status {
    /// Reads the memory and CPU time of the process `pid` and the free space of the file
    /// system holding `dir` now, and sets or clears the disk warning.
    pub fn measure(&mut self, dir: &Path) {
        if let Some(usage) = resources::process(self.pid) {
            self.rss_bytes = Some(usage.rss_bytes);
            self.cpu_ms = Some(usage.cpu_ms);
        }
        if let Some(space) = resources::disk(dir) {
            self.disk_free_bytes = Some(space.free);
            self.disk_total_bytes = Some(space.total);
            self.disk_warning = resources::disk_warning(space, resources::min_free(space.total));
        }
    }
}

fn yes() -> bool {
    true
}

/// Why the status file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// There is none (the path it was looked for at).
    #[error("no status file at {0}: is a project-watcher running on this repository?")]
    Missing(PathBuf),
    /// It could not be read.
    #[error("cannot read status file {path}: {source}")]
    Io {
        /// The status file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// It is not a status file.
    #[error(
        "status file {path} is corrupt ({source}); the running watcher rewrites it on its next change"
    )]
    Corrupt {
        /// The status file.
        path: PathBuf,
        /// What serde said.
        source: serde_json::Error,
    },
}

/// `.git/project-watcher/status.json` of the repository at `git_dir`.
pub fn status_path(git_dir: &Path) -> PathBuf {
    state_file(git_dir, STATUS)
}

/// Formats a time as RFC 3339 UTC with seconds, the form every timestamp here uses.
pub(crate) fn timestamp(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// Space kept in `.git/project-watcher/status.reserve` so that a full disk can still be
/// reported: the status write that hits ENOSPC frees it and tries again.
const RESERVE_BYTES: usize = 64 * 1024;

/// Writes the status file through a temp file and a rename. On a full disk it spends the
/// reserve to get the news out, and puts the reserve back once there is room again.
pub fn write(git_dir: &Path, status: &Status) -> io::Result<()> {
    layout::create_state_dir(git_dir)?;
    let mut body = serde_json::to_vec_pretty(status).map_err(io::Error::other)?;
    body.push(b'\n');
    let reserve = state_file(git_dir, STATUS_RESERVE);
    match replace(git_dir, &body) {
        Err(e) if e.kind() == io::ErrorKind::StorageFull && fs::remove_file(&reserve).is_ok() => {
            replace(git_dir, &body)
        }
        Err(e) => Err(e),
        Ok(()) => {
            if fs::symlink_metadata(&reserve).is_err()
                && fs::write(&reserve, [0u8; RESERVE_BYTES]).is_err()
            {
                let _ = fs::remove_file(&reserve);
            }
            Ok(())
        }
    }
}

fn replace(git_dir: &Path, body: &[u8]) -> io::Result<()> {
    let tmp = state_dir(git_dir).join(format!("{STATUS}.tmp.{}", std::process::id()));
    let written = fs::File::create(&tmp).and_then(|mut file| {
        file.write_all(body)?;
        file.sync_data()
    });
    if let Err(e) = written.and_then(|()| fs::rename(&tmp, status_path(git_dir))) {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(())
}

/// The status file the watcher of `git_dir` last wrote.
pub fn read(git_dir: &Path) -> Result<Status, StatusError> {
    let path = status_path(git_dir);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(StatusError::Missing(path)),
        Err(source) => return Err(StatusError::Io { path, source }),
    };
    serde_json::from_slice(&bytes).map_err(|source| StatusError::Corrupt { path, source })
}

impl Status {
    /// The human form for a file whose watcher is no longer running: says so instead of
    /// showing its last state and pid as if they were live.
    pub fn stopped(&self) -> Stopped<'_> {
        Stopped(self)
    }

    /// What a stopped watcher's file says now: not running, no process figures, and
    /// `head`/`branch` as the repository has them now (a `restore` may have moved them).
    /// `state` stays the last one the watcher wrote, for [`Status::stopped`]'s human form;
    /// the JSON form says [`State::Stopped`].
    pub fn as_stopped(&mut self, repo: &git2::Repository) {
        self.running = false;
        self.rss_bytes = None;
        self.cpu_ms = None;
        let head = repo.head().ok();
        self.head = head
            .as_ref()
            .and_then(|h| h.target())
            .map(|oid| oid.to_string());
        self.branch = match head {
            Some(head) => head
                .is_branch()
                .then(|| head.shorthand().ok().map(str::to_owned))
                .flatten(),
            // An unborn branch (no commit yet) is still the branch `HEAD` names.
            None => repo.find_reference("HEAD").ok().and_then(|h| {
                h.symbolic_target()
                    .ok()
                    .flatten()
                    .and_then(|t| t.strip_prefix("refs/heads/"))
                    .map(str::to_owned)
            }),
        };
    }
}

impl Status {
    /// What `status` shows of a project no watcher has run on (no status file): not running,
    /// state `stopped`, `head` and `branch` as the repository has them, no pid (0) and no
    /// version (empty).
    pub fn never_ran(repo: &git2::Repository) -> Self {
        let mut status = Self {
            state: State::Stopped,
            pid: 0,
            version: String::new(),
            ..Self::default()
        };
        status.as_stopped(repo);
        status
    }
}

/// See [`Status::stopped`].
pub struct Stopped<'a>(&'a Status);

impl fmt::Display for Stopped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let live = self.0.to_string();
        let mut lines: Vec<&str> = live.lines().collect();
        lines.pop();
        lines.remove(0);
        if self.0.state == State::Stopped {
            writeln!(
                f,
                "state:            stopped (no watcher has run on this project)"
            )?;
            for line in lines.iter().take(2) {
                writeln!(f, "{line}")?;
            }
            return write!(f, "watcher:          not running");
        }
        writeln!(
            f,
            "state:            stopped (no watcher is running; its last state was {})",
            self.0.state
        )?;
        for line in lines {
            writeln!(f, "{line}")?;
        }
        write!(
            f,
            "watcher:          not running (was pid {}, version {})",
            self.0.pid, self.0.version
        )
    }
}

impl fmt::Display for Status {
    /// The human form of `project-watcher status`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let or_never = |v: &Option<String>| v.clone().unwrap_or_else(|| "never".to_owned());
        match (self.state, &self.paused_reason, self.last_push_failure) {
            (State::Paused, Some(reason), _) => {
                writeln!(f, "state:            paused: {reason}")?;
            }
            (State::Backoff, _, Some(failure)) => {
                writeln!(f, "state:            backoff ({})", failure.describe())?;
            }
            (state, _, _) => writeln!(f, "state:            {state}")?,
        }
        writeln!(
            f,
            "branch:           {}",
            self.branch.as_deref().unwrap_or("(none: HEAD is detached)")
        )?;
        writeln!(
            f,
            "head:             {}",
            self.head.as_deref().unwrap_or("(none)")
        )?;
        writeln!(f, "last commit:      {}", or_never(&self.last_commit_at))?;
        writeln!(f, "last push:        {}", or_never(&self.last_push_at))?;
        writeln!(f, "unpushed commits: {}", self.unpushed_commits)?;
        if let Some(err) = &self.last_push_error {
            writeln!(f, "push error:       {err}")?;
        }
        if let Some(r) = &self.recovery_ref {
            writeln!(
                f,
                "recovery branch:  {r} (the remote moved on; run `project-watcher sync`)"
            )?;
        }
        if let Some(err) = &self.last_error {
            writeln!(f, "problem:          {err}")?;
        }
        if let (Some(rss), Some(cpu)) = (self.rss_bytes, self.cpu_ms) {
            writeln!(
                f,
                "memory, CPU:      {} resident, {}.{:03} s CPU",
                human_bytes(rss),
                cpu / 1000,
                cpu % 1000
            )?;
        }
        if let (Some(free), Some(total)) = (self.disk_free_bytes, self.disk_total_bytes) {
            writeln!(
                f,
                "disk:             {} free of {}",
                human_bytes(free),
                human_bytes(total)
            )?;
        }
        if let Some(warning) = &self.disk_warning {
            writeln!(f, "disk warning:     {warning}")?;
        }
        for s in &self.skipped_files {
            writeln!(
                f,
                "skipped:          {} ({} bytes: {})",
                s.path, s.size, s.reason
            )?;
        }
        write!(
            f,
            "watcher:          pid {}, version {}",
            self.pid, self.version
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_then_read_round_trips_and_uses_lowercase_states() {
        let dir = tempfile::tempdir().unwrap();
        let status = Status {
            state: State::Backoff,
            last_push_error: Some("server answered 500".into()),
            unpushed_commits: 3,
            ..Status::default()
        };
        write(dir.path(), &status).unwrap();
        let raw = fs::read_to_string(status_path(dir.path())).unwrap();
        assert!(raw.contains("\"state\": \"backoff\""), "{raw}");
        assert_eq!(read(dir.path()).unwrap(), status);
    }

    #[test]
    fn a_refusal_for_missing_objects_is_said_in_words_in_the_json_and_the_text() {
        let dir = tempfile::tempdir().unwrap();
        let status = Status {
            state: State::Backoff,
            last_push_error: Some(
                "the remote refused the push: missing objects; sending a full pack (...)".into(),
            ),
            last_push_failure: Some(FailureKind::MissingObjects),
            ..Status::default()
        };
        write(dir.path(), &status).unwrap();
        let raw = fs::read_to_string(status_path(dir.path())).unwrap();
        assert!(
            raw.contains("\"last_push_failure\": \"missing_objects\""),
            "{raw}"
        );
        assert_eq!(read(dir.path()).unwrap(), status);
        let text = status.to_string();
        assert!(
            text.starts_with(
                "state:            backoff (the remote refused the push: missing objects)\n"
            ),
            "{text}"
        );
        assert!(text.contains(
            "push error:       the remote refused the push: missing objects; sending a full pack"
        ));
        // A status written before the field existed still reads.
        let old = raw.replace("\"last_push_failure\": \"missing_objects\",", "");
        assert_ne!(old, raw);
        let old: Status = serde_json::from_str(&old).unwrap();
        assert_eq!(old.last_push_failure, None);
    }

    #[test]
    fn corrupt_and_missing_files_are_distinct_errors() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(read(dir.path()), Err(StatusError::Missing(_))));
        layout::create_state_dir(dir.path()).unwrap();
        fs::write(status_path(dir.path()), b"{not json").unwrap();
        assert!(matches!(read(dir.path()), Err(StatusError::Corrupt { .. })));
    }
}
