//! Git's ignore rules: which paths of the working tree `git add -A` would consider.
//!
//! Precedence is git's: the `.gitignore` nearest to the path wins over those above it, then
//! `.git/info/exclude`, then `core.excludesFile`; inside one file the last matching line wins.
//! A path under an ignored directory is ignored whatever its own rules say, which is why
//! callers walk top-down and never ask about the children of an ignored directory.
//! On top of git's rules, `.git` is always ignored and so is anything named `.env`.
//!
//! Lines are read and matched by [`crate::gitignore`], a port of git's own code: bytes, not
//! text (a line that is not UTF-8 applies), braces literal, `***` as `**`, a line with an
//! unclosed `[` matching nothing, `core.ignoreCase` making every rule case-insensitive. An
//! in-tree `.gitignore` that is a symbolic link is not read (git 2.32+ opens it with
//! `O_NOFOLLOW`); `info/exclude` and `core.excludesFile` may be links.
//!
//! The watch stage owns the rules and hands an immutable snapshot (`Rules`) with each batch:
//! no lock is shared between stages. Tracked paths that a rule matches stay tracked (git
//! updates them): the stage finds them ([`TrackedIgnored`]) and sends them to the watch stage,
//! which keeps watching their directories.

use std::collections::{BTreeSet, HashMap};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use shmastra_contract::manifest::is_env_file_name;

use crate::gitignore::Patterns;

/// The file name that is never committed, whatever `.gitignore` says.
pub(crate) const ENV_FILE: &str = ".env";

/// Which rules file a path is, when it is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RulesFile {
    /// A `.gitignore` in this directory (relative to the working tree; empty for the root).
    Dir(PathBuf),
    /// `.git/info/exclude` or `core.excludesFile`.
    Repo,
}

/// A rules file line that could not be read; the other lines still apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleWarning(pub String);

/// Cloned only when the watch stage changes rules a batch still holds: the rules files' parsed
/// forms are shared, not copied.
#[derive(Clone)]
pub struct Filter {
    workdir: PathBuf,
    git_dir: PathBuf,
    info_exclude: PathBuf,
    excludes_file: Option<PathBuf>,
    /// Rules of each kept directory that has a `.gitignore`, by relative directory.
    per_dir: HashMap<PathBuf, Arc<Patterns>>,
    repo_rules: Vec<Arc<Patterns>>,
    /// `core.ignoreCase`.
    ignore_case: bool,
    /// The sparse-checkout patterns when `core.sparseCheckout` is on: `git add -A` adds no
    /// untracked path outside them.
    sparse: Option<Arc<Patterns>>,
}

/// One version of the rules, as the watch stage hands it on with a batch. A newer version
/// (a higher `generation`) wins when batches merge.
#[derive(Clone)]
pub(crate) struct Rules {
    pub(crate) filter: Arc<Filter>,
    pub(crate) generation: u64,
}

impl Rules {
    pub(crate) fn new(filter: Filter) -> Self {
        Self {
            filter: Arc::new(filter),
            generation: 0,
        }
    }

    /// The rules to change: a copy when a batch still holds this version.
    pub(crate) fn make_mut(&mut self) -> &mut Filter {
        self.generation += 1;
        Arc::make_mut(&mut self.filter)
    }

    /// The newer of the two.
    pub(crate) fn newest(self, other: Rules) -> Rules {
        if other.generation > self.generation {
            other
        } else {
            self
        }
    }
}

impl PartialEq for Rules {
    fn eq(&self, other: &Self) -> bool {
        self.generation == other.generation && Arc::ptr_eq(&self.filter, &other.filter)
    }
}

impl Eq for Rules {}

impl std::fmt::Debug for Rules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Rules(v{})", self.generation)
    }
}

/// What a directory's listing says of its `.gitignore`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listed {
    /// The listing has no entry of that name.
    Absent,
    /// It has one (of any type), or the directory could not be listed.
    Named,
}

impl Filter {
    /// Rules from the repository files only; call [`Filter::load_dir`] for each directory as a
    /// top-down walk reaches it.
    pub fn new(
        workdir: &Path,
        git_dir: &Path,
        excludes_file: Option<PathBuf>,
        ignore_case: bool,
    ) -> (Self, Vec<RuleWarning>) {
        let mut filter = Self {
            workdir: workdir.to_owned(),
            git_dir: git_dir.to_owned(),
            info_exclude: crate::layout::info_exclude(git_dir),
            excludes_file,
            per_dir: HashMap::new(),
            repo_rules: Vec::new(),
            ignore_case,
            sparse: None,
        };
        let warnings = filter.reload_repo_rules();
        (filter, warnings)
    }

