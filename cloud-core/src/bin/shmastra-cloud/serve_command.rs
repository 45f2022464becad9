//! `serve`: builds the validated serve configuration from flags and env, then runs the server
//! until SIGINT or SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use cloud_core::config::Config;
use cloud_core::proxy::ProxyLimits;
use cloud_core::serve::{ServeConfig, UpstreamChoice, serve};
use cloud_core::token::TokenSigner;
use cloud_core::webhook::WEBHOOK_SECRET_ENV;
use secrecy::SecretString;
use serde_json::json;
use tokio::signal::unix::{SignalKind, signal};

use crate::outcome::{Failure, Outcome, Success};

#[derive(clap::Args)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks a free one; the bound address is printed).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Serve bare repositories (DIR/<user>.git, created on first use) instead of GitLab.
    #[arg(long, value_name = "DIR")]
    pub upstream_dir: Option<PathBuf>,
    /// Shell command run per external push, with SHMASTRA_USER, SHMASTRA_REF, SHMASTRA_NEW_OID.
    #[arg(long, value_name = "CMD")]
    pub on_external_push: Option<String>,
    /// Largest request body (a push's pack), in bytes.
    #[arg(long, default_value_t = 1 << 30)]
    pub max_request_bytes: u64,
    /// How long the upstream may take to start answering.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub upstream_timeout: Duration,
    /// Longest silence within a request or response body.
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    pub idle_timeout: Duration,
}

pub async fn run(args: ServeArgs) -> Outcome {
    let signer = TokenSigner::from_env().map_err(Failure::config)?;
    let gitlab = Config::from_env().map_err(Failure::config)?;
    let upstream = match (args.upstream_dir, gitlab) {
        (Some(dir), gitlab) => {
            if gitlab.is_some() {
                tracing::warn!("--upstream-dir given: GitLab settings are ignored");
            }
            UpstreamChoice::Embedded(dir)
        }
        (None, Some(config)) => UpstreamChoice::GitLab(config),
        (None, None) => {
            return Err(Failure::config(anyhow::anyhow!(
                "no upstream: set GITLAB_SERVICE_TOKEN and GITLAB_GROUP_ID, or pass --upstream-dir DIR for the embedded one"
            )));
        }
    };
    let webhook_secret = std::env::var(WEBHOOK_SECRET_ENV)
        .ok()
        .filter(|s| !s.is_empty())
        .map(SecretString::from);
    let config = ServeConfig {
        listen: args.listen,
        upstream,
        signer,
        webhook_secret,
        on_external_push: args.on_external_push,
        limits: ProxyLimits {
            max_request_bytes: args.max_request_bytes,
            upstream_timeout: args.upstream_timeout,
            idle_timeout: args.idle_timeout,
        },
    };
    let mut terminate = signal(SignalKind::terminate())
        .context("installing the SIGTERM handler")
        .map_err(Failure::runtime)?;
    let shutdown = async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
        tracing::info!("shutting down");
    };
    // Scripts and tests read the bound address (port 0 becomes a real one) from this line.
    let announce = |addr: SocketAddr| println!("listening on {addr}");
    serve(config, announce, shutdown)
        .await
        .map_err(Failure::runtime)?;
    Ok(Success {
        text: "stopped".into(),
        json: json!({ "stopped": true }),
    })
}
