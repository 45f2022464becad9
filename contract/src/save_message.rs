//! The commit messages of the watcher's saves: the watcher writes them ([`render`]), its
//! `history` and the cloud's history read them back ([`classify`], [`listed_files`]).
//!
//! Format:
//!
//! ```text
//! <subject: at most 72 characters>
//!
//! <each changed path on a line of its own, at most 20, then `... and N more`>
//!
//! Saved-by: project-watcher/<version>
//! Save-kind: autosave|restore|backup
//! <more trailers: `Restored-from: <commit id>` for a restore>
//! ```
//!
//! The paths paragraph is left out when no path is listed. The trailers are read as git reads
//! them ([`crate::trailers`]), so `git log --format=%(trailers)` shows what the watcher reads.

use std::fmt::{self, Write as _};

use serde::{Deserialize, Serialize};

use crate::trailers;

/// The trailer that marks the watcher's commits: `Saved-by: project-watcher/<version>`.
pub const SAVED_BY: &str = "Saved-by";
/// What a [`SAVED_BY`] value starts with; the watcher's version follows.
pub const SAVED_BY_PRODUCT: &str = "project-watcher/";
/// The trailer that says what made a watcher commit: `Save-kind: autosave`.
pub const SAVE_KIND: &str = "Save-kind";
/// The trailer of a restore: the full id of the save it went back to.
pub const RESTORED_FROM: &str = "Restored-from";
/// At most this many paths are listed in a message body.
pub const LISTED_PATHS: usize = 20;
/// A subject fits git's one-line views (`git log --oneline`, GitLab's commit list).
pub const SUBJECT_WIDTH: usize = 72;

/// What made a save. The watcher writes the first three into the [`SAVE_KIND`] trailer;
/// `other` (a commit a person made, here or pushed from elsewhere) is only ever read, and is
/// the word of the watcher's `history` and of the workspace page alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SaveKind {
    /// Edits the watcher saved as they happened.
    Autosave,
    /// `restore --at`: the project (or some paths) as at an earlier save.
    Restore,
    /// Unsaved work kept before a `sync` moved the tree.
    Backup,
    /// A commit the watcher did not make.
    Other,
}

impl SaveKind {
    const ALL: [Self; 4] = [Self::Autosave, Self::Restore, Self::Backup, Self::Other];

    /// The kind's name, as the trailer and the JSON write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Autosave => "autosave",
            Self::Restore => "restore",
            Self::Backup => "backup",
            Self::Other => "other",
        }
    }

    /// The kind a [`SAVE_KIND`] trailer value names.
    pub fn parse(value: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == value.trim())
    }
}

impl fmt::Display for SaveKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// A whole message: `subject` (cut to [`SUBJECT_WIDTH`]), a body listing up to
/// [`LISTED_PATHS`] of `paths` (each made [`one_line_path`]), then the [`SAVED_BY`] trailer naming `version`, the
/// [`SAVE_KIND`] trailer and `extra` trailers (`(token, value)`).
pub fn render(
    subject: &str,
    kind: SaveKind,
    version: &str,
    paths: &[String],
    extra: &[(&str, String)],
) -> String {
    let mut text = format!("{}\n\n", one_line(subject, SUBJECT_WIDTH));
    for path in paths.iter().take(LISTED_PATHS) {
        let _ = writeln!(text, "{}", one_line_path(path.as_bytes()));
    }
    if paths.len() > LISTED_PATHS {
        let _ = writeln!(text, "... and {} more", paths.len() - LISTED_PATHS);
    }
    if !paths.is_empty() {
        text.push('\n');
    }
    let _ = writeln!(text, "{SAVED_BY}: {SAVED_BY_PRODUCT}{version}");
    let _ = writeln!(text, "{SAVE_KIND}: {kind}");
    for (token, value) in extra {
        let _ = writeln!(text, "{token}: {value}");
    }
    text
}

