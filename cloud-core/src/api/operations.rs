//! The control API's long operations (provision, sync, restore): each answers `202` at once
//! with a status URL, runs in the background, and is kept for [`KEEP_FINISHED`] after it ends.
//!
//! One user's operations run one at a time, in the order asked. A request joins an operation
//! instead of starting another when it asks for the same thing (same kind, same body):
//! a provision or a restore that is queued or running, a sync that is still queued (a running
//! sync may have started before the push the new request is about, so the request gets the
//! next run, as `coalesce.rs` does for the page). With an `Idempotency-Key`, a request repeated
//! with that key gets the operation the first one started, whatever its state; the same key
//! with another request is refused (422). Requests are told apart by a keyed hash of their
//! body (the key is this process's own and random, so no secret value can be guessed back
//! from it); nothing of a body is kept.

use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use hmac::{Hmac, Mac};
use http::StatusCode;
use serde::Serialize;
use sha2::Sha256;
use tokio::time::Instant;
use utoipa::ToSchema;

use super::error::{ApiError, ErrorDetail};
use super::model::{ProvisionResult, RestoreResult, SyncResult};
use crate::orchestrate::history::rfc3339;
use crate::user::UserId;

/// How long a finished operation (and its `Idempotency-Key`) is remembered.
pub const KEEP_FINISHED: Duration = Duration::from_secs(3600);
/// Most operations remembered, all users together; past it the oldest finished go first.
const MAX_KEPT: usize = 4096;
/// Most operations one user may have queued or running.
pub const MAX_PENDING_PER_USER: usize = 4;
/// Longest `Idempotency-Key`.
const MAX_KEY_LEN: usize = 255;

/// What an operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OperationKind {
    /// `POST /users/{user}/sandbox`.
    Provision,
    /// `POST /users/{user}/sync`.
    Sync,
    /// `POST /users/{user}/restore`.
    Restore,
}

impl OperationKind {
    /// The name the API's JSON gives it, for log lines.
    fn name(self) -> &'static str {
        match self {
            Self::Provision => "provision",
            Self::Sync => "sync",
            Self::Restore => "restore",
        }
    }
}

/// Where an operation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OperationState {
    /// Waiting for the user's earlier operation.
    Queued,
    /// Under way.
    Running,
    /// Done; the result is in the field named after its kind.
    Succeeded,
    /// Done without success; `error` says why.
    Failed,
}

/// A long operation, as its status URL answers it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Operation {
    /// `op_` and 32 hex digits.
    pub id: String,
    /// What it does.
    pub kind: OperationKind,
    /// Whose sandbox.
    pub user: String,
    /// Where it is.
    pub state: OperationState,
    /// Where to read it again (`GET`).
    pub status_url: String,
    /// When it was asked for (RFC 3339 UTC).
    pub created_at: String,
    /// When it started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    /// When it ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// A provision's result.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provision: Option<ProvisionResult>,
    /// A sync's result (a failed install is a sync that succeeded in telling: `outcome`
    /// `failed`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sync: Option<SyncResult>,
    /// A restore's result.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restore: Option<RestoreResult>,
    /// Why it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorDetail>,
}

/// What an operation produced.
pub enum Outcome {
    /// A provision's result.
    Provision(ProvisionResult),
    /// A sync's result.
    Sync(SyncResult),
    /// A restore's result.
    Restore(RestoreResult),
}

/// An operation's work, started when the user's earlier operations have ended.
pub type Work = Box<dyn FnOnce() -> BoxFuture<'static, Result<Outcome, ApiError>> + Send>;

struct Entry {
    op: Operation,
    user: UserId,
    fingerprint: [u8; 32],
    key: Option<String>,
    finished: Option<Instant>,
}

#[derive(Default)]
struct Book {
    entries: HashMap<String, Entry>,
    /// Ids, oldest first.
    order: VecDeque<String>,
    /// `(user, Idempotency-Key)` -> id.
    keys: HashMap<(UserId, String), String>,
}

/// The operations of this server.
pub struct Operations {
    book: Mutex<Book>,
    /// Per user: held by the operation running, so the next waits.
    turns: Mutex<HashMap<UserId, Arc<tokio::sync::Mutex<()>>>>,
    fingerprint_key: [u8; 32],
}