    /// Re-reads `.git/info/exclude`, `core.excludesFile` and the sparse-checkout patterns.
    pub(crate) fn reload_repo_rules(&mut self) -> Vec<RuleWarning> {
        let mut warnings = Vec::new();
        // `git sparse-checkout` writes the setting to `config.worktree` when it can.
        let sparse_on = ["config.worktree", "config"]
            .iter()
            .find_map(|file| {
                let path = self.git_dir.join(file);
                path.is_file()
                    .then(|| {
                        git2::Config::open(&path).and_then(|c| c.get_bool("core.sparseCheckout"))
                    })
                    .and_then(Result::ok)
            })
            .unwrap_or(false);
        self.sparse = if sparse_on {
            read_rules(
                &self.sparse_file(),
                Path::new(""),
                Follow::Yes,
                &mut warnings,
            )
            .map(Arc::new)
        } else {
            None
        };
        // Checked nearest first: `info/exclude`, then `core.excludesFile`.
        let files = [Some(self.info_exclude.clone()), self.excludes_file.clone()];
        self.repo_rules = files
            .into_iter()
            .flatten()
            .filter_map(|file| read_rules(&file, Path::new(""), Follow::Yes, &mut warnings))
            .map(Arc::new)
            .collect();
        warnings
    }

    /// (Re-)reads `dir/.gitignore`; a missing file drops the directory's rules.
    pub fn load_dir(&mut self, dir: &Path) -> Vec<RuleWarning> {
        let mut warnings = Vec::new();
        let file = self.workdir.join(dir).join(".gitignore");
        match read_rules(&file, dir, Follow::No, &mut warnings) {
            Some(rules) => {
                self.per_dir.insert(dir.to_owned(), Arc::new(rules));
            }
            None => {
                self.per_dir.remove(dir);
            }
        }
        warnings
    }

    /// The rules of `dir` as a walk that has just read it finds them: a listing that names no
    /// `.gitignore` drops them without opening anything (a kept directory rarely has one, and
    /// a failed open per directory was an eighth of start-up at 100k tracked files); one that
    /// names it, or a directory that could not be listed, reads it ([`Filter::load_dir`]).
    pub fn load_listed(&mut self, dir: &Path, gitignore: Listed) -> Vec<RuleWarning> {
        match gitignore {
            Listed::Absent => {
                self.per_dir.remove(dir);
                Vec::new()
            }
            Listed::Named => self.load_dir(dir),
        }
    }

    /// Whether `dir` has rules of its own now.
    pub(crate) fn has_rules(&self, dir: &Path) -> bool {
        self.per_dir.contains_key(dir)
    }

    /// Forgets the rules of `dir` and every directory below it (removed or now ignored).
    pub(crate) fn forget_below(&mut self, dir: &Path) {
        self.per_dir.retain(|d, _| !d.starts_with(dir));
    }

    /// Whether `dir` or a directory below it has rules of its own.
    pub(crate) fn has_rules_below(&self, dir: &Path) -> bool {
        self.per_dir.keys().any(|d| d.starts_with(dir))
    }

    /// Whether `rel` is ignored, assuming its parent directory is not.
    pub fn is_ignored(&self, rel: &Path, is_dir: bool) -> bool {
        match (rel.parent(), rel.file_name()) {
            (Some(dir), Some(name)) => self.dir_rules(dir).is_ignored(name, is_dir),
            _ => is_always_ignored(rel),
        }
    }

    /// The rules that judge the entries of the kept directory `dir`, looked up once for all of
    /// them (a walk judges a whole listing with it); [`Filter::is_ignored`] judges one path
    /// with it.
    pub fn dir_rules(&self, dir: &Path) -> DirRules<'_> {
        let chain = dir
            .ancestors()
            .filter_map(|d| self.per_dir.get(d))
            .map(Arc::as_ref)
            .collect();
        let mut rel = dir.as_os_str().as_bytes().to_vec();
        if !rel.is_empty() {
            rel.push(b'/');
        }
        DirRules {
            chain,
            repo_rules: &self.repo_rules,
            dir_always_ignored: dir.components().any(|c| c.as_os_str() == ".git"),
            dir_len: rel.len(),
            rel,
            ignore_case: self.ignore_case,
        }
    }

    /// Whether an untracked `rel` lies outside the sparse checkout, where `git add -A` adds
    /// nothing: the nearest of it and its directories that a pattern matches decides.
    pub(crate) fn outside_sparse(&self, rel: &Path, is_dir: bool) -> bool {
        let Some(sparse) = &self.sparse else {
            return false;
        };
        let mut path = Some(rel);
        let mut dir = is_dir;
        while let Some(p) = path.filter(|p| !p.as_os_str().is_empty()) {
            if let Some(included) = sparse.decide(p.as_os_str().as_bytes(), dir, self.ignore_case) {
                return !included;
            }
            path = p.parent();
            dir = true;
        }
        true
    }

    fn sparse_file(&self) -> PathBuf {
        self.git_dir.join("info").join("sparse-checkout")
    }

    /// Whether `rel` and every directory above it are kept: the check for a path that did not
    /// come from a top-down walk.
    pub fn is_kept(&self, rel: &Path, is_dir: bool) -> bool {
        let ancestors_kept = rel
            .ancestors()
            .skip(1)
            .filter(|a| !a.as_os_str().is_empty())
            .all(|a| !self.is_ignored(a, true));
        ancestors_kept && !self.is_ignored(rel, is_dir)
    }

    /// Which rules file `abs` is, if any.
    pub(crate) fn rules_file(&self, rel: Option<&Path>, abs: &Path) -> Option<RulesFile> {
        if abs == self.info_exclude
            || abs == self.sparse_file()
            || self.excludes_file.as_deref() == Some(abs)
        {
            return Some(RulesFile::Repo);
        }
        let rel = rel?;
        if rel.file_name()? == ".gitignore" {
            return Some(RulesFile::Dir(
                rel.parent().unwrap_or(Path::new("")).to_owned(),
            ));
        }
        None
    }

    pub(crate) fn excludes_file(&self) -> Option<&Path> {
        self.excludes_file.as_deref()
    }
}

