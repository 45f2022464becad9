//! What flows from the watch stage through the debounce to the stage: the paths that may
//! have changed, the directories to scan again, whether `.env` changed, and the ignore rules
//! they are to be judged by (the watch stage's snapshot).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::filter::Rules;

/// Paths are relative to the working tree; the empty path is the whole tree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// Files, symlinks or directories that may have been created, edited or removed.
    pub paths: BTreeSet<PathBuf>,
    /// Directories whose whole content must be compared with the index (new directories,
    /// `.gitignore` edits, rescans).
    pub subtrees: BTreeSet<PathBuf>,
    /// `.env` changed, so the manifest may have to be rewritten.
    pub env_changed: bool,
    /// The user's git moved `HEAD` or began or ended an operation (its markers in the git
    /// directory): the save looks again whether it must wait, even with no file changed.
    pub git_state: bool,
    /// The rules as the watch stage had them when it sent these changes (a rule edit is
    /// judged by the new rules); `None` keeps the rules of the save before.
    pub rules: Option<Rules>,
}

impl Changes {
    /// A full pass: everything is compared again (start-up, overflow, shutdown).
    pub fn everything() -> Self {
        Self {
            subtrees: BTreeSet::from([PathBuf::new()]),
            env_changed: true,
            ..Self::default()
        }
    }

    pub fn is_empty(&self) -> bool {
        self.paths.is_empty() && self.subtrees.is_empty() && !self.env_changed && !self.git_state
    }

    pub fn merge(&mut self, other: Changes) {
        self.paths.extend(other.paths);
        self.subtrees.extend(other.subtrees);
        self.env_changed |= other.env_changed;
        self.git_state |= other.git_state;
        self.rules = match (self.rules.take(), other.rules) {
            (Some(mine), Some(theirs)) => Some(mine.newest(theirs)),
            (mine, theirs) => mine.or(theirs),
        };
    }

    /// The subtrees to scan with none inside another, and the paths no subtree covers.
    pub fn minimal(&self) -> (Vec<&Path>, Vec<&Path>) {
        let mut subtrees: Vec<&Path> = Vec::new();
        for dir in &self.subtrees {
            // BTreeSet order puts a directory before everything inside it.
            if !subtrees.iter().any(|s| dir.starts_with(s)) {
                subtrees.push(dir);
            }
        }
        let paths = self
            .paths
            .iter()
            .filter(|p| !subtrees.iter().any(|s| p.starts_with(s)))
            .map(PathBuf::as_path)
            .collect();
        (subtrees, paths)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimal_drops_what_a_subtree_covers() {
        let mut c = Changes::default();
        for p in ["a/x", "b/y", "ab"] {
            c.paths.insert(p.into());
        }
        for s in ["a", "a/deep", "c"] {
            c.subtrees.insert(s.into());
        }
        let (subtrees, paths) = c.minimal();
        assert_eq!(subtrees, [Path::new("a"), Path::new("c")]);
        assert_eq!(paths, [Path::new("ab"), Path::new("b/y")]);
        let everything = Changes::everything();
        let (subtrees, _) = everything.minimal();
        assert_eq!(subtrees, [Path::new("")]);
    }
}
