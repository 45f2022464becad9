//! Git's commit message trailers (`Token: value` lines at the end of a message), found as
//! `git interpret-trailers --parse` finds them: the same rules as git's `trailer.c` and
//! `commit.c`, with git's default settings (separator `:`, comment character `#`, no
//! `trailer.*` configuration). `contract/tests/trailers_oracle.rs` runs real git on generated
//! messages and compares.
//!
//! The rules, in git's order:
//! - the message ends before a `---` line (the patch part of `format-patch`), before the
//!   `# ------------------------ >8 ------------------------` scissors line, and before the
//!   trailing run of comment lines, blank lines and old `Conflicts:` blocks;
//! - the first paragraph is the title and never holds trailers;
//! - the trailer block is the last paragraph when all its lines are trailers (continuation
//!   lines, which start with white space, belong to the trailer above them), or when it holds
//!   a line git itself writes (`Signed-off-by: `, `(cherry picked from commit `) and at least
//!   a quarter of its lines are trailers;
//! - a trailer line is a token of letters, digits and `-`, optional white space, then `:`;
//!   the token and the value are trimmed, a folded value is unfolded to one line.

/// One trailer: its token (as written, case kept) and its unfolded value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trailer {
    /// The token before the `:`, trimmed: `Saved-by`.
    pub token: String,
    /// The value after it, trimmed and on one line.
    pub value: String,
}

/// The lines git writes as trailers itself, recognised in a block that is not all trailers.
const GIT_GENERATED_PREFIXES: [&[u8]; 2] = [b"Signed-off-by: ", b"(cherry picked from commit "];
const COMMENT: &[u8] = b"#";
const SCISSORS: &[u8] = b"# ------------------------ >8 ------------------------\n";

/// The trailers of `message`, in order, as `git interpret-trailers --parse` lists them.
pub fn parse(message: &str) -> Vec<Trailer> {
    let buf = input(message);
    let end = end_of_log_message(&buf);
    let start = trailer_block_start(&buf, end);
    let mut lines: Vec<Vec<u8>> = Vec::new();
    let mut last_is_trailer = false;
    for line in buf[start..end].split_inclusive(|&b| b == b'\n') {
        if last_is_trailer && line.first().is_some_and(|&b| is_space(b)) {
            lines
                .last_mut()
                .expect("a trailer came before")
                .extend_from_slice(line);
            continue;
        }
        last_is_trailer = separator(line).is_some_and(|at| at >= 1);
        lines.push(line.to_vec());
    }
    lines
        .iter()
        .filter(|line| !line.starts_with(COMMENT))
        .filter_map(|line| {
            let at = separator(line).filter(|&at| at >= 1)?;
            Some(Trailer {
                token: text(trim(&line[..at])),
                value: text(&unfold(trim(&line[at + 1..]))),
            })
        })
        .collect()
}

/// Where the trailer block of `message` starts (a byte offset), or `None` when it has none.
pub fn block_start(message: &str) -> Option<usize> {
    let buf = input(message);
    let end = end_of_log_message(&buf);
    let start = trailer_block_start(&buf, end);
    (start < end).then_some(start)
}

/// The message as git reads it: ending in a newline (`interpret-trailers` completes the last
/// line), then up to a NUL (git parses it as a C string).
fn input(message: &str) -> Vec<u8> {
    let mut buf = message.as_bytes().to_vec();
    if !buf.is_empty() && !buf.ends_with(b"\n") {
        buf.push(b'\n');
    }
    if let Some(nul) = buf.iter().position(|&b| b == 0) {
        buf.truncate(nul);
    }
    buf
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Git's `isspace`: only these four (its own ctype table, not the C library's).
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

fn trim(mut bytes: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = bytes
        && is_space(*first)
    {
        bytes = rest;
    }
    while let [rest @ .., last] = bytes
        && is_space(*last)
    {
        bytes = rest;
    }
    bytes
}

