//! The `shmastra-cloud serve` harness shared by `serve.rs` and the `serve_attacks_*.rs` tests:
//! the real binary on `127.0.0.1:0` with a hermetic environment, its log file, and the sync
//! command's record of the events it ran for.
#![allow(dead_code)] // each test file uses its own part of the harness

pub mod attack;
pub mod page;
pub mod workspace;

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use testkit::git::{git, hermetic_env, init_repo};
use testkit::wait;

pub use testkit::wait::PATIENCE;

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
        Serve::try_start(secret, args, env, Some(sync_extra))
            .unwrap_or_else(|why| panic!("serve did not start: {why}"))
    }

    /// [`Serve::start`] (with no `--on-external-push` when `sync_extra` is `None`), or what
    /// serve printed when it did not start (it exited).
    pub fn try_start(
        secret: &'static str,
        args: &[&str],
        env: &[(&str, &str)],
        sync_extra: Option<&str>,
    ) -> Result<Serve, String> {
        Serve::try_start_as(None, secret, args, env, sync_extra)
    }

    /// [`Serve::try_start`] as `uid` (its group the same number) when given: its own files
    /// (the log, `HOME`) are given to it.
    pub fn try_start_as(
        uid: Option<u32>,
        secret: &'static str,
        args: &[&str],
        env: &[(&str, &str)],
        sync_extra: Option<&str>,
    ) -> Result<Serve, String> {
        let tmp = tempfile::tempdir().expect("tempdir");
        let stderr = tmp.path().join("serve.log");
        let events = tmp.path().join("events");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_shmastra-cloud"));
        cmd.arg("serve");
        if !args.contains(&"--listen") {
            cmd.args(["--listen", "127.0.0.1:0"]);
        }
        if let Some(extra) = sync_extra {
            cmd.args(["--on-external-push", &record_command(&events, extra)]);
        }
        cmd.args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("SHMASTRA_TOKEN_SECRET", secret)
            .envs(hermetic_env(tmp.path()))
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).expect("log file"));
        if let Some(uid) = uid {
            give(tmp.path(), uid);
            use std::os::unix::process::CommandExt as _;
            cmd.uid(uid).gid(uid);
        }
        let mut child = cmd.spawn().expect("start shmastra-cloud serve");
        let mut first = String::new();
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        stdout
            .read_line(&mut first)
            .expect("read the listening line");
        let Some(addr) = first
            .trim()
            .strip_prefix("listening on ")
            .map(str::to_owned)
        else {
            let _ = child.wait();
            return Err(format!(
                "{first:?}\n{}",
                std::fs::read_to_string(&stderr).unwrap_or_default()
            ));
        };
        Ok(Serve {
            child,
            _stdout: stdout,
            secret,
            addr,
            stderr,
            events,
            tmp,
        })
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

    /// `GET path` on its own connection: the status and the body.
    pub fn get(&self, path: &str) -> (u16, String) {
        use std::io::{Read, Write};
        let mut stream = self.connect();
        stream
            .write_all(
                format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
            )
            .expect("send the request");
        let mut response = String::new();
        stream
            .read_to_string(&mut response)
            .expect("read the response");
        let status = response
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"));
        let body = response
            .split_once("\r\n\r\n")
            .map(|(_, body)| body.to_owned())
            .unwrap_or_default();
        (status, body)
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
        wait::until_seen(PATIENCE, &format!("{n} sync command runs"), || {
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
        wait::until(PATIENCE, "serve exits", || {
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

/// Gives everything under `dir` to `uid` (and the group of that number).
pub fn give(dir: &Path, uid: u32) {
    let status = Command::new("chown")
        .args(["-R", &format!("{uid}:{uid}")])
        .arg(dir)
        .status()
        .expect("chown");
    assert!(status.success(), "chown -R {uid} {}", dir.display());
}

/// A work tree with one commit on `main` whose remote `origin` is `url`; returns its HEAD.
pub fn work_tree(dir: &Path, url: &str) -> String {
    init_repo(dir);
    std::fs::write(dir.join("a.txt"), "a\n").expect("write");
    git(dir, ["add", "-A"]);
    git(dir, ["commit", "-qm", "first"]);
    git(dir, ["remote", "add", "origin", url]);
    git(dir, ["rev-parse", "HEAD"]).trim().to_owned()
}
