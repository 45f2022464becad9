//! [`E2bSandbox`]: the [`Sandbox`] trait over one E2B sandbox.
//!
//! A failure is never taken at its word when the sandbox may only be paused or briefly
//! unroutable: the proxy's 502 "The sandbox was not found", a stream that broke or went
//! silent, are confirmed with `GET /sandboxes/{id}`: 404 is [`SandboxError::Gone`] (a kill, or
//! a snapshot that expired); `paused` is resumed by `connect` and the call goes on (a command
//! that had started is followed again by its pid through `process.Process/Connect`, since the
//! memory snapshot kept it running; one that had not is started); `running` goes on the same
//! way. At most [`MAX_RECOVERIES`] times per call, then the call is
//! [`SandboxError::Unavailable`]. Before a command whose limit could outlast the sandbox's
//! timeout, `connect` extends the timeout (connect only ever extends it).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use secrecy::ExposeSecret;
use tokio::time::Instant;

use super::api::{ControlPlane, SandboxAccess, SandboxState};
use super::envd::{Collected, Command, Envd, Interrupted, MIN_ENVD_VERSION, version_at_least};
use super::{E2bError, E2bSettings};
use crate::sandbox::{Exec, ExecOutput, Sandbox, SandboxError};

/// How many times one call confirms the sandbox's state and goes on before it gives up.
pub const MAX_RECOVERIES: u32 = 3;
/// Kept on top of a command's limit when the sandbox's timeout is extended for it.
const TIMEOUT_MARGIN: Duration = Duration::from_secs(60);
/// The wait before trying again when the control plane says running and the proxy said not.
const ROUTE_SETTLE: Duration = Duration::from_millis(500);
/// The limit of the shell commands a file write runs around its upload.
const FILE_COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// One E2B sandbox, named after its user. Cheap to clone; clones share the envd client and
/// what is known of the sandbox's timeout.
#[derive(Clone)]
pub struct E2bSandbox {
    inner: Arc<Inner>,
}

struct Inner {
    name: String,
    sandbox_id: String,
    home: PathBuf,
    api: ControlPlane,
    settings: Arc<E2bSettings>,
    user: String,
    /// The timeout every `connect` asks for (the sandbox lives at least this long after it).
    keep: Duration,
    envd: Mutex<Envd>,
    alive_until: Mutex<Instant>,
}

impl std::fmt::Debug for E2bSandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("E2bSandbox")
            .field("name", &self.inner.name)
            .field("sandbox_id", &self.inner.sandbox_id)
            .field("home", &self.inner.home)
            .finish_non_exhaustive()
    }
}

/// What the control plane said about a sandbox a call failed on.
enum Confirmed {
    Running,
    Resumed,
}

impl E2bSandbox {
    /// A sandbox reached with `access` (from create or connect, which left it alive for at
    /// least `keep`), its user's home at `home`.
    pub(crate) fn new(
        name: &str,
        access: &SandboxAccess,
        home: PathBuf,
        api: ControlPlane,
        settings: Arc<E2bSettings>,
        user: &str,
        keep: Duration,
    ) -> Result<E2bSandbox, SandboxError> {
        if !version_at_least(&access.envd_version, MIN_ENVD_VERSION) {
            return Err(SandboxError::Refused {
                sandbox: name.to_owned(),
                source: Box::new(E2bError::EnvdTooOld {
                    sandbox: access.sandbox_id.clone(),
                    version: access.envd_version.clone(),
                    minimum: MIN_ENVD_VERSION,
                }),
            });
        }
        let envd = envd_for(&settings, access, user).map_err(|e| refused(name, e))?;
        Ok(E2bSandbox {
            inner: Arc::new(Inner {
                name: name.to_owned(),
                sandbox_id: access.sandbox_id.clone(),
                home,
                api,
                settings,
                user: user.to_owned(),
                keep,
                envd: Mutex::new(envd),
                alive_until: Mutex::new(Instant::now() + keep),
            }),
        })
    }

    /// The sandbox's id at E2B.
    pub fn sandbox_id(&self) -> &str {
        &self.inner.sandbox_id
    }