/// `unfold_value`: each line break and the white space after it become one space.
fn unfold(value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.len());
    let mut i = 0;
    while i < value.len() {
        let mut c = value[i];
        i += 1;
        if c == b'\n' {
            while i < value.len() && is_space(value[i]) {
                i += 1;
            }
            c = b' ';
        }
        out.push(c);
    }
    trim(&out).to_vec()
}

/// `find_separator`: the offset of the `:` after a token (letters, digits, `-`) and optional
/// white space; `Some(0)` for a line that starts with it, `None` for any other line.
fn separator(line: &[u8]) -> Option<usize> {
    let mut whitespace_found = false;
    for (i, &c) in line.iter().enumerate() {
        if c == b':' {
            return Some(i);
        }
        if !whitespace_found && (c.is_ascii_alphanumeric() || c == b'-') {
            continue;
        }
        if i != 0 && (c == b' ' || c == b'\t') {
            whitespace_found = true;
            continue;
        }
        break;
    }
    None
}

/// The start of the line after the one starting at `at`.
fn next_line(buf: &[u8], at: usize) -> usize {
    buf[at..]
        .iter()
        .position(|&b| b == b'\n')
        .map_or(buf.len(), |nl| at + nl + 1)
}

/// Git's `is_blank_line`: nothing but white space up to the end of the line.
fn is_blank_line(line: &[u8]) -> bool {
    line.iter()
        .take_while(|&&b| b != b'\n')
        .all(|&b| is_space(b))
}

/// `last_line`: the start of the last line of `buf[..len]` (its final newline belongs to it).
fn last_line(buf: &[u8], len: usize) -> Option<usize> {
    match len {
        0 => None,
        1 => Some(0),
        _ => Some(
            buf[..len - 1]
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(0, |nl| nl + 1),
        ),
    }
}

/// `find_end_of_log_message`: before a `---` divider line, then without what
/// `ignored_log_message_bytes` leaves out.
fn end_of_log_message(buf: &[u8]) -> usize {
    let mut end = buf.len();
    let mut s = 0;
    while s < buf.len() {
        if buf[s..].starts_with(b"---") && buf.get(s + 3).is_some_and(|&b| is_space(b)) {
            end = s;
            break;
        }
        s = next_line(buf, s);
    }
    end - ignored_log_message_bytes(buf, end)
}

/// `wt_status_locate_end`: the message ends before the scissors line.
fn locate_end(buf: &[u8], len: usize) -> usize {
    if buf.starts_with(SCISSORS) {
        return 0;
    }
    let mut pattern = b"\n".to_vec();
    pattern.extend_from_slice(SCISSORS);
    match buf.windows(pattern.len()).position(|w| w == pattern) {
        Some(at) => len.min(at + 1),
        None => len,
    }
}

/// `ignored_log_message_bytes`: the trailing comments, blank lines and `Conflicts:` blocks of
/// `buf[..len]`, and everything from the scissors line on.
fn ignored_log_message_bytes(buf: &[u8], len: usize) -> usize {
    let cutoff = locate_end(buf, len);
    // Git marks "no run yet" with 0, so a run that starts at the very beginning is not one.
    let mut boc = 0;
    let mut in_old_conflicts_block = false;
    let mut bol = 0;
    while bol < cutoff {
        let next = buf[bol..len]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(len, |nl| bol + nl + 1);
        let line = &buf[bol..];
        if buf[bol..cutoff].starts_with(COMMENT) || buf[bol] == b'\n' {
            if boc == 0 {
                boc = bol;
            }
        } else if line.starts_with(b"Conflicts:\n") {
            in_old_conflicts_block = true;
            if boc == 0 {
                boc = bol;
            }
        } else if boc != 0 && !(in_old_conflicts_block && buf[bol] == b'\t') {
            boc = 0;
            in_old_conflicts_block = false;
        }
        bol = next;
    }
    if boc != 0 { len - boc } else { len - cutoff }
}

