//! The `shmastra-cloud serve` harness shared by `serve.rs` and `serve_attacks.rs`: the real
//! binary on `127.0.0.1:0` with a hermetic environment, its log file, and the sync command's
//! record of the events it ran for.
#![allow(dead_code)] // each test file uses its own part of the harness

pub mod workspace;

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use testkit::git::hermetic_env;
use testkit::wait;

pub const DEADLINE: Duration = Duration::from_secs(60);

/// A running `shmastra-cloud serve`; killed on drop.
pub struct Serve {
    pub child: Child,
    /// Kept open: serve prints its outcome on exit, and a closed pipe would fail that.
    _stdout: BufReader<std::process::ChildStdout>,
    secret: &'static str,
    pub addr: String,
    pub stderr: PathBuf,
    pub events: PathBuf,
    pub tmp: tempfile::TempDir,
}

/// `--on-external-push` that appends `user ref oid` to `events`, then runs `extra`.
pub fn record_command(events: &Path, extra: &str) -> String {
    format!(
        "printf '%s %s %s\\n' \"$SHMASTRA_USER\" \"$SHMASTRA_REF\" \"$SHMASTRA_NEW_OID\" >> '{}'; {extra}",
        events.display()
    )
}

impl Serve {
    /// Starts serve signed with `secret`; `sync_extra` is shell the sync command runs after it
    /// recorded the event.
    pub fn start(
        secret: &'static str,
        args: &[&str],
        env: &[(&str, &str)],
        sync_extra: &str,
    ) -> Serve {
        let tmp = tempfile::tempdir().expect("tempdir");
        let stderr = tmp.path().join("serve.log");
        let events = tmp.path().join("events");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_shmastra-cloud"));
        cmd.args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--on-external-push",
            &record_command(&events, sync_extra),
        ])
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("SHMASTRA_TOKEN_SECRET", secret)
        .envs(hermetic_env(tmp.path()))
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr).expect("log file"));
        let mut child = cmd.spawn().expect("start shmastra-cloud serve");
        let mut first = String::new();
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        stdout
            .read_line(&mut first)
            .expect("read the listening line");
        let addr = first
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| {
                panic!(
                    "serve did not start: {first:?}\n{}",
                    std::fs::read_to_string(&stderr).unwrap_or_default()
                )
            })
            .to_owned();
        Serve {
            child,
            _stdout: stdout,
            secret,
            addr,
            stderr,
            events,
            tmp,
        }
    }

    /// `token mint --user USER` with this server's secret.
    pub fn token(&self, user: &str) -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_shmastra-cloud"))
            .args(["token", "mint", "--user", user])
            .env_clear()
            .env("SHMASTRA_TOKEN_SECRET", self.secret)
            .output()
            .expect("token mint");
        assert!(
            out.status.success(),
            "token mint failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .expect("utf-8")
            .trim()
            .to_owned()
    }

    pub fn remote_url(&self, user: &str) -> String {
        format!(
            "http://x:{}@{}/api/git/{user}.git",
            self.token(user),
            self.addr
        )
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn connect(&self) -> TcpStream {
        let stream = TcpStream::connect(&self.addr).expect("connect to serve");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("read timeout");
        stream
    }

    pub fn events(&self) -> Vec<String> {
        std::fs::read_to_string(&self.events)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    pub fn wait_for_events(&self, n: usize) -> Vec<String> {
        wait::until_seen(DEADLINE, &format!("{n} sync command runs"), || {
            let events = self.events();
            if events.len() >= n {
                Ok(events)
            } else {
                Err(events)
            }
        })
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, then the exit status.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
        wait::until(DEADLINE, "serve exits", || {
            self.child.try_wait().expect("wait")
        })
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
