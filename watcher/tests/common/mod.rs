//! Shared by the watcher's integration tests: a temp repository and an in-process daemon.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use project_watcher::config::Config;
use project_watcher::daemon::{self, DaemonError};
use project_watcher::status;
use testkit::git::{git, init_repo, tree_of, tree_of_add_all_from};
use tokio::sync::oneshot;

/// Generous: other helpers' builds and tests share the two cores.
pub const PATIENCE: Duration = Duration::from_secs(60);

pub struct Repo {
    _tmp: tempfile::TempDir,
    pub dir: PathBuf,
}

impl Repo {
    pub fn new() -> Self {
        let tmp = tempfile::tempdir().expect("temp dir");
        let dir = tmp.path().join("project");
        init_repo(&dir);
        let dir = dir.canonicalize().expect("canonical repo path");
        Self { _tmp: tmp, dir }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    pub fn write(&self, rel: &str, body: &str) {
        let path = self.path(rel);
        std::fs::create_dir_all(path.parent().expect("has parent")).expect("mkdir -p");
        std::fs::write(path, body).expect("write file");
    }

    pub fn git(&self, args: &[&str]) -> String {
        git(&self.dir, args)
    }

    pub fn head_tree(&self) -> Option<String> {
        tree_of(&self.dir, "HEAD")
    }

    pub fn commit_count(&self) -> usize {
        if self.head_tree().is_none() {
            return 0;
        }
        self.git(&["rev-list", "--count", "HEAD"])
            .trim()
            .parse()
            .expect("a count")
    }

    /// Paths in HEAD, one per element (`-z`, so names with newlines survive).
    pub fn head_paths(&self) -> Vec<String> {
        if self.head_tree().is_none() {
            return Vec::new();
        }
        self.git(&["ls-tree", "-r", "-z", "--name-only", "--full-tree", "HEAD"])
            .split('\0')
            .filter(|p| !p.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// `git ls-tree` of HEAD for one path: mode, type, id.
    pub fn head_entry(&self, rel: &str) -> String {
        self.git(&["ls-tree", "HEAD", "--", rel])
    }

    pub fn config(&self) -> Config {
        let mut c = Config::new(&self.dir);
        c.debounce = Duration::from_millis(150);
        c.max_delay = Duration::from_secs(2);
        c.push = false;
        c
    }

    /// What `git add -A` would commit now, run on a copy of the repository's index (so tracked
    /// files stay tracked, as git keeps them).
    pub fn add_all_tree(&self) -> String {
        tree_of_add_all_from(&self.dir, Some(&self.dir.join(".git/index")))
    }

    /// Waits until HEAD's tree is what `git add -A` would commit now, and stays so for a
    /// while (so a transient match while the watcher is still busy does not count).
    pub fn wait_saved(&self) {
        self.wait_saved_within(PATIENCE);
    }

    /// [`Repo::wait_saved`] with a deadline of `patience`.
    pub fn wait_saved_within(&self, patience: Duration) {
        let stable_for = Duration::from_millis(500);
        let deadline = Instant::now() + patience;
        let mut equal_since: Option<Instant> = None;
        loop {
            let expected = self.add_all_tree();
            let actual = self.head_tree();
            if actual.as_deref() == Some(expected.as_str()) {
                let since = *equal_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= stable_for {
                    return;
                }
            } else {
                equal_since = None;
            }
            assert!(
                Instant::now() < deadline,
                "HEAD never matched `git add -A`.\nHEAD:\n{}\nstatus:\n{}",
                actual
                    .map(|_| self.git(&["ls-tree", "-r", "--full-tree", "HEAD"]))
                    .unwrap_or_default(),
                self.git(&["status", "--porcelain", "--ignored"]),
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn status(&self) -> Option<status::Status> {
        status::read(&self.dir.join(".git")).ok()
    }
}

/// A watcher running in this process, on its own runtime thread.
pub struct Daemon {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<Result<(), DaemonError>>>,
}

impl Daemon {
    /// Starts the daemon and waits for its "ready" status file.
    pub fn start(repo: &Repo, config: Config) -> Self {
        let status_file = status::status_path(&repo.dir.join(".git"));
        let _ = std::fs::remove_file(&status_file);
        let daemon = Self::spawn(config);
        testkit::wait::until(PATIENCE, "the watcher's status file", || {
            if let Some(thread) = &daemon.thread
                && thread.is_finished()
            {
                panic!("the watcher stopped during start-up");
            }
            status_file.exists().then_some(())
        });
        daemon
    }

    /// Starts the daemon without waiting for anything.
    pub fn spawn(config: Config) -> Self {
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(daemon::run(config, async {
                let _ = stopped.await;
            }))
        });
        Self {
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Sends the shutdown and returns what `run` returned.
    pub fn stop(mut self) -> Result<(), DaemonError> {
        self.finish()
    }

    /// Whether `run` has returned.
    pub fn finished(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Waits for `run` to return by itself.
    pub fn join(mut self) -> Result<(), DaemonError> {
        self.thread
            .take()
            .expect("joined once")
            .join()
            .expect("daemon thread does not panic")
    }

    fn finish(&mut self) -> Result<(), DaemonError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.thread.take() {
            Some(thread) => thread.join().expect("daemon thread does not panic"),
            None => Ok(()),
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

/// Inotify watches this process holds, from `/proc/self/fdinfo`.
pub fn inotify_watches_of_this_process() -> usize {
    let mut count = 0;
    for fd in std::fs::read_dir("/proc/self/fdinfo")
        .expect("procfs")
        .flatten()
    {
        if let Ok(text) = std::fs::read_to_string(fd.path()) {
            count += text
                .lines()
                .filter(|l| l.starts_with("inotify wd:"))
                .count();
        }
    }
    count
}

pub fn exists(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}
