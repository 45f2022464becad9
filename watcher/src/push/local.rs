//! The push to a remote on this machine (a path or a `file://` URL), in process: the objects
//! [`super::objects`] finds are written into the remote's object database, then its ref is
//! moved with a compare-and-swap, refusing what `git receive-pack` refuses (a non-fast-forward,
//! the checked-out branch of a non-bare repository).
//!
//! Objects first, the ref last: a kill between the two leaves only objects no ref reaches
//! (`git gc` prunes them), and the ref never names an object the remote lacks (the head commit
//! and its tree are checked before it moves). As with libgit2's local transport, the remote's
//! hooks do not run; `git receive-pack` as a child cost a process start and a connectivity
//! check that walks the remote tip's trees (O(tree)) on every push.

use std::path::Path;

use git2::{ErrorCode, Odb, OdbLookupFlags, Oid, Repository, RepositoryOpenFlags};

use super::send_pack::{self, SendError, Sent};

/// Fewer new objects (of those packed here) than this are written as loose objects, more as
/// one pack: git's own default of `receive.unpackLimit`, which the remote's configuration can
/// change.
const UNPACK_LIMIT: i32 = 100;

/// Pushes `head` to `dst` (a full ref name) of the repository at `dir`, never forcing.
pub(crate) fn push(repo: &Repository, dir: &Path, head: Oid, dst: &str) -> Result<Sent, SendError> {
    let remote = Repository::open_ext(
        dir,
        RepositoryOpenFlags::NO_SEARCH,
        std::iter::empty::<&std::ffi::OsStr>(),
    )
    .map_err(|e| {
        SendError::Transport(std::io::Error::other(format!(
            "{} does not appear to be a git repository: {}",
            dir.display(),
            e.message()
        )))
    })?;
    let store = |source: git2::Error| SendError::Store {
        dir: dir.to_owned(),
        source,
    };
    refuse_checked_out_branch(&remote, dst)?;
    let old = tip(&remote, dst).map_err(store)?;
    if send_pack::fast_forward(repo, old, head, dst)? == Sent::UpToDate {
        return Ok(Sent::UpToDate);
    }
    let hidden: Vec<Oid> = remote
        .references()
        .map_err(store)?
        .filter_map(|r| r.ok()?.target())
        .collect();
    let objects = super::objects::new_objects(repo, head, hidden).map_err(SendError::Local)?;
    let odb = remote.odb().map_err(store)?;
    // Opened just now: a miss need not rescan the pack folder (libgit2 does by default).
    let missing: Vec<Oid> = objects
        .into_iter()
        .filter(|o| !odb.exists_ext(*o, OdbLookupFlags::NO_REFRESH))
        .collect();
    write_objects(repo, &remote, &odb, &missing).map_err(store)?;
    let commit = remote.find_commit(head).map_err(store)?;
    if !odb.exists(commit.tree_id()) {
        return Err(store(git2::Error::from_str(
            "the pushed tree is missing after the write",
        )));
    }
    let moved = match old {
        Some(old) => remote.reference_matching(dst, head, true, old, "push"),
        None => remote.reference(dst, head, false, "push"),
    };
    match moved {
        Ok(_) => Ok(Sent::Updated {
            objects: missing.len(),
        }),
        // Someone else moved the ref since it was read: judged again like a fresh attempt.
        Err(e)
            if matches!(
                e.code(),
                ErrorCode::Modified | ErrorCode::Exists | ErrorCode::Locked
            ) =>
        {
            let now = tip(&remote, dst).map_err(store)?;
            if send_pack::fast_forward(repo, now, head, dst)? == Sent::UpToDate {
                return Ok(Sent::UpToDate);
            }
            Err(SendError::Refused {
                refname: dst.to_owned(),
                reason: format!("failed to update ref: {}", e.message()),
                said: String::new(),
            })
        }
        Err(e) => Err(store(e)),
    }
}

