//! External-push events: what the proxy and the GitLab webhook report to the cloud, and the
//! memory of recent pushes that keeps one push from being reported twice.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use crate::UserId;

/// A branch moved by someone other than the sandbox's own watcher: the cloud starts a sync.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ExternalPush {
    pub user: UserId,
    /// The full ref name, e.g. `refs/heads/main`.
    pub refname: String,
    pub new_oid: String,
}

/// Receives external pushes. Called from the request path: it must return quickly (spawn the
/// slow work).
pub type OnExternalPush = Arc<dyn Fn(ExternalPush) + Send + Sync>;

/// How many pushes the proxy remembers for the webhook's de-duplication: GitLab's webhook for
/// a proxied push arrives within seconds, far fewer pushes than this later.
const REMEMBERED: usize = 4096;

/// The branch updates the proxy saw applied lately, watcher's or not. A GitLab webhook for one
/// of them is an echo, not a push made directly to GitLab.
#[derive(Debug, Default)]
pub struct RecentPushes {
    seen: Mutex<VecDeque<ExternalPush>>,
}

impl RecentPushes {
    pub fn record(&self, push: ExternalPush) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.len() == REMEMBERED {
            seen.pop_front();
        }
        seen.push_back(push);
    }

    pub fn contains(&self, push: &ExternalPush) -> bool {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.contains(push)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(n: usize) -> ExternalPush {
        ExternalPush {
            user: UserId::parse("alice").expect("valid"),
            refname: "refs/heads/main".into(),
            new_oid: format!("{n:040x}"),
        }
    }

    #[test]
    fn remembers_the_latest_pushes_only() {
        let recent = RecentPushes::default();
        for n in 0..=REMEMBERED {
            recent.record(push(n));
        }
        assert!(!recent.contains(&push(0)), "the oldest is forgotten");
        assert!(recent.contains(&push(1)));
        assert!(recent.contains(&push(REMEMBERED)));
        assert!(!recent.contains(&push(REMEMBERED + 1)));
    }
}
