//! The in-process [`Store`]: one replica, nothing to install. Leases run on tokio's clock, so
//! tests of lease expiry can pause it.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use tokio::sync::broadcast;
use tokio::time::Instant;

use super::{
    Claim, FinishedRun, REMEMBERED_DELIVERY_TTL, REMEMBERED_PUSH_TTL, REMEMBERED_PUSHES_PER_USER,
    STATUS_CHANGES_BUFFER, SandboxClaim, StatusChange, Store, StoreFuture, USED_NONCE_MARGIN,
};
use crate::event::ExternalPush;
use crate::status::{SandboxStatus, SyncOutcome};
use crate::user::UserId;

struct Job {
    push: ExternalPush,
    /// How many events the user sent.
    events: u64,
    finished: Option<FinishedRun>,
    pending: bool,
    /// Order of the first owed event (claims take the smallest).
    pending_since: u64,
    holder: Option<(String, Instant)>,
}

#[derive(Default)]
struct State {
    jobs: HashMap<UserId, Job>,
    next_order: u64,
    pushes: HashMap<UserId, VecDeque<(String, String, Instant)>>,
    deliveries: HashMap<String, Instant>,
    statuses: HashMap<String, (SandboxStatus, SystemTime)>,
    nonces: HashMap<String, SystemTime>,
    generations: HashMap<UserId, (u64, i64)>,
    next_version: i64,
    sandboxes: HashMap<UserId, UserSandbox>,
}

/// A user's sandbox id, and the create in flight with its lease.
#[derive(Default)]
struct UserSandbox {
    sandbox: Option<String>,
    creator: Option<(String, Instant)>,
}

/// The in-process store. Share it behind an `Arc`.
pub struct MemoryStore {
    state: Mutex<State>,
    changes: broadcast::Sender<StatusChange>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore {
            state: Mutex::default(),
            changes: broadcast::channel(STATUS_CHANGES_BUFFER).0,
        }
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn claim_where(&self, only: Option<&UserId>, owner: String, lease: Duration) -> Option<Claim> {
        let now = Instant::now();
        let mut state = self.lock();
        let (_, job) = state
            .jobs
            .iter_mut()
            .filter(|(user, _)| only.is_none_or(|only| only == *user))
            .filter(|(_, job)| match &job.holder {
                None => job.pending,
                Some((_, until)) => *until < now,
            })
            .min_by_key(|(_, job)| job.pending_since)?;
        job.pending = false;
        job.holder = Some((owner.clone(), now + lease));
        Some(Claim {
            push: job.push.clone(),
            owner,
            seq: job.events,
        })
    }

    fn held<'a>(state: &'a mut State, claim: &Claim) -> Option<&'a mut Job> {
        state
            .jobs
            .get_mut(&claim.push.user)
            .filter(|job| job.holder.as_ref().is_some_and(|(o, _)| *o == claim.owner))
    }
}

fn ready<'a, T: Send + 'a>(value: T) -> StoreFuture<'a, T> {
    Box::pin(std::future::ready(Ok(value)))
}