/// A path as one line of a message: quoted like a Rust string when it holds control
/// characters (a newline in a name must not break the list apart) or starts like a line git
/// reads as the end of the message (`---`, the patch divider; `#`, a comment or the scissors
/// line) or as a blank line (white space only), lossy for invalid UTF-8. A quoted path is left
/// as it is.
pub fn one_line_path(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    if text.chars().any(char::is_control)
        || text.starts_with("---")
        || text.starts_with('#')
        || text.trim().is_empty()
    {
        format!("{text:?}")
    } else {
        text.into_owned()
    }
}

/// The kind of a watcher's save from its message: `None` when the watcher did not make it (no
/// [`SAVED_BY`] trailer naming it). Saves from before the [`SAVE_KIND`] trailer existed are
/// told by their subject: `backup:` for sync's backups, else autosaves.
pub fn classify(message: &str) -> Option<SaveKind> {
    let mut by_watcher = false;
    let mut kind = None;
    for trailer in trailers::parse(message) {
        if trailer.token.eq_ignore_ascii_case(SAVED_BY)
            && trailer.value.starts_with(SAVED_BY_PRODUCT)
        {
            by_watcher = true;
        } else if trailer.token.eq_ignore_ascii_case(SAVE_KIND) {
            kind = SaveKind::parse(&trailer.value);
        }
    }
    by_watcher.then(|| {
        kind.unwrap_or(if message.starts_with("backup:") {
            SaveKind::Backup
        } else {
            SaveKind::Autosave
        })
    })
}

/// The paths a watcher's message lists (the `... and N more` line included): the paragraph
/// between the subject and the trailers; empty for a message the watcher did not make.
pub fn listed_files(message: &str) -> Vec<String> {
    if classify(message).is_none() {
        return Vec::new();
    }
    let Some(start) = trailers::block_start(message) else {
        return Vec::new();
    };
    let paragraphs: Vec<&str> = message[..start]
        .trim_end_matches('\n')
        .split("\n\n")
        .filter(|p| !p.trim().is_empty())
        .collect();
    match paragraphs.as_slice() {
        [_subject, paths] => paths.lines().map(str::to_owned).collect(),
        _ => Vec::new(),
    }
}

/// A subject without the `<kind>: ` the watcher starts it with (`autosave: a.ts` is `a.ts`),
/// so a view that shows the kind does not say it twice; any other subject as it is.
pub fn subject_without_kind(subject: &str, kind: SaveKind) -> &str {
    subject
        .strip_prefix(kind.as_str())
        .and_then(|rest| rest.strip_prefix(": "))
        .filter(|rest| !rest.trim().is_empty())
        .unwrap_or(subject)
}

