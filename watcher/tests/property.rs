//! Property: whatever sequence of file operations runs while the watcher works, once it
//! settles HEAD's tree is exactly what `git add -A` commits for the same working tree.
//!
//! `WATCHER_PROPTEST_CASES` raises the number of cases for a soak run.

mod common;

use std::fs;
use std::path::Path;
use std::time::Duration;

use common::{Daemon, Repo};
use proptest::prelude::*;

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
const NAMES: &[&str] = &["x", "y.log", "keep.log", "c", "build", "z.txt"];
const RULES: &[&str] = &[
    "*.log",
    "!keep.log",
    "build/",
    "a/c",
    "node_modules",
    "/x",
    "deep",
    "",
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
}

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
    };
}

fn cases() -> u32 {
    std::env::var("WATCHER_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        max_shrink_iters: 20,
        failure_persistence: None,
        .. ProptestConfig::default()
    })]

    #[test]
    fn head_equals_git_add_all_after_any_operations(
        before in prop::collection::vec(op(), 0..8),
        during in prop::collection::vec(op(), 1..40),
    ) {
        let repo = Repo::new();
        for op in &before {
            if !matches!(op, Op::Pause { .. }) {
                apply(&repo.dir, op);
            }
        }
        let mut config = repo.config();
        config.debounce = Duration::from_millis(100);
        config.max_delay = Duration::from_millis(400);
        let daemon = Daemon::start(&repo, config);
        for op in &during {
            apply(&repo.dir, op);
        }
        repo.wait_saved_within(Duration::from_secs(20));
        daemon.stop().expect("clean shutdown");
    }
}
