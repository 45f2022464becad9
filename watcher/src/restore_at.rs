//! `project-watcher restore --at REV [--path P ...]`: the working tree (or only the given
//! paths) becomes exactly what it was at a save, and that becomes a new save on top, of kind
//! `restore`. History is never rewritten, so a restore is undone by restoring the save before it.
//!
//! All of it runs under the repo lock, so a running watcher waits and then finds the index,
//! `HEAD` and the tree in agreement: it saves nothing of the half-restored tree, and publishes
//! the restore commit to its pusher with its next save. Unsaved edits are saved first, so
//! going back loses nothing. Ignored files and `.env` are never touched.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use git2::build::CheckoutBuilder;
use git2::{Index, IndexAddOption, Oid, Repository, Signature};
use shmastra_contract::save_message::{RESTORED_FROM, SaveKind};

use crate::at::{self, RevError};
use crate::commit;
use crate::history::normalise_path;
use crate::lock::{InstanceLock, LockError, RepoLock};
use crate::restore::{RestoreError, exclude_env_files};
use crate::status::timestamp;

/// The identity used when the repository configures none (as for autosaves).
const FALLBACK_NAME: &str = "project-watcher";
const FALLBACK_EMAIL: &str = "project-watcher@localhost";

/// What a restore did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RestoredAt {
    /// The save the tree (or the paths) came from.
    #[serde(serialize_with = "oid_text")]
    pub from: Oid,
    /// Its time, RFC 3339 UTC.
    pub from_time: String,
    /// The autosave of edits that were not saved yet, made before the restore.
    #[serde(serialize_with = "maybe_oid_text")]
    pub saved_first: Option<Oid>,
    /// The new save of kind `restore`; `None` when the tree already was as at `from`.
    #[serde(serialize_with = "maybe_oid_text")]
    pub commit: Option<Oid>,
    /// The paths the restore changed.
    pub files: Vec<String>,
    /// Whether a `watch` runs on the project: it pushes the new save. Without one the save
    /// stays local until the next `watch` or `once`.
    pub watcher_running: bool,
}

