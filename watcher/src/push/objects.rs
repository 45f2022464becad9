//! Which objects a push sends: for an ordinary save, found without walking any tree the remote
//! already has; after the server refused a pack for missing objects, the complete pack
//! `git push` would send, or every object of the branch.
//!
//! [`Pack::Changes`]: the commits are those reachable from the pushed head but from none of the
//! remote's advertised tips that exist locally (a revwalk hiding them), taken parents before
//! children (`TOPOLOGICAL | REVERSE`). For each, the commit itself and the trees and blobs that
//! differ from its first parent's tree, by name: a subtree whose id is unchanged is skipped
//! whole, so the cost grows with the change, not with the tree. A root commit has no parent
//! tree: its whole tree is sent (but for objects already in the pack).
//!
//! Why that is complete. Call a tree *complete* when every object it reaches is on the remote
//! (reachable from an advertised tip, whose objects a connected remote holds) or in the pack.
//! Claim: when a commit has been handled, its tree is complete. By induction over the walk
//! order. A commit's first parent is either in the walk, so handled before it (parents come
//! first) and complete, or not in the walk, so reachable from an advertised tip and complete.
//! In the commit's tree, an entry whose id equals the parent tree's entry of the same name is
//! an object of a complete tree, so it and everything below it are complete; a differing blob
//! is put in the pack; a differing tree is either put in the pack and handled the same way
//! against the parent's entry of its name (a complete tree, or nothing), or it was put in the
//! pack before. A tree put in the pack before has been handled to the end already (a tree
//! cannot reach itself, so it is never met again while it is being handled), so it is
//! complete: "already in the pack" means "complete", which is what lets an object be sent
//! once however many commits and paths hold it. Merges: a merge is diffed against its first
//! parent only; its other parents are commits of the walk (handled, and sent) or on the remote.
//!
//! Walking children first, as the default order does, breaks the step "already in the pack
//! means complete": a tree first met in a newer commit was sent only as a difference against
//! that commit's parent, which is not handled yet, so an older commit holding the same tree (a
//! revert a -> b -> a, the root commit, `restore --at`) skipped objects that were never sent.
//!
//! Some objects may be sent though the remote has them (a file moved to another directory, a
//! merge's second parent); git accepts those and stores them once.
//!
//! [`Pack::Full`] is the pack `git push` sends, built by libgit2's `insert_walk`: the same
//! commits, each with its whole tree but for the objects of the advertised tips' trees.
//! [`Pack::Everything`] hides nothing: every commit and object the head reaches.

use std::collections::HashSet;

use git2::{ObjectType, Oid, PackBuilder, Repository, Sort, Tree};

/// How much a push sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pack {
    /// The new commits and what each changed: O(change).
    Changes,
    /// What `git push` sends: the new commits with their whole trees, less what the
    /// advertised tips' trees hold (O(tree)). After the server refused a pack for missing
    /// objects.
    Full,
    /// Every object the head reaches, whatever the remote advertises (O(history)). After the
    /// server refused even a full pack: its own refs reach objects it lacks.
    Everything,
}

impl Pack {
    /// The pack to send after the server refused this one for missing objects, if any is
    /// larger.
    pub(crate) fn larger(self) -> Option<Self> {
        match self {
            Self::Changes => Some(Self::Full),
            Self::Full => Some(Self::Everything),
            Self::Everything => None,
        }
    }

    /// The words for a status line: what the next attempt sends.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Self::Changes => "the new saves' changes",
            Self::Full => "a full pack",
            Self::Everything => "every object of the branch",
        }
    }
}

/// The advertised tips that are commits here: what the walks hide.
fn hide_known(
    repo: &Repository,
    walk: &mut git2::Revwalk<'_>,
    hidden: impl IntoIterator<Item = Oid>,
) -> Result<(), git2::Error> {
    for tip in hidden {
        if repo.find_commit(tip).is_ok() {
            walk.hide(tip)?;
        }
    }
    Ok(())
}