/// The id `dst` holds in `remote`, if it exists.
fn tip(remote: &Repository, dst: &str) -> Result<Option<Oid>, git2::Error> {
    match remote.refname_to_id(dst) {
        Ok(id) => Ok(Some(id)),
        Err(e) if e.code() == ErrorCode::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// `git receive-pack`'s `receive.denyCurrentBranch` (default `refuse`): the branch checked out
/// in a non-bare repository is not moved under its working tree. `updateInstead` needs the
/// working tree updated, which only git does: refused here too, saying so.
fn refuse_checked_out_branch(remote: &Repository, dst: &str) -> Result<(), SendError> {
    if remote.is_bare() {
        return Ok(());
    }
    let checked_out = remote
        .find_reference("HEAD")
        .ok()
        .and_then(|h| h.symbolic_target().ok().flatten().map(str::to_owned));
    if checked_out.as_deref() != Some(dst) {
        return Ok(());
    }
    let setting = remote
        .config()
        .and_then(|c| c.get_string("receive.denyCurrentBranch"))
        .unwrap_or_default()
        .to_ascii_lowercase();
    if matches!(
        setting.as_str(),
        "false" | "no" | "off" | "0" | "ignore" | "warn"
    ) {
        return Ok(());
    }
    Err(SendError::Refused {
        refname: dst.to_owned(),
        reason: "branch is currently checked out".to_owned(),
        said: if setting == "updateinstead" {
            "receive.denyCurrentBranch=updateInstead needs git's own receive-pack".to_owned()
        } else {
            String::new()
        },
    })
}

/// The remote's `receive.unpackLimit`, else `transfer.unpackLimit`, else git's default.
fn unpack_limit(remote: &Repository) -> i32 {
    let Ok(config) = remote.config() else {
        return UNPACK_LIMIT;
    };
    config
        .get_i32("receive.unpackLimit")
        .or_else(|_| config.get_i32("transfer.unpackLimit"))
        .ok()
        .filter(|limit| *limit > 0)
        .unwrap_or(UNPACK_LIMIT)
}

/// The objects into the remote: those loose here are linked into its object directory (a
/// loose object file is the same bytes in any repository and never changes: the saves' own
/// objects cost no read, deflate or hash again); the rest (packed here) as loose objects below
/// the remote's unpack limit, else as one pack, as `git receive-pack` keeps them.
fn write_objects(
    repo: &Repository,
    remote: &Repository,
    odb: &Odb<'_>,
    objects: &[Oid],
) -> Result<(), git2::Error> {
    let (from, to) = (repo.path().join("objects"), remote.path().join("objects"));
    let packed: Vec<Oid> = objects
        .iter()
        .copied()
        .filter(|oid| !link_loose(&from, &to, *oid))
        .collect();
    if packed.len() < unpack_limit(remote) as usize {
        write_loose(repo, odb, &packed)
    } else {
        write_pack(repo, odb, &packed)
    }
}

/// Hard-links the loose object `oid` of the objects directory `from` into `to` (a link
/// appears whole or not at all); false when it is not loose in `from` or cannot be linked
/// (another file system).
fn link_loose(from: &Path, to: &Path, oid: Oid) -> bool {
    let hex = oid.to_string();
    let (fan_out, rest) = hex.split_at(2);
    let dir = to.join(fan_out);
    match std::fs::create_dir(&dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return false,
        _ => {}
    }
    match std::fs::hard_link(from.join(fan_out).join(rest), dir.join(rest)) {
        Ok(()) => true,
        Err(e) => e.kind() == std::io::ErrorKind::AlreadyExists,
    }
}

/// Each object as a loose object of the remote (a temporary file renamed into place).
fn write_loose(repo: &Repository, odb: &Odb<'_>, objects: &[Oid]) -> Result<(), git2::Error> {
    let local = repo.odb()?;
    for oid in objects {
        let object = local.read(*oid)?;
        let written = odb.write(object.kind(), object.data())?;
        if written != *oid {
            return Err(git2::Error::from_str(&format!(
                "object {oid} was stored as {written}"
            )));
        }
    }
    Ok(())
}

/// The objects as one pack of the remote, indexed as `git index-pack` would (the pack and its
/// index are renamed into place once whole).
fn write_pack(repo: &Repository, odb: &Odb<'_>, objects: &[Oid]) -> Result<(), git2::Error> {
    use std::io::Write as _;
    let mut pack = repo.packbuilder()?;
    pack.set_threads(1);
    for oid in objects {
        pack.insert_object(*oid, None)?;
    }
    let mut writer = odb.packwriter()?;
    let mut written = Ok(());
    pack.foreach(|chunk| {
        written = writer.write_all(chunk);
        written.is_ok()
    })?;
    written.map_err(|e| git2::Error::from_str(&e.to_string()))?;
    writer.commit()?;
    Ok(())
}
