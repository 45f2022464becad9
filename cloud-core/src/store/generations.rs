//! Token generations kept in the [`Store`], for [`crate::token::TokenSigner`]: verification
//! is synchronous and on the request path, so it reads a local copy that follows the store
//! every [`GENERATIONS_POLL`]. A revocation on any replica is refused by every replica within
//! that interval; while the database is down the copy keeps the revocations it knew.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use super::Store;
use crate::UserId;
use crate::token::{GenerationError, Generations};

/// How often each replica reads the revocations made since its last look.
pub const GENERATIONS_POLL: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Known {
    after: i64,
    generations: HashMap<UserId, u64>,
}

/// [`Generations`] backed by a [`Store`]. Dropping it stops the follower.
pub struct StoreGenerations {
    known: Arc<RwLock<Known>>,
    follower: tokio::task::JoinHandle<()>,
}

impl Drop for StoreGenerations {
    fn drop(&mut self) {
        self.follower.abort();
    }
}

impl StoreGenerations {
    /// Reads the store's generations now (errors if it cannot) and follows them from then on.
    pub async fn start(store: Arc<dyn Store>) -> Result<StoreGenerations, super::StoreError> {
        let known = Arc::new(RwLock::new(Known::default()));
        refresh(&*store, &known).await?;
        let follower = tokio::spawn({
            let known = known.clone();
            async move {
                let mut tick = tokio::time::interval(GENERATIONS_POLL);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    if let Err(e) = refresh(&*store, &known).await {
                        tracing::debug!(error = %e, "cannot read token revocations now; keeping the ones known");
                    }
                }
            }
        });
        Ok(StoreGenerations { known, follower })
    }
}

async fn refresh(store: &dyn Store, known: &RwLock<Known>) -> Result<(), super::StoreError> {
    let after = known.read().unwrap_or_else(|p| p.into_inner()).after;
    let changed = store.token_generations_since(after).await?;
    let mut known = known.write().unwrap_or_else(|p| p.into_inner());
    for (user, generation, version) in changed {
        known.after = known.after.max(version);
        known.generations.insert(user, generation);
    }
    Ok(())
}

impl Generations for StoreGenerations {
    fn current(&self, user: &UserId) -> Result<u64, GenerationError> {
        let known = self.known.read().unwrap_or_else(|p| p.into_inner());
        Ok(known.generations.get(user).copied().unwrap_or(0))
    }

    /// Revocation goes through the store's async [`Store::bump_token_generation`] (the
    /// `token revoke` command); this copy only follows it.
    fn bump(&self, _user: &UserId) -> Result<u64, GenerationError> {
        Err(GenerationError::InDatabase)
    }
}
