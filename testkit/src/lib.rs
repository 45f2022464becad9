//! Test-only helpers shared by every crate's tests: hermetic git, a smart-HTTP git server with
//! faults, a fake GitLab, a fake E2B, a real PostgreSQL, pinned npm packages, polling waits,
//! sandboxes in memory, a recording status sink, real PM2 and the sandbox template.
//!
//! Nothing here is linked into a shipped binary.

pub mod cargo_bin;
pub mod fake_e2b;
pub mod fake_gitlab;
pub mod git;
pub mod git_server;
pub mod net;
pub mod npm;
pub mod pm2;
pub mod postgres;
pub mod proptest_check;
pub mod sandbox;
pub mod statuses;
pub mod template;
pub mod wait;
