//! Test-only helpers shared by every crate's tests: hermetic git, a smart-HTTP git server with
//! faults, a fake GitLab, a real PostgreSQL, polling waits.
//!
//! Nothing here is linked into a shipped binary.

pub mod cargo_bin;
pub mod fake_gitlab;
pub mod git;
pub mod git_server;
pub mod postgres;
pub mod proptest_check;
pub mod wait;
