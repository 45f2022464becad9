//! shmastra-contract: what the sandbox's `project-watcher` and the cloud (`cloud-core`) agree
//! on, written once and used by both sides.
//!
//! - [`env`]: the watcher's environment variables, the remote and branch defaults, and the
//!   watcher's environment file that provisioning writes;
//! - [`manifest`]: `shmastra.json` (the names of a project's secrets), its strict parser,
//!   canonical text and name validation;
//! - [`failure`]: the sync failure file (`step`, `error`, output tail): its default path,
//!   writer and parser;
//! - [`command`]: the `project-watcher restore` and `sync` command lines the cloud runs in a
//!   sandbox, as argument lists and as shell text.
//!
//! Small on purpose: serde, serde_json and thiserror, nothing else.

pub mod command;
pub mod env;
pub mod failure;
pub mod manifest;

pub use command::{RestoreCommand, SyncCommand};
pub use failure::SyncFailure;
pub use manifest::{MANIFEST_FILE, Manifest, ManifestError};
