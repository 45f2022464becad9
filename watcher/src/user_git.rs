//! What the user's own git is doing in the repository, so that the watcher never saves into
//! it: an operation stopped half way (git's own markers, as `wt-status.c` and libgit2's
//! `git_repository_state` read them), a detached `HEAD`, a git command running that may move
//! `HEAD` or the index (a `git commit` waiting for its editor), or git's lock files.
//!
//! The running commands are found in `/proc`: a process whose program is `git`, whose
//! subcommand is one of [`MOVES_HEAD`] (aliases resolved through the repository's
//! configuration) and whose working directory (after `-C`), or `GIT_DIR`, is in this
//! repository. A lock file is git's as long as a git command that may hold it runs in the
//! repository (any but one that only reads, or works on an index of its own), or any process
//! has it open: the watcher removes none then.

use std::fmt;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Subcommands that move `HEAD`, a branch or the index after waiting for the user (an editor)
/// or between steps: while one runs in the repository, the watcher saves nothing.
const MOVES_HEAD: &[&str] = &[
    "commit",
    "merge",
    "rebase",
    "cherry-pick",
    "revert",
    "am",
    "pull",
    "stash",
    "checkout",
    "switch",
    "reset",
    "bisect",
    "update-ref",
    "symbolic-ref",
    "read-tree",
];

/// Subcommands that only read (none takes a lock of the repository).
const READ_ONLY: &[&str] = &[
    "blame",
    "cat-file",
    "check-attr",
    "check-ignore",
    "config",
    "count-objects",
    "describe",
    "for-each-ref",
    "fsck",
    "grep",
    "hash-object",
    "help",
    "interpret-trailers",
    "log",
    "ls-files",
    "ls-remote",
    "ls-tree",
    "merge-base",
    "name-rev",
    "rev-list",
    "rev-parse",
    "shortlog",
    "show",
    "show-ref",
    "var",
    "version",
];

/// git's global options that take their value as the next argument (`git.c`'s
/// `handle_options`).
const OPTIONS_WITH_VALUE: &[&str] = &[
    "-C",
    "-c",
    "--git-dir",
    "--work-tree",
    "--namespace",
    "--config-env",
    "--attr-source",
    "--shallow-file",
];

/// Why the watcher does not save now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Pause {
    /// A merge, rebase, cherry-pick, revert, `am`, bisect or sequencer run stopped half way.
    Operation(Operation),
    /// The index holds unmerged entries (a conflict to resolve).
    Unmerged,
    /// `HEAD` names a commit, not a branch.
    Detached,
    /// A git command holds one of these lock files.
    Locked(PathBuf),
    /// A git command that may move `HEAD` runs in the repository.
    Command { pid: u32, subcommand: String },
}

impl fmt::Display for Pause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Operation(op) => write!(f, "{op} in progress"),
            Self::Unmerged => f.write_str("unmerged paths in the index (a conflict to resolve)"),
            Self::Detached => f.write_str(
                "HEAD is detached (not on a branch); nothing is saved until a branch is checked out",
            ),
            Self::Locked(path) => {
                let name = path.file_name().unwrap_or_default().to_string_lossy();
                write!(f, "a git command holds {name}")
            }
            Self::Command { pid, subcommand } => {
                write!(f, "`git {subcommand}` is running (pid {pid})")
            }
        }
    }
}

impl Pause {
    /// Whether its end is a change of the git directory the watch stage reports (a marker
    /// removed, `HEAD` or the index written): the watcher then waits for that, and looks again
    /// on a timer only for a lock or a running command, whose end no file event shows.
    pub(crate) fn ends_with_git_event(&self) -> bool {
        matches!(self, Self::Operation(_) | Self::Unmerged | Self::Detached)
    }
}

/// The operations git leaves half done, by the markers it leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Operation {
    Merge,
    Rebase,
    Am,
    CherryPick,
    Revert,
    Bisect,
    /// A `git cherry-pick` or `git revert` of several commits (`sequencer/`).
    Sequencer,
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Merge => "merge",
            Self::Rebase => "rebase",
            Self::Am => "am",
            Self::CherryPick => "cherry-pick",
            Self::Revert => "revert",
            Self::Bisect => "bisect",
            Self::Sequencer => "cherry-pick or revert sequence",
        })
    }
}