/// The pack of `pack`'s kind for `head`, the remote holding everything reachable from
/// `hidden` (commits unknown locally are not hidden).
pub(crate) fn build<'r>(
    repo: &'r Repository,
    head: Oid,
    hidden: &[Oid],
    pack: Pack,
) -> Result<PackBuilder<'r>, git2::Error> {
    let mut builder = repo.packbuilder()?;
    builder.set_threads(1);
    match pack {
        Pack::Changes => {
            for oid in new_objects(repo, head, hidden.iter().copied())? {
                builder.insert_object(oid, None)?;
            }
        }
        Pack::Full | Pack::Everything => {
            let mut walk = repo.revwalk()?;
            walk.push(head)?;
            if pack == Pack::Full {
                hide_known(repo, &mut walk, hidden.iter().copied())?;
            }
            builder.insert_walk(&mut walk)?;
        }
    }
    Ok(builder)
}

/// The objects to send for `head`, the remote holding everything reachable from `hidden`
/// (commits unknown locally are skipped): each commit followed by what it added, parents
/// before children.
pub(crate) fn new_objects(
    repo: &Repository,
    head: Oid,
    hidden: impl IntoIterator<Item = Oid>,
) -> Result<Vec<Oid>, git2::Error> {
    let mut walk = repo.revwalk()?;
    walk.set_sorting(Sort::TOPOLOGICAL | Sort::REVERSE)?;
    walk.push(head)?;
    hide_known(repo, &mut walk, hidden)?;
    let mut objects = Vec::new();
    let mut sent = HashSet::new();
    for commit in walk {
        let commit = repo.find_commit(commit?)?;
        objects.push(commit.id());
        let tree = commit.tree()?;
        let parent_tree = match commit.parents().next() {
            Some(parent) => Some(parent.tree()?),
            None => None,
        };
        if parent_tree.as_ref().map(Tree::id) == Some(tree.id()) || !sent.insert(tree.id()) {
            continue;
        }
        objects.push(tree.id());
        changed_entries(repo, &tree, parent_tree.as_ref(), &mut sent, &mut objects)?;
    }
    Ok(objects)
}

/// Appends the blobs and trees of `new` whose id differs from the entry of the same name in
/// `old` and is not in `sent`, recursing only into subtrees that changed. Gitlinks name commits
/// of another repository and are never sent.
fn changed_entries(
    repo: &Repository,
    new: &Tree<'_>,
    old: Option<&Tree<'_>>,
    sent: &mut HashSet<Oid>,
    out: &mut Vec<Oid>,
) -> Result<(), git2::Error> {
    for (entry, before) in differing(new, old) {
        let id = entry.id();
        match entry.kind() {
            Some(ObjectType::Blob) if sent.insert(id) => out.push(id),
            Some(ObjectType::Tree) if sent.insert(id) => {
                out.push(id);
                let subtree = repo.find_tree(id)?;
                let old_subtree = match before {
                    Some(b) if b.kind() == Some(ObjectType::Tree) => Some(repo.find_tree(b.id())?),
                    _ => None,
                };
                changed_entries(repo, &subtree, old_subtree.as_ref(), sent, out)?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// The entries of `new` whose id differs from the entry of the same name in `old` (all of
/// them without `old`), each with that entry of `old`, if any.
pub(crate) fn differing<'t>(
    new: &'t Tree<'_>,
    old: Option<&'t Tree<'_>>,
) -> impl Iterator<Item = (git2::TreeEntry<'t>, Option<git2::TreeEntry<'t>>)> {
    new.iter().filter_map(move |entry| {
        let before = old.and_then(|old| old.get_name_bytes(entry.name_bytes()));
        if before.as_ref().is_some_and(|b| b.id() == entry.id()) {
            None
        } else {
            Some((entry, before))
        }
    })
}
