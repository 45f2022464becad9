//! A save's diff as the page shows it, read from `git show` with [`SHOW_ARGS`]: a header
//! line of NUL-separated fields (id, author, ISO time, subject), then git's patch, parsed into
//! one entry per file (added, deleted, changed or renamed; a binary, or its lines).

/// The arguments after `git` that print a save in the form [`parse`] reads (the commit, then
/// `--`, follow): rename detection on, no colour, no external diff or text conversion, paths
/// as they are.
pub const SHOW_ARGS: [&str; 9] = [
    "-c",
    "core.quotePath=false",
    "show",
    "--format=%H%x00%an%x00%cI%x00%s%x00",
    "--patch",
    "-M",
    "--no-color",
    "--no-ext-diff",
    "--no-textconv",
];

/// A file with more lines in its diff than this is shown folded.
pub const FOLDED_LINES: usize = 300;

/// One save and what it changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SaveDiff {
    /// The full commit id.
    pub commit: String,
    /// The author's name.
    pub author: String,
    /// The commit time, ISO 8601.
    pub time: String,
    /// The subject line.
    pub subject: String,
    /// The files, in git's order.
    pub files: Vec<FileDiff>,
    /// git's output went on past what was read: the last file may be cut.
    pub cut: bool,
}

/// What happened to a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Added,
    Deleted,
    Modified,
    /// Moved from [`FileDiff::old_path`] (maybe changed too).
    Renamed,
}

impl Change {
    /// The word the page shows.
    pub fn as_str(self) -> &'static str {
        match self {
            Change::Added => "added",
            Change::Deleted => "deleted",
            Change::Modified => "changed",
            Change::Renamed => "renamed",
        }
    }
}

/// The kind of a line of a file's diff.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineKind {
    /// `@@ -a,b +c,d @@`: where the next lines are.
    Hunk,
    Context,
    Added,
    Removed,
    /// `\ No newline at end of file`.
    NoNewline,
}

/// One line of a file's diff, without its sign.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub kind: LineKind,
    pub text: String,
}

/// One file of a save.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileDiff {
    /// Its path in the save (for a deleted file, where it was).
    pub path: String,
    /// Where a renamed file was.
    pub old_path: Option<String>,
    pub change: Change,
    /// git reports it as binary; its size in the save when known (none for a deleted one).
    pub binary: Option<Option<u64>>,
    /// The lines of its diff; empty for a binary, a pure rename or a mode change.
    pub lines: Vec<Line>,
}

impl FileDiff {
    /// Lines added and removed.
    pub fn counts(&self) -> (usize, usize) {
        self.lines.iter().fold((0, 0), |(a, r), l| match l.kind {
            LineKind::Added => (a + 1, r),
            LineKind::Removed => (a, r + 1),
            _ => (a, r),
        })
    }

    /// Whether the page folds it.
    pub fn is_large(&self) -> bool {
        self.lines.len() > FOLDED_LINES
    }
}

/// `git show` with [`SHOW_ARGS`]' output (`cut` when it was stopped before its end).
pub fn parse(bytes: &[u8], cut: bool) -> SaveDiff {
    let text = String::from_utf8_lossy(bytes);
    let mut fields = text.splitn(5, '\0');
    let mut next = || fields.next().unwrap_or_default().to_owned();
    let (commit, author, time, subject, patch) = (next(), next(), next(), next(), next());
    let mut diff = SaveDiff {
        commit,
        author,
        time,
        subject,
        files: Vec::new(),
        cut,
    };
    let mut in_hunk = false;
    for line in patch.lines() {
        if let Some(names) = line.strip_prefix("diff --git ") {
            in_hunk = false;
            diff.files.push(FileDiff {
                path: same_names(names).unwrap_or_else(|| names.to_owned()),
                old_path: None,
                change: Change::Modified,
                binary: None,
                lines: Vec::new(),
            });
            continue;
        }
        let Some(file) = diff.files.last_mut() else {
            continue;
        };
        if in_hunk {
            let (kind, rest) = match line.as_bytes().first() {
                Some(b'+') => (LineKind::Added, &line[1..]),
                Some(b'-') => (LineKind::Removed, &line[1..]),
                Some(b' ') => (LineKind::Context, &line[1..]),
                Some(b'\\') => (LineKind::NoNewline, line),
                Some(b'@') if line.starts_with("@@") => (LineKind::Hunk, line),
                // An empty context line (some tools strip the space).
                None => (LineKind::Context, ""),
                _ => continue,
            };
            file.lines.push(Line {
                kind,
                text: rest.to_owned(),
            });
        } else if line.starts_with("@@") {
            in_hunk = true;
            file.lines.push(Line {
                kind: LineKind::Hunk,
                text: line.to_owned(),
            });
        } else if line.starts_with("new file mode") {
            file.change = Change::Added;
        } else if line.starts_with("deleted file mode") {
            file.change = Change::Deleted;
        } else if let Some(from) = line.strip_prefix("rename from ") {
            file.change = Change::Renamed;
            file.old_path = Some(from.to_owned());
        } else if let Some(to) = line.strip_prefix("rename to ") {
            file.path = to.to_owned();
        } else if let Some(to) = line.strip_prefix("+++ b/") {
            file.path = to.trim_end_matches('\t').to_owned();
        } else if let Some(from) = line.strip_prefix("--- a/") {
            if file.change == Change::Deleted {
                file.path = from.trim_end_matches('\t').to_owned();
            }
        } else if line.starts_with("Binary files ") || line == "GIT binary patch" {
            file.binary = Some(None);
        }
    }
    diff
}

