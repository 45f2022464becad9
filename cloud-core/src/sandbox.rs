//! The seam between orchestration and a sandbox: run a command, read and write a file.
//!
//! The cloud drives E2B sandboxes through this trait; [`LocalSandbox`] runs on this machine
//! for tests and for developers. A sandbox can vanish (wiped after a long pause, or lost by its
//! provider): every call then fails with [`SandboxError::Gone`], which recovery tells apart from
//! a command that failed or timed out (see [`crate::provider`]).

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};

use crate::env_names::SERVER_SECRET_VARS;

/// One command: a shell command line (`sh -c`), its environment, working directory and limit.
/// `Debug` shows the names of the variables, never their values (`PROJECT_TOKEN` is one).
#[derive(Clone)]
pub struct Exec {
    /// The command line, run with `sh -c`.
    pub command: String,
    /// Variables set for the command, on top of the sandbox's own.
    pub env: BTreeMap<String, SecretString>,
    /// Where it runs; the sandbox's default when `None`.
    pub cwd: Option<PathBuf>,
    /// How long it may run before it is killed.
    pub timeout: Duration,
}

impl Exec {
    /// `command` with no variables of its own, in the default directory.
    pub fn new(command: impl Into<String>, timeout: Duration) -> Self {
        Self {
            command: command.into(),
            env: BTreeMap::new(),
            cwd: None,
            timeout,
        }
    }

    /// Sets `name` for the command.
    pub fn env(mut self, name: &str, value: impl Into<String>) -> Self {
        self.env
            .insert(name.to_owned(), SecretString::from(value.into()));
        self
    }

    /// Runs the command in `dir`.
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
    /// The exit status; `None` after a signal.
    pub exit_code: Option<i32>,
    /// What the command printed (lossy UTF-8).
    pub stdout: String,
    /// What the command printed to stderr (lossy UTF-8).
    pub stderr: String,
}

impl ExecOutput {
    /// Exited 0.
    pub fn success(&self) -> bool {
        self.exit_code == Some(0)
    }
}

/// Why a call into a sandbox failed.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The sandbox no longer exists (or its provider does not know it): nothing run in it can
    /// succeed until a new one is created.
    #[error("sandbox {sandbox} is gone")]
    Gone {
        /// The sandbox's id.
        sandbox: String,
    },
    /// A command ran past its limit and was killed.
    #[error("sandbox {sandbox}: `{command}` did not finish within {timeout:?}")]
    Timeout {
        /// The sandbox's id.
        sandbox: String,
        /// The command line.
        command: String,
        /// Its limit.
        timeout: Duration,
    },
    /// A command could not be started.
    #[error("sandbox {sandbox}: cannot run `{command}`: {source}")]
    Spawn {
        /// The sandbox's id.
        sandbox: String,
        /// The command line.
        command: String,
        /// Why it could not start.
        source: io::Error,
    },
    /// The server is stopping: no more commands start (see [`Gate`]).
    #[error("sandbox {sandbox}: the server is stopping, no command starts now")]
    Closed {
        /// The sandbox's id.
        sandbox: String,
    },
    /// A file could not be read or written.
    #[error("sandbox {sandbox}: cannot {action} {path}: {source}")]
    File {
        /// The sandbox's id.
        sandbox: String,
        /// `read` or `write`.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// Why it failed.
        source: io::Error,
    },
    /// The provider cannot be asked now (a network failure, its rate limit, an outage, a
    /// stream that broke): the sandbox itself may be fine, and the same call may work later.
    #[error("sandbox {sandbox}: {source}")]
    Unavailable {
        /// The sandbox's name.
        sandbox: String,
        /// The provider's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The provider refuses for a reason someone must fix (its credentials, the template,
    /// the team's quota of sandboxes).
    #[error("sandbox {sandbox}: {source}")]
    Refused {
        /// The sandbox's name.
        sandbox: String,
        /// The provider's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl SandboxError {
    /// Whether the sandbox itself is gone, as opposed to one command or file failing in it.
    pub fn is_gone(&self) -> bool {
        matches!(self, Self::Gone { .. })
    }

    /// Whether the same call may succeed later without anyone changing anything.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Timeout { .. } | Self::Unavailable { .. })
    }
}

