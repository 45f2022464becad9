//! The two watchers under test, started the same way: in a process group of their own, with
//! the hermetic git environment, their output in a log file outside the project, and "ready"
//! taken from what each one says when it has finished setting up.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::Serialize;

use super::fixture::Fixture;
use super::procs::{Sample, sample_group};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Side {
    /// `xtask/bench/baseline.sh`, the original system's watcher: inotifywait and the git CLI,
    /// restarted by `xtask/bench/autorestart.sh` when it exits, as PM2 restarts it.
    Baseline,
    /// `project-watcher watch`, release build.
    Watcher,
}

impl Side {
    pub fn name(self) -> &'static str {
        match self {
            Side::Baseline => "baseline",
            Side::Watcher => "watcher",
        }
    }
}

/// What starts each side.
pub struct Programs {
    pub baseline_script: PathBuf,
    pub autorestart_script: PathBuf,
    pub watcher_binary: PathBuf,
}

/// How long a side may take to get ready or to stop before the bench calls it broken.
const READY_DEADLINE: Duration = Duration::from_secs(180);
const STOP_DEADLINE: Duration = Duration::from_secs(30);
const BASELINE_READY_LINE: &str = "Watches established.";
/// The watcher's JSON log line once every watch is set and the first save is done.
const WATCHER_READY_MESSAGE: &str = r#""message":"ready""#;

pub struct Running {
    pub side: Side,
    child: Child,
    /// Spawned with `process_group(0)`: the group id is the child's pid.
    pgid: u32,
    pub ready_after: Duration,
    log: PathBuf,
}

impl Running {
    /// Starts `side` on the fixture and returns once it is ready.
    pub fn start(
        side: Side,
        programs: &Programs,
        fixture: &Fixture,
        settle: Duration,
        case: &str,
    ) -> Result<Self> {
        let log = fixture.logs.join(format!("{}-{case}.log", side.name()));
        let mut cmd = match side {
            Side::Baseline => {
                let mut cmd = Command::new("bash");
                cmd.arg(&programs.autorestart_script)
                    .arg(&programs.baseline_script)
                    .arg(&fixture.project)
                    .arg(format!("{}", settle.as_secs_f64()));
                cmd
            }
            Side::Watcher => {
                let mut cmd = Command::new(&programs.watcher_binary);
                cmd.arg("watch")
                    .arg("--dir")
                    .arg(&fixture.project)
                    .arg("--debounce")
                    .arg(format!("{}ms", settle.as_millis()))
                    .arg("--log-format")
                    .arg("json");
                cmd
            }
        };
        let status_file = fixture.project.join(".git/project-watcher/status.json");
        if side == Side::Watcher {
            let _ = std::fs::remove_file(&status_file);
        }
        cmd.current_dir(&fixture.project)
            .envs(fixture.git.env())
            .env_remove("PROJECT_TOKEN")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let started = Instant::now();
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting the {} side: {cmd:?}", side.name()))?;
        let pgid = child.id();
        let (lines_tx, lines_rx) = mpsc::channel::<String>();
        let file = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        for stream in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let mut file = file.try_clone()?;
            let tx = lines_tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines() {
                    let Ok(line) = line else { break };
                    let _ = writeln!(file, "{line}");
                    let _ = tx.send(line);
                }
            });
        }
        drop(lines_tx);

        let mut running = Self {
            side,
            child,
            pgid,
            ready_after: Duration::ZERO,
            log,
        };
        let ready = |line: Option<&str>| match side {
            Side::Baseline => line.is_some_and(|l| l.contains(BASELINE_READY_LINE)),
            Side::Watcher => {
                line.is_some_and(|l| l.contains(WATCHER_READY_MESSAGE))
                    || watcher_reports_ready(&status_file, pgid)
            }
        };
        loop {
            // The baseline announces itself on stderr, the watcher in its log; its status file
            // (state `idle` with its pid) is checked too, every few milliseconds.
            let line = match lines_rx.recv_timeout(Duration::from_millis(5)) {
                Ok(line) => Some(line),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    std::thread::sleep(Duration::from_millis(5));
                    None
                }
            };
            if ready(line.as_deref()) {
                running.ready_after = started.elapsed();
                break;
            }
            if let Some(status) = running.child.try_wait()? {
                bail!(
                    "the {} side exited with {status} before it was ready; its log:\n{}",
                    side.name(),
                    running.log_tail()
                );
            }
            if started.elapsed() > READY_DEADLINE {
                let tail = running.log_tail();
                running.stop()?;
                bail!(
                    "the {} side was not ready after {READY_DEADLINE:?}; its log:\n{tail}",
                    side.name()
                );
            }
        }
        // Later lines only go to the log file.
        std::thread::spawn(move || for _ in lines_rx {});
        Ok(running)
    }

    /// What the side's process group costs now. The baseline's group leader is its
    /// autorestart loop, standing in for PM2: its CPU counts (a restarted baseline's time is
    /// in its `cutime`), its memory does not, as PM2's is not counted for the watcher.
    pub fn sample(&self) -> Result<Sample> {
        sample_group(self.pgid, self.side == Side::Baseline)
    }

    /// The last lines of the side's log, for error messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// SIGTERM to the whole group (the watcher saves what is pending and exits; the baseline's
    /// shell, subshell and inotifywait all end), then SIGKILL if it lingers.
    pub fn stop(mut self) -> Result<()> {
        signal_group(self.pgid, "TERM");
        let deadline = Instant::now() + STOP_DEADLINE;
        loop {
            if self.child.try_wait()?.is_some() {
                break;
            }
            if Instant::now() > deadline {
                signal_group(self.pgid, "KILL");
                self.child.wait()?;
                bail!(
                    "the {} side did not stop within {STOP_DEADLINE:?} of SIGTERM",
                    self.side.name()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // inotifywait may outlive its shell for a moment.
        signal_group(self.pgid, "KILL");
        Ok(())
    }
}

fn signal_group(pgid: u32, signal: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg("--")
        .arg(format!("-{pgid}"))
        .stderr(Stdio::null())
        .status();
}

/// The watcher writes its status file with state `idle` once start-up is complete.
fn watcher_reports_ready(status_file: &Path, pid: u32) -> bool {
    let Ok(raw) = std::fs::read(status_file) else {
        return false;
    };
    let Ok(status) = serde_json::from_slice::<serde_json::Value>(&raw) else {
        return false;
    };
    status["state"] == "idle" && status["pid"] == pid
}
