//! Which remote the watcher talks to, with which token, and how it answers the server's
//! basic-auth challenge: shared by `push`, `restore` and `sync`.

use std::cell::Cell;
use std::path::PathBuf;

use git2::{Cred, CredentialType, RemoteCallbacks};

/// The env var holding the basic-auth password. Never a flag: flags show up in `ps`.
pub const TOKEN_ENV: &str = "PROJECT_TOKEN";

/// A repository's remote branch. `token` is the basic-auth password, from [`TOKEN_ENV`].
#[derive(Clone)]
pub struct RemoteSettings {
    pub workdir: PathBuf,
    pub remote: String,
    pub branch: String,
    pub token: Option<String>,
}

impl std::fmt::Debug for RemoteSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteSettings")
            .field("workdir", &self.workdir)
            .field("remote", &self.remote)
            .field("branch", &self.branch)
            .field("token", &self.token.as_ref().map(|_| "[redacted]"))
            .finish()
    }
}

/// The token from the environment; an empty value counts as none.
pub fn token_from_env() -> Option<String> {
    std::env::var(TOKEN_ENV).ok().filter(|t| !t.is_empty())
}

/// Callbacks that answer the basic-auth challenge once with `token`. libgit2 asks again after
/// a 401, and answering again would only repeat a refused token (GitLab bans an address after
/// repeated failures). `asked` counts the challenges, so a caller can tell a refused token
/// (asked more than once) from a network failure.
pub fn credentials<'a>(token: Option<&'a str>, asked: &'a Cell<u32>) -> RemoteCallbacks<'a> {
    let mut callbacks = RemoteCallbacks::new();
    callbacks.credentials(move |_url, username, allowed| {
        asked.set(asked.get() + 1);
        match token {
            Some(token)
                if asked.get() == 1 && allowed.contains(CredentialType::USER_PASS_PLAINTEXT) =>
            {
                Cred::userpass_plaintext(username.unwrap_or("project-watcher"), token)
            }
            Some(_) => Err(git2::Error::from_str(
                "the remote refused PROJECT_TOKEN (authentication failed)",
            )),
            None => Err(git2::Error::from_str(
                "the remote asks for credentials and PROJECT_TOKEN is not set",
            )),
        }
    });
    callbacks
}
