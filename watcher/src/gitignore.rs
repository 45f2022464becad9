//! Git's ignore patterns, read and matched as git does it: the parsing and precedence of
//! `dir.c` (`add_patterns_from_buffer`, `parse_path_pattern`, `match_basename`,
//! `match_pathname`, `last_matching_pattern_from_list`) and the glob matcher of
//! `wildmatch.c`, ported line by line. Bytes throughout: a rules file or a path need not be
//! UTF-8, and nothing in a rules file is ever refused (git refuses nothing either).
//!
//! `watcher/tests/rules_differential.rs` compares it with real git on generated rules.

/// One rules file's patterns, in file order, with the directory they apply under.
#[derive(Debug, Clone, Default)]
pub(crate) struct Patterns {
    /// The directory of the `.gitignore`, relative to the top, with a trailing `/`; empty for
    /// the top's and for the repository's files (`info/exclude`, `core.excludesFile`).
    base: Vec<u8>,
    patterns: Vec<Pattern>,
}

#[derive(Debug, Clone)]
struct Pattern {
    /// Without the leading `!` and the trailing `/`.
    text: Vec<u8>,
    /// How many leading bytes hold no glob character (`simple_length`).
    literal_prefix: usize,
    negative: bool,
    must_be_dir: bool,
    /// No `/` but a trailing one: matched against the basename alone.
    no_dir: bool,
    /// `*literal`: matched as a suffix.
    ends_with: bool,
}

/// Glob characters (`is_glob_special`).
fn is_glob_special(c: u8) -> bool {
    matches!(c, b'*' | b'?' | b'[' | b'\\')
}

impl Patterns {
    /// The patterns of a rules file's `bytes`, for paths under `dir` (relative to the top;
    /// empty for the top and the repository's files). As `add_patterns_from_buffer`: a UTF-8
    /// byte order mark is skipped, empty lines and lines starting with `#` are not patterns,
    /// a line's final `\r` goes, trailing spaces go unless escaped, a NUL ends the line.
    pub(crate) fn parse(bytes: &[u8], dir: &[u8]) -> Self {
        let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
        let mut base = dir.to_vec();
        if !base.is_empty() && !base.ends_with(b"/") {
            base.push(b'/');
        }
        let mut patterns = Vec::new();
        // Git appends a newline to the buffer: a last line without one is a line too.
        for line in bytes.split(|&b| b == b'\n') {
            if line.is_empty() || line[0] == b'#' {
                continue;
            }
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let line = &line[..line.iter().position(|&b| b == 0).unwrap_or(line.len())];
            patterns.push(Pattern::parse(trim_trailing_spaces(line)));
        }
        Self { base, patterns }
    }

    /// What the last pattern matching `path` (relative to the top, no trailing slash) says:
    /// `Some(true)` ignored, `Some(false)` kept by a `!` pattern, `None` when none matches.
    pub(crate) fn decide(&self, path: &[u8], is_dir: bool, ignore_case: bool) -> Option<bool> {
        let basename = path
            .iter()
            .rposition(|&b| b == b'/')
            .map_or(path, |slash| &path[slash + 1..]);
        self.patterns
            .iter()
            .rev()
            .find(|p| {
                if p.must_be_dir && !is_dir {
                    return false;
                }
                if p.no_dir {
                    p.matches_basename(basename, ignore_case)
                } else {
                    p.matches_pathname(path, &self.base, ignore_case)
                }
            })
            .map(|p| !p.negative)
    }
}

/// `trim_trailing_spaces`: spaces at the end go, unless a backslash escapes the first of them.
fn trim_trailing_spaces(line: &[u8]) -> &[u8] {
    let mut last_space = None;
    let mut i = 0;
    while i < line.len() {
        match line[i] {
            b' ' => {
                if last_space.is_none() {
                    last_space = Some(i);
                }
            }
            b'\\' => {
                i += 1;
                if i >= line.len() {
                    return line;
                }
                last_space = None;
            }
            _ => last_space = None,
        }
        i += 1;
    }
    &line[..last_space.unwrap_or(line.len())]
}

