//! [`Orchestrator::sync_queued`]: a sync coordinated through the [`Store`]'s job queue, so one
//! user's sandbox is synced by one replica at a time across all replicas, and triggers on any
//! replica during a run give exactly one more run. Each caller gets the outcome of a run that
//! covered its event, whichever replica ran it.

use std::time::Duration;

use tokio::time::Instant;

use super::Orchestrator;
use super::sync::gone_failure;
use crate::event::ExternalPush;
use crate::host::ProjectHost;
use crate::sandbox::Sandbox;
use crate::status::{StatusSink, SyncOutcome};
use crate::store::{Store, StoreError, claim_owner, replica_name, run_holding};
use crate::user::UserId;

/// How often a caller whose event another runner covers looks for that run's end (and for a
/// job whose runner's lease ran out, which it then runs itself).
const OUTCOME_POLL: Duration = Duration::from_millis(200);

/// Why [`Orchestrator::sync_queued`] cannot say how the sync ended.
#[derive(Debug, thiserror::Error)]
pub enum QueuedSyncError {
    /// The store did not answer.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Another runner holds the user's job and renews its lease, but no run covering this
    /// event finished in time; its outcome will be the sandbox's status.
    #[error("the sync of user {user} runs elsewhere and had not finished after {}", shmastra_contract::duration::short_duration(*waited))]
    NotFinished {
        /// Whose sync.
        user: UserId,
        /// How long this caller waited.
        waited: Duration,
    },
}

impl<H: ProjectHost> Orchestrator<H> {
    /// Queues a sync for `push`'s user in `store` and returns how the run that covered it
    /// ended. The caller runs the user's job itself while it can claim it (its own run, then
    /// the runs that events on any replica owe meanwhile); while a runner elsewhere holds the
    /// job, it waits for the store to record a finished run that covered its event (the job's
    /// last run, as [`Store::last_run`] reports it), claiming the job itself if that runner's
    /// lease runs out. It waits at most two syncs and two commands (`sync_timeout` and
    /// `command_timeout` of the layout) plus one `lease` after it last ran anything:
    /// [`QueuedSyncError::NotFinished`]. While running, the claim is renewed every third of
    /// `lease`; a run whose lease is lost is stopped (the status stays `syncing`, and the
    /// replica now holding the job finishes it). Each run ends as in [`Orchestrator::sync`].
    pub async fn sync_queued<S: Sandbox>(
        &self,
        store: &dyn Store,
        sandbox: &S,
        push: ExternalPush,
        status: &impl StatusSink,
        lease: Duration,
    ) -> Result<SyncOutcome, QueuedSyncError> {
        let user = push.user.clone();
        let event = store.enqueue(push).await?;
        let replica = replica_name();
        let patience = (self.layout.sync_timeout + self.layout.command_timeout) * 2 + lease;
        let mut deadline = Instant::now() + patience;
        let mut own = None;
        loop {
            while let Some(claim) = store
                .claim_user(user.clone(), claim_owner(&replica), lease)
                .await?
            {
                let run = async {
                    match self.sync_once(sandbox, &user, status).await {
                        Ok(outcome) => outcome,
                        Err(gone) => gone_failure(sandbox.id(), &gone, status),
                    }
                };
                let Some(outcome) = run_holding(store, &claim, lease, run).await else {
                    break;
                };
                let covers = claim.seq >= event;
                if !store.finish(claim, outcome.clone()).await? {
                    tracing::warn!(%user, "the sync job's lease ran out before the run ended; another runner may repeat it");
                    break;
                }
                if covers && own.is_none() {
                    own = Some(outcome);
                }
                deadline = Instant::now() + patience;
            }
            if let Some(outcome) = own {
                return Ok(outcome);
            }
            if let Some(run) = store.last_run(user.clone()).await?
                && run.seq >= event
            {
                return Ok(run.outcome);
            }
            if Instant::now() >= deadline {
                return Err(QueuedSyncError::NotFinished {
                    user,
                    waited: patience,
                });
            }
            tokio::time::sleep(OUTCOME_POLL).await;
        }
    }
}
