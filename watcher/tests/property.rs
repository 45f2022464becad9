//! Property: whatever repository state git supports the watcher starts in, and whatever
//! sequence of file operations runs while it works, once it settles HEAD's tree is exactly
//! what real `git add -A` commits.
//!
//! The states are made with real git before the watcher starts: commits (so files are
//! tracked, some of them ignored), forced adds, skip-worktree / assume-unchanged /
//! intent-to-add entries, sparse checkouts (with and without a sparse index), submodules
//! checked out and not, nested repositories, `.gitattributes`, `core.ignoreCase`, rules with
//! unusual syntax. While watching, nested repositories appear and lose their `.git`, and a
//! tiny event buffer forces overflow rescans in some cases.
//!
//! Two oracles, both real git: `git add -A` on a copy of the watcher's index at the end (the
//! tree must be exactly that), and, in the cases whose operations only add or change (a third
//! of them), `git add -A` on a copy of the user's index taken before the watcher started, run
//! once at start (the watcher's first save is done before it reports) and once at the end: the
//! tree must be exactly that too. (When paths are removed, renamed or re-ignored while the
//! watcher works, which of them git still tracks depends on when the saves happened, as it
//! does for a user who runs `git add -A` now and then; only the first oracle applies there.)
//!
//! `WATCHER_PROPTEST_CASES` sets the number of cases (`cargo xtask soak` runs thousands).
//! Failing cases are saved in `property.proptest-regressions` beside this file and replayed
//! first by every later run; commit that file.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{Daemon, Repo};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use testkit::git::{add_all_into, git, git_output, tree_of_add_all_from};

const DIRS: &[&str] = &[
    "",
    "a",
    "a/c",
    "b",
    "b/deep/er",
    "node_modules",
    "build",
    "a/build",
];
// No two names differ only in case: `core.ignoreCase` on a case-sensitive file system (which
// git documents as unsupported) would make them one index entry.
const NAMES: &[&str] = &[
    "x", "y.log", "keep.log", "c", "build", "z.txt", "W.LOG", "a.{x,c}",
];
const RULES: &[&str] = &[
    "*.log",
    "!keep.log",
    "build/",
    "a/c",
    "node_modules",
    "/x",
    "deep",
    "",
    "*.{x,c}",
    "[ab",
    "z.tx[t]",
    "**/deep/**",
    "!/build",
    "w.log",
    "\\#x",
];
const TEXTS: &[&[u8]] = &[
    b"one\ntwo\n",
    b"crlf\r\nline\r\n",
    b"mixed\r\nends\n",
    b"$Id$\n",
    b"\0binary\r\n",
    b"no newline",
];
const ATTRIBUTES: &[&str] = &[
    "*.txt text eol=crlf",
    "*.txt text eol=lf",
    "* text=auto",
    "*.log -text",
    "x binary",
    "*.TXT text",
    "c ident",
    "*.log filter=upper",
];

#[derive(Debug, Clone)]
enum Op {
    Write {
        dir: usize,
        name: usize,
        body: u8,
    },
    Append {
        dir: usize,
        name: usize,
    },
    Remove {
        dir: usize,
        name: usize,
    },
    Rename {
        from: (usize, usize),
        to: (usize, usize),
    },
    Mkdir {
        dir: usize,
        name: usize,
    },
    RemoveDir {
        dir: usize,
    },
    MoveDir {
        from: usize,
        to: (usize, usize),
    },
    Rules {
        dir: usize,
        lines: Vec<usize>,
    },
    Burst {
        dir: usize,
        count: u8,
    },
    Symlink {
        at: (usize, usize),
        target: usize,
    },
    Executable {
        dir: usize,
        name: usize,
        on: bool,
    },
    Pause {
        millis: u16,
    },
    WriteText {
        dir: usize,
        name: usize,
        text: usize,
    },
    /// `git init` + a commit in a (new) directory: a nested repository appears.
    NestedRepo {
        dir: usize,
        name: usize,
    },
    /// `rm -rf DIR/NAME/.git`: a nested repository becomes plain files.
    DropGit {
        dir: usize,
        name: usize,
    },
}

