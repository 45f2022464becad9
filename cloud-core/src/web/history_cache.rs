//! The history the page shows, per user, kept for [`HISTORY_TTL`]: a user reloading the page
//! in a loop reads the host (GitLab's API with the one service account every user shares, or
//! `git log`) at most once per TTL on this replica, and loads that arrive together wait for
//! the one read. An external push for the user, and any change of their status (a sync, a
//! restore), forgets their entry.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::orchestrate::history::Save;
use crate::user::UserId;

/// How long a user's history is reused.
pub(super) const HISTORY_TTL: Duration = Duration::from_secs(10);

type Entry = Arc<tokio::sync::Mutex<Option<(Instant, Result<Vec<Save>, String>)>>>;

/// Per user: the last history read and when.
#[derive(Default)]
pub(super) struct HistoryCache {
    entries: Mutex<HashMap<UserId, Entry>>,
}

impl HistoryCache {
    /// `user`'s history: the kept one while it is younger than the TTL, else what `read`
    /// gives (one `read` at a time per user).
    pub async fn get<F, Fut>(&self, user: &UserId, read: F) -> Result<Vec<Save>, String>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Vec<Save>, String>>,
    {
        let entry = self
            .entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(user.clone())
            .or_default()
            .clone();
        let mut kept = entry.lock().await;
        if let Some((at, history)) = kept.as_ref()
            && at.elapsed() < HISTORY_TTL
        {
            return history.clone();
        }
        let history = read().await;
        *kept = Some((Instant::now(), history.clone()));
        history
    }

    /// Forgets every user's history.
    pub fn forget_all(&self) {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// Forgets `user`'s history: the next load reads it again.
    pub fn forget(&self, user: &UserId) {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(user);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test(start_paused = true)]
    async fn one_read_per_ttl_and_user_and_together_waits_for_one() {
        let cache = HistoryCache::default();
        let reads = AtomicU32::new(0);
        let alice = UserId::parse("alice").unwrap();
        let read = || async {
            reads.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok(Vec::new())
        };
        let together =
            futures_util::future::join_all((0..5).map(|_| cache.get(&alice, read))).await;
        assert!(together.iter().all(Result::is_ok));
        assert_eq!(reads.load(Ordering::SeqCst), 1);
        for _ in 0..20 {
            cache.get(&alice, read).await.unwrap();
            tokio::time::advance(Duration::from_millis(100)).await;
        }
        assert_eq!(reads.load(Ordering::SeqCst), 1, "2 s of reloads");
        tokio::time::advance(HISTORY_TTL).await;
        cache.get(&alice, read).await.unwrap();
        assert_eq!(reads.load(Ordering::SeqCst), 2);
        cache.forget(&alice);
        cache.get(&alice, read).await.unwrap();
        assert_eq!(reads.load(Ordering::SeqCst), 3);
    }
}