impl Store for MemoryStore {
    fn enqueue(&self, push: ExternalPush) -> StoreFuture<'_, u64> {
        let mut state = self.lock();
        state.next_order += 1;
        let order = state.next_order;
        let job = state.jobs.entry(push.user.clone()).or_insert(Job {
            push: push.clone(),
            events: 0,
            finished: None,
            pending: false,
            pending_since: order,
            holder: None,
        });
        if !job.pending {
            job.pending_since = order;
        }
        job.pending = true;
        job.push = push;
        job.events += 1;
        ready(job.events)
    }

    fn claim(&self, owner: String, lease: Duration) -> StoreFuture<'_, Option<Claim>> {
        ready(self.claim_where(None, owner, lease))
    }

    fn claim_user(
        &self,
        user: UserId,
        owner: String,
        lease: Duration,
    ) -> StoreFuture<'_, Option<Claim>> {
        ready(self.claim_where(Some(&user), owner, lease))
    }

    fn renew(&self, claim: Claim, lease: Duration) -> StoreFuture<'_, bool> {
        let mut state = self.lock();
        let renewed = match MemoryStore::held(&mut state, &claim) {
            Some(job) => {
                job.holder = Some((claim.owner, Instant::now() + lease));
                true
            }
            None => false,
        };
        ready(renewed)
    }

    fn finish(&self, claim: Claim, outcome: SyncOutcome) -> StoreFuture<'_, bool> {
        let mut state = self.lock();
        let finished = match MemoryStore::held(&mut state, &claim) {
            Some(job) => {
                job.holder = None;
                job.finished = Some(FinishedRun {
                    seq: claim.seq,
                    outcome,
                });
                true
            }
            None => false,
        };
        ready(finished)
    }

    fn last_run(&self, user: UserId) -> StoreFuture<'_, Option<FinishedRun>> {
        ready(
            self.lock()
                .jobs
                .get(&user)
                .and_then(|job| job.finished.clone()),
        )
    }

    fn record_push(&self, push: ExternalPush) -> StoreFuture<'_, ()> {
        let now = Instant::now();
        let mut state = self.lock();
        let mine = state.pushes.entry(push.user).or_default();
        mine.retain(|(r, o, at)| {
            !(*r == push.refname && *o == push.new_oid) && now - *at < REMEMBERED_PUSH_TTL
        });
        while mine.len() >= REMEMBERED_PUSHES_PER_USER {
            mine.pop_front();
        }
        mine.push_back((push.refname, push.new_oid, now));
        ready(())
    }

    fn push_seen(&self, push: ExternalPush) -> StoreFuture<'_, bool> {
        let now = Instant::now();
        let state = self.lock();
        ready(state.pushes.get(&push.user).is_some_and(|mine| {
            mine.iter().any(|(r, o, at)| {
                *r == push.refname && *o == push.new_oid && now - *at < REMEMBERED_PUSH_TTL
            })
        }))
    }

    fn first_delivery(&self, ids: Vec<String>) -> StoreFuture<'_, bool> {
        let now = Instant::now();
        let mut state = self.lock();
        state
            .deliveries
            .retain(|_, at| now - *at < REMEMBERED_DELIVERY_TTL);
        let first = !ids.iter().any(|id| state.deliveries.contains_key(id));
        for id in ids {
            state.deliveries.insert(id, now);
        }
        ready(first)
    }

    fn set_status(&self, sandbox: String, status: SandboxStatus) -> StoreFuture<'_, ()> {
        let changed_at = SystemTime::now();
        self.lock()
            .statuses
            .insert(sandbox.clone(), (status.clone(), changed_at));
        let _ = self.changes.send(StatusChange {
            sandbox,
            status,
            changed_at,
        });
        ready(())
    }

    fn status(&self, sandbox: String) -> StoreFuture<'_, Option<(SandboxStatus, SystemTime)>> {
        ready(self.lock().statuses.get(&sandbox).cloned())
    }

    fn status_changes(&self) -> broadcast::Receiver<StatusChange> {
        self.changes.subscribe()
    }

    fn spend_link_nonce(&self, nonce: String, expires: SystemTime) -> StoreFuture<'_, bool> {
        let now = SystemTime::now();
        let mut state = self.lock();
        state
            .nonces
            .retain(|_, until| *until + USED_NONCE_MARGIN > now);
        ready(state.nonces.insert(nonce, expires).is_none())
    }

    fn link_nonce_spent(&self, nonce: String) -> StoreFuture<'_, bool> {
        ready(self.lock().nonces.contains_key(&nonce))
    }

    fn token_generation(&self, user: UserId) -> StoreFuture<'_, u64> {
        ready(self.lock().generations.get(&user).map_or(0, |(g, _)| *g))
    }

    fn bump_token_generation(&self, user: UserId) -> StoreFuture<'_, u64> {
        let mut state = self.lock();
        state.next_version += 1;
        let version = state.next_version;
        let entry = state.generations.entry(user).or_insert((0, version));
        *entry = (entry.0 + 1, version);
        ready(entry.0)
    }

    fn token_generations_since(&self, after: i64) -> StoreFuture<'_, Vec<(UserId, u64, i64)>> {
        let state = self.lock();
        ready(
            state
                .generations
                .iter()
                .filter(|(_, (_, version))| *version > after)
                .map(|(user, (g, version))| (user.clone(), *g, *version))
                .collect(),
        )
    }

    fn sandbox_of(&self, user: UserId) -> StoreFuture<'_, Option<String>> {
        let state = self.lock();
        ready(state.sandboxes.get(&user).and_then(|s| s.sandbox.clone()))
    }

    fn claim_sandbox(
        &self,
        user: UserId,
        owner: String,
        lease: Duration,
    ) -> StoreFuture<'_, SandboxClaim> {
        let now = Instant::now();
        let mut state = self.lock();
        let entry = state.sandboxes.entry(user).or_default();
        if let Some(sandbox) = &entry.sandbox {
            return ready(SandboxClaim::Known(sandbox.clone()));
        }
        match &entry.creator {
            Some((creator, until)) if *until >= now && *creator != owner => {
                ready(SandboxClaim::Creating)
            }
            _ => {
                entry.creator = Some((owner, now + lease));
                ready(SandboxClaim::Create)
            }
        }
    }

    fn set_sandbox(&self, user: UserId, owner: String, sandbox: String) -> StoreFuture<'_, bool> {
        let mut state = self.lock();
        let entry = state.sandboxes.entry(user).or_default();
        let holds = entry.creator.as_ref().is_some_and(|(c, _)| *c == owner);
        if holds {
            entry.sandbox = Some(sandbox);
            entry.creator = None;
        }
        ready(holds)
    }

    fn forget_sandbox(&self, user: UserId, sandbox: String) -> StoreFuture<'_, bool> {
        let mut state = self.lock();
        let Some(entry) = state.sandboxes.get_mut(&user) else {
            return ready(false);
        };
        let known = entry.sandbox.as_deref() == Some(sandbox.as_str());
        if known {
            entry.sandbox = None;
        }
        ready(known)
    }

    fn user_sandboxes(&self) -> StoreFuture<'_, Vec<(UserId, String)>> {
        let state = self.lock();
        let mut all: Vec<(UserId, String)> = state
            .sandboxes
            .iter()
            .filter_map(|(user, s)| Some((user.clone(), s.sandbox.clone()?)))
            .collect();
        all.sort();
        ready(all)
    }
}
