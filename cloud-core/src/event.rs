//! The external-push event: what the proxy and the GitLab webhook report, and what the job
//! queue and orchestration consume. It lives here, not in the proxy, so that orchestration and
//! the store depend on the event and not on the proxy that produces it.

use std::sync::Arc;

use crate::user::UserId;

/// A branch moved by someone other than the sandbox's own watcher: the cloud starts a sync.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ExternalPush {
    /// Whose project moved.
    pub user: UserId,
    /// The full ref name, e.g. `refs/heads/main`.
    pub refname: String,
    /// The commit the ref moved to.
    pub new_oid: String,
}

/// Receives external pushes. Called from the request path: it must return quickly (spawn the
/// slow work).
pub type OnExternalPush = Arc<dyn Fn(ExternalPush) + Send + Sync>;
