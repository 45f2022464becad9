//! `shmastra-cloud serve`: the git proxy at `/api/git`, the GitLab push webhook at
//! `/api/gitlab/webhook`, `/healthz`, the workspace page ([`crate::web`]), and the local
//! stand-in for starting a sync: a command run per external push through the store's job
//! queue (coalesced per user, one run at a time per user across every replica on the same
//! database), and, with sandboxes on this machine, a sync of the user's sandbox.
//!
//! The accept loop is its own, not `axum::serve`: hyper's header timeout needs a timer, and
//! the connection limit, the client address of each request and the end of every CGI child
//! at shutdown need the loop.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use http::StatusCode;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use secrecy::SecretString;
use shmastra_contract::SyncFailure;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use crate::api;
use crate::api::keys::ApiKeys;
use crate::client::ClientAddr;
use crate::config::Config;
use crate::env_names::{SERVER_SECRET_VARS, WEBHOOK_SECRET_ENV};
use crate::event::{ExternalPush, OnExternalPush};
use crate::gitlab::GitLab;
use crate::hosts::embedded::EmbeddedUpstream;
use crate::http_backend::Children;
use crate::proxy::upstream::{HttpUpstream, Upstream};
use crate::proxy::{Proxy, ProxyLimits};
use crate::status::SyncOutcome;
use crate::store::generations::StoreGenerations;
use crate::store::jobs::SyncJobs;
use crate::store::memory::MemoryStore;
use crate::store::postgres::PostgresStore;
use crate::store::{Store, StoreError, replica_name};
use crate::token::TokenSigner;
use crate::web::sandboxes::LocalSandboxes;
use crate::web::{WebConfig, WorkspaceError, workspace};
use crate::webhook::Webhook;

/// Where the proxy forwards to.
pub enum UpstreamChoice {
    /// A directory of bare repositories served by `git http-backend` (`--upstream-dir`).
    Embedded(PathBuf),
    /// GitLab, with the service token as the git password.
    GitLab(Config),
}

/// Bounds on the connections `serve` accepts.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// Open connections at most; past it a new connection gets a canned 503 and is closed,
    /// while the open ones are served.
    pub max_connections: usize,
    /// Longest time a connection may take to send a request's headers, and longest a
    /// keep-alive connection may sit idle between requests.
    pub header_timeout: Duration,
    /// How long a stopping server waits for requests in flight before it ends them.
    pub shutdown_grace: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: 512,
            header_timeout: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// Everything `serve` needs, validated by the caller.
pub struct ServeConfig {
    /// Where to listen (`--listen`); port 0 picks one.
    pub listen: SocketAddr,
    /// Where the proxy forwards to.
    pub upstream: UpstreamChoice,
    /// Verifies project tokens; signs sign-in links and sessions.
    pub signer: TokenSigner,
    /// `GITLAB_WEBHOOK_SECRET`; without it the webhook route is not mounted.
    pub webhook_secret: Option<SecretString>,
    /// `--on-external-push`: a shell command run per external push.
    pub on_external_push: Option<String>,
    /// Bounds on each proxied request.
    pub limits: ProxyLimits,
    /// Bounds on connections.
    pub connections: ConnectionLimits,
    /// The embedded upstream protects `main`, `recovery/*` and tags unless this is set
    /// (`--allow-history-rewrite`).
    pub allow_history_rewrite: bool,
    /// Names of env vars `--on-external-push` inherits besides its own (`--sync-env`).
    pub sync_env: Vec<String>,
    /// How many `--on-external-push` runs (for different users) go on at once.
    pub parallel_syncs: usize,
    /// `--database-url`: the state every replica shares; without it, in-process state for a
    /// single replica.
    pub database: Option<deadpool_postgres::Pool>,
    /// How long a replica's claim on a sync job holds without renewal: a replica that dies
    /// mid-run leaves the job to another within this time.
    pub sync_lease: Duration,
    /// With a database: how long this replica accepts tokens while it cannot read the token
    /// revocations (`--token-state-max-age`); past it every token gets 503 and `/healthz` says
    /// unhealthy.
    pub token_state_max_age: Duration,
    /// The workspace page: public URL, sandboxes on this machine.
    pub web: WebConfig,
    /// `SHMASTRA_API_KEY`: the control API's keys; without them `/api/v1/` answers that it is
    /// off (its OpenAPI document is served all the same).
    pub api_keys: Option<ApiKeys>,
}

