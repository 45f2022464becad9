//! The sync failure file: `project-watcher sync` writes it when a step fails (and removes it
//! on success), the cloud reads it into [`SyncFailure`] for the sandbox's `broken` status.
//!
//! Format, one file, UTF-8:
//!
//! ```text
//! step: NAME
//! error: MESSAGE
//! first: N
//! <the N first lines of the step's output that read as errors: at most FIRST_LINES, N may be 0>
//! <the step's output tail: at most TAIL_LINES lines>
//! ```
//!
//! `NAME` and `MESSAGE` are one line each: a line break in them is written `\n` (`\r` as
//! `\r`, a backslash as `\\`). The `first:` line is always written, so a tail that starts
//! with such a line reads back as tail; a file without it, as older watchers write, reads as
//! before. The tail is
//! written as it is, followed by one newline when it is not empty. The parser never fails: a
//! file in another shape (truncated, empty, garbage) still becomes a failure that says so and
//! keeps the end of the text.

use std::collections::VecDeque;
use std::fmt;

use serde::{Deserialize, Serialize};

/// Where `project-watcher sync` writes the file when not told otherwise.
pub const DEFAULT_FAILURE_FILE: &str = "/tmp/shmastra-sync-failure";
/// How many lines of a failed step's output the file keeps.
pub const TAIL_LINES: usize = 50;
/// How many of the first error lines of a failed step's output the file keeps: what a long
/// tail (npm's usage text after `Missing: left-pad@1.3.0 from lock file`) pushes out.
pub const FIRST_LINES: usize = 8;
/// The most of the tail the parser keeps, in bytes (its end); of the step and the message
/// (their start). A sandbox can write anything into the file; the status stays small.
pub const MAX_TAIL_BYTES: usize = 16 * 1024;
/// See [`MAX_TAIL_BYTES`].
pub const MAX_LINE_BYTES: usize = 4 * 1024;
/// The steps of `project-watcher sync`, in order, as its failure file and its step file
/// (`sync --step-file`) name them.
pub const SYNC_STEPS: [&str; 8] = [
    "open", "lock", "fetch", "backup", "stop", "restore", "install", "start",
];
/// The step of a failure whose file did not name one.
pub const UNKNOWN_STEP: &str = "unknown";

/// Why a sync failed: the step (`fetch`, `install`, ...), what went wrong, the first lines of
/// the step's output that read as errors, and the end of its output (lines joined by `\n`;
/// empty when the step printed nothing).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncFailure {
    pub step: String,
    pub message: String,
    /// At most [`FIRST_LINES`] lines (see [`OutputLines`]); empty when none read as errors.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub first: String,
    pub tail: String,
}

impl SyncFailure {
    /// A failure without output.
    pub fn new(step: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            step: step.into(),
            message: message.into(),
            first: String::new(),
            tail: String::new(),
        }
    }

    /// The same failure with the output tail `lines` (the last [`TAIL_LINES`] are kept).
    pub fn with_tail<I, S>(mut self, lines: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let lines: Vec<S> = lines.into_iter().collect();
        let start = lines.len().saturating_sub(TAIL_LINES);
        self.tail = lines[start..]
            .iter()
            .map(AsRef::as_ref)
            .collect::<Vec<_>>()
            .join("\n");
        self
    }

    /// The file's text.
    pub fn render(&self) -> String {
        let mut out = format!(
            "step: {}\nerror: {}\n",
            escape(&self.step),
            escape(&self.message)
        );
        let first: Vec<&str> = match self.first.as_str() {
            "" => Vec::new(),
            first => first.split('\n').take(FIRST_LINES).collect(),
        };
        out.push_str(&format!("first: {}\n", first.len()));
        for line in first {
            out.push_str(line);
            out.push('\n');
        }
        if !self.tail.is_empty() {
            out.push_str(&self.tail);
            out.push('\n');
        }
        out
    }

    /// Reads a failure file. Never fails: whatever the bytes, the result names a step and a
    /// message, and keeps at most [`TAIL_LINES`] lines of output.
    pub fn parse(bytes: &[u8]) -> Self {
        let text = String::from_utf8_lossy(bytes);
        let mut rest: &str = &text;
        let Some(step) = next_line(&mut rest).and_then(|l| l.strip_prefix("step: ")) else {
            let message = if text.trim().is_empty() {
                "the sync failed and its failure file is empty"
            } else {
                "the sync failed and its failure file is not in the expected format"
            };
            return Self {
                step: UNKNOWN_STEP.to_owned(),
                message: message.to_owned(),
                first: String::new(),
                tail: last_lines(text.strip_suffix('\n').unwrap_or(&text)),
            };
        };
        let step = match unescape(head(step)) {
            s if s.is_empty() => UNKNOWN_STEP.to_owned(),
            s => s,
        };
        let before_message = rest;
        let message = match next_line(&mut rest) {
            Some(line) => match line.strip_prefix("error: ") {
                Some(message) => unescape(head(message)),
                None => {
                    rest = before_message;
                    "the failure file has no error line".to_owned()
                }
            },
            None => "the failure file ends before its error line".to_owned(),
        };
        let first = first_lines(&mut rest);
        Self {
            step,
            message,
            first,
            tail: last_lines(rest.strip_suffix('\n').unwrap_or(rest)),
        }
    }
}

