//! Where sandboxes come from: create one for a user from the template, connect to the user's
//! existing one, and answer [`SandboxError::Gone`] when there is none.
//!
//! [`LocalProvider`] keeps one [`LocalSandbox`] per user in `DIR/<user>`, copied from a template
//! directory; removing that directory is a wipe. [`crate::e2b::E2bProvider`] is the one a
//! deployment uses: `create` and `connect` are E2B's REST calls, the sandbox it returns talks
//! to the in-sandbox daemon, and a sandbox E2B no longer knows is `Gone`.

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::sandbox::{Gate, LocalSandbox, Sandbox, SandboxError};
use crate::user::UserId;

/// Creates and finds users' sandboxes. The sandboxes it hands out are named after their user
/// ([`Sandbox::id`] is the user id), so a re-created sandbox keeps its statuses and its place in
/// the one-sync-at-a-time queue.
pub trait SandboxProvider: Send + Sync {
    /// The sandboxes this provider hands out.
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
    users: SandboxUsers,
    gate: Option<Arc<Gate>>,
}

/// Whose uid a sandbox's commands run as.
#[derive(Debug, Clone)]
enum SandboxUsers {
    /// This process's (tests and developers: one trusted user).
    Shared,
    /// This process's, with a cleared environment, and only one user's sandbox may exist: this
    /// process cannot switch uids, so a second user's code would run as the first's (and as
    /// this server).
    OneUser,
    /// One uid per sandbox, from `base` up: the owner of its directory (0700) is the uid it
    /// runs as.
    Own {
        base: u32,
        allocating: Arc<Mutex<()>>,
    },
}

impl LocalProvider {
    /// Sandboxes under `root` (created when needed), each a copy of the `template` directory,
    /// which holds a sandbox home (the project folder inside it, as the layout names it).
    pub fn new(root: impl Into<PathBuf>, template: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            template: template.into(),
            base_env: BTreeMap::new(),
            users: SandboxUsers::Shared,
            gate: None,
        }
    }

    /// Every sandbox's commands pass `gate` (see [`LocalSandbox::with_gate`]).
    pub fn with_gate(mut self, gate: Arc<Gate>) -> Self {
        self.gate = Some(gate);
        self
    }

    /// Each sandbox runs as a uid of its own, `base` and up (no account is needed): its
    /// directory is made 0700 and owned by it, `root` 0711 (others may pass, not list). This
    /// process must be root.
    pub fn with_own_uids(mut self, base: u32) -> Self {
        self.users = SandboxUsers::Own {
            base,
            allocating: Arc::default(),
        };
        self
    }

    /// For a process that cannot switch uids: only one user's sandbox is made (creating a
    /// second user's is refused, saying why), and its commands get a cleared environment.
    pub fn one_user_only(mut self) -> Self {
        self.users = SandboxUsers::OneUser;
        self
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

    fn sandbox(&self, user: &UserId, owner: Option<(u32, u32)>) -> LocalSandbox {
        let mut sandbox = self.base_env.iter().fold(
            LocalSandbox::new(user.as_str(), self.dir_of(user)),
            |sandbox, (name, value)| sandbox.with_env(name, value),
        );
        if let Some(gate) = &self.gate {
            sandbox = sandbox.with_gate(gate.clone());
        }
        match (owner, &self.users) {
            (Some((uid, gid)), _) => sandbox.run_as(uid, gid),
            (None, SandboxUsers::OneUser) => sandbox.with_cleared_env(),
            (None, _) => sandbox,
        }
    }

    /// The uid and gid `dir` runs as: its owner's, once it is one of ours; a directory owned by
    /// someone else (made before sandboxes had users of their own) is given a fresh uid.
    fn owner_of(&self, dir: &Path) -> io::Result<Option<(u32, u32)>> {
        use std::os::unix::fs::MetadataExt;
        let SandboxUsers::Own { base, allocating } = &self.users else {
            return Ok(None);
        };
        let meta = std::fs::metadata(dir)?;
        if meta.uid() >= *base {
            return Ok(Some((meta.uid(), meta.gid())));
        }
        let _one = allocating.lock().unwrap_or_else(|p| p.into_inner());
        let uid = next_uid(&self.root, *base)?;
        give(dir, uid)?;
        Ok(Some((uid, uid)))
    }
}

