//! Real PM2 for tests: a pinned version installed from npm by [`crate::npm`] once.

use std::path::PathBuf;

/// The PM2 version the tests run (the sandbox template's).
pub const PM2_VERSION: &str = "7.0.4";

/// `<target>/npm/pm2-<version>/node_modules/.bin/pm2`, installed by [`crate::npm::package`]
/// on first use.
pub fn pm2_bin() -> PathBuf {
    crate::npm::package("pm2", PM2_VERSION)
        .with_file_name(".bin")
        .join("pm2")
}
