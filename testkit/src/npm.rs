//! npm packages for tests, pinned: `<target>/npm/<name>-<version>/node_modules/<name>`,
//! installed with npm on first use and kept for later runs.

use std::fs;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

/// The installed package's folder (`.../node_modules/<name>`). The install goes to a scratch
/// folder renamed into place, so a half-finished one is never used. One install at a time, in
/// this process (a mutex) and across processes (a lock file): npm's cache does not take two
/// installs of the same package at once (ENOTEMPTY).
pub fn package(name: &str, version: &str) -> PathBuf {
    static INSTALL: Mutex<()> = Mutex::new(());
    let _one_thread = INSTALL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let exe = std::env::current_exe().expect("the test's own path");
    let target = exe
        .ancestors()
        .nth(3)
        .expect("tests run from <target>/<profile>/deps")
        .join("npm");
    fs::create_dir_all(&target).expect("create <target>/npm");
    let dir = target.join(format!("{name}-{version}"));
    let installed = dir.join("node_modules").join(name);
    if installed.join("package.json").exists() {
        return installed;
    }
    let lock = fs::File::create(target.join(format!("{name}-{version}.lock"))).expect("lock");
    lock.lock().expect("take the install lock");
    if installed.join("package.json").exists() {
        return installed;
    }
    let scratch = target.join(format!("{name}-{version}.tmp-{}", std::process::id()));
    let _ = fs::remove_dir_all(&scratch);
    fs::create_dir_all(&scratch).expect("create the scratch folder");
    let out = Command::new("npm")
        .args(["install", "--prefix"])
        .arg(&scratch)
        .arg(format!("{name}@{version}"))
        .args(["--no-audit", "--no-fund", "--loglevel=error"])
        .output()
        .expect("npm is installed");
    assert!(
        out.status.success(),
        "npm install {name}@{version} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    fs::rename(&scratch, &dir).expect("rename the install into place");
    assert!(
        installed.join("package.json").exists(),
        "{} missing after install",
        installed.display()
    );
    installed
}
