//! Top-down walks of the working tree that never enter an ignored directory, a nested
//! repository or a symlink: the start-up pass, rescans, and new directories. Entry types come
//! from what `readdir` returns (`d_type`); only files and symlinks get an `lstat`, for the
//! stat data the index compares.

use std::fs::{self, FileType, Metadata};
use std::io;
use std::path::{Path, PathBuf};

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

/// Kept directories under `start` (itself included), loading each one's `.gitignore` into
/// `filter` before deciding about its children. `enter` sees each directory before it is
/// read (the watch stage watches it there). `start` must itself be kept.
///
/// Nested repositories are entered too, and their own `.git` directory is listed (and seen
/// by `enter`) but not entered: whether such a directory is a gitlink or loose files depends
/// on the index, which the stage decides, and a commit inside it shows only in its `.git`.
pub fn kept_dirs(
    workdir: &Path,
    start: &Path,
    filter: &mut Filter,
    warnings: &mut Vec<RuleWarning>,
    mut enter: impl FnMut(&Path),
) -> Vec<PathBuf> {
    let mut found = Vec::new();
    // An ignored directory is entered only for the tracked paths it holds (git updates
    // those); whatever else is below it stays ignored, whatever its own name.
    let start_ignored = !start.as_os_str().is_empty() && !filter.is_kept(start, true);
    let mut stack = vec![(start.to_owned(), start_ignored)];
    while let Some((dir, inside_ignored)) = stack.pop() {
        enter(&dir);
        warnings.extend(filter.load_dir(&dir));
        for (rel, file_type) in read_dir(workdir, &dir).unwrap_or_default() {
            if !file_type.is_dir() {
                continue;
            }
            if !dir.as_os_str().is_empty() && rel.file_name().is_some_and(|n| n == ".git") {
                enter(&rel);
                found.push(rel);
                continue;
            }
            let ignored = inside_ignored || filter.is_ignored(&rel, true);
            if !ignored || filter.holds_tracked_ignored(&rel) {
                stack.push((rel, ignored));
            }
        }
        found.push(dir);
    }
    found
}

/// Every kept file and symlink (with its `lstat`), nested repository and gitlink under `start`,
/// and the directories that could not be read (what was saved of them stands: unreadable is
/// not gone). `in_index` says what the index holds under a directory.
pub fn kept_entries(
    workdir: &Path,
    start: &Path,
    filter: &Filter,
    in_index: impl Fn(&Path) -> DirInIndex,
) -> (Vec<(PathBuf, EntryKind)>, Vec<PathBuf>) {
    let mut found = Vec::new();
    let mut unreadable = Vec::new();
    let mut stack = vec![start.to_owned()];
    while let Some(dir) = stack.pop() {
        let Some(entries) = read_dir(workdir, &dir) else {
            unreadable.push(dir);
            continue;
        };
        for (rel, ft) in entries {
            let is_dir = ft.is_dir();
            if filter.is_ignored(&rel, is_dir) {
                continue;
            }
            if ft.is_file() || ft.is_symlink() {
                // Tracked files outside a sparse checkout are refreshed from the index.
                if !filter.outside_sparse(&rel, false)
                    && let Ok(meta) = fs::symlink_metadata(workdir.join(&rel))
                {
                    found.push((rel, EntryKind::File(meta)));
                }
            } else if is_dir {
                match in_index(&rel) {
                    DirInIndex::Gitlink => found.push((rel, EntryKind::Gitlink)),
                    DirInIndex::Untracked if is_nested_repo(&workdir.join(&rel)) => {
                        if !filter.outside_sparse(&rel, true) {
                            found.push((rel, EntryKind::NestedRepo));
                        }
                    }
                    DirInIndex::Tracked | DirInIndex::Untracked => stack.push(rel),
                }
            }
        }
    }
    (found, unreadable)
}

/// The entries of one directory with their type as `readdir` gives it (no `lstat` on the file
/// systems that fill `d_type`); a directory that vanished yields nothing (its removal arrives
/// as an event of its own), one that cannot be read `None`.
fn read_dir(workdir: &Path, dir: &Path) -> Option<Vec<(PathBuf, FileType)>> {
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
            Some((dir.join(entry.file_name()), file_type))
        })
        .collect();
    Some(entries)
}