/// `text` cut to `width` characters, keeping its start.
fn one_line(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_owned();
    }
    let head: String = text.chars().take(width.saturating_sub(3)).collect();
    format!("{head}...")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subject_loses_only_its_own_kind() {
        assert_eq!(
            subject_without_kind("autosave: a.ts, b.ts", SaveKind::Autosave),
            "a.ts, b.ts"
        );
        assert_eq!(
            subject_without_kind("backup: before sync", SaveKind::Autosave),
            "backup: before sync"
        );
        assert_eq!(
            subject_without_kind("autosave: ", SaveKind::Autosave),
            "autosave: "
        );
        assert_eq!(subject_without_kind("fix it", SaveKind::Other), "fix it");
    }

    fn paths(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("src/tools/f{i}")).collect()
    }

    #[test]
    fn a_message_lists_twenty_paths_and_ends_with_the_trailers() {
        let m = render(
            "autosave: 25 files",
            SaveKind::Autosave,
            "9.9.9",
            &paths(25),
            &[],
        );
        assert!(m.starts_with("autosave: 25 files\n\nsrc/tools/f0\n"), "{m}");
        assert!(m.contains("f19\n... and 5 more\n\n"), "{m}");
        assert!(!m.contains("f20"), "{m}");
        assert!(
            m.ends_with("\n\nSaved-by: project-watcher/9.9.9\nSave-kind: autosave\n"),
            "{m}"
        );
        let long = "x".repeat(100);
        let subject = render(&long, SaveKind::Autosave, "1", &[], &[]);
        let subject = subject.lines().next().unwrap();
        assert_eq!(subject.chars().count(), SUBJECT_WIDTH);
        assert!(subject.ends_with("..."));
    }

    #[test]
    fn what_is_rendered_is_read_back() {
        for kind in [SaveKind::Autosave, SaveKind::Restore, SaveKind::Backup] {
            for n in [0, 1, 20, 21] {
                let extra = [(RESTORED_FROM, "1a2b".to_owned())];
                let m = render("s: x", kind, "0.1.0", &paths(n), &extra);
                assert_eq!(classify(&m), Some(kind), "{m}");
                let listed = listed_files(&m);
                assert_eq!(listed.len(), n.min(LISTED_PATHS + 1), "{m}");
                assert_eq!(listed.first(), paths(n).first(), "{m}");
            }
        }
    }

    #[test]
    fn kinds_follow_the_watchers_trailers() {
        let check = |message: &str, expected: Option<SaveKind>| {
            assert_eq!(classify(message), expected, "{message:?}");
        };
        check(
            "autosave: a.ts\n\na.ts\n\nSaved-by: project-watcher/0.1.0\nSave-kind: autosave\n",
            Some(SaveKind::Autosave),
        );
        check(
            "restore: the project as at 1a2b3c4 (2026-11-30T13:05:12Z)\n\na.ts\n\nSaved-by: project-watcher/0.1.0\nSave-kind: restore\nRestored-from: 1a2b\n",
            Some(SaveKind::Restore),
        );
        // Before the kind trailer: the subject tells.
        check(
            "backup: unsaved work before sync\n\nSaved-by: project-watcher/0.1.0\n",
            Some(SaveKind::Backup),
        );
        check(
            "autosave: 1 files changed\n\na.ts\n\nSaved-by: project-watcher/0.1.0\n",
            Some(SaveKind::Autosave),
        );
        check("fix the weather tool\n", None);
        check(
            "Saved-by: project-watcher/1\n\nthe trailer is not in the last paragraph\n",
            None,
        );
        check(
            "Save-kind: restore\n\nwrote Saved-by: project-watcher/1 by hand\n",
            None,
        );
        check(
            "a person's commit\n\nSaved-by: someone else\nSave-kind: autosave\n",
            None,
        );
    }

    #[test]
    fn files_come_from_the_watchers_body_only() {
        assert_eq!(
            listed_files(
                "autosave: 2 files\n\na.ts\nsrc/b.ts\n\nSaved-by: project-watcher/0.1.0\nSave-kind: autosave\n"
            ),
            ["a.ts", "src/b.ts"]
        );
        assert!(listed_files("backup: x\n\nSaved-by: project-watcher/0.1.0\n").is_empty());
        assert!(listed_files("a person's commit\n\nbody\n\nmore\n").is_empty());
    }

    #[test]
    fn kinds_round_trip_through_the_trailer_value() {
        for kind in SaveKind::ALL {
            assert_eq!(SaveKind::parse(kind.as_str()), Some(kind));
            assert_eq!(serde_json::to_string(&kind).unwrap(), format!("\"{kind}\""));
        }
        assert_eq!(SaveKind::parse("nonsense"), None);
    }

    #[test]
    fn control_characters_in_names_stay_on_one_line() {
        assert_eq!(one_line_path(b"a\nb"), "\"a\\nb\"");
        assert_eq!(one_line_path(b"plain/name.txt"), "plain/name.txt");
        assert_eq!(one_line_path(b"bad\xffutf8"), "bad\u{fffd}utf8");
        assert_eq!(one_line_path(b"--- notes.md"), "\"--- notes.md\"");
        assert_eq!(one_line_path(b"# x"), "\"# x\"");
        assert_eq!(one_line_path(b"a-b#"), "a-b#");
        assert_eq!(one_line_path(b" "), "\" \"");
        for quoted in ["\"a\\nb\"", "\"--- notes.md\""] {
            assert_eq!(one_line_path(quoted.as_bytes()), quoted);
        }
    }
}