/// The `first: N` block at the start of `rest`, advancing past it; empty when there is none.
fn first_lines(rest: &mut &str) -> String {
    let mut after = *rest;
    let count = next_line(&mut after)
        .and_then(|l| l.strip_prefix("first: "))
        .filter(|n| !n.is_empty() && n.len() <= 2 && n.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|n| n.parse::<usize>().ok())
        .filter(|n| *n <= FIRST_LINES);
    let Some(count) = count else {
        return String::new();
    };
    let mut lines = Vec::with_capacity(count);
    for _ in 0..count {
        match next_line(&mut after) {
            Some(line) => lines.push(head(line)),
            None => break,
        }
    }
    *rest = after;
    lines.join("\n")
}

/// A failed step's output as it comes, line by line, kept as the failure file holds it: the
/// first [`FIRST_LINES`] lines that read as errors (a word such as `error`, `ERR!`, `failed`,
/// `missing`, `cannot`, `fatal`, `ENOENT`), and the last [`TAIL_LINES`].
#[derive(Debug, Clone, Default)]
pub struct OutputLines {
    first: Vec<String>,
    tail: VecDeque<String>,
}

impl OutputLines {
    /// The next line of output (without its newline).
    pub fn push(&mut self, line: &str) {
        if self.first.len() < FIRST_LINES && reads_as_error(line) {
            self.first.push(head(line).to_owned());
        }
        if self.tail.len() == TAIL_LINES {
            self.tail.pop_front();
        }
        self.tail.push_back(line.to_owned());
    }

    /// The failure of `step` with `message` and this output.
    pub fn failure(&self, step: impl Into<String>, message: impl Into<String>) -> SyncFailure {
        SyncFailure {
            first: self.first.join("\n"),
            ..SyncFailure::new(step, message).with_tail(&self.tail)
        }
    }
}

/// Words that make a line of a tool's output an error line (compared in lower case).
const ERROR_WORDS: [&str; 18] = [
    "err",
    "error",
    "errors",
    "fatal",
    "fail",
    "failed",
    "failure",
    "missing",
    "cannot",
    "denied",
    "exception",
    "panicked",
    "traceback",
    "enoent",
    "eacces",
    "etarget",
    "eresolve",
    "notarget",
];

/// Whether `line` reads as an error: one of [`ERROR_WORDS`] as a word, or a word starting
/// with `err_` (`ERR_PNPM_OUTDATED_LOCKFILE`).
fn reads_as_error(line: &str) -> bool {
    line.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .map(str::to_lowercase)
        .any(|word| ERROR_WORDS.contains(&word.as_str()) || word.starts_with("err_"))
}

impl fmt::Display for SyncFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sync failed at step `{}`: {}", self.step, self.message)
    }
}

