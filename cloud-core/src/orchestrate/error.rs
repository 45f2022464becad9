//! Why an orchestration step failed, sorted by what the caller does next: try again later,
//! recover a lost sandbox, or show it to someone.

use std::time::Duration;

use shmastra_contract::SyncFailure;
use shmastra_contract::manifest::{MANIFEST_FILE, ManifestError};

use crate::sandbox::SandboxError;
use crate::secrets::RestoreFormError;
use crate::user::UserId;
use shmastra_contract::duration::short_duration;

/// Why an orchestration step failed.
#[derive(Debug, thiserror::Error)]
pub enum OrchestrateError {
    /// The host could not make the user's project.
    #[error("cannot create the project of user {user}: {source}")]
    Host {
        /// Whose project.
        user: UserId,
        /// Whether the host said trying again may work.
        transient: bool,
        /// The host's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The sandbox failed a call (gone, timed out, ...).
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// The saved `shmastra.json` cannot be read.
    #[error("the saved project of user {user} has a bad {MANIFEST_FILE}: {source}")]
    Manifest {
        /// Whose project.
        user: UserId,
        /// What is wrong with it.
        source: ManifestError,
    },
    /// The restore form was refused; nothing changed.
    #[error(transparent)]
    Form(#[from] RestoreFormError),
    /// A command in the sandbox exited non-zero.
    #[error("sandbox {sandbox}: {step} failed ({exit}): {tail}")]
    Command {
        /// The sandbox's id.
        sandbox: String,
        /// What the command was for.
        step: &'static str,
        /// How it exited.
        exit: String,
        /// The last lines of its output.
        tail: String,
    },
    /// The dev server did not answer its health check in time.
    #[error("{}: {}", failure.step, failure.message)]
    DevServerDown {
        /// The step, the message and the probe's and the dev server's last output.
        failure: SyncFailure,
    },
    /// Recovery gave up: the user's sandbox was lost again and again. Someone has to look.
    #[error(
        "the sandbox of user {user} was lost and re-created {count} times within {}; recovery stopped, it needs attention",
        short_duration(*window)
    )]
    NeedsAttention {
        /// Whose sandbox.
        user: UserId,
        /// How many recoveries the window holds.
        count: u32,
        /// The policy's window.
        window: Duration,
    },
}

impl OrchestrateError {
    /// Whether trying again later may succeed without anyone changing the setup.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Host { transient, .. } => *transient,
            Self::Sandbox(e) => e.is_transient(),
            Self::Command { .. }
            | Self::DevServerDown { .. }
            | Self::Manifest { .. }
            | Self::Form(_)
            | Self::NeedsAttention { .. } => false,
        }
    }

    /// Whether the sandbox itself is gone (recovery re-provisions it), as opposed to a step
    /// failing inside it.
    pub fn is_gone(&self) -> bool {
        matches!(self, Self::Sandbox(e) if e.is_gone())
    }
}
