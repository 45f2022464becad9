//! `login-link`: prints a one-time sign-in URL for the workspace page.

use std::time::Duration;

use cloud_core::UserId;
use cloud_core::{SignIn, TokenSigner};
use serde_json::json;

use crate::outcome::{Failure, Outcome, Success};

/// The env var naming where people reach `serve` (`--public-url`).
pub const PUBLIC_URL_ENV: &str = "SHMASTRA_PUBLIC_URL";
/// Without a public URL: serve's default listen address.
const DEFAULT_BASE: &str = "http://127.0.0.1:8080";

#[derive(clap::Args)]
pub struct LoginLinkArgs {
    #[arg(long)]
    pub user: String,
    /// How long the link may wait to be opened (at most 24h).
    #[arg(long, default_value = "15m", value_parser = humantime::parse_duration)]
    pub ttl: Duration,
    /// Where people reach serve (default: http://127.0.0.1:8080).
    #[arg(long, env = PUBLIC_URL_ENV, value_name = "URL")]
    pub public_url: Option<String>,
}

pub fn run(args: LoginLinkArgs) -> Outcome {
    let user = UserId::parse(&args.user).map_err(Failure::config)?;
    let signer = TokenSigner::from_env().map_err(Failure::config)?;
    let link = SignIn::new(signer)
        .link(&user, args.ttl)
        .map_err(Failure::config)?;
    let base = args.public_url.as_deref().unwrap_or(DEFAULT_BASE);
    let url = format!("{}/login?t={link}", base.trim_end_matches('/'));
    Ok(Success {
        json: json!({ "user": user.as_str(), "url": url, "ttl_seconds": args.ttl.as_secs() }),
        text: url,
    })
}