/// Why `serve` could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The address cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// `--listen`.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// `--upstream-dir` cannot be used.
    #[error("cannot use {dir} as the upstream directory: {source}")]
    UpstreamDir {
        /// The directory.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The workspace page's sandboxes cannot be set up.
    #[error(transparent)]
    Workspace(#[from] WorkspaceError),
    /// The GitLab client or upstream cannot be made.
    #[error("cannot set up the GitLab upstream: {0}")]
    GitLab(String),
    /// A `--sync-env` name is one of the server's secrets.
    #[error("--sync-env {0}: a server secret is never passed to the sync command")]
    SecretInSyncEnv(String),
    /// The accept loop failed.
    #[error("the server failed: {0}")]
    Server(std::io::Error),
    /// The database cannot be used at start (unreachable, migration).
    #[error("cannot start on the database: {0}")]
    Database(StoreError),
}

/// What the sync command inherits from the server's environment, besides `--sync-env`.
const SYNC_BASE_ENV: [&str; 7] = ["PATH", "HOME", "USER", "LANG", "LC_ALL", "TZ", "TMPDIR"];

/// The answer to a connection past the limit: written without reading the request.
const OVER_CONNECTION_LIMIT: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 5\r\nContent-Type: text/plain\r\nContent-Length: 40\r\nConnection: close\r\n\r\nthe server is at its connection limit.\r\n";

/// Binds `config.listen`, calls `on_listening` with the bound address (port 0 becomes a real
/// one), and serves until `shutdown` completes. Then it stops accepting, lets requests in
/// flight finish within the grace period, and ends every `git http-backend` child.
pub async fn serve(
    config: ServeConfig,
    on_listening: impl FnOnce(SocketAddr),
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| ServeError::Listen {
            addr: config.listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(ServeError::Server)?;
    // Nothing of this process (its memory, its environment with the signing secret) is for
    // another process of the same uid to read: no core dumps, no ptrace, `/proc/<pid>/environ`
    // root's alone.
    if let Err(e) =
        rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
    {
        tracing::warn!(error = %e, "cannot make this process non-dumpable");
    }
    let mut config = config;
    let (store, generations): (Arc<dyn Store>, _) = match &config.database {
        Some(pool) => {
            let store: Arc<dyn Store> = PostgresStore::connect(pool.clone())
                .await
                .map_err(ServeError::Database)?;
            let generations = Arc::new(
                StoreGenerations::start(store.clone(), config.token_state_max_age)
                    .await
                    .map_err(ServeError::Database)?,
            );
            config.signer = config.signer.clone().with_generations(generations.clone());
            tracing::info!("shared state: PostgreSQL");
            (store, Some(generations))
        }
        None => (Arc::new(MemoryStore::new()), None),
    };
    let jobs = SyncJobs::new(store.clone(), replica_name(), config.sync_lease);
    let (on_external_push, _workers) = match config.on_external_push.clone() {
        Some(command) => {
            let run = sync_runner(command, &config.sync_env)?;
            let workers = jobs.start(config.parallel_syncs, run);
            let submit = jobs.clone();
            let on_push: OnExternalPush = Arc::new(move |push| submit.submit(push));
            (on_push, Some(workers))
        }
        None => (Arc::new(|_| {}) as OnExternalPush, None),
    };
    // In one process the proxy's and the webhook's own bounded memories are the whole truth;
    // only a database adds anything for them.
    let shared = Shared {
        store: config.database.is_some().then_some(store),
        jobs: Some(jobs),
        generations,
    };
    let (app, children, sandboxes) = app_with_children(&config, on_external_push, shared, addr)?;
    tracing::info!(%addr, max_connections = config.connections.max_connections, "listening");
    on_listening(addr);
    let result = accept_loop(listener, app, &config.connections, shutdown).await;
    if let Some(children) = children {
        children.kill_all();
    }
    if let Some(sandboxes) = sandboxes {
        sandboxes.stop_all().await;
    }
    result
}

/// Accepts connections until `shutdown`, each served by hyper with a header timeout, within
/// the connection limit.
async fn accept_loop(
    listener: tokio::net::TcpListener,
    app: Router,
    limits: &ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let (stopping, stop) = watch::channel(false);
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: pause instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        while connections.try_join_next().is_some() {}
        let Ok(permit) = open.clone().try_acquire_owned() else {
            tracing::warn!(client = %peer, status = 503, "connection refused: at the connection limit");
            let _ = stream.try_write(OVER_CONNECTION_LIMIT);
            continue;
        };
        let app = app.clone().layer(axum::Extension(ClientAddr(peer)));
        let header_timeout = limits.header_timeout;
        let mut stop = stop.clone();
        connections.spawn(async move {
            let _permit = permit;
            let service = TowerToHyperService::new(app);
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout);
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(client = %peer, error = %e, "connection ended");
                    }
                    return;
                }
                _ = stop.wait_for(|stopping| *stopping) => {}
            }
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        });
    }
    drop(listener);
    let _ = stopping.send(true);
    let drained = tokio::time::timeout(limits.shutdown_grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            open = connections.len(),
            "requests still in flight after the shutdown grace period; ending them"
        );
        connections.shutdown().await;
    }
    Ok(())
}

