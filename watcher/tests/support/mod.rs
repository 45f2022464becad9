//! The watcher's test harness, shared by every integration test: here, a project with a
//! remote, the real `project-watcher` binary started, killed and restarted, and the checks
//! every reliability case ends with (the remote holds the working tree, `git fsck` is clean,
//! the daemon idles); in [`in_process`], a repository without a remote and the daemon run on a
//! thread of the test process.

#![allow(dead_code)] // each test binary uses its own part of the harness

pub mod in_process;

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use project_watcher::status::{self, State, Status};
use testkit::git::{command, git, git_output, hermetic_env, init_bare, init_repo, tree_of};
use testkit::git_server::GitServer;
pub use testkit::wait::PATIENCE;
use testkit::wait::{until, until_seen};

/// A number from the environment (the soak raises them), or the short-run default.
pub fn knob(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The line the soak collects for RELIABILITY.md.
pub fn report(case: &str, figures: &str) {
    println!("RELIABILITY {case}: {figures}");
}

/// A small seeded generator (splitmix64): a failing run is replayed with its printed seed.
pub struct Rng(u64);

impl Rng {
    /// From `RELIABILITY_SEED`, else the clock; the seed is printed either way.
    pub fn from_env(case: &str) -> Self {
        let seed = std::env::var("RELIABILITY_SEED")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
            });
        println!("{case}: RELIABILITY_SEED={seed}");
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub fn millis(&mut self, max: u64) -> Duration {
        Duration::from_millis(self.below(max + 1))
    }
}

/// A working tree with a `project` remote: a local bare repository, or a bare repository
/// served over smart HTTP by `testkit::git_server` (for network faults).
pub struct Project {
    pub root: PathBuf,
    pub work: PathBuf,
    pub bare: PathBuf,
    pub home: PathBuf,
    pub server: Option<GitServer>,
}

impl Project {
    /// A project under `root` pushing to a local bare repository.
    pub fn local(root: &Path) -> Self {
        let bare = root.join("remote.git");
        init_bare(&bare);
        Self::with_remote(root, bare.clone(), bare.to_string_lossy().into_owned())
    }

    /// A project under `root` pushing over HTTP to `git http-backend`.
    pub fn served(root: &Path) -> Self {
        let server = GitServer::start(&root.join("srv"));
        let bare = server.create_bare("user.git");
        let url = server.url("user.git");
        let mut project = Self::with_remote(root, bare, url);
        project.server = Some(server);
        project
    }

    fn with_remote(root: &Path, bare: PathBuf, url: String) -> Self {
        let work = root.join("project");
        init_repo(&work);
        git(&work, ["remote", "add", "project", &url]);
        let home = root.join("home");
        fs::create_dir_all(&home).unwrap();
        Self {
            root: root.to_owned(),
            work,
            bare,
            home,
            server: None,
        }
    }

    /// The repository's git directory (a linked worktree's `.git` file names it).
    pub fn git_dir(&self) -> PathBuf {
        let dot_git = self.work.join(".git");
        match fs::read_to_string(&dot_git) {
            Ok(text) => PathBuf::from(text.trim().trim_start_matches("gitdir: ")),
            Err(_) => dot_git,
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.work.join(rel)
    }

    pub fn write(&self, rel: &str, body: impl AsRef<[u8]>) {
        let path = self.work.join(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).unwrap();
        }
        fs::write(path, body).unwrap();
    }

    pub fn status(&self) -> Option<Status> {
        status::read(&self.git_dir()).ok()
    }

    /// Waits for a status the check accepts; the last status seen is in the panic message.
    pub fn wait_status(
        &self,
        what: &str,
        timeout: Duration,
        check: impl Fn(&Status) -> bool,
    ) -> Status {
        until_seen(timeout, what, || match self.status() {
            Some(s) if check(&s) => Ok(s),
            other => Err(Box::new(other)),
        })
    }

