//! Top-down walks of the working tree that never enter an ignored directory (but for the
//! tracked paths it holds) or a symlink: the start-up pass (one walk for the watches and the
//! first save), rescans, and new directories. Entry types come from what `readdir` returns
//! (`d_type`); only files and symlinks get an `lstat`, for the stat data the index compares.

use std::fs::{self, FileType, Metadata};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::filter::{Filter, RuleWarning};

/// What a kept non-directory entry is, as `git add -A` sees it.
#[derive(Debug, Clone)]
pub enum EntryKind {
    /// A regular file or a symlink (committed as a link, never followed), with its `lstat`.
    File(Metadata),
    /// A directory holding a repository of its own and nothing tracked: recorded as a
    /// gitlink, not entered.
    NestedRepo,
    /// A directory the index holds as a gitlink (a submodule), checked out or not.
    Gitlink,
}

/// What the index holds at or under a directory, which decides how `git add -A` walks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirInIndex {
    /// A gitlink: never entered, whatever the directory holds.
    Gitlink,
    /// Tracked paths below it: entered even when it holds a repository of its own.
    Tracked,
    /// Nothing: a repository there is a new gitlink, anything else is entered.
    Untracked,
}

/// A directory that holds a repository of its own, as git decides it: a `.git` directory with
/// `objects/`, `refs/` and a valid `HEAD`, or a `.git` file (`gitdir: PATH`) pointing at one.
/// A garbage `.git` file or an empty `.git` directory does not count: git walks into those.
pub fn is_nested_repo(abs_dir: &Path) -> bool {
    let dot_git = abs_dir.join(".git");
    let Ok(meta) = fs::symlink_metadata(&dot_git) else {
        return false;
    };
    if meta.is_dir() {
        return is_git_dir(&dot_git);
    }
    if !meta.is_file() {
        return false;
    }
    let Ok(text) = fs::read_to_string(&dot_git) else {
        return false;
    };
    let Some(target) = text.strip_prefix("gitdir: ") else {
        return false;
    };
    is_git_dir(&abs_dir.join(target.trim_end_matches(['\n', '\r'])))
}

/// git's `is_git_directory`: `objects/` and `refs/` directories and a `HEAD` that is a
/// symbolic ref under `refs/` or an object id.
fn is_git_dir(dir: &Path) -> bool {
    let is_dir = |name: &str| fs::metadata(dir.join(name)).is_ok_and(|m| m.is_dir());
    if !is_dir("objects") || !is_dir("refs") {
        return false;
    }
    let Ok(head) = fs::read_to_string(dir.join("HEAD")) else {
        return false;
    };
    let head = head.trim_end();
    head.strip_prefix("ref:")
        .is_some_and(|r| r.trim_start().starts_with("refs/"))
        || (head.len() >= 40 && head.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The directory side of a walk: the rules, and what is done with each directory before it
/// is read (the watch stage watches it and loads its `.gitignore` there).
pub trait Dirs {
    fn rules(&self) -> &Filter;

    /// A directory about to be read, or (`git_dir`) a nested repository's `.git`, which is
    /// never read: a commit inside it shows only there.
    fn enter(&mut self, dir: &Path, git_dir: bool);

    /// Whether the walk also goes where only watches are needed: into nested repositories and
    /// gitlinks, and into ignored directories that hold a tracked path.
    fn watching(&self) -> bool {
        false
    }

    /// Whether `dir` holds a tracked path the rules ignore (watched, though ignored).
    fn holds_tracked_ignored(&self, _dir: &Path) -> bool {
        false
    }
}

/// A batch's rules for the stage's walks, each directory's `.gitignore` read again as the walk
/// enters it (as `git add -A` reads it then), and nothing watched: a directory moved in after
/// the batch's snapshot was taken (a subtree walked from its parent) is judged by the rules it
/// holds, not by none. The snapshot is copied once, at the first directory; the watch stage
/// reports the rules files' warnings, so these are dropped.
pub struct Fresh(pub Arc<Filter>);

impl Dirs for Fresh {
    fn rules(&self) -> &Filter {
        &self.0
    }

    fn enter(&mut self, dir: &Path, git_dir: bool) {
        if !git_dir {
            Arc::make_mut(&mut self.0).load_dir(dir);
        }
    }
}

/// Rules loaded on the way down every directory a watch would need, and nothing watched:
/// `once`, which has no watch stage, loads its rules with it before its save.
pub struct LoadRules<'a> {
    pub filter: &'a mut Filter,
    pub warnings: Vec<RuleWarning>,
}

impl Dirs for LoadRules<'_> {
    fn rules(&self) -> &Filter {
        self.filter
    }

    fn enter(&mut self, dir: &Path, git_dir: bool) {
        if !git_dir {
            self.warnings.extend(self.filter.load_dir(dir));
        }
    }

    fn watching(&self) -> bool {
        true
    }
}

/// The entry side of a walk: what `git add -A` would consider, handed over as it is found.
pub trait Entries {
    /// What the index holds under a directory.
    fn in_index(&self, dir: &Path) -> DirInIndex;