impl SandboxProvider for LocalProvider {
    type Sandbox = LocalSandbox;

    async fn connect(&self, user: &UserId) -> Result<LocalSandbox, SandboxError> {
        let dir = self.dir_of(user);
        match tokio::fs::metadata(&dir).await {
            Ok(meta) if meta.is_dir() => {}
            _ => {
                return Err(SandboxError::Gone {
                    sandbox: user.to_string(),
                });
            }
        }
        let owner = self.owner_of(&dir).map_err(|source| SandboxError::File {
            sandbox: user.to_string(),
            action: "give its user",
            path: dir.clone(),
            source,
        })?;
        Ok(self.sandbox(user, owner))
    }

    async fn create(&self, user: &UserId) -> Result<LocalSandbox, SandboxError> {
        let (root, template, dir) = (self.root.clone(), self.template.clone(), self.dir_of(user));
        let users = self.users.clone();
        let created = tokio::task::spawn_blocking({
            let dir = dir.clone();
            move || create_sandbox(&root, &template, &dir, &users)
        })
        .await
        .unwrap_or_else(|join| Err(io::Error::other(join)));
        let owner = created.map_err(|source| SandboxError::File {
            sandbox: user.to_string(),
            action: "create from the template",
            path: dir,
            source,
        })?;
        Ok(self.sandbox(user, owner))
    }
}

/// The users' sandboxes under `root`: the entries whose name is not hidden.
fn sandbox_dirs(root: &Path) -> io::Result<Vec<std::fs::DirEntry>> {
    Ok(std::fs::read_dir(root)?
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .collect())
}

/// The file under `root` that holds the last uid given to a sandbox (hidden: never a user).
const LAST_UID_FILE: &str = ".last-uid";

/// A uid no sandbox under `root` has ever had: one past the highest from `base` that a
/// directory has or `root/.last-uid` records, recorded there before it is used. A wiped
/// sandbox's uid is never given again: what its code left running must not own a later one.
fn next_uid(root: &Path, base: u32) -> io::Result<u32> {
    use std::os::unix::fs::MetadataExt;
    let record = root.join(LAST_UID_FILE);
    let recorded =
        match std::fs::read_to_string(&record) {
            Ok(text) => Some(text.trim().parse::<u32>().map_err(|e| {
                io::Error::other(format!("{} is not a uid: {e}", record.display()))
            })?),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
    let highest = sandbox_dirs(root)?
        .iter()
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.uid())
        .chain(recorded)
        .filter(|uid| *uid >= base)
        .max();
    let uid = match highest {
        None => base,
        Some(uid) => uid
            .checked_add(1)
            .ok_or_else(|| io::Error::other("no uid is left for another sandbox"))?,
    };
    let staging = root.join(format!("{LAST_UID_FILE}.{}", std::process::id()));
    std::fs::write(&staging, format!("{uid}\n"))?;
    std::fs::rename(&staging, &record)?;
    Ok(uid)
}

/// Makes everything under `dir` `uid`'s (links themselves, not what they name) and `dir` 0700.
fn give(dir: &Path, uid: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let out = std::process::Command::new("chown")
        .args(["-R", "-h", &format!("{uid}:{uid}"), "--"])
        .arg(dir)
        .output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "chown -R {uid} {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

/// A new sandbox at `dir` from `template`, owned as `users` says; the uid and gid it runs as.
fn create_sandbox(
    root: &Path,
    template: &Path,
    dir: &Path,
    users: &SandboxUsers,
) -> io::Result<Option<(u32, u32)>> {
    match users {
        SandboxUsers::Shared => copy_template(root, template, dir, None).map(|()| None),
        SandboxUsers::OneUser => {
            std::fs::create_dir_all(root)?;
            if let Some(other) = sandbox_dirs(root)?.first() {
                return Err(io::Error::other(format!(
                    "this server is not root, so a sandbox cannot run as a user of its own: one sandboxes directory serves one user, and {} has it (run serve as root, or give each user a server of their own)",
                    other.file_name().to_string_lossy()
                )));
            }
            copy_template(root, template, dir, None).map(|()| None)
        }
        SandboxUsers::Own { base, allocating } => {
            use std::os::unix::fs::PermissionsExt;
            let _one = allocating.lock().unwrap_or_else(|p| p.into_inner());
            std::fs::create_dir_all(root)?;
            std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o711))?;
            let uid = next_uid(root, *base)?;
            copy_template(root, template, dir, Some(uid))?;
            Ok(Some((uid, uid)))
        }
    }
}

