//! The user id: validated once at the edge, then safe as a path component, a GitLab project
//! path and a token subject everywhere else.

use std::fmt;

/// Longest accepted user id, in bytes (all allowed characters are ASCII).
pub const MAX_USER_ID_LEN: usize = 64;

/// A user id: 1..=64 characters of `[a-z0-9._-]`, not starting with `.` or `-`, without
/// `..`, and not ending in `.git` or `.atom` (GitLab reserves those project path endings).
///
/// Upper case is refused, not folded: GitLab resolves project paths case-insensitively, so
/// `Alice` and `alice` would reach one project, and folding would merge two tenants silently.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UserId(String);

/// Why a string is not a user id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid user id {shown:?}: {reason}")]
pub struct InvalidUserId {
    /// The rejected input, cut to a printable length.
    pub shown: String,
    /// What rule it broke.
    pub reason: &'static str,
}

impl UserId {
    /// Validates `input` as a user id.
    pub fn parse(input: &str) -> Result<UserId, InvalidUserId> {
        let reject = |reason| InvalidUserId {
            shown: input.chars().take(80).collect(),
            reason,
        };
        if input.is_empty() {
            return Err(reject("it is empty"));
        }
        if input.len() > MAX_USER_ID_LEN {
            return Err(reject("it is longer than 64 characters"));
        }
        if !input
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            return Err(reject(
                "only lower-case letters, digits, '.', '_' and '-' are allowed",
            ));
        }
        if input.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(reject(
                "upper-case letters are not allowed (GitLab project paths ignore case, so ids differing only in case would share a project)",
            ));
        }
        if input.starts_with(['.', '-']) {
            return Err(reject("it must not start with '.' or '-'"));
        }
        if input.contains("..") {
            return Err(reject("it must not contain '..'"));
        }
        if input.ends_with(".git") || input.ends_with(".atom") {
            return Err(reject("it must not end in '.git' or '.atom'"));
        }
        Ok(UserId(input.to_owned()))
    }

    /// The id as validated.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UserId({:?})", self.0)
    }
}

impl std::str::FromStr for UserId {
    type Err = InvalidUserId;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        UserId::parse(s)
    }
}

impl AsRef<str> for UserId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: &str, ok: bool) {
        assert_eq!(UserId::parse(input).is_ok(), ok, "{input:?}");
    }

    #[test]
    fn accepts_and_rejects() {
        check("alice", true);
        check("user_42.dev-x", true);
        check("a", true);
        check("A", false);
        check("Alice", false);
        check("aLICE", false);
        check(&"a".repeat(64), true);
        check(&"a".repeat(65), false);
        check("", false);
        check(".hidden", false);
        check("-flag", false);
        check("a..b", false);
        check("a/b", false);
        check("a b", false);
        check("é", false);
        check("a\0b", false);
        check("repo.git", false);
        check("feed.atom", false);
    }

    #[test]
    fn error_names_the_rule_and_cuts_long_input() {
        let err = UserId::parse(&"x/".repeat(100)).unwrap_err();
        assert_eq!(err.shown.chars().count(), 80);
        assert!(err.to_string().contains("longer than 64"), "{err}");
    }
}
