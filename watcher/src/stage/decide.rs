//! What `git add -A` does with one path, decided from what the index holds, what the disk
//! holds and what the rules say: a pure function, so every combination is a line of the table
//! below.

use git2::{IndexEntry, IndexEntryExtendedFlag, IndexEntryFlag};

/// The mode of a gitlink (a submodule's commit) in the index.
pub(crate) const GITLINK_MODE: u32 = 0o160000;

/// How the index holds one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Held {
    No,
    /// skip-worktree or assume-unchanged, or outside the sparse checkout: git leaves the entry
    /// as it is.
    Frozen,
    /// A submodule.
    Gitlink,
    /// A file or a symlink.
    File,
}

impl Held {
    /// How `entry` (none: the path is not in the index) holds its path; `frozen` tells
    /// whether git leaves it as it is.
    pub(crate) fn of(entry: Option<&IndexEntry>, frozen: impl FnOnce(&IndexEntry) -> bool) -> Self {
        match entry {
            None => Self::No,
            Some(entry) if frozen(entry) => Self::Frozen,
            Some(entry) if entry.mode == GITLINK_MODE => Self::Gitlink,
            Some(_) => Self::File,
        }
    }
}

/// What the working tree holds at a path (`lstat`, symlinks not followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnDisk {
    Missing,
    Dir,
    /// A regular file or a symlink: what git stores.
    File,
    /// A FIFO, a socket, a device: nothing git stores.
    Other,
    /// `lstat` failed for another reason than the path being gone (permissions): unknown.
    Unreadable,
}

impl OnDisk {
    /// The kind of what `lstat` answered.
    pub(crate) fn of(lstat: &std::io::Result<std::fs::Metadata>) -> Self {
        match lstat {
            Ok(meta) if meta.is_dir() => Self::Dir,
            Ok(meta) if meta.is_file() || meta.is_symlink() => Self::File,
            Ok(_) => Self::Other,
            Err(e) if is_gone(e) => Self::Missing,
            Err(_) => Self::Unreadable,
        }
    }
}

/// The path, or a directory on its way, does not exist.
pub(crate) fn is_gone(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
    )
}

/// How the stage came to the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Via {
    /// An event or a batch named it (it may have changed into anything).
    Changed,
    /// A tracked entry no walk reached: it, or a directory above it, is ignored.
    Unreached,
}

/// What the stage does with the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// The entry stays as it is.
    Leave,
    /// The entry stays as it is, because the disk could not be read (a warning says so).
    KeepSaved,
    /// The gitlink moves to the submodule's `HEAD` (when it is checked out).
    Gitlink,
    /// The directory is staged as a subtree.
    Walk,
    /// The file's content is staged.
    Add,
    /// The path leaves the index.
    Remove,
}

/// What `git add -A` does with a path the index holds as `held`, the disk as `disk`; `kept`:
/// the rules keep it (not ignored, inside the sparse checkout); `always_ignored`: `.git` or
/// an env file, never saved even when tracked.
pub(crate) fn decide(
    via: Via,
    held: Held,
    disk: OnDisk,
    kept: bool,
    always_ignored: bool,
) -> Action {
    if held == Held::Frozen {
        return Action::Leave;
    }
    match via {
        Via::Unreached if always_ignored => Action::Remove,
        _ if disk == OnDisk::Unreadable => Action::KeepSaved,
        Via::Changed => match disk {
            OnDisk::Dir if held == Held::Gitlink => Action::Gitlink,
            OnDisk::Dir => Action::Walk,
            // Tracked files stay tracked and are updated even when an ignore rule matches them.
            OnDisk::File if kept || is_tracked(held, always_ignored) => Action::Add,
            OnDisk::File | OnDisk::Missing | OnDisk::Other | OnDisk::Unreadable => Action::Remove,
        },
        Via::Unreached => match disk {
            OnDisk::File => Action::Add,
            OnDisk::Dir if held == Held::Gitlink => Action::Gitlink,
            OnDisk::Dir | OnDisk::Missing | OnDisk::Other | OnDisk::Unreadable => Action::Remove,
        },
    }
}

/// Whether git keeps updating the path whatever the rules say: the index holds it and it is
/// not one of the paths never saved.
pub(crate) fn is_tracked(held: Held, always_ignored: bool) -> bool {
    held != Held::No && !always_ignored
}