/// Copies `template` to a staging directory under `root` (given to `uid` when there is one) and
/// renames it to `dir`. The staging name starts with `.`, which no user id does, so it can
/// never be taken for a sandbox.
fn copy_template(root: &Path, template: &Path, dir: &Path, uid: Option<u32>) -> io::Result<()> {
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
        uid.map_or(Ok(()), |uid| give(&staging, uid))
            .and_then(|()| std::fs::rename(&staging, dir))
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
    async fn a_provider_that_cannot_switch_uids_makes_one_users_sandbox_only() {
        let tmp = tempfile::tempdir().unwrap();
        let provider =
            LocalProvider::new(tmp.path().join("sandboxes"), template(tmp.path())).one_user_only();
        provider.create(&user("alice")).await.unwrap();
        assert!(provider.connect(&user("alice")).await.is_ok());
        let refused = provider.create(&user("bob")).await.unwrap_err().to_string();
        assert!(
            refused.contains("not root") && refused.contains("alice has it"),
            "{refused}"
        );
        assert!(!provider.dir_of(&user("bob")).exists());
    }

    #[tokio::test]
    async fn the_one_users_commands_get_none_of_this_processs_environment() {
        let tmp = tempfile::tempdir().unwrap();
        let provider = LocalProvider::new(tmp.path().join("sandboxes"), template(tmp.path()))
            .with_env("X", "1")
            .one_user_only();
        let sandbox = provider.create(&user("alice")).await.unwrap();
        let out = sandbox
            .exec(&Exec::new("env", Duration::from_secs(10)))
            .await
            .unwrap();
        let names: Vec<&str> = out
            .stdout
            .lines()
            .filter_map(|l| l.split_once('=').map(|(name, _)| name))
            .filter(|name| !["PWD", "SHLVL", "_"].contains(name))
            .collect();
        let inherited = std::env::vars()
            .filter(|(name, _)| !["PATH", "LANG", "LC_ALL", "TZ", "HOME"].contains(&name.as_str()))
            .count();
        assert!(inherited > 0, "this test process has variables of its own");
        let mut expected = vec!["HOME", "X"];
        expected.extend(
            ["PATH", "LANG", "LC_ALL", "TZ"]
                .into_iter()
                .filter(|n| std::env::var_os(n).is_some()),
        );
        expected.sort();
        let mut names = names;
        names.sort();
        assert_eq!(names, expected, "{}", out.stdout);
    }

    /// Each sandbox is a uid of its own; a wiped one's uid is never given again, since what its
    /// code left running still runs as it. Needs root, as `serve` does for this.
    #[tokio::test]
    async fn every_sandbox_gets_a_uid_no_sandbox_ever_had() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let base = 310_000;
        let provider = LocalProvider::new(tmp.path().join("sandboxes"), template(tmp.path()))
            .with_own_uids(base);
        let uid_of = |name: &str| {
            let meta = std::fs::metadata(provider.dir_of(&user(name))).unwrap();
            (meta.uid(), meta.mode() & 0o777)
        };
        provider.create(&user("alice")).await.unwrap();
        let bob = provider.create(&user("bob")).await.unwrap();
        assert_eq!(
            (uid_of("alice"), uid_of("bob")),
            ((base, 0o700), (base + 1, 0o700))
        );
        let out = bob
            .exec(&Exec::new(
                "id -u; id -G; stat -c %u project/src/index.ts",
                Duration::from_secs(10),
            ))
            .await
            .unwrap();
        assert_eq!(out.stdout, format!("{0}\n{0}\n{0}\n", base + 1));

        std::fs::remove_dir_all(provider.dir_of(&user("bob"))).unwrap();
        provider.create(&user("carol")).await.unwrap();
        assert_eq!(
            uid_of("carol"),
            (base + 2, 0o700),
            "carol got the wiped bob's uid"
        );
        provider.create(&user("bob")).await.unwrap();
        assert_eq!(uid_of("bob"), (base + 3, 0o700));
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
