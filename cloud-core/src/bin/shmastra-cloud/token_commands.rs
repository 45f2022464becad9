//! `token mint`.

use cloud_core::UserId;
use cloud_core::token::TokenSigner;
use serde_json::json;

use crate::outcome::{Failure, Outcome, Success};

pub fn mint(user: &str) -> Outcome {
    let user = UserId::parse(user).map_err(Failure::config)?;
    let signer = TokenSigner::from_env().map_err(Failure::config)?;
    let token = signer.mint(&user);
    Ok(Success {
        json: json!({ "user": user.as_str(), "token": token }),
        text: token,
    })
}
