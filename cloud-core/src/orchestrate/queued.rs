//! [`Orchestrator::sync_queued`]: a sync coordinated through the [`Store`]'s job queue, so one
//! user's sandbox is synced by one replica at a time across all replicas, and triggers on any
//! replica during a run give exactly one more run.

use std::time::Duration;

use shmastra_contract::SyncFailure;

use super::coalesce::Triggered;
use super::{Orchestrator, ProjectHost, SandboxStatus, StatusSink};
use crate::event::ExternalPush;
use crate::sandbox::Sandbox;
use crate::store::{Store, StoreError, claim_owner, replica_name, run_holding};

impl<H: ProjectHost> Orchestrator<H> {
    /// Queues a sync for `push`'s user in `store`, then runs it here unless a runner elsewhere
    /// holds the user's job (it runs once more for this trigger: `Coalesced`). While running,
    /// the claim is renewed every third of `lease`; a run whose lease is lost is stopped (the
    /// status stays `syncing` and the replica now holding the job finishes it). Each run ends
    /// as in [`Orchestrator::sync`]. `Err`: the store cannot be reached; nothing ran.
    pub async fn sync_queued<S: Sandbox>(
        &self,
        store: &dyn Store,
        sandbox: &S,
        push: ExternalPush,
        status: &impl StatusSink,
        lease: Duration,
    ) -> Result<Triggered, StoreError> {
        let user = push.user.clone();
        store.enqueue(push).await?;
        let replica = replica_name();
        let mut runs = 0;
        while let Some(claim) = store
            .claim_user(user.clone(), claim_owner(&replica), lease)
            .await?
        {
            runs += 1;
            let run = async {
                if let Err(gone) = self.sync_once(sandbox, &user, status).await {
                    status.set_status(
                        sandbox.id(),
                        SandboxStatus::Broken {
                            failure: SyncFailure::new("sync", gone.to_string()),
                        },
                    );
                }
            };
            if !run_holding(store, &claim, lease, run).await {
                break;
            }
            if !store.finish(claim).await? {
                tracing::warn!(%user, "the sync job's lease ran out before the run ended; another runner may repeat it");
                break;
            }
        }
        Ok(if runs == 0 {
            Triggered::Coalesced
        } else {
            Triggered::Ran { runs }
        })
    }
}
