//! Property: whatever repository state git supports the watcher starts in, and whatever
//! sequence of file operations runs while it works, once it settles HEAD's tree is exactly
//! what real `git add -A` commits.
//!
//! The states are made with real git before the watcher starts: commits (so files are
//! tracked, some of them ignored), forced adds, skip-worktree / assume-unchanged /
//! intent-to-add entries, sparse checkouts (with and without a sparse index), submodules
//! checked out and not, nested repositories, `.gitattributes` (`ident` with several `$Id$`,
//! `core.autocrlf` over blobs with a lone CR, one removed from the disk), attributes in
//! `.git/info/attributes` and `core.attributesFile`, `core.ignoreCase`,
//! rules with unusual syntax (`***`, `a**`, an unclosed brace, classes) in `.gitignore` files,
//! `.git/info/exclude` (with bytes that are not UTF-8) and `core.excludesFile` (absolute or
//! relative), a `.gitignore` or `.gitattributes` that is a symbolic link. While watching,
//! nested repositories appear and lose their `.git`, `.gitattributes` files are written and
//! removed, the user's git edits the index (`reset HEAD~1`, `rm --cached`, `add -f`, `reset`),
//! and in about a third of the cases a one-event buffer makes most reads an overflow rescan.
//! The cases reaching one of these rules, attribute and index corners are counted.
//!
//! Three oracles, all real git:
//! 1. `git add -A` on a copy of the watcher's index at the end: the tree must be exactly that.
//! 2. In every case, nothing git ignores that no save could have tracked: each path that
//!    existed unignored at some moment while the watcher ran (looked up with `git ls-files
//!    -o --exclude-standard` before every operation that may remove or ignore a path, at the
//!    moments inside one that make a path briefly unignored, and at the end) may be tracked,
//!    as may the user's index; `HEAD` must hold no ignored path outside them. This is what
//!    catches a watcher that commits an ignored file where oracle 1 cannot: once in its own
//!    index, the file stays tracked and `git add -A` agrees.
//! 3. In the cases whose operations only add or change (about a third), `git add -A` on a copy
//!    of the user's index taken before the watcher started, run once at start (the watcher's
//!    first save is done before it reports) and once at the end: the tree must be exactly
//!    that. (When paths are removed, renamed or re-ignored while the watcher works, which of
//!    them git still tracks depends on when the saves happened, as it does for a user who
//!    runs `git add -A` now and then; there oracle 2 bounds it.)
//!
//! The run counts the cases that reach each oracle's interesting branch and fails below a
//! minimum share, then prints `RELIABILITY property: ...` (the figures and the seconds it
//! took) to stdout, where `cargo xtask soak` collects it.
//!
//! `WATCHER_PROPTEST_CASES` sets the number of cases (`cargo xtask soak` runs thousands).
//! Counterexamples found so far are explicit cases in `property_regressions/`, run first. A
//! new failure is saved in `property.proptest-regressions` beside this file and replayed
//! first by every later run (commit it, and move it to the explicit cases before changing a
//! generator: a seed replays a different case once a generator changes).

mod property_regressions;
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};
use support::in_process::{Daemon, Repo};
use testkit::git::{add_all_into, git, git_output, tree_of_add_all_from};
use testkit::proptest_check::assert_share;

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
    "***/c",
    "a**/x",
    "x{",
    "[[:upper:]]*",
];
const TEXTS: &[&[u8]] = &[
    b"one\ntwo\n",
    b"crlf\r\nline\r\n",
    b"mixed\r\nends\n",
    b"$Id$\n",
    b"\0binary\r\n",
    b"no newline",
    b"lone\rcr\n",
    b"$Id$ one $Id: old $ two $Id$\n",
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
    "*.txt ident",
    "* eol=crlf",
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
    /// The user's git edits the index while the watcher works ([`INDEX_EDITS`]).
    UserIndex {
        edit: usize,
        dir: usize,
        name: usize,
    },
    /// `DIR/.gitattributes` written with these lines (removed when there are none) while the
    /// watcher works, often in the same debounce window as the files it converts.
    Attributes {
        dir: usize,
        lines: Vec<usize>,
    },
}

