//! The adapters: GitLab and the embedded upstream, each wired to every seam the services and
//! the page define (`ProjectHost`, `ProjectPages`, `SaveHistory`, `Upstream`, `RepoLocator`,
//! `GroupPath`). They sit above the services so that no service imports another's host.

mod bounded;
pub mod embedded;
mod gitlab;
