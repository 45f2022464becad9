//! The sparse-index fallback: libgit2 cannot read an index with git's `sdir` extension
//! (`git sparse-checkout set --sparse-index`), so git is asked to write the same index in
//! full; skip-worktree entries, staged changes and the sparse checkout itself stay as they are.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};

static WARNED: AtomicBool = AtomicBool::new(false);

/// Rewrites the index of `workdir` without the sparse-directory extension. Returns whether git
/// did; git re-sparsifies it the next time it writes the index, and the watcher expands it
/// again then. Warns once per process (and on every failure).
pub fn expand(workdir: &Path) -> bool {
    let output = Command::new("git")
        .arg("-C")
        .arg(workdir)
        .args([
            "-c",
            "index.sparse=false",
            "-c",
            "advice.sparseIndexExpanded=false",
            "update-index",
            "-q",
            "--refresh",
        ])
        .output();
    match output {
        Ok(out) if out.status.success() => {
            if !WARNED.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "the git index is a sparse index, which libgit2 cannot read: git rewrote it \
                     as a full index (the sparse checkout is unchanged); run \
                     `git sparse-checkout set --no-sparse-index` to keep it that way"
                );
            }
            true
        }
        Ok(out) => {
            tracing::error!(
                "cannot read the git index, and `git update-index` could not rewrite it: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            false
        }
        Err(e) => {
            tracing::error!(
                "cannot read the git index (a sparse index needs the git command to expand it): {e}"
            );
            false
        }
    }
}