    fn envd(&self) -> Envd {
        self.inner
            .envd
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Makes sure the sandbox lives at least `needed` (plus a margin) from now.
    async fn keep_alive_for(&self, needed: Duration) -> Result<(), SandboxError> {
        let until = *self
            .inner
            .alive_until
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if Instant::now() + needed + TIMEOUT_MARGIN <= until {
            return Ok(());
        }
        self.connect(self.inner.keep.max(needed + TIMEOUT_MARGIN))
            .await
            .map(|_| ())
    }

    /// `connect` (which resumes a paused sandbox and extends its timeout to `timeout`), and
    /// the access it hands out from now on.
    async fn connect(&self, timeout: Duration) -> Result<Confirmed, SandboxError> {
        let (connected, access) = self
            .inner
            .api
            .connect(&self.inner.sandbox_id, timeout)
            .await
            .map_err(|e| self.failure(e))?;
        *self
            .inner
            .alive_until
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Instant::now() + timeout;
        let envd = envd_for(&self.inner.settings, &access, &self.inner.user)
            .map_err(|e| self.failure(e))?;
        *self.inner.envd.lock().unwrap_or_else(|p| p.into_inner()) = envd;
        Ok(match connected {
            super::Connected::Running => Confirmed::Running,
            super::Connected::Resumed => Confirmed::Resumed,
        })
    }

    /// Asks the control plane what became of the sandbox after `error`: gone, paused (then
    /// resumed here) or running. `Ok`: the call may go on.
    async fn recover(&self, error: E2bError, recoveries: &mut u32) -> Result<(), SandboxError> {
        let confirmable = matches!(
            &error,
            E2bError::NotRunning { .. }
                | E2bError::StreamBroken { .. }
                | E2bError::StreamIdle { .. }
                | E2bError::EnvdUnauthorized { .. }
        ) || matches!(&error, E2bError::Rpc { code, .. } if code == "unavailable" || code == "unknown");
        if !confirmable || *recoveries >= MAX_RECOVERIES {
            return Err(self.failure(error));
        }
        *recoveries += 1;
        let state = self
            .inner
            .api
            .get(&self.inner.sandbox_id)
            .await
            .map_err(|e| self.failure(e))?;
        let confirmed = match state.map(|s| s.state) {
            None => {
                return Err(SandboxError::Gone {
                    sandbox: self.inner.name.clone(),
                });
            }
            Some(SandboxState::Paused) => self.connect(self.inner.keep).await?,
            // A refused token is asked for again; a running sandbox the proxy did not find is
            // given a moment to become routable.
            Some(SandboxState::Running) if matches!(error, E2bError::EnvdUnauthorized { .. }) => {
                self.connect(self.inner.keep).await?
            }
            Some(SandboxState::Running) => Confirmed::Running,
        };
        match confirmed {
            Confirmed::Resumed => {
                tracing::info!(sandbox = %self.inner.name, id = %self.inner.sandbox_id, error = %error, "the sandbox was paused; resumed it");
            }
            Confirmed::Running => {
                tracing::warn!(sandbox = %self.inner.name, id = %self.inner.sandbox_id, error = %error, "a call to a running sandbox failed; trying again");
                if matches!(error, E2bError::NotRunning { .. }) {
                    tokio::time::sleep(ROUTE_SETTLE).await;
                }
            }
        }
        Ok(())
    }

    fn failure(&self, error: E2bError) -> SandboxError {
        let sandbox = self.inner.name.clone();
        match error {
            E2bError::NotFound { .. } => SandboxError::Gone { sandbox },
            e if e.is_setup() => refused(&sandbox, e),
            e => SandboxError::Unavailable {
                sandbox,
                source: Box::new(e),
            },
        }
    }

    fn path_str<'a>(&self, action: &'static str, path: &'a Path) -> Result<&'a str, SandboxError> {
        path.to_str().ok_or_else(|| SandboxError::File {
            sandbox: self.inner.name.clone(),
            action,
            path: path.to_owned(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "not UTF-8"),
        })
    }

    async fn run(&self, command: &Command<'_>) -> Result<ExecOutput, SandboxError> {
        self.keep_alive_for(command.timeout).await?;
        let deadline = Instant::now() + command.timeout;
        let timeout = || SandboxError::Timeout {
            sandbox: self.inner.name.clone(),
            command: command.line.to_owned(),
            timeout: command.timeout,
        };
        let mut collected = Collected::default();
        let mut recoveries = 0;
        loop {
            let envd = self.envd();
            let opened = match collected.pid {
                None => envd.start(command).await,
                Some(pid) => envd.reconnect(pid, command.line).await,
            };
            let waited = match opened {
                Ok(mut stream) => stream.wait(&mut collected, deadline).await,
                Err(e) => Err(Interrupted::Broken(e)),
            };
            let error = match waited {
                Ok(end) => {
                    return Ok(ExecOutput {
                        exit_code: end.code(),
                        stdout: String::from_utf8_lossy(&collected.stdout).into_owned(),
                        stderr: String::from_utf8_lossy(&collected.stderr).into_owned(),
                    });
                }
                Err(Interrupted::Deadline) => return Err(timeout()),
                Err(Interrupted::Broken(error)) => error,
            };
            if Instant::now() >= deadline {
                return Err(timeout());
            }
            match (&error, collected.pid) {
                // envd refused to start it (a missing working directory): the command's own
                // failure, as a spawn error is on this machine.
                (E2bError::Rpc { code, message, .. }, None) if code == "invalid_argument" => {
                    return Err(SandboxError::Spawn {
                        sandbox: self.inner.name.clone(),
                        command: command.line.to_owned(),
                        source: std::io::Error::other(message.clone()),
                    });
                }
                // The process is no longer known after a resume: its end cannot be learned.
                (E2bError::Rpc { code, .. }, Some(pid)) if code == "not_found" => {
                    return Err(SandboxError::Unavailable {
                        sandbox: self.inner.name.clone(),
                        source: format!(
                            "`{}` (pid {pid}) is no longer known to envd after its stream broke; its outcome is unknown",
                            command.line
                        )
                        .into(),
                    });
                }
                _ => self.recover(error, &mut recoveries).await?,
            }
        }
    }
}

impl Sandbox for E2bSandbox {
    fn id(&self) -> &str {
        &self.inner.name
    }

