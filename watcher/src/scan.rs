//! Top-down walks of the working tree that never enter an ignored directory (but for the
//! tracked paths it holds) or a symlink: the start-up pass (one walk for the watches and the
//! first save), rescans, and new directories. Entry types come from what `readdir` returns
//! (`d_type`); only files and symlinks get an `lstat`, for the stat data the index compares.

use std::collections::HashSet;
use std::fs::{self, FileType, Metadata};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use crate::filter::{Filter, Listed, RuleWarning};

/// What a kept non-directory entry is, as `git add -A` sees it.
#[derive(Debug, Clone)]
pub enum EntryKind {
    /// A regular file or a symlink (committed as a link, never followed), with its `lstat`.
    File(Metadata),
    /// A directory holding a repository of its own and nothing tracked: recorded as a
    /// gitlink, not entered.
    NestedRepo,
    /// A directory the index holds as a gitlink (a submodule), checked out or not.
    Gitlink,
}

/// What the index holds at or under a directory, which decides how `git add -A` walks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirInIndex {
    /// A gitlink: never entered, whatever the directory holds.
    Gitlink,
    /// Tracked paths below it: entered even when it holds a repository of its own.
    Tracked,
    /// Nothing: a repository there is a new gitlink, anything else is entered.
    Untracked,
}

/// A directory that holds a repository of its own, as git decides it: a `.git` directory with
/// `objects/`, `refs/` and a valid `HEAD`, or a `.git` file (`gitdir: PATH`) pointing at one.
/// A garbage `.git` file or an empty `.git` directory does not count: git walks into those.
pub fn is_nested_repo(abs_dir: &Path) -> bool {
    let dot_git = abs_dir.join(".git");
    let Ok(meta) = fs::symlink_metadata(&dot_git) else {
        return false;
    };
    if meta.is_dir() {
        return is_git_dir(&dot_git);
    }
    if !meta.is_file() {
        return false;
    }
    let Ok(text) = fs::read_to_string(&dot_git) else {
        return false;
    };
    let Some(target) = text.strip_prefix("gitdir: ") else {
        return false;
    };
    is_git_dir(&abs_dir.join(target.trim_end_matches(['\n', '\r'])))
}

/// git's `is_git_directory`: `objects/` and `refs/` directories and a `HEAD` that is a
/// symbolic ref under `refs/` or an object id.
fn is_git_dir(dir: &Path) -> bool {
    let is_dir = |name: &str| fs::metadata(dir.join(name)).is_ok_and(|m| m.is_dir());
    if !is_dir("objects") || !is_dir("refs") {
        return false;
    }
    let Ok(head) = fs::read_to_string(dir.join("HEAD")) else {
        return false;
    };
    let head = head.trim_end();
    head.strip_prefix("ref:")
        .is_some_and(|r| r.trim_start().starts_with("refs/"))
        || (head.len() >= 40 && head.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The directory side of a walk: the rules, what is done with each directory before it is
/// read (the watch stage watches it), and its `.gitignore` loaded once it is read.
pub trait Dirs {
    fn rules(&self) -> &Filter;

    /// A directory about to be read, or a nested repository's `.git`, which is never read (a
    /// commit inside it shows only there): the watch stage watches it; nothing by default.
    fn enter(&mut self, _dir: &Path) {}

    /// `dir` was read (or could not be): its rules, as its listing names a `.gitignore`, are
    /// loaded before its entries are judged.
    fn load_rules(&mut self, dir: &Path, gitignore: Listed);

    /// Whether the walk also goes where only watches are needed: into nested repositories and
    /// gitlinks, and into ignored directories that hold a tracked path.
    fn watching(&self) -> bool {
        false
    }

    /// Whether `dir` holds a tracked path the rules ignore (watched, though ignored).
    fn holds_tracked_ignored(&self, _dir: &Path) -> bool {
        false
    }
}

/// A batch's rules for the stage's walks, each directory's `.gitignore` read again as the walk
/// enters it (as `git add -A` reads it then), and nothing watched: a directory moved in after
/// the batch's snapshot was taken (a subtree walked from its parent) is judged by the rules it
/// holds, not by none. The snapshot is copied once, at the first directory; the watch stage
/// reports the rules files' warnings, so these are dropped.
pub struct Fresh(pub Arc<Filter>);

impl Dirs for Fresh {
    fn rules(&self) -> &Filter {
        &self.0
    }

    fn load_rules(&mut self, dir: &Path, gitignore: Listed) {
        if gitignore == Listed::Absent && !self.0.has_rules(dir) {
            return;
        }
        Arc::make_mut(&mut self.0).load_listed(dir, gitignore);
    }
}

/// Rules loaded on the way down every directory a watch would need, and nothing watched:
/// `once`, which has no watch stage, loads its rules with it before its save.
pub struct LoadRules<'a> {
    pub filter: &'a mut Filter,
    pub warnings: Vec<RuleWarning>,
}

impl Dirs for LoadRules<'_> {
    fn rules(&self) -> &Filter {
        self.filter
    }

    fn load_rules(&mut self, dir: &Path, gitignore: Listed) {
        self.warnings
            .extend(self.filter.load_listed(dir, gitignore));
    }

    fn watching(&self) -> bool {
        true
    }
}

