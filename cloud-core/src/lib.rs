//! cloud-core: the cloud side of project persistence, linked by the cloud backend.
pub mod proxy;
