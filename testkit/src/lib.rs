//! Test-only helpers shared by every crate's tests: hermetic git, polling waits.
//!
//! Nothing here is linked into a shipped binary.

pub mod git;
pub mod wait;