/// The operation `git_dir` (a worktree's own git directory) is in the middle of, in the order
/// `wt_status_get_state` tests them: `MERGE_HEAD`; `rebase-apply/` (`applying`: `am`),
/// `rebase-merge/`; `CHERRY_PICK_HEAD`; `BISECT_LOG`; `REVERT_HEAD`; `sequencer/todo`.
pub(crate) fn operation_in_progress(git_dir: &Path) -> Option<Operation> {
    let has = |name: &str| fs::symlink_metadata(git_dir.join(name)).is_ok();
    if has("MERGE_HEAD") {
        Some(Operation::Merge)
    } else if has("rebase-apply") {
        Some(if has("rebase-apply/applying") {
            Operation::Am
        } else {
            Operation::Rebase
        })
    } else if has("rebase-merge") {
        Some(Operation::Rebase)
    } else if has("CHERRY_PICK_HEAD") {
        Some(Operation::CherryPick)
    } else if has("BISECT_LOG") {
        Some(Operation::Bisect)
    } else if has("REVERT_HEAD") {
        Some(Operation::Revert)
    } else if has("sequencer/todo") {
        Some(Operation::Sequencer)
    } else {
        None
    }
}

/// Where one repository's git commands may run: its working tree, its git directory and the
/// common directory of its worktrees.
pub(crate) struct RepoPlaces {
    workdir: PathBuf,
    git_dir: PathBuf,
    common_dir: PathBuf,
}

/// A git process running in the repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GitProcess {
    pub(crate) pid: u32,
    /// The subcommand, aliases resolved (empty when none was given).
    pub(crate) subcommand: String,
    /// Whether it works on another index than the repository's (`GIT_INDEX_FILE`).
    pub(crate) other_index: bool,
}

impl RepoPlaces {
    /// The places of `repo` (paths made canonical).
    pub(crate) fn of(repo: &git2::Repository) -> Self {
        let canonical = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_owned());
        Self {
            workdir: canonical(repo.workdir().unwrap_or(repo.path())),
            git_dir: canonical(repo.path()),
            common_dir: canonical(repo.commondir()),
        }
    }

    fn holds(&self, path: &Path) -> bool {
        path.starts_with(&self.workdir)
            || path.starts_with(&self.git_dir)
            || path.starts_with(&self.common_dir)
    }

    /// The git processes of this user running in this repository (`aliases`: the
    /// repository's configuration, to resolve `git ci` to `commit`).
    pub(crate) fn git_processes(&self, aliases: Option<&git2::Config>) -> Vec<GitProcess> {
        let Ok(procs) = fs::read_dir("/proc") else {
            return Vec::new();
        };
        let me = std::process::id();
        procs
            .flatten()
            .filter_map(|p| p.file_name().to_str()?.parse::<u32>().ok())
            .filter(|&pid| pid != me)
            .filter_map(|pid| self.git_process(pid, aliases))
            .collect()
    }

    fn git_process(&self, pid: u32, aliases: Option<&git2::Config>) -> Option<GitProcess> {
        let dir = PathBuf::from(format!("/proc/{pid}"));
        let cmdline = fs::read(dir.join("cmdline")).ok()?;
        let args: Vec<&[u8]> = cmdline
            .split(|&b| b == 0)
            .filter(|a| !a.is_empty())
            .collect();
        let (program, rest) = args.split_first()?;
        let program = Path::new(std::ffi::OsStr::from_bytes(program));
        let name = program.file_name()?.to_str()?;
        let dashed = name.strip_prefix("git-").map(str::to_owned);
        if name != "git" && dashed.is_none() {
            return None;
        }
        let cwd = fs::read_link(dir.join("cwd")).ok()?;
        let invocation = Invocation::parse(rest);
        let mut place = match &invocation.chdir {
            Some(c) => cwd.join(c),
            None => cwd,
        };
        if let Some(git_dir) = invocation
            .git_dir
            .clone()
            .or_else(|| env_var(&dir, b"GIT_DIR"))
        {
            place = place.join(git_dir);
        }
        let place = place.canonicalize().unwrap_or(place);
        if !self.holds(&place) {
            return None;
        }
        let subcommand = dashed.or(invocation.subcommand).unwrap_or_default();
        let other_index = env_var(&dir, b"GIT_INDEX_FILE").is_some_and(|index| {
            let index = place.join(index);
            index.canonicalize().unwrap_or(index) != self.git_dir.join("index")
        });
        Some(GitProcess {
            pid,
            subcommand: resolve_alias(&subcommand, aliases),
            other_index,
        })
    }
}

impl GitProcess {
    /// Whether it may move `HEAD`, a branch or the index while it runs.
    pub(crate) fn moves_head(&self) -> bool {
        MOVES_HEAD.contains(&self.subcommand.as_str())
    }