/// A place where the user's project runs. Implementations must be usable from many tasks.
pub trait Sandbox: Send + Sync {
    /// A stable name: the key for one-sync-at-a-time, statuses and reports. Sandboxes from a
    /// [`crate::provider::SandboxProvider`] are named after their user, so a re-created sandbox
    /// keeps its name.
    fn id(&self) -> &str;

    /// The user's home directory: relative paths in a [`crate::orchestrate::SandboxLayout`]
    /// are taken from here.
    fn home(&self) -> &Path;

    /// Runs a command to its end (or its timeout, which kills it). A sandbox that vanished
    /// before or while the command ran answers [`SandboxError::Gone`], not the command's failure.
    fn exec(&self, exec: &Exec) -> impl Future<Output = Result<ExecOutput, SandboxError>> + Send;

    /// A file's bytes, or `None` when it does not exist.
    fn read_file(
        &self,
        path: &Path,
    ) -> impl Future<Output = Result<Option<Vec<u8>>, SandboxError>> + Send;

    /// A file's bytes, or `None` when it does not exist, asked for once of the sandbox as it
    /// is: unlike [`Sandbox::read_file`], one that does not answer (paused, resuming) is
    /// neither woken nor waited for, so that a reader beside a running command never races
    /// that command's own recovery.
    fn peek_file(
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
/// hermetic git configuration there). The home directory is the sandbox: once it no longer
/// exists, every call answers [`SandboxError::Gone`] (removing it is a wipe).
#[derive(Debug, Clone)]
pub struct LocalSandbox {
    id: String,
    home: PathBuf,
    base_env: BTreeMap<String, String>,
    /// The uid and gid every command and file access runs as, when the sandbox has a user of
    /// its own (`serve --sandboxes-dir` as root).
    owner: Option<(u32, u32)>,
    /// Whether its commands start from a cleared environment (see [`CLEARED_BASE_ENV`]).
    cleared_env: bool,
    /// Shared by the sandboxes of one server, which closes it when it stops.
    gate: Option<Arc<Gate>>,
}

/// What lets a server stop its sandboxes' processes for good: once closed, no command starts
/// (a background task's `start watcher` after the stop would leave a watcher running).
#[derive(Debug, Default)]
pub struct Gate {
    closed: AtomicBool,
    /// Held shared by each command while it runs.
    running: tokio::sync::RwLock<()>,
}

impl Gate {
    /// Refuses every command from now on, then waits up to `patience` for the running ones.
    pub async fn close(&self, patience: Duration) {
        self.closed.store(true, Ordering::SeqCst);
        if tokio::time::timeout(patience, self.running.write())
            .await
            .is_err()
        {
            tracing::warn!(patience = %shmastra_contract::duration::short_duration(patience), "sandbox commands still run as the server stops");
        }
    }
}

/// What a command of a sandbox with a cleared environment inherits from this process (besides
/// the sandbox's own variables): nothing else of the server's environment reaches it.
const CLEARED_BASE_ENV: [&str; 4] = ["PATH", "LANG", "LC_ALL", "TZ"];

impl LocalSandbox {
    /// The sandbox `id` at home `home` (`HOME` for its commands).
    pub fn new(id: impl Into<String>, home: impl Into<PathBuf>) -> Self {
        let home = home.into();
        let mut base_env = BTreeMap::new();
        base_env.insert("HOME".to_owned(), home.display().to_string());
        Self {
            id: id.into(),
            home,
            base_env,
            owner: None,
            cleared_env: false,
            gate: None,
        }
    }

    /// Its commands pass `gate`: none starts once it is closed ([`SandboxError::Closed`]).
    pub fn with_gate(mut self, gate: Arc<Gate>) -> Self {
        self.gate = Some(gate);
        self
    }

    /// The same sandbox, its commands never refused: the server's own stop of its processes.
    pub fn ungated(mut self) -> Self {
        self.gate = None;
        self
    }

    /// Every command runs, and every file is read and written, as `uid`:`gid` (with no
    /// supplementary groups), with a cleared environment: the sandbox's code cannot read this
    /// process's memory, environment or files, nor another sandbox's. This process must be
    /// root.
    pub fn run_as(mut self, uid: u32, gid: u32) -> Self {
        self.owner = Some((uid, gid));
        self.with_cleared_env()
    }

    /// Commands get `PATH`, `LANG`, `LC_ALL`, `TZ` and the sandbox's own variables, nothing
    /// else of this process's environment (no `DATABASE_URL`, no token state, no secret);
    /// otherwise they inherit it, the server's secrets removed.
    pub fn with_cleared_env(mut self) -> Self {
        self.cleared_env = true;
        self
    }

    /// Sets `name` for every command of this sandbox.
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
        let _running = match &self.gate {
            Some(gate) => {
                let running = gate.running.read().await;
                if gate.closed.load(Ordering::SeqCst) {
                    return Err(SandboxError::Closed {
                        sandbox: self.id.clone(),
                    });
                }
                Some(running)
            }
            None => None,
        };
        self.ensure_present().await?;
        let ran = self.run(exec).await;
        // A wipe during the command makes it fail in whatever way it happens to: the missing
        // home, not that failure, is what the caller must hear about.
        match ran {
            Ok(out) if out.success() => Ok(out),
            other => {
                self.ensure_present().await?;
                other
            }
        }
    }

    /// The same as [`Sandbox::read_file`]: this machine has no pause to wake from.
    async fn peek_file(&self, path: &Path) -> Result<Option<Vec<u8>>, SandboxError> {
        self.read_file(path).await
    }

    async fn read_file(&self, path: &Path) -> Result<Option<Vec<u8>>, SandboxError> {
        self.ensure_present().await?;
        if self.owner.is_some() {
            return self.read_as_owner(path).await;
        }
        match tokio::fs::read(path).await {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) => {
                self.ensure_present().await?;
                match e.kind() {
                    io::ErrorKind::NotFound => Ok(None),
                    _ => Err(self.file_error("read", path, e)),
                }
            }
        }
    }

