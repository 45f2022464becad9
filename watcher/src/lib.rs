//! project-watcher: saves a project directory to git as the user works, and restores it.
//!
//! Data flows one way: `watch -> filter -> debounce -> stage -> commit -> push`, one module
//! per arrow. See ARCHITECTURE.md for the code map and the invariants.

pub mod at;
pub mod changes;
pub mod commit;
pub mod config;
pub mod daemon;
pub mod debounce;
pub mod filter;
pub mod history;
pub mod lock;
pub mod logging;
pub mod manifest;
pub mod push;
pub mod remote;
pub mod resources;
pub mod restore;
pub mod restore_at;
pub mod retry;
pub mod save;
pub mod scan;
mod smart_http;
pub mod sparse;
pub mod stage;
pub mod status;
pub mod sync;
pub mod transport;
pub mod watch;
