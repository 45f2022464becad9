//! Where things are inside a sandbox, and the commands that control its processes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use shmastra_contract::failure::DEFAULT_FAILURE_FILE;

/// Where things are inside a sandbox, and the commands that control its processes. Every
/// command runs with `sh -c` in the project directory. Relative paths are taken from the
/// sandbox's home directory.
#[derive(Debug, Clone)]
pub struct SandboxLayout {
    /// The project the watcher saves (`shmastra`: `/home/user/shmastra` in the template).
    pub project_dir: PathBuf,
    /// The watcher's environment (`PROJECT_TOKEN` and friends), read by the PM2 ecosystem
    /// file. Named `.env` because it holds a secret, and secrets live only in `.env` files.
    pub watcher_env_file: PathBuf,
    /// The `project-watcher` executable.
    pub watcher_bin: String,
    /// Starts the watcher.
    pub start_watcher: String,
    /// Stops the watcher and returns once it has exited.
    pub stop_watcher: String,
    /// Exits 0 when the watcher is running.
    pub watcher_running: String,
    /// Starts the project's dev server.
    pub start_dev_server: String,
    /// Stops the project's dev server.
    pub stop_dev_server: String,
    /// Overrides the lock file's own package manager during a sync.
    pub install_cmd: Option<String>,
    /// Where `project-watcher sync` leaves the failed step's output; beside it
    /// ([`SandboxLayout::step_file`]), the step under way.
    pub failure_file: PathBuf,
    /// The limit for short commands (git setup, PM2 control).
    pub command_timeout: Duration,
    /// The limit for a whole restore or sync, dependency install included.
    pub sync_timeout: Duration,
    /// When the dev server counts as up after a start, a sync or a restore; `None`: as soon
    /// as its start command returned.
    pub health: Option<HealthCheck>,
    /// Patterns the project's `.git/info/exclude` must hold before the watcher starts: what
    /// the sandbox writes into the project that is never the user's work (PM2's `.logs/`),
    /// whatever the saved `.gitignore` says.
    pub exclude: Vec<String>,
}

/// The dev server is up when its health URL answers with a 2xx, asked from inside the sandbox
/// (with `node`, which every Shmastra sandbox has).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    /// The URL inside the sandbox (`http://localhost:4111/health`: Mastra's dev server).
    pub url: String,
    /// How long it may take to come up (180 s, as the original cloud waited).
    pub timeout: Duration,
    /// The wait between two tries.
    pub interval: Duration,
    /// A log (relative to the home) whose last lines go in the failure when it does not come
    /// up: the dev server's own error output.
    pub log: Option<PathBuf>,
}

impl HealthCheck {
    /// Mastra's dev server on port 4111, as the original template runs it under PM2.
    pub fn shmastra() -> HealthCheck {
        HealthCheck {
            url: "http://localhost:4111/health".into(),
            timeout: Duration::from_secs(180),
            interval: Duration::from_secs(2),
            log: Some("shmastra/.logs/shmastra-error.log".into()),
        }
    }

    /// The shell command that polls the URL until it answers 2xx (exit 0) or the time is up
    /// (exit 1, the last answer or error on stderr, then the log's last 40 lines).
    pub(crate) fn command(&self, home: &Path) -> String {
        let probe = "const [url, total, every] = [process.argv[1], +process.argv[2], +process.argv[3]];             const end = Date.now() + total; let last = 'no answer';             (async function poll() {               try { const r = await fetch(url); if (r.ok) { console.log(url + ' answered ' + r.status); process.exit(0); }                     last = url + ' answered ' + r.status; }               catch (e) { last = url + ': ' + (e.cause ? (e.cause.code || e.cause.message) : e.message); }               if (Date.now() + every > end) { console.error(last); process.exit(1); }               setTimeout(poll, every);             })();";
        let log = match &self.log {
            Some(log) => {
                let log = home.join(log).display().to_string();
                format!(
                    " || {{ code=$?; echo {} >&2; tail -n 40 {} >&2 2>/dev/null; exit $code; }}",
                    quote(&format!("--- {log}:")),
                    quote(&log)
                )
            }
            None => String::new(),
        };
        format!(
            "node -e {} {} {} {}{log}",
            quote(probe),
            quote(&self.url),
            self.timeout.as_millis(),
            self.interval.as_millis().max(1)
        )
    }
}

/// `value` as one single-quoted shell word.
fn quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', "'\\''"))
}

impl SandboxLayout {
    /// Where `project-watcher sync` writes the step under way (`sync --step-file`): the
    /// failure file's path with `.step` added.
    pub fn step_file(&self) -> PathBuf {
        let mut path = self.failure_file.clone().into_os_string();
        path.push(".step");
        path.into()
    }

    /// The Shmastra sandbox template, as the original's: the project in `/home/user/shmastra`,
    /// PM2 (`/home/user/ecosystem.config.js`, this repository's `pm2/`) running the dev
    /// server as `shmastra` beside `healer`, and the watcher as `project-watcher`.
    pub fn shmastra() -> Self {
        Self {
            project_dir: "shmastra".into(),
            watcher_env_file: ".project-watcher/.env".into(),
            watcher_bin: "project-watcher".into(),
            start_watcher: "pm2 start \"$HOME/ecosystem.config.js\" --only project-watcher".into(),
            stop_watcher: "pm2 stop project-watcher".into(),
            watcher_running: "pm2 pid project-watcher | grep -q '^[1-9]'".into(),
            start_dev_server: "pm2 start \"$HOME/ecosystem.config.js\" --only shmastra,healer"
                .into(),
            stop_dev_server: "pm2 stop shmastra healer".into(),
            install_cmd: None,
            failure_file: DEFAULT_FAILURE_FILE.into(),
            command_timeout: Duration::from_secs(60),
            sync_timeout: Duration::from_secs(15 * 60),
            health: Some(HealthCheck::shmastra()),
            exclude: vec!["/.logs/".into()],
        }
    }
}
