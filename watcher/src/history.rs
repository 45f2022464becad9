//! `project-watcher history` and `show`: the saves, newest first, read from local git data
//! only (no network), so listing the last 20 saves of a 100k-commit project is instant.
//! `show` detects renames as `git show` does, and prints the save as text or as a [`Save`].
//!
//! A save's kind comes from the watcher's trailers (`Saved-by: project-watcher/<version>`,
//! `Save-kind: <kind>`); a commit without them is `other`, the cloud's workspace page's word
//! for it too, and `synced` when it is one of the commits a sync made the working tree
//! (recorded in `.git/project-watcher/synced`), pushed from elsewhere rather than made here. Backups of unsaved work (`refs/project-watcher/backup/*`)
//! and the recovery branches they were pushed to are listed beside the branch.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use git2::{Delta, DiffFindOptions, DiffFormat, DiffOptions, DiffStatsFormat, Oid, Repository};
use serde::{Deserialize, Serialize};
use shmastra_contract::save_message::{self, SaveKind};

use crate::at::{self, RevError};
use crate::commit::diff_paths;
use crate::layout::{self, BACKUP_REF_PREFIX, read_synced};
use crate::status::timestamp;

/// One save, as `history --json` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The full commit id.
    pub commit: String,
    /// The commit time, RFC 3339 UTC.
    pub time: String,
    /// What made it.
    pub kind: SaveKind,
    /// Whether a `sync` pulled it in (a commit pushed from elsewhere; its kind is `other`).
    pub synced: bool,
    /// The paths this save changed (against its first parent).
    pub files: Vec<String>,
    /// Whether the remote has it, as far as this repository last heard.
    pub pushed: bool,
    /// The subject line of the commit message.
    pub subject: String,
    /// The backup ref or recovery branch this save is the tip of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r#ref: Option<String>,
    /// The branch `HEAD` is on, for a save in its history (saves only a backup or a recovery
    /// branch holds, and those of a detached `HEAD`, have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
}

/// One save, as `show --json` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Save {
    /// The full commit id.
    pub commit: String,
    /// The shortest unique prefix git would print (`git rev-parse --short`).
    pub short: String,
    /// What made it, named as `history --json` names it.
    pub kind: SaveKind,
    /// Whether a `sync` pulled it in, as `history --json` says it.
    pub synced: bool,
    /// The subject line of the commit message.
    pub subject: String,
    /// The whole commit message, trailers included.
    pub message: String,
    /// Who made it.
    pub author: Author,
    /// The commit time, RFC 3339 UTC.
    pub time: String,
    /// The full ids of its parents (none for the first save).
    pub parents: Vec<String>,
    /// What it changed against its first parent, in git's path order.
    pub files: Vec<FileChange>,
}

/// A commit's author.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Author {
    /// The name.
    pub name: String,
    /// The email address.
    pub email: String,
}

/// One path a save changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileChange {
    /// The path after the save (before it, for a deleted file).
    pub path: String,
    /// The path before a rename.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_path: Option<String>,
    /// How it changed.
    pub change: Change,
    /// Whether git treats its content as binary (then no line counts).
    pub binary: bool,
    /// Lines added, as `git show --numstat` counts them; `null` for a binary file.
    pub added: Option<usize>,
    /// Lines removed; `null` for a binary file.
    pub removed: Option<usize>,
    /// This file's part of the patch, as `git show` prints it (its `diff --git` header
    /// first; a binary file's is one `Binary files ... differ` line), but for an edited
    /// rename's `similarity index`, which libgit2 scores its own way.
    pub patch: String,
}

/// How a path changed, as `git diff-tree --name-status` letters it (`A`, `M`, `D`, `R`, `T`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// `A`: a new path.
    Added,
    /// `M`: new content or mode.
    Modified,
    /// `D`: the path is gone.
    Deleted,
    /// `R`: moved from `old_path`, maybe with edits.
    Renamed,
    /// `T`: a file became a symlink or a submodule, or back.
    TypeChanged,
}

/// What to list.
#[derive(Debug, Clone)]
pub struct Query {
    /// At most this many saves.
    pub limit: usize,
    /// Only saves that changed this path (a file, or everything under a folder).
    pub path: Option<PathBuf>,
    /// The remote whose tracking refs say what was pushed.
    pub remote: String,
}

