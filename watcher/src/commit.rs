//! The commit: turns a staged tree into an autosave commit on `HEAD`, unless nothing changed.

use std::fmt::Write as _;

use git2::{DiffOptions, Oid, Repository, Signature};

use crate::status::VERSION;

/// At most this many paths are listed in a commit message body.
const LISTED_PATHS: usize = 20;

/// The identity used when the repository configures none.
const FALLBACK_NAME: &str = "project-watcher";
const FALLBACK_EMAIL: &str = "project-watcher@localhost";

/// A commit that was made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    pub id: Oid,
    pub files_changed: usize,
}

/// Commits `tree` on `HEAD` when it differs from `HEAD`'s tree (an unborn `HEAD` counts as
/// the empty tree). `HEAD` is read fresh, so a `restore` that reset the branch is respected.
pub fn commit_tree(repo: &Repository, tree: Oid) -> Result<Option<Committed>, git2::Error> {
    let parent = match repo.head() {
        Ok(head) => Some(head.peel_to_commit()?),
        Err(e)
            if matches!(
                e.code(),
                git2::ErrorCode::UnbornBranch | git2::ErrorCode::NotFound
            ) =>
        {
            None
        }
        Err(e) => return Err(e),
    };
    let parent_tree = parent.as_ref().map(|c| c.tree()).transpose()?;
    if parent_tree.as_ref().map(|t| t.id()) == Some(tree) {
        return Ok(None);
    }
    let new_tree = repo.find_tree(tree)?;
    if parent.is_none() && new_tree.is_empty() {
        return Ok(None);
    }
    let mut opts = DiffOptions::new();
    opts.ignore_submodules(false);
    let diff = repo.diff_tree_to_tree(parent_tree.as_ref(), Some(&new_tree), Some(&mut opts))?;
    let paths: Vec<String> = diff
        .deltas()
        .filter_map(|d| {
            d.new_file()
                .path_bytes()
                .or(d.old_file().path_bytes())
                .map(show_path)
        })
        .collect();
    if paths.is_empty() {
        return Ok(None);
    }
    let message = message(&paths);
    let signature = repo
        .signature()
        .or_else(|_| Signature::now(FALLBACK_NAME, FALLBACK_EMAIL))?;
    let parents: Vec<&git2::Commit<'_>> = parent.iter().collect();
    let id = repo.commit(
        Some("HEAD"),
        &signature,
        &signature,
        &message,
        &new_tree,
        &parents,
    )?;
    Ok(Some(Committed {
        id,
        files_changed: paths.len(),
    }))
}

/// `autosave: N files changed`, the first paths, and the `Saved-by` trailer.
pub fn message(paths: &[String]) -> String {
    let mut text = format!("autosave: {} files changed\n\n", paths.len());
    for path in paths.iter().take(LISTED_PATHS) {
        let _ = writeln!(text, "{path}");
    }
    if paths.len() > LISTED_PATHS {
        let _ = writeln!(text, "... and {} more", paths.len() - LISTED_PATHS);
    }
    let _ = write!(text, "\nSaved-by: project-watcher/{VERSION}\n");
    text
}

/// A path as one line of text: quoted like Rust strings when it holds control characters
/// (a newline in a name must not break the message apart), lossy for invalid UTF-8.
fn show_path(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    if text.chars().any(char::is_control) {
        format!("{text:?}")
    } else {
        text.into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_lists_twenty_paths_and_ends_with_the_trailer() {
        let paths: Vec<String> = (0..25).map(|i| format!("f{i}")).collect();
        let m = message(&paths);
        assert!(m.starts_with("autosave: 25 files changed\n\nf0\n"), "{m}");
        assert!(m.contains("f19\n... and 5 more\n"), "{m}");
        assert!(!m.contains("f20"), "{m}");
        assert!(
            m.ends_with(&format!("\n\nSaved-by: project-watcher/{VERSION}\n")),
            "{m}"
        );
    }

    #[test]
    fn control_characters_in_names_stay_on_one_line() {
        assert_eq!(show_path(b"a\nb"), "\"a\\nb\"");
        assert_eq!(show_path(b"plain/name.txt"), "plain/name.txt");
        assert_eq!(show_path(b"bad\xffutf8"), "bad\u{fffd}utf8");
    }
}
