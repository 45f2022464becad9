//! `token mint`, `token revoke` and `token rotate`.

use cloud_core::TokenSigner;
use cloud_core::UserId;
use serde_json::json;

use crate::outcome::{Failure, Outcome, Success};

pub fn mint(user: &str) -> Outcome {
    let user = UserId::parse(user).map_err(Failure::config)?;
    let signer = TokenSigner::from_env().map_err(Failure::config)?;
    let token = signer.mint_current(&user).map_err(Failure::runtime)?;
    Ok(Success {
        json: json!({ "user": user.as_str(), "token": token }),
        text: token,
    })
}

/// Revokes every token of the user; `print_new` prints the user's new token (rotation).
pub fn revoke(user: &str, print_new: bool) -> Outcome {
    let user = UserId::parse(user).map_err(Failure::config)?;
    let signer = TokenSigner::from_env().map_err(Failure::config)?;
    let token = signer.rotate(&user).map_err(|e| match e {
        cloud_core::GenerationError::NoStore => Failure::config(e),
        e => Failure::runtime(e),
    })?;
    let generation = signer.generation(&user).map_err(Failure::runtime)?;
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