/// Tracked paths a rule matches (not skip-worktree ones): git keeps updating them, so the
/// watch stage watches their directories. The stage finds them and sends each new set on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TrackedIgnored {
    paths: BTreeSet<PathBuf>,
}

impl TrackedIgnored {
    /// Whether `rel` is tracked although ignored (git keeps updating it).
    pub(crate) fn contains(&self, rel: &Path) -> bool {
        self.paths.contains(rel)
    }

    /// Whether `dir` is, or holds, a tracked path that is ignored: such a directory is watched.
    pub(crate) fn holds(&self, dir: &Path) -> bool {
        self.paths
            .range(dir.to_owned()..)
            .next()
            .is_some_and(|p| p.starts_with(dir))
    }

    /// Replaces the tracked ignored paths at or under `scope` (everything for the empty path)
    /// by `paths`. Returns whether the set changed.
    pub(crate) fn set(&mut self, scope: &Path, paths: Vec<PathBuf>) -> bool {
        let before: Vec<PathBuf> = self
            .paths
            .range(scope.to_owned()..)
            .take_while(|p| p.starts_with(scope))
            .cloned()
            .collect();
        let mut after = paths;
        after.sort();
        after.dedup();
        if before == after {
            return false;
        }
        for p in before {
            self.paths.remove(&p);
        }
        self.paths.extend(after);
        true
    }
}

/// The rules of one directory's entries ([`Filter::dir_rules`]): its own `.gitignore` and
/// those of the directories above it, nearest first, then the repository's.
pub struct DirRules<'a> {
    chain: Vec<&'a Patterns>,
    repo_rules: &'a [Arc<Patterns>],
    dir_always_ignored: bool,
    /// The directory's path from the top with a trailing `/` (empty for the top); each
    /// entry's name is put after it.
    rel: Vec<u8>,
    dir_len: usize,
    ignore_case: bool,
}

impl DirRules<'_> {
    /// Whether the entry `name` of the directory is ignored, assuming the directory is not.
    pub fn is_ignored(&mut self, name: &OsStr, is_dir: bool) -> bool {
        if self.dir_always_ignored || name == ".git" || name.to_str().is_some_and(is_env_file_name)
        {
            return true;
        }
        self.rel.truncate(self.dir_len);
        self.rel.extend_from_slice(name.as_bytes());
        let (rel, ignore_case) = (&self.rel, self.ignore_case);
        self.chain
            .iter()
            .copied()
            .chain(self.repo_rules.iter().map(Arc::as_ref))
            .find_map(|rules| rules.decide(rel, is_dir, ignore_case))
            .unwrap_or(false)
    }
}

/// `.git` at any depth, and env files: never saved, even when tracked.
pub(crate) fn is_always_ignored(rel: &Path) -> bool {
    rel.components().any(|c| c.as_os_str() == ".git")
        || rel
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(is_env_file_name)
}

/// Whether a rules file may be a symbolic link.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Follow {
    Yes,
    /// An in-tree `.gitignore`: git opens it with `O_NOFOLLOW`.
    No,
}

