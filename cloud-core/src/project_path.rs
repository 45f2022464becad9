//! Where each user's GitLab project lives: the template `--project-path` (`GITLAB_PROJECT_PATH`),
//! default `<group>/<user>`. A deployment whose projects already exist under another naming
//! keeps them: the original system's `shmastra-user-<first 8 hex of the user id>` is
//! `<group>/shmastra-user-<user:8>`.
//!
//! The template is `<group>/` and then the project's path inside the group: letters, digits,
//! `.`, `_`, `-` around exactly one `<user>` (the whole user id) or `<user:N>` (its first N
//! characters). Both directions are here: the path of a user's project ([`ProjectPath::render`])
//! and whose project a path is ([`ProjectPath::owner`], for the webhook).

use std::fmt;

use crate::user::UserId;

/// The default template.
pub const DEFAULT_PROJECT_PATH: &str = "<group>/<user>";

/// Why a template is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "project path template {template:?}: {reason} (it is `<group>/` and then letters, digits, '.', '_', '-' around one `<user>` or `<user:N>`, e.g. `<group>/shmastra-user-<user:8>`)"
)]
pub struct ProjectPathError {
    /// The template given.
    pub template: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// How much of the user id the path holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UserPart {
    Whole,
    Prefix(usize),
}

/// A validated template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectPath {
    before: String,
    user: UserPart,
    after: String,
}

/// Whose project a path names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// The template holds the whole user id: this user's.
    User(UserId),
    /// The template holds the first characters of the user id: these, so the owner is the
    /// user whose project the caller knows to have this path.
    Prefix(String),
    /// Not a project the template names.
    Nobody,
}

impl Default for ProjectPath {
    fn default() -> Self {
        ProjectPath::parse(DEFAULT_PROJECT_PATH).expect("the default template is valid")
    }
}

impl fmt::Display for ProjectPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let user = match self.user {
            UserPart::Whole => "<user>".to_owned(),
            UserPart::Prefix(n) => format!("<user:{n}>"),
        };
        write!(f, "<group>/{}{user}{}", self.before, self.after)
    }
}

fn path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

impl ProjectPath {
    /// Checks a template.
    pub fn parse(template: &str) -> Result<ProjectPath, ProjectPathError> {
        let refuse = |reason| ProjectPathError {
            template: template.to_owned(),
            reason,
        };
        let rest = template
            .strip_prefix("<group>/")
            .ok_or_else(|| refuse("it must start with `<group>/`"))?;
        let start = rest
            .find("<user")
            .ok_or_else(|| refuse("it names no `<user>`"))?;
        let end = start
            + rest[start..]
                .find('>')
                .ok_or_else(|| refuse("an unclosed `<user`"))?;
        let user = match &rest[start + 5..end] {
            "" => UserPart::Whole,
            count => {
                let n: usize = count
                    .strip_prefix(':')
                    .and_then(|n| n.parse().ok())
                    .filter(|n| (1..=64).contains(n))
                    .ok_or_else(|| refuse("`<user:N>` takes N from 1 to 64"))?;
                UserPart::Prefix(n)
            }
        };
        let (before, after) = (&rest[..start], &rest[end + 1..]);
        if !before.chars().chain(after.chars()).all(path_char) {
            return Err(refuse(
                "only letters, digits, '.', '_', '-' may stand around the user",
            ));
        }
        if before.starts_with(['.', '-']) || after.ends_with(".git") || after.ends_with(".atom") {
            return Err(refuse(
                "GitLab refuses a path starting with '.' or '-' or ending in .git or .atom",
            ));
        }
        Ok(ProjectPath {
            before: before.to_owned(),
            user,
            after: after.to_owned(),
        })
    }

    /// The project's path inside the group (`shmastra-user-3f2a9c1e`).
    pub fn name(&self, user: &UserId) -> String {
        let id = user.as_str();
        let id = match self.user {
            UserPart::Whole => id,
            UserPart::Prefix(n) => &id[..n.min(id.len())],
        };
        format!("{}{id}{}", self.before, self.after)
    }

    /// The project's full path (`shmastra/users/shmastra-user-3f2a9c1e`) in `group` (its full
    /// path as GitLab spells it).
    pub fn render(&self, group: &str, user: &UserId) -> String {
        format!("{group}/{}", self.name(user))
    }

    /// Whose project `path` (a `path_with_namespace`) is, for projects directly in `group`.
    pub fn owner(&self, group: &str, path: &str) -> Owner {
        let Some(name) = path
            .strip_prefix(group)
            .and_then(|rest| rest.strip_prefix('/'))
            .filter(|rest| !rest.contains('/'))
        else {
            return Owner::Nobody;
        };
        let Some(id) = name
            .strip_prefix(self.before.as_str())
            .and_then(|rest| rest.strip_suffix(self.after.as_str()))
        else {
            return Owner::Nobody;
        };
        match self.user {
            UserPart::Whole => UserId::parse(id).map_or(Owner::Nobody, Owner::User),
            UserPart::Prefix(n) if id.len() == n && !id.is_empty() && id.chars().all(path_char) => {
                Owner::Prefix(id.to_owned())
            }
            UserPart::Prefix(_) => Owner::Nobody,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(id: &str) -> UserId {
        UserId::parse(id).unwrap()
    }

    #[test]
    fn templates_render_and_read_back() {
        let check = |template: &str, id: &str, path: &str| {
            let t = ProjectPath::parse(template).unwrap();
            assert_eq!(t.render("shmastra/users", &user(id)), path, "{template}");
            assert_eq!(t.to_string(), template);
            let owner = t.owner("shmastra/users", path);
            match owner {
                Owner::User(found) => assert_eq!(found, user(id)),
                Owner::Prefix(prefix) => assert!(id.starts_with(&prefix), "{prefix}"),
                Owner::Nobody => panic!("{path} is nobody's under {template}"),
            }
        };
        check("<group>/<user>", "alice", "shmastra/users/alice");
        check(
            "<group>/shmastra-user-<user:8>",
            "3f2a9c1e-77b0-4c1e-9d2a-0123456789ab",
            "shmastra/users/shmastra-user-3f2a9c1e",
        );
        check("<group>/p_<user>.work", "bob", "shmastra/users/p_bob.work");
    }

    #[test]
    fn paths_of_no_user() {
        let default = ProjectPath::default();
        let legacy = ProjectPath::parse("<group>/shmastra-user-<user:8>").unwrap();
        let g = "shmastra/users";
        for path in [
            "attacker/alice",
            "shmastra/alice",
            "shmastra/users/sub/alice",
            "shmastra/users-x/alice",
            "Shmastra/Users/alice",
            "shmastra/usersalice",
            "shmastra/users/..evil",
            "shmastra/users/Alice",
        ] {
            assert_eq!(default.owner(g, path), Owner::Nobody, "{path}");
        }
        for path in [
            "shmastra/users/shmastra-user-3f2a9c1",
            "shmastra/users/shmastra-user-3f2a9c1e0",
            "shmastra/users/alice",
            "shmastra/users/shmastra-user-",
        ] {
            assert_eq!(legacy.owner(g, path), Owner::Nobody, "{path}");
        }
    }

    #[test]
    fn bad_templates_are_refused() {
        for template in [
            "<user>",
            "group/<user>",
            "<group>/static",
            "<group>/<user:0>",
            "<group>/<user:65>",
            "<group>/<user:x>",
            "<group>/a/<user>",
            "<group>/<user>.git",
            "<group>/-<user>",
            "<group>/<user",
            "<group>/<user> x",
        ] {
            assert!(ProjectPath::parse(template).is_err(), "{template}");
        }
    }
}
