//! `token mint`, `token revoke` and `token rotate`. The generations live in PostgreSQL when
//! `DATABASE_URL` is set (what `serve --database-url` reads), else in `SHMASTRA_TOKEN_STATE`.

use std::sync::Arc;

use cloud_core::TOKEN_STATE_ENV;
use cloud_core::TokenSigner;
use cloud_core::UserId;
use cloud_core::store::Store;
use cloud_core::store::generations::{DEFAULT_MAX_AGE, StoreGenerations};
use cloud_core::store::postgres::{PostgresStore, pool};
use serde_json::json;

use crate::outcome::{Failure, Outcome, Success};

/// The env var naming the shared database (also `serve --database-url`).
const DATABASE_URL_ENV: &str = "DATABASE_URL";

/// The signer from the environment, and the database store when `DATABASE_URL` is set.
pub async fn signer() -> Result<(TokenSigner, Option<Arc<dyn Store>>), Failure> {
    let signer = TokenSigner::from_env().map_err(Failure::config)?;
    let Some(url) = std::env::var(DATABASE_URL_ENV)
        .ok()
        .filter(|u| !u.is_empty())
    else {
        return Ok((signer, None));
    };
    if std::env::var_os(TOKEN_STATE_ENV).is_some_and(|d| !d.is_empty()) {
        return Err(Failure::config(anyhow::anyhow!(
            "both {DATABASE_URL_ENV} and {TOKEN_STATE_ENV} are set: token generations live in one place; unset one"
        )));
    }
    let store: Arc<dyn Store> = PostgresStore::connect(pool(&url).map_err(Failure::config)?)
        .await
        .map_err(Failure::runtime)?;
    let generations = StoreGenerations::start(store.clone(), DEFAULT_MAX_AGE)
        .await
        .map_err(Failure::runtime)?;
    Ok((signer.with_generations(Arc::new(generations)), Some(store)))
}

pub async fn mint(user: &str) -> Outcome {
    let user = UserId::parse(user).map_err(Failure::config)?;
    let (signer, _) = signer().await?;
    let token = signer.mint_current(&user).map_err(Failure::runtime)?;
    Ok(Success {
        json: json!({ "user": user.as_str(), "token": token }),
        text: token,
    })
}

/// Revokes every token of the user; `print_new` prints the user's new token (rotation).
pub async fn revoke(user: &str, print_new: bool) -> Outcome {
    let user = UserId::parse(user).map_err(Failure::config)?;
    let (token, generation) = match signer().await? {
        (_, Some(store)) => {
            store
                .bump_token_generation(user.clone())
                .await
                .map_err(Failure::runtime)?;
            // A signer started after the bump reads the new generation.
            let (signer, _) = signer().await?;
            let token = signer.mint_current(&user).map_err(Failure::runtime)?;
            (token, signer.generation(&user).map_err(Failure::runtime)?)
        }
        (signer, None) => {
            let token = signer.rotate(&user).map_err(|e| match e {
                cloud_core::GenerationError::NoStore => Failure::config(e),
                e => Failure::runtime(e),
            })?;
            (token, signer.generation(&user).map_err(Failure::runtime)?)
        }
    };
    if print_new {
        return Ok(Success {
            json: json!({ "user": user.as_str(), "generation": generation, "token": token }),
            text: token,
        });
    }
    Ok(Success {
        json: json!({ "user": user.as_str(), "generation": generation }),
        text: format!(
            "revoked every project token of {user}; `token mint --user {user}` prints the new one"
        ),
    })
}