    /// The watcher, started with short debounce times; logs (JSON, debug) go to a file
    /// outside the project.
    pub fn spawn(&self, args: &[&str], envs: &[(&str, &str)]) -> Watcher {
        self.spawn_via(None, args, envs)
    }

    /// [`Self::start`] as another user: `setpriv` with `ids` (`--reuid=...`).
    pub fn start_as(&self, ids: &[&str], args: &[&str]) -> Watcher {
        let watcher = self.spawn_via(Some(ids), args, &[]);
        self.wait_started(watcher)
    }

    fn spawn_via(&self, setpriv: Option<&[&str]>, args: &[&str], envs: &[(&str, &str)]) -> Watcher {
        let log = self.root.join(format!("watcher-{}.log", now_nanos()));
        let bin = env!("CARGO_BIN_EXE_project-watcher");
        let mut cmd = match setpriv {
            Some(ids) => {
                let mut cmd = Command::new("setpriv");
                cmd.args(ids).arg(bin);
                cmd
            }
            None => Command::new(bin),
        };
        cmd.args(["watch", "--dir"])
            .arg(&self.work)
            .args(["--log-format", "json"])
            .args(args)
            .env_remove("PROJECT_TOKEN")
            .env("RUST_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap());
        if !args.contains(&"--debounce") {
            cmd.args(["--debounce", "100ms", "--max-delay", "1s"]);
        }
        for (k, v) in hermetic_env(&self.home) {
            cmd.env(k, v);
        }
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("start project-watcher");
        Watcher { child, log }
    }

    /// [`Self::spawn`], then waits until the watcher wrote its first status.
    pub fn start(&self, args: &[&str], envs: &[(&str, &str)]) -> Watcher {
        let watcher = self.spawn(args, envs);
        self.wait_started(watcher)
    }

    fn wait_started(&self, mut watcher: Watcher) -> Watcher {
        let pid = watcher.pid();
        let deadline = Instant::now() + PATIENCE;
        while self.status().is_none_or(|s| s.pid != pid) {
            if let Some(exit) = watcher.child.try_wait().unwrap() {
                panic!(
                    "the watcher exited with {exit} at start:\n{}",
                    watcher.logs()
                );
            }
            assert!(
                Instant::now() < deadline,
                "the watcher did not start:\n{}",
                watcher.logs()
            );
            std::thread::sleep(Duration::from_millis(25));
        }
        watcher
    }

    /// What `git add -A` would commit now, leaving out the paths in `except`.
    pub fn expected_tree(&self, except: &[&str]) -> String {
        let scratch = tempfile::NamedTempFile::new().unwrap();
        let index = scratch.path().to_owned();
        drop(scratch);
        let mut args = vec!["add", "-A", "--", "."];
        let excluded: Vec<String> = except
            .iter()
            .map(|p| format!(":(exclude,literal){p}"))
            .collect();
        args.extend(excluded.iter().map(String::as_str));
        let run = |args: &[&str]| {
            let out = command(&self.work)
                .env("GIT_INDEX_FILE", &index)
                .args(args)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "git {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).trim().to_owned()
        };
        run(&args);
        let tree = run(&["write-tree"]);
        let _ = fs::remove_file(&index);
        tree
    }

    /// Waits until `HEAD` holds what `git add -A` would commit (minus `except`).
    pub fn wait_committed(&self, except: &[&str], timeout: Duration) {
        until(timeout, "HEAD to hold the working tree", || {
            let expected = self.expected_tree(except);
            (tree_of(&self.work, "HEAD").as_deref() == Some(expected.as_str())).then_some(())
        });
    }

    /// Waits until the remote `main` holds the working tree and the status says all is pushed.
    pub fn wait_pushed(&self, timeout: Duration) -> Status {
        until_seen(
            timeout,
            "the remote to hold the working tree and the status to say all is pushed",
            || {
                let expected = self.expected_tree(&[]);
                let remote = tree_of(&self.bare, "main");
                match self.status() {
                    Some(s)
                        if remote.as_deref() == Some(expected.as_str())
                            && s.unpushed_commits == 0
                            && s.state == State::Idle
                            && s.last_push_error.is_none() =>
                    {
                        Ok(s)
                    }
                    status => Err(Box::new((remote, expected, status))),
                }
            },
        )
    }

    /// The bytes of `rel` in the remote `main`, `None` when it has no such path.
    pub fn remote_file(&self, rel: &str) -> Option<Vec<u8>> {
        let out = git_output(&self.bare, ["cat-file", "blob", &format!("main:{rel}")]);
        out.status.success().then_some(out.stdout)
    }

    /// The paths where `rev` of the repository at `repo` differs from what `git add -A` would
    /// commit now (minus `except`): the changes that did not get there. Measured, for the
    /// figures the soak reports.
    pub fn unsaved_paths(&self, repo: &Path, rev: &str, except: &[&str]) -> usize {
        let expected = self.expected_tree(except);
        let args = match tree_of(repo, rev) {
            Some(actual) => vec!["diff-tree", "-r", "-z", "--name-only", &expected, &actual]
                .into_iter()
                .map(str::to_owned)
                .collect::<Vec<_>>(),
            None => ["ls-tree", "-r", "-z", "--name-only", &expected]
                .into_iter()
                .map(str::to_owned)
                .collect(),
        };
        git(&self.work, &args)
            .split('\0')
            .filter(|p| !p.is_empty())
            .count()
    }

    /// Directories of the working tree (the top included, `.git` not): what the watcher
    /// watches when nothing is ignored.
    pub fn directories(&self) -> usize {
        fn walk(dir: &Path) -> usize {
            1 + fs::read_dir(dir)
                .unwrap()
                .flatten()
                .filter(|e| e.file_name() != ".git" && e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| walk(&e.path()))
                .sum::<usize>()
        }
        walk(&self.work)
    }

    /// `git fsck --full --strict` in the working repository and the remote both pass.
    pub fn assert_fsck_clean(&self) {
        for dir in [&self.work, &self.bare] {
            let out = git_output(dir, ["fsck", "--full", "--strict", "--no-progress"]);
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                out.status.success(),
                "git fsck in {}:\n{text}",
                dir.display()
            );
            for bad in ["error", "missing", "broken", "corrupt", "bad "] {
                assert!(
                    !text.contains(bad),
                    "git fsck in {}:\n{text}",
                    dir.display()
                );
            }
        }
    }
}