/// The patterns of `file`, for paths under `dir` (relative to the top). A missing file has
/// none; one git would not read (a symbolic link in the tree, unreadable) has none and a
/// warning says so.
fn read_rules(
    file: &Path,
    dir: &Path,
    follow: Follow,
    warnings: &mut Vec<RuleWarning>,
) -> Option<Patterns> {
    if follow == Follow::No
        && std::fs::symlink_metadata(file).is_ok_and(|m| m.file_type().is_symlink())
    {
        warnings.push(RuleWarning(format!(
            "{}: a symbolic link, which git does not follow for a .gitignore; its rules do not apply",
            file.display()
        )));
        return None;
    }
    match std::fs::read(file) {
        Ok(bytes) => Some(Patterns::parse(&bytes, dir.as_os_str().as_bytes())),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
            ) =>
        {
            None
        }
        Err(e) => {
            warnings.push(RuleWarning(format!(
                "{}: cannot be read, its rules do not apply: {e}",
                file.display()
            )));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn setup(files: &[(&str, &str)]) -> (tempfile::TempDir, Filter) {
        let dir = tempfile::tempdir().unwrap();
        let git = dir.path().join(".git");
        fs::create_dir_all(git.join("info")).unwrap();
        for (path, body) in files {
            let p = dir.path().join(path);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, body).unwrap();
        }
        let (mut filter, _) = Filter::new(dir.path(), &git, None, false);
        for d in ["", "a", "a/b", "c"] {
            filter.load_dir(Path::new(d));
        }
        (dir, filter)
    }

    #[test]
    fn git_precedence_and_forms() {
        let (_dir, filter) = setup(&[
            (".gitignore", "*.log\nbuild/\n/top-only\nnode_modules\n"),
            ("a/.gitignore", "!keep.log\nsecret\n"),
            ("a/b/.gitignore", "!secret\n"),
            (".git/info/exclude", "excluded\n"),
        ]);
        let check = |path: &str, is_dir: bool, ignored: bool| {
            assert_eq!(
                filter.is_kept(Path::new(path), is_dir),
                !ignored,
                "{path} (dir: {is_dir})"
            );
        };
        check("x.log", false, true);
        check("a/keep.log", false, false);
        check("a/other.log", false, true);
        check("build", true, true);
        check("build", false, false);
        check("top-only", false, true);
        check("a/top-only", false, false);
        check("a/secret", false, true);
        check("a/b/secret", false, false);
        check("node_modules", true, true);
        check("node_modules/x/y.js", false, true);
        check("excluded", false, true);
        check("a/excluded", false, true);
        check(".git", true, true);
        check("sub/.git", false, true);
        check(".env", false, true);
        check("a/.env", false, true);
        check(".env.local", false, true);
        check(".env.production", false, true);
        check("a/.env.development.local", false, true);
        check(".env.example", false, false);
        check(".env.sample", false, false);
        check(".envrc", false, false);
        check("src/main.rs", false, false);
    }

    #[test]
    fn a_negation_cannot_reach_into_an_ignored_directory() {
        let (_dir, filter) = setup(&[(".gitignore", "c/\n!c/file\n")]);
        assert!(!filter.is_kept(Path::new("c/file"), false));
    }

    #[test]
    fn braces_are_literal_and_an_unclosed_class_matches_nothing() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(".gitignore"), "*.{js,map}\n[abc\n*.tmp\n").unwrap();
        let (mut filter, _) = Filter::new(dir.path(), &dir.path().join(".git"), None, false);
        let warnings = filter.load_dir(Path::new(""));
        assert!(warnings.is_empty(), "{warnings:?}");
        assert!(filter.is_ignored(Path::new("x.tmp"), false));
        assert!(filter.is_ignored(Path::new("a.{js,map}"), false));
        assert!(!filter.is_ignored(Path::new("a.js"), false));
        assert!(!filter.is_ignored(Path::new("[abc"), false));
        assert!(!filter.is_ignored(Path::new("a"), false));
    }

    #[test]
    fn ignore_case_applies_to_every_rule() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(".gitignore"), "A.TXT\n").unwrap();
        for (ignore_case, ignored) in [(false, false), (true, true)] {
            let (mut filter, _) =
                Filter::new(dir.path(), &dir.path().join(".git"), None, ignore_case);
            filter.load_dir(Path::new(""));
            assert_eq!(filter.is_ignored(Path::new("a.txt"), false), ignored);
        }
    }

    #[test]
    fn rules_files_are_recognised() {
        let (dir, filter) = setup(&[]);
        assert_eq!(
            filter.rules_file(
                Some(Path::new("a/.gitignore")),
                &dir.path().join("a/.gitignore")
            ),
            Some(RulesFile::Dir(PathBuf::from("a")))
        );
        assert_eq!(
            filter.rules_file(None, &dir.path().join(".git/info/exclude")),
            Some(RulesFile::Repo)
        );
        assert_eq!(
            filter.rules_file(Some(Path::new("a/x")), &dir.path().join("a/x")),
            None
        );
    }
}
