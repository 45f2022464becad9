//! project-watcher: saves a project directory to git as the user works, and restores it.
//!
//! Data flows one way: `watch -> filter -> debounce -> stage -> commit -> push`, one module
//! per arrow. See ARCHITECTURE.md for the code map and the invariants.

pub mod lock;
pub mod push;
pub mod restore;
pub mod status;
pub mod sync;