    /// A kept file or symlink (with its `lstat`), nested repository or gitlink.
    fn found(&mut self, rel: PathBuf, kind: EntryKind);

    /// A directory that could not be read (what was saved of it stands: unreadable is not gone).
    fn unreadable(&mut self, dir: PathBuf);
}

/// A walk for the watches alone.
pub struct NoEntries;

impl Entries for NoEntries {
    fn in_index(&self, _dir: &Path) -> DirInIndex {
        DirInIndex::Untracked
    }

    fn found(&mut self, _rel: PathBuf, _kind: EntryKind) {}

    fn unreadable(&mut self, _dir: PathBuf) {}
}

/// One top-down walk from `start` (itself included) that serves both sides: every directory
/// `dirs` needs is entered (and `dirs.enter` sees it before it is read, so its `.gitignore`
/// applies to its children), and when `staged`, every kept entry below `start` goes to
/// `entries`. Start-up walks once for both (every watch set and the first save's stat pass);
/// later walks are for one side. Entries are handed over as they are found: nothing per file
/// is kept.
///
/// An ignored directory is entered (for the watches) only for the tracked paths it holds;
/// whatever else is below it stays ignored, whatever its own name. Nested repositories are
/// entered for the watches too, and their own `.git` is entered (watched) but not read;
/// whether such a directory is a gitlink or loose files depends on the index, which
/// `entries.in_index` says.
pub fn walk<D, E>(workdir: &Path, start: &Path, staged: bool, dirs: &mut D, entries: &mut E)
where
    D: Dirs + ?Sized,
    E: Entries + ?Sized,
{
    let watching = dirs.watching();
    let start_ignored = !start.as_os_str().is_empty() && !dirs.rules().is_kept(start, true);
    let mut stack = vec![(start.to_owned(), start_ignored, staged && !start_ignored)];
    while let Some((dir, inside_ignored, staged)) = stack.pop() {
        dirs.enter(&dir, false);
        let Some(listing) = read_dir(workdir, &dir) else {
            if staged {
                entries.unreadable(dir);
            }
            continue;
        };
        // A nested repository's `.git` is entered after the listing, which is judged by the
        // rules of `dir` looked up once.
        let mut git_dirs = Vec::new();
        let mut rules = dirs.rules().dir_rules(&dir);
        for (rel, file_type, entry) in listing {
            let Some(name) = rel.file_name() else {
                continue;
            };
            if file_type.is_dir() {
                if !dir.as_os_str().is_empty() && name == ".git" {
                    if watching {
                        git_dirs.push(rel);
                    }
                    continue;
                }
                let ignored = inside_ignored || rules.is_ignored(name, true);
                let mut stage_it = false;
                if staged && !ignored {
                    match entries.in_index(&rel) {
                        DirInIndex::Gitlink => entries.found(rel.clone(), EntryKind::Gitlink),
                        DirInIndex::Untracked if is_nested_repo(&workdir.join(&rel)) => {
                            if !dirs.rules().outside_sparse(&rel, true) {
                                entries.found(rel.clone(), EntryKind::NestedRepo);
                            }
                        }
                        DirInIndex::Tracked | DirInIndex::Untracked => stage_it = true,
                    }
                }
                let watch_it = watching && (!ignored || dirs.holds_tracked_ignored(&rel));
                if stage_it || watch_it {
                    stack.push((rel, ignored, stage_it));
                }
            } else if staged && (file_type.is_file() || file_type.is_symlink()) {
                // Tracked files outside a sparse checkout are refreshed from the index.
                if !rules.is_ignored(name, false)
                    && !dirs.rules().outside_sparse(&rel, false)
                    && let Ok(meta) = entry.metadata()
                {
                    entries.found(rel, EntryKind::File(meta));
                }
            }
        }
        drop(rules);
        for git_dir in git_dirs {
            dirs.enter(&git_dir, true);
        }
    }
}

