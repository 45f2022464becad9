//! Where used one-time values are remembered: the nonces of redeemed sign-in links and the ids
//! of sessions signed out. In the state store with a database (every replica's), else in the
//! token state directory (`SHMASTRA_TOKEN_STATE`), which outlives a restart. With neither there
//! is nothing durable, and the page signs no one in.

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::store::{Store, StoreError, StoreFuture, USED_NONCE_MARGIN};

/// Spent values, each kept until [`USED_NONCE_MARGIN`] past the time given.
pub(crate) trait Nonces: Send + Sync {
    /// Spends `key`: `true` the first time.
    fn spend(&self, key: String, until: SystemTime) -> StoreFuture<'_, bool>;
    /// Whether `key` was spent.
    fn spent(&self, key: String) -> StoreFuture<'_, bool>;
}

/// The state store's nonces (`used_link_nonces` in PostgreSQL).
pub(crate) struct StoreNonces(pub Arc<dyn Store>);

impl Nonces for StoreNonces {
    fn spend(&self, key: String, until: SystemTime) -> StoreFuture<'_, bool> {
        self.0.spend_link_nonce(key, until)
    }

    fn spent(&self, key: String) -> StoreFuture<'_, bool> {
        self.0.link_nonce_spent(key)
    }
}

/// One file per spent value in `<dir>/used-nonces/`, named by the value (base64url and a
/// one-letter kind), holding the Unix second it may be forgotten after; made with `O_EXCL`,
/// so two redemptions at once spend it once. Expired files go at each spend.
pub(crate) struct NonceDir {
    dir: PathBuf,
}

impl NonceDir {
    /// Spent values under `state` (the token state directory).
    pub fn new(state: impl Into<PathBuf>) -> NonceDir {
        NonceDir {
            dir: state.into().join("used-nonces"),
        }
    }

    fn path(&self, key: &str) -> Result<PathBuf, StoreError> {
        if key.is_empty()
            || !key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b':'))
        {
            return Err(StoreError::Query(format!("not a nonce: {key:?}")));
        }
        Ok(self.dir.join(key))
    }

    fn io(&self, e: std::io::Error) -> StoreError {
        StoreError::Unavailable(format!("{}: {e}", self.dir.display()))
    }

    fn spend_now(&self, key: &str, until: SystemTime) -> Result<bool, StoreError> {
        let path = self.path(key)?;
        std::fs::create_dir_all(&self.dir).map_err(|e| self.io(e))?;
        self.forget_expired();
        let forget_after = (until + USED_NONCE_MARGIN)
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(mut file) => {
                file.write_all(forget_after.to_string().as_bytes())
                    .and_then(|()| file.sync_all())
                    .map_err(|e| self.io(e))?;
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(self.io(e)),
        }
    }

    /// Removes the files whose time has passed (an unreadable one is left alone).
    fn forget_expired(&self) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO)
            .as_secs();
        for entry in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            let expired = std::fs::read_to_string(entry.path())
                .ok()
                .and_then(|text| text.trim().parse::<u64>().ok())
                .is_some_and(|after| after < now);
            if expired {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

impl Nonces for NonceDir {
    fn spend(&self, key: String, until: SystemTime) -> StoreFuture<'_, bool> {
        let result = self.spend_now(&key, until);
        Box::pin(async move { result })
    }

    fn spent(&self, key: String) -> StoreFuture<'_, bool> {
        let result = self.path(&key).map(|path| path.exists());
        Box::pin(async move { result })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_value_is_spent_once_and_expired_files_are_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let nonces = NonceDir::new(dir.path());
        let soon = SystemTime::now() + Duration::from_secs(60);
        assert!(nonces.spend("l:abc".into(), soon).await.unwrap());
        assert!(!nonces.spend("l:abc".into(), soon).await.unwrap());
        assert!(nonces.spent("l:abc".into()).await.unwrap());
        assert!(!nonces.spent("s:abc".into()).await.unwrap());
        assert!(nonces.spend("../x".into(), soon).await.is_err());

        let long_ago = SystemTime::now() - USED_NONCE_MARGIN - Duration::from_secs(60);
        assert!(nonces.spend("l:old".into(), long_ago).await.unwrap());
        assert!(nonces.spend("l:new".into(), soon).await.unwrap());
        assert!(!nonces.spent("l:old".into()).await.unwrap(), "forgotten");
        assert!(nonces.spent("l:abc".into()).await.unwrap(), "kept");
    }
}