/// A repository state made with real git before the watcher starts.
#[derive(Debug, Clone)]
enum Setup {
    Op(Op),
    /// `git add -A && git commit`: what exists becomes tracked.
    Commit,
    /// `git add -f`: a tracked file an ignore rule matches.
    ForceAdd {
        dir: usize,
        name: usize,
    },
    Flag {
        dir: usize,
        name: usize,
        flag: usize,
    },
    Sparse {
        dir: usize,
        sparse_index: bool,
    },
    /// A clone of a small repository, added as a gitlink; not checked out: an empty directory.
    Submodule {
        dir: usize,
        name: usize,
        checked_out: bool,
    },
    Attributes {
        dir: usize,
        lines: Vec<usize>,
    },
    IgnoreCase,
}

const FLAGS: &[&str] = &["--skip-worktree", "--assume-unchanged"];

fn op() -> impl Strategy<Value = Op> {
    let dir = 0..DIRS.len();
    let name = 0..NAMES.len();
    let at = (0..DIRS.len(), 0..NAMES.len());
    prop_oneof![
        4 => (dir.clone(), name.clone(), any::<u8>()).prop_map(|(dir, name, body)| Op::Write { dir, name, body }),
        2 => (dir.clone(), name.clone()).prop_map(|(dir, name)| Op::Append { dir, name }),
        2 => (dir.clone(), name.clone()).prop_map(|(dir, name)| Op::Remove { dir, name }),
        2 => (at.clone(), at.clone()).prop_map(|(from, to)| Op::Rename { from, to }),
        1 => (dir.clone(), name.clone()).prop_map(|(dir, name)| Op::Mkdir { dir, name }),
        1 => dir.clone().prop_map(|dir| Op::RemoveDir { dir }),
        1 => (dir.clone(), at).prop_map(|(from, to)| Op::MoveDir { from, to }),
        2 => (dir.clone(), prop::collection::vec(0..RULES.len(), 0..3)).prop_map(|(dir, lines)| Op::Rules { dir, lines }),
        1 => (dir, 1..60u8).prop_map(|(dir, count)| Op::Burst { dir, count }),
        1 => (at_again(), 0..DIRS.len()).prop_map(|(at, target)| Op::Symlink { at, target }),
        1 => (0..DIRS.len(), 0..NAMES.len(), any::<bool>()).prop_map(|(dir, name, on)| Op::Executable { dir, name, on }),
        1 => (0..400u16).prop_map(|millis| Op::Pause { millis }),
        2 => (0..DIRS.len(), 0..NAMES.len(), 0..TEXTS.len()).prop_map(|(dir, name, text)| Op::WriteText { dir, name, text }),
        1 => (0..DIRS.len(), 0..NAMES.len()).prop_map(|(dir, name)| Op::NestedRepo { dir, name }),
        1 => (0..DIRS.len(), 0..NAMES.len()).prop_map(|(dir, name)| Op::DropGit { dir, name }),
    ]
}

fn setup() -> impl Strategy<Value = Setup> {
    let at = (0..DIRS.len(), 0..NAMES.len());
    prop_oneof![
        8 => op().prop_map(Setup::Op),
        3 => Just(Setup::Commit),
        2 => at.clone().prop_map(|(dir, name)| Setup::ForceAdd { dir, name }),
        3 => (at.clone(), 0..FLAGS.len() + 1).prop_map(|((dir, name), flag)| Setup::Flag { dir, name, flag }),
        1 => (1..DIRS.len(), any::<bool>()).prop_map(|(dir, sparse_index)| Setup::Sparse { dir, sparse_index }),
        1 => (at, any::<bool>()).prop_map(|((dir, name), checked_out)| Setup::Submodule { dir, name, checked_out }),
        1 => (0..DIRS.len(), prop::collection::vec(0..ATTRIBUTES.len(), 1..3)).prop_map(|(dir, lines)| Setup::Attributes { dir, lines }),
        1 => Just(Setup::IgnoreCase),
    ]
}

