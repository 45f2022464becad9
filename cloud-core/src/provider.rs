//! Where sandboxes come from: create one for a user from the template, connect to the user's
//! existing one, and answer [`SandboxError::Gone`] when there is none.
//!
//! [`LocalProvider`] keeps one [`LocalSandbox`] per user in `DIR/<user>`, copied from a template
//! directory; removing that directory is a wipe. An E2B provider fits the same trait (see
//! ARCHITECTURE.md): `create` and `connect` are its REST calls, the sandbox it returns talks to
//! the in-sandbox daemon, and a 404 from either is `Gone`.

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::UserId;
use crate::sandbox::{LocalSandbox, Sandbox, SandboxError};

/// Creates and finds users' sandboxes. The sandboxes it hands out are named after their user
/// ([`Sandbox::id`] is the user id), so a re-created sandbox keeps its statuses and its place in
/// the one-sync-at-a-time queue.
pub trait SandboxProvider: Send + Sync {
    type Sandbox: Sandbox + Clone;

    /// The user's sandbox, or [`SandboxError::Gone`] when the user has none (never had one, or
    /// it was wiped or lost).
    fn connect(
        &self,
        user: &UserId,
    ) -> impl Future<Output = Result<Self::Sandbox, SandboxError>> + Send;

    /// A new sandbox for `user`, fresh from the template: the template's project (not a git
    /// repository yet), its installed dependencies, no watcher running. Orchestration calls it
    /// only after [`SandboxProvider::connect`] said [`SandboxError::Gone`], one call per user at
    /// a time.
    fn create(
        &self,
        user: &UserId,
    ) -> impl Future<Output = Result<Self::Sandbox, SandboxError>> + Send;
}

/// One [`LocalSandbox`] per user at `root/<user>`, created by copying `template` (with `cp -a`,
/// so modes and symlinks survive) into a hidden staging name and renaming it into place: a
/// sandbox directory either holds the whole template or does not exist.
#[derive(Debug, Clone)]
pub struct LocalProvider {
    root: PathBuf,
    template: PathBuf,
    base_env: BTreeMap<String, String>,
}

impl LocalProvider {
    /// Sandboxes under `root` (created when needed), each a copy of the `template` directory,
    /// which holds a sandbox home (the project folder inside it, as the layout names it).
    pub fn new(root: impl Into<PathBuf>, template: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            template: template.into(),
            base_env: BTreeMap::new(),
        }
    }

    /// An environment variable every sandbox's commands get (tests put a hermetic git
    /// configuration here). `HOME` is always the sandbox's own directory.
    pub fn with_env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.base_env.insert(name.into(), value.into());
        self
    }

    /// Where `user`'s sandbox lives. `UserId` is a safe path component, so this never leaves
    /// `root`.
    pub fn dir_of(&self, user: &UserId) -> PathBuf {
        self.root.join(user.as_str())
    }

    fn sandbox(&self, user: &UserId) -> LocalSandbox {
        self.base_env.iter().fold(
            LocalSandbox::new(user.as_str(), self.dir_of(user)),
            |sandbox, (name, value)| sandbox.with_env(name, value),
        )
    }
}

impl SandboxProvider for LocalProvider {
    type Sandbox = LocalSandbox;

    async fn connect(&self, user: &UserId) -> Result<LocalSandbox, SandboxError> {
        match tokio::fs::metadata(self.dir_of(user)).await {
            Ok(meta) if meta.is_dir() => Ok(self.sandbox(user)),
            _ => Err(SandboxError::Gone {
                sandbox: user.to_string(),
            }),
        }
    }

    async fn create(&self, user: &UserId) -> Result<LocalSandbox, SandboxError> {
        let (root, template, dir) = (self.root.clone(), self.template.clone(), self.dir_of(user));
        let created = tokio::task::spawn_blocking({
            let dir = dir.clone();
            move || copy_template(&root, &template, &dir)
        })
        .await
        .unwrap_or_else(|join| Err(io::Error::other(join)));
        created.map_err(|source| SandboxError::File {
            sandbox: user.to_string(),
            action: "create from the template",
            path: dir,
            source,
        })?;
        Ok(self.sandbox(user))
    }
}

