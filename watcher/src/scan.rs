//! Top-down walks of the working tree that never enter an ignored directory, a nested
//! repository or a symlink: the start-up pass, rescans, and new directories.

use std::fs::{self, Metadata};
use std::io;
use std::path::{Path, PathBuf};

use crate::filter::{Filter, RuleWarning};

/// What a kept non-directory entry is, as `git add -A` sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file or a symlink (committed as a link, never followed).
    File,
    /// A directory holding its own `.git`: recorded as a gitlink, not entered.
    NestedRepo,
}

/// A directory that holds a `.git` of its own.
pub fn is_nested_repo(abs_dir: &Path) -> bool {
    fs::symlink_metadata(abs_dir.join(".git")).is_ok()
}

/// The kind of `abs` for staging, or `None` for something git does not track (sockets,
/// fifos, devices, directories that are not nested repositories) or a path that is gone.
pub fn entry_kind(abs: &Path, meta: &Metadata) -> Option<EntryKind> {
    let ft = meta.file_type();
    if ft.is_file() || ft.is_symlink() {
        Some(EntryKind::File)
    } else if ft.is_dir() && is_nested_repo(abs) {
        Some(EntryKind::NestedRepo)
    } else {
        None
    }
}

/// Kept directories under `start` (itself included), loading each one's `.gitignore` into
/// `filter` before deciding about its children. `enter` sees each directory before it is
/// read (the watch stage watches it there). `start` must itself be kept.
pub fn kept_dirs(
    workdir: &Path,
    start: &Path,
    filter: &mut Filter,
    warnings: &mut Vec<RuleWarning>,
    mut enter: impl FnMut(&Path),
) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![start.to_owned()];
    while let Some(dir) = stack.pop() {
        enter(&dir);
        warnings.extend(filter.load_dir(&dir));
        for (rel, meta) in read_dir(workdir, &dir).unwrap_or_default() {
            if meta.is_dir()
                && !filter.is_ignored(&rel, true)
                && !is_nested_repo(&workdir.join(&rel))
            {
                stack.push(rel);
            }
        }
        found.push(dir);
    }
    found
}

/// Every kept file, symlink and nested repository under `start`, with its metadata, and the
/// directories that could not be read (what was saved of them stands: unreadable is not gone).
pub fn kept_entries(
    workdir: &Path,
    start: &Path,
    filter: &Filter,
) -> (Vec<(PathBuf, EntryKind, Metadata)>, Vec<PathBuf>) {
    let mut found = Vec::new();
    let mut unreadable = Vec::new();
    let mut stack = vec![start.to_owned()];
    while let Some(dir) = stack.pop() {
        let Some(entries) = read_dir(workdir, &dir) else {
            unreadable.push(dir);
            continue;
        };
        for (rel, meta) in entries {
            let is_dir = meta.is_dir();
            if filter.is_ignored(&rel, is_dir) {
                continue;
            }
            match entry_kind(&workdir.join(&rel), &meta) {
                Some(kind) => found.push((rel, kind, meta)),
                None if is_dir => stack.push(rel),
                None => {}
            }
        }
    }
    (found, unreadable)
}

/// The entries of one directory with their `lstat`; a directory that vanished yields nothing
/// (its removal arrives as an event of its own), one that cannot be read `None`.
fn read_dir(workdir: &Path, dir: &Path) -> Option<Vec<(PathBuf, Metadata)>> {
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
            let meta = entry.metadata().ok()?;
            Some((dir.join(entry.file_name()), meta))
        })
        .collect();
    Some(entries)
}