/// The entry side of a walk: what `git add -A` would consider, handed over as it is found.
pub trait Entries {
    /// What the index holds under a directory.
    fn in_index(&self, dir: &Path) -> DirInIndex;

    /// A kept file or symlink (with its `lstat`), nested repository or gitlink.
    fn found(&mut self, rel: PathBuf, kind: EntryKind);

    /// A directory that could not be read (what was saved of it stands: unreadable is not gone).
    fn unreadable(&mut self, dir: PathBuf);
}

/// A walk for the watches alone.
pub struct NoEntries;

impl Entries for NoEntries {
    fn in_index(&self, _dir: &Path) -> DirInIndex {
        DirInIndex::Untracked
    }

    fn found(&mut self, _rel: PathBuf, _kind: EntryKind) {}

    fn unreadable(&mut self, _dir: PathBuf) {}
}

/// One top-down walk from `start` (itself included) that serves both sides: every directory
/// `dirs` needs is entered (and `dirs.enter` sees it before it is read, so its `.gitignore`
/// applies to its children), and when `staged`, every kept entry below `start` goes to
/// `entries`. Later walks are for one side; the start-up pass splits the two sides over two
/// threads instead ([`walk_listings`], [`stage_listings`]). Entries are handed over one
/// directory at a time: nothing per file is kept past its directory.
///
/// An ignored directory is entered (for the watches) only for the tracked paths it holds;
/// whatever else is below it stays ignored, whatever its own name. Nested repositories are
/// entered for the watches too, and their own `.git` is entered (watched) but not read;
/// whether such a directory is a gitlink or loose files depends on the index, which
/// `entries.in_index` says.
pub fn walk<D, E>(workdir: &Path, start: &Path, staged: bool, dirs: &mut D, entries: &mut E)
where
    D: Dirs + ?Sized,
    E: Entries + ?Sized,
{
    let watching = dirs.watching();
    let start_ignored = !start.as_os_str().is_empty() && !dirs.rules().is_kept(start, true);
    let mut stack = vec![(start.to_owned(), start_ignored, staged && !start_ignored)];
    while let Some((dir, inside_ignored, staged)) = stack.pop() {
        let Some(judged) = read_judged(workdir, &dir, inside_ignored, staged, dirs) else {
            if staged {
                entries.unreadable(dir);
            }
            continue;
        };
        for (rel, ignored) in judged.dirs {
            let stage_it = staged && !ignored && stage_dir(workdir, &rel, dirs.rules(), entries);
            let watch_it = watching && (!ignored || dirs.holds_tracked_ignored(&rel));
            if stage_it || watch_it {
                stack.push((rel, ignored, stage_it));
            }
        }
        for (rel, meta) in judged.files {
            entries.found(rel, EntryKind::File(meta));
        }
    }
}

