//! The workspace page's harness: serve with the embedded upstream and sandboxes on this
//! machine (the real watcher in each), sign-in links from the real `login-link`, a laptop clone
//! pushing through the proxy, and a stop that leaves no watcher running.

use std::path::{Path, PathBuf};
use std::process::Command;

use testkit::git::git;

use super::Serve;

pub const SECRET: &str = "workspace-page-secret-0123456789abcdef";

/// The install command of the sandboxes' syncs: fails while the project holds `break-install`,
/// as npm does, with its cause first and more lines of usage text after it than the tail keeps;
/// waits while the sandbox (the project's parent) holds `hold-install`, so a test sees a sync
/// under way for as long as it needs.
pub const INSTALL_CMD: &str = "while [ -f ../hold-install ]; do sleep 0.1; done; if [ -f break-install ]; then echo 'npm ERR! code ETARGET' >&2; \
     echo 'npm ERR! notarget No matching version found for left-pad@9.9.9' >&2; \
     for i in $(seq 1 60); do echo \"npm usage: --omit <dep type> ($i)\" >&2; done; exit 1; fi";

/// A running serve with sandboxes; stopping it (also on drop) stops every watcher.
pub struct Workspace {
    pub serve: Serve,
    pub upstream: PathBuf,
    pub sandboxes: PathBuf,
    /// Where `login-link` reads the token generations: serve's database, else its token state
    /// directory (where serve also remembers used links).
    state_env: Vec<(String, String)>,
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
        Workspace::start_as(None, extra, env, prepare)
    }

    /// [`Workspace::start_with_env`] with serve run as `uid` when given (not root), its
    /// directories given to it.
    pub fn start_as(
        uid: Option<u32>,
        extra: &[&str],
        env: &[(&str, &str)],
        prepare: impl FnOnce(&Path),
    ) -> Workspace {
        let tmp = tempfile::tempdir().expect("tempdir");
        let base = tmp.path().to_owned();
        // As root, each sandbox runs as a user of its own, which must reach its directory.
        std::fs::set_permissions(&base, std::os::unix::fs::PermissionsExt::from_mode(0o711))
            .expect("chmod the workspace dir");
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
        ];
        if !extra.contains(&"--install-cmd") {
            args.extend(["--install-cmd".to_owned(), INSTALL_CMD.to_owned()]);
        }
        args.extend(extra.iter().map(|a| a.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let state = base.join("token-state");
        let state_env: Vec<(String, String)> = match env.iter().find(|(k, _)| *k == "DATABASE_URL")
        {
            Some((k, v)) => vec![(k.to_string(), v.to_string())],
            None => vec![(
                "SHMASTRA_TOKEN_STATE".to_owned(),
                state.display().to_string(),
            )],
        };
        let mut serve_env: Vec<(&str, &str)> = env.to_vec();
        serve_env.extend(state_env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        serve_env.dedup();
        if let Some(uid) = uid {
            super::give(&base, uid);
        }
        let serve = Serve::try_start_as(uid, SECRET, &args, &serve_env, Some("true"))
            .unwrap_or_else(|why| panic!("serve did not start: {why}"));
        Workspace {
            serve,
            upstream,
            sandboxes,
            state_env,
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
            .envs(self.state_env.iter().map(|(k, v)| (k, v)))
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

    /// A sign-in link for `user` that has expired: minted to live 1 s (`login-link` refuses
    /// `0s`), and returned once the page says it expired.
    pub fn expired_link(&self, user: &str) -> String {
        let link = self.link(user, "1s");
        testkit::wait::until(super::PATIENCE, "the 1 s link to expire", || {
            // On a thread of its own: the caller may be inside a tokio runtime.
            let (status, _, body) = std::thread::scope(|s| {
                s.spawn(|| super::page::get(&link, None))
                    .join()
                    .expect("GET the link")
            });
            (status == reqwest::StatusCode::UNAUTHORIZED && body.contains("expired")).then_some(())
        });
        link
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
