//! `project-watcher history` and `show`: the saves, newest first, read from local git data
//! only (no network), so listing the last 20 saves of a 100k-commit project is instant.
//!
//! A save's kind comes from the watcher's trailers (`Saved-by: project-watcher/<version>`,
//! `Save-kind: <kind>`); a commit without them was made by a person (`other`), or pulled in
//! by a `sync` when it is one of the commits a sync made the working tree (recorded in
//! `.git/project-watcher/synced`). Backups of unsaved work (`refs/project-watcher/backup/*`)
//! and the recovery branches they were pushed to are listed beside the branch.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use git2::{DiffFormat, DiffOptions, DiffStatsFormat, Oid, Repository};
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
        let kind = match classify(message, synced.contains(&oid)) {
            SaveKind::Autosave if tip.is_some() => SaveKind::Backup,
            kind => kind,
        };
        entries.push(Entry {
            commit: oid.to_string(),
            time: timestamp(at::commit_time(commit.time().seconds())),
            kind,
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

/// The kind of a commit from its message: the watcher's trailers, else `sync` for a commit a
/// sync pulled in, else `other`.
pub(crate) fn classify(message: &str, synced: bool) -> SaveKind {
    save_message::classify(message).unwrap_or(if synced {
        SaveKind::Sync
    } else {
        SaveKind::Other
    })
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
        out.push('\n');
    }
    out
}

/// `project-watcher show REV`: the save's header, then its stat and patch as git prints them
/// (binary files summarised).
pub fn show(repo: &Repository, rev: &str) -> Result<String, HistoryError> {
    let oid = at::resolve(repo, rev, std::time::SystemTime::now())?;
    let commit = repo.find_commit(oid)?;
    let synced = read_synced(repo.path());
    let message = commit.message_raw().unwrap_or_default();
    let mut out = format!(
        "commit {oid}\nKind: {}\nAuthor: {} <{}>\nDate:   {}\n\n",
        classify(message, synced.contains(&oid)),
        commit.author().name().unwrap_or_default(),
        commit.author().email().unwrap_or_default(),
        timestamp(at::commit_time(commit.time().seconds())),
    );
    for line in message.lines() {
        let _ = writeln!(out, "    {line}");
    }
    out.push('\n');
    let diff = diff_of(repo, &commit, None)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The trailer rules are the contract's (tested there against git); here: what a sync
    /// record adds to them.
    #[test]
    fn a_synced_commit_without_the_watchers_trailers_is_a_sync() {
        let paths = vec!["a.ts".to_owned()];
        let check = |message: &str, synced: bool, expected: SaveKind| {
            assert_eq!(classify(message, synced), expected, "{message:?}");
        };
        check(&crate::commit::message(&paths), false, SaveKind::Autosave);
        check(&crate::commit::message(&paths), true, SaveKind::Autosave);
        check("fix the weather tool\n", false, SaveKind::Other);
        check("fix the weather tool\n", true, SaveKind::Sync);
    }

    #[test]
    fn paths_are_relative_to_the_top() {
        assert_eq!(normalise_path(Path::new("./src/")), "src");
        assert_eq!(normalise_path(Path::new("src/a.ts")), "src/a.ts");
    }
}
