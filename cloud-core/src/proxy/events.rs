//! External-push events: what the proxy and the GitLab webhook report to the cloud, and the
//! memory of recent pushes that keeps one push from being reported twice.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};

use crate::event::{ExternalPush, OnExternalPush};
use crate::store::Store;
use crate::user::UserId;

/// How many branch updates the proxy remembers per user for the webhook's de-duplication:
/// GitLab's webhook for a proxied push arrives within seconds, far fewer updates than this
/// later. Per user, so one user's pushes never evict another's.
const REMEMBERED_PER_USER: usize = 64;

/// The branch updates the proxy saw applied lately (the server reported them `ok`), watcher's
/// or not. A GitLab webhook for one of them is an echo, not a push made directly to GitLab.
/// Kept in this process, and in the shared store once one is attached, so a webhook that
/// reaches another replica knows the echo too.
#[derive(Default)]
pub struct RecentPushes {
    seen: Mutex<HashMap<UserId, VecDeque<(String, String)>>>,
    store: OnceLock<Arc<dyn Store>>,
    /// Told of every update recorded (the workspace page's live history).
    listener: OnceLock<OnExternalPush>,
}

impl RecentPushes {
    /// Also remembers pushes in `store` (the first store attached stays).
    pub(crate) fn attach_store(&self, store: Arc<dyn Store>) {
        let _ = self.store.set(store);
    }

    /// Tells `listener` of every update recorded from now on (the first listener stays).
    pub(crate) fn listen(&self, listener: OnExternalPush) {
        let _ = self.listener.set(listener);
    }

    /// Remembers `push` here at once and, in the background, in the attached store; tells
    /// the listener.
    pub(crate) fn record(&self, push: ExternalPush) {
        if let Some(listener) = self.listener.get() {
            listener(push.clone());
        }
        if let Some(store) = self.store.get() {
            let (store, push) = (store.clone(), push.clone());
            tokio::spawn(async move {
                if let Err(e) = store.record_push(push.clone()).await {
                    tracing::warn!(user = %push.user, error = %e, "cannot share a proxied push with the other replicas; a webhook echo of it reaching another replica starts one extra sync");
                }
            });
        }
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let mine = seen.entry(push.user).or_default();
        if mine.len() == REMEMBERED_PER_USER {
            mine.pop_front();
        }
        mine.push_back((push.refname, push.new_oid));
    }

    /// Whether this process or, with a store attached, any replica saw `push`.
    pub(crate) async fn seen_anywhere(&self, push: &ExternalPush) -> bool {
        if self.contains(push) {
            return true;
        }
        match self.store.get() {
            Some(store) => store.push_seen(push.clone()).await.unwrap_or_else(|e| {
                tracing::warn!(user = %push.user, error = %e, "cannot ask the other replicas about a push; treating it as external");
                false
            }),
            None => false,
        }
    }

    pub(crate) fn contains(&self, push: &ExternalPush) -> bool {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.get(&push.user).is_some_and(|mine| {
            mine.iter()
                .any(|(refname, oid)| *refname == push.refname && *oid == push.new_oid)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(n: usize) -> ExternalPush {
        push_of("alice", n)
    }

    fn push_of(user: &str, n: usize) -> ExternalPush {
        ExternalPush {
            user: UserId::parse(user).expect("valid"),
            refname: "refs/heads/main".into(),
            new_oid: format!("{n:040x}"),
        }
    }

    #[test]
    fn remembers_the_latest_pushes_of_each_user_only() {
        let recent = RecentPushes::default();
        recent.record(push_of("bob", 7));
        for n in 0..=REMEMBERED_PER_USER * 10 {
            recent.record(push(n));
        }
        assert!(!recent.contains(&push(0)), "the oldest is forgotten");
        assert!(recent.contains(&push(REMEMBERED_PER_USER * 9 + 1)));
        assert!(recent.contains(&push(REMEMBERED_PER_USER * 10)));
        assert!(!recent.contains(&push(REMEMBERED_PER_USER * 10 + 1)));
        assert!(
            recent.contains(&push_of("bob", 7)),
            "alice's volume never evicts bob's"
        );
        assert!(!recent.contains(&push_of("bob", 0)));
    }
}
