//! The PostgreSQL [`Store`]: any number of replicas over one database. Every statement is
//! parameterized; every connection has statement and lock timeouts, and the pool has wait and
//! connect timeouts, so nothing waits on the database without a deadline. Versioned migrations
//! (`cloud-core/migrations/`) are applied at start-up under an advisory lock.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use deadpool_postgres::tokio_postgres::{self, NoTls, Row};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio::sync::broadcast;
use tokio_postgres_rustls::MakeRustlsConnect;

use super::{
    Claim, FinishedRun, REMEMBERED_DELIVERY_TTL, REMEMBERED_PUSH_TTL, REMEMBERED_PUSHES_PER_USER,
    STATUS_CHANGES_BUFFER, SandboxClaim, StatusChange, Store, StoreError, StoreFuture,
    USED_NONCE_MARGIN, from_millis, tls,
};
use crate::event::ExternalPush;
use crate::status::{SandboxStatus, SyncOutcome};
use crate::user::UserId;

/// The migrations, in order: (version, SQL). A version is applied once, in one transaction.
const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../../migrations/0001_shared_state.sql")),
    (2, include_str!("../../migrations/0002_sync_outcomes.sql")),
    (
        3,
        include_str!("../../migrations/0003_used_link_nonces.sql"),
    ),
    (4, include_str!("../../migrations/0004_user_sandboxes.sql")),
];

/// How often a replica looks for status changes other replicas made.
pub const STATUS_POLL: Duration = Duration::from_millis(250);
/// Longest a statement may run, and longest it may wait for a row lock.
const STATEMENT_TIMEOUT_MS: u64 = 5_000;
const LOCK_TIMEOUT_MS: u64 = 2_000;
/// Longest a caller waits for a pooled connection, and for a new one to connect.
const POOL_WAIT: Duration = Duration::from_secs(3);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// An arbitrary constant naming the migration lock among advisory locks.
const MIGRATION_LOCK: i64 = 0x5348_4d41_5354_5241;

/// Whether `url` carries a password (a URL's `user:password@`, or `password=`).
pub fn has_password(url: &str) -> bool {
    tls::split(url)
        .ok()
        .and_then(|request| request.rest.parse::<tokio_postgres::Config>().ok())
        .is_some_and(|config| config.get_password().is_some())
}

/// A pool of connections to `url` with this store's timeouts, over TLS as the URL's `sslmode`
/// says (`require` when it says nothing and the host is not this machine; see `tls.rs`).
pub fn pool(url: &str) -> Result<Pool, StoreError> {
    let request = tls::split(url)?;
    let mut config: tokio_postgres::Config =
        request.rest.parse().map_err(|e: tokio_postgres::Error| {
            StoreError::Unavailable(format!("bad database URL: {e}"))
        })?;
    let mode = request.mode.unwrap_or_else(|| tls::default_mode(&config));
    config
        .connect_timeout(CONNECT_TIMEOUT)
        .ssl_mode(tls::pg_mode(mode))
        .options(format!(
            "-c statement_timeout={STATEMENT_TIMEOUT_MS} -c lock_timeout={LOCK_TIMEOUT_MS}"
        ));
    let recycling = ManagerConfig {
        recycling_method: RecyclingMethod::Fast,
    };
    let manager = match mode {
        tls::SslMode::Disable => Manager::from_config(config, NoTls, recycling),
        mode => Manager::from_config(
            config,
            MakeRustlsConnect::new(tls::client_config(mode, request.root_cert.as_deref())?),
            recycling,
        ),
    };
    Pool::builder(manager)
        .max_size(16)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(POOL_WAIT))
        .create_timeout(Some(CONNECT_TIMEOUT))
        .recycle_timeout(Some(CONNECT_TIMEOUT))
        .build()
        .map_err(|e| StoreError::Unavailable(e.to_string()))
}

/// The PostgreSQL store. Dropping it stops its status follower.
pub struct PostgresStore {
    pool: Pool,
    changes: broadcast::Sender<StatusChange>,
    follower: tokio::task::JoinHandle<()>,
}

impl Drop for PostgresStore {
    fn drop(&mut self) {
        self.follower.abort();
    }
}

