//! The state every replica of the cloud shares, behind one trait with two implementations:
//! [`memory::MemoryStore`] (in-process, one replica, nothing to install) and
//! [`postgres::PostgresStore`] (PostgreSQL, any number of replicas).
//!
//! It holds the sync jobs (one row per user: coalesced, leased, claimed oldest first, with
//! the outcome of the last run), the branch updates the proxy saw (for the webhook's
//! de-duplication), the webhook deliveries already handled, each sandbox's status with the
//! time of its change, the nonces of sign-in links already used, each user's project
//! token generation, and each user's sandbox at the provider (with the create in flight). [`jobs::SyncJobs`] runs a command per job on top of it; [`StoreStatusSink`]
//! and [`generations::StoreGenerations`] plug it into orchestration and token checks.

pub mod generations;
pub mod jobs;
pub mod memory;
pub mod postgres;
mod tls;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::future::BoxFuture;
use tokio::sync::{broadcast, mpsc};

use crate::event::ExternalPush;
use crate::status::{SandboxStatus, StatusSink, SyncOutcome};
use crate::user::UserId;

/// A store operation in flight.
pub type StoreFuture<'a, T> = BoxFuture<'a, Result<T, StoreError>>;

/// How many branch updates are remembered per user for the webhook's de-duplication: GitLab's
/// webhook for a proxied push arrives within seconds, far fewer updates than this later.
pub const REMEMBERED_PUSHES_PER_USER: usize = 64;
/// How long a remembered branch update counts (GitLab retries a failed webhook for hours).
pub const REMEMBERED_PUSH_TTL: Duration = Duration::from_secs(24 * 3600);
/// How long a handled webhook delivery id is remembered.
pub const REMEMBERED_DELIVERY_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// How long past its link's expiry a used sign-in nonce is kept: a replica whose clock is
/// behind the database's by less than this still finds it.
pub const USED_NONCE_MARGIN: Duration = Duration::from_secs(3600);
/// How many status changes a follower may fall behind before it misses some (it then reads
/// [`Store::status`] again).
pub const STATUS_CHANGES_BUFFER: usize = 1024;

/// Why the store could not do something. Every variant is transient from the caller's side
/// except `Migration` and `Corrupt`: retry later.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No connection (down, refused, timed out).
    #[error("the database is unreachable: {0}")]
    Unavailable(String),
    /// A statement failed (a lock or statement timeout among others).
    #[error("the database refused a statement: {0}")]
    Query(String),
    /// A migration could not be applied at start.
    #[error("cannot apply database migration {version}: {message}")]
    Migration {
        /// The migration's number.
        version: i64,
        /// The database's error.
        message: String,
    },
    /// A stored value this version cannot read.
    #[error("the stored {what} is not readable: {message}")]
    Corrupt {
        /// What kind of value.
        what: &'static str,
        /// Why it cannot be read.
        message: String,
    },
}

/// A sync job claimed by one runner: it alone runs the user's sync until it calls
/// [`Store::finish`] or its lease runs out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The newest push of the user when the job was claimed.
    pub push: ExternalPush,
    /// Unique per claim: renewals and the finish of an expired claim change nothing.
    pub owner: String,
    /// The number of the user's newest event when the job was claimed: the run covers every
    /// event up to it.
    pub seq: u64,
}

/// The last run of a user's job that finished under its claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinishedRun {
    /// The run covered the user's events up to this number ([`Claim::seq`]).
    pub seq: u64,
    /// How that run ended.
    pub outcome: SyncOutcome,
}

/// What [`Store::claim_sandbox`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SandboxClaim {
    /// The user's sandbox (its id at the provider).
    Known(String),
    /// None is known and no other create holds a lease: the caller creates it, and records
    /// it with [`Store::set_sandbox`] within its lease.
    Create,
    /// Another claim is creating the user's sandbox now: wait, and ask again.
    Creating,
}

/// One change of a sandbox's status, as followers see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusChange {
    /// Whose status changed.
    pub sandbox: String,
    /// The new status.
    pub status: SandboxStatus,
    /// When, by the store's clock.
    pub changed_at: SystemTime,
}