    async fn write_file(&self, path: &Path, contents: &[u8]) -> Result<(), SandboxError> {
        self.ensure_present().await?;
        if self.owner.is_some() {
            return self.write_as_owner(path, contents).await;
        }
        let path = path.to_owned();
        let contents = contents.to_vec();
        let home = self.home.clone();
        let written = tokio::task::spawn_blocking({
            let path = path.clone();
            move || write_private(&home, &path, &contents)
        })
        .await
        .unwrap_or_else(|join| Err(io::Error::other(join)));
        match written {
            Ok(()) => Ok(()),
            Err(source) => {
                self.ensure_present().await?;
                Err(self.file_error("write", &path, source))
            }
        }
    }
}

impl LocalSandbox {
    /// [`SandboxError::Gone`] unless the home directory exists.
    async fn ensure_present(&self) -> Result<(), SandboxError> {
        match tokio::fs::metadata(&self.home).await {
            Ok(meta) if meta.is_dir() => Ok(()),
            _ => Err(SandboxError::Gone {
                sandbox: self.id.clone(),
            }),
        }
    }

    /// `sh -c command` as the sandbox's user, or as this process with its secrets removed.
    fn shell(&self, command: &str) -> tokio::process::Command {
        let mut shell = tokio::process::Command::new("sh");
        if self.cleared_env {
            shell.env_clear();
            for name in CLEARED_BASE_ENV {
                if let Some(value) = std::env::var_os(name) {
                    shell.env(name, value);
                }
            }
        } else {
            // The sandbox's commands (the watcher's sync and the dev server it starts) are the
            // user's: this process's secrets must not reach them through the inherited
            // environment.
            for var in SERVER_SECRET_VARS {
                shell.env_remove(var);
            }
        }
        if let Some((uid, gid)) = self.owner {
            shell.uid(uid).gid(gid).current_dir(&self.home);
        }
        shell.arg("-c").arg(command).envs(&self.base_env);
        shell
    }