/// The next line of `rest` without its newline (a last line without one counts), advancing
/// `rest` past it; `None` at the end.
fn next_line<'a>(rest: &mut &'a str) -> Option<&'a str> {
    if rest.is_empty() {
        return None;
    }
    let (line, after) = rest.split_once('\n').unwrap_or((rest, ""));
    *rest = after;
    Some(line)
}

fn last_lines(text: &str) -> String {
    let lines: Vec<&str> = text.split('\n').collect();
    let tail = lines[lines.len().saturating_sub(TAIL_LINES)..].join("\n");
    let mut start = tail.len().saturating_sub(MAX_TAIL_BYTES);
    while !tail.is_char_boundary(start) {
        start += 1;
    }
    tail[start..].to_owned()
}

/// At most [`MAX_LINE_BYTES`] of the start of `line`.
fn head(line: &str) -> &str {
    let mut end = line.len().min(MAX_LINE_BYTES);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    &line[..end]
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
    out
}

/// The inverse of [`escape`]; an escape it does not know is kept as written.
fn unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('\\') => out.push('\\'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_file_reads_as_people_expect() {
        let failure = SyncFailure::new("install", "`npm ci` failed (exit status: 1)")
            .with_tail(["npm ERR! missing script", "npm ERR! see log"]);
        assert_eq!(
            failure.render(),
            "step: install\nerror: `npm ci` failed (exit status: 1)\nfirst: 0\nnpm ERR! missing script\nnpm ERR! see log\n"
        );
        assert_eq!(
            SyncFailure::new("open", "not a repository").render(),
            "step: open\nerror: not a repository\nfirst: 0\n"
        );
        assert_eq!(
            SyncFailure::new("stop", "a\nb\\n").render(),
            "step: stop\nerror: a\\nb\\\\n\nfirst: 0\n"
        );
        // A tail that starts like the block of first lines is still tail.
        let odd = SyncFailure::new("install", "x").with_tail(["first: 1", "a"]);
        assert_eq!(SyncFailure::parse(odd.render().as_bytes()), odd);
    }

    #[test]
    fn the_tail_keeps_the_last_lines() {
        let lines: Vec<String> = (1..=80).map(|i| format!("line {i}")).collect();
        let failure = SyncFailure::new("install", "x").with_tail(&lines);
        assert_eq!(failure.tail.lines().count(), TAIL_LINES);
        assert!(failure.tail.starts_with("line 31\n"), "{}", failure.tail);
        let long = format!("step: install\nerror: x\n{}\n", lines.join("\n"));
        assert_eq!(SyncFailure::parse(long.as_bytes()), failure);
    }

    #[test]
    fn any_file_parses_into_a_failure_that_says_what_it_could() {
        let check = |bytes: &[u8], step: &str, message: &str, tail: &str| {
            let got = SyncFailure::parse(bytes);
            let want = SyncFailure {
                step: step.into(),
                message: message.into(),
                first: String::new(),
                tail: tail.into(),
            };
            assert_eq!(got, want, "{:?}", String::from_utf8_lossy(bytes));
        };
        check(
            b"",
            UNKNOWN_STEP,
            "the sync failed and its failure file is empty",
            "",
        );
        check(
            b"npm ERR! boom\nmore\n",
            UNKNOWN_STEP,
            "the sync failed and its failure file is not in the expected format",
            "npm ERR! boom\nmore",
        );
        check(
            b"step: inst",
            "inst",
            "the failure file ends before its error line",
            "",
        );
        check(
            b"step: install\n",
            "install",
            "the failure file ends before its error line",
            "",
        );
        check(
            b"step: install\nerror: cannot ru",
            "install",
            "cannot ru",
            "",
        );
        check(
            b"step: install\nnpm ERR!\n",
            "install",
            "the failure file has no error line",
            "npm ERR!",
        );
        check(b"step: \nerror: x\n", UNKNOWN_STEP, "x", "");
        check(
            b"step: install\nerror: x\nfirst: 9\na\n",
            "install",
            "x",
            "first: 9\na",
        );
        let huge = format!(
            "step: install\nerror: {}\n{}\n",
            "é".repeat(MAX_LINE_BYTES),
            "x".repeat(MAX_TAIL_BYTES * 2)
        );
        let parsed = SyncFailure::parse(huge.as_bytes());
        assert_eq!(parsed.message, "é".repeat(MAX_LINE_BYTES / 2));
        assert_eq!(parsed.tail, "x".repeat(MAX_TAIL_BYTES));
        check(b"step: a\\\nerror: b\\q\n", "a\\", "b\\q", "");
        check(
            b"step: install\nerror: bad \xff byte\n\xfe\n",
            "install",
            "bad \u{fffd} byte",
            "\u{fffd}",
        );
    }

    #[test]
    fn the_first_error_lines_outlive_a_long_tail() {
        let mut output = OutputLines::default();
        output.push("npm ERR! code EUSAGE");
        output.push("added 3 packages, and audited 4 in 1s");
        output.push("npm ERR! Missing: left-pad@1.3.0 from lock file");
        for i in 0..80 {
            output.push(&format!("npm ERR!     --omit <dep type> option {i}"));
        }
        output.push("npm WARN deprecated: interrupted overriding default");
        let failure = output.failure("install", "`npm ci` failed");
        let first: Vec<&str> = failure.first.lines().collect();
        assert_eq!(first.len(), FIRST_LINES);
        assert_eq!(
            first[..2],
            [
                "npm ERR! code EUSAGE",
                "npm ERR! Missing: left-pad@1.3.0 from lock file"
            ]
        );
        assert!(
            !failure.tail.contains("Missing:"),
            "the tail is the usage text"
        );
        assert_eq!(SyncFailure::parse(failure.render().as_bytes()), failure);
        let quiet = ["Resolving", "Fetching 3 packages", "Done with warnings"];
        let mut output = OutputLines::default();
        quiet.iter().for_each(|l| output.push(l));
        assert_eq!(output.failure("install", "x").first, "");
        for line in [
            "ERR_PNPM_OUTDATED_LOCKFILE",
            "Error: Cannot find module 'x'",
            "fatal: bad object",
            "ENOENT: no such file",
        ] {
            assert!(reads_as_error(line), "{line}");
        }
        for line in ["interrupted", "overriding", "stderr output", "terrific"] {
            assert!(!reads_as_error(line), "{line}");
        }
    }

    fn one_line_or_more() -> impl Strategy<Value = String> {
        prop_oneof!["[^\n]{0,40}", "(.|\n|\r|\\\\){0,40}", "\\PC{0,20}"]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(
            std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(2048)
        ))]

        #[test]
        fn what_the_writer_writes_the_parser_reads_back(
            step in "[a-z]{1,12}|\\PC{1,12}",
            message in one_line_or_more(),
            lines in prop::collection::vec(prop_oneof!["[^\n]{0,30}", "first: [0-9]{1,2}"], 0..=TAIL_LINES),
            first in prop::collection::vec("[^\n]{0,30}", 0..=FIRST_LINES),
        ) {
            let failure = SyncFailure {
                first: first.join("\n"),
                ..SyncFailure::new(step, message).with_tail(&lines)
            };
            let text = failure.render();
            prop_assert_eq!(SyncFailure::parse(text.as_bytes()), failure.clone());
            prop_assert_eq!(text.lines().take(2).count(), 2, "header lines: {:?}", text);
        }

        #[test]
        fn any_bytes_parse_without_panicking_and_keep_a_bounded_tail(
            bytes in prop::collection::vec(any::<u8>(), 0..400),
            cut in 0usize..400,
        ) {
            let failure = SyncFailure::parse(&bytes);
            prop_assert!(!failure.step.is_empty());
            prop_assert!(!failure.message.is_empty() || bytes.starts_with(b"step: "));
            prop_assert!(failure.tail.split('\n').count() <= TAIL_LINES);
            let written = SyncFailure::new("install", "x").with_tail(["a", "b"]).render();
            let truncated = &written.as_bytes()[..cut.min(written.len())];
            let parsed = SyncFailure::parse(truncated);
            let header = format!("step: {}", parsed.step);
            prop_assert!(
                written.starts_with(&header) || parsed.step == UNKNOWN_STEP,
                "{:?} -> {:?}", truncated, parsed
            );
        }
    }
}