/// The shared state. Methods take owned arguments so each returns one boxed future, which
/// keeps the trait usable as `Arc<dyn Store>`.
pub trait Store: Send + Sync + 'static {
    /// Records that `push` needs a sync of its user: creates the user's job or marks it owed
    /// again with this push as the newest. A run going on now is followed by exactly one more.
    /// Returns the event's number among the user's events (1, 2, ...): the first run whose
    /// [`Claim::seq`] reaches it covers it.
    fn enqueue(&self, push: ExternalPush) -> StoreFuture<'_, u64>;

    /// Claims the owed job asked for longest ago (or one whose runner's lease ran out) for
    /// `owner`, holding it for `lease`. `None`: nothing to run now. Never a job another claim
    /// holds within its lease.
    fn claim(&self, owner: String, lease: Duration) -> StoreFuture<'_, Option<Claim>>;

    /// [`Store::claim`] limited to one user's job.
    fn claim_user(
        &self,
        user: UserId,
        owner: String,
        lease: Duration,
    ) -> StoreFuture<'_, Option<Claim>>;

    /// Extends a claim's lease from now. `false`: the claim is no longer held (its lease ran
    /// out and another runner may have the job): stop running it.
    fn renew(&self, claim: Claim, lease: Duration) -> StoreFuture<'_, bool>;

    /// Releases a claim and records how its run ended ([`Store::last_run`]). An event that
    /// arrived during the run leaves the job owed, so it runs once more. `false`: the claim had
    /// already been lost, and nothing is recorded.
    fn finish(&self, claim: Claim, outcome: SyncOutcome) -> StoreFuture<'_, bool>;

    /// The user's last finished run, `None` before the first.
    fn last_run(&self, user: UserId) -> StoreFuture<'_, Option<FinishedRun>>;

    /// Remembers a branch update the proxy saw applied (bounded per user, expiring).
    fn record_push(&self, push: ExternalPush) -> StoreFuture<'_, ()>;

    /// Whether the proxy saw this branch update lately.
    fn push_seen(&self, push: ExternalPush) -> StoreFuture<'_, bool>;

    /// Marks webhook delivery ids handled; `true` when none of them had been before (the
    /// caller handles the delivery), `false` when one had (a replay: do nothing).
    fn first_delivery(&self, ids: Vec<String>) -> StoreFuture<'_, bool>;

    /// Records a sandbox's new status and tells every follower.
    fn set_status(&self, sandbox: String, status: SandboxStatus) -> StoreFuture<'_, ()>;

    /// A sandbox's status and when it last changed.
    fn status(&self, sandbox: String) -> StoreFuture<'_, Option<(SandboxStatus, SystemTime)>>;

    /// Status changes from now on, made by any replica (PostgreSQL: seen within a poll
    /// interval).
    fn status_changes(&self) -> broadcast::Receiver<StatusChange>;

    /// Spends a sign-in link's nonce: `true` the first time, `false` when any replica spent it
    /// before. Kept until [`USED_NONCE_MARGIN`] past `expires` (the link's expiry).
    fn spend_link_nonce(&self, nonce: String, expires: SystemTime) -> StoreFuture<'_, bool>;

    /// Whether [`Store::spend_link_nonce`] spent `nonce` (and still keeps it).
    fn link_nonce_spent(&self, nonce: String) -> StoreFuture<'_, bool>;

    /// The user's project token generation (0: never revoked).
    fn token_generation(&self, user: UserId) -> StoreFuture<'_, u64>;

    /// Moves the user to the next token generation and returns it.
    fn bump_token_generation(&self, user: UserId) -> StoreFuture<'_, u64>;

    /// Every user at a generation above 0, with the version of its last change, for changes
    /// with a version above `after`.
    fn token_generations_since(&self, after: i64) -> StoreFuture<'_, Vec<(UserId, u64, i64)>>;

    /// The id of the user's sandbox at the provider, `None` when none is recorded.
    fn sandbox_of(&self, user: UserId) -> StoreFuture<'_, Option<String>>;

    /// The user's sandbox, or the right to create it for `lease` (granted to one claim at a
    /// time across replicas; `owner` asking again renews its own), or word that another
    /// claim holds that right.
    fn claim_sandbox(
        &self,
        user: UserId,
        owner: String,
        lease: Duration,
    ) -> StoreFuture<'_, SandboxClaim>;

    /// Records the sandbox `owner` created (or found) under its claim, and ends the claim.
    /// `false`: the claim was no longer held, and nothing is recorded.
    fn set_sandbox(&self, user: UserId, owner: String, sandbox: String) -> StoreFuture<'_, bool>;

    /// Forgets the user's sandbox if it is still `sandbox` (the provider no longer knows it);
    /// `false` when another had been recorded since.
    fn forget_sandbox(&self, user: UserId, sandbox: String) -> StoreFuture<'_, bool>;

    /// Every user with a recorded sandbox, by user id.
    fn user_sandboxes(&self) -> StoreFuture<'_, Vec<(UserId, String)>>;
}