/// One directory as the start-up walk read it, for the stage on the other thread.
pub struct Listing {
    dir: PathBuf,
    /// `None`: it could not be read.
    judged: Option<Judged>,
}

/// How many listings go to the stage at once: each send may wake its thread, which mostly
/// waits for the walk.
const LISTINGS_SENT_TOGETHER: usize = 32;

/// How many directories' listings the start-up walk may read ahead of the stage comparing
/// them (the stage reads the index meanwhile); past it the walk waits, its memory bounded.
const LISTINGS_AHEAD: usize = 4096;

/// The channel from [`walk_listings`] to [`stage_listings`].
pub fn listings_channel() -> (SyncSender<Vec<Listing>>, Receiver<Vec<Listing>>) {
    sync_channel(LISTINGS_AHEAD / LISTINGS_SENT_TOGETHER)
}

/// The walk of the start-up pass, on a thread of its own: every directory `dirs` needs is
/// entered (watched) before it is read, and each listing goes to `listings` as it is read,
/// its entries judged by its rules and its kept files `lstat`ed, for [`stage_listings`] to
/// compare with the index on the save thread meanwhile (which reads the index first: the
/// two overlap). Whether a directory is staged depends on the index, which only the other
/// side has: a directory entered for the watches alone (a gitlink, a nested repository) is
/// listed as any other and dropped there. Once nobody receives, the walk goes on for the
/// watches alone.
pub fn walk_listings<D: Dirs + ?Sized>(
    workdir: &Path,
    dirs: &mut D,
    listings: &SyncSender<Vec<Listing>>,
) {
    let mut sending = true;
    let mut batch = Vec::with_capacity(LISTINGS_SENT_TOGETHER);
    let mut stack = vec![(PathBuf::new(), false)];
    while let Some((dir, inside_ignored)) = stack.pop() {
        let judged = read_judged(
            workdir,
            &dir,
            inside_ignored,
            sending && !inside_ignored,
            dirs,
        );
        if let Some(judged) = &judged {
            for (rel, ignored) in &judged.dirs {
                if !ignored || dirs.holds_tracked_ignored(rel) {
                    stack.push((rel.clone(), *ignored));
                }
            }
        }
        if sending {
            batch.push(Listing { dir, judged });
            if batch.len() == LISTINGS_SENT_TOGETHER || stack.is_empty() {
                let full =
                    std::mem::replace(&mut batch, Vec::with_capacity(LISTINGS_SENT_TOGETHER));
                sending = listings.send(full).is_ok();
            }
        }
    }
}

/// The stage's side of the start-up walk: the listings [`walk_listings`] sends, in the order
/// it read them (a directory before its subdirectories), judged against the index as
/// [`walk`] judges its own with `staged` from the top: a subdirectory is staged unless it is
/// ignored, a gitlink or a nested repository (`rules` says which are outside the sparse
/// checkout); the listings of directories not staged are dropped.
pub fn stage_listings<E: Entries + ?Sized>(
    workdir: &Path,
    listings: Receiver<Vec<Listing>>,
    rules: &Filter,
    entries: &mut E,
) {
    let mut staged: HashSet<PathBuf> = HashSet::from([PathBuf::new()]);
    for Listing { dir, judged } in listings.into_iter().flatten() {
        if !staged.remove(&dir) {
            continue;
        }
        let Some(judged) = judged else {
            entries.unreadable(dir);
            continue;
        };
        for (rel, ignored) in judged.dirs {
            if !ignored && stage_dir(workdir, &rel, rules, entries) {
                staged.insert(rel);
            }
        }
        for (rel, meta) in judged.files {
            entries.found(rel, EntryKind::File(meta));
        }
    }
}

/// A directory's listing judged by its rules: its subdirectories (each with whether it is
/// ignored; a nested repository's `.git` is entered for the watches, not listed) and, when
/// `files`, its kept files and symlinks with their `lstat` (tracked files outside a sparse
/// checkout are refreshed from the index, not here).
struct Judged {
    dirs: Vec<(PathBuf, bool)>,
    files: Vec<(PathBuf, Metadata)>,
}

