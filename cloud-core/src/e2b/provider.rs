//! [`E2bProvider`]: users' sandboxes at E2B, their ids in the [`Store`] so every replica finds
//! the same one, and one create per user across replicas (the store's leased claim).
//!
//! A sandbox is created from `E2B_TEMPLATE` with `metadata.shmastraUser` naming its user (and
//! `shmastraCreate` naming the create, so a create whose answer was lost is found again), the
//! [`E2bLifecycle`]'s timeout, `autoPause` and `autoResume`. `connect` is E2B's connect: it
//! resumes a paused sandbox and extends the timeout; a 404 (killed, or its snapshot expired) is
//! [`SandboxError::Gone`] and the id is forgotten. A user whose id is not recorded (the store
//! was reset, or the sandbox predates it) is looked for by metadata through every page of
//! `GET /v2/sandboxes`.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::api::{ControlPlane, NewSandbox, SandboxAccess, SandboxInfo};
use super::sandbox::{E2bSandbox, nonce};
use super::{E2bError, E2bSettings};
use crate::provider::SandboxProvider;
use crate::sandbox::{Exec, Sandbox, SandboxError};
use crate::store::{SandboxClaim, Store, StoreError};
use crate::user::UserId;

/// The metadata key naming a sandbox's user.
pub const USER_METADATA: &str = "shmastraUser";
/// The metadata key naming the create that made a sandbox.
const CREATE_METADATA: &str = "shmastraCreate";
/// The sandbox's user, whose home the project lives in (the template's default user).
pub const SANDBOX_USER: &str = "user";

/// How a sandbox lives at E2B. The default is the original system's: 10 minutes, paused
/// (memory and files kept) rather than killed when they pass, resumed by traffic, and
/// extended by every connect (each operation, each visit of the workspace page).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct E2bLifecycle {
    /// How long a sandbox lives after its create or last connect.
    pub timeout: Duration,
    /// Paused (memory and files kept) rather than killed when the timeout passes.
    pub auto_pause: bool,
    /// A paused sandbox resumes when traffic reaches it (needs `auto_pause`).
    pub auto_resume: bool,
}

impl Default for E2bLifecycle {
    fn default() -> Self {
        E2bLifecycle {
            timeout: Duration::from_secs(10 * 60),
            auto_pause: true,
            auto_resume: true,
        }
    }
}

/// Users' E2B sandboxes. Cheap to clone.
#[derive(Clone)]
pub struct E2bProvider {
    inner: Arc<Inner>,
}

struct Inner {
    settings: Arc<E2bSettings>,
    api: ControlPlane,
    store: Arc<dyn Store>,
    lifecycle: E2bLifecycle,
    /// This replica's name in create claims.
    owner: String,
    create_lease: Duration,
    /// Each sandbox's home, learned once (`$HOME` in it never changes).
    homes: Mutex<HashMap<String, PathBuf>>,
    /// Per user, held while this replica claims: the store grants this replica's claim again
    /// to itself, so two of its calls at once must not both hold it.
    claiming: Mutex<HashMap<UserId, Arc<tokio::sync::Mutex<()>>>>,
}

