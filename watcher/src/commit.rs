//! The commit: turns a staged tree into an autosave commit on `HEAD`, unless nothing changed.

use git2::{ObjectType, Oid, Repository, Signature, Tree, TreeEntry};
use shmastra_contract::save_message::{self, SUBJECT_WIDTH, SaveKind, one_line_path};

use crate::status::VERSION;

/// At most this many paths are named in a subject line (when they fit on it).
const LISTED_IN_SUBJECT: usize = 5;

/// The identity used when the repository configures none.
const FALLBACK_NAME: &str = "project-watcher";
const FALLBACK_EMAIL: &str = "project-watcher@localhost";

/// A commit that was made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    pub id: Oid,
    pub files_changed: usize,
}

/// The tree `HEAD` names (`None` for an unborn branch).
pub(crate) fn head_tree(repo: &Repository) -> Result<Option<Oid>, git2::Error> {
    match repo.head() {
        Ok(head) => Ok(Some(head.peel_to_commit()?.tree_id())),
        Err(e)
            if matches!(
                e.code(),
                git2::ErrorCode::UnbornBranch | git2::ErrorCode::NotFound
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
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
    let paths = changed_paths(repo, parent_tree.as_ref(), &new_tree)?;
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

/// The paths whose blob, mode or gitlink differs between `old` (none: the empty tree) and
/// `new`, in git's order, as `git diff-tree -r --name-only` lists them: the two trees are
/// walked side by side and a subtree whose id did not change is skipped whole, so the cost
/// grows with the change, not with the tree (libgit2's tree-to-tree diff reads every tree of
/// both). A path that changed type (a file that became a symlink) is listed once; a file that
/// became a directory lists the file and every path below the directory.
pub fn changed_paths(
    repo: &Repository,
    old: Option<&Tree<'_>>,
    new: &Tree<'_>,
) -> Result<Vec<String>, git2::Error> {
    let mut paths = Vec::new();
    diff_trees(repo, old, Some(new), &mut Vec::new(), &mut paths)?;
    Ok(paths.iter().map(|p| one_line_path(p)).collect())
}

/// An entry's place in git's tree order: its name, with a `/` after a directory's.
fn sort_key(entry: &TreeEntry<'_>) -> Vec<u8> {
    let mut key = entry.name_bytes().to_vec();
    if entry.kind() == Some(ObjectType::Tree) {
        key.push(b'/');
    }
    key
}

/// Appends to `out` the paths (under `prefix`) that differ between `old` and `new`.
fn diff_trees(
    repo: &Repository,
    old: Option<&Tree<'_>>,
    new: Option<&Tree<'_>>,
    prefix: &mut Vec<u8>,
    out: &mut Vec<Vec<u8>>,
) -> Result<(), git2::Error> {
    let mut old_entries = old.into_iter().flat_map(Tree::iter).peekable();
    let mut new_entries = new.into_iter().flat_map(Tree::iter).peekable();
    loop {
        let order = match (old_entries.peek(), new_entries.peek()) {
            (None, None) => return Ok(()),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (Some(o), Some(n)) => sort_key(o).cmp(&sort_key(n)),
        };
        let (before, after) = match order {
            std::cmp::Ordering::Less => (old_entries.next(), None),
            std::cmp::Ordering::Greater => (None, new_entries.next()),
            std::cmp::Ordering::Equal => (old_entries.next(), new_entries.next()),
        };
        if let (Some(b), Some(a)) = (&before, &after)
            && b.id() == a.id()
            && b.filemode() == a.filemode()
        {
            continue;
        }
        let entry = after.as_ref().or(before.as_ref()).expect("one side has it");
        let len = prefix.len();
        prefix.extend_from_slice(entry.name_bytes());
        if entry.kind() == Some(ObjectType::Tree) {
            let tree =
                |e: &Option<TreeEntry<'_>>| e.as_ref().map(|e| repo.find_tree(e.id())).transpose();
            let (before, after) = (tree(&before)?, tree(&after)?);
            prefix.push(b'/');
            diff_trees(repo, before.as_ref(), after.as_ref(), prefix, out)?;
        } else {
            out.push(prefix.clone());
        }
        prefix.truncate(len);
    }
}

/// `autosave: <what changed>`, the first paths, and the trailers.
pub fn message(paths: &[String]) -> String {
    let subject = format!("{}: {}", SaveKind::Autosave, describe_paths(paths));
    message_with(&subject, SaveKind::Autosave, paths, &[])
}

/// A whole message of this watcher (its version in the `Saved-by` trailer), as the contract
/// writes it: `subject`, the listed `paths`, the trailers and `extra` ones.
pub fn message_with(
    subject: &str,
    kind: SaveKind,
    paths: &[String],
    extra: &[(&str, String)],
) -> String {
    save_message::render(subject, kind, VERSION, paths, extra)
}

/// What changed, for a subject line: the paths when they fit on one line (a single long path
/// keeps its end: `.../agents/weather.ts`), else the count and the folder they share
/// (`14 files in src/tools`).
pub fn describe_paths(paths: &[String]) -> String {
    let room = SUBJECT_WIDTH - "autosave: ".len();
    match paths {
        [] => "no files".to_owned(),
        [only] => shorten_start(only, room),
        _ => {
            let listed = paths.join(", ");
            if paths.len() <= LISTED_IN_SUBJECT && listed.chars().count() <= room {
                return listed;
            }
            match common_folder(paths) {
                Some(folder) => {
                    let head = format!("{} files in ", paths.len());
                    format!("{head}{}", shorten_start(&folder, room - head.len()))
                }
                None => format!("{} files", paths.len()),
            }
        }
    }
}

/// The deepest folder holding every path, if they share one.
fn common_folder(paths: &[String]) -> Option<String> {
    let folders = |p: &String| -> Vec<String> {
        let mut parts: Vec<String> = p.split('/').map(str::to_owned).collect();
        parts.pop();
        parts
    };
    let mut common = folders(&paths[0]);
    for path in &paths[1..] {
        let other = folders(path);
        let same = common
            .iter()
            .zip(&other)
            .take_while(|(a, b)| a == b)
            .count();
        common.truncate(same);
    }
    (!common.is_empty()).then(|| common.join("/"))
}

/// `text` cut to `width` characters, keeping its end behind `...` (the file name matters most).
fn shorten_start(text: &str, width: usize) -> String {
    let count = text.chars().count();
    if count <= width {
        return text.to_owned();
    }
    let keep = width.saturating_sub(3);
    let tail: String = text.chars().skip(count - keep).collect();
    format!("...{tail}")
}

/// The paths a diff touches, each as one line of text ([`one_line_path`]).
pub fn diff_paths(diff: &git2::Diff<'_>) -> Vec<String> {
    diff.deltas()
        .filter_map(|d| {
            d.new_file()
                .path_bytes()
                .or(d.old_file().path_bytes())
                .map(one_line_path)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_autosave_message_lists_its_paths_and_names_this_watcher() {
        let paths: Vec<String> = (0..25).map(|i| format!("src/tools/f{i}")).collect();
        let m = message(&paths);
        assert!(
            m.starts_with("autosave: 25 files in src/tools\n\nsrc/tools/f0\n"),
            "{m}"
        );
        assert!(
            m.ends_with(&format!(
                "\n\nSaved-by: project-watcher/{VERSION}\nSave-kind: autosave\n"
            )),
            "{m}"
        );
        assert_eq!(save_message::classify(&m), Some(SaveKind::Autosave));
    }

    #[test]
    fn subjects_name_few_paths_and_count_many() {
        let check = |paths: &[&str], expected: &str| {
            let paths: Vec<String> = paths.iter().map(|p| (*p).to_owned()).collect();
            let subject = message(&paths).lines().next().unwrap().to_owned();
            assert_eq!(subject, expected, "{paths:?}");
            assert!(subject.chars().count() <= SUBJECT_WIDTH, "{subject}");
        };
        check(
            &["src/agents/weather.ts"],
            "autosave: src/agents/weather.ts",
        );
        check(&["a.ts", "b.ts"], "autosave: a.ts, b.ts");
        check(&["a", "b", "c"], "autosave: a, b, c");
        check(&["a", "b", "c", "d", "e"], "autosave: a, b, c, d, e");
        check(
            &["src/a", "src/b", "src/c", "src/d", "src/e", "src/f"],
            "autosave: 6 files in src",
        );
        check(
            &[
                "src/tools/x/a.ts",
                "src/tools/b.ts",
                "src/tools/y/c.ts",
                "src/tools/d.ts",
                "src/tools/registry/of/every/tool/e.ts",
            ],
            "autosave: 5 files in src/tools",
        );
        check(&["a", "b", "c", "d", "e", "f"], "autosave: 6 files");
        check(
            &["x/a", "y/b", "y/c", "y/d", "y/e", "y/f"],
            "autosave: 6 files",
        );
        let long = format!("{}/weather.ts", "deep".repeat(30));
        let subject = message(std::slice::from_ref(&long))
            .lines()
            .next()
            .unwrap()
            .to_owned();
        assert!(subject.starts_with("autosave: ..."), "{subject}");
        assert!(subject.ends_with("deep/weather.ts"), "{subject}");
        assert_eq!(subject.chars().count(), SUBJECT_WIDTH);
        let two_long = [format!("{long}1"), format!("{long}2")];
        check(
            &[two_long[0].as_str(), two_long[1].as_str()],
            &format!(
                "autosave: 2 files in {}",
                shorten_start(&"deep".repeat(30), SUBJECT_WIDTH - 21)
            ),
        );
    }

    /// Paths that collide every way a tree can: a file and a directory of one name, names that
    /// sort around `/` (`a.b`, `a-b`, `a0`), a name with a newline, depth.
    const UNIVERSE: [&str; 11] = [
        "a",
        "a/b",
        "a/c/d",
        "a.b",
        "a-b",
        "a0",
        "b/x",
        "b/y/z",
        "b/y/zz",
        "c",
        "new\nline",
    ];

    /// One version of a tree: for each path of [`UNIVERSE`], absent or `(kind, content)` with
    /// kind 0 a file, 1 an executable, 2 a symlink, 3 a gitlink.
    fn version() -> impl proptest::strategy::Strategy<Value = Vec<Option<(u8, u8)>>> {
        proptest::collection::vec(proptest::option::of((0u8..4, 0u8..3)), UNIVERSE.len())
    }

    /// The tree of `version` (a path under one that is kept as a file is left out).
    fn build(repo: &Repository, version: &[Option<(u8, u8)>]) -> Oid {
        let mut index = git2::Index::new().unwrap();
        let mut files: Vec<&str> = Vec::new();
        for (path, entry) in UNIVERSE.iter().zip(version) {
            let Some((kind, content)) = entry else {
                continue;
            };
            if files
                .iter()
                .any(|f| path.starts_with(&format!("{f}/")) || f.starts_with(&format!("{path}/")))
            {
                continue;
            }
            files.push(path);
            let (mode, id) = match kind {
                3 => (
                    0o160000,
                    Oid::hash_object(git2::ObjectType::Commit, &[*content]).unwrap(),
                ),
                _ => {
                    let mode = [0o100644, 0o100755, 0o120000][*kind as usize];
                    (mode, repo.blob(format!("{content}\n").as_bytes()).unwrap())
                }
            };
            index
                .add(&git2::IndexEntry {
                    ctime: git2::IndexTime::new(0, 0),
                    mtime: git2::IndexTime::new(0, 0),
                    dev: 0,
                    ino: 0,
                    mode,
                    uid: 0,
                    gid: 0,
                    file_size: 0,
                    id,
                    flags: 0,
                    flags_extended: 0,
                    path: path.as_bytes().to_vec(),
                })
                .unwrap();
        }
        index.write_tree_to(repo).unwrap()
    }

    /// Differential: for generated pairs of trees, the paths the commit message lists are
    /// those real git's `git diff-tree -r --name-only` lists, in its order.
    #[test]
    fn changed_paths_are_those_git_diff_tree_lists() {
        use proptest::test_runner::{Config, TestRunner};
        let cases = std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(64);
        let tmp = tempfile::tempdir().unwrap();
        testkit::git::init_repo(tmp.path());
        let repo = Repository::open(tmp.path()).unwrap();
        let checked = std::cell::Cell::new(0u32);
        let mut runner = TestRunner::new(Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        });
        runner
            .run(&(version(), version()), |(old, new)| {
                let (old, new) = (build(&repo, &old), build(&repo, &new));
                let out = testkit::git::git_output(
                    tmp.path(),
                    [
                        "diff-tree",
                        "-r",
                        "--name-only",
                        "-z",
                        &old.to_string(),
                        &new.to_string(),
                    ],
                );
                proptest::prop_assert!(out.status.success());
                let expected: Vec<String> = out
                    .stdout
                    .split(|b| *b == 0)
                    .filter(|p| !p.is_empty())
                    .map(one_line_path)
                    .collect();
                let old = repo.find_tree(old).unwrap();
                let new = repo.find_tree(new).unwrap();
                proptest::prop_assert_eq!(
                    changed_paths(&repo, Some(&old), &new).unwrap(),
                    expected
                );
                checked.set(checked.get() + 1);
                Ok(())
            })
            .unwrap();
        assert_eq!(checked.get(), cases, "every case reached the oracle");
        let empty = repo.find_tree(build(&repo, &[])).unwrap();
        let all = repo
            .find_tree(build(&repo, &[Some((0, 0)); UNIVERSE.len()]))
            .unwrap();
        assert_eq!(
            changed_paths(&repo, None, &all).unwrap(),
            changed_paths(&repo, Some(&empty), &all).unwrap(),
            "no parent is the empty tree"
        );
    }
}