/// Copies `template` to a staging directory under `root` and renames it to `dir`. The staging
/// name starts with `.`, which no user id does, so it can never be taken for a sandbox.
fn copy_template(root: &Path, template: &Path, dir: &Path) -> io::Result<()> {
    static STAGING: AtomicU64 = AtomicU64::new(0);
    std::fs::create_dir_all(root)?;
    let staging = root.join(format!(
        ".creating-{}-{}",
        std::process::id(),
        STAGING.fetch_add(1, Ordering::Relaxed)
    ));
    let copied = std::process::Command::new("cp")
        .arg("-a")
        .arg("--")
        .arg(template)
        .arg(&staging)
        .output()?;
    let placed = if copied.status.success() {
        std::fs::rename(&staging, dir)
    } else {
        Err(io::Error::other(format!(
            "cp -a {} failed: {}",
            template.display(),
            String::from_utf8_lossy(&copied.stderr).trim()
        )))
    };
    if placed.is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    placed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::Exec;
    use std::time::Duration;

    fn user(name: &str) -> UserId {
        UserId::parse(name).unwrap()
    }

    fn template(tmp: &Path) -> PathBuf {
        let template = tmp.join("template");
        std::fs::create_dir_all(template.join("project/src")).unwrap();
        std::fs::write(template.join("project/src/index.ts"), "template\n").unwrap();
        std::os::unix::fs::symlink("src/index.ts", template.join("project/link")).unwrap();
        template
    }

    #[tokio::test]
    async fn connect_before_create_is_gone_and_after_create_finds_the_template_copy() {
        let tmp = tempfile::tempdir().unwrap();
        let provider = LocalProvider::new(tmp.path().join("sandboxes"), template(tmp.path()))
            .with_env("X", "1");

        let err = provider.connect(&user("alice")).await.unwrap_err();
        assert!(err.is_gone(), "{err}");

        let created = provider.create(&user("alice")).await.unwrap();
        assert_eq!(created.id(), "alice");
        let dir = tmp.path().join("sandboxes/alice");
        assert_eq!(created.home(), dir);
        assert_eq!(
            std::fs::read_to_string(dir.join("project/src/index.ts")).unwrap(),
            "template\n"
        );
        assert_eq!(
            std::fs::read_link(dir.join("project/link")).unwrap(),
            Path::new("src/index.ts")
        );
        let out = provider
            .connect(&user("alice"))
            .await
            .unwrap()
            .exec(&Exec::new("echo \"$HOME $X\"", Duration::from_secs(10)))
            .await
            .unwrap();
        assert_eq!(out.stdout, format!("{} 1\n", dir.display()));
        let names: Vec<_> = std::fs::read_dir(tmp.path().join("sandboxes"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["alice"], "no staging directory is left behind");
    }

    #[tokio::test]
    async fn a_wiped_directory_is_gone_and_create_brings_the_template_back() {
        let tmp = tempfile::tempdir().unwrap();
        let provider = LocalProvider::new(tmp.path().join("sandboxes"), template(tmp.path()));
        let sandbox = provider.create(&user("alice")).await.unwrap();
        let dir = provider.dir_of(&user("alice"));
        std::fs::write(dir.join("project/src/index.ts"), "edited\n").unwrap();

        std::fs::remove_dir_all(&dir).unwrap();

        assert!(
            provider
                .connect(&user("alice"))
                .await
                .unwrap_err()
                .is_gone()
        );
        let exec = Exec::new("true", Duration::from_secs(10));
        assert!(sandbox.exec(&exec).await.unwrap_err().is_gone());
        provider.create(&user("alice")).await.unwrap();
        assert!(sandbox.exec(&exec).await.unwrap().success());
        assert_eq!(
            std::fs::read_to_string(dir.join("project/src/index.ts")).unwrap(),
            "template\n"
        );
    }

    #[tokio::test]
    async fn create_over_an_existing_sandbox_fails_and_keeps_it() {
        let tmp = tempfile::tempdir().unwrap();
        let provider = LocalProvider::new(tmp.path().join("sandboxes"), template(tmp.path()));
        provider.create(&user("alice")).await.unwrap();
        let dir = provider.dir_of(&user("alice"));
        std::fs::write(dir.join("project/src/index.ts"), "work\n").unwrap();

        let err = provider.create(&user("alice")).await.unwrap_err();

        assert!(matches!(err, SandboxError::File { .. }), "{err}");
        assert_eq!(
            std::fs::read_to_string(dir.join("project/src/index.ts")).unwrap(),
            "work\n"
        );
        assert_eq!(
            std::fs::read_dir(tmp.path().join("sandboxes"))
                .unwrap()
                .count(),
            1
        );
    }

    #[tokio::test]
    async fn a_missing_template_is_a_clear_error_that_leaves_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let provider = LocalProvider::new(tmp.path().join("sandboxes"), tmp.path().join("nope"));
        let err = provider.create(&user("alice")).await.unwrap_err();
        let shown = err.to_string();
        assert!(shown.contains("create from the template"), "{shown}");
        assert!(shown.contains("nope"), "{shown}");
        assert_eq!(
            std::fs::read_dir(tmp.path().join("sandboxes"))
                .unwrap()
                .count(),
            0
        );
    }
}