/// A running `project-watcher watch`.
pub struct Watcher {
    pub child: Child,
    pub log: PathBuf,
}

impl Watcher {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL: no flush, no cleanup, as a crash or an OOM kill.
    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGSTOP, returning once every thread of the watcher is stopped: what it was doing at
    /// that moment can then be read from its files before a [`Self::kill9`] ends it there.
    pub fn freeze(&self) {
        let pid = self.child.id();
        let sent = Command::new("kill")
            .args(["-STOP", &pid.to_string()])
            .status()
            .unwrap();
        assert!(sent.success(), "SIGSTOP {pid}");
        until(PATIENCE, "every thread of the watcher to stop", || {
            let tasks = fs::read_dir(format!("/proc/{pid}/task")).ok()?;
            tasks
                .flatten()
                .all(|task| {
                    fs::read_to_string(task.path().join("stat")).is_ok_and(|stat| {
                        let after = &stat[stat.rfind(')').map_or(0, |i| i + 2)..];
                        after.starts_with('T') || after.starts_with('t')
                    })
                })
                .then_some(())
        });
    }

    /// SIGTERM, then the exit status and the logs.
    pub fn stop(mut self) -> (ExitStatus, String) {
        let pid = self.child.id().to_string();
        assert!(
            Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success()
        );
        let status = until(PATIENCE, "the watcher to exit", || {
            self.child.try_wait().unwrap()
        });
        (status, self.logs())
    }