    /// A file read by the sandbox's user (`cat`): a link it planted leads only where that user
    /// may read.
    async fn read_as_owner(&self, path: &Path) -> Result<Option<Vec<u8>>, SandboxError> {
        const ABSENT: i32 = 66;
        let out = self
            .shell("if [ -e \"$1\" ]; then exec cat -- \"$1\"; else exit 66; fi")
            .arg("sh")
            .arg(path)
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|e| self.file_error("read", path, e))?;
        match out.status.code() {
            Some(0) => Ok(Some(out.stdout)),
            Some(ABSENT) => {
                self.ensure_present().await?;
                Ok(None)
            }
            _ => {
                self.ensure_present().await?;
                Err(self.file_error(
                    "read",
                    path,
                    io::Error::other(String::from_utf8_lossy(&out.stderr).trim().to_owned()),
                ))
            }
        }
    }

    /// A file written by the sandbox's user: through a temp file and a rename, mode 0600,
    /// folders made below the home (which the user cannot re-create once it is gone).
    async fn write_as_owner(&self, path: &Path, contents: &[u8]) -> Result<(), SandboxError> {
        use tokio::io::AsyncWriteExt as _;
        let mut child = self
            .shell(
                "umask 077; mkdir -p -- \"$(dirname -- \"$1\")\" && t=\"$1.tmp.$$\" && cat > \"$t\" && mv -f -- \"$t\" \"$1\"",
            )
            .arg("sh")
            .arg(path)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| self.file_error("write", path, e))?;
        let mut stdin = child.stdin.take().expect("stdin is piped");
        let fed = stdin.write_all(contents).await;
        drop(stdin);
        let out = child
            .wait_with_output()
            .await
            .map_err(|e| self.file_error("write", path, e))?;
        if out.status.success() && fed.is_ok() {
            return Ok(());
        }
        self.ensure_present().await?;
        Err(self.file_error(
            "write",
            path,
            io::Error::other(String::from_utf8_lossy(&out.stderr).trim().to_owned()),
        ))
    }

    async fn run(&self, exec: &Exec) -> Result<ExecOutput, SandboxError> {
        let mut command = self.shell(&exec.command);
        command
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
                    crate::process_group::kill(group);
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

    fn file_error(&self, action: &'static str, path: &Path, source: io::Error) -> SandboxError {
        SandboxError::File {
            sandbox: self.id.clone(),
            action,
            path: path.to_owned(),
            source,
        }
    }
}

/// Writes through a temp file and a rename, mode 0600 from the start. Missing folders are
/// created, but never `home` itself: a write racing a wipe must not bring back an empty home.
fn write_private(home: &Path, path: &Path, contents: &[u8]) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        create_dirs_below(home, dir)?;
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

