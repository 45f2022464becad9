//! Which objects a push sends, found without walking any tree the remote already has.
//!
//! The commits are those reachable from the pushed head but from none of the remote's
//! advertised tips that exist locally (a revwalk hiding them). For each, the commit itself and
//! the trees and blobs that differ from its first parent's tree, by name: a subtree whose id
//! is unchanged is skipped whole, so the cost grows with the change, not with the tree.
//!
//! Why that is complete: a parent is either in the walk (and sends what it changed) or reachable
//! from an advertised tip, whose objects a connected remote holds. Everything in a commit's tree
//! is either in its parent's tree, or differs from it and is sent. Some objects may be sent
//! though the remote has them (a file moved to another directory, a merge's second parent);
//! git accepts those and stores them once.

use std::collections::HashSet;

use git2::{ObjectType, Oid, Repository, Tree};

/// The objects to send for `head`, the remote holding everything reachable from `hidden`
/// (commits unknown locally are skipped): each commit followed by what it added.
pub(crate) fn new_objects(
    repo: &Repository,
    head: Oid,
    hidden: impl IntoIterator<Item = Oid>,
) -> Result<Vec<Oid>, git2::Error> {
    let mut walk = repo.revwalk()?;
    walk.push(head)?;
    for tip in hidden {
        if repo.find_commit(tip).is_ok() {
            walk.hide(tip)?;
        }
    }
    let mut objects = Vec::new();
    let mut seen = HashSet::new();
    for commit in walk {
        let commit = repo.find_commit(commit?)?;
        objects.push(commit.id());
        let tree = commit.tree()?;
        let parent_tree = match commit.parents().next() {
            Some(parent) => Some(parent.tree()?),
            None => None,
        };
        if parent_tree.as_ref().map(Tree::id) == Some(tree.id()) || !seen.insert(tree.id()) {
            continue;
        }
        objects.push(tree.id());
        changed_entries(repo, &tree, parent_tree.as_ref(), &mut seen, &mut objects)?;
    }
    Ok(objects)
}

/// Appends the blobs and trees of `new` whose id differs from the entry of the same name in
/// `old`, recursing only into subtrees that changed. Gitlinks name commits of another
/// repository and are never sent.
fn changed_entries(
    repo: &Repository,
    new: &Tree<'_>,
    old: Option<&Tree<'_>>,
    seen: &mut HashSet<Oid>,
    out: &mut Vec<Oid>,
) -> Result<(), git2::Error> {
    for entry in new.iter() {
        let id = entry.id();
        let before = old.and_then(|old| old.get_name_bytes(entry.name_bytes()));
        if before.as_ref().is_some_and(|b| b.id() == id) {
            continue;
        }
        match entry.kind() {
            Some(ObjectType::Blob) if seen.insert(id) => out.push(id),
            Some(ObjectType::Tree) => {
                if !seen.insert(id) {
                    continue;
                }
                out.push(id);
                let subtree = repo.find_tree(id)?;
                let old_subtree = match before {
                    Some(b) if b.kind() == Some(ObjectType::Tree) => Some(repo.find_tree(b.id())?),
                    _ => None,
                };
                changed_entries(repo, &subtree, old_subtree.as_ref(), seen, out)?;
            }
            _ => {}
        }
    }
    Ok(())
}