/// The index edits of [`Op::UserIndex`]: `git reset -q HEAD~1`, `git rm -q --cached PATH`,
/// `git add -f PATH`, `git reset -q`.
const INDEX_EDITS: &[&str] = &["reset HEAD~1", "rm --cached", "add -f", "reset"];

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
    /// Rules in `.git/info/exclude`, or in a file outside the repository that
    /// `core.excludesFile` names.
    Exclude {
        lines: Vec<usize>,
        excludes_file: bool,
    },
    /// Attributes in `.git/info/attributes`, or in a file outside the repository that
    /// `core.attributesFile` names.
    OutsideAttributes {
        lines: Vec<usize>,
        attributes_file: bool,
    },
    /// `core.autocrlf=true` (blobs with lone CRs may be in the index already).
    AutoCrlf,
    /// `.git/info/exclude` with a comment that is not UTF-8, then these rules.
    ExcludeBytes {
        lines: Vec<usize>,
    },
    /// A relative `core.excludesFile` (`rules/ignore`), which git reads from the top of the
    /// working tree.
    RelativeExcludes {
        lines: Vec<usize>,
    },
    /// A `.gitignore` (or `.gitattributes`) that is a symbolic link to rules outside the
    /// tree: git does not follow it.
    LinkedRules {
        dir: usize,
        lines: Vec<usize>,
        attributes: bool,
    },
    /// `rm DIR/.gitattributes`: gone from the disk, maybe still in the index.
    RemoveAttributes {
        dir: usize,
    },
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
        1 => (0..INDEX_EDITS.len(), 0..DIRS.len(), 0..NAMES.len()).prop_map(|(edit, dir, name)| Op::UserIndex { edit, dir, name }),
        1 => (0..DIRS.len(), prop::collection::vec(0..ATTRIBUTES.len(), 0..3)).prop_map(|(dir, lines)| Op::Attributes { dir, lines }),
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
        3 => (prop::collection::vec(0..RULES.len(), 1..4), any::<bool>()).prop_map(|(lines, excludes_file)| Setup::Exclude { lines, excludes_file }),
        1 => (prop::collection::vec(0..ATTRIBUTES.len(), 1..3), any::<bool>()).prop_map(|(lines, attributes_file)| Setup::OutsideAttributes { lines, attributes_file }),
        1 => Just(Setup::AutoCrlf),
        1 => prop::collection::vec(0..RULES.len(), 1..3).prop_map(|lines| Setup::ExcludeBytes { lines }),
        1 => prop::collection::vec(0..RULES.len(), 1..3).prop_map(|lines| Setup::RelativeExcludes { lines }),
        1 => (0..DIRS.len(), prop::collection::vec(0..RULES.len(), 1..3), any::<bool>()).prop_map(|(dir, lines, attributes)| Setup::LinkedRules { dir, lines, attributes }),
        1 => (0..DIRS.len()).prop_map(|dir| Setup::RemoveAttributes { dir }),
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
/// `between` is called at the moments inside an operation when a path is briefly less ignored
/// than before and after it: a rules file truncated before its new text is written, a
/// directory's rules files gone before the rest of it.
fn apply(root: &Path, op: &Op, between: &mut dyn FnMut()) {
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
        // As `rm -rf` may do it: its rules files first.
        Op::RemoveDir { dir } => {
            let removed = root.join(DIRS[*dir]);
            if fs::symlink_metadata(&removed).is_ok_and(|m| m.is_dir()) {
                remove_rules_files(&removed);
                between();
            }
            fs::remove_dir_all(removed)
        }
        Op::MoveDir { from, .. } if DIRS[*from].is_empty() => Ok(()),
        Op::MoveDir { from, to } => {
            let target = join(root, to.0, to.1);
            fs::create_dir_all(root.join(DIRS[to.0]))
                .and_then(|()| fs::rename(root.join(DIRS[*from]), target))
        }
        // As `fs::write` does it: truncated, then written.
        Op::Rules { dir, lines } => {
            use std::io::Write;
            let text: String = lines.iter().map(|&i| format!("{}\n", RULES[i])).collect();
            let path = root.join(DIRS[*dir]).join(".gitignore");
            fs::create_dir_all(path.parent().unwrap())
                .and_then(|()| fs::File::create(path))
                .and_then(|mut file| {
                    between();
                    file.write_all(text.as_bytes())
                })
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
        Op::UserIndex { edit, dir, name } => {
            let path = Path::new(DIRS[*dir]).join(NAMES[*name]);
            let path = path.to_string_lossy();
            let args: Vec<&str> = match INDEX_EDITS[*edit] {
                "reset HEAD~1" => vec!["reset", "-q", "HEAD~1"],
                "rm --cached" => vec!["rm", "-q", "--cached", "--", &path],
                "add -f" => vec!["add", "-f", "--", &path],
                _ => vec!["reset", "-q"],
            };
            git_output(root, args);
            Ok(())
        }
        Op::Attributes { dir, lines } => write_attributes(root, *dir, lines),
    };
}

