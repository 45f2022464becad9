//! The push to a remote on this machine (a path or a `file://` URL), in process: the objects
//! [`super::objects`] finds are written into the remote's object database, the connectivity
//! check `git receive-pack` makes is made ([`super::connected`]: every object the new tip
//! reaches is in the remote, read from the remote's own object database), then its ref is
//! moved with a compare-and-swap, refusing what `git receive-pack` refuses (a non-fast-forward,
//! the checked-out branch of a non-bare repository, a tip whose objects are not all there).
//!
//! Before anything is judged by the remote's refs, the remote is made whole: a ref an earlier
//! version of the watcher moved to a commit whose objects it had left out is found by
//! [`super::connected::audit`] (only for tips this repository did not verify or push itself,
//! so the steady state costs a read of the refs) and the missing objects this repository has
//! are written in, history untouched.
//!
//! Objects first, the ref last: a kill between the two leaves only objects no ref reaches
//! (`git gc` prunes them), and the ref never names an object the remote lacks. As with
//! libgit2's local transport, the remote's hooks do not run; `git receive-pack` as a child cost
//! a process start and a connectivity check that walks the remote tip's trees (O(tree)) on
//! every push, where this one walks the pushed commits' changes.

use std::path::Path;

use git2::{ErrorCode, Odb, OdbLookupFlags, Oid, PackBuilder, Repository, RepositoryOpenFlags};

use super::connected::{self, Verified};
use super::objects::{self, Pack};
use super::send_pack::{self, SendError, Sent};

/// Fewer new objects (of those packed here) than this are written as loose objects, more as
/// one pack: git's own default of `receive.unpackLimit`, which the remote's configuration can
/// change.
const UNPACK_LIMIT: i32 = 100;

/// What [`repair`] did to a remote.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Repaired {
    /// Objects its refs reach that it lacked and that were written into it from here.
    pub written: usize,
    /// Objects its refs reach that neither it nor this repository has.
    pub lost: usize,
    /// Commits the audit walked (0: every tip was verified before).
    pub commits: usize,
}

/// Opens the repository at `dir` exactly there (no search upward).
fn open(dir: &Path) -> Result<Repository, SendError> {
    Repository::open_ext(
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
    })
}

fn store(dir: &Path) -> impl Fn(git2::Error) -> SendError + '_ {
    move |source| SendError::Store {
        dir: dir.to_owned(),
        source,
    }
}

/// Pushes `head` to `dst` (a full ref name) of the repository at `dir`, never forcing, with
/// a pack of `pack`'s kind.
pub(crate) fn push(
    repo: &Repository,
    dir: &Path,
    head: Oid,
    dst: &str,
    pack: Pack,
) -> Result<Sent, SendError> {
    push_with(repo, dir, head, dst, |remote, odb, hidden| {
        write_new_objects(repo, remote, odb, head, hidden, pack)
    })
}

/// Writes the objects of `pack`'s kind for `head` into `remote`, whose refs reach `hidden`;
/// returns how many.
fn write_new_objects(
    repo: &Repository,
    remote: &Repository,
    odb: &Odb<'_>,
    head: Oid,
    hidden: &[Oid],
    pack: Pack,
) -> Result<usize, SendError> {
    let store = store(remote.path());
    match pack {
        Pack::Changes => {
            let objects = objects::new_objects(repo, head, hidden.iter().copied())
                .map_err(SendError::Local)?;
            // Opened just now: a miss need not rescan the pack folder (libgit2 does by default).
            let missing: Vec<Oid> = objects
                .into_iter()
                .filter(|o| !odb.exists_ext(*o, OdbLookupFlags::NO_REFRESH))
                .collect();
            write_objects(repo, remote, odb, &missing).map_err(&store)?;
            Ok(missing.len())
        }
        Pack::Full | Pack::Everything => {
            let mut builder = objects::build(repo, head, hidden, pack).map_err(SendError::Local)?;
            let count = builder.object_count();
            write_pack(&mut builder, odb).map_err(&store)?;
            Ok(count)
        }
    }
}