/// Why `history` or `show` could not answer.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// `--dir` is not the top of a working tree (exit 2).
    #[error(transparent)]
    NotARepository(#[from] crate::project_dir::OpenError),
    /// Reading the repository failed.
    #[error("cannot read the project's history: {}", .0.message())]
    Git(#[from] git2::Error),
    /// The save asked for does not resolve.
    #[error(transparent)]
    Rev(#[from] RevError),
}

impl HistoryError {
    /// The user's input is wrong (exit 2).
    pub fn is_usage(&self) -> bool {
        match self {
            Self::NotARepository(_) => true,
            Self::Rev(e) => e.is_usage(),
            Self::Git(_) => false,
        }
    }
}

/// The repository at `dir`, or an error that says it is none.
pub fn open(dir: &Path) -> Result<Repository, HistoryError> {
    crate::project_dir::open(dir).map_err(HistoryError::from)
}

/// The saves on `HEAD`, the backups and the recovery branches, newest first.
pub fn history(repo: &Repository, query: &Query) -> Result<Vec<Entry>, HistoryError> {
    let tips = side_tips(repo, &query.remote)?;
    let head = repo.head().ok().and_then(|h| h.target());
    let walk = at::NewestFirst::new(repo, head.into_iter().chain(tips.keys().copied()))?;
    let unpushed = unpushed(repo, &query.remote, &tips)?;
    let synced = read_synced(repo.path());
    let pathspec = query.path.as_deref().map(normalise_path);
    let branch = repo
        .head()
        .ok()
        .filter(|h| h.is_branch())
        .and_then(|h| h.shorthand().ok().map(str::to_owned));
    // Without side tips every save walked is on `HEAD`'s history; with them, each is asked.
    let on_branch = |oid: Oid| {
        head.is_some_and(|h| {
            tips.is_empty() || h == oid || repo.graph_descendant_of(h, oid).unwrap_or(false)
        })
    };
    let mut entries = Vec::new();
    for commit in walk {
        if entries.len() >= query.limit {
            break;
        }
        let commit = commit?;
        let oid = commit.id();
        if let Some(path) = &pathspec
            && changed_paths(repo, &commit, Some(path))?.is_empty()
        {
            continue;
        }
        let message = commit.message_raw().unwrap_or_default();
        let tip = tips.get(&oid).cloned();
        let kind = match classify(message) {
            SaveKind::Autosave if tip.is_some() => SaveKind::Backup,
            kind => kind,
        };
        entries.push(Entry {
            commit: oid.to_string(),
            time: timestamp(at::commit_time(commit.time().seconds())),
            kind,
            synced: kind == SaveKind::Other && synced.contains(&oid),
            files: changed_paths(repo, &commit, None)?,
            pushed: !unpushed.contains(&oid),
            subject: commit
                .summary()
                .ok()
                .flatten()
                .unwrap_or_default()
                .to_owned(),
            r#ref: tip,
            branch: branch.clone().filter(|_| on_branch(oid)),
        });
    }
    Ok(entries)
}

/// The kind of a commit from its message: the watcher's trailers, else `other`.
pub(crate) fn classify(message: &str) -> SaveKind {
    save_message::classify(message).unwrap_or(SaveKind::Other)
}

/// The backup refs and the recovery branches known locally: tip -> ref name.
fn side_tips(repo: &Repository, remote: &str) -> Result<HashMap<Oid, String>, git2::Error> {
    let mut tips = HashMap::new();
    // A pushed backup has both refs; the remote's name is the one that outlives the sandbox.
    for glob in [
        layout::recovery_tracking_glob(remote),
        format!("{BACKUP_REF_PREFIX}*"),
    ] {
        for reference in repo.references_glob(&glob)? {
            let reference = reference?;
            if let (Ok(name), Ok(commit)) = (reference.name(), reference.peel_to_commit()) {
                tips.entry(commit.id()).or_insert_with(|| name.to_owned());
            }
        }
    }
    Ok(tips)
}

/// What the remote lacks, from its tracking refs.
enum Unpushed {
    /// No ref of the remote exists: nothing was ever pushed (no walk needed).
    Everything,
    /// The commits on `HEAD` and the side tips that no ref of the remote holds.
    These(HashSet<Oid>),
}

impl Unpushed {
    fn contains(&self, oid: &Oid) -> bool {
        match self {
            Self::Everything => true,
            Self::These(set) => set.contains(oid),
        }
    }
}

fn unpushed(
    repo: &Repository,
    remote: &str,
    tips: &HashMap<Oid, String>,
) -> Result<Unpushed, git2::Error> {
    let remote_refs: Vec<Oid> = repo
        .references_glob(&format!("refs/remotes/{remote}/*"))?
        .filter_map(|r| r.ok().and_then(|r| r.target()))
        .collect();
    if remote_refs.is_empty() {
        return Ok(Unpushed::Everything);
    }
    let mut walk = repo.revwalk()?;
    let _ = walk.push_head();
    for oid in tips.keys() {
        walk.push(*oid)?;
    }
    for oid in remote_refs {
        walk.hide(oid)?;
    }
    walk.collect::<Result<_, _>>().map(Unpushed::These)
}

/// The paths `commit` changed against its first parent (the empty tree for the first save),
/// limited to `path` when given.
fn changed_paths(
    repo: &Repository,
    commit: &git2::Commit<'_>,
    path: Option<&str>,
) -> Result<Vec<String>, git2::Error> {
    Ok(diff_paths(&diff_of(repo, commit, path)?))
}

fn diff_of<'r>(
    repo: &'r Repository,
    commit: &git2::Commit<'_>,
    path: Option<&str>,
) -> Result<git2::Diff<'r>, git2::Error> {
    let parent_tree = match commit.parent(0) {
        Ok(parent) => Some(parent.tree()?),
        Err(_) => None,
    };
    let mut options = DiffOptions::new();
    options.ignore_submodules(false);
    if let Some(path) = path {
        options.pathspec(path).disable_pathspec_match(true);
    }
    repo.diff_tree_to_tree(
        parent_tree.as_ref(),
        Some(&commit.tree()?),
        Some(&mut options),
    )
}

