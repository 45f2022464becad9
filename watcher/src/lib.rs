//! project-watcher: saves a project directory to git as the user works, and restores it.
//!
//! Data flows one way: `watch -> debounce -> stage -> commit -> push`, one module per arrow;
//! `filter` holds git's ignore rules, which the stages judge paths with. See ARCHITECTURE.md
//! for the code map and the invariants.
//!
//! The public face is what the `project-watcher` binary and the tests use: the commands
//! ([`daemon`], [`history`], [`restore`], [`restore_at`], [`sync`]), their settings
//! ([`config`], [`remote`], [`logging`], [`transport`]), the status file ([`status`],
//! [`resources`]), the locks ([`lock`]), opening `--dir` ([`project_dir`]), and the parts tests
//! drive on their own ([`filter`], [`manifest`], [`push`]). Everything else is crate-private.

#![deny(missing_docs)]

pub(crate) mod at;
pub(crate) mod changes;
pub(crate) mod commit;
pub mod config;
pub mod daemon;
pub(crate) mod debounce;
pub mod filter;
pub(crate) mod gitignore;
pub mod history;
pub(crate) mod index_write;
pub(crate) mod layout;
pub mod lock;
pub mod logging;
pub mod manifest;
pub mod project_dir;
pub mod push;
pub mod remote;
pub mod resources;
pub mod restore;
pub mod restore_at;
pub(crate) mod retry;
pub(crate) mod save;
pub(crate) mod scan;
mod smart_http;
pub(crate) mod sparse;
pub(crate) mod stage;
pub mod status;
pub(crate) mod status_book;
pub mod sync;
pub mod transport;
pub(crate) mod user_git;
pub(crate) mod watch;