fn unavailable(e: deadpool_postgres::PoolError) -> StoreError {
    StoreError::Unavailable(with_causes(&e))
}

fn query_error(e: tokio_postgres::Error) -> StoreError {
    if e.is_closed() || e.as_db_error().is_none() {
        StoreError::Unavailable(with_causes(&e))
    } else {
        StoreError::Query(with_causes(&e))
    }
}

/// `e` and every error under it that its own text does not already say (a TLS failure's
/// reason sits two levels down).
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(next) = cause {
        let said = next.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = next.source();
    }
    text
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn push_of(row: &Row) -> Result<ExternalPush, StoreError> {
    let user: String = row.get("user_id");
    Ok(ExternalPush {
        user: UserId::parse(&user).map_err(|e| StoreError::Corrupt {
            what: "user id",
            message: e.to_string(),
        })?,
        refname: row.get("refname"),
        new_oid: row.get("new_oid"),
    })
}

fn outcome_of(text: &str) -> Result<SyncOutcome, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt {
        what: "sync outcome",
        message: e.to_string(),
    })
}

fn status_of(text: &str) -> Result<SandboxStatus, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt {
        what: "sandbox status",
        message: e.to_string(),
    })
}

const CLAIM: &str = "
UPDATE sync_jobs j
   SET owner = $1, lease_until = shmastra_now_ms() + $2, pending = false
  FROM (SELECT user_id FROM sync_jobs
         WHERE ((owner IS NULL AND pending) OR (owner IS NOT NULL AND lease_until < shmastra_now_ms()))
           AND ($3::text IS NULL OR user_id = $3)
         ORDER BY pending_since
         LIMIT 1
         FOR UPDATE SKIP LOCKED) c
 WHERE j.user_id = c.user_id
RETURNING j.user_id, j.refname, j.new_oid, j.events";

impl PostgresStore {
    /// Applies the migrations this build knows and starts following status changes. Fails
    /// when the database cannot be reached (the caller decides whether to start without it).
    pub async fn connect(pool: Pool) -> Result<Arc<PostgresStore>, StoreError> {
        migrate(&pool).await?;
        let (changes, _) = broadcast::channel(STATUS_CHANGES_BUFFER);
        let after = {
            let client = pool.get().await.map_err(unavailable)?;
            let row = client
                .query_one(
                    "SELECT coalesce(max(version), 0) AS v FROM sandbox_statuses",
                    &[],
                )
                .await
                .map_err(query_error)?;
            row.get::<_, i64>("v")
        };
        let follower = tokio::spawn(follow_statuses(pool.clone(), changes.clone(), after));
        Ok(Arc::new(PostgresStore {
            pool,
            changes,
            follower,
        }))
    }

    async fn claim_where(
        &self,
        user: Option<UserId>,
        owner: String,
        lease: Duration,
    ) -> Result<Option<Claim>, StoreError> {
        let client = self.pool.get().await.map_err(unavailable)?;
        let only = user.as_ref().map(|u| u.as_str());
        let row = client
            .query_opt(CLAIM, &[&owner, &millis(lease), &only])
            .await
            .map_err(query_error)?;
        row.map(|row| {
            Ok(Claim {
                push: push_of(&row)?,
                owner,
                seq: row.get::<_, i64>("events").unsigned_abs(),
            })
        })
        .transpose()
    }

    async fn execute(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<u64, StoreError> {
        let client = self.pool.get().await.map_err(unavailable)?;
        client.execute(sql, params).await.map_err(query_error)
    }
}

async fn migrate(pool: &Pool) -> Result<(), StoreError> {
    let mut client = pool.get().await.map_err(unavailable)?;
    let tx = client.transaction().await.map_err(query_error)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(query_error)?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS shmastra_migrations (
             version bigint PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now())",
    )
    .await
    .map_err(query_error)?;
    let applied: Vec<i64> = tx
        .query("SELECT version FROM shmastra_migrations", &[])
        .await
        .map_err(query_error)?
        .iter()
        .map(|row| row.get(0))
        .collect();
    for (version, sql) in MIGRATIONS {
        if applied.contains(version) {
            continue;
        }
        let failed = |e: tokio_postgres::Error| StoreError::Migration {
            version: *version,
            message: e.to_string(),
        };
        tx.batch_execute(sql).await.map_err(failed)?;
        tx.execute(
            "INSERT INTO shmastra_migrations (version) VALUES ($1)",
            &[version],
        )
        .await
        .map_err(failed)?;
        tracing::info!(version, "database migration applied");
    }
    tx.commit().await.map_err(query_error)
}

