//! The seam between orchestration and a sandbox: run a command, read and write a file.
//!
//! The cloud drives E2B sandboxes through this trait; [`LocalSandbox`] runs on this machine
//! for tests and for developers.

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};

/// The cloud process's own secrets, removed from what a [`LocalSandbox`] command inherits.
pub const SERVER_SECRET_VARS: [&str; 3] = [
    crate::token::TOKEN_SECRET_ENV,
    crate::config::SERVICE_TOKEN_ENV,
    crate::webhook::WEBHOOK_SECRET_ENV,
];

/// One command: a shell command line (`sh -c`), its environment, working directory and limit.
/// `Debug` shows the names of the variables, never their values (`PROJECT_TOKEN` is one).
#[derive(Clone)]
pub struct Exec {
    pub command: String,
    pub env: BTreeMap<String, SecretString>,
    pub cwd: Option<PathBuf>,
    pub timeout: Duration,
}

impl Exec {
    pub fn new(command: impl Into<String>, timeout: Duration) -> Self {
        Self {
            command: command.into(),
            env: BTreeMap::new(),
            cwd: None,
            timeout,
        }
    }

    pub fn env(mut self, name: &str, value: impl Into<String>) -> Self {
        self.env
            .insert(name.to_owned(), SecretString::from(value.into()));
        self
    }

    pub fn cwd(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cwd = Some(dir.into());
        self
    }
}

impl std::fmt::Debug for Exec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exec")
            .field("command", &self.command)
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("cwd", &self.cwd)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// How a command ended. `exit_code` is `None` when a signal ended it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    pub exit_code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl ExecOutput {
    pub fn success(&self) -> bool {
        self.exit_code == Some(0)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("sandbox {sandbox}: `{command}` did not finish within {timeout:?}")]
    Timeout {
        sandbox: String,
        command: String,
        timeout: Duration,
    },
    #[error("sandbox {sandbox}: cannot run `{command}`: {source}")]
    Spawn {
        sandbox: String,
        command: String,
        source: io::Error,
    },
    #[error("sandbox {sandbox}: cannot {action} {path}: {source}")]
    File {
        sandbox: String,
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

/// A place where the user's project runs. Implementations must be usable from many tasks.
pub trait Sandbox: Send + Sync {
    /// A stable name: the key for one-sync-at-a-time and for reports.
    fn id(&self) -> &str;

    /// The user's home directory: relative paths in a [`crate::orchestrate::SandboxLayout`]
    /// are taken from here.
    fn home(&self) -> &Path;

    /// Runs a command to its end (or its timeout, which kills it).
    fn exec(&self, exec: &Exec) -> impl Future<Output = Result<ExecOutput, SandboxError>> + Send;

    /// A file's bytes, or `None` when it does not exist.
    fn read_file(
        &self,
        path: &Path,
    ) -> impl Future<Output = Result<Option<Vec<u8>>, SandboxError>> + Send;

    /// Replaces a file (creating its folders), readable by its owner only: the files written
    /// here (`.env`, the watcher's environment) hold secrets.
    fn write_file(
        &self,
        path: &Path,
        contents: &[u8],
    ) -> impl Future<Output = Result<(), SandboxError>> + Send;
}

/// A sandbox that is this machine, with its own home directory (so several can live side by
/// side in one test). Every command gets `HOME` set to it, plus `base_env` (tests put a
/// hermetic git configuration there).
#[derive(Debug, Clone)]
pub struct LocalSandbox {
    id: String,
    home: PathBuf,
    base_env: BTreeMap<String, String>,
}

impl LocalSandbox {
    pub fn new(id: impl Into<String>, home: impl Into<PathBuf>) -> Self {
        let home = home.into();
        let mut base_env = BTreeMap::new();
        base_env.insert("HOME".to_owned(), home.display().to_string());
        Self {
            id: id.into(),
            home,
            base_env,
        }
    }

    pub fn with_env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.base_env.insert(name.into(), value.into());
        self
    }
}

impl Sandbox for LocalSandbox {
    fn id(&self) -> &str {
        &self.id
    }

    fn home(&self) -> &Path {
        &self.home
    }