/// `DIR/.gitattributes` with these lines of [`ATTRIBUTES`]; removed when there are none.
fn write_attributes(root: &Path, dir: usize, lines: &[usize]) -> std::io::Result<()> {
    let path = root.join(DIRS[dir]).join(".gitattributes");
    if lines.is_empty() {
        return fs::remove_file(path);
    }
    let text: String = lines
        .iter()
        .map(|&i| format!("{}\n", ATTRIBUTES[i]))
        .collect();
    fs::create_dir_all(path.parent().unwrap()).and_then(|()| fs::write(path, text))
}

/// Removes every `.gitignore` under `dir`, never through a symlink.
fn remove_rules_files(dir: &Path) {
    let _ = fs::remove_file(dir.join(".gitignore"));
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_rules_files(&entry.path());
        }
    }
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
                apply(root, op, &mut || ());
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
            let _ = write_attributes(root, *dir, lines);
        }
        Setup::IgnoreCase => {
            git_output(root, ["config", "core.ignoreCase", "true"]);
        }
        Setup::Exclude {
            lines,
            excludes_file,
        } => {
            let file = excludes_file.then_some(("core.excludesFile", "excludes"));
            write_outside_rules(root, RULES, lines, file, "exclude");
        }
        Setup::OutsideAttributes {
            lines,
            attributes_file,
        } => {
            git_output(root, ["config", "filter.upper.clean", "tr a-z A-Z"]);
            let file = attributes_file.then_some(("core.attributesFile", "attributes"));
            write_outside_rules(root, ATTRIBUTES, lines, file, "attributes");
        }
        Setup::AutoCrlf => {
            git_output(root, ["config", "core.autocrlf", "true"]);
        }
        Setup::ExcludeBytes { lines } => {
            let mut text = b"# caf\xe9, not UTF-8\n".to_vec();
            for &i in lines {
                text.extend_from_slice(RULES[i].as_bytes());
                text.push(b'\n');
            }
            let _ = fs::write(root.join(".git/info/exclude"), text);
        }
        Setup::RelativeExcludes { lines } => {
            let text: String = lines.iter().map(|&i| format!("{}\n", RULES[i])).collect();
            let _ = fs::create_dir_all(root.join("rules"))
                .and_then(|()| fs::write(root.join("rules/ignore"), text));
            git_output(root, ["config", "core.excludesFile", "rules/ignore"]);
        }
        Setup::LinkedRules {
            dir,
            lines,
            attributes,
        } => {
            let (table, name): (&[&str], &str) = if *attributes {
                (ATTRIBUTES, ".gitattributes")
            } else {
                (RULES, ".gitignore")
            };
            let text: String = lines
                .iter()
                .map(|&i| format!("{}\n", table[i % table.len()]))
                .collect();
            let outside = root.parent().unwrap().join(format!("linked-{dir}-{name}"));
            let path = root.join(DIRS[*dir]).join(name);
            let _ = fs::write(&outside, text)
                .and_then(|()| fs::create_dir_all(path.parent().unwrap()))
                .and_then(|()| std::os::unix::fs::symlink(&outside, &path));
        }
        Setup::RemoveAttributes { dir } => {
            let _ = fs::remove_file(root.join(DIRS[*dir]).join(".gitattributes"));
        }
    }
}