impl E2bProvider {
    /// Sandboxes from `settings.template`, living as `lifecycle` says, their ids in `store`.
    pub fn new(
        settings: E2bSettings,
        store: Arc<dyn Store>,
        lifecycle: E2bLifecycle,
    ) -> Result<E2bProvider, E2bError> {
        let api = ControlPlane::new(
            settings.api_url.clone(),
            &settings.api_key,
            settings.request_timeout,
            settings.retry.clone(),
        )?;
        Ok(E2bProvider {
            inner: Arc::new(Inner {
                settings: Arc::new(settings),
                api,
                store,
                lifecycle,
                owner: crate::store::claim_owner(&crate::store::replica_name()),
                create_lease: CREATE_LEASE,
                homes: Mutex::new(HashMap::new()),
                claiming: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// The control-plane client.
    pub fn control_plane(&self) -> &ControlPlane {
        &self.inner.api
    }

    /// `E2B_TEMPLATE`.
    pub fn template(&self) -> &str {
        &self.inner.settings.template
    }

    /// The user's recorded sandbox id, or one found at E2B by its metadata (then recorded).
    pub async fn sandbox_id(&self, user: &UserId) -> Result<Option<String>, SandboxError> {
        if let Some(id) = self
            .store(user, self.inner.store.sandbox_of(user.clone()))
            .await?
        {
            return Ok(Some(id));
        }
        let Some(found) = self.listed(user).await? else {
            return Ok(None);
        };
        self.adopt(user, &found).await.map(Some)
    }

    /// Records `found` as `user`'s sandbox unless one is recorded already (which is returned
    /// instead); under a claim like a create, so a create racing this finds it.
    pub async fn adopt(&self, user: &UserId, found: &str) -> Result<String, SandboxError> {
        let _alone = self.claiming(user).await;
        loop {
            match self.claim(user).await? {
                SandboxClaim::Known(id) => return Ok(id),
                SandboxClaim::Create => {
                    let set = self.inner.store.set_sandbox(
                        user.clone(),
                        self.inner.owner.clone(),
                        found.to_owned(),
                    );
                    if self.store(user, set).await? {
                        return Ok(found.to_owned());
                    }
                }
                SandboxClaim::Creating => tokio::time::sleep(CLAIM_POLL).await,
            }
        }
    }

    /// Every sandbox at E2B whose metadata names a user under `key` (`shmastraUser` for the
    /// ones this cloud made; another key for sandboxes made before it), with that user.
    pub async fn listed_sandboxes(
        &self,
        key: &str,
    ) -> Result<Vec<(UserId, SandboxInfo)>, E2bError> {
        let all = self.inner.api.list(&BTreeMap::new()).await?;
        Ok(all
            .into_iter()
            .filter_map(|info| {
                let user = info.metadata.as_ref()?.get(key)?;
                Some((UserId::parse(user).ok()?, info))
            })
            .collect())
    }

    /// Every user with a recorded sandbox id, from the store.
    pub async fn recorded_sandboxes(&self) -> Result<Vec<(UserId, String)>, StoreError> {
        self.inner.store.user_sandboxes().await
    }

    /// Connects to sandbox `id` as `user`'s (resuming it when paused); a sandbox E2B no longer
    /// knows is [`SandboxError::Gone`], and forgotten.
    pub async fn open_sandbox(&self, user: &UserId, id: &str) -> Result<E2bSandbox, SandboxError> {
        self.open(user, id).await
    }

    /// The newest sandbox at E2B whose metadata names `user`.
    async fn listed(&self, user: &UserId) -> Result<Option<String>, SandboxError> {
        let filter = BTreeMap::from([(USER_METADATA.to_owned(), user.to_string())]);
        let found = self
            .inner
            .api
            .list(&filter)
            .await
            .map_err(|e| failure(user, e))?;
        Ok(found.into_iter().next().map(|s| s.sandbox_id))
    }

    /// This replica's turn to claim for `user`.
    async fn claiming(&self, user: &UserId) -> tokio::sync::OwnedMutexGuard<()> {
        let turn = self
            .inner
            .claiming
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(user.clone())
            .or_default()
            .clone();
        turn.lock_owned().await
    }

    async fn claim(&self, user: &UserId) -> Result<SandboxClaim, SandboxError> {
        let claim = self.inner.store.claim_sandbox(
            user.clone(),
            self.inner.owner.clone(),
            self.inner.create_lease,
        );
        self.store(user, claim).await
    }

    async fn store<T>(
        &self,
        user: &UserId,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, SandboxError> {
        call.await.map_err(|e| SandboxError::Unavailable {
            sandbox: user.to_string(),
            source: Box::new(e),
        })
    }

    /// Connects to sandbox `id` of `user`; a sandbox E2B no longer knows is forgotten.
    async fn open(&self, user: &UserId, id: &str) -> Result<E2bSandbox, SandboxError> {
        let timeout = self.inner.lifecycle.timeout;
        match self.inner.api.connect(id, timeout).await {
            Ok((_, access)) => self.sandbox(user, &access).await,
            // 404: killed or expired; 409: being killed.
            Err(E2bError::NotFound { .. } | E2bError::Conflict { .. }) => {
                let forget = self.inner.store.forget_sandbox(user.clone(), id.to_owned());
                self.store(user, forget).await?;
                tracing::info!(user = %user, id, "the user's sandbox is gone at E2B");
                Err(SandboxError::Gone {
                    sandbox: user.to_string(),
                })
            }
            Err(e) => Err(failure(user, e)),
        }
    }

    async fn sandbox(
        &self,
        user: &UserId,
        access: &SandboxAccess,
    ) -> Result<E2bSandbox, SandboxError> {
        let known = self
            .inner
            .homes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&access.sandbox_id)
            .cloned();
        let make = |home: PathBuf| {
            E2bSandbox::new(
                user.as_str(),
                access,
                home,
                self.inner.api.clone(),
                self.inner.settings.clone(),
                SANDBOX_USER,
                self.inner.lifecycle.timeout,
            )
        };
        if let Some(home) = known {
            return make(home);
        }
        let probe = make(PathBuf::from("/"))?;
        let out = probe
            .exec(&Exec::new("printf '%s' \"$HOME\"", Duration::from_secs(60)))
            .await?;
        let home = PathBuf::from(out.stdout.trim());
        if !out.success() || !home.is_absolute() {
            return Err(SandboxError::Unavailable {
                sandbox: user.to_string(),
                source: format!(
                    "cannot learn the home directory of sandbox {}: {out:?}",
                    access.sandbox_id
                )
                .into(),
            });
        }
        self.inner
            .homes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(access.sandbox_id.clone(), home.clone());
        make(home)
    }

    fn new_sandbox(&self, user: &UserId) -> NewSandbox {
        let lifecycle = self.inner.lifecycle;
        NewSandbox {
            template: self.inner.settings.template.clone(),
            timeout: lifecycle.timeout,
            auto_pause: lifecycle.auto_pause,
            auto_resume: lifecycle.auto_pause && lifecycle.auto_resume,
            metadata: BTreeMap::from([
                (USER_METADATA.to_owned(), user.to_string()),
                (CREATE_METADATA.to_owned(), nonce()),
            ]),
            env_vars: BTreeMap::new(),
        }
    }
}

/// How often a replica waiting for another's create asks again.
const CLAIM_POLL: Duration = Duration::from_millis(250);
/// How long a create claim holds before another replica may create: far longer than a create.
const CREATE_LEASE: Duration = Duration::from_secs(120);

fn failure(user: &UserId, error: E2bError) -> SandboxError {
    let sandbox = user.to_string();
    match error {
        E2bError::NotFound { .. } => SandboxError::Gone { sandbox },
        e if e.is_setup() => SandboxError::Refused {
            sandbox,
            source: Box::new(e),
        },
        e => SandboxError::Unavailable {
            sandbox,
            source: Box::new(e),
        },
    }
}

impl SandboxProvider for E2bProvider {
    type Sandbox = E2bSandbox;

    async fn connect(&self, user: &UserId) -> Result<E2bSandbox, SandboxError> {
        match self.sandbox_id(user).await? {
            Some(id) => self.open(user, &id).await,
            None => Err(SandboxError::Gone {
                sandbox: user.to_string(),
            }),
        }
    }

    /// Creates the user's sandbox, unless another replica holds the create: then waits for
    /// it (at most twice the create lease) and returns the sandbox it made.
    async fn create(&self, user: &UserId) -> Result<E2bSandbox, SandboxError> {
        let _alone = self.claiming(user).await;
        let give_up = Instant::now() + self.inner.create_lease * 2;
        loop {
            match self.claim(user).await? {
                SandboxClaim::Known(id) => match self.open(user, &id).await {
                    Err(e) if e.is_gone() => continue,
                    other => return other,
                },
                SandboxClaim::Creating if Instant::now() < give_up => {
                    tokio::time::sleep(CLAIM_POLL).await;
                }
                SandboxClaim::Creating => {
                    return Err(SandboxError::Unavailable {
                        sandbox: user.to_string(),
                        source:
                            "another replica is creating this user's sandbox and has not finished"
                                .into(),
                    });
                }
                SandboxClaim::Create => {
                    let access = self
                        .inner
                        .api
                        .create(&self.new_sandbox(user))
                        .await
                        .map_err(|e| failure(user, e))?;
                    tracing::info!(user = %user, id = %access.sandbox_id, template = %self.inner.settings.template, "created an E2B sandbox");
                    let set = self.inner.store.set_sandbox(
                        user.clone(),
                        self.inner.owner.clone(),
                        access.sandbox_id.clone(),
                    );
                    if self.store(user, set).await? {
                        return self.sandbox(user, &access).await;
                    }
                    // The claim ran out during the create and another replica made one: keep
                    // that one.
                    tracing::warn!(user = %user, id = %access.sandbox_id, "the create claim ran out; killing the sandbox it made");
                    if let Err(e) = self.inner.api.kill(&access.sandbox_id).await {
                        tracing::warn!(user = %user, error = %e, "cannot kill the surplus sandbox");
                    }
                }
            }
        }
    }
}