/// Byte comparison, folding ASCII case when asked (`fspathncmp` under `core.ignoreCase`).
fn same_bytes(a: &[u8], b: &[u8], ignore_case: bool) -> bool {
    if ignore_case {
        a.eq_ignore_ascii_case(b)
    } else {
        a == b
    }
}

impl Pattern {
    /// `parse_path_pattern`.
    fn parse(line: &[u8]) -> Self {
        let (negative, rest) = match line.strip_prefix(b"!") {
            Some(rest) => (true, rest),
            None => (false, line),
        };
        let (must_be_dir, text) = match rest.strip_suffix(b"/") {
            Some(text) => (true, text),
            None => (false, rest),
        };
        let simple = |s: &[u8]| {
            s.iter()
                .position(|&c| is_glob_special(c))
                .unwrap_or(s.len())
        };
        Self {
            literal_prefix: simple(rest).min(text.len()),
            no_dir: !text.contains(&b'/'),
            ends_with: text.first() == Some(&b'*') && simple(&rest[1..]) == rest.len() - 1,
            negative,
            must_be_dir,
            text: text.to_vec(),
        }
    }

    /// `match_basename`.
    fn matches_basename(&self, basename: &[u8], ignore_case: bool) -> bool {
        let pattern = &self.text;
        if self.literal_prefix == pattern.len() {
            same_bytes(pattern, basename, ignore_case)
        } else if self.ends_with {
            let suffix = &pattern[1..];
            suffix.len() <= basename.len()
                && same_bytes(
                    suffix,
                    &basename[basename.len() - suffix.len()..],
                    ignore_case,
                )
        } else {
            wildmatch(pattern, basename, false, ignore_case)
        }
    }

    /// `match_pathname`: the pattern has `base` (its file's directory) in front of it.
    fn matches_pathname(&self, path: &[u8], base: &[u8], ignore_case: bool) -> bool {
        let (mut pattern, mut prefix) = (&self.text[..], self.literal_prefix);
        if let Some(rest) = pattern.strip_prefix(b"/") {
            pattern = rest;
            prefix = prefix.saturating_sub(1);
        }
        let base = base.strip_suffix(b"/").unwrap_or(base);
        if path.len() < base.len() + 1
            || (!base.is_empty() && path[base.len()] != b'/')
            || !same_bytes(&path[..base.len()], base, ignore_case)
        {
            return false;
        }
        let mut name = if base.is_empty() {
            path
        } else {
            &path[base.len() + 1..]
        };
        if prefix > 0 {
            if prefix > name.len() || !same_bytes(&pattern[..prefix], &name[..prefix], ignore_case)
            {
                return false;
            }
            pattern = &pattern[prefix..];
            name = &name[prefix..];
            if pattern.is_empty() && name.is_empty() {
                return true;
            }
        }
        wildmatch(pattern, name, true, ignore_case)
    }
}

/// The results of `dowild`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wild {
    Match,
    NoMatch,
    AbortAll,
    AbortToStarStar,
}

/// Whether `text` matches the glob `pattern`, as git's `wildmatch` with `WM_PATHNAME`
/// (`pathname`: `*` and `?` do not match `/`, `**` between slashes matches any depth) and
/// `WM_CASEFOLD` (`casefold`).
pub(crate) fn wildmatch(pattern: &[u8], text: &[u8], pathname: bool, casefold: bool) -> bool {
    dowild(pattern, text, pathname, casefold) == Wild::Match
}

fn fold(c: u8, casefold: bool) -> u8 {
    if casefold { c.to_ascii_lowercase() } else { c }
}