/// `a/P b/P` → `P`: the two names of a file that kept its name.
fn same_names(names: &str) -> Option<String> {
    let half = names.len().checked_sub(1)? / 2;
    let (old, new) = (names.get(..half)?, names.get(half + 1..)?);
    let (old, new) = (old.strip_prefix("a/")?, new.strip_prefix("b/")?);
    (old == new).then(|| new.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::process::Command;

    fn git(dir: &Path, args: &[&str]) -> Vec<u8> {
        let out = Command::new("git")
            .args(args)
            .current_dir(dir)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_AUTHOR_NAME", "Ann Author")
            .env("GIT_AUTHOR_EMAIL", "ann@example.test")
            .env("GIT_COMMITTER_NAME", "Ann Author")
            .env("GIT_COMMITTER_EMAIL", "ann@example.test")
            .output()
            .expect("git runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    #[test]
    fn real_git_output_reads_per_file() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        git(dir, &["init", "-q", "-b", "main"]);
        let write = |name: &str, bytes: &[u8]| std::fs::write(dir.join(name), bytes).unwrap();
        write("a.txt", b"one\ntwo\n");
        write("old.txt", b"keep\nthis\nfile\n");
        write("del.txt", b"gone\n");
        write("img.bin", &[0, 1, 2, 3, 0, 255]);
        std::fs::create_dir(dir.join("src")).unwrap();
        write("src/big.txt", b"");
        git(dir, &["add", "-A"]);
        git(dir, &["commit", "-qm", "first"]);
        write("a.txt", b"one\nthree\n");
        git(dir, &["mv", "old.txt", "new name é.txt"]);
        git(dir, &["rm", "-q", "del.txt"]);
        write("img.bin", &[0, 9, 9, 0, 7]);
        write("nonl.txt", b"x");
        let big: String = (0..FOLDED_LINES + 5)
            .map(|i| format!("line {i}\n"))
            .collect();
        write("src/big.txt", big.as_bytes());
        git(dir, &["add", "-A"]);
        git(dir, &["commit", "-qm", "second: many kinds"]);
        let mut args = SHOW_ARGS.to_vec();
        args.extend(["HEAD", "--"]);
        let diff = parse(&git(dir, &args), false);
        assert_eq!(diff.subject, "second: many kinds");
        assert_eq!(diff.author, "Ann Author");
        assert_eq!(diff.commit.len(), 40);
        assert!(diff.time.contains('T'), "{}", diff.time);
        let file = |path: &str| {
            diff.files
                .iter()
                .find(|f| f.path == path)
                .unwrap_or_else(|| panic!("{path} in {:?}", diff.files))
        };
        let a = file("a.txt");
        assert_eq!(a.change, Change::Modified);
        assert_eq!(a.counts(), (1, 1));
        assert!(a.lines.contains(&Line {
            kind: LineKind::Removed,
            text: "two".into()
        }));
        assert!(a.lines.contains(&Line {
            kind: LineKind::Added,
            text: "three".into()
        }));
        let renamed = file("new name é.txt");
        assert_eq!(renamed.change, Change::Renamed);
        assert_eq!(renamed.old_path.as_deref(), Some("old.txt"));
        assert!(renamed.lines.is_empty());
        let deleted = file("del.txt");
        assert_eq!(deleted.change, Change::Deleted);
        assert_eq!(deleted.counts(), (0, 1));
        let img = file("img.bin");
        assert_eq!(img.binary, Some(None));
        assert!(img.lines.is_empty());
        let nonl = file("nonl.txt");
        assert_eq!(nonl.change, Change::Added);
        assert_eq!(nonl.lines.last().unwrap().kind, LineKind::NoNewline);
        let big = file("src/big.txt");
        assert!(big.is_large() && big.counts() == (FOLDED_LINES + 5, 0));
        assert_eq!(diff.files.len(), 6, "{:?}", diff.files);
    }

    #[test]
    fn a_first_save_and_a_cut_diff() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        git(dir, &["init", "-q", "-b", "main"]);
        std::fs::write(dir.join("with space.txt"), "hello\n").unwrap();
        git(dir, &["add", "-A"]);
        git(dir, &["commit", "-qm", "root"]);
        let mut args = SHOW_ARGS.to_vec();
        args.extend(["HEAD", "--"]);
        let out = git(dir, &args);
        let diff = parse(&out, false);
        assert_eq!(diff.files.len(), 1);
        assert_eq!(diff.files[0].path, "with space.txt");
        assert_eq!(diff.files[0].change, Change::Added);
        let cut = parse(&out[..out.len() - 3], true);
        assert!(cut.cut && cut.files.len() == 1);
    }
}