    /// Whether a lock file of the repository (`index.lock`, `HEAD.lock`, a branch's) may be
    /// its: not for a command that only reads, nor for one on another index unless it moves
    /// `HEAD` or a branch.
    pub(crate) fn may_hold_locks(&self) -> bool {
        if READ_ONLY.contains(&self.subcommand.as_str()) {
            return false;
        }
        !self.other_index || self.moves_head()
    }
}

/// What a git command line says about where it runs and what it does.
#[derive(Debug, Default, PartialEq, Eq)]
struct Invocation {
    chdir: Option<PathBuf>,
    git_dir: Option<PathBuf>,
    subcommand: Option<String>,
}

impl Invocation {
    /// Reads git's global options (`-C` is relative to the one before, as git applies them),
    /// then the subcommand.
    fn parse(args: &[&[u8]]) -> Self {
        let path = |a: &[u8]| PathBuf::from(std::ffi::OsStr::from_bytes(a));
        let mut out = Self::default();
        let mut i = 0;
        while i < args.len() {
            let arg = args[i];
            if !arg.starts_with(b"-") {
                out.subcommand = Some(String::from_utf8_lossy(arg).into_owned());
                break;
            }
            let text = String::from_utf8_lossy(arg);
            if OPTIONS_WITH_VALUE.contains(&text.as_ref()) {
                let value = args.get(i + 1).copied().unwrap_or_default();
                match text.as_ref() {
                    "-C" if !value.is_empty() => {
                        out.chdir = Some(match out.chdir.take() {
                            Some(before) => before.join(path(value)),
                            None => path(value),
                        });
                    }
                    "--git-dir" => out.git_dir = Some(path(value)),
                    _ => {}
                }
                i += 2;
                continue;
            }
            if let Some(value) = arg.strip_prefix(b"--git-dir=") {
                out.git_dir = Some(path(value));
            }
            i += 1;
        }
        out
    }
}

/// `alias.<name>`'s first word when it names a git command (a `!shell` alias runs git commands
/// of its own, found by themselves).
fn resolve_alias(subcommand: &str, aliases: Option<&git2::Config>) -> String {
    if MOVES_HEAD.contains(&subcommand) || subcommand.is_empty() {
        return subcommand.to_owned();
    }
    aliases
        .and_then(|c| c.get_string(&format!("alias.{subcommand}")).ok())
        .and_then(|value| {
            value
                .split_whitespace()
                .next()
                .filter(|w| !w.starts_with('!'))
                .map(str::to_owned)
        })
        .unwrap_or_else(|| subcommand.to_owned())
}

