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
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use git2::{DiffFormat, DiffOptions, DiffStatsFormat, Oid, Repository};
use serde::{Deserialize, Serialize};

use crate::at::{self, RevError};
use crate::commit::{KIND_TRAILER, Kind, SAVED_BY_TRAILER, diff_paths};
use crate::lock::state_dir;
use crate::status::timestamp;
use crate::sync::BACKUP_REF_PREFIX;

/// How many synced commits `.git/project-watcher/synced` remembers.
const SYNCED_KEPT: usize = 200;

/// One save, as `history --json` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The full commit id.
    pub commit: String,
    /// The commit time, RFC 3339 UTC.
    pub time: String,
    pub kind: Kind,
    /// The paths this save changed (against its first parent).
    pub files: Vec<String>,
    /// Whether the remote has it, as far as this repository last heard.
    pub pushed: bool,
    /// The subject line of the commit message.
    pub subject: String,
    /// The backup ref or recovery branch this save is the tip of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r#ref: Option<String>,
}

/// What to list.
#[derive(Debug, Clone)]
pub struct Query {
    pub limit: usize,
    /// Only saves that changed this path (a file, or everything under a folder).
    pub path: Option<PathBuf>,
    /// The remote whose tracking refs say what was pushed.
    pub remote: String,
}

#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("{path} is not a git repository: {source}")]
    NotARepository { path: PathBuf, source: git2::Error },
    #[error("cannot read the project's history: {0}")]
    Git(#[from] git2::Error),
    #[error(transparent)]
    Rev(#[from] RevError),
}

impl HistoryError {
    /// The user's input is wrong (exit 2).
    pub fn is_usage(&self) -> bool {
        match self {
            Self::NotARepository { .. } => true,
            Self::Rev(e) => e.is_usage(),
            Self::Git(_) => false,
        }
    }
}

pub fn open(dir: &Path) -> Result<Repository, HistoryError> {
    Repository::open(dir).map_err(|source| HistoryError::NotARepository {
        path: dir.to_owned(),
        source,
    })
}

/// The saves on `HEAD`, the backups and the recovery branches, newest first.
pub fn history(repo: &Repository, query: &Query) -> Result<Vec<Entry>, HistoryError> {
    let tips = side_tips(repo, &query.remote)?;
    let head = repo.head().ok().and_then(|h| h.target());
    let walk = at::NewestFirst::new(repo, head.into_iter().chain(tips.keys().copied()))?;
    let unpushed = unpushed(repo, &query.remote, &tips)?;
    let synced = read_synced(repo.path());
    let pathspec = query.path.as_deref().map(normalise_path);
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
            Kind::Autosave if tip.is_some() => Kind::Backup,
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
        });
    }
    Ok(entries)
}

/// The kind of a commit from its message: the watcher's trailers, else `sync` for a commit a
/// sync pulled in, else `other`.
pub fn classify(message: &str, synced: bool) -> Kind {
    let mut saved_by_watcher = false;
    let mut kind = None;
    if let Ok(trailers) = git2::message_trailers_strs(message) {
        for (name, value) in trailers.iter() {
            if name.eq_ignore_ascii_case(SAVED_BY_TRAILER) && value.starts_with("project-watcher/")
            {
                saved_by_watcher = true;
            } else if name.eq_ignore_ascii_case(KIND_TRAILER) {
                kind = Kind::parse(value);
            }
        }
    }
    if !saved_by_watcher {
        return if synced { Kind::Sync } else { Kind::Other };
    }
    // Saves from before the kind trailer existed: autosaves and sync's backups.
    kind.unwrap_or_else(|| {
        if message.starts_with("backup:") {
            Kind::Backup
        } else {
            Kind::Autosave
        }
    })
}

/// The backup refs and the recovery branches known locally: tip -> ref name.
fn side_tips(repo: &Repository, remote: &str) -> Result<HashMap<Oid, String>, git2::Error> {
    let mut tips = HashMap::new();
    // A pushed backup has both refs; the remote's name is the one that outlives the sandbox.
    for glob in [
        format!("refs/remotes/{remote}/recovery/*"),
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
pub fn normalise_path(path: &Path) -> String {
    let text = path.to_string_lossy();
    let text = text.trim_start_matches("./").trim_end_matches('/');
    text.to_owned()
}

/// The history as a person reads it: one line per save.
pub fn render(entries: &[Entry]) -> String {
    let mut out = String::new();
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

/// The commits syncs made the working tree, as `.git/project-watcher/synced` lists them.
fn read_synced(git_dir: &Path) -> HashSet<Oid> {
    fs::read_to_string(synced_file(git_dir))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| Oid::from_str(l.trim()).ok())
        .collect()
}

fn synced_file(git_dir: &Path) -> PathBuf {
    state_dir(git_dir).join("synced")
}

/// Remembers that a sync made `commit` the working tree (kind `sync` in history). Keeps the
/// newest [`SYNCED_KEPT`]; written through a temp file and a rename.
pub fn record_synced(git_dir: &Path, commit: Oid) -> io::Result<()> {
    let path = synced_file(git_dir);
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
    fs::create_dir_all(state_dir(git_dir))?;
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, body)?;
    fs::rename(&tmp, &path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_come_from_the_trailers() {
        let check = |message: &str, synced: bool, expected: Kind| {
            assert_eq!(classify(message, synced), expected, "{message:?}");
        };
        let paths = vec!["a.ts".to_owned()];
        check(&crate::commit::message(&paths), false, Kind::Autosave);
        check(&crate::commit::message(&paths), true, Kind::Autosave);
        check(
            &crate::commit::message_with("restore: x", Kind::Restore, &paths, &[]),
            false,
            Kind::Restore,
        );
        check(
            &crate::commit::message_with("backup: x", Kind::Backup, &[], &[]),
            false,
            Kind::Backup,
        );
        // Before the kind trailer: the subject tells.
        check(
            "autosave: 1 files changed\n\na.ts\n\nSaved-by: project-watcher/0.1.0\n",
            false,
            Kind::Autosave,
        );
        check(
            "backup: unsaved work before sync\n\nSaved-by: project-watcher/0.1.0\n",
            false,
            Kind::Backup,
        );
        // A person's commit, even one that mentions the trailer in its body.
        check("fix the weather tool\n", false, Kind::Other);
        check("fix the weather tool\n", true, Kind::Sync);
        check(
            "Save-kind: restore\n\nwrote Saved-by: project-watcher/1 by hand\n",
            false,
            Kind::Other,
        );
    }

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
    fn paths_are_relative_to_the_top() {
        assert_eq!(normalise_path(Path::new("./src/")), "src");
        assert_eq!(normalise_path(Path::new("src/a.ts")), "src/a.ts");
    }
}
