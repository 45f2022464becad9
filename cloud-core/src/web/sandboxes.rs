//! Sandboxes on one machine (`serve --sandboxes-dir DIR`): one [`LocalProvider`] sandbox per
//! user at `DIR/<user>`, made from an empty template, with the watcher as a supervised child
//! process: a shell loop restarts it when it dies of anything but a clean stop (exit 0, 2 for a
//! configuration error, 3 for a held lock).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::orchestrate::SandboxLayout;
use crate::provider::{LocalProvider, SandboxProvider};
use crate::sandbox::{Exec, Gate, LocalSandbox, Sandbox};
use crate::user::UserId;

/// The template directory's name under the sandboxes dir; a leading `.` is never a user id.
const TEMPLATE: &str = ".template";
/// The first uid a sandbox runs as (as root): far above the accounts of a system.
const FIRST_SANDBOX_UID: u32 = 200_000;

/// What `serve` needs to run sandboxes on this machine.
#[derive(Debug, Clone)]
pub struct LocalSandboxes {
    /// `--sandboxes-dir`: one directory per user, and the template.
    pub root: PathBuf,
    /// The `project-watcher` executable run in each sandbox.
    pub watcher_bin: String,
    /// Overrides the lock file's package manager in a sync (`--install-cmd`).
    pub install_cmd: Option<String>,
    /// The sandboxes' commands pass it; [`LocalSandboxes::stop_all`] closes it.
    pub gate: Arc<Gate>,
}

/// How long a stopping server waits for the sandbox commands that run (a watcher being
/// started, a restore) before it stops the watchers anyway.
const STOP_PATIENCE: Duration = Duration::from_secs(20);

impl LocalSandboxes {
    /// The provider, after making the root and its (empty) template directory. As root, each
    /// sandbox runs as a uid of its own (the sandboxes dir must be reachable by other users:
    /// every folder above it traversable); otherwise only one user's sandbox is made.
    pub fn provider(&self) -> std::io::Result<LocalProvider> {
        let template = self.root.join(TEMPLATE);
        std::fs::create_dir_all(&template)?;
        let provider = LocalProvider::new(&self.root, template).with_gate(self.gate.clone());
        if !rustix::process::geteuid().is_root() {
            tracing::warn!(
                dir = %self.root.display(),
                "serve is not root: sandboxes cannot run as users of their own, so this sandboxes directory serves one user only"
            );
            return Ok(provider.one_user_only());
        }
        let root = std::path::absolute(&self.root)?;
        for dir in root.ancestors().skip(1) {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir)?.permissions().mode();
            if mode & 0o001 == 0 {
                return Err(std::io::Error::other(format!(
                    "{} is inside {}, which other users cannot enter (mode {:o}): each sandbox runs as a user of its own and must reach its directory; chmod o+x it or choose another place",
                    root.display(),
                    dir.display(),
                    mode & 0o777
                )));
            }
        }
        Ok(provider.with_own_uids(FIRST_SANDBOX_UID))
    }

    /// The layout of a local sandbox: the project in `project/`, the watcher's pid in
    /// `watcher.pid` and its supervisor's in `supervisor.pid`, their output in `watcher.log`; no
    /// dev server.
    pub fn layout(&self) -> SandboxLayout {
        let watcher = shell_quote(&self.watcher_bin);
        SandboxLayout {
            project_dir: "project".into(),
            watcher_env_file: ".project-watcher/.env".into(),
            watcher_bin: self.watcher_bin.clone(),
            start_watcher: format!(
                "set -a; . \"$HOME/.project-watcher/.env\"; set +a; \
                 nohup sh -c 'while :; do \"$0\" watch & echo $! > \"$HOME/watcher.pid\"; wait $!; \
                 code=$?; case $code in 0|2|3) exit $code;; esac; sleep 1; done' {watcher} \
                 >> \"$HOME/watcher.log\" 2>&1 < /dev/null & echo $! > \"$HOME/supervisor.pid\""
            ),
            stop_watcher: STOP_WATCHER.into(),
            watcher_running: "kill -0 $(cat \"$HOME/watcher.pid\" 2>/dev/null) 2>/dev/null".into(),
            start_dev_server: "true".into(),
            stop_dev_server: "true".into(),
            install_cmd: self.install_cmd.clone(),
            failure_file: "sync-failure".into(),
            command_timeout: Duration::from_secs(60),
            sync_timeout: Duration::from_secs(15 * 60),
            health: None,
            exclude: Vec::new(),
        }
    }

    /// Stops the watcher of every sandbox (at shutdown: nothing outlives `serve`), each as the
    /// sandbox's own user: the pid files are the sandbox's to write. First no command starts
    /// any more and the running ones end (a background provision's `start watcher` would
    /// otherwise start a watcher after this stop).
    pub async fn stop_all(&self) {
        self.gate.close(STOP_PATIENCE).await;
        let (Ok(entries), Ok(provider)) = (std::fs::read_dir(&self.root), self.provider()) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(user) = UserId::parse(&name) else {
                continue;
            };
            let Ok(sandbox) = provider.connect(&user).await.map(LocalSandbox::ungated) else {
                continue;
            };
            let stop = Exec::new(STOP_WATCHER, Duration::from_secs(20)).cwd(entry.path());
            if let Err(e) = sandbox.exec(&stop).await {
                tracing::warn!(sandbox = name, error = %e, "cannot stop the watcher");
            }
        }
    }
}

/// Ends the supervisor first (so nothing restarts), then asks the watcher to save and stop
/// (SIGINT, as PM2 does) and waits for it. Succeeds when nothing was running.
const STOP_WATCHER: &str = "kill $(cat \"$HOME/supervisor.pid\" 2>/dev/null) 2>/dev/null; \
     pid=$(cat \"$HOME/watcher.pid\" 2>/dev/null) && kill -INT $pid 2>/dev/null && \
     while kill -0 $pid 2>/dev/null; do sleep 0.05; done; rm -f \"$HOME/watcher.pid\"; true";

/// `value` as one single-quoted shell word.
fn shell_quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', "'\\''"))
}

/// `project-watcher` from PATH, as an absolute path (the sandboxes' commands get PATH too, but
/// an absolute path shows in `ps` which binary runs).
pub fn watcher_on_path() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("project-watcher"))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_keeps_one_word() {
        assert_eq!(shell_quote("/a b/it's"), "'/a b/it'\\''s'");
    }
}
