//! The workspace's own binaries for end-to-end tests in another package (Cargo only hands
//! `CARGO_BIN_EXE_*` to the package that owns the binary): built once per test process with
//! the cargo that runs the tests, into the same target directory and profile.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// The `project-watcher` executable, built if needed.
pub fn project_watcher() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| build("project-watcher", "project-watcher"))
        .clone()
}

/// The `shmastra-cloud` executable, built if needed.
pub fn shmastra_cloud() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| build("shmastra-cloud", "shmastra-cloud"))
        .clone()
}

fn build(package: &str, bin: &str) -> PathBuf {
    // Test executables live in `<target>/<profile>/deps/`; binaries one level up.
    let exe = std::env::current_exe().expect("the test executable's path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("tests run from <target>/<profile>/deps")
        .to_owned();
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(["build", "--quiet", "-p", package, "--bin", bin]);
    if profile_dir.file_name().is_some_and(|p| p == "release") {
        cmd.arg("--release");
    }
    let status = cmd.status().expect("cargo runs");
    assert!(
        status.success(),
        "cargo build -p {package} --bin {bin} failed"
    );
    let path = profile_dir.join(bin);
    assert!(path.exists(), "{} was not built", path.display());
    path
}
