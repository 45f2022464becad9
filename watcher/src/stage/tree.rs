//! The tree of the in-memory index: the last save's tree with the touched paths updated, so a
//! save reads and writes only the trees on those paths.

use std::collections::BTreeSet;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use git2::build::TreeUpdateBuilder;
use git2::{FileMode, Index, Oid, Repository};

use super::decide::GITLINK_MODE;

/// The tree `index` describes, given that it is `base` plus the entries of `touched`: only the
/// trees on those paths are read and written. When `base` is unknown (the index was just
/// read) or the update cannot be made that way (a file became a directory, conflicts),
/// libgit2's full `write_tree`.
pub(crate) fn build(
    repo: &Repository,
    index: &mut Index,
    base: Option<Oid>,
    touched: &BTreeSet<PathBuf>,
) -> Result<Oid, git2::Error> {
    if let Some(base) = base
        && !index.has_conflicts()
        && let Ok(base) = repo.find_tree(base)
    {
        let mut update = TreeUpdateBuilder::new();
        for path in touched {
            match index.get_path(path, 0) {
                Some(entry) => {
                    update.upsert(path.as_os_str().as_bytes(), entry.id, file_mode(entry.mode));
                }
                None if base.get_path(path).is_ok() => {
                    update.remove(path.as_os_str().as_bytes());
                }
                None => {}
            }
        }
        if let Ok(tree) = update.create_updated(repo, &base) {
            return Ok(tree);
        }
    }
    index.write_tree()
}

/// The tree entry mode of an index entry's mode.
fn file_mode(mode: u32) -> FileMode {
    match mode {
        0o100755 => FileMode::BlobExecutable,
        0o120000 => FileMode::Link,
        GITLINK_MODE => FileMode::Commit,
        _ => FileMode::Blob,
    }
}
