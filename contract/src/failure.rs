//! The sync failure file: `project-watcher sync` writes it when a step fails (and removes it
//! on success), the cloud reads it into [`SyncFailure`] for the sandbox's `broken` status.
//!
//! Format, one file, UTF-8:
//!
//! ```text
//! step: NAME
//! error: MESSAGE
//! <the step's output tail: at most TAIL_LINES lines>
//! ```
//!
//! `NAME` and `MESSAGE` are one line each: a line break in them is written `\n` (`\r` as
//! `\r`, a backslash as `\\`). The tail is written as it is, followed by one newline when it
//! is not empty. The parser never fails: a file in another shape (truncated, empty, garbage)
//! still becomes a failure that says so and keeps the end of the text.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Where `project-watcher sync` writes the file when not told otherwise.
pub const DEFAULT_FAILURE_FILE: &str = "/tmp/shmastra-sync-failure";
/// How many lines of a failed step's output the file keeps.
pub const TAIL_LINES: usize = 50;
/// The most of the tail the parser keeps, in bytes (its end); of the step and the message
/// (their start). A sandbox can write anything into the file; the status stays small.
pub const MAX_TAIL_BYTES: usize = 16 * 1024;
/// See [`MAX_TAIL_BYTES`].
pub const MAX_LINE_BYTES: usize = 4 * 1024;
/// The step of a failure whose file did not name one.
pub const UNKNOWN_STEP: &str = "unknown";

/// Why a sync failed: the step (`fetch`, `install`, ...), what went wrong, and the end of the
/// step's output (lines joined by `\n`; empty when the step printed nothing).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncFailure {
    pub step: String,
    pub message: String,
    pub tail: String,
}

impl SyncFailure {
    /// A failure without output.
    pub fn new(step: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            step: step.into(),
            message: message.into(),
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
        Self {
            step,
            message,
            tail: last_lines(rest.strip_suffix('\n').unwrap_or(rest)),
        }
    }
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
            "step: install\nerror: `npm ci` failed (exit status: 1)\nnpm ERR! missing script\nnpm ERR! see log\n"
        );
        assert_eq!(
            SyncFailure::new("open", "not a repository").render(),
            "step: open\nerror: not a repository\n"
        );
        assert_eq!(
            SyncFailure::new("stop", "a\nb\\n").render(),
            "step: stop\nerror: a\\nb\\\\n\n"
        );
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
            lines in prop::collection::vec("[^\n]{0,30}", 0..=TAIL_LINES),
        ) {
            let failure = SyncFailure::new(step, message).with_tail(&lines);
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
