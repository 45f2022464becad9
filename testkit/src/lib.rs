//! Test-only helpers shared by every crate's tests: hermetic git, a smart-HTTP git server with faults, polling waits.
//!
//! Nothing here is linked into a shipped binary.

pub mod git;
pub mod git_server;
pub mod wait;
