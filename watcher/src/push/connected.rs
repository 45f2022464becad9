//! Whether a repository on this machine holds every object its refs reach: the connectivity
//! check `git receive-pack` makes before it moves a ref (`connected.c`), and the audit that
//! finds what an earlier watcher left out of a remote, so [`super::local`] can write it in.
//!
//! Both read the remote's own object database, never the list of objects a push computed, so
//! a mistake in that list is caught here instead of being written. Both walk commits the way
//! [`super::objects`] proves complete, in any order and without remembering what an earlier
//! commit had: a commit is whole when it is present, its tree is present, and every entry of
//! that tree whose id differs from the first parent's entry of the same name is present (a
//! differing subtree checked the same way against the parent's subtree). Given that the
//! commits the walk stops at are whole, every commit it walks is whole, by induction over the
//! history: a root commit has no parent and its whole tree is checked; an entry equal to the
//! parent's is an object of the parent's whole tree. The cost is the size of the commits'
//! changes, not of their trees.
//!
//! The check stops at what the remote's refs reach before the push (as receive-pack stops at
//! `--not --all`); the audit stops at the tips this repository verified or pushed last time
//! (kept in `.git/project-watcher/remote-verified`, [`layout::REMOTE_VERIFIED`]), so it walks the whole history once per
//! remote, and only what others pushed since after that.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use git2::{ObjectType, Odb, Oid, Repository, Tree};

use super::objects::differing;
use crate::layout;

/// What a walk found absent from the remote.
#[derive(Debug, Default)]
pub(crate) struct Audit {
    /// Objects the walked commits reach that the remote lacks, in the order found.
    pub missing: Vec<Oid>,
    /// Of those, the ones the reader could not read either (the audit cannot write them).
    pub unreadable: Vec<Oid>,
    /// Commits walked.
    pub commits: usize,
}

/// Walks the commits `reader` reaches from `tips` but not from `stops` and returns every
/// object of theirs that `present` (the remote's own object database) lacks, reading commits
/// and trees through `reader` (the remote itself for the check; the remote with this
/// repository's objects behind it for the audit). An error is the walk's own: a commit it
/// needs that `reader` cannot read comes back as `NotFound`.
pub(crate) fn audit(
    reader: &Repository,
    present: &Odb<'_>,
    tips: &[Oid],
    stops: &[Oid],
) -> Result<Audit, git2::Error> {
    let mut found = Finder {
        reader,
        reader_odb: reader.odb()?,
        present,
        audit: Audit::default(),
        noted: HashSet::new(),
    };
    let mut walk = reader.revwalk()?;
    let mut pushed = false;
    for tip in tips {
        if reader.find_commit(*tip).is_err() {
            found.note(*tip);
            continue;
        }
        walk.push(*tip)?;
        pushed = true;
    }
    if !pushed {
        return Ok(found.audit);
    }
    for stop in stops {
        if present.exists(*stop) && reader.find_commit(*stop).is_ok() {
            walk.hide(*stop)?;
        }
    }
    for commit in walk {
        let commit = reader.find_commit(commit?)?;
        found.audit.commits += 1;
        if !present.exists(commit.id()) {
            found.note(commit.id());
        }
        // A parent or a parent's tree that cannot be read: the whole tree is checked.
        let parent_tree = commit.parent(0).ok().and_then(|p| p.tree().ok());
        if parent_tree.as_ref().map(Tree::id) == Some(commit.tree_id()) {
            continue;
        }
        if !present.exists(commit.tree_id()) {
            found.note(commit.tree_id());
        }
        if let Ok(tree) = reader.find_tree(commit.tree_id()) {
            found.tree(&tree, parent_tree.as_ref())?;
        }
    }
    Ok(found.audit)
}

/// One audit's state: where objects are read, where they must be, what was found.
struct Finder<'a> {
    reader: &'a Repository,
    reader_odb: Odb<'a>,
    present: &'a Odb<'a>,
    audit: Audit,
    noted: HashSet<Oid>,
}

impl Finder<'_> {
    /// Records `oid` as absent from the remote (once), and whether the reader has it.
    fn note(&mut self, oid: Oid) {
        if self.noted.insert(oid) {
            self.audit.missing.push(oid);
            if !self.reader_odb.exists(oid) {
                self.audit.unreadable.push(oid);
            }
        }
    }

    /// Notes every entry of `new` that differs from `old`'s entry of the same name and is
    /// absent from the remote, descending into differing subtrees. Gitlinks are another
    /// repository's.
    fn tree(&mut self, new: &Tree<'_>, old: Option<&Tree<'_>>) -> Result<(), git2::Error> {
        for (entry, before) in differing(new, old) {
            let id = entry.id();
            match entry.kind() {
                Some(ObjectType::Blob) if !self.present.exists(id) => self.note(id),
                Some(ObjectType::Tree) => {
                    if !self.present.exists(id) {
                        self.note(id);
                    }
                    let Ok(subtree) = self.reader.find_tree(id) else {
                        continue;
                    };
                    let old_subtree = match before {
                        Some(b) if b.kind() == Some(ObjectType::Tree) => {
                            self.reader.find_tree(b.id()).ok()
                        }
                        _ => None,
                    };
                    self.tree(&subtree, old_subtree.as_ref())?;
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// The commits the refs of `repo` point at (tags peeled), each once.
pub(crate) fn ref_tips(repo: &Repository) -> Result<Vec<Oid>, git2::Error> {
    let mut tips = Vec::new();
    for reference in repo.references()? {
        let Ok(reference) = reference else { continue };
        if reference.target().is_none() {
            continue;
        }
        if let Ok(commit) = reference.peel_to_commit()
            && !tips.contains(&commit.id())
        {
            tips.push(commit.id());
        }
    }
    Ok(tips)
}

/// The tips recorded as verified whole in the remote at `remote_dir`, and where the record
/// lives. A record made for another remote counts as none.
pub(crate) struct Verified {
    git_dir: PathBuf,
    remote: String,
    pub tips: Vec<Oid>,
}

impl Verified {
    pub(crate) fn read(git_dir: &Path, remote_dir: &Path) -> Self {
        let remote = remote_dir
            .canonicalize()
            .unwrap_or_else(|_| remote_dir.to_owned())
            .display()
            .to_string();
        let text = std::fs::read_to_string(layout::state_file(git_dir, layout::REMOTE_VERIFIED))
            .unwrap_or_default();
        let mut lines = text.lines();
        let tips = if lines.next() == Some(remote.as_str()) {
            lines.filter_map(|l| Oid::from_str(l.trim()).ok()).collect()
        } else {
            Vec::new()
        };
        Self {
            git_dir: git_dir.to_owned(),
            remote,
            tips,
        }
    }

    /// Records `tips` as verified (temp file + rename; a failure only costs a walk later).
    pub(crate) fn write(&mut self, tips: &[Oid]) {
        self.tips = tips.to_vec();
        let mut body = format!("{}\n", self.remote);
        for tip in tips {
            body.push_str(&format!("{tip}\n"));
        }
        let path = layout::state_file(&self.git_dir, layout::REMOTE_VERIFIED);
        let tmp = path.with_extension("tmp");
        let written = layout::create_state_dir(&self.git_dir)
            .and_then(|()| std::fs::write(&tmp, body))
            .and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = written {
            tracing::debug!(error = %e, "cannot record the remote's verified tips");
        }
    }

    /// The tips of `now` not recorded as verified.
    pub(crate) fn unverified(&self, now: &[Oid]) -> Vec<Oid> {
        now.iter()
            .copied()
            .filter(|tip| !self.tips.contains(tip))
            .collect()
    }
}