impl Default for Operations {
    fn default() -> Self {
        let mut fingerprint_key = [0u8; 32];
        getrandom::getrandom(&mut fingerprint_key).expect("the OS random source is readable");
        Operations {
            book: Mutex::default(),
            turns: Mutex::default(),
            fingerprint_key,
        }
    }
}

/// Checks an `Idempotency-Key` header's value: 1 to 255 visible ASCII characters.
pub fn idempotency_key(value: Option<&http::HeaderValue>) -> Result<Option<String>, ApiError> {
    let Some(value) = value else {
        return Ok(None);
    };
    match value.to_str() {
        Ok(key)
            if (1..=MAX_KEY_LEN).contains(&key.len())
                && key.bytes().all(|b| b.is_ascii_graphic()) =>
        {
            Ok(Some(key.to_owned()))
        }
        _ => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            format!("Idempotency-Key must be 1 to {MAX_KEY_LEN} visible ASCII characters"),
        )),
    }
}

impl Operations {
    /// Starts `work` as an operation of `kind` for `user`, or returns the operation this
    /// request joins (see the module doc). `request` is the body as it identifies the request.
    pub fn start(
        self: &Arc<Self>,
        user: &UserId,
        kind: OperationKind,
        request: &[u8],
        key: Option<String>,
        work: Work,
    ) -> Result<Operation, ApiError> {
        let fingerprint = self.fingerprint(kind, request);
        let mut book = self.book.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        book.prune(now);
        if let Some(key) = &key
            && let Some(id) = book.keys.get(&(user.clone(), key.clone()))
            && let Some(entry) = book.entries.get(id)
        {
            if entry.fingerprint != fingerprint {
                return Err(ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "idempotency_key_reused",
                    "this Idempotency-Key was used for another request; use a new key for a new request",
                ));
            }
            return Ok(entry.op.clone());
        }
        let joined = book.entries.values().find(|e| {
            e.user == *user
                && e.fingerprint == fingerprint
                && match e.op.state {
                    OperationState::Queued => true,
                    OperationState::Running => kind != OperationKind::Sync,
                    OperationState::Succeeded | OperationState::Failed => false,
                }
        });
        if let Some(entry) = joined {
            let op = entry.op.clone();
            if let Some(key) = key {
                book.keys.insert((user.clone(), key), op.id.clone());
            }
            return Ok(op);
        }
        let pending = book
            .entries
            .values()
            .filter(|e| e.user == *user && e.finished.is_none())
            .count();
        if pending >= MAX_PENDING_PER_USER {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_operations",
                format!(
                    "user {user} has {pending} operations queued or running; wait for one to end"
                ),
            ));
        }
        let id = new_id();
        let op = Operation {
            status_url: format!("/api/v1/users/{user}/operations/{id}"),
            id: id.clone(),
            kind,
            user: user.to_string(),
            state: OperationState::Queued,
            created_at: rfc3339(SystemTime::now()),
            started_at: None,
            finished_at: None,
            provision: None,
            sync: None,
            restore: None,
            error: None,
        };
        if let Some(key) = &key {
            book.keys.insert((user.clone(), key.clone()), id.clone());
        }
        book.entries.insert(
            id.clone(),
            Entry {
                op: op.clone(),
                user: user.clone(),
                fingerprint,
                key,
                finished: None,
            },
        );
        book.order.push_back(id.clone());
        drop(book);
        let operations = self.clone();
        let turn = self.turn(user);
        tokio::spawn(async move {
            let _turn = turn.lock().await;
            operations.update(&id, |op| {
                op.state = OperationState::Running;
                op.started_at = Some(rfc3339(SystemTime::now()));
            });
            let outcome = AssertUnwindSafe(work()).catch_unwind().await;
            let outcome = outcome.unwrap_or_else(|_| {
                Err(ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "the operation stopped unexpectedly",
                ))
            });
            operations.finish(&id, outcome);
        });
        Ok(op)
    }

    /// The user's operation `id`, if it is remembered.
    pub fn get(&self, user: &UserId, id: &str) -> Option<Operation> {
        let book = self.book.lock().unwrap_or_else(|p| p.into_inner());
        book.entries
            .get(id)
            .filter(|e| e.user == *user)
            .map(|e| e.op.clone())
    }

    fn fingerprint(&self, kind: OperationKind, request: &[u8]) -> [u8; 32] {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.fingerprint_key)
            .expect("HMAC accepts keys of any length");
        mac.update(&[kind as u8]);
        mac.update(request);
        mac.finalize().into_bytes().into()
    }

    fn turn(&self, user: &UserId) -> Arc<tokio::sync::Mutex<()>> {
        let mut turns = self.turns.lock().unwrap_or_else(|p| p.into_inner());
        // A turn nobody holds or waits for is dropped, so the map follows the users with work.
        turns.retain(|_, turn| Arc::strong_count(turn) > 1);
        turns.entry(user.clone()).or_default().clone()
    }

    fn update(&self, id: &str, change: impl FnOnce(&mut Operation)) {
        let mut book = self.book.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = book.entries.get_mut(id) {
            change(&mut entry.op);
        }
    }

    fn finish(&self, id: &str, outcome: Result<Outcome, ApiError>) {
        let mut book = self.book.lock().unwrap_or_else(|p| p.into_inner());
        let Some(entry) = book.entries.get_mut(id) else {
            return;
        };
        entry.finished = Some(Instant::now());
        let op = &mut entry.op;
        op.finished_at = Some(rfc3339(SystemTime::now()));
        match outcome {
            Ok(Outcome::Provision(result)) => op.provision = Some(result),
            Ok(Outcome::Sync(result)) => op.sync = Some(result),
            Ok(Outcome::Restore(result)) => op.restore = Some(result),
            Err(error) => {
                tracing::info!(operation = %op.id, user = %op.user, kind = op.kind.name(), status = error.status().as_u16(), "operation failed");
                op.error = Some(error.body().error);
            }
        }
        op.state = if op.error.is_some() {
            OperationState::Failed
        } else {
            OperationState::Succeeded
        };
    }
}