/// Why `restore --at` did nothing ([`RestoreAtError::is_usage`]: the input was refused).
#[derive(Debug, thiserror::Error)]
pub enum RestoreAtError {
    /// `--dir` is not the top of a working tree (exit 2).
    #[error(transparent)]
    NotARepository(#[from] crate::project_dir::OpenError),
    /// The save asked for does not resolve.
    #[error(transparent)]
    Rev(#[from] RevError),
    /// A `--path` that neither the save nor the project holds.
    #[error("`{path}` is neither in the save {rev} nor in the project now")]
    UnknownPath {
        /// The path given.
        path: String,
        /// The save given.
        rev: String,
    },
    /// A `--path` outside the project.
    #[error("`{path}` is not a path inside the project (give it relative to the project's top)")]
    BadPath {
        /// The path given.
        path: String,
    },
    /// `repo.lock` could not be taken.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// `.git/info/exclude` could not be written.
    #[error(transparent)]
    Exclude(#[from] RestoreError),
    /// git failed.
    #[error("restore failed in {}: {}", .dir.display(), .source.message())]
    Git {
        /// The project.
        dir: PathBuf,
        /// What libgit2 said.
        source: git2::Error,
    },
}

impl RestoreAtError {
    /// The user's input is wrong (exit 2); nothing was changed.
    pub fn is_usage(&self) -> bool {
        match self {
            Self::NotARepository(_) | Self::UnknownPath { .. } | Self::BadPath { .. } => true,
            Self::Rev(e) => e.is_usage(),
            Self::Lock(_) | Self::Exclude(_) | Self::Git { .. } => false,
        }
    }
}

/// Restores `workdir` (or `paths` in it) to the save `rev` names. See the module docs. Files
/// over `max_file_size` are left out of the save of unsaved work, as the watcher leaves them
/// out; they stay on disk untouched.
pub fn restore_at(
    workdir: &Path,
    rev: &str,
    paths: &[PathBuf],
    max_file_size: u64,
    now: SystemTime,
) -> Result<RestoredAt, RestoreAtError> {
    let repo = crate::project_dir::open(workdir).map_err(RestoreAtError::from)?;
    let git = |source| RestoreAtError::Git {
        dir: workdir.to_owned(),
        source,
    };
    let paths = paths
        .iter()
        .map(|p| checked_path(p))
        .collect::<Result<Vec<_>, _>>()?;
    exclude_env_files(repo.path())?;
    let _lock = RepoLock::acquire_after_watcher_index(repo.path())?;

    // Everything the user gave is checked before anything changes.
    let from = at::resolve(&repo, rev, now)?;
    let from_commit = repo.find_commit(from).map_err(git)?;
    let from_tree = from_commit.tree().map_err(git)?;
    let head_tree = repo.head().and_then(|h| h.peel_to_tree()).map_err(git)?;
    for path in &paths {
        let unsaved = std::fs::symlink_metadata(workdir.join(path)).is_ok();
        if from_tree.get_path(Path::new(path)).is_err()
            && head_tree.get_path(Path::new(path)).is_err()
            && !unsaved
        {
            return Err(RestoreAtError::UnknownPath {
                path: path.clone(),
                rev: short(from),
            });
        }
    }

    let saved_first = save_unsaved_work(&repo, workdir, max_file_size).map_err(git)?;
    let head = repo.head().and_then(|h| h.peel_to_commit()).map_err(git)?;
    let target = if paths.is_empty() {
        from_tree.id()
    } else {
        merge_paths(&repo, &head.tree().map_err(git)?, &from_tree, &paths).map_err(git)?
    };
    let from_time = timestamp(at::commit_time(from_commit.time().seconds()));
    if target == head.tree_id() {
        return Ok(RestoredAt {
            from,
            from_time,
            saved_first,
            commit: None,
            files: Vec::new(),
            watcher_running: watcher_running(repo.path()),
        });
    }
    let target_tree = repo.find_tree(target).map_err(git)?;
    let files = changed(&repo, &head.tree().map_err(git)?, &target_tree).map_err(git)?;
    let mut checkout = CheckoutBuilder::new();
    checkout.force().disable_pathspec_match(true);
    for path in &paths {
        checkout.path(path);
    }
    repo.checkout_tree(target_tree.as_object(), Some(&mut checkout))
        .map_err(git)?;
    let mut index = repo.index().map_err(git)?;
    index.read(true).map_err(git)?;
    if index.write_tree().map_err(git)? != target {
        index.read_tree(&target_tree).map_err(git)?;
    }
    index.write().map_err(git)?;

    let what = if paths.is_empty() {
        "the project".to_owned()
    } else {
        commit::describe_paths(&paths)
    };
    let subject = format!("restore: {what} as at {} ({from_time})", short(from));
    let message = commit::message_with(
        &subject,
        SaveKind::Restore,
        &files,
        &[(RESTORED_FROM, from.to_string())],
    );
    let signature = signature(&repo).map_err(git)?;
    let commit = repo
        .commit(
            Some("HEAD"),
            &signature,
            &signature,
            &message,
            &target_tree,
            &[&head],
        )
        .map_err(git)?;
    Ok(RestoredAt {
        from,
        from_time,
        saved_first,
        commit: Some(commit),
        files,
        watcher_running: watcher_running(repo.path()),
    })
}

/// Whether another process holds the watcher's instance lock. Taking it to find out is
/// harmless: it is released at once.
fn watcher_running(git_dir: &Path) -> bool {
    matches!(
        InstanceLock::try_acquire(git_dir),
        Err(LockError::Held { .. })
    )
}

/// A path relative to the project's top, without `.`/`..` components or a leading `/`.
fn checked_path(path: &Path) -> Result<String, RestoreAtError> {
    let text = normalise_path(path);
    let bad = text.is_empty()
        || path.is_absolute()
        || text
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == ".." || c == ".git");
    if bad {
        return Err(RestoreAtError::BadPath {
            path: path.display().to_string(),
        });
    }
    Ok(text)
}

/// Commits what `git add -A` would stage (minus files over `max_file_size`) when it differs
/// from `HEAD`, as an autosave, and leaves the index equal to `HEAD`.
fn save_unsaved_work(
    repo: &Repository,
    workdir: &Path,
    max_file_size: u64,
) -> Result<Option<Oid>, git2::Error> {
    // 0: stage it; 1: leave it as the index has it.
    let mut within_limit = |path: &Path, _: &[u8]| -> i32 {
        match std::fs::symlink_metadata(workdir.join(path)) {
            Ok(meta) if meta.is_file() && meta.len() > max_file_size => 1,
            _ => 0,
        }
    };
    let mut index = repo.index()?;
    index.read(true)?;
    index.add_all(["*"], IndexAddOption::DEFAULT, Some(&mut within_limit))?;
    index.update_all(["*"], Some(&mut within_limit))?;
    let tree = index.write_tree()?;
    let saved = commit::commit_tree(repo, tree)?;
    index.write()?;
    Ok(saved.map(|c| c.id))
}

/// `head` with every path under `paths` replaced by what `from` holds there (gone when `from`
/// has nothing there).
fn merge_paths(
    repo: &Repository,
    head: &git2::Tree<'_>,
    from: &git2::Tree<'_>,
    paths: &[String],
) -> Result<Oid, git2::Error> {
    let under = |entry_path: &[u8]| {
        paths.iter().any(|p| {
            entry_path == p.as_bytes()
                || (entry_path.starts_with(p.as_bytes()) && entry_path.get(p.len()) == Some(&b'/'))
        })
    };
    let mut index = Index::new()?;
    index.read_tree(head)?;
    let mut old = Index::new()?;
    old.read_tree(from)?;
    let drop: Vec<Vec<u8>> = index
        .iter()
        .filter(|e| under(&e.path))
        .map(|e| e.path)
        .collect();
    for path in drop {
        index.remove_path(Path::new(OsStr::from_bytes(&path)))?;
    }
    for entry in old.iter().filter(|e| under(&e.path)) {
        index.add(&entry)?;
    }
    index.write_tree_to(repo)
}

/// The paths that differ between two trees.
fn changed(
    repo: &Repository,
    old: &git2::Tree<'_>,
    new: &git2::Tree<'_>,
) -> Result<Vec<String>, git2::Error> {
    Ok(commit::diff_paths(&repo.diff_tree_to_tree(
        Some(old),
        Some(new),
        None,
    )?))
}

fn signature(repo: &Repository) -> Result<Signature<'static>, git2::Error> {
    repo.signature()
        .or_else(|_| Signature::now(FALLBACK_NAME, FALLBACK_EMAIL))
}

fn oid_text<S: serde::Serializer>(oid: &Oid, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(oid)
}

fn maybe_oid_text<S: serde::Serializer>(oid: &Option<Oid>, s: S) -> Result<S::Ok, S::Error> {
    match oid {
        Some(oid) => s.collect_str(oid),
        None => s.serialize_none(),
    }
}

fn short(oid: Oid) -> String {
    oid.to_string()[..7].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_must_stay_inside_the_project() {
        let check = |input: &str, expected: Option<&str>| {
            let got = checked_path(Path::new(input)).ok();
            assert_eq!(got.as_deref(), expected, "{input}");
        };
        check("src/a.ts", Some("src/a.ts"));
        check("./src/", Some("src"));
        check("src", Some("src"));
        check("/etc/passwd", None);
        check("../outside", None);
        check("src/../../x", None);
        check("src//a.ts", None);
        check(".git/config", None);
        check("", None);
        check(".", None);
    }
}
