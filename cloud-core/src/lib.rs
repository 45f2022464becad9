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
pub mod store;
pub mod token;
pub mod user;
pub mod web;
pub mod webhook;

pub use user::UserId;