/// `./src/` -> `src`: pathspecs are relative to the project's top.
pub(crate) fn normalise_path(path: &Path) -> String {
    let text = path.to_string_lossy();
    let text = text.trim_start_matches("./").trim_end_matches('/');
    text.to_owned()
}

/// The history as a person reads it: one line per save, after a line naming the branch.
pub fn render(entries: &[Entry]) -> String {
    let mut out = match entries.iter().find_map(|e| e.branch.as_deref()) {
        Some(branch) => format!("branch {branch}\n"),
        None => String::new(),
    };
    for e in entries {
        let files = match e.files.len() {
            1 => "1 file".to_owned(),
            n => format!("{n} files"),
        };
        let _ = write!(
            out,
            "{}  {}  {:<8}  {:<8}  {:>9}  {}",
            &e.commit[..7.min(e.commit.len())],
            e.time,
            e.kind,
            if e.pushed { "pushed" } else { "local" },
            files,
            e.subject,
        );
        if let Some(r) = &e.r#ref {
            let _ = write!(out, "  [{r}]");
        }
        if e.synced {
            out.push_str("  [synced]");
        }
        out.push('\n');
    }
    out
}

/// `project-watcher show REV`: the save's header, then its stat and patch as git prints them
/// (binary files summarised).
pub fn show(repo: &Repository, rev: &str) -> Result<String, HistoryError> {
    let commit = repo.find_commit(at::resolve(repo, rev, std::time::SystemTime::now())?)?;
    let message = commit.message_raw().unwrap_or_default();
    let mut out = format!(
        "commit {}\nKind: {}{}\nAuthor: {} <{}>\nDate:   {}\n\n",
        commit.id(),
        kind_of(&commit),
        if synced(repo, &commit) {
            " (pulled in by a sync)"
        } else {
            ""
        },
        commit.author().name().unwrap_or_default(),
        commit.author().email().unwrap_or_default(),
        timestamp(at::commit_time(commit.time().seconds())),
    );
    for line in message.lines() {
        let _ = writeln!(out, "    {line}");
    }
    out.push('\n');
    let diff = shown_diff(repo, &commit)?;
    let stats = diff.stats()?.to_buf(DiffStatsFormat::FULL, 80)?;
    out.push_str(&String::from_utf8_lossy(&stats));
    out.push('\n');
    let mut patch = Vec::new();
    diff.print(DiffFormat::Patch, |_, _, line| {
        if matches!(line.origin(), '+' | '-' | ' ') {
            patch.push(line.origin() as u8);
        }
        patch.extend_from_slice(line.content());
        true
    })?;
    out.push_str(&String::from_utf8_lossy(&patch));
    Ok(out)
}

