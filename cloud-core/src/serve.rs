//! `shmastra-cloud serve`: the git proxy at `/api/git`, the GitLab push webhook at
//! `/api/gitlab/webhook`, `/healthz`, and the local stand-in for starting a sync: a command
//! run once per external push.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use secrecy::SecretString;
use tokio::sync::mpsc;

use crate::config::Config;
use crate::gitlab::GitLab;
use crate::proxy::embedded::EmbeddedUpstream;
use crate::proxy::events::OnExternalPush;
use crate::proxy::upstream::{HttpUpstream, Upstream};
use crate::proxy::{ExternalPush, Proxy, ProxyLimits};
use crate::token::TokenSigner;
use crate::webhook::Webhook;

/// Where the proxy forwards to.
pub enum UpstreamChoice {
    /// A directory of bare repositories served by `git http-backend` (`--upstream-dir`).
    Embedded(PathBuf),
    /// GitLab, with the service token as the git password.
    GitLab(Config),
}

/// Everything `serve` needs, validated by the caller.
pub struct ServeConfig {
    pub listen: SocketAddr,
    pub upstream: UpstreamChoice,
    pub signer: TokenSigner,
    /// `GITLAB_WEBHOOK_SECRET`; without it the webhook route is not mounted.
    pub webhook_secret: Option<SecretString>,
    /// `--on-external-push`: a shell command run per external push.
    pub on_external_push: Option<String>,
    pub limits: ProxyLimits,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot use {dir} as the upstream directory: {source}")]
    UpstreamDir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot set up the GitLab upstream: {0}")]
    GitLab(String),
    #[error("the server failed: {0}")]
    Server(std::io::Error),
}

/// Env vars the sync command must never inherit.
const SECRET_VARS: [&str; 3] = [
    crate::token::TOKEN_SECRET_ENV,
    crate::config::SERVICE_TOKEN_ENV,
    crate::webhook::WEBHOOK_SECRET_ENV,
];

/// Pending sync commands beyond this are dropped with an error line (each push still logs).
const QUEUED_SYNCS: usize = 256;

/// Binds `config.listen`, calls `on_listening` with the bound address (port 0 becomes a real
/// one), and serves until `shutdown` completes.
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
    let on_external_push = match config.on_external_push.clone() {
        Some(command) => sync_runner(command),
        None => Arc::new(|_| {}) as OnExternalPush,
    };
    let app = app(&config, on_external_push)?;
    tracing::info!(%addr, "listening");
    on_listening(addr);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(ServeError::Server)
}

/// The routes, for embedding in another server or testing without a socket.
pub fn app(config: &ServeConfig, on_external_push: OnExternalPush) -> Result<Router, ServeError> {
    let upstream: Arc<dyn Upstream> = match &config.upstream {
        UpstreamChoice::Embedded(dir) => {
            let upstream =
                EmbeddedUpstream::new(dir).map_err(|source| ServeError::UpstreamDir {
                    dir: dir.clone(),
                    source,
                })?;
            tracing::info!(dir = %dir.display(), "upstream: embedded repositories");
            Arc::new(upstream)
        }
        UpstreamChoice::GitLab(gitlab_config) => {
            let gitlab =
                GitLab::new(gitlab_config).map_err(|e| ServeError::GitLab(e.to_string()))?;
            tracing::info!(api_url = %gitlab_config.api_url, "upstream: GitLab");
            let upstream = HttpUpstream::new(
                Arc::new(gitlab),
                "oauth2",
                gitlab_config.service_token.clone(),
            )
            .map_err(|e| ServeError::GitLab(e.to_string()))?;
            Arc::new(upstream)
        }
    };
    let proxy = Proxy::new(
        config.signer.clone(),
        upstream,
        config.limits.clone(),
        on_external_push.clone(),
    );
    let mut app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .nest("/api/git", proxy.router());
    match &config.webhook_secret {
        Some(secret) => {
            let webhook = Webhook::new(secret.clone(), proxy.recent_pushes(), on_external_push);
            app = app.nest("/api/gitlab/webhook", webhook.router());
        }
        None => tracing::info!(
            "{} is not set: the GitLab webhook is off",
            crate::webhook::WEBHOOK_SECRET_ENV
        ),
    }
    Ok(app)
}

/// Runs `command` (with `sh -c`) once per external push, one at a time, in arrival order.
fn sync_runner(command: String) -> OnExternalPush {
    let (queue, mut pending) = mpsc::channel::<ExternalPush>(QUEUED_SYNCS);
    tokio::spawn(async move {
        while let Some(push) = pending.recv().await {
            run_sync(&command, &push).await;
        }
    });
    Arc::new(move |push: ExternalPush| {
        if let Err(e) = queue.try_send(push) {
            tracing::error!(error = %e, "sync queue full; this push starts no sync");
        }
    })
}

async fn run_sync(command: &str, push: &ExternalPush) {
    let mut child = tokio::process::Command::new("sh");
    child
        .arg("-c")
        .arg(command)
        .env("SHMASTRA_USER", push.user.as_str())
        .env("SHMASTRA_REF", &push.refname)
        .env("SHMASTRA_NEW_OID", &push.new_oid)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    for var in SECRET_VARS {
        child.env_remove(var);
    }
    // The command's own output goes where serve's goes: it is the operator's script.
    match child.status().await {
        Ok(status) if status.success() => {
            tracing::info!(user = %push.user, git_ref = %push.refname, "sync command finished");
        }
        Ok(status) => {
            tracing::error!(user = %push.user, git_ref = %push.refname, %status, "sync command failed");
        }
        Err(e) => {
            tracing::error!(user = %push.user, error = %e, "cannot run the sync command")
        }
    }
}