impl Book {
    /// Forgets finished operations past [`KEEP_FINISHED`], then the oldest finished ones while
    /// more than [`MAX_KEPT`] are kept.
    fn prune(&mut self, now: Instant) {
        let expired = |e: &Entry, all: usize| {
            e.finished
                .is_some_and(|at| now.duration_since(at) >= KEEP_FINISHED || all > MAX_KEPT)
        };
        let mut kept = VecDeque::with_capacity(self.order.len());
        while let Some(id) = self.order.pop_front() {
            let all = self.entries.len();
            match self.entries.get(&id) {
                Some(entry) if expired(entry, all) => {
                    if let Some(entry) = self.entries.remove(&id)
                        && let Some(key) = entry.key
                    {
                        self.keys.remove(&(entry.user, key));
                    }
                }
                Some(_) => kept.push_back(id),
                None => {}
            }
        }
        self.order = kept;
    }
}

fn new_id() -> String {
    let mut bytes = [0u8; 16];
    getrandom::getrandom(&mut bytes).expect("the OS random source is readable");
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("op_{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str) -> UserId {
        UserId::parse(name).unwrap()
    }

    #[test]
    fn a_kind_logs_under_its_json_name() {
        for kind in [
            OperationKind::Provision,
            OperationKind::Sync,
            OperationKind::Restore,
        ] {
            assert_eq!(serde_json::to_value(kind).unwrap(), kind.name());
        }
    }

    /// Work that waits for `gate` and then succeeds with a sync result.
    fn gated(gate: &Arc<tokio::sync::Notify>, runs: &Arc<std::sync::atomic::AtomicUsize>) -> Work {
        let (gate, runs) = (gate.clone(), runs.clone());
        Box::new(move || {
            Box::pin(async move {
                runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                gate.notified().await;
                Ok(Outcome::Sync(SyncResult {
                    outcome: super::super::model::SyncOutcomeWord::Synced,
                    commit: None,
                    failure: None,
                }))
            })
        })
    }

    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn same_requests_join_and_a_running_sync_gets_one_more_run() {
        let ops = Arc::new(Operations::default());
        let gate = Arc::new(tokio::sync::Notify::new());
        let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let alice = user("alice");
        let first = ops
            .start(&alice, OperationKind::Sync, b"", None, gated(&gate, &runs))
            .unwrap();
        settle().await;
        assert_eq!(
            ops.get(&alice, &first.id).unwrap().state,
            OperationState::Running
        );
        // The running sync may predate this request's push: a new, queued run.
        let second = ops
            .start(&alice, OperationKind::Sync, b"", None, gated(&gate, &runs))
            .unwrap();
        assert_ne!(second.id, first.id);
        assert_eq!(second.state, OperationState::Queued);
        // A third joins the queued one.
        let third = ops
            .start(&alice, OperationKind::Sync, b"", None, gated(&gate, &runs))
            .unwrap();
        assert_eq!(third.id, second.id);
        // Another user's is their own.
        let bobs = ops
            .start(
                &user("bob"),
                OperationKind::Sync,
                b"",
                None,
                gated(&gate, &runs),
            )
            .unwrap();
        assert_ne!(bobs.id, second.id);
        settle().await;
        assert_eq!(
            runs.load(std::sync::atomic::Ordering::SeqCst),
            2,
            "alice's first and bob's"
        );
        gate.notify_waiters();
        settle().await;
        assert_eq!(
            ops.get(&alice, &first.id).unwrap().state,
            OperationState::Succeeded
        );
        assert_eq!(
            ops.get(&alice, &second.id).unwrap().state,
            OperationState::Running
        );
        gate.notify_waiters();
        settle().await;
        assert_eq!(
            ops.get(&alice, &second.id).unwrap().state,
            OperationState::Succeeded
        );
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 3);
        assert!(
            ops.get(&user("bob"), &first.id).is_none(),
            "alice's is not bob's"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_running_provision_is_joined_and_keys_are_kept_until_forgotten() {
        let ops = Arc::new(Operations::default());
        let gate = Arc::new(tokio::sync::Notify::new());
        let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let alice = user("alice");
        let key = || Some("k-1".to_owned());
        let first = ops
            .start(
                &alice,
                OperationKind::Provision,
                b"{}",
                key(),
                gated(&gate, &runs),
            )
            .unwrap();
        settle().await;
        let joined = ops
            .start(
                &alice,
                OperationKind::Provision,
                b"{}",
                None,
                gated(&gate, &runs),
            )
            .unwrap();
        assert_eq!(joined.id, first.id);
        let reused = ops
            .start(
                &alice,
                OperationKind::Provision,
                b"{\"x\":1}",
                key(),
                gated(&gate, &runs),
            )
            .unwrap_err();
        assert_eq!(reused.status(), StatusCode::UNPROCESSABLE_ENTITY);
        gate.notify_waiters();
        settle().await;
        // After it ended, the key still names it; without the key, a new one starts.
        let again = ops
            .start(
                &alice,
                OperationKind::Provision,
                b"{}",
                key(),
                gated(&gate, &runs),
            )
            .unwrap();
        assert_eq!(
            (again.id.as_str(), again.state),
            (first.id.as_str(), OperationState::Succeeded)
        );
        tokio::time::advance(KEEP_FINISHED).await;
        let later = ops
            .start(
                &alice,
                OperationKind::Provision,
                b"{}",
                key(),
                gated(&gate, &runs),
            )
            .unwrap();
        assert_ne!(later.id, first.id, "forgotten after KEEP_FINISHED");
        assert!(ops.get(&alice, &first.id).is_none());
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_user_has_a_bounded_queue() {
        let ops = Arc::new(Operations::default());
        let gate = Arc::new(tokio::sync::Notify::new());
        let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let alice = user("alice");
        for n in 0..MAX_PENDING_PER_USER {
            ops.start(
                &alice,
                OperationKind::Restore,
                &[n as u8],
                None,
                gated(&gate, &runs),
            )
            .unwrap();
        }
        let refused = ops
            .start(
                &alice,
                OperationKind::Restore,
                b"more",
                None,
                gated(&gate, &runs),
            )
            .unwrap_err();
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    }

    #[test]
    fn idempotency_keys_are_visible_ascii() {
        let key =
            |v: &'static [u8]| idempotency_key(Some(&http::HeaderValue::from_bytes(v).unwrap()));
        assert_eq!(key(b"abc-123").unwrap().as_deref(), Some("abc-123"));
        assert!(key(b"").is_err());
        assert!(key(b"a b").is_err());
        assert!(key(&[b'a'; 256]).is_err());
        assert_eq!(idempotency_key(None).unwrap(), None);
    }
}