/// skip-worktree or assume-unchanged.
pub(crate) fn is_frozen(entry: &IndexEntry) -> bool {
    entry.flags & IndexEntryFlag::VALID.bits() != 0
        || entry.flags_extended & IndexEntryExtendedFlag::SKIP_WORKTREE.bits() != 0
}

/// `git add -N`: an entry with no content yet, always hashed.
pub(crate) fn is_intent_to_add(entry: &IndexEntry) -> bool {
    entry.flags_extended & IndexEntryExtendedFlag::INTENT_TO_ADD.bits() != 0
}

#[cfg(test)]
mod tests {
    use super::Action::*;
    use super::Held::{File as Tracked, Frozen, Gitlink as Submodule, No};
    use super::OnDisk::{Dir, File, Missing, Other, Unreadable};
    use super::Via::{Changed, Unreached};
    use super::*;

    /// One line per case: how the stage came to the path, the index, the disk, whether the
    /// rules keep it, whether it is never saved; then what `git add -A` does.
    #[test]
    fn each_path_as_git_add_all_treats_it() {
        let check = |via, held, disk, kept, always, expected| {
            assert_eq!(
                decide(via, held, disk, kept, always),
                expected,
                "{via:?} held={held:?} disk={disk:?} kept={kept} always_ignored={always}"
            );
        };
        // A changed path.
        check(Changed, No, File, true, false, Add);
        check(Changed, No, File, false, false, Remove); // ignored and untracked: not added
        check(Changed, Tracked, File, false, false, Add); // tracked: updated though ignored
        check(Changed, Tracked, File, true, false, Add);
        check(Changed, Tracked, File, false, true, Remove); // `.env`, even tracked
        check(Changed, No, File, false, true, Remove);
        check(Changed, Tracked, Missing, true, false, Remove);
        check(Changed, No, Missing, true, false, Remove);
        check(Changed, Tracked, Other, true, false, Remove); // a file became a FIFO
        check(Changed, No, Other, true, false, Remove);
        check(Changed, No, Dir, true, false, Walk);
        check(Changed, No, Dir, false, false, Walk); // the subtree judges its own rules
        check(Changed, Tracked, Dir, true, false, Walk); // a file became a directory
        check(Changed, Submodule, Dir, true, false, Gitlink);
        check(Changed, Submodule, Dir, false, false, Gitlink);
        check(Changed, Submodule, Missing, true, false, Remove);
        check(Changed, Submodule, File, true, false, Add); // a submodule became a file
        check(Changed, Frozen, Missing, true, false, Leave); // skip-worktree: left alone
        check(Changed, Frozen, File, true, false, Leave);
        check(Changed, Frozen, Dir, false, true, Leave);
        check(Changed, Tracked, Unreadable, true, false, KeepSaved); // EACCES: nothing lost
        check(Changed, No, Unreadable, true, false, KeepSaved);
        check(Changed, Tracked, Unreadable, true, true, KeepSaved);
        check(Changed, Frozen, Unreadable, true, false, Leave);
        // A tracked entry no walk reached (ignored, or under an ignored directory).
        check(Unreached, Tracked, File, false, false, Add);
        check(Unreached, Tracked, Missing, false, false, Remove);
        check(Unreached, Tracked, Dir, false, false, Remove); // not walked: ignored
        check(Unreached, Tracked, Other, false, false, Remove);
        check(Unreached, Tracked, File, false, true, Remove);
        check(Unreached, Submodule, Dir, false, false, Gitlink);
        check(Unreached, Submodule, Dir, false, true, Remove);
        check(Unreached, Submodule, Missing, false, false, Remove);
        check(Unreached, Frozen, Missing, false, false, Leave);
        check(Unreached, Frozen, File, false, true, Leave);
        check(Unreached, Tracked, Unreadable, false, false, KeepSaved);
        check(Unreached, Tracked, Unreadable, false, true, Remove); // never saved: no lstat needed
    }

    #[test]
    fn tracked_means_held_and_not_always_ignored() {
        assert!(is_tracked(Tracked, false));
        assert!(is_tracked(Submodule, false));
        assert!(is_tracked(Frozen, false));
        assert!(!is_tracked(No, false));
        assert!(!is_tracked(Tracked, true));
    }
}