/// `project-watcher show --json REV`: the same save as [`show`], as data.
pub fn show_save(repo: &Repository, rev: &str) -> Result<Save, HistoryError> {
    let commit = repo.find_commit(at::resolve(repo, rev, std::time::SystemTime::now())?)?;
    let diff = shown_diff(repo, &commit)?;
    let mut files = Vec::with_capacity(diff.deltas().len());
    for index in 0..diff.deltas().len() {
        let Some(mut patch) = git2::Patch::from_diff(&diff, index)? else {
            continue;
        };
        let delta = patch.delta();
        let path = |file: git2::DiffFile<'_>| {
            file.path_bytes()
                .map(|p| String::from_utf8_lossy(p).into_owned())
        };
        let (old, new) = (path(delta.old_file()), path(delta.new_file()));
        let change = match delta.status() {
            Delta::Added => Change::Added,
            Delta::Deleted => Change::Deleted,
            Delta::Renamed => Change::Renamed,
            Delta::Typechange => Change::TypeChanged,
            _ => Change::Modified,
        };
        let binary = delta.flags().is_binary();
        let (_, added, removed) = patch.line_stats()?;
        files.push(FileChange {
            path: new.clone().or(old.clone()).unwrap_or_default(),
            old_path: old.filter(|_| change == Change::Renamed),
            change,
            binary,
            added: (!binary).then_some(added),
            removed: (!binary).then_some(removed),
            patch: String::from_utf8_lossy(&patch.to_buf()?).into_owned(),
        });
    }
    Ok(Save {
        commit: commit.id().to_string(),
        short: String::from_utf8_lossy(&commit.as_object().short_id()?).into_owned(),
        kind: kind_of(&commit),
        synced: synced(repo, &commit),
        subject: commit
            .summary()
            .ok()
            .flatten()
            .unwrap_or_default()
            .to_owned(),
        message: commit.message_raw().unwrap_or_default().to_owned(),
        author: Author {
            name: commit.author().name().unwrap_or_default().to_owned(),
            email: commit.author().email().unwrap_or_default().to_owned(),
        },
        time: timestamp(at::commit_time(commit.time().seconds())),
        parents: commit.parent_ids().map(|id| id.to_string()).collect(),
        files,
    })
}

fn kind_of(commit: &git2::Commit<'_>) -> SaveKind {
    classify(commit.message_raw().unwrap_or_default())
}

/// Whether a sync pulled the commit in (only a commit the watcher did not make).
fn synced(repo: &Repository, commit: &git2::Commit<'_>) -> bool {
    kind_of(commit) == SaveKind::Other && read_synced(repo.path()).contains(&commit.id())
}

/// The diff `show` prints: against the first parent, renames found as `git show` finds them.
fn shown_diff<'r>(
    repo: &'r Repository,
    commit: &git2::Commit<'_>,
) -> Result<git2::Diff<'r>, git2::Error> {
    let mut diff = diff_of(repo, commit, None)?;
    diff.find_similar(Some(DiffFindOptions::new().renames(true)))?;
    Ok(diff)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The trailer rules are the contract's (tested there against git); here: a commit
    /// without them.
    #[test]
    fn a_commit_without_the_watchers_trailers_is_other() {
        let paths = vec!["a.ts".to_owned()];
        assert_eq!(
            classify(&crate::commit::message(&paths)),
            SaveKind::Autosave
        );
        assert_eq!(classify("fix the weather tool\n"), SaveKind::Other);
    }

    #[test]
    fn paths_are_relative_to_the_top() {
        assert_eq!(normalise_path(Path::new("./src/")), "src");
        assert_eq!(normalise_path(Path::new("src/a.ts")), "src/a.ts");
    }
}
