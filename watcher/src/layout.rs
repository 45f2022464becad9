//! What the watcher keeps under `.git`, by name: its state folder and the files in it, the
//! list of synced commits, the backup refs and the recovery branches. Every other module
//! asks here for a path or a ref name.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use git2::Oid;

/// The watcher's own folder under `.git`.
const STATE_DIR: &str = "project-watcher";
/// Held by the running watcher: one per repository.
pub(crate) const INSTANCE_LOCK: &str = "instance.lock";
/// Held around every git mutation.
pub(crate) const REPO_LOCK: &str = "repo.lock";
/// The status file.
pub(crate) const STATUS: &str = "status.json";
/// The space kept so that a full disk can still be reported.
pub(crate) const STATUS_RESERVE: &str = "status.reserve";
/// Present while `.git/index` is behind the index the watcher committed from.
pub(crate) const INDEX_UNWRITTEN: &str = "index-unwritten";
/// Work markers: present while a watcher saves, or pushes.
pub(crate) const SAVING: &str = "saving";
pub(crate) const PUSHING: &str = "pushing";
/// The remote (its path) and the tips of its refs verified whole there (`push::connected`).
pub(crate) const REMOTE_VERIFIED: &str = "remote-verified";
/// The commits syncs made the working tree, newest last.
const SYNCED: &str = "synced";
/// How many synced commits [`SYNCED`] remembers.
pub(crate) const SYNCED_KEPT: usize = 200;

/// Where sync's backups of unsaved work live; each ref's last component is a [`stamp`].
pub(crate) const BACKUP_REF_PREFIX: &str = "refs/project-watcher/backup/";
/// The remote branches a diverged watcher and sync's backups push to.
pub(crate) const RECOVERY_BRANCH_PREFIX: &str = "refs/heads/recovery/";

/// `.git/project-watcher`.
pub(crate) fn state_dir(git_dir: &Path) -> PathBuf {
    git_dir.join(STATE_DIR)
}

/// A file of the state folder.
pub(crate) fn state_file(git_dir: &Path, name: &str) -> PathBuf {
    state_dir(git_dir).join(name)
}

/// Makes `.git/project-watcher` (one level: `.git` must exist). A watcher whose project was
/// removed under it then fails here instead of re-creating the removed tree, which a sandbox
/// provider would take for a sandbox that still exists.
pub(crate) fn create_state_dir(git_dir: &Path) -> io::Result<()> {
    match fs::create_dir(state_dir(git_dir)) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    }
}

/// The directory a linked worktree's `commondir` file names (relative to `git_dir`), else
/// `git_dir` itself: where the objects, the refs, the configuration and `info/exclude` live.
pub(crate) fn common_dir(git_dir: &Path) -> PathBuf {
    match fs::read_to_string(git_dir.join("commondir")) {
        Ok(text) => git_dir.join(text.trim_end_matches(['\n', '\r'])),
        Err(_) => git_dir.to_owned(),
    }
}

/// `info/exclude`, which git reads from the common directory (shared by every worktree).
pub(crate) fn info_exclude(git_dir: &Path) -> PathBuf {
    common_dir(git_dir).join("info").join("exclude")
}

/// `20261129T230046Z`: ISO 8601 basic format, a valid ref name component that sorts by time.
pub(crate) fn stamp(at: SystemTime) -> String {
    crate::status::timestamp(at).replace(['-', ':'], "")
}

/// `refs/remotes/<remote>/<branch>`: what this repository last heard the remote branch hold.
pub(crate) fn tracking_ref(remote: &str, branch: &str) -> String {
    format!("refs/remotes/{remote}/{branch}")
}

/// The recovery branch of a backup pushed with `stamp`, on the remote.
pub(crate) fn recovery_branch(stamp: &str) -> String {
    format!("{RECOVERY_BRANCH_PREFIX}{stamp}")
}

/// The recovery branches of `remote` as this repository records them (a glob).
pub(crate) fn recovery_tracking_glob(remote: &str) -> String {
    format!("refs/remotes/{remote}/recovery/*")
}

/// Where a recovery branch pushed with `stamp` is recorded locally.
pub(crate) fn recovery_tracking_ref(remote: &str, stamp: &str) -> String {
    format!("refs/remotes/{remote}/recovery/{stamp}")
}

/// The commits syncs made the working tree, as the synced list holds them.
pub(crate) fn read_synced(git_dir: &Path) -> HashSet<Oid> {
    fs::read_to_string(state_file(git_dir, SYNCED))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| Oid::from_str(l.trim()).ok())
        .collect()
}

/// Remembers that a sync made `commit` the working tree (kind `sync` in history). Keeps the
/// newest [`SYNCED_KEPT`]; written through a temp file and a rename.
pub(crate) fn record_synced(git_dir: &Path, commit: Oid) -> io::Result<()> {
    let path = state_file(git_dir, SYNCED);
    let current = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e),
    };
    let mut lines: Vec<&str> = current.lines().collect();
    let id = commit.to_string();
    lines.push(&id);
    let start = lines.len().saturating_sub(SYNCED_KEPT);
    let body = lines[start..].join("\n") + "\n";
    create_state_dir(git_dir)?;
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, body)?;
    fs::rename(&tmp, &path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_synced_list_keeps_the_newest() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..(SYNCED_KEPT as u32 + 3) {
            let oid = Oid::hash_object(git2::ObjectType::Blob, &i.to_be_bytes()).unwrap();
            record_synced(dir.path(), oid).unwrap();
        }
        let kept = read_synced(dir.path());
        assert_eq!(kept.len(), SYNCED_KEPT);
        let first = Oid::hash_object(git2::ObjectType::Blob, &0u32.to_be_bytes()).unwrap();
        let last = Oid::hash_object(
            git2::ObjectType::Blob,
            &(SYNCED_KEPT as u32 + 2).to_be_bytes(),
        )
        .unwrap();
        assert!(!kept.contains(&first));
        assert!(kept.contains(&last));
    }

    #[test]
    fn names_are_valid_refs_that_sort_by_time() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_994_100);
        assert_eq!(stamp(at), "20261129T231500Z");
        for name in [
            recovery_branch(&stamp(at)),
            recovery_tracking_ref("project", &stamp(at)),
            format!("{BACKUP_REF_PREFIX}{}", stamp(at)),
            tracking_ref("project", "main"),
        ] {
            assert!(git2::Reference::is_valid_name(&name), "{name}");
        }
        assert!(stamp(at) < stamp(at + Duration::from_secs(1)));
    }
}