/// A variable of a process's environment, when this process may read it.
fn env_var(proc_dir: &Path, name: &[u8]) -> Option<PathBuf> {
    let environ = fs::read(proc_dir.join("environ")).ok()?;
    environ.split(|&b| b == 0).find_map(|entry| {
        let value = entry.strip_prefix(name)?.strip_prefix(b"=")?;
        Some(PathBuf::from(std::ffi::OsStr::from_bytes(value)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_are_told_by_git_s_markers_in_git_s_order() {
        let check = |markers: &[&str], expected: Option<Operation>| {
            let dir = tempfile::tempdir().unwrap();
            for m in markers {
                let path = dir.path().join(m);
                if m.ends_with('/') {
                    fs::create_dir_all(&path).unwrap();
                } else {
                    fs::create_dir_all(path.parent().unwrap()).unwrap();
                    fs::write(&path, "x").unwrap();
                }
            }
            assert_eq!(operation_in_progress(dir.path()), expected, "{markers:?}");
        };
        check(&[], None);
        check(&["MERGE_HEAD"], Some(Operation::Merge));
        check(&["rebase-apply/"], Some(Operation::Rebase));
        check(&["rebase-apply/applying"], Some(Operation::Am));
        check(&["rebase-merge/"], Some(Operation::Rebase));
        check(&["rebase-merge/interactive"], Some(Operation::Rebase));
        check(&["CHERRY_PICK_HEAD"], Some(Operation::CherryPick));
        check(&["REVERT_HEAD"], Some(Operation::Revert));
        check(&["BISECT_LOG"], Some(Operation::Bisect));
        check(&["sequencer/todo"], Some(Operation::Sequencer));
        check(&["sequencer/"], None);
        check(&["MERGE_HEAD", "rebase-merge/"], Some(Operation::Merge));
        check(
            &["CHERRY_PICK_HEAD", "BISECT_LOG"],
            Some(Operation::CherryPick),
        );
        check(&["BISECT_LOG", "REVERT_HEAD"], Some(Operation::Bisect));
        check(&["COMMIT_EDITMSG", "ORIG_HEAD", "FETCH_HEAD"], None);
    }

    #[test]
    fn a_command_line_says_where_git_runs_and_what_it_does() {
        let check =
            |line: &[&str], chdir: Option<&str>, git_dir: Option<&str>, sub: Option<&str>| {
                let args: Vec<&[u8]> = line.iter().map(|a| a.as_bytes()).collect();
                assert_eq!(
                    Invocation::parse(&args),
                    Invocation {
                        chdir: chdir.map(PathBuf::from),
                        git_dir: git_dir.map(PathBuf::from),
                        subcommand: sub.map(str::to_owned),
                    },
                    "{line:?}"
                );
            };
        check(&["commit", "-a"], None, None, Some("commit"));
        check(&["-C", "p", "commit"], Some("p"), None, Some("commit"));
        check(
            &["-C", "a", "-C", "b", "merge"],
            Some("a/b"),
            None,
            Some("merge"),
        );
        check(
            &["-c", "core.editor=vi", "rebase", "-i"],
            None,
            None,
            Some("rebase"),
        );
        check(
            &["--git-dir", "/r/.git", "am"],
            None,
            Some("/r/.git"),
            Some("am"),
        );
        check(
            &["--git-dir=/r/.git", "--no-pager", "log"],
            None,
            Some("/r/.git"),
            Some("log"),
        );
        check(
            &["--work-tree", "w", "-p", "stash"],
            None,
            None,
            Some("stash"),
        );
        check(&["--version"], None, None, None);
        check(&[], None, None, None);
    }

    #[test]
    fn only_commands_that_may_write_may_hold_the_locks() {
        let check = |subcommand: &str, other_index: bool, expected: bool| {
            let git = GitProcess {
                pid: 1,
                subcommand: subcommand.into(),
                other_index,
            };
            assert_eq!(git.may_hold_locks(), expected, "{subcommand} {other_index}");
        };
        check("commit", false, true);
        check("add", false, true);
        check("status", false, true);
        check("add", true, false);
        check("commit", true, true);
        check("rev-parse", false, false);
        check("ls-tree", false, false);
    }

    #[test]
    fn pauses_say_why() {
        assert_eq!(
            Pause::Operation(Operation::Merge).to_string(),
            "merge in progress"
        );
        assert_eq!(
            Pause::Command {
                pid: 7,
                subcommand: "commit".into()
            }
            .to_string(),
            "`git commit` is running (pid 7)"
        );
        assert_eq!(
            Pause::Locked(PathBuf::from("/r/.git/index.lock")).to_string(),
            "a git command holds index.lock"
        );
    }

    #[test]
    fn a_git_process_in_the_repository_is_found_and_one_elsewhere_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let repo_dir = dir.path().join("r");
        let repo = git2::Repository::init(&repo_dir).unwrap();
        let places = RepoPlaces::of(&repo);
        let editor = dir.path().join("wait.sh");
        fs::write(&editor, "#!/bin/sh\nsleep 30\n").unwrap();
        let spawn = |cwd: &Path, args: &[&str]| {
            std::process::Command::new("git")
                .args(args)
                .current_dir(cwd)
                .env("GIT_CONFIG_GLOBAL", "/dev/null")
                .env("GIT_EDITOR", &editor)
                .env("GIT_AUTHOR_NAME", "t")
                .env("GIT_AUTHOR_EMAIL", "t@t")
                .env("GIT_COMMITTER_NAME", "t")
                .env("GIT_COMMITTER_EMAIL", "t@t")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap()
        };
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&editor, fs::Permissions::from_mode(0o755)).unwrap();
        let mut inside = spawn(&repo_dir, &["commit", "--allow-empty"]);
        let mut outside = spawn(dir.path(), &["-C", "/", "commit", "--allow-empty"]);
        let found = testkit::wait::until(
            std::time::Duration::from_secs(30),
            "the editor of git commit",
            || {
                let found = places.git_processes(None);
                // `git commit` forks to run the editor: until the child execs, it is a
                // `git commit` in the repository too.
                (found.len() == 1).then_some(found)
            },
        );
        assert_eq!(
            found,
            [GitProcess {
                pid: inside.id(),
                subcommand: "commit".into(),
                other_index: false,
            }]
        );
        assert!(found[0].moves_head() && found[0].may_hold_locks());
        for child in [&mut inside, &mut outside] {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
