//! Git's ignore rules: which paths of the working tree `git add -A` would consider.
//!
//! Precedence is git's: the `.gitignore` nearest to the path wins over those above it, then
//! `.git/info/exclude`, then `core.excludesFile`; inside one file the last matching line wins.
//! A path under an ignored directory is ignored whatever its own rules say, which is why
//! callers walk top-down and never ask about the children of an ignored directory.
//! On top of git's rules, `.git` is always ignored and so is anything named `.env`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use ignore::Match;
use ignore::gitignore::{Gitignore, GitignoreBuilder};

/// The file name that is never committed, whatever `.gitignore` says.
pub const ENV_FILE: &str = ".env";

/// Which rules file a path is, when it is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RulesFile {
    /// A `.gitignore` in this directory (relative to the working tree; empty for the root).
    Dir(PathBuf),
    /// `.git/info/exclude` or `core.excludesFile`.
    Repo,
}

/// A rules file line that could not be read; the other lines still apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleWarning(pub String);

pub struct Filter {
    workdir: PathBuf,
    info_exclude: PathBuf,
    excludes_file: Option<PathBuf>,
    /// Rules of each kept directory that has a `.gitignore`, by relative directory.
    per_dir: HashMap<PathBuf, Gitignore>,
    repo_rules: Vec<Gitignore>,
}

impl Filter {
    /// Rules from the repository files only; call [`Filter::load_dir`] for each directory as a
    /// top-down walk reaches it.
    pub fn new(
        workdir: &Path,
        git_dir: &Path,
        excludes_file: Option<PathBuf>,
    ) -> (Self, Vec<RuleWarning>) {
        let mut filter = Self {
            workdir: workdir.to_owned(),
            info_exclude: git_dir.join("info").join("exclude"),
            excludes_file,
            per_dir: HashMap::new(),
            repo_rules: Vec::new(),
        };
        let warnings = filter.reload_repo_rules();
        (filter, warnings)
    }

    /// Re-reads `.git/info/exclude` and `core.excludesFile`.
    pub fn reload_repo_rules(&mut self) -> Vec<RuleWarning> {
        let mut warnings = Vec::new();
        let files = [Some(self.info_exclude.clone()), self.excludes_file.clone()];
        self.repo_rules = files
            .into_iter()
            .flatten()
            .filter_map(|file| read_rules(&self.workdir, &file, &mut warnings))
            .collect();
        warnings
    }

    /// (Re-)reads `dir/.gitignore`; a missing file drops the directory's rules.
    pub fn load_dir(&mut self, dir: &Path) -> Vec<RuleWarning> {
        let mut warnings = Vec::new();
        let file = self.workdir.join(dir).join(".gitignore");
        match read_rules(&self.workdir.join(dir), &file, &mut warnings) {
            Some(rules) => {
                self.per_dir.insert(dir.to_owned(), rules);
            }
            None => {
                self.per_dir.remove(dir);
            }
        }
        warnings
    }

    /// Forgets the rules of `dir` and every directory below it (removed or now ignored).
    pub fn forget_below(&mut self, dir: &Path) {
        self.per_dir.retain(|d, _| !d.starts_with(dir));
    }

    /// Whether `rel` is ignored, assuming its parent directory is not.
    pub fn is_ignored(&self, rel: &Path, is_dir: bool) -> bool {
        if is_always_ignored(rel) {
            return true;
        }
        let abs = self.workdir.join(rel);
        let mut dir = rel.parent();
        while let Some(d) = dir {
            if let Some(rules) = self.per_dir.get(d) {
                match rules.matched(&abs, is_dir) {
                    Match::Ignore(_) => return true,
                    Match::Whitelist(_) => return false,
                    Match::None => {}
                }
            }
            dir = d.parent();
        }
        for rules in &self.repo_rules {
            match rules.matched(&abs, is_dir) {
                Match::Ignore(_) => return true,
                Match::Whitelist(_) => return false,
                Match::None => {}
            }
        }
        false
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
    pub fn rules_file(&self, rel: Option<&Path>, abs: &Path) -> Option<RulesFile> {
        if abs == self.info_exclude || self.excludes_file.as_deref() == Some(abs) {
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

    pub fn excludes_file(&self) -> Option<&Path> {
        self.excludes_file.as_deref()
    }
}

/// `.git` at any depth, and `.env` files.
fn is_always_ignored(rel: &Path) -> bool {
    rel.components().any(|c| c.as_os_str() == ".git")
        || rel.file_name().is_some_and(|n| n == ENV_FILE)
}

fn read_rules(root: &Path, file: &Path, warnings: &mut Vec<RuleWarning>) -> Option<Gitignore> {
    if !file.is_file() {
        return None;
    }
    let mut builder = GitignoreBuilder::new(root);
    if let Some(err) = builder.add(file) {
        warnings.push(RuleWarning(format!(
            "{}: some lines were skipped: {err}",
            file.display()
        )));
    }
    match builder.build() {
        Ok(rules) => Some(rules),
        Err(err) => {
            warnings.push(RuleWarning(format!(
                "{}: rules not used: {err}",
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
        let (mut filter, _) = Filter::new(dir.path(), &git, None);
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
        check("src/main.rs", false, false);
    }

    #[test]
    fn a_negation_cannot_reach_into_an_ignored_directory() {
        let (_dir, filter) = setup(&[(".gitignore", "c/\n!c/file\n")]);
        assert!(!filter.is_kept(Path::new("c/file"), false));
    }

    #[test]
    fn a_malformed_line_is_reported_and_the_rest_still_applies() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(".gitignore"), "a{b\n*.tmp\n").unwrap();
        let (mut filter, _) = Filter::new(dir.path(), &dir.path().join(".git"), None);
        let warnings = filter.load_dir(Path::new(""));
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(filter.is_ignored(Path::new("x.tmp"), false));
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