/// A unique owner name for one claim: the replica's name and a counter.
pub fn claim_owner(replica: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{replica}#{n}")
}

/// A name for this process among the replicas: host, pid and start time.
pub fn replica_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "host".to_owned());
    let started = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default();
    format!("{host}-{}-{started}", std::process::id())
}

/// A [`StatusSink`] that writes into a [`Store`], in order, from one task: `set_status` never
/// waits for the database, and a change made while the database is down is written when it
/// is back (only the newest per sandbox: older ones are superseded).
#[derive(Clone)]
pub struct StoreStatusSink {
    changes: mpsc::UnboundedSender<(String, SandboxStatus)>,
}

impl StoreStatusSink {
    /// Spawns the writer task; it ends when every clone of the sink is dropped and the
    /// changes are written.
    pub fn new(store: Arc<dyn Store>) -> StoreStatusSink {
        let (changes, mut pending) = mpsc::unbounded_channel::<(String, SandboxStatus)>();
        tokio::spawn(async move {
            while let Some((sandbox, status)) = pending.recv().await {
                let mut newest = vec![(sandbox, status)];
                while let Ok((sandbox, status)) = pending.try_recv() {
                    newest.retain(|(s, _)| *s != sandbox);
                    newest.push((sandbox, status));
                }
                for (sandbox, status) in newest {
                    let mut delay = Duration::from_millis(100);
                    while let Err(e) = store.set_status(sandbox.clone(), status.clone()).await {
                        tracing::warn!(%sandbox, error = %e, "cannot record the sandbox status; retrying");
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(5));
                    }
                }
            }
        });
        StoreStatusSink { changes }
    }
}

impl StatusSink for StoreStatusSink {
    fn set_status(&self, sandbox: &str, status: SandboxStatus) {
        let _ = self.changes.send((sandbox.to_owned(), status));
    }
}

/// Milliseconds since the Unix epoch as a time.
fn from_millis(ms: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or_default())
}

/// Runs `run` while renewing `claim` every third of `lease`, and returns its output. `None`:
/// the lease was lost first (the store gave the job up, or could not be reached until the
/// lease ran out), and `run` was dropped unfinished, since another runner may hold the job now.
pub async fn run_holding<T>(
    store: &dyn Store,
    claim: &Claim,
    lease: Duration,
    run: impl std::future::Future<Output = T>,
) -> Option<T> {
    let user = &claim.push.user;
    tokio::pin!(run);
    let mut held_until = tokio::time::Instant::now() + lease;
    let mut renew = tokio::time::interval(lease / 3);
    renew.tick().await;
    loop {
        tokio::select! {
            output = &mut run => return Some(output),
            _ = renew.tick() => match store.renew(claim.clone(), lease).await {
                Ok(true) => held_until = tokio::time::Instant::now() + lease,
                Ok(false) => {
                    tracing::error!(%user, "the sync job's lease was lost; stopping this run");
                    return None;
                }
                Err(e) if tokio::time::Instant::now() >= held_until => {
                    tracing::error!(%user, error = %e, "the sync job's lease cannot be renewed and ran out; stopping this run");
                    return None;
                }
                Err(e) => tracing::warn!(%user, error = %e, "cannot renew the sync job's lease yet"),
            },
        }
    }
}
