//! cloud-core: the cloud side of project persistence, linked by the cloud backend.

pub mod config;
pub mod gitlab;
pub mod http_backend;
pub mod manifest;
pub mod secrets;
pub mod token;
pub mod user;

pub use user::UserId;
