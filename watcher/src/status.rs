//! The status file `.git/project-watcher/status.json`: what the watcher is doing, written
//! atomically so a reader never sees half a file.

use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::lock::state_dir;
use crate::resources::{self, human_bytes};

/// The version every status file and commit trailer carries.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum State {
    #[default]
    Idle,
    Pending,
    Committing,
    Pushing,
    Backoff,
    Diverged,
    Error,
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
    pub path: String,
    pub size: u64,
    pub reason: String,
}

/// The whole status file. Timestamps are RFC 3339 UTC strings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub state: State,
    pub head: Option<String>,
    pub last_commit_at: Option<String>,
    pub last_push_at: Option<String>,
    pub last_push_error: Option<String>,
    pub unpushed_commits: u64,
    pub skipped_files: Vec<SkippedFile>,
    /// The branch the watcher pushed its commits to after a non-fast-forward rejection.
    #[serde(default)]
    pub recovery_ref: Option<String>,
    /// The latest problem that is not about pushing (watch limit, disk full, ...).
    #[serde(default)]
    pub last_error: Option<String>,
    pub pid: u32,
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
            state: State::Idle,
            head: None,
            last_commit_at: None,
            last_push_at: None,
            last_push_error: None,
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

#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error("no status file at {0}: is a project-watcher running on this repository?")]
    Missing(PathBuf),
    #[error("cannot read status file {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error(
        "status file {path} is corrupt ({source}); the running watcher rewrites it on its next change"
    )]
    Corrupt {
        path: PathBuf,
        source: serde_json::Error,
    },
}

pub fn status_path(git_dir: &Path) -> PathBuf {
    state_dir(git_dir).join("status.json")
}

/// Formats a time as RFC 3339 UTC with seconds, the form every timestamp here uses.
pub fn timestamp(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// Space kept in `.git/project-watcher/status.reserve` so that a full disk can still be
/// reported: the status write that hits ENOSPC frees it and tries again.
const RESERVE_BYTES: usize = 64 * 1024;

/// Writes the status file through a temp file and a rename. On a full disk it spends the
/// reserve to get the news out, and puts the reserve back once there is room again.
pub fn write(git_dir: &Path, status: &Status) -> io::Result<()> {
    let dir = state_dir(git_dir);
    crate::lock::create_state_dir(&dir)?;
    let mut body = serde_json::to_vec_pretty(status).map_err(io::Error::other)?;
    body.push(b'\n');
    let reserve = dir.join("status.reserve");
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
    let tmp = state_dir(git_dir).join(format!("status.json.tmp.{}", std::process::id()));
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
}

/// See [`Status::stopped`].
pub struct Stopped<'a>(&'a Status);

impl fmt::Display for Stopped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let live = self.0.to_string();
        let mut lines: Vec<&str> = live.lines().collect();
        lines.pop();
        lines.remove(0);
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
        writeln!(f, "state:            {}", self.state)?;
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
    fn corrupt_and_missing_files_are_distinct_errors() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(read(dir.path()), Err(StatusError::Missing(_))));
        fs::create_dir_all(state_dir(dir.path())).unwrap();
        fs::write(status_path(dir.path()), b"{not json").unwrap();
        assert!(matches!(read(dir.path()), Err(StatusError::Corrupt { .. })));
    }
}