    fn home(&self) -> &Path {
        &self.inner.home
    }

    async fn exec(&self, exec: &Exec) -> Result<ExecOutput, SandboxError> {
        let cwd = match &exec.cwd {
            Some(dir) => Some(self.path_str("run a command in", dir)?),
            None => None,
        };
        let command = Command {
            line: &exec.command,
            envs: exec
                .env
                .iter()
                .map(|(k, v)| (k.as_str(), v.expose_secret()))
                .collect(),
            cwd,
            timeout: exec.timeout,
        };
        self.run(&command).await
    }

    async fn read_file(&self, path: &Path) -> Result<Option<Vec<u8>>, SandboxError> {
        let text = self.path_str("read", path)?;
        let mut recoveries = 0;
        loop {
            match self.envd().read(text).await {
                Ok(bytes) => return Ok(bytes),
                Err(e) => self.recover(e, &mut recoveries).await?,
            }
        }
    }

    /// One envd read, its failure not recovered from: a paused sandbox is left to the
    /// command that runs in it.
    async fn peek_file(&self, path: &Path) -> Result<Option<Vec<u8>>, SandboxError> {
        let text = self.path_str("read", path)?;
        self.envd().read(text).await.map_err(|e| self.failure(e))
    }

    /// envd's upload creates a file with mode 0666 under the umask, and keeps the mode of one
    /// that exists (`O_TRUNC`, infra's `packages/envd/internal/api/upload.go`); so the file is
    /// first made empty with mode 0600 beside its target, uploaded into, and renamed over it.
    async fn write_file(&self, path: &Path, contents: &[u8]) -> Result<(), SandboxError> {
        let text = self.path_str("write", path)?;
        let dir = path.parent().unwrap_or(Path::new("/"));
        let tmp = format!("{text}.tmp-{}", nonce());
        let prepare = format!(
            "umask 077 && mkdir -p -- {} && : > {}",
            shell_quote(self.path_str("write", dir)?),
            shell_quote(&tmp)
        );
        self.checked(&prepare, path).await?;
        let mut recoveries = 0;
        let uploaded = loop {
            match self.envd().write(&tmp, contents).await {
                Ok(()) => break Ok(()),
                Err(e) => {
                    if let Err(e) = self.recover(e, &mut recoveries).await {
                        break Err(e);
                    }
                }
            }
        };
        let finish = match &uploaded {
            Ok(()) => format!("mv -f -- {} {}", shell_quote(&tmp), shell_quote(text)),
            Err(_) => format!("rm -f -- {}", shell_quote(&tmp)),
        };
        let finished = self.checked(&finish, path).await;
        uploaded.and(finished)
    }
}

impl E2bSandbox {
    /// Runs a file operation's shell step; its failure is a [`SandboxError::File`].
    async fn checked(&self, line: &str, path: &Path) -> Result<(), SandboxError> {
        let out = self
            .run(&Command {
                line,
                envs: BTreeMap::new(),
                cwd: None,
                timeout: FILE_COMMAND_TIMEOUT,
            })
            .await?;
        if out.success() {
            return Ok(());
        }
        Err(SandboxError::File {
            sandbox: self.inner.name.clone(),
            action: "write",
            path: path.to_owned(),
            source: std::io::Error::other(out.stderr.trim().to_owned()),
        })
    }
}

fn envd_for(settings: &E2bSettings, access: &SandboxAccess, user: &str) -> Result<Envd, E2bError> {
    Envd::new(
        settings.envd_url(&access.sandbox_id, access.domain.as_deref()),
        &access.sandbox_id,
        access.envd_access_token.as_ref(),
        user,
        settings.streams,
        settings.retry.clone(),
    )
}

fn refused(sandbox: &str, error: E2bError) -> SandboxError {
    SandboxError::Refused {
        sandbox: sandbox.to_owned(),
        source: Box::new(error),
    }
}

/// A name no other write uses at the same time, on any replica.
pub(crate) fn nonce() -> String {
    let mut bytes = [0u8; 8];
    getrandom::getrandom(&mut bytes).expect("the OS random source is readable");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `value` as one single-quoted shell word.
fn shell_quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', "'\\''"))
}