/// The routes, for embedding in another server or testing without a socket (state in this
/// process only); `listen` is where the server is reached (sandboxes on this machine push
/// through it).
pub fn app(
    config: &ServeConfig,
    on_external_push: OnExternalPush,
    listen: SocketAddr,
) -> Result<Router, ServeError> {
    app_with_children(config, on_external_push, Shared::default(), listen).map(|(app, _, _)| app)
}

/// What the routes share with the other replicas: the database store (none in one process)
/// and this replica's job queue.
#[derive(Default)]
struct Shared {
    store: Option<Arc<dyn Store>>,
    jobs: Option<Arc<SyncJobs>>,
    /// The token revocations followed from the database, whose freshness is the database's
    /// health.
    generations: Option<Arc<StoreGenerations>>,
}

/// [`app`], the embedded upstream's `git http-backend` children to end at shutdown, and the
/// sandboxes whose watchers to stop.
fn app_with_children(
    config: &ServeConfig,
    on_external_push: OnExternalPush,
    shared: Shared,
    listen: SocketAddr,
) -> Result<(Router, Option<Children>, Option<LocalSandboxes>), ServeError> {
    let mut children = None;
    let mut gitlab_client = None;
    let page;
    let upstream: Arc<dyn Upstream> = match &config.upstream {
        UpstreamChoice::Embedded(dir) => {
            let upstream = EmbeddedUpstream::with_protection(dir, !config.allow_history_rewrite)
                .map_err(|source| ServeError::UpstreamDir {
                    dir: dir.clone(),
                    source,
                })?;
            tracing::info!(dir = %dir.display(), protected_history = !config.allow_history_rewrite, "upstream: embedded repositories");
            children = Some(upstream.children());
            let history = EmbeddedUpstream::with_protection(dir, !config.allow_history_rewrite)
                .map_err(|source| ServeError::UpstreamDir {
                    dir: dir.clone(),
                    source,
                })?;
            page = workspace(
                history,
                config.signer.clone(),
                &config.web,
                listen,
                shared.store.clone(),
            )?;
            Arc::new(upstream)
        }
        UpstreamChoice::GitLab(gitlab_config) => {
            let gitlab =
                GitLab::new(gitlab_config).map_err(|e| ServeError::GitLab(e.to_string()))?;
            tracing::info!(api_url = %gitlab_config.api_url, "upstream: GitLab");
            gitlab_client = Some(gitlab.clone());
            page = workspace(
                gitlab.clone(),
                config.signer.clone(),
                &config.web,
                listen,
                shared.store.clone(),
            )?;
            let upstream = HttpUpstream::new(
                Arc::new(gitlab),
                "oauth2",
                gitlab_config.service_token.clone(),
            )
            .map_err(|e| ServeError::GitLab(e.to_string()))?;
            Arc::new(upstream)
        }
    };
    let page_on_push = page.on_push;
    let on_external_push = Arc::new(move |push: ExternalPush| {
        on_external_push(push.clone());
        page_on_push(push);
    }) as OnExternalPush;
    let proxy = Proxy::new(
        config.signer.clone(),
        upstream,
        config.limits.clone(),
        on_external_push.clone(),
    );
    if let Some(store) = &shared.store {
        proxy.recent_pushes().attach_store(store.clone());
    }
    proxy.recent_pushes().listen(page.on_saved);
    let health = proxy.clone();
    let jobs = shared.jobs.clone();
    let generations = shared.generations.clone();
    let mut app = Router::new()
        .route(
            "/healthz",
            get(move || async move {
                // Git traffic needs no database while the token revocations are fresh: the
                // replica is degraded (syncs wait in memory), not unhealthy. Past their limit
                // every token is refused, and the balancer should drain it.
                // Both halves are told while degraded: the revocations' error alone would hide
                // how many sync requests wait in memory.
                let database = match generations.as_ref().map(|g| g.health()) {
                    Some(Err(why)) => Err(why),
                    revocations => {
                        let revocations = revocations.and_then(Result::ok).flatten();
                        let syncs = jobs.as_ref().and_then(|j| j.degraded());
                        Ok(match (revocations, syncs) {
                            (Some(r), Some(s)) => Some(format!("{r}; {s}")),
                            (r, s) => r.or(s),
                        })
                    }
                };
                match (health.health(), database) {
                    (Err(why), _) => (
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("unhealthy: {why}\n"),
                    ),
                    (Ok(()), Err(why)) => (
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("unhealthy: database: {why}\n"),
                    ),
                    (Ok(()), Ok(Some(why))) => {
                        (StatusCode::OK, format!("degraded: database: {why}\n"))
                    }
                    (Ok(()), Ok(None)) => (StatusCode::OK, "ok\n".to_owned()),
                }
            }),
        )
        .nest("/api/git", proxy.router())
        .merge(api::router(
            config.api_keys.clone(),
            page.control,
            config.signer.clone(),
            shared.store.clone(),
            config.web.public_url.clone(),
        ))
        .merge(page.router);
    match (&config.webhook_secret, gitlab_client) {
        (Some(secret), Some(gitlab)) => {
            let webhook = match &shared.store {
                Some(store) => Webhook::shared(
                    secret.clone(),
                    Arc::new(gitlab),
                    proxy.recent_pushes(),
                    on_external_push,
                    store.clone(),
                ),
                None => Webhook::new(
                    secret.clone(),
                    Arc::new(gitlab),
                    proxy.recent_pushes(),
                    on_external_push,
                ),
            };
            app = app.nest("/api/gitlab/webhook", webhook.router());
        }
        (Some(_), None) => tracing::warn!(
            "{} is set, but the upstream is not GitLab: the GitLab webhook is off",
            WEBHOOK_SECRET_ENV
        ),
        (None, _) => tracing::info!(
            "{} is not set: the GitLab webhook is off",
            WEBHOOK_SECRET_ENV
        ),
    }
    Ok((app, children, page.sandboxes))
}

