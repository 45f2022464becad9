//! Token generations kept in the [`Store`], for [`crate::token::TokenSigner`]: verification
//! is synchronous and on the request path, so it reads a local copy that follows the store
//! every [`GENERATIONS_POLL`]. A revocation on any replica is refused by every replica within
//! that interval. While the database does not answer the copy keeps the revocations it knew,
//! but only for `max_age`: past it a revocation made meanwhile could be missed, so every token
//! is refused ([`GenerationError::Stale`]) and [`StoreGenerations::health`] says the replica is
//! unhealthy, for a balancer to drain it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::time::Instant;

use super::Store;
use crate::token::{GenerationError, Generations};
use crate::user::UserId;

/// How often each replica reads the revocations made since its last look.
pub const GENERATIONS_POLL: Duration = Duration::from_secs(1);
/// How long a replica trusts its copy without reading the database (`serve
/// --token-state-max-age`).
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(30);

#[derive(Default)]
struct Known {
    after: i64,
    generations: HashMap<UserId, u64>,
}

/// When the copy was last read, and why the reads since failed.
struct Freshness {
    read_at: Instant,
    error: Option<String>,
}

/// [`Generations`] backed by a [`Store`]. Dropping it stops the follower.
pub struct StoreGenerations {
    known: Arc<RwLock<Known>>,
    freshness: Arc<Mutex<Freshness>>,
    max_age: Duration,
    follower: tokio::task::JoinHandle<()>,
}

impl Drop for StoreGenerations {
    fn drop(&mut self) {
        self.follower.abort();
    }
}

impl StoreGenerations {
    /// Reads the store's generations now (errors if it cannot) and follows them from then on;
    /// past `max_age` without a read, every token is refused.
    pub async fn start(
        store: Arc<dyn Store>,
        max_age: Duration,
    ) -> Result<StoreGenerations, super::StoreError> {
        let known = Arc::new(RwLock::new(Known::default()));
        refresh(&*store, &known).await?;
        let freshness = Arc::new(Mutex::new(Freshness {
            read_at: Instant::now(),
            error: None,
        }));
        let follower = tokio::spawn({
            let (known, freshness) = (known.clone(), freshness.clone());
            async move {
                let mut tick = tokio::time::interval(GENERATIONS_POLL);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let result = refresh(&*store, &known).await;
                    let mut freshness = freshness.lock().unwrap_or_else(|p| p.into_inner());
                    match result {
                        Ok(()) => {
                            if freshness.error.take().is_some() {
                                tracing::info!(
                                    "token revocations are read from the database again"
                                );
                            }
                            freshness.read_at = Instant::now();
                        }
                        Err(e) => {
                            if freshness.error.is_none() {
                                tracing::warn!(error = %e, "cannot read token revocations now; keeping the ones known for a while");
                            }
                            freshness.error = Some(e.to_string());
                        }
                    }
                }
            }
        });
        Ok(StoreGenerations {
            known,
            freshness,
            max_age,
            follower,
        })
    }

    /// `Ok(None)`: the copy follows the database. `Ok(Some(why))`: the last reads failed, but
    /// the copy is still trusted (degraded). `Err(why)`: too old; tokens are refused.
    pub fn health(&self) -> Result<Option<String>, String> {
        let freshness = self.freshness.lock().unwrap_or_else(|p| p.into_inner());
        let age = freshness.read_at.elapsed();
        match &freshness.error {
            None => Ok(None),
            Some(error) if age <= self.max_age => Ok(Some(error.clone())),
            Some(error) => Err(format!(
                "{}; {error}",
                GenerationError::Stale {
                    age_secs: age.as_secs(),
                    limit_secs: self.max_age.as_secs(),
                }
            )),
        }
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
        let age = self
            .freshness
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .read_at
            .elapsed();
        if age > self.max_age {
            return Err(GenerationError::Stale {
                age_secs: age.as_secs(),
                limit_secs: self.max_age.as_secs(),
            });
        }
        let known = self.known.read().unwrap_or_else(|p| p.into_inner());
        Ok(known.generations.get(user).copied().unwrap_or(0))
    }

    /// Revocation goes through the store's async [`Store::bump_token_generation`] (the
    /// `token revoke` command); this copy only follows it.
    fn bump(&self, _user: &UserId) -> Result<u64, GenerationError> {
        Err(GenerationError::InDatabase)
    }
}