fn at_again() -> impl Strategy<Value = (usize, usize)> {
    (0..DIRS.len(), 0..NAMES.len())
}

fn join(root: &Path, dir: usize, name: usize) -> std::path::PathBuf {
    root.join(DIRS[dir]).join(NAMES[name])
}

/// Applies one operation the way a user or a tool would; an operation that makes no sense
/// for the current tree (a file where a directory is needed) simply fails and is skipped.
fn apply(root: &Path, op: &Op) {
    let _ = match op {
        Op::Write { dir, name, body } => {
            let path = join(root, *dir, *name);
            fs::create_dir_all(path.parent().unwrap()).and_then(|()| fs::write(&path, [*body; 3]))
        }
        Op::Append { dir, name } => {
            use std::io::Write;
            fs::OpenOptions::new()
                .append(true)
                .open(join(root, *dir, *name))
                .and_then(|mut f| f.write_all(b"+"))
        }
        Op::Remove { dir, name } => fs::remove_file(join(root, *dir, *name)),
        Op::Rename { from, to } => fs::rename(join(root, from.0, from.1), join(root, to.0, to.1)),
        Op::Mkdir { dir, name } => fs::create_dir_all(join(root, *dir, *name).join("sub")),
        Op::RemoveDir { dir } if DIRS[*dir].is_empty() => Ok(()),
        Op::RemoveDir { dir } => fs::remove_dir_all(root.join(DIRS[*dir])),
        Op::MoveDir { from, .. } if DIRS[*from].is_empty() => Ok(()),
        Op::MoveDir { from, to } => {
            let target = join(root, to.0, to.1);
            fs::create_dir_all(root.join(DIRS[to.0]))
                .and_then(|()| fs::rename(root.join(DIRS[*from]), target))
        }
        Op::Rules { dir, lines } => {
            let text: String = lines.iter().map(|&i| format!("{}\n", RULES[i])).collect();
            let path = root.join(DIRS[*dir]).join(".gitignore");
            fs::create_dir_all(path.parent().unwrap()).and_then(|()| fs::write(path, text))
        }
        Op::Burst { dir, count } => {
            let base = root.join(DIRS[*dir]).join("burst");
            (0..*count).try_for_each(|i| {
                let path = base.join(format!("d{}", i % 4)).join(format!("f{i}"));
                fs::create_dir_all(path.parent().unwrap()).and_then(|()| fs::write(path, [i]))
            })
        }
        // Links to directories (even to an ancestor: a loop) are saved as links, never followed.
        Op::Symlink { at, target } => {
            let path = join(root, at.0, at.1);
            let target = root.join(DIRS[*target]);
            fs::create_dir_all(path.parent().unwrap())
                .and_then(|()| std::os::unix::fs::symlink(target, &path))
        }
        Op::Executable { dir, name, on } => {
            use std::os::unix::fs::PermissionsExt;
            let mode = if *on { 0o755 } else { 0o644 };
            fs::set_permissions(join(root, *dir, *name), fs::Permissions::from_mode(mode))
        }
        Op::Pause { millis } => {
            std::thread::sleep(Duration::from_millis(u64::from(*millis)));
            Ok(())
        }
        Op::WriteText { dir, name, text } => {
            let path = join(root, *dir, *name);
            fs::create_dir_all(path.parent().unwrap()).and_then(|()| fs::write(&path, TEXTS[*text]))
        }
        // Made beside the project and moved in at once: a save that caught it half made would
        // track its files as loose ones, which is right but depends on timing.
        Op::NestedRepo { dir, name } => {
            let scratch = root.parent().unwrap().join("nested-in-the-making");
            let _ = fs::remove_dir_all(&scratch);
            let made = fs::create_dir_all(&scratch)
                .and_then(|()| fs::write(scratch.join("inner.txt"), "inner"))
                .is_ok();
            if made {
                for args in [
                    &["init", "-q", "-b", "main"][..],
                    &["add", "-A"],
                    &["commit", "-qm", "inner"],
                ] {
                    git_output(&scratch, args);
                }
            }
            let path = join(root, *dir, *name);
            fs::create_dir_all(path.parent().unwrap()).and_then(|()| fs::rename(&scratch, &path))
        }
        // Never through a symlink: one to the project would drop the project's own `.git`.
        Op::DropGit { dir, name } => {
            let path = join(root, *dir, *name);
            if fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
                return;
            }
            fs::remove_dir_all(path.join(".git"))
        }
    };
}