    pub fn logs(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// CPU seconds (user + system) the watcher used so far.
    pub fn cpu_seconds(&self) -> f64 {
        let stat = fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
        // Fields after the `(comm)`, which may hold spaces: state is field 3, utime 14, stime 15.
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let fields: Vec<&str> = after.split(' ').collect();
        let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        ticks as f64 / clock_ticks_per_second()
    }

    /// CPU seconds used over `window` (the watcher must be idle or backing off meanwhile).
    pub fn cpu_over(&self, window: Duration) -> f64 {
        let before = self.cpu_seconds();
        std::thread::sleep(window);
        self.cpu_seconds() - before
    }

    /// How many times the watcher's threads were scheduled over `window` (context switches,
    /// voluntary or not, of every thread alive at its end): 0 for a watcher that no timer
    /// wakes.
    pub fn wakeups_over(&self, window: Duration) -> u64 {
        let before = self.context_switches();
        std::thread::sleep(window);
        self.context_switches()
            .iter()
            .map(|(tid, n)| n - before.get(tid).copied().unwrap_or(0))
            .sum()
    }

    fn context_switches(&self) -> BTreeMap<u32, u64> {
        let tasks = fs::read_dir(format!("/proc/{}/task", self.child.id())).unwrap();
        tasks
            .flatten()
            .filter_map(|task| {
                let tid = task.file_name().to_str()?.parse().ok()?;
                let status = fs::read_to_string(task.path().join("status")).ok()?;
                let switches = status
                    .lines()
                    .filter(|l| l.contains("ctxt_switches:"))
                    .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                    .sum();
                Some((tid, switches))
            })
            .collect()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn clock_ticks_per_second() -> f64 {
    let out = Command::new("getconf").arg("CLK_TCK").output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(100.0)
}

pub fn now_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// Running as root (mounts, sysctls, other users).
pub fn is_root() -> bool {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// A case that cannot run on this machine. With `REQUIRE_PRIVILEGED=1` (`.ci/run` sets it)
/// that is a failure. Elsewhere the line goes straight to the terminal, past the test
/// harness's capture of a passing test's output, and into the list `cargo xtask ci` prints
/// at the end.
pub fn skip(case: &str, why: &str) {
    if std::env::var("REQUIRE_PRIVILEGED").is_ok_and(|v| v == "1") {
        panic!("{case} did not run ({why}), and REQUIRE_PRIVILEGED=1 requires it");
    }
    let line = format!("SKIPPED {case}: {why}");
    let _ = writeln!(std::io::stderr(), "{line}");
    println!("{line}");
    if let Ok(mut list) = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(skipped_list())
    {
        let _ = writeln!(list, "{line}");
    }
}

/// Where [`skip`] lists the skipped cases of a test run (`cargo xtask ci` clears and prints it).
pub fn skipped_list() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("skipped-tests.txt")
}

/// Whether this process may mount file systems: root, and a test mount of a tmpfs works (a
/// container's root often may not). When not, the case is skipped (see [`skip`]).
pub fn can_mount(case: &str) -> bool {
    if !is_root() {
        skip(case, "needs root to mount file systems");
        return false;
    }
    let probe = tempfile::tempdir().unwrap();
    let out = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
        .arg(probe.path())
        .output();
    match out {
        Ok(out) if out.status.success() => {
            let _ = Command::new("umount").arg(probe.path()).status();
            true
        }
        Ok(out) => {
            let why = format!(
                "root, but mount fails: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            skip(case, &why);
            false
        }
        Err(e) => {
            skip(case, &format!("cannot run mount: {e}"));
            false
        }
    }
}

/// A tmpfs of `size` mounted at `at`, unmounted on drop; `None` (the case skipped, see
/// [`skip`]) when this process may not mount.
pub struct Tmpfs {
    pub at: PathBuf,
}

impl Tmpfs {
    pub fn mount(at: &Path, size: &str, case: &str) -> Option<Self> {
        if !can_mount(case) {
            return None;
        }
        fs::create_dir_all(at).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .unwrap();
        assert!(ok.success(), "mount a tmpfs at {}", at.display());
        Some(Self { at: at.to_owned() })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.at).status();
    }
}
