//! Hermetic git for tests: every command runs with the global and system config cut off and a
//! fixed identity, so a developer's own `~/.gitconfig` never changes a result.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Environment that isolates git (and libgit2 in child processes) from the machine it runs on.
/// `home` becomes `HOME` and `XDG_CONFIG_HOME`, which libgit2 reads instead of
/// `GIT_CONFIG_GLOBAL`.
pub fn hermetic_env(home: &Path) -> Vec<(&'static str, PathBuf)> {
    vec![
        ("GIT_CONFIG_GLOBAL", PathBuf::from("/dev/null")),
        ("GIT_CONFIG_NOSYSTEM", PathBuf::from("1")),
        ("HOME", home.to_owned()),
        ("XDG_CONFIG_HOME", home.join(".config")),
        ("GIT_AUTHOR_NAME", PathBuf::from("Test Author")),
        ("GIT_AUTHOR_EMAIL", PathBuf::from("author@example.test")),
        ("GIT_COMMITTER_NAME", PathBuf::from("Test Author")),
        ("GIT_COMMITTER_EMAIL", PathBuf::from("author@example.test")),
        ("GIT_TERMINAL_PROMPT", PathBuf::from("0")),
    ]
}

/// A `git` command in `dir` with the hermetic environment (HOME is `dir`'s parent-free temp).
/// Any repository is safe to it: a test looks into sandboxes that run as users of their own.
pub fn command(dir: &Path) -> Command {
    let mut cmd = Command::new("git");
    cmd.current_dir(dir);
    for (k, v) in hermetic_env(dir) {
        cmd.env(k, v);
    }
    cmd.env("GIT_CONFIG_COUNT", "1")
        .env("GIT_CONFIG_KEY_0", "safe.directory")
        .env("GIT_CONFIG_VALUE_0", "*");
    cmd.env_remove("GIT_DIR").env_remove("GIT_WORK_TREE");
    cmd
}

/// Runs git and returns its stdout; panics with git's stderr when it fails.
pub fn git<I, S>(dir: &Path, args: I) -> String
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let out = git_output(dir, args);
    assert!(
        out.status.success(),
        "git failed in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs git and returns its whole output, success or not.
pub fn git_output<I, S>(dir: &Path, args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    command(dir)
        .args(args)
        .output()
        .expect("git is installed and runnable")
}

/// `git init` with `main` as the first branch and a fixed identity in the repo config.
pub fn init_repo(dir: &Path) {
    std::fs::create_dir_all(dir).expect("create repo dir");
    git(dir, ["init", "-q", "-b", "main"]);
    git(dir, ["config", "user.name", "Test Author"]);
    git(dir, ["config", "user.email", "author@example.test"]);
}

/// `git init --bare` with `main` as HEAD.
pub fn init_bare(dir: &Path) {
    std::fs::create_dir_all(dir).expect("create bare dir");
    git(dir, ["init", "-q", "--bare", "-b", "main"]);
}

/// The tree id of `rev` (e.g. `HEAD`, `main`), or `None` when it does not resolve.
pub fn tree_of(dir: &Path, rev: &str) -> Option<String> {
    let out = git_output(
        dir,
        ["rev-parse", "--verify", "-q", &format!("{rev}^{{tree}}")],
    );
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The tree `git add -A` would commit for `work_tree`, computed in a scratch index so the
/// repository's own index is untouched.
pub fn tree_of_add_all(work_tree: &Path) -> String {
    tree_of_add_all_from(work_tree, None)
}

/// The tree `git add -A` would commit for `work_tree` starting from a copy of the index file
/// `start` (a repository's own `.git/index`, whose tracked files, skip-worktree and
/// assume-unchanged entries and gitlinks git keeps), or from an empty index with `None`.
pub fn tree_of_add_all_from(work_tree: &Path, start: Option<&Path>) -> String {
    let scratch = tempfile::NamedTempFile::new().expect("scratch index");
    let index = scratch.path().to_owned();
    drop(scratch);
    if let Some(start) = start
        && start.exists()
    {
        copy_index(start, &index);
    }
    add_all_into(work_tree, &index);
    let tree = run_on_index(work_tree, &index, &["write-tree"]);
    let _ = std::fs::remove_file(&index);
    tree
}

/// Runs `git add -A` for `work_tree` on the index file `index` (created if missing), as a
/// user's save at this moment would: later states then start from what this one kept.
pub fn add_all_into(work_tree: &Path, index: &Path) {
    run_on_index(work_tree, index, &["add", "-A"]);
}

fn run_on_index(work_tree: &Path, index: &Path, args: &[&str]) -> String {
    let out = command(work_tree)
        .env("GIT_INDEX_FILE", index)
        .args(args)
        .output()
        .expect("git runs");
    // In a sparse checkout git adds what it may, writes the index, and fails naming the
    // untracked paths outside the checkout it did not add.
    let sparse_refusal =
        String::from_utf8_lossy(&out.stderr).contains("outside of your sparse-checkout definition");
    assert!(
        out.status.success() || sparse_refusal,
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Copies an index file keeping its modification time: git trusts an entry's stat data only
/// when the file was modified before the index was written (its "racy git" rule), so a copy
/// with a new time would make git take a file rewritten in the same clock tick as unchanged.
pub fn copy_index(from: &Path, to: &Path) {
    std::fs::copy(from, to).expect("copy the index");
    let modified = std::fs::metadata(from)
        .and_then(|m| m.modified())
        .expect("the index's modification time");
    std::fs::File::options()
        .write(true)
        .open(to)
        .and_then(|f| f.set_modified(modified))
        .expect("keep the index's modification time");
}

/// Paths and modes in a tree, one `mode path` per line, sorted: readable in a failed assert.
pub fn ls_tree(dir: &Path, rev: &str) -> String {
    git(dir, ["ls-tree", "-r", "--full-tree", rev])
}

/// A project saved to a bare remote, as restore and sync find it: `sandbox` saved it (its
/// remote `project` is `remote`), and `laptop` is a developer's clone (remote `origin`) that
/// pushes from elsewhere. Everything lives in `tmp`.
#[derive(Debug)]
pub struct SavedProject {
    pub tmp: tempfile::TempDir,
    pub remote: PathBuf,
    pub sandbox: PathBuf,
    pub laptop: PathBuf,
}

impl SavedProject {
    /// Writes `.gitignore` (ignoring `node_modules/`) and `files` into the sandbox, commits
    /// them, pushes to the remote, and clones the laptop from it.
    pub fn new(files: &[(&str, &str)]) -> Self {
        let tmp = tempfile::tempdir().expect("temp dir");
        let remote = tmp.path().join("remote.git");
        let sandbox = tmp.path().join("sandbox");
        let laptop = tmp.path().join("laptop");
        init_bare(&remote);
        init_repo(&sandbox);
        let write = |rel: &str, body: &str| {
            std::fs::write(sandbox.join(rel), body).expect("write a fixture file");
        };
        write(".gitignore", "node_modules/\n");
        for (rel, body) in files {
            write(rel, body);
        }
        let remote_path = remote.to_str().expect("temp paths are UTF-8");
        git(&sandbox, ["add", "-A"]);
        git(&sandbox, ["commit", "-qm", "first"]);
        git(&sandbox, ["remote", "add", "project", remote_path]);
        git(&sandbox, ["push", "-q", "project", "main"]);
        git(tmp.path(), ["clone", "-q", remote_path, "laptop"]);
        init_repo(&laptop);
        Self {
            tmp,
            remote,
            sandbox,
            laptop,
        }
    }
}