/// `dowild`, with the pattern and the text as slices (git's end of string is their end).
fn dowild(pattern: &[u8], text: &[u8], pathname: bool, casefold: bool) -> Wild {
    let at = |s: &[u8], i: usize| s.get(i).copied().unwrap_or(0);
    let (mut p, mut t) = (0, 0);
    while p < pattern.len() {
        let mut p_ch = at(pattern, p);
        let t_ch = at(text, t);
        if t >= text.len() && p_ch != b'*' {
            return Wild::AbortAll;
        }
        let t_ch = fold(t_ch, casefold);
        p_ch = fold(p_ch, casefold);
        match p_ch {
            b'?' => {
                if pathname && t_ch == b'/' {
                    return Wild::NoMatch;
                }
            }
            b'*' => {
                let match_slash;
                p += 1;
                if at(pattern, p) == b'*' {
                    let prev_p = p;
                    while at(pattern, p + 1) == b'*' {
                        p += 1;
                    }
                    p += 1;
                    if !pathname {
                        match_slash = true;
                    } else if (prev_p < 2 || pattern[prev_p - 2] == b'/')
                        && (p >= pattern.len()
                            || pattern[p] == b'/'
                            || (pattern[p] == b'\\' && at(pattern, p + 1) == b'/'))
                    {
                        if at(pattern, p) == b'/'
                            && dowild(&pattern[p + 1..], &text[t..], pathname, casefold)
                                == Wild::Match
                        {
                            return Wild::Match;
                        }
                        match_slash = true;
                    } else {
                        match_slash = false;
                    }
                } else {
                    match_slash = !pathname;
                }
                if p >= pattern.len() {
                    // A trailing `**` matches everything, a trailing `*` no slash.
                    if !match_slash && text[t..].contains(&b'/') {
                        return Wild::AbortToStarStar;
                    }
                    return Wild::Match;
                } else if !match_slash && pattern[p] == b'/' {
                    // One `*` then a slash: the rest of this directory's name; the slash
                    // itself is matched by the loop's next step.
                    let Some(slash) = text[t..].iter().position(|&c| c == b'/') else {
                        return Wild::AbortAll;
                    };
                    t += slash;
                    p += 1;
                    t += 1;
                    continue;
                }
                let mut t_ch = t_ch;
                loop {
                    if t >= text.len() {
                        break;
                    }
                    // Faster when a literal follows the star: the text up to it is the star's.
                    if !is_glob_special(pattern[p]) {
                        let p_lit = fold(pattern[p], casefold);
                        while t < text.len() && (match_slash || text[t] != b'/') {
                            t_ch = fold(text[t], casefold);
                            if t_ch == p_lit {
                                break;
                            }
                            t += 1;
                        }
                        if t >= text.len() || fold(text[t], casefold) != p_lit {
                            return if match_slash {
                                Wild::AbortAll
                            } else {
                                Wild::AbortToStarStar
                            };
                        }
                        t_ch = p_lit;
                    }
                    let matched = dowild(&pattern[p..], &text[t..], pathname, casefold);
                    if matched != Wild::NoMatch {
                        if !match_slash || matched != Wild::AbortToStarStar {
                            return matched;
                        }
                    } else if !match_slash && t_ch == b'/' {
                        return Wild::AbortToStarStar;
                    }
                    t += 1;
                    t_ch = fold(at(text, t), casefold);
                }
                return Wild::AbortAll;
            }
            b'[' => match class(pattern, &mut p, t_ch, casefold) {
                Some(matched) => {
                    if !matched || (pathname && t_ch == b'/') {
                        return Wild::NoMatch;
                    }
                }
                None => return Wild::AbortAll,
            },
            _ => {
                if p_ch == b'\\' {
                    // A literal: the next character, not case-folded (none matches nothing).
                    p += 1;
                    p_ch = at(pattern, p);
                }
                if t_ch != p_ch {
                    return Wild::NoMatch;
                }
            }
        }
        p += 1;
        t += 1;
    }
    if t < text.len() {
        Wild::NoMatch
    } else {
        Wild::Match
    }
}