/// The entries of one directory with their type as `readdir` gives it (no `lstat` on the file
/// systems that fill `d_type`); a directory that vanished yields nothing (its removal arrives
/// as an event of its own), one that cannot be read `None`.
///
/// Each entry keeps its `DirEntry`, whose `metadata` is an `lstat` relative to the open
/// directory: the kernel resolves one name, not the whole path again.
fn read_dir(workdir: &Path, dir: &Path) -> Option<Vec<(PathBuf, FileType, fs::DirEntry)>> {
    let entries = match fs::read_dir(workdir.join(dir)) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Some(Vec::new()),
        Err(e) => {
            tracing::warn!(dir = %dir.display(), "cannot read directory, its last saved files are kept: {e}");
            return None;
        }
    };
    let entries = entries
        .flatten()
        .filter_map(|entry| {
            let file_type = entry.file_type().ok()?;
            Some((dir.join(entry.file_name()), file_type, entry))
        })
        .collect();
    Some(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// Records what a staged walk hands over.
    #[derive(Default)]
    struct Seen {
        files: Vec<PathBuf>,
        unreadable: Vec<PathBuf>,
    }

    impl Entries for Seen {
        fn in_index(&self, _dir: &Path) -> DirInIndex {
            DirInIndex::Untracked
        }

        fn found(&mut self, rel: PathBuf, kind: EntryKind) {
            if let EntryKind::File(_) = kind {
                self.files.push(rel);
            }
        }

        fn unreadable(&mut self, dir: PathBuf) {
            self.unreadable.push(dir);
        }
    }

    /// Replaces the other of `a` and `b` by a file when the walk enters the first of them: a
    /// directory replaced after its parent was read and before it is.
    struct Replacing<'a> {
        filter: &'a mut Filter,
        workdir: PathBuf,
        entered: Vec<PathBuf>,
    }

    impl Dirs for Replacing<'_> {
        fn rules(&self) -> &Filter {
            self.filter
        }

        fn enter(&mut self, dir: &Path, _git_dir: bool) {
            self.entered.push(dir.to_owned());
            if self.entered.len() == 2 {
                let other = if dir == Path::new("a") { "b" } else { "a" };
                let abs = self.workdir.join(other);
                fs::remove_dir_all(&abs).unwrap();
                fs::write(&abs, "now a file").unwrap();
            }
        }

        fn watching(&self) -> bool {
            true
        }
    }

    #[test]
    fn a_directory_replaced_by_a_file_mid_walk_is_unreadable_not_gone() {
        let tmp = tempfile::tempdir().unwrap();
        let workdir = tmp.path().to_owned();
        for dir in ["a", "b"] {
            fs::create_dir_all(workdir.join(dir)).unwrap();
            fs::write(workdir.join(dir).join("inside.txt"), dir).unwrap();
        }
        let (mut filter, _) = Filter::new(&workdir, &workdir.join(".git"), None, false);
        let mut dirs = Replacing {
            filter: &mut filter,
            workdir: workdir.clone(),
            entered: Vec::new(),
        };
        let mut seen = Seen::default();
        walk(&workdir, Path::new(""), true, &mut dirs, &mut seen);
        let first = dirs.entered[1].clone();
        let replaced = if first == Path::new("a") { "b" } else { "a" };
        assert_eq!(seen.files, [first.join("inside.txt")]);
        // What was saved under it stands until the events of the swap are staged.
        assert_eq!(seen.unreadable, [PathBuf::from(replaced)]);
        assert_eq!(dirs.entered.len(), 3, "{:?}", dirs.entered);
    }

    #[test]
    fn symlinks_are_entries_and_never_entered() {
        let tmp = tempfile::tempdir().unwrap();
        let workdir = tmp.path().join("w");
        fs::create_dir_all(workdir.join("real")).unwrap();
        fs::write(workdir.join("real/file.txt"), "x").unwrap();
        symlink("real", workdir.join("link")).unwrap();
        symlink(tmp.path(), workdir.join("up")).unwrap();
        let (mut filter, _) = Filter::new(&workdir, &workdir.join(".git"), None, false);
        let mut dirs = LoadRules {
            filter: &mut filter,
            warnings: Vec::new(),
        };
        let mut seen = Seen::default();
        walk(&workdir, Path::new(""), true, &mut dirs, &mut seen);
        seen.files.sort();
        let expected: Vec<PathBuf> = ["link", "real/file.txt", "up"]
            .iter()
            .map(PathBuf::from)
            .collect();
        assert_eq!(seen.files, expected);
    }

    /// `a` moved to `b/x` after the batch's rules were taken: the walk of `b` judges `b/x` by
    /// the `.gitignore` it holds, not by none (the snapshot has no rules for `b/x`).
    #[test]
    fn a_stage_walk_reads_the_rules_of_a_directory_moved_in_after_the_snapshot() {
        let tmp = tempfile::tempdir().unwrap();
        let workdir = tmp.path().join("w");
        fs::create_dir_all(workdir.join("b")).unwrap();
        let (mut snapshot, _) = Filter::new(&workdir, &workdir.join(".git"), None, false);
        snapshot.load_dir(Path::new(""));
        snapshot.load_dir(Path::new("b"));
        let moved = workdir.join("b/x");
        fs::create_dir_all(moved.join("c")).unwrap();
        fs::write(moved.join(".gitignore"), "***/c\n").unwrap();
        fs::write(moved.join("c/f"), "ignored").unwrap();
        fs::write(moved.join("k"), "kept").unwrap();
        let snapshot = Arc::new(snapshot);
        let mut dirs = Fresh(Arc::clone(&snapshot));
        let mut seen = Seen::default();
        walk(&workdir, Path::new("b"), true, &mut dirs, &mut seen);
        seen.files.sort();
        let expected: Vec<PathBuf> = ["b/x/.gitignore", "b/x/k"]
            .iter()
            .map(PathBuf::from)
            .collect();
        assert_eq!(seen.files, expected);
        assert!(
            !snapshot.has_rules_below(Path::new("b/x")),
            "the batch's snapshot itself is left as it was"
        );
    }
}