/// [`push`], the objects written by `write` (given the remote, its object database and the
/// commits its refs point at). The connectivity check after it is what decides whether the
/// ref moves.
fn push_with(
    repo: &Repository,
    dir: &Path,
    head: Oid,
    dst: &str,
    write: impl FnOnce(&Repository, &Odb<'_>, &[Oid]) -> Result<usize, SendError>,
) -> Result<Sent, SendError> {
    let remote = open(dir)?;
    let store = store(dir);
    refuse_checked_out_branch(&remote, dst)?;
    let (mut verified, _) = repair_open(repo, &remote, dir)?;
    let old = tip(&remote, dst).map_err(&store)?;
    if send_pack::fast_forward(repo, old, head, dst)? == Sent::UpToDate {
        return Ok(Sent::UpToDate);
    }
    let hidden = connected::ref_tips(&remote).map_err(&store)?;
    let odb = remote.odb().map_err(&store)?;
    let written = write(&remote, &odb, &hidden)?;
    let found = connected::audit(&remote, &odb, &[head], &hidden).map_err(|e| {
        if e.code() == ErrorCode::NotFound {
            SendError::Incomplete {
                missing: 1,
                example: e.message().to_owned(),
            }
        } else {
            store(e)
        }
    })?;
    if let Some(first) = found.missing.first() {
        return Err(SendError::Incomplete {
            missing: found.missing.len(),
            example: first.to_string(),
        });
    }
    let moved = match old {
        Some(old) => remote.reference_matching(dst, head, true, old, "push"),
        None => remote.reference(dst, head, false, "push"),
    };
    match moved {
        Ok(_) => {
            let now = connected::ref_tips(&remote).unwrap_or_default();
            let whole: Vec<Oid> = now
                .into_iter()
                .filter(|t| *t == head || verified.tips.contains(t))
                .collect();
            verified.write(&whole);
            Ok(Sent::Updated { objects: written })
        }
        // Someone else moved the ref since it was read: judged again like a fresh attempt.
        Err(e)
            if matches!(
                e.code(),
                ErrorCode::Modified | ErrorCode::Exists | ErrorCode::Locked
            ) =>
        {
            let now = tip(&remote, dst).map_err(&store)?;
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

/// Makes the repository at `dir` whole: every object its refs reach that it lacks and this
/// repository has is written into it. Only tips not verified (or pushed) from here before are
/// walked, down to those that were.
pub(crate) fn repair(repo: &Repository, dir: &Path) -> Result<Repaired, SendError> {
    let remote = open(dir)?;
    repair_open(repo, &remote, dir).map(|(_, repaired)| repaired)
}

fn repair_open(
    repo: &Repository,
    remote: &Repository,
    dir: &Path,
) -> Result<(Verified, Repaired), SendError> {
    let store = store(dir);
    let mut verified = Verified::read(repo.path(), remote.path());
    let tips = connected::ref_tips(remote).map_err(&store)?;
    let unverified = verified.unverified(&tips);
    if unverified.is_empty() {
        return Ok((verified, Repaired::default()));
    }
    // The remote, reading what it lacks from here: the walk goes on past a missing commit or
    // tree this repository has, and finds everything below it.
    let view = open(dir)?;
    view.odb()
        .and_then(|odb| odb.add_disk_alternate(&repo.path().join("objects").to_string_lossy()))
        .map_err(&store)?;
    let odb = remote.odb().map_err(&store)?;
    let found = match connected::audit(&view, &odb, &unverified, &verified.tips) {
        Ok(found) => found,
        Err(e) => {
            tracing::warn!(
                remote = %dir.display(),
                "cannot check that the remote holds every object its refs reach: {}; run `git fsck` there",
                e.message()
            );
            return Ok((verified, Repaired::default()));
        }
    };
    let writable: Vec<Oid> = found
        .missing
        .iter()
        .copied()
        .filter(|o| !found.unreadable.contains(o))
        .collect();
    write_objects(repo, remote, &odb, &writable).map_err(&store)?;
    let repaired = Repaired {
        written: writable.len(),
        lost: found.unreadable.len(),
        commits: found.commits,
    };
    if repaired.written > 0 {
        tracing::warn!(
            remote = %dir.display(),
            objects = repaired.written,
            "the remote lacked objects its refs reach (an earlier push left them out); wrote them from this repository"
        );
    }
    if let Some(first) = found.unreadable.first() {
        tracing::warn!(
            remote = %dir.display(),
            objects = repaired.lost,
            example = %first,
            "the remote lacks objects its refs reach that this repository does not have either; run `git fsck` there"
        );
    }
    verified.write(&tips);
    Ok((verified, repaired))
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
        let mut pack = repo.packbuilder()?;
        pack.set_threads(1);
        for oid in &packed {
            pack.insert_object(*oid, None)?;
        }
        write_pack(&mut pack, odb)
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

/// `pack` as one pack of the remote, indexed as `git index-pack` would (the pack and its
/// index are renamed into place once whole).
fn write_pack(pack: &mut PackBuilder<'_>, odb: &Odb<'_>) -> Result<(), git2::Error> {
    use std::io::Write as _;
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

#[cfg(test)]
mod tests {
    use super::*;
    use testkit::git::{git, git_output, init_bare, init_repo};

    /// A project with a commit of two files in a folder, and an empty bare remote.
    fn project() -> (tempfile::TempDir, Repository, std::path::PathBuf, Oid) {
        let tmp = tempfile::tempdir().unwrap();
        let work = tmp.path().join("work");
        init_repo(&work);
        std::fs::create_dir_all(work.join("src")).unwrap();
        std::fs::write(work.join("src/a.txt"), "a\n").unwrap();
        std::fs::write(work.join("src/b.txt"), "b\n").unwrap();
        git(&work, ["add", "-A"]);
        git(&work, ["commit", "-qm", "first"]);
        let bare = tmp.path().join("remote.git");
        init_bare(&bare);
        let repo = Repository::open(&work).unwrap();
        let head = repo.head().unwrap().target().unwrap();
        (tmp, repo, bare, head)
    }

    #[test]
    fn a_push_whose_objects_do_not_all_arrive_is_refused_and_the_ref_stays() {
        let (_tmp, repo, bare, head) = project();
        let left_out = repo.revparse_single("HEAD:src/b.txt").unwrap().id();
        let refused = push_with(
            &repo,
            &bare,
            head,
            "refs/heads/main",
            |remote, odb, hidden| {
                let all = objects::new_objects(&repo, head, hidden.iter().copied()).unwrap();
                let some: Vec<Oid> = all.into_iter().filter(|o| *o != left_out).collect();
                write_objects(&repo, remote, odb, &some).unwrap();
                Ok(some.len())
            },
        )
        .unwrap_err();
        match &refused {
            SendError::Incomplete { missing, example } => {
                assert_eq!(
                    (*missing, example.as_str()),
                    (1, left_out.to_string().as_str())
                );
            }
            other => panic!("not refused as incomplete: {other}"),
        }
        assert!(
            !git_output(&bare, ["rev-parse", "--verify", "-q", "main"])
                .status
                .success(),
            "the ref did not move"
        );
        assert!(
            git_output(&bare, ["fsck", "--full", "--strict"])
                .status
                .success()
        );

        // The real push writes everything; the ref moves and the remote is whole.
        push(&repo, &bare, head, "refs/heads/main", Pack::Changes).unwrap();
        assert_eq!(git(&bare, ["rev-parse", "main"]).trim(), head.to_string());
        assert!(
            git_output(&bare, ["fsck", "--full", "--strict"])
                .status
                .success()
        );
    }

    #[test]
    fn a_remote_missing_objects_its_ref_reaches_is_repaired_once_and_then_trusted() {
        let (_tmp, repo, bare, head) = project();
        let work = repo.workdir().unwrap().to_owned();
        git(&bare, ["config", "receive.unpackLimit", "1000"]);
        git(&work, ["push", "-q", bare.to_str().unwrap(), "main"]);
        // An earlier watcher left a blob out: delete it from the remote.
        let blob = git(&work, ["rev-parse", "HEAD:src/b.txt"]);
        let blob = blob.trim();
        std::fs::remove_file(bare.join("objects").join(&blob[..2]).join(&blob[2..])).unwrap();
        assert!(!git_output(&bare, ["fsck", "--full"]).status.success());

        let repaired = repair(&repo, &bare).unwrap();
        assert_eq!(
            repaired,
            Repaired {
                written: 1,
                lost: 0,
                commits: 1
            }
        );
        assert!(
            git_output(&bare, ["fsck", "--full", "--strict"])
                .status
                .success()
        );
        assert_eq!(git(&bare, ["rev-parse", "main"]).trim(), head.to_string());
        // Verified now: the next start walks nothing.
        assert_eq!(repair(&repo, &bare).unwrap(), Repaired::default());
    }
}
