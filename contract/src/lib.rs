//! shmastra-contract: what the sandbox's `project-watcher` and the cloud (`cloud-core`) agree
//! on, written once and used by both sides.
//!
//! - [`env`]: the watcher's environment variables, the remote and branch defaults, and the
//!   watcher's environment file that provisioning writes;
//! - [`manifest`]: `shmastra.json` (the names of a project's secrets), its strict parser,
//!   canonical text and name validation;
//! - [`failure`]: the sync failure file (`step`, `error`, first error lines, output tail): its
//!   default path, writer and parser;
//! - [`command`]: the `project-watcher restore` and `sync` command lines the cloud runs in a
//!   sandbox, as argument lists and as shell text;
//! - [`save_message`]: the commit messages of the watcher's saves (the `Saved-by`,
//!   `Save-kind` and `Restored-from` trailers, the kinds, the listed paths), written by the
//!   watcher and read by its `history` and the cloud's;
//! - [`trailers`]: git's commit message trailers, found as `git interpret-trailers --parse`
//!   finds them;
//! - [`log_level`]: the log filter both binaries start with (`-q`, `-v`, `RUST_LOG`);
//! - [`duration`]: a duration in a message or a log field as people write it (`1d`, `1s 500ms`).
//!
//! Small on purpose: serde, serde_json and thiserror, nothing else.

pub mod command;
pub mod duration;
pub mod env;
pub mod failure;
pub mod log_level;
pub mod manifest;
pub mod save_message;
pub mod trailers;

pub use command::{RestoreCommand, SyncCommand};
pub use failure::SyncFailure;
pub use manifest::{MANIFEST_FILE, Manifest, ManifestError};
pub use save_message::SaveKind;