/// Polls for status changes past `after` and broadcasts them, until the store is dropped. A
/// database that is down is tried again at the next tick.
async fn follow_statuses(pool: Pool, changes: broadcast::Sender<StatusChange>, mut after: i64) {
    let mut tick = tokio::time::interval(STATUS_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Ok(client) = pool.get().await else {
            continue;
        };
        let Ok(rows) = client
            .query(
                "SELECT sandbox, status, changed_at, version FROM sandbox_statuses
                  WHERE version > $1 ORDER BY version",
                &[&after],
            )
            .await
        else {
            continue;
        };
        for row in rows {
            after = row.get("version");
            let sandbox: String = row.get("sandbox");
            match status_of(row.get("status")) {
                Ok(status) => {
                    let _ = changes.send(StatusChange {
                        sandbox,
                        status,
                        changed_at: from_millis(row.get("changed_at")),
                    });
                }
                Err(e) => tracing::warn!(%sandbox, error = %e, "skipping an unreadable status"),
            }
        }
    }
}

impl Store for PostgresStore {
    fn enqueue(&self, push: ExternalPush) -> StoreFuture<'_, u64> {
        Box::pin(async move {
            let client = self.pool.get().await.map_err(unavailable)?;
            let row = client
                .query_one(
                    "INSERT INTO sync_jobs (user_id, refname, new_oid, pending, pending_since, events)
                     VALUES ($1, $2, $3, true, shmastra_now_ms(), 1)
                     ON CONFLICT (user_id) DO UPDATE
                        SET refname = EXCLUDED.refname, new_oid = EXCLUDED.new_oid, pending = true,
                            pending_since = CASE WHEN sync_jobs.pending THEN sync_jobs.pending_since
                                                 ELSE EXCLUDED.pending_since END,
                            events = sync_jobs.events + 1
                     RETURNING events",
                    &[&push.user.as_str(), &push.refname, &push.new_oid],
                )
                .await
                .map_err(query_error)?;
            Ok(row.get::<_, i64>("events").unsigned_abs())
        })
    }

    fn claim(&self, owner: String, lease: Duration) -> StoreFuture<'_, Option<Claim>> {
        Box::pin(self.claim_where(None, owner, lease))
    }

    fn claim_user(
        &self,
        user: UserId,
        owner: String,
        lease: Duration,
    ) -> StoreFuture<'_, Option<Claim>> {
        Box::pin(self.claim_where(Some(user), owner, lease))
    }

    fn renew(&self, claim: Claim, lease: Duration) -> StoreFuture<'_, bool> {
        Box::pin(async move {
            let changed = self
                .execute(
                    "UPDATE sync_jobs SET lease_until = shmastra_now_ms() + $3
                      WHERE user_id = $1 AND owner = $2 AND lease_until >= shmastra_now_ms()",
                    &[&claim.push.user.as_str(), &claim.owner, &millis(lease)],
                )
                .await?;
            Ok(changed == 1)
        })
    }

    fn finish(&self, claim: Claim, outcome: SyncOutcome) -> StoreFuture<'_, bool> {
        Box::pin(async move {
            let outcome = serde_json::to_string(&outcome).map_err(|e| StoreError::Corrupt {
                what: "sync outcome",
                message: e.to_string(),
            })?;
            let seq = i64::try_from(claim.seq).unwrap_or(i64::MAX);
            let changed = self
                .execute(
                    "UPDATE sync_jobs SET owner = NULL, lease_until = NULL, finished = $3, outcome = $4
                      WHERE user_id = $1 AND owner = $2",
                    &[&claim.push.user.as_str(), &claim.owner, &seq, &outcome],
                )
                .await?;
            Ok(changed == 1)
        })
    }

    fn last_run(&self, user: UserId) -> StoreFuture<'_, Option<FinishedRun>> {
        Box::pin(async move {
            let client = self.pool.get().await.map_err(unavailable)?;
            let row = client
                .query_opt(
                    "SELECT finished, outcome FROM sync_jobs
                      WHERE user_id = $1 AND finished IS NOT NULL AND outcome IS NOT NULL",
                    &[&user.as_str()],
                )
                .await
                .map_err(query_error)?;
            row.map(|row| {
                Ok(FinishedRun {
                    seq: row.get::<_, i64>("finished").unsigned_abs(),
                    outcome: outcome_of(row.get("outcome"))?,
                })
            })
            .transpose()
        })
    }

    fn record_push(&self, push: ExternalPush) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let mut client = self.pool.get().await.map_err(unavailable)?;
            let tx = client.transaction().await.map_err(query_error)?;
            let user = push.user.as_str();
            tx.execute(
                "INSERT INTO recent_pushes (user_id, refname, new_oid, seen_at)
                 VALUES ($1, $2, $3, shmastra_now_ms())
                 ON CONFLICT (user_id, refname, new_oid) DO UPDATE SET seen_at = EXCLUDED.seen_at",
                &[&user, &push.refname, &push.new_oid],
            )
            .await
            .map_err(query_error)?;
            tx.execute(
                "DELETE FROM recent_pushes WHERE user_id = $1
                   AND (seen_at < shmastra_now_ms() - $2
                        OR (refname, new_oid) NOT IN (
                            SELECT refname, new_oid FROM recent_pushes WHERE user_id = $1
                             ORDER BY seen_at DESC LIMIT $3))",
                &[
                    &user,
                    &millis(REMEMBERED_PUSH_TTL),
                    &(REMEMBERED_PUSHES_PER_USER as i64),
                ],
            )
            .await
            .map_err(query_error)?;
            tx.commit().await.map_err(query_error)
        })
    }

    fn push_seen(&self, push: ExternalPush) -> StoreFuture<'_, bool> {
        Box::pin(async move {
            let client = self.pool.get().await.map_err(unavailable)?;
            let row = client
                .query_opt(
                    "SELECT 1 FROM recent_pushes WHERE user_id = $1 AND refname = $2
                        AND new_oid = $3 AND seen_at >= shmastra_now_ms() - $4",
                    &[
                        &push.user.as_str(),
                        &push.refname,
                        &push.new_oid,
                        &millis(REMEMBERED_PUSH_TTL),
                    ],
                )
                .await
                .map_err(query_error)?;
            Ok(row.is_some())
        })
    }

    fn first_delivery(&self, ids: Vec<String>) -> StoreFuture<'_, bool> {
        Box::pin(async move {
            let mut client = self.pool.get().await.map_err(unavailable)?;
            let tx = client.transaction().await.map_err(query_error)?;
            tx.execute(
                "DELETE FROM webhook_deliveries WHERE seen_at < shmastra_now_ms() - $1",
                &[&millis(REMEMBERED_DELIVERY_TTL)],
            )
            .await
            .map_err(query_error)?;
            let mut first = true;
            for id in &ids {
                let inserted = tx
                    .execute(
                        "INSERT INTO webhook_deliveries (id, seen_at) VALUES ($1, shmastra_now_ms())
                         ON CONFLICT (id) DO NOTHING",
                        &[id],
                    )
                    .await
                    .map_err(query_error)?;
                first &= inserted == 1;
            }
            tx.commit().await.map_err(query_error)?;
            Ok(first)
        })
    }

    fn set_status(&self, sandbox: String, status: SandboxStatus) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let json = serde_json::to_string(&status).map_err(|e| StoreError::Corrupt {
                what: "sandbox status",
                message: e.to_string(),
            })?;
            self.execute(
                "INSERT INTO sandbox_statuses (sandbox, status, changed_at, version)
                 VALUES ($1, $2, shmastra_now_ms(), nextval('change_versions'))
                 ON CONFLICT (sandbox) DO UPDATE
                    SET status = EXCLUDED.status, changed_at = EXCLUDED.changed_at,
                        version = EXCLUDED.version",
                &[&sandbox, &json],
            )
            .await
            .map(|_| ())
        })
    }

    fn status(&self, sandbox: String) -> StoreFuture<'_, Option<(SandboxStatus, SystemTime)>> {
        Box::pin(async move {
            let client = self.pool.get().await.map_err(unavailable)?;
            let row = client
                .query_opt(
                    "SELECT status, changed_at FROM sandbox_statuses WHERE sandbox = $1",
                    &[&sandbox],
                )
                .await
                .map_err(query_error)?;
            row.map(|row| {
                Ok((
                    status_of(row.get("status"))?,
                    from_millis(row.get("changed_at")),
                ))
            })
            .transpose()
        })
    }

    fn status_changes(&self) -> broadcast::Receiver<StatusChange> {
        self.changes.subscribe()
    }

    fn spend_link_nonce(&self, nonce: String, expires: SystemTime) -> StoreFuture<'_, bool> {
        Box::pin(async move {
            let expires = expires
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, millis);
            let mut client = self.pool.get().await.map_err(unavailable)?;
            let tx = client.transaction().await.map_err(query_error)?;
            tx.execute(
                "DELETE FROM used_link_nonces WHERE expires_at < shmastra_now_ms() - $1",
                &[&millis(USED_NONCE_MARGIN)],
            )
            .await
            .map_err(query_error)?;
            let inserted = tx
                .execute(
                    "INSERT INTO used_link_nonces (nonce, expires_at) VALUES ($1, $2)
                     ON CONFLICT (nonce) DO NOTHING",
                    &[&nonce, &expires],
                )
                .await
                .map_err(query_error)?;
            tx.commit().await.map_err(query_error)?;
            Ok(inserted == 1)
        })
    }

    fn link_nonce_spent(&self, nonce: String) -> StoreFuture<'_, bool> {
        Box::pin(async move {
            let client = self.pool.get().await.map_err(unavailable)?;
            let row = client
                .query_opt("SELECT 1 FROM used_link_nonces WHERE nonce = $1", &[&nonce])
                .await
                .map_err(query_error)?;
            Ok(row.is_some())
        })
    }

    fn token_generation(&self, user: UserId) -> StoreFuture<'_, u64> {
        Box::pin(async move {
            let client = self.pool.get().await.map_err(unavailable)?;
            let row = client
                .query_opt(
                    "SELECT generation FROM token_generations WHERE user_id = $1",
                    &[&user.as_str()],
                )
                .await
                .map_err(query_error)?;
            Ok(row.map_or(0, |row| row.get::<_, i64>(0).unsigned_abs()))
        })
    }

    fn bump_token_generation(&self, user: UserId) -> StoreFuture<'_, u64> {
        Box::pin(async move {
            let client = self.pool.get().await.map_err(unavailable)?;
            let row = client
                .query_one(
                    "INSERT INTO token_generations (user_id, generation, version)
                     VALUES ($1, 1, nextval('change_versions'))
                     ON CONFLICT (user_id) DO UPDATE
                        SET generation = token_generations.generation + 1,
                            version = EXCLUDED.version
                     RETURNING generation",
                    &[&user.as_str()],
                )
                .await
                .map_err(query_error)?;
            Ok(row.get::<_, i64>(0).unsigned_abs())
        })
    }

    fn token_generations_since(&self, after: i64) -> StoreFuture<'_, Vec<(UserId, u64, i64)>> {
        Box::pin(async move {
            let client = self.pool.get().await.map_err(unavailable)?;
            let rows = client
                .query(
                    "SELECT user_id, generation, version FROM token_generations
                      WHERE version > $1 ORDER BY version",
                    &[&after],
                )
                .await
                .map_err(query_error)?;
            rows.iter()
                .map(|row| {
                    let user: String = row.get(0);
                    let user = UserId::parse(&user).map_err(|e| StoreError::Corrupt {
                        what: "user id",
                        message: e.to_string(),
                    })?;
                    Ok((
                        user,
                        row.get::<_, i64>(1).unsigned_abs(),
                        row.get::<_, i64>(2),
                    ))
                })
                .collect()
        })
    }

    fn sandbox_of(&self, user: UserId) -> StoreFuture<'_, Option<String>> {
        Box::pin(async move {
            let client = self.pool.get().await.map_err(unavailable)?;
            let row = client
                .query_opt(
                    "SELECT sandbox_id FROM user_sandboxes WHERE user_id = $1",
                    &[&user.as_str()],
                )
                .await
                .map_err(query_error)?;
            Ok(row.and_then(|row| row.get::<_, Option<String>>(0)))
        })
    }

    fn claim_sandbox(
        &self,
        user: UserId,
        owner: String,
        lease: Duration,
    ) -> StoreFuture<'_, SandboxClaim> {
        Box::pin(async move {
            let client = self.pool.get().await.map_err(unavailable)?;
            // One statement: the row lock of `ON CONFLICT DO UPDATE` makes two claims at once
            // see each other, so at most one is granted.
            let granted = client
                .query_opt(
                    "INSERT INTO user_sandboxes (user_id, creator, creating_until, updated_at)
                     VALUES ($1, $2, shmastra_now_ms() + $3, shmastra_now_ms())
                     ON CONFLICT (user_id) DO UPDATE
                        SET creator = EXCLUDED.creator,
                            creating_until = EXCLUDED.creating_until,
                            updated_at = EXCLUDED.updated_at
                      WHERE user_sandboxes.sandbox_id IS NULL
                        AND (user_sandboxes.creating_until IS NULL
                             OR user_sandboxes.creating_until < shmastra_now_ms()
                             OR user_sandboxes.creator = EXCLUDED.creator)
                     RETURNING creator",
                    &[&user.as_str(), &owner, &millis(lease)],
                )
                .await
                .map_err(query_error)?;
            if granted.is_some() {
                return Ok(SandboxClaim::Create);
            }
            let row = client
                .query_opt(
                    "SELECT sandbox_id FROM user_sandboxes WHERE user_id = $1",
                    &[&user.as_str()],
                )
                .await
                .map_err(query_error)?;
            Ok(match row.and_then(|row| row.get::<_, Option<String>>(0)) {
                Some(sandbox) => SandboxClaim::Known(sandbox),
                None => SandboxClaim::Creating,
            })
        })
    }

    fn set_sandbox(&self, user: UserId, owner: String, sandbox: String) -> StoreFuture<'_, bool> {
        Box::pin(async move {
            let changed = self
                .execute(
                    "UPDATE user_sandboxes
                        SET sandbox_id = $3, creator = NULL, creating_until = NULL,
                            updated_at = shmastra_now_ms()
                      WHERE user_id = $1 AND creator = $2",
                    &[&user.as_str(), &owner, &sandbox],
                )
                .await?;
            Ok(changed == 1)
        })
    }

    fn forget_sandbox(&self, user: UserId, sandbox: String) -> StoreFuture<'_, bool> {
        Box::pin(async move {
            let changed = self
                .execute(
                    "UPDATE user_sandboxes SET sandbox_id = NULL, updated_at = shmastra_now_ms()
                      WHERE user_id = $1 AND sandbox_id = $2",
                    &[&user.as_str(), &sandbox],
                )
                .await?;
            Ok(changed == 1)
        })
    }

    fn user_sandboxes(&self) -> StoreFuture<'_, Vec<(UserId, String)>> {
        Box::pin(async move {
            let client = self.pool.get().await.map_err(unavailable)?;
            let rows = client
                .query(
                    "SELECT user_id, sandbox_id FROM user_sandboxes
                      WHERE sandbox_id IS NOT NULL ORDER BY user_id",
                    &[],
                )
                .await
                .map_err(query_error)?;
            rows.iter()
                .map(|row| {
                    let user: String = row.get(0);
                    let user = UserId::parse(&user).map_err(|e| StoreError::Corrupt {
                        what: "user id",
                        message: e.to_string(),
                    })?;
                    Ok((user, row.get(1)))
                })
                .collect()
        })
    }
}
