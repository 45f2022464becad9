//! The in-process half of the harness: a temp repository without a remote and the daemon
//! running on a thread of the test process.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, Once};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use project_watcher::config::Config;
use project_watcher::daemon::{self, DaemonError};
use project_watcher::status;
use testkit::git::{git, init_repo, tree_of, tree_of_add_all_from};
use tokio::sync::oneshot;

use super::PATIENCE;

/// The tree of no files.
const EMPTY_TREE: &str = "4b825dc642cb6eb9a060e54bf8d69288fbee4904";

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
            // On an unborn branch with nothing to add, `git commit` commits nothing ("nothing
            // to commit"): no HEAD is what git leaves.
            let saved = match &actual {
                Some(tree) => *tree == expected,
                None => expected == EMPTY_TREE,
            };
            if saved {
                let since = *equal_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= stable_for {
                    return;
                }
            } else {
                equal_since = None;
            }
            assert!(
                Instant::now() < deadline,
                "HEAD never matched `git add -A`.\nHEAD:\n{}\ngit status:\n{}\nthe watcher's status: {:?}",
                actual
                    .map(|_| self.git(&["ls-tree", "-r", "--full-tree", "HEAD"]))
                    .unwrap_or_default(),
                self.git(&["status", "--porcelain", "--ignored"]),
                self.status(),
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn status(&self) -> Option<status::Status> {
        status::read(&self.dir.join(".git")).ok()
    }
}

/// Sets up a state with `setup` (real git commands), computes git's answer (`git add -A` on
/// a copy of the index as the user left it), starts the watcher and waits until HEAD holds
/// exactly that tree.
pub fn check_state(name: &str, setup: impl Fn(&Repo)) -> (Repo, Daemon) {
    let repo = Repo::new();
    repo.write("base.txt", "base");
    // What the watcher writes before its first pass, so that git's answer includes it.
    repo.write(
        "shmastra.json",
        &shmastra_contract::Manifest::default().to_json(),
    );
    setup(&repo);
    let expected = repo.add_all_tree();
    let daemon = Daemon::start(&repo, repo.config());
    testkit::wait::until_seen(PATIENCE, name, || {
        let head = repo.head_tree();
        if head.as_deref() == Some(expected.as_str()) {
            Ok(())
        } else {
            Err((
                head.map(|_| repo.git(&["ls-tree", "-r", "HEAD"])),
                repo.git(&["ls-tree", "-r", &expected]),
            ))
        }
    });
    (repo, daemon)
}

/// `git add -A` + `git commit` as a user does, so that later states start from a history.
pub fn commit_all(repo: &Repo, force: &[&str]) {
    repo.git(&["add", "-A"]);
    for path in force {
        repo.git(&["add", "-f", path]);
    }
    repo.git(&["commit", "-qm", "user commit"]);
}

/// A watcher running in this process, on its own runtime thread.
pub struct Daemon {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<Result<(), DaemonError>>>,
    /// The name of this daemon's threads, under which its log lines are kept.
    name: String,
}

/// The prefix of the names of every daemon's threads (its runtime's workers and the thread that
/// drives it); a log line from such a thread is kept for that daemon.
const DAEMON_THREAD: &str = "test-daemon-";

/// Log lines (as the binary's pretty format writes them, without times) by daemon thread name.
static LOGS: Mutex<Option<HashMap<String, String>>> = Mutex::new(None);

/// Files each log line under the name of the thread that wrote it, when that is a daemon's.
struct ThreadLog;

impl std::io::Write for ThreadLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Some(name) = std::thread::current().name()
            && name.starts_with(DAEMON_THREAD)
        {
            let mut logs = LOGS.lock().unwrap_or_else(|e| e.into_inner());
            logs.get_or_insert_with(HashMap::new)
                .entry(name.to_owned())
                .or_default()
                .push_str(&String::from_utf8_lossy(buf));
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs, once per test binary, the subscriber that keeps each daemon's log lines.
fn capture_logs() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_writer(|| ThreadLog)
            .with_ansi(false)
            .without_time()
            .try_init();
    });
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
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        capture_logs();
        let name = format!("{DAEMON_THREAD}{}", NEXT.fetch_add(1, Ordering::Relaxed));
        let (stop, stopped) = oneshot::channel::<()>();
        let threads = name.clone();
        let thread = std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name(threads)
                    .enable_all()
                    .build()
                    .expect("runtime");
                runtime.block_on(daemon::run(config, async {
                    let _ = stopped.await;
                }))
            })
            .expect("spawn the daemon's thread");
        Self {
            stop: Some(stop),
            thread: Some(thread),
            name,
        }
    }

    /// What this daemon has logged so far from its runtime's threads (the watch stage, the
    /// debounce, the daemon's own task; not the save thread).
    pub fn logs(&self) -> String {
        let logs = LOGS.lock().unwrap_or_else(|e| e.into_inner());
        logs.as_ref()
            .and_then(|logs| logs.get(&self.name))
            .cloned()
            .unwrap_or_default()
    }

    /// How many full rescans the watch stage logged for overflowing events: more raw events
    /// in one read than its event buffer holds, or the kernel's own queue overflow.
    pub fn overflow_rescans(&self) -> usize {
        let logs = self.logs();
        logs.matches("too many events at once; rescanning the whole project")
            .count()
            + logs
                .matches("the kernel dropped file events; rescanning the whole project")
                .count()
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
        let result = match self.thread.take() {
            Some(thread) => thread.join().expect("daemon thread does not panic"),
            None => Ok(()),
        };
        if let Some(logs) = LOGS.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            logs.remove(&self.name);
        }
        result
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
