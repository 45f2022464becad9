//! The workspace page's harness: serve with the embedded upstream and sandboxes on this
//! machine (the real watcher in each), sign-in links from the real `login-link`, a laptop clone
//! pushing through the proxy, and a stop that leaves no watcher running.

use std::path::{Path, PathBuf};
use std::process::Command;

use testkit::git::git;

use super::Serve;

pub const SECRET: &str = "workspace-page-secret-0123456789abcdef";

/// The install command of the sandboxes' syncs: fails, with an npm-like tail, while the
/// project holds `break-install`.
pub const INSTALL_CMD: &str = "if [ -f break-install ]; then echo 'npm ERR! code ETARGET' >&2; \
     echo 'npm ERR! notarget No matching version found for left-pad@9.9.9' >&2; exit 1; fi";

/// A running serve with sandboxes; stopping it (also on drop) stops every watcher.
pub struct Workspace {
    pub serve: Serve,
    pub upstream: PathBuf,
    pub sandboxes: PathBuf,
    stopped: bool,
    _tmp: tempfile::TempDir,
}

impl Workspace {
    /// serve with `--upstream-dir` and `--sandboxes-dir` in a temp dir; `prepare` runs on the
    /// upstream dir first (to seed a saved project); `extra` are more serve flags.
    pub fn start(extra: &[&str], prepare: impl FnOnce(&Path)) -> Workspace {
        Workspace::start_with_env(extra, &[], prepare)
    }

    /// [`Workspace::start`] with more environment for serve (`DATABASE_URL`).
    pub fn start_with_env(
        extra: &[&str],
        env: &[(&str, &str)],
        prepare: impl FnOnce(&Path),
    ) -> Workspace {
        let tmp = tempfile::tempdir().expect("tempdir");
        let base = tmp.path().to_owned();
        let upstream = base.join("upstream");
        let sandboxes = base.join("sandboxes");
        std::fs::create_dir_all(&upstream).expect("upstream dir");
        prepare(&upstream);
        let watcher = testkit::cargo_bin::project_watcher();
        let mut args = vec![
            "--upstream-dir".to_owned(),
            upstream.display().to_string(),
            "--sandboxes-dir".to_owned(),
            sandboxes.display().to_string(),
            "--watcher-bin".to_owned(),
            watcher.display().to_string(),
            "--install-cmd".to_owned(),
            INSTALL_CMD.to_owned(),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let serve = Serve::start(SECRET, &args, env, "true");
        Workspace {
            serve,
            upstream,
            sandboxes,
            stopped: false,
            _tmp: tmp,
        }
    }

    /// A sign-in link for `user` from the real binary.
    pub fn link(&self, user: &str, ttl: &str) -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_shmastra-cloud"))
            .args(["login-link", "--user", user, "--ttl", ttl, "--public-url"])
            .arg(self.serve.url(""))
            .env_clear()
            .env("SHMASTRA_TOKEN_SECRET", SECRET)
            .output()
            .expect("login-link");
        assert!(
            out.status.success(),
            "login-link failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .expect("utf-8")
            .trim()
            .to_owned()
    }

    pub fn project(&self, user: &str) -> PathBuf {
        self.sandboxes.join(user).join("project")
    }

    pub fn upstream_repo(&self, user: &str) -> PathBuf {
        self.upstream.join(format!("{user}.git"))
    }

    /// A clone of `user`'s project through the proxy, as on a laptop.
    pub fn laptop(&self, user: &str, dir: &Path) {
        let url = self.serve.remote_url(user);
        std::fs::create_dir_all(dir).expect("laptop dir");
        git(dir, ["clone", "-q", &url, "."]);
    }

    /// SIGTERM: serve stops the watchers; then no process runs from the sandboxes.
    pub fn stop(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        let status = self.serve.stop();
        assert!(status.success(), "serve exited with {status}");
        for pid_file in ["watcher.pid", "supervisor.pid"] {
            for entry in std::fs::read_dir(&self.sandboxes)
                .into_iter()
                .flatten()
                .flatten()
            {
                if let Ok(pid) = std::fs::read_to_string(entry.path().join(pid_file)) {
                    let alive = Command::new("kill")
                        .args(["-0", pid.trim()])
                        .stderr(std::process::Stdio::null())
                        .status()
                        .is_ok_and(|s| s.success());
                    assert!(
                        !alive,
                        "{pid_file} {} still runs after serve stopped",
                        pid.trim()
                    );
                }
            }
        }
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        if !self.stopped && !std::thread::panicking() {
            self.stop();
        } else if !self.stopped {
            // A failed test: end what it started without asserting again.
            let _ = Command::new("kill")
                .args(["-TERM", &self.serve.pid().to_string()])
                .status();
            let _ = self.serve.child.wait();
        }
    }
}

/// The HTML-escaped value of the first `name="csrf"` field in `html`.
pub fn csrf_of(html: &str) -> String {
    let at = html
        .find("name=\"csrf\" value=\"")
        .expect("a form with a CSRF token")
        + 19;
    html[at..]
        .split('"')
        .next()
        .expect("a closing quote")
        .to_owned()
}