/// These lines of `table` in a rules file outside the tree: `.git/info/<info_name>`, or, with
/// `file` = `(key, name)`, a file `name` beside the repository that configuration `key` names.
fn write_outside_rules(
    root: &Path,
    table: &[&str],
    lines: &[usize],
    file: Option<(&str, &str)>,
    info_name: &str,
) {
    let text: String = lines.iter().map(|&i| format!("{}\n", table[i])).collect();
    let path = match file {
        Some((key, name)) => {
            let path = root.parent().unwrap().join(name);
            git_output(root, ["config", key, path.to_str().unwrap()]);
            path
        }
        None => root.join(".git/info").join(info_name),
    };
    let _ = fs::create_dir_all(path.parent().unwrap()).and_then(|()| fs::write(path, text));
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

/// Paths (files, symlinks, nested repositories without their trailing `/`) listed by
/// `git ls-files -z ARGS` in `root` with the index file `index` (a missing one is empty).
fn ls_files(root: &Path, index: &Path, args: &[&str]) -> BTreeSet<String> {
    let out = testkit::git::command(root)
        .env("GIT_INDEX_FILE", index)
        .args(["ls-files", "-z"])
        .args(args)
        .output()
        .expect("git runs");
    assert!(
        out.status.success(),
        "git ls-files {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split('\0')
        .filter(|p| !p.is_empty())
        .map(|p| p.trim_end_matches('/').to_owned())
        .collect()
}

/// Every path a save could have taken into the watcher's index so far: the user's index
/// before the watcher started and after the start-up save, and every path that existed
/// unignored at some moment since (after each operation and at the moments [`apply`] calls
/// `between`). A path leaves the index only when a save sees it gone, which may never
/// happen, so nothing leaves this set: a path in `HEAD` that is not in it was committed
/// while git ignored it and did not track it, whenever the saves happened.
struct MayBeTracked {
    root: std::path::PathBuf,
    /// A missing file: an empty index, so `ls-files -o` lists every path git does not ignore.
    empty_index: std::path::PathBuf,
    paths: BTreeSet<String>,
}

impl MayBeTracked {
    fn new(root: &Path, user_index: &Path) -> Self {
        let empty_index = root.parent().unwrap().join("no-index");
        let mut this = Self {
            root: root.to_owned(),
            empty_index,
            paths: ls_files(root, user_index, &[]),
        };
        this.look();
        this
    }

    fn look(&mut self) {
        let unignored = ls_files(&self.root, &self.empty_index, &["-o", "--exclude-standard"]);
        self.paths.extend(unignored);
    }

    /// Ignored paths on disk now that no save could have tracked.
    fn ignored_untracked(&self) -> BTreeSet<String> {
        ls_files(
            &self.root,
            &self.empty_index,
            &["-o", "-i", "--exclude-standard"],
        )
        .into_iter()
        .filter(|p| !self.paths.contains(p))
        .collect()
    }
}

/// What the cases reached, asserted as shares after the run.
#[derive(Default)]
struct Reached {
    cases: AtomicU64,
    /// Checked against `git add -A` on the user's own index (the additive cases).
    user_index: AtomicU64,
    /// Of those, the cases whose index held entries git keeps whatever the disk says
    /// (skip-worktree, assume-unchanged, gitlinks).
    kept_state: AtomicU64,
    /// Cases whose tree at the end held ignored paths no save could have tracked, all of which
    /// `HEAD` was checked not to hold.
    ignored_untracked: AtomicU64,
    /// Cases with the one-event buffer, and those of them in which it forced a rescan.
    tiny_buffer: AtomicU64,
    overflowed: AtomicU64,
    /// Cases with a rules-file, attribute or index corner of issue 25 ([`has_corner`]).
    corners: AtomicU64,
}

impl Reached {
    fn count(counter: &AtomicU64) -> u64 {
        counter.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    fn line(&self, seconds: u64) -> String {
        format!(
            "RELIABILITY property: cases={} user_index={} kept_state={} ignored_untracked={} tiny_buffer={} overflowed={} corners={} seconds={seconds}",
            Self::get(&self.cases),
            Self::get(&self.user_index),
            Self::get(&self.kept_state),
            Self::get(&self.ignored_untracked),
            Self::get(&self.tiny_buffer),
            Self::get(&self.overflowed),
            Self::get(&self.corners),
        )
    }
}

/// Whether a case reaches a rules-file, attribute or index corner of issue 25: a byte that is
/// not UTF-8 in `info/exclude`, a relative excludes file, a symlinked rules file,
/// attributes outside the tree, `core.autocrlf`, a `.gitattributes` gone from the disk or written while the watcher works,
/// the user's index edits while it works.
fn has_corner(before: &[Setup], during: &[Op]) -> bool {
    before.iter().any(|s| {
        matches!(
            s,
            Setup::AutoCrlf
                | Setup::ExcludeBytes { .. }
                | Setup::RelativeExcludes { .. }
                | Setup::LinkedRules { .. }
                | Setup::RemoveAttributes { .. }
                | Setup::OutsideAttributes { .. }
        )
    }) || during
        .iter()
        .any(|o| matches!(o, Op::UserIndex { .. } | Op::Attributes { .. }))
}

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

#[test]
fn head_equals_git_add_all_in_any_state_after_any_operations() {
    let started = Instant::now();
    let reached = Reached::default();
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        max_shrink_iters: 20,
        source_file: Some(file!()),
        failure_persistence: Some(Box::new(FileFailurePersistence::SourceParallel(
            "proptest-regressions",
        ))),
        ..Config::default()
    });
    for (before, during, tiny_event_buffer, additive) in property_regressions::cases() {
        let case = format!("{before:?}, {during:?}, {tiny_event_buffer}, {additive}");
        if let Err(e) = one_case(&reached, before, during, tiny_event_buffer, additive) {
            panic!("a kept counterexample fails again: {e}\ncase: {case}");
        }
    }
    let strategy = (
        prop::collection::vec(setup(), 0..14),
        prop::collection::vec(op(), 1..40),
        prop::bool::weighted(0.3),
        prop::bool::weighted(0.35),
    );
    let outcome = runner.run(
        &strategy,
        |(before, during, tiny_event_buffer, additive)| {
            one_case(&reached, before, during, tiny_event_buffer, additive)?;
            let run = Reached::get(&reached.cases);
            if run.is_multiple_of(16) {
                eprintln!("{}", reached.line(started.elapsed().as_secs()));
            }
            Ok(())
        },
    );
    if let Err(e) = outcome {
        panic!("{e}\n{runner}");
    }
    println!("{}", reached.line(started.elapsed().as_secs()));
    let name = "property";
    let cases = Reached::get(&reached.cases);
    let user_index = Reached::get(&reached.user_index);
    let tiny = Reached::get(&reached.tiny_buffer);
    // Measured at 64 cases: 44 %, 61 %, 36 % and 78 % (the corners, with issue 25's widening:
    // 73 %); each minimum is missed by chance in fewer than 1 in 5000 runs.
    assert_share(name, "the user's-index oracle", user_index, cases, 0.15);
    assert_share(
        name,
        "entries git keeps whatever the disk says (of the user's-index cases)",
        Reached::get(&reached.kept_state),
        user_index,
        0.2,
    );
    assert_share(
        name,
        "ignored paths no save could track at the end",
        Reached::get(&reached.ignored_untracked),
        cases,
        0.15,
    );
    assert_share(
        name,
        "an overflow rescan (of the one-event-buffer cases)",
        Reached::get(&reached.overflowed),
        tiny,
        0.3,
    );
    assert_share(
        name,
        "a rules-file, attribute or index corner",
        Reached::get(&reached.corners),
        cases,
        0.4,
    );
}

fn one_case(
    reached: &Reached,
    before: Vec<Setup>,
    mut during: Vec<Op>,
    tiny_event_buffer: bool,
    additive: bool,
) -> Result<(), TestCaseError> {
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
    let mut may_be_tracked = MayBeTracked::new(&repo.dir, &baseline);
    // The watcher's first save is done before `Daemon::start` returns, so git's answer is a
    // save now and one at the end: a gitlink whose directory is gone now is dropped now, and
    // a plain directory made there later holds plain files.
    add_all_into(&repo.dir, &baseline);
    may_be_tracked
        .paths
        .extend(ls_files(&repo.dir, &baseline, &[]));
    let mut config = repo.config();
    config.debounce = Duration::from_millis(100);
    config.max_delay = Duration::from_millis(400);
    if tiny_event_buffer {
        config.event_buffer = 1;
    }
    let daemon = Daemon::start(&repo, config);
    // A path that was unignored at some moment is still there, unignored, when the next
    // operation that may remove or ignore it begins: look then (only then, so additive runs
    // keep their pace) and at the end.
    for op in &during {
        if !adds_or_changes(op) {
            may_be_tracked.look();
        }
        apply(&repo.dir, op, &mut || may_be_tracked.look());
        if matches!(op, Op::UserIndex { .. }) {
            // The user's index (an `add -f` of an ignored path) may be saved too.
            let index = repo.path(".git/index");
            may_be_tracked
                .paths
                .extend(ls_files(&repo.dir, &index, &[]));
        }
    }
    may_be_tracked.look();
    // Oracle 1: `git add -A` on a copy of the watcher's own index.
    repo.wait_saved_within(Duration::from_secs(30));
    let overflowed = daemon.overflow_rescans() > 0;
    daemon.stop().expect("clean shutdown");

    // No HEAD: nothing was there to save (git's own commit would have refused).
    let head = match repo.head_tree() {
        Some(tree) => entries(&repo.dir, &tree),
        None => BTreeMap::new(),
    };
    // Oracle 2, in every case: nothing in HEAD that git ignores and no save could track.
    let ignored_untracked = may_be_tracked.ignored_untracked();
    let committed: Vec<&String> = head
        .keys()
        .filter(|p| ignored_untracked.contains(*p))
        .collect();
    prop_assert!(
        committed.is_empty(),
        "ignored and never tracked, yet committed: {:?}",
        committed
    );
    if additive {
        // Oracle 3: the user's own index, before the watcher touched it, saved at start.
        let from_user = entries(&repo.dir, &tree_of_add_all_from(&repo.dir, Some(&baseline)));
        prop_assert_eq!(&head, &from_user);
        Reached::count(&reached.user_index);
        let kept_by_index = git(&repo.dir, ["ls-files", "-s", "-v"])
            .lines()
            .any(|l| l.starts_with('S') || l.starts_with('h') || l.contains(" 160000 "));
        if kept_by_index {
            Reached::count(&reached.kept_state);
        }
    }
    if !ignored_untracked.is_empty() {
        Reached::count(&reached.ignored_untracked);
    }
    if tiny_event_buffer {
        Reached::count(&reached.tiny_buffer);
        if overflowed {
            Reached::count(&reached.overflowed);
        }
    }
    if has_corner(&before, &during) {
        Reached::count(&reached.corners);
    }
    Reached::count(&reached.cases);
    Ok(())
}