/// Enters `dir` (`dirs.enter`: the watch before the read), reads it, loads its rules and
/// judges its entries; `None` when it cannot be read.
fn read_judged<D: Dirs + ?Sized>(
    workdir: &Path,
    dir: &Path,
    inside_ignored: bool,
    files: bool,
    dirs: &mut D,
) -> Option<Judged> {
    dirs.enter(dir);
    let listing = read_dir(workdir, dir);
    let gitignore = match &listing {
        Some(entries) if !entries.iter().any(|(rel, ..)| rel.ends_with(".gitignore")) => {
            Listed::Absent
        }
        _ => Listed::Named,
    };
    dirs.load_rules(dir, gitignore);
    let listing = listing?;
    let watching = dirs.watching();
    let mut judged = Judged {
        dirs: Vec::new(),
        files: Vec::new(),
    };
    // A nested repository's `.git` is entered after the listing, which is judged by the
    // rules of `dir` looked up once.
    let mut git_dirs = Vec::new();
    let mut rules = dirs.rules().dir_rules(dir);
    for (rel, file_type, entry) in listing {
        let Some(name) = rel.file_name() else {
            continue;
        };
        if file_type.is_dir() {
            if !dir.as_os_str().is_empty() && name == ".git" {
                if watching {
                    git_dirs.push(rel);
                }
                continue;
            }
            let ignored = inside_ignored || rules.is_ignored(name, true);
            judged.dirs.push((rel, ignored));
        } else if files
            && (file_type.is_file() || file_type.is_symlink())
            && !rules.is_ignored(name, false)
            && !dirs.rules().outside_sparse(&rel, false)
            && let Ok(meta) = entry.metadata()
        {
            judged.files.push((rel, meta));
        }
    }
    drop(rules);
    for git_dir in git_dirs {
        dirs.enter(&git_dir);
    }
    Some(judged)
}

/// Whether the kept directory `rel` of a staged directory is walked for the stage: not a
/// gitlink (handed over as one) nor, where the index holds nothing under it, a repository of
/// its own (handed over as a new gitlink unless outside the sparse checkout).
fn stage_dir<E: Entries + ?Sized>(
    workdir: &Path,
    rel: &Path,
    rules: &Filter,
    entries: &mut E,
) -> bool {
    match entries.in_index(rel) {
        DirInIndex::Gitlink => {
            entries.found(rel.to_owned(), EntryKind::Gitlink);
            false
        }
        DirInIndex::Untracked if is_nested_repo(&workdir.join(rel)) => {
            if !rules.outside_sparse(rel, true) {
                entries.found(rel.to_owned(), EntryKind::NestedRepo);
            }
            false
        }
        DirInIndex::Tracked | DirInIndex::Untracked => true,
    }
}