/// `find_trailer_block_start`: the start of the trailer block of `buf[..len]`, or `len`.
fn trailer_block_start(buf: &[u8], len: usize) -> usize {
    let mut s = 0;
    while s < len {
        if buf[s..len].starts_with(COMMENT) {
            s = next_line(buf, s);
            continue;
        }
        if is_blank_line(&buf[s..]) {
            break;
        }
        s = next_line(buf, s);
    }
    let end_of_title = s;
    let mut only_spaces = true;
    let mut recognized_prefix = false;
    let (mut trailer_lines, mut non_trailer_lines, mut possible_continuation_lines) = (0, 0, 0);
    let mut l = last_line(buf, len);
    while let Some(at) = l.filter(|&at| at >= end_of_title) {
        l = last_line(buf, at);
        let bol = &buf[at..];
        if buf[at..len].starts_with(COMMENT) {
            non_trailer_lines += possible_continuation_lines;
            possible_continuation_lines = 0;
            continue;
        }
        if is_blank_line(bol) {
            if only_spaces {
                continue;
            }
            non_trailer_lines += possible_continuation_lines;
            if (recognized_prefix && trailer_lines * 3 >= non_trailer_lines)
                || (trailer_lines > 0 && non_trailer_lines == 0)
            {
                return next_line(buf, at);
            }
            return len;
        }
        only_spaces = false;
        if GIT_GENERATED_PREFIXES.iter().any(|p| bol.starts_with(p)) {
            trailer_lines += 1;
            possible_continuation_lines = 0;
            recognized_prefix = true;
            continue;
        }
        let starts_with_space = is_space(bol[0]);
        if separator(bol).is_some_and(|at| at >= 1) && !starts_with_space {
            trailer_lines += 1;
            possible_continuation_lines = 0;
        } else if starts_with_space {
            possible_continuation_lines += 1;
        } else {
            non_trailer_lines += 1 + possible_continuation_lines;
            possible_continuation_lines = 0;
        }
    }
    len
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(message: &str, expected: &[(&str, &str)]) {
        let got: Vec<(String, String)> = parse(message)
            .into_iter()
            .map(|t| (t.token, t.value))
            .collect();
        let expected: Vec<(String, String)> = expected
            .iter()
            .map(|(t, v)| ((*t).to_owned(), (*v).to_owned()))
            .collect();
        assert_eq!(got, expected, "{message:?}");
    }

    #[test]
    fn trailers_as_git_finds_them() {
        check("subject\n\nA: b\n", &[("A", "b")]);
        check("subject\n\nA: b", &[("A", "b")]);
        check("A: b\n", &[]);
        check(
            "subject\n\nbody\n\nA: b\nC : d e\n",
            &[("A", "b"), ("C", "d e")],
        );
        check("subject\n\nA: b\nnot one\n", &[]);
        check(
            "subject\n\nA: b\n  folded\n  twice\n",
            &[("A", "b folded twice")],
        );
        check(
            "subject\n\nSigned-off-by: x\nnot one\nnot two\n",
            &[("Signed-off-by", "x")],
        );
        check(
            "subject\n\nSigned-off-by: x\nno\nno\nno\n",
            &[("Signed-off-by", "x")],
        );
        check("subject\n\nSigned-off-by: x\nno\nno\nno\nno\n", &[]);
        check("subject\n\nA: b\n\n# a comment\n\n", &[("A", "b")]);
        check("subject\n\nA: b\n--- \npatch\n", &[("A", "b")]);
        check("subject\n\nA: b\n---x\n", &[]);
        check(
            "subject\n\nA: b\n# ------------------------ >8 ------------------------\nC: d\n",
            &[("A", "b")],
        );
        check("subject\n\nA B: c\n", &[]);
        check("subject\n\n: c\n", &[]);
        check("subject\n\nA:\n", &[("A", "")]);
        check("subject\n\nA: b\0\nC: d\n", &[("A", "b")]);
    }

    #[test]
    fn the_block_starts_after_the_last_blank_line() {
        let message = "subject\n\nbody\n\nA: b\n";
        assert_eq!(block_start(message), Some(message.find("A:").unwrap()));
        assert_eq!(block_start("subject\n\nbody\n"), None);
    }
}