/// `create_dir_all(dir)`, except that below `home` each level is made with `create_dir`, which
/// fails when its parent (ultimately `home`) is gone instead of re-creating it.
fn create_dirs_below(home: &Path, dir: &Path) -> io::Result<()> {
    let Ok(below) = dir.strip_prefix(home) else {
        return std::fs::create_dir_all(dir);
    };
    let mut current = home.to_owned();
    for part in below.components() {
        current.push(part);
        match std::fs::create_dir(&current) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[tokio::test]
    async fn a_closed_gate_waits_for_the_running_command_and_starts_no_other() {
        let home = tempfile::tempdir().unwrap();
        let gate = Arc::new(Gate::default());
        let sandbox = LocalSandbox::new("local", home.path()).with_gate(gate.clone());
        let (started, done) = (home.path().join("started"), home.path().join("done"));
        let slow = Exec::new(
            format!(
                "touch '{}'; sleep 0.3; touch '{}'",
                started.display(),
                done.display()
            ),
            Duration::from_secs(30),
        );
        let running = tokio::spawn({
            let sandbox = sandbox.clone();
            async move { sandbox.exec(&slow).await }
        });
        testkit::wait::until_async(Duration::from_secs(30), "the command to start", || {
            let seen = started.exists();
            async move { seen.then_some(()) }
        })
        .await;
        gate.close(Duration::from_secs(30)).await;
        assert!(
            done.exists(),
            "close returned before the running command ended"
        );
        assert!(running.await.unwrap().unwrap().success());
        let refused = sandbox
            .exec(&Exec::new("true", Duration::from_secs(5)))
            .await;
        assert!(
            matches!(refused, Err(SandboxError::Closed { .. })),
            "{refused:?}"
        );
        let stop = Exec::new("true", Duration::from_secs(5));
        assert!(sandbox.ungated().exec(&stop).await.unwrap().success());
    }

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

    #[tokio::test]
    async fn a_removed_home_is_gone_for_every_call_and_a_write_does_not_bring_it_back() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("sandbox");
        std::fs::create_dir_all(home.join("project")).unwrap();
        let sandbox = LocalSandbox::new("alice", &home);
        std::fs::remove_dir_all(&home).unwrap();

        let exec = Exec::new("true", Duration::from_secs(10));
        let errors = [
            sandbox.exec(&exec).await.unwrap_err(),
            sandbox
                .read_file(&home.join("project/a"))
                .await
                .unwrap_err(),
            sandbox
                .write_file(&home.join("project/a"), b"x")
                .await
                .unwrap_err(),
        ];
        for err in errors {
            assert!(err.is_gone(), "{err}");
            assert_eq!(err.to_string(), "sandbox alice is gone");
        }
        assert!(!home.exists());
    }

    #[tokio::test]
    async fn a_command_that_fails_because_its_sandbox_vanished_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("sandbox");
        std::fs::create_dir_all(&home).unwrap();
        let sandbox = LocalSandbox::new("alice", &home);
        let err = sandbox
            .exec(&Exec::new(
                "rm -rf \"$HOME\"; cat \"$HOME/missing\"",
                Duration::from_secs(10),
            ))
            .await
            .unwrap_err();
        assert!(err.is_gone(), "{err}");
    }

    #[tokio::test]
    async fn a_failing_command_in_a_present_sandbox_is_not_gone() {
        let dir = tempfile::tempdir().unwrap();
        let sandbox = LocalSandbox::new("alice", dir.path());
        let out = sandbox
            .exec(&Exec::new("exit 3", Duration::from_secs(10)))
            .await
            .unwrap();
        assert_eq!(out.exit_code, Some(3));
        let err = sandbox
            .exec(&Exec::new("sleep 5", Duration::from_millis(100)))
            .await
            .unwrap_err();
        assert!(matches!(err, SandboxError::Timeout { .. }), "{err}");
        sandbox
            .write_file(&dir.path().join("a/b"), b"x")
            .await
            .unwrap();
        assert_eq!(std::fs::read(dir.path().join("a/b")).unwrap(), b"x");
        std::fs::create_dir(dir.path().join("c")).unwrap();
        let err = sandbox.read_file(&dir.path().join("c")).await.unwrap_err();
        assert!(matches!(err, SandboxError::File { .. }), "{err}");
    }

    #[test]
    fn debug_never_shows_env_values() {
        let exec = Exec::new("true", Duration::from_secs(1)).env("PROJECT_TOKEN", "v1.secret");
        let shown = format!("{exec:?}");
        assert!(shown.contains("PROJECT_TOKEN"), "{shown}");
        assert!(!shown.contains("v1.secret"), "{shown}");
    }
}
