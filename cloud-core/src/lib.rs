//! cloud-core: the cloud side of project persistence, linked by the cloud backend.

pub mod http_backend;
pub mod proxy;
pub mod token;
pub mod user;

pub use user::UserId;