    async fn exec(&self, exec: &Exec) -> Result<ExecOutput, SandboxError> {
        let mut command = tokio::process::Command::new("sh");
        // The sandbox's commands (the watcher's sync and the dev server it starts) are the
        // user's: this process's secrets must not reach them through the inherited environment.
        for var in SERVER_SECRET_VARS {
            command.env_remove(var);
        }
        command
            .arg("-c")
            .arg(&exec.command)
            .envs(&self.base_env)
            .envs(exec.env.iter().map(|(k, v)| (k, v.expose_secret())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            // Its own process group, so a timeout ends what the shell started too.
            .process_group(0);
        if let Some(dir) = &exec.cwd {
            command.current_dir(dir);
        }
        let child = command.spawn().map_err(|source| SandboxError::Spawn {
            sandbox: self.id.clone(),
            command: exec.command.clone(),
            source,
        })?;
        let group = child.id();
        let output = tokio::time::timeout(exec.timeout, child.wait_with_output())
            .await
            .map_err(|_| {
                if let Some(group) = group {
                    kill_process_group(group);
                }
                SandboxError::Timeout {
                    sandbox: self.id.clone(),
                    command: exec.command.clone(),
                    timeout: exec.timeout,
                }
            })?
            .map_err(|source| SandboxError::Spawn {
                sandbox: self.id.clone(),
                command: exec.command.clone(),
                source,
            })?;
        Ok(ExecOutput {
            exit_code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }

    async fn read_file(&self, path: &Path) -> Result<Option<Vec<u8>>, SandboxError> {
        match tokio::fs::read(path).await {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(self.file_error("read", path, source)),
        }
    }

    async fn write_file(&self, path: &Path, contents: &[u8]) -> Result<(), SandboxError> {
        let path = path.to_owned();
        let contents = contents.to_vec();
        let written = tokio::task::spawn_blocking({
            let path = path.clone();
            move || write_private(&path, &contents)
        })
        .await
        .unwrap_or_else(|join| Err(io::Error::other(join)));
        written.map_err(|source| self.file_error("write", &path, source))
    }
}

impl LocalSandbox {
    fn file_error(&self, action: &'static str, path: &Path, source: io::Error) -> SandboxError {
        SandboxError::File {
            sandbox: self.id.clone(),
            action,
            path: path.to_owned(),
            source,
        }
    }
}

/// SIGKILLs every process in the group (`kill -KILL -- -PGID`): the library forbids `unsafe`,
/// and this runs only after a timeout, so one extra process is cheap.
fn kill_process_group(group: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{group}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Writes through a temp file and a rename, mode 0600 from the start.
fn write_private(path: &Path, contents: &[u8]) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(format!(".tmp.{}", std::process::id()));
    let tmp = PathBuf::from(tmp_name);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(contents)?;
    file.sync_data()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[tokio::test]
    async fn exec_passes_env_and_cwd_and_reports_the_exit_code() {
        let dir = tempfile::tempdir().unwrap();
        let sandbox = LocalSandbox::new("local", std::env::temp_dir()).with_env("BASE", "base");
        let out = sandbox
            .exec(
                &Exec::new(
                    "echo \"$BASE $EXTRA $(pwd)\"; echo oops >&2; exit 7",
                    Duration::from_secs(10),
                )
                .env("EXTRA", "extra")
                .cwd(dir.path()),
            )
            .await
            .unwrap();
        let cwd = dir.path().canonicalize().unwrap();
        assert_eq!(out.stdout, format!("base extra {}\n", cwd.display()));
        assert_eq!(out.stderr, "oops\n");
        assert_eq!(out.exit_code, Some(7));
        assert!(!out.success());
    }

    #[tokio::test]
    async fn exec_past_its_timeout_is_an_error_and_kills_what_it_started() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        let sandbox = LocalSandbox::new("local", dir.path());
        let err = sandbox
            .exec(&Exec::new(
                format!("sleep 30 & echo $! > {}; wait", pid_file.display()),
                Duration::from_millis(300),
            ))
            .await
            .unwrap_err();
        assert!(matches!(err, SandboxError::Timeout { .. }), "{err}");
        let pid = std::fs::read_to_string(&pid_file).unwrap();
        testkit::wait::until(
            Duration::from_secs(10),
            "the background sleep to die",
            || {
                let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim()));
                stat.map_or(true, |s| {
                    s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z'))
                })
                .then_some(())
            },
        );
    }

    #[tokio::test]
    async fn files_round_trip_privately_and_missing_reads_as_none() {
        let dir = tempfile::tempdir().unwrap();
        let sandbox = LocalSandbox::new("local", std::env::temp_dir());
        let path = dir.path().join("a/b/.env");
        assert_eq!(sandbox.read_file(&path).await.unwrap(), None);
        sandbox.write_file(&path, b"KEY=1\n").await.unwrap();
        sandbox.write_file(&path, b"KEY=2\n").await.unwrap();
        assert_eq!(
            sandbox.read_file(&path).await.unwrap(),
            Some(b"KEY=2\n".to_vec())
        );
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn debug_never_shows_env_values() {
        let exec = Exec::new("true", Duration::from_secs(1)).env("PROJECT_TOKEN", "v1.secret");
        let shown = format!("{exec:?}");
        assert!(shown.contains("PROJECT_TOKEN"), "{shown}");
        assert!(!shown.contains("v1.secret"), "{shown}");
    }
}