/// A `[...]` class at `pattern[*p]` against `t_ch`: whether it matched (negation applied),
/// `None` when the class never closes or names an unknown `[:class:]`. Leaves `*p` on the
/// closing `]`.
fn class(pattern: &[u8], p: &mut usize, t_ch: u8, casefold: bool) -> Option<bool> {
    let at = |i: usize| pattern.get(i).copied().unwrap_or(0);
    *p += 1;
    let mut p_ch = at(*p);
    if p_ch == b'^' {
        p_ch = b'!';
    }
    let negated = p_ch == b'!';
    if negated {
        *p += 1;
        p_ch = at(*p);
    }
    let mut prev_ch = 0u8;
    let mut matched = false;
    loop {
        if p_ch == 0 {
            return None;
        }
        if p_ch == b'\\' {
            *p += 1;
            p_ch = at(*p);
            if p_ch == 0 {
                return None;
            }
            if t_ch == p_ch {
                matched = true;
            }
        } else if p_ch == b'-' && prev_ch != 0 && at(*p + 1) != 0 && at(*p + 1) != b']' {
            *p += 1;
            p_ch = at(*p);
            if p_ch == b'\\' {
                *p += 1;
                p_ch = at(*p);
                if p_ch == 0 {
                    return None;
                }
            }
            if t_ch <= p_ch && t_ch >= prev_ch {
                matched = true;
            } else if casefold && t_ch.is_ascii_lowercase() {
                let upper = t_ch.to_ascii_uppercase();
                if upper <= p_ch && upper >= prev_ch {
                    matched = true;
                }
            }
            p_ch = 0;
        } else if p_ch == b'[' && at(*p + 1) == b':' {
            let s = *p + 2;
            let mut e = s;
            while at(e) != 0 && at(e) != b']' {
                e += 1;
            }
            if at(e) == 0 {
                return None;
            }
            if e < s + 1 || pattern[e - 1] != b':' {
                // No `:]`: a plain `[` in the set.
                *p = s - 2;
                p_ch = b'[';
                if t_ch == p_ch {
                    matched = true;
                }
                prev_ch = p_ch;
                *p += 1;
                p_ch = at(*p);
                if p_ch == b']' {
                    break;
                }
                continue;
            }
            *p = e;
            let name = &pattern[s..e - 1];
            let hit = match name {
                b"alnum" => t_ch.is_ascii_alphanumeric(),
                b"alpha" => t_ch.is_ascii_alphabetic(),
                b"blank" => t_ch == b' ' || t_ch == b'\t',
                b"cntrl" => t_ch.is_ascii_control(),
                b"digit" => t_ch.is_ascii_digit(),
                b"graph" => t_ch.is_ascii_graphic(),
                b"lower" => t_ch.is_ascii_lowercase(),
                b"print" => (0x20..=0x7e).contains(&t_ch),
                b"punct" => t_ch.is_ascii_punctuation(),
                b"space" => matches!(t_ch, b' ' | b'\t' | b'\n' | b'\r'),
                b"upper" => t_ch.is_ascii_uppercase() || (casefold && t_ch.is_ascii_lowercase()),
                b"xdigit" => t_ch.is_ascii_hexdigit(),
                _ => return None,
            };
            if hit {
                matched = true;
            }
            p_ch = 0;
        } else if t_ch == p_ch {
            matched = true;
        }
        prev_ch = p_ch;
        *p += 1;
        p_ch = at(*p);
        if p_ch == b']' {
            break;
        }
    }
    Some(matched != negated)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_as_wildmatch_does() {
        // (pattern, text, WM_PATHNAME, matches)
        let check = |pattern: &str, text: &str, pathname: bool, expected: bool| {
            assert_eq!(
                wildmatch(pattern.as_bytes(), text.as_bytes(), pathname, false),
                expected,
                "{pattern:?} {text:?} pathname={pathname}"
            );
        };
        check("foo", "foo", true, true);
        check("foo", "bar", true, false);
        check("???", "foo", true, true);
        check("*", "foo", true, true);
        check("*f", "foo", true, false);
        check("*ob*a*r*", "foobar", true, true);
        check("foo\\*", "foo*", true, true);
        check("*[al]?", "ball", true, true);
        check("[ten]", "ten", true, false);
        check("**[!te]", "ten", true, true);
        check("t[a-g]n", "ten", true, true);
        check("t[!a-g]n", "ten", true, false);
        check("foo*bar", "foo/baz/bar", true, false);
        check("foo*bar", "foo/baz/bar", false, true);
        check("foo**bar", "foo/baz/bar", true, false);
        check("foo/**/bar", "foo/baz/bar", true, true);
        check("foo/**/bar", "foo/bar", true, true);
        check("foo/**/bar", "foo/b/a/z/bar", true, true);
        check("**/foo", "a/b/foo", true, true);
        check("***/foo", "a/b/foo", true, true);
        check("a/***/x", "a/b/c/x", true, true);
        check("a**/b", "a/c/b", true, false);
        check("**/b", "/c/d/b", true, true);
        check("foo/*", "foo/bar/baz", true, false);
        check("*/bar", "foo/bar", true, true);
        check("[[:alpha:]]x", "ax", true, true);
        check("[[:digit:][:upper:]]", "Q", true, true);
        check("[[:nope:]]", "a", true, false);
        check("[a", "a", true, false);
        check("[!]-]", "]", true, false);
        check("[]-]", "-", true, true);
        check("a\\", "a", true, false);
        check("[\\]]", "]", true, true);
        check("*.{js,map}", "a.{js,map}", true, true);
        check("*.{js,map}", "a.js", true, false);
        check("f\u{fffd}*", "f\u{fffd}x", true, true);
    }

    #[test]
    fn case_folds_only_when_asked() {
        assert!(wildmatch(b"A.TXT", b"a.txt", true, true));
        assert!(!wildmatch(b"A.TXT", b"a.txt", true, false));
        assert!(wildmatch(b"[A-C]x", b"bx", true, true));
    }

    #[test]
    fn lines_and_precedence_as_git_reads_them() {
        let check = |file: &[u8], dir: &[u8], path: &[u8], is_dir: bool, expected: Option<bool>| {
            let rules = Patterns::parse(file, dir);
            assert_eq!(
                rules.decide(path, is_dir, false),
                expected,
                "{:?} in {:?}: {:?}",
                String::from_utf8_lossy(file),
                String::from_utf8_lossy(dir),
                String::from_utf8_lossy(path)
            );
        };
        check(
            b"*.log\n!keep.log\n",
            b"",
            b"a/keep.log",
            false,
            Some(false),
        );
        check(b"*.log\n!keep.log\n", b"", b"a/x.log", false, Some(true));
        check(b"!keep.log\n*.log\n", b"", b"keep.log", false, Some(true));
        check(b"build/\n", b"", b"build", false, None);
        check(b"build/\n", b"", b"build", true, Some(true));
        check(b"/top\n", b"", b"a/top", false, None);
        check(b"/top\n", b"", b"top", false, Some(true));
        check(b"a/b\n", b"x", b"x/a/b", false, Some(true));
        check(b"a/b\n", b"x", b"a/b", false, None);
        check(b"\xEF\xBB\xBFbom\n", b"", b"bom", false, Some(true));
        check(b"crlf\r\n", b"", b"crlf", false, Some(true));
        check(b"trail  \n", b"", b"trail", false, Some(true));
        check(b"trail\\ \n", b"", b"trail ", false, Some(true));
        check(b"#c\n\\#c\n", b"", b"#c", false, Some(true));
        check(b"\\!bang\n", b"", b"!bang", false, Some(true));
        check(b"f\xff*\n", b"", b"f\xffx", false, Some(true));
        check(b"nul\0ignored\n", b"", b"nul", false, Some(true));
        check(b"last", b"", b"last", false, Some(true));
        // The literal prefix is compared first, so the `**` after it starts the glob.
        check(b"a**/b\n", b"", b"a/c/d/b", false, Some(true));
        check(b"   \n/\n", b"", b"x", true, None);
    }

    #[test]
    fn literal_and_suffix_shortcuts_agree_with_the_glob() {
        for (pattern, name) in [
            ("*.log", "a.log"),
            ("*.log", "log"),
            ("abc", "abc"),
            ("*", "x"),
        ] {
            let p = Pattern::parse(pattern.as_bytes());
            assert_eq!(
                p.matches_basename(name.as_bytes(), false),
                wildmatch(pattern.as_bytes(), name.as_bytes(), false, false),
                "{pattern} {name}"
            );
        }
    }
}