/// Applies one setup step; like [`apply`], a step that makes no sense here fails quietly.
fn prepare(repo: &Repo, upstream: &Path, step: &Setup) {
    let root = &repo.dir;
    let rel = |dir: usize, name: usize| {
        Path::new(DIRS[dir])
            .join(NAMES[name])
            .to_string_lossy()
            .into_owned()
    };
    match step {
        Setup::Op(op) => {
            if !matches!(op, Op::Pause { .. }) {
                apply(root, op);
            }
        }
        Setup::Commit => {
            git_output(root, ["add", "-A"]);
            git_output(root, ["commit", "-qm", "user commit"]);
        }
        Setup::ForceAdd { dir, name } => {
            git_output(root, ["add", "-f", "--", &rel(*dir, *name)]);
        }
        Setup::Flag { dir, name, flag } => {
            let path = rel(*dir, *name);
            match FLAGS.get(*flag) {
                Some(flag) => git_output(root, ["update-index", flag, "--", &path]),
                None => git_output(root, ["add", "-N", "--", &path]),
            };
        }
        Setup::Sparse { dir, sparse_index } => {
            let mode = if *sparse_index {
                "--sparse-index"
            } else {
                "--no-sparse-index"
            };
            git_output(root, ["sparse-checkout", "set", mode, DIRS[*dir]]);
        }
        Setup::Submodule {
            dir,
            name,
            checked_out,
        } => {
            let path = rel(*dir, *name);
            if root.join(&path).exists() {
                return;
            }
            let cloned = git_output(root, ["clone", "-q", upstream.to_str().unwrap(), &path]);
            if cloned.status.success() {
                git_output(root, ["add", "--", &path]);
                if !checked_out {
                    let _ = fs::remove_dir_all(root.join(&path))
                        .and_then(|()| fs::create_dir(root.join(&path)));
                }
            }
        }
        Setup::Attributes { dir, lines } => {
            // A clean filter driver, as git-lfs installs one.
            git_output(root, ["config", "filter.upper.clean", "tr a-z A-Z"]);
            let text: String = lines
                .iter()
                .map(|&i| format!("{}\n", ATTRIBUTES[i]))
                .collect();
            let path = root.join(DIRS[*dir]).join(".gitattributes");
            let _ = fs::create_dir_all(path.parent().unwrap()).and_then(|()| fs::write(path, text));
        }
        Setup::IgnoreCase => {
            git_output(root, ["config", "core.ignoreCase", "true"]);
        }
    }
}

/// `(mode, id)` by path of a tree, recursively.
fn entries(dir: &Path, tree: &str) -> BTreeMap<String, String> {
    git(dir, ["ls-tree", "-r", "-z", "--full-tree", tree])
        .split('\0')
        .filter(|l| !l.is_empty())
        .filter_map(|line| {
            let (meta, path) = line.split_once('\t')?;
            let mut parts = meta.split(' ');
            let mode = parts.next()?;
            let id = parts.nth(1)?;
            Some((path.to_owned(), format!("{mode} {id}")))
        })
        .collect()
}

