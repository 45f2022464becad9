//! What the services ask of the place where user projects live (GitLab in production, the
//! embedded upstream on one machine). The implementations are in [`crate::hosts`], beside
//! each other, so no service imports another service's host.

use std::future::Future;

use crate::user::UserId;

/// Where user projects are created.
pub trait ProjectHost: Send + Sync {
    /// Why a project could not be made.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Makes `user`'s project exist; nothing when it does.
    fn ensure_project(&self, user: &UserId)
    -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Whether the same call may succeed later without anyone changing the setup.
    fn is_transient(error: &Self::Error) -> bool;
}

/// What the workspace page needs from the host, beyond its history.
pub trait ProjectPages: ProjectHost + Sized + 'static {
    /// Where the project button leads.
    fn link(&self, user: &UserId) -> impl Future<Output = HostLink> + Send;
    /// One save's diff.
    fn diff(&self, user: &UserId, commit: &str) -> impl Future<Output = Diff> + Send;
}

/// Where a user's project is reached.
pub enum HostLink {
    /// A page of the host (GitLab's project page).
    WebUrl(String),
    /// Through this server's git proxy: the clone URL and the project token.
    CloneHere,
    /// The host cannot say now.
    Unavailable,
}

/// A save's diff: the diff, or where it is shown.
pub enum Diff {
    /// The diff itself, per file (cut at the page's limit).
    Save(crate::patch::SaveDiff),
    /// The host shows it at this URL.
    Elsewhere(String),
    /// There is no such save, or it cannot be read now: why.
    Missing(String),
    /// The user has as many git commands running for the page as they may.
    Busy,
}
