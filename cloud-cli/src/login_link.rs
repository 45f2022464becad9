//! `login-link`: prints a one-time sign-in URL for the workspace page, bound to the user's
//! current token generation (read where `token` reads it: `DATABASE_URL`, else
//! `SHMASTRA_TOKEN_STATE`). A link is minted only when one of them is set: that is also where
//! `serve` remembers a used link, and without either nothing durable would.

use std::time::Duration;

use cloud_core::{SignIn, TOKEN_STATE_ENV, UserId};
use serde_json::json;

use crate::outcome::{Failure, Outcome, Success};

/// The env var naming where people reach `serve` (`--public-url`).
pub const PUBLIC_URL_ENV: &str = "SHMASTRA_PUBLIC_URL";
/// Without a public URL: serve's default listen address.
const DEFAULT_BASE: &str = "http://127.0.0.1:8080";

#[derive(clap::Args)]
pub struct LoginLinkArgs {
    /// The user the link signs in: their id (up to 64 letters, digits, `.`, `-`, `_`).
    #[arg(long)]
    pub user: String,
    /// How long the link may wait to be opened (more than zero, at most 24h).
    #[arg(long, default_value = "15m", value_parser = positive_duration)]
    pub ttl: Duration,
    /// Where people reach serve (default: http://127.0.0.1:8080).
    #[arg(long, env = PUBLIC_URL_ENV, value_name = "URL")]
    pub public_url: Option<String>,
}

/// A duration humantime reads (`15m`, `1h`), more than zero: a link nobody can open is a mistake.
fn positive_duration(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(ttl) if ttl.is_zero() => Err("a link must live more than zero".to_owned()),
        Ok(ttl) => Ok(ttl),
        Err(e) => Err(e.to_string()),
    }
}

pub async fn run(args: LoginLinkArgs) -> Outcome {
    let user = UserId::parse(&args.user).map_err(Failure::config)?;
    let durable = ["DATABASE_URL", TOKEN_STATE_ENV]
        .iter()
        .any(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()));
    if !durable {
        return Err(Failure::config(anyhow::anyhow!(
            "neither DATABASE_URL nor {TOKEN_STATE_ENV} is set: serve would have nowhere durable to remember that a link was used (a restart would let it sign in again), so no link is made; set the one serve uses"
        )));
    }
    let (signer, _store) = crate::token_commands::signer().await?;
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