fn cases() -> u32 {
    std::env::var("WATCHER_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

/// Cases checked against the user's own index, and those among them whose index held
/// entries git keeps whatever the disk says (skip-worktree, assume-unchanged, gitlinks).
static ADDITIVE: AtomicUsize = AtomicUsize::new(0);
static ADDITIVE_WITH_KEPT_STATE: AtomicUsize = AtomicUsize::new(0);
static CASES_RUN: AtomicUsize = AtomicUsize::new(0);

/// Operations that remove, rename or re-ignore nothing.
fn adds_or_changes(op: &Op) -> bool {
    matches!(
        op,
        Op::Write { .. }
            | Op::Append { .. }
            | Op::Mkdir { .. }
            | Op::Burst { .. }
            | Op::Symlink { .. }
            | Op::Executable { .. }
            | Op::Pause { .. }
            | Op::WriteText { .. }
            | Op::NestedRepo { .. }
    )
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        max_shrink_iters: 20,
        failure_persistence: Some(Box::new(FileFailurePersistence::SourceParallel(
            "proptest-regressions",
        ))),
        .. ProptestConfig::default()
    })]

    #[test]
    fn head_equals_git_add_all_in_any_state_after_any_operations(
        before in prop::collection::vec(setup(), 0..14),
        during in prop::collection::vec(op(), 1..40),
        tiny_event_buffer in prop::bool::weighted(0.2),
        additive in prop::bool::weighted(0.35),
    ) {
        let mut during = during;
        if additive {
            during.retain(adds_or_changes);
        }
        let repo = Repo::new();
        let upstream = repo.dir.parent().unwrap().join("upstream");
        testkit::git::init_repo(&upstream);
        fs::write(upstream.join("u.txt"), "upstream").unwrap();
        git(&upstream, ["add", "-A"]);
        git(&upstream, ["commit", "-qm", "upstream"]);
        for step in &before {
            prepare(&repo, &upstream, step);
        }
        let baseline = repo.dir.parent().unwrap().join("baseline-index");
        if repo.path(".git/index").exists() {
            testkit::git::copy_index(&repo.path(".git/index"), &baseline);
        }
        if additive {
            // The watcher's first save is done before `Daemon::start` returns, so git's answer
            // is a save now and one at the end: a gitlink whose directory is gone now is
            // dropped now, and a plain directory made there later holds plain files.
            add_all_into(&repo.dir, &baseline);
        }
        let mut config = repo.config();
        config.debounce = Duration::from_millis(100);
        config.max_delay = Duration::from_millis(400);
        if tiny_event_buffer {
            config.event_buffer = 4;
        }
        let daemon = Daemon::start(&repo, config);
        for op in &during {
            apply(&repo.dir, op);
        }
        repo.wait_saved_within(Duration::from_secs(30));
        daemon.stop().expect("clean shutdown");

        if additive {
            // Oracle 2: the user's own index, before the watcher touched it, saved at start.
            let head = entries(&repo.dir, "HEAD");
            let from_user = entries(&repo.dir, &tree_of_add_all_from(&repo.dir, Some(&baseline)));
            prop_assert_eq!(head, from_user);
            let kept_by_index = git(&repo.dir, ["ls-files", "-s", "-v"])
                .lines()
                .any(|l| l.starts_with('S') || l.starts_with('h') || l.contains(" 160000 "));
            ADDITIVE.fetch_add(1, Ordering::Relaxed);
            if kept_by_index {
                ADDITIVE_WITH_KEPT_STATE.fetch_add(1, Ordering::Relaxed);
            }
        }
        let run = CASES_RUN.fetch_add(1, Ordering::Relaxed) + 1;
        if run.is_multiple_of(16) {
            eprintln!(
                "RELIABILITY property: {run} cases, {} checked against the user's index ({} of them with entries git keeps whatever the disk says)",
                ADDITIVE.load(Ordering::Relaxed),
                ADDITIVE_WITH_KEPT_STATE.load(Ordering::Relaxed),
            );
        }
    }
}
