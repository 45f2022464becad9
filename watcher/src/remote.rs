//! Which remote the watcher talks to and with which token: shared by `push`, `restore` and
//! `sync`. The token reaches the HTTP requests through [`crate::transport::with_token`].

use std::path::PathBuf;

use shmastra_contract::env::PROJECT_TOKEN;

/// A repository's remote branch. `token` is the basic-auth password, from [`PROJECT_TOKEN`]
/// (never a flag: flags show up in `ps`).
#[derive(Clone)]
pub struct RemoteSettings {
    /// The project's top directory.
    pub workdir: PathBuf,
    /// The remote's name.
    pub remote: String,
    /// The branch on that remote.
    pub branch: String,
    /// The basic-auth password of HTTP requests to it.
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
    std::env::var(PROJECT_TOKEN).ok().filter(|t| !t.is_empty())
}