/// The entries of one directory with their type as `readdir` gives it (no `lstat` on the file
/// systems that fill `d_type`); a directory that vanished yields nothing (its removal arrives
/// as an event of its own), one that cannot be read `None`.
///
/// Each entry keeps its `DirEntry`, whose `metadata` is an `lstat` relative to the open
/// directory: the kernel resolves one name, not the whole path again.
fn read_dir(workdir: &Path, dir: &Path) -> Option<Vec<(PathBuf, FileType, fs::DirEntry)>> {
    let entries = match fs::read_dir(workdir.join(dir)) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Some(Vec::new()),
        Err(e) => {
            tracing::warn!(dir = %dir.display(), "cannot read directory, its last saved files are kept: {e}");
            return None;
        }
    };
    let entries = entries
        .flatten()
        .filter_map(|entry| {
            let file_type = entry.file_type().ok()?;
            Some((dir.join(entry.file_name()), file_type, entry))
        })
        .collect();
    Some(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::os::unix::fs::symlink;

    /// Records what a staged walk hands over.
    #[derive(Default)]
    struct Seen {
        files: Vec<PathBuf>,
        unreadable: Vec<PathBuf>,
    }

    impl Entries for Seen {
        fn in_index(&self, _dir: &Path) -> DirInIndex {
            DirInIndex::Untracked
        }

        fn found(&mut self, rel: PathBuf, kind: EntryKind) {
            if let EntryKind::File(_) = kind {
                self.files.push(rel);
            }
        }

        fn unreadable(&mut self, dir: PathBuf) {
            self.unreadable.push(dir);
        }
    }

    /// Replaces the other of `a` and `b` by a file when the walk enters the first of them: a
    /// directory replaced after its parent was read and before it is.
    struct Replacing<'a> {
        filter: &'a mut Filter,
        workdir: PathBuf,
        entered: Vec<PathBuf>,
    }

    impl Dirs for Replacing<'_> {
        fn rules(&self) -> &Filter {
            self.filter
        }

        fn enter(&mut self, dir: &Path) {
            self.entered.push(dir.to_owned());
            if self.entered.len() == 2 {
                let other = if dir == Path::new("a") { "b" } else { "a" };
                let abs = self.workdir.join(other);
                fs::remove_dir_all(&abs).unwrap();
                fs::write(&abs, "now a file").unwrap();
            }
        }

        fn load_rules(&mut self, dir: &Path, gitignore: Listed) {
            self.filter.load_listed(dir, gitignore);
        }

        fn watching(&self) -> bool {
            true
        }
    }

    /// A working tree of two directories, `a` and `b`, each holding one file.
    fn two_dirs() -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let workdir = tmp.path().to_owned();
        for dir in ["a", "b"] {
            fs::create_dir_all(workdir.join(dir)).unwrap();
            fs::write(workdir.join(dir).join("inside.txt"), dir).unwrap();
        }
        (tmp, workdir)
    }

    #[test]
    fn a_directory_replaced_by_a_file_mid_walk_is_unreadable_not_gone() {
        let (_tmp, workdir) = two_dirs();
        let (mut filter, _) = Filter::new(&workdir, &workdir.join(".git"), None, false);
        let mut dirs = Replacing {
            filter: &mut filter,
            workdir: workdir.clone(),
            entered: Vec::new(),
        };
        let mut seen = Seen::default();
        walk(&workdir, Path::new(""), true, &mut dirs, &mut seen);
        let first = dirs.entered[1].clone();
        let replaced = if first == Path::new("a") { "b" } else { "a" };
        assert_eq!(seen.files, [first.join("inside.txt")]);
        // What was saved under it stands until the events of the swap are staged.
        assert_eq!(seen.unreadable, [PathBuf::from(replaced)]);
        assert_eq!(dirs.entered.len(), 3, "{:?}", dirs.entered);
    }

    /// Everything a staged walk hands over, by kind, in order.
    struct Recorded {
        gitlinks: BTreeSet<PathBuf>,
        tracked: BTreeSet<PathBuf>,
        found: Vec<(PathBuf, &'static str)>,
        unreadable: Vec<PathBuf>,
    }

    impl Recorded {
        fn new(gitlinks: &[&str], tracked: &[&str]) -> Self {
            Self {
                gitlinks: gitlinks.iter().map(PathBuf::from).collect(),
                tracked: tracked.iter().map(PathBuf::from).collect(),
                found: Vec::new(),
                unreadable: Vec::new(),
            }
        }

        fn sorted(mut self) -> (Vec<(PathBuf, &'static str)>, Vec<PathBuf>) {
            self.found.sort();
            self.unreadable.sort();
            (self.found, self.unreadable)
        }
    }

    impl Entries for Recorded {
        fn in_index(&self, dir: &Path) -> DirInIndex {
            if self.gitlinks.contains(dir) {
                DirInIndex::Gitlink
            } else if self.tracked.contains(dir) {
                DirInIndex::Tracked
            } else {
                DirInIndex::Untracked
            }
        }

        fn found(&mut self, rel: PathBuf, kind: EntryKind) {
            let kind = match kind {
                EntryKind::File(_) => "file",
                EntryKind::NestedRepo => "nested repository",
                EntryKind::Gitlink => "gitlink",
            };
            self.found.push((rel, kind));
        }

        fn unreadable(&mut self, dir: PathBuf) {
            self.unreadable.push(dir);
        }
    }

    /// The start-up pass's two sides on two threads: the watch side's walk and its listings
    /// staged on this thread.
    fn staged_from_listings<D: Dirs + Send>(
        workdir: &Path,
        mut dirs: D,
        mut entries: Recorded,
    ) -> (Recorded, D) {
        let (sender, listings) = listings_channel();
        let walking = std::thread::scope(|scope| {
            let walking = scope.spawn(|| {
                walk_listings(workdir, &mut dirs, &sender);
                drop(sender);
            });
            let (rules, _) = Filter::new(workdir, &workdir.join(".git"), None, false);
            stage_listings(workdir, listings, &rules, &mut entries);
            walking.join()
        });
        walking.unwrap();
        (entries, dirs)
    }

    fn make_repo(dir: &Path) {
        for sub in ["objects", "refs"] {
            fs::create_dir_all(dir.join(".git").join(sub)).unwrap();
        }
        fs::write(dir.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
    }

    /// Every kind of directory a staged walk decides on: kept, ignored (by a nested
    /// `.gitignore`, one that re-includes a file, one that is a symbolic link), a gitlink, a
    /// repository of its own with nothing tracked (a new gitlink) and one with tracked paths
    /// (entered), deep enough that the listings go over the channel in several sends.
    #[test]
    fn the_start_up_passs_two_threads_hand_the_stage_what_one_walk_does() {
        let tmp = tempfile::tempdir().unwrap();
        let workdir = tmp.path().join("w");
        let write = |rel: &str, text: &str| {
            let path = workdir.join(rel);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, text).unwrap();
        };
        write(".gitignore", "*.log\n");
        write("top.txt", "t");
        write("a/.gitignore", "ign/\n!keep.log\n");
        for file in [
            "a/f.txt",
            "a/x.log",
            "a/keep.log",
            "a/ign/f.txt",
            "a/b/c/deep.txt",
        ] {
            write(file, file);
        }
        write("links/target/.gitignore", "*.txt\n");
        symlink("target/.gitignore", workdir.join("links/.gitignore")).unwrap();
        write("links/kept.txt", "kept: its .gitignore is a symbolic link");
        write("module/inside.txt", "a gitlink's files are not the stage's");
        write("nested/inner.txt", "a new gitlink");
        make_repo(&workdir.join("nested"));
        write("tracked/t.txt", "tracked below a repository of its own");
        make_repo(&workdir.join("tracked"));
        for i in 0..3 * LISTINGS_SENT_TOGETHER {
            write(&format!("many/d{i}/f.txt"), "x");
        }
        symlink("a", workdir.join("link")).unwrap();
        let gitlinks = ["module"];
        let tracked = ["tracked", "a", "many"];

        let (mut filter, _) = Filter::new(&workdir, &workdir.join(".git"), None, false);
        let mut load = LoadRules {
            filter: &mut filter,
            warnings: Vec::new(),
        };
        let mut one = Recorded::new(&gitlinks, &tracked);
        walk(&workdir, Path::new(""), true, &mut load, &mut one);
        let one_warnings = load.warnings.len();

        let (mut filter, _) = Filter::new(&workdir, &workdir.join(".git"), None, false);
        let load = LoadRules {
            filter: &mut filter,
            warnings: Vec::new(),
        };
        let (two, load) = staged_from_listings(&workdir, load, Recorded::new(&gitlinks, &tracked));
        assert_eq!(load.warnings.len(), one_warnings);
        assert_eq!(one_warnings, 1, "the symbolic link .gitignore is named");

        let (one, two) = (one.sorted(), two.sorted());
        assert_eq!(two, one);
        let (many, found): (Vec<_>, Vec<_>) =
            one.0.iter().partition(|(p, _)| p.starts_with("many"));
        assert_eq!(many.len(), 3 * LISTINGS_SENT_TOGETHER);
        let found: Vec<(&str, &str)> = found
            .iter()
            .map(|(p, k)| (p.to_str().unwrap(), *k))
            .collect();
        let file = |p| (p, "file");
        assert_eq!(
            found,
            [
                file(".gitignore"),
                file("a/.gitignore"),
                file("a/b/c/deep.txt"),
                file("a/f.txt"),
                file("a/keep.log"),
                file("link"),
                file("links/.gitignore"),
                file("links/kept.txt"),
                file("links/target/.gitignore"),
                ("module", "gitlink"),
                ("nested", "nested repository"),
                file("top.txt"),
                file("tracked/t.txt"),
            ]
        );
    }

    /// A directory replaced by a file after its parent was listed and before it is read is
    /// unreadable to the stage on the other thread too, not gone.
    #[test]
    fn a_directory_replaced_mid_walk_is_unreadable_to_the_stage_on_the_other_thread() {
        let (_tmp, workdir) = two_dirs();
        let (mut filter, _) = Filter::new(&workdir, &workdir.join(".git"), None, false);
        let dirs = Replacing {
            filter: &mut filter,
            workdir: workdir.clone(),
            entered: Vec::new(),
        };
        let (seen, dirs) = staged_from_listings(&workdir, dirs, Recorded::new(&[], &[]));
        let first = dirs.entered[1].clone();
        let replaced = if first == Path::new("a") { "b" } else { "a" };
        let (found, unreadable) = seen.sorted();
        assert_eq!(found, [(first.join("inside.txt"), "file")]);
        assert_eq!(unreadable, [PathBuf::from(replaced)]);
    }

    #[test]
    fn symlinks_are_entries_and_never_entered() {
        let tmp = tempfile::tempdir().unwrap();
        let workdir = tmp.path().join("w");
        fs::create_dir_all(workdir.join("real")).unwrap();
        fs::write(workdir.join("real/file.txt"), "x").unwrap();
        symlink("real", workdir.join("link")).unwrap();
        symlink(tmp.path(), workdir.join("up")).unwrap();
        let (mut filter, _) = Filter::new(&workdir, &workdir.join(".git"), None, false);
        let mut dirs = LoadRules {
            filter: &mut filter,
            warnings: Vec::new(),
        };
        let mut seen = Seen::default();
        walk(&workdir, Path::new(""), true, &mut dirs, &mut seen);
        seen.files.sort();
        let expected: Vec<PathBuf> = ["link", "real/file.txt", "up"]
            .iter()
            .map(PathBuf::from)
            .collect();
        assert_eq!(seen.files, expected);
    }

    /// `a` moved to `b/x` after the batch's rules were taken: the walk of `b` judges `b/x` by
    /// the `.gitignore` it holds, not by none (the snapshot has no rules for `b/x`).
    #[test]
    fn a_stage_walk_reads_the_rules_of_a_directory_moved_in_after_the_snapshot() {
        let tmp = tempfile::tempdir().unwrap();
        let workdir = tmp.path().join("w");
        fs::create_dir_all(workdir.join("b")).unwrap();
        let (mut snapshot, _) = Filter::new(&workdir, &workdir.join(".git"), None, false);
        snapshot.load_dir(Path::new(""));
        snapshot.load_dir(Path::new("b"));
        let moved = workdir.join("b/x");
        fs::create_dir_all(moved.join("c")).unwrap();
        fs::write(moved.join(".gitignore"), "***/c\n").unwrap();
        fs::write(moved.join("c/f"), "ignored").unwrap();
        fs::write(moved.join("k"), "kept").unwrap();
        let snapshot = Arc::new(snapshot);
        let mut dirs = Fresh(Arc::clone(&snapshot));
        let mut seen = Seen::default();
        walk(&workdir, Path::new("b"), true, &mut dirs, &mut seen);
        seen.files.sort();
        let expected: Vec<PathBuf> = ["b/x/.gitignore", "b/x/k"]
            .iter()
            .map(PathBuf::from)
            .collect();
        assert_eq!(seen.files, expected);
        assert!(
            !snapshot.has_rules_below(Path::new("b/x")),
            "the batch's snapshot itself is left as it was"
        );
    }
}