/// The runner of `command` (with `sh -c`) for one claimed sync job.
fn sync_runner(
    command: String,
    sync_env: &[String],
) -> Result<
    impl Fn(ExternalPush) -> futures_util::future::BoxFuture<'static, SyncOutcome>
    + Send
    + Sync
    + 'static,
    ServeError,
> {
    if let Some(secret) = sync_env
        .iter()
        .find(|n| SERVER_SECRET_VARS.contains(&n.as_str()))
    {
        return Err(ServeError::SecretInSyncEnv(secret.clone()));
    }
    let inherited: Arc<Vec<(String, std::ffi::OsString)>> = Arc::new(
        SYNC_BASE_ENV
            .iter()
            .map(|n| n.to_string())
            .chain(sync_env.iter().cloned())
            .filter_map(|name| std::env::var_os(&name).map(|value| (name, value)))
            .collect(),
    );
    let command = Arc::new(command);
    Ok(move |push: ExternalPush| {
        let command = command.clone();
        let inherited = inherited.clone();
        Box::pin(async move { run_sync(&command, &inherited, &push).await })
            as futures_util::future::BoxFuture<'static, SyncOutcome>
    })
}

/// Runs the `--on-external-push` command; its outcome is its exit (its output goes where
/// serve's goes, so a failure carries no tail).
async fn run_sync(
    command: &str,
    inherited: &[(String, std::ffi::OsString)],
    push: &ExternalPush,
) -> SyncOutcome {
    let mut child = tokio::process::Command::new("sh");
    child
        .arg("-c")
        .arg(command)
        .env_clear()
        .envs(inherited.iter().map(|(k, v)| (k, v)))
        .env("SHMASTRA_USER", push.user.as_str())
        .env("SHMASTRA_REF", &push.refname)
        .env("SHMASTRA_NEW_OID", &push.new_oid)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    // The command's own output goes where serve's goes: it is the operator's script.
    let message = match child.status().await {
        Ok(status) if status.success() => {
            tracing::info!(user = %push.user, git_ref = %push.refname, "sync command finished");
            return SyncOutcome::Synced { commit: None };
        }
        Ok(status) => {
            tracing::error!(user = %push.user, git_ref = %push.refname, %status, "sync command failed");
            format!("the sync command failed: {status}")
        }
        Err(e) => {
            tracing::error!(user = %push.user, error = %e, "cannot run the sync command");
            format!("cannot run the sync command: {e}")
        }
    };
    SyncOutcome::Failed {
        failure: SyncFailure::new("on-external-push", message),
    }
}
