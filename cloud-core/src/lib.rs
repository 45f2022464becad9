//! cloud-core: the cloud side of project persistence, linked by the cloud backend.

pub mod config;
pub mod gitlab;
pub mod http_backend;
pub mod manifest;
pub mod orchestrate;
mod process_group;
pub mod provider;
pub mod proxy;
pub mod sandbox;
pub mod secrets;
pub mod serve;
pub mod sync_queue;
pub mod token;
pub mod user;
pub mod webhook;

pub use shmastra_contract::SyncFailure;
pub use user::UserId;
