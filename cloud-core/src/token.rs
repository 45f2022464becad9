//! Per-user project tokens: `PROJECT_TOKEN`s the proxy verifies without a database.
//!
//! A token is `v1.<user>.<mac>`: the user id and an HMAC-SHA256 over a versioned domain tag and
//! the user id, both base64url without padding. The version prefix lets a later format coexist;
//! base64url never contains `.`, so the three parts split unambiguously.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretString};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::user::UserId;

/// The env var holding the signing secret, shared by `token mint` and `serve`.
pub const TOKEN_SECRET_ENV: &str = "SHMASTRA_TOKEN_SECRET";

/// Fewest secret bytes accepted: below 32 a secret is guessable offline from one token.
pub const MIN_SECRET_LEN: usize = 32;

const VERSION: &str = "v1";
const DOMAIN: &[u8] = b"shmastra-project-token-v1\0";
/// Longer input cannot be a token; rejecting it first bounds the work an attacker can cause.
const MAX_TOKEN_LEN: usize = 256;

/// Why a secret cannot sign tokens.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenSecretError {
    #[error("{TOKEN_SECRET_ENV} is not set (generate one with `openssl rand -hex 32`)")]
    Missing,
    #[error(
        "{TOKEN_SECRET_ENV} is {len} bytes; at least {MIN_SECRET_LEN} are needed (generate one with `openssl rand -hex 32`)"
    )]
    TooShort { len: usize },
}

/// Mints and verifies project tokens with one server secret.
#[derive(Clone)]
pub struct TokenSigner {
    keyed: Hmac<Sha256>,
}

impl TokenSigner {
    /// A signer keyed with `secret`, which must hold at least [`MIN_SECRET_LEN`] bytes.
    pub fn new(secret: &[u8]) -> Result<TokenSigner, TokenSecretError> {
        if secret.len() < MIN_SECRET_LEN {
            return Err(TokenSecretError::TooShort { len: secret.len() });
        }
        let keyed =
            Hmac::<Sha256>::new_from_slice(secret).expect("HMAC accepts keys of any length");
        Ok(TokenSigner { keyed })
    }

    /// A signer keyed with a secret string (its UTF-8 bytes).
    pub fn from_secret(secret: &SecretString) -> Result<TokenSigner, TokenSecretError> {
        TokenSigner::new(secret.expose_secret().as_bytes())
    }

    /// A signer keyed with [`TOKEN_SECRET_ENV`].
    pub fn from_env() -> Result<TokenSigner, TokenSecretError> {
        match std::env::var(TOKEN_SECRET_ENV) {
            Ok(secret) if !secret.is_empty() => {
                TokenSigner::from_secret(&SecretString::from(secret))
            }
            _ => Err(TokenSecretError::Missing),
        }
    }

    /// The project token for `user`. The same user and secret always give the same token.
    pub fn mint(&self, user: &UserId) -> String {
        let mut mac = self.keyed.clone();
        mac.update(DOMAIN);
        mac.update(user.as_str().as_bytes());
        let tag = mac.finalize().into_bytes();
        format!(
            "{VERSION}.{}.{}",
            URL_SAFE_NO_PAD.encode(user.as_str()),
            URL_SAFE_NO_PAD.encode(tag)
        )
    }

    /// The user `token` was minted for, or `None` for anything this signer did not mint.
    pub fn verify(&self, token: &str) -> Option<UserId> {
        if token.len() > MAX_TOKEN_LEN {
            return None;
        }
        let mut parts = token.split('.');
        let (Some(VERSION), Some(user_part), Some(_), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        let user_bytes = URL_SAFE_NO_PAD.decode(user_part).ok()?;
        let user = UserId::parse(std::str::from_utf8(&user_bytes).ok()?).ok()?;
        // Comparing the whole canonical token accepts exactly what `mint` produced: any other
        // spelling of the same bytes (padding, trailing bits) fails too.
        let expected = self.mint(&user);
        bool::from(expected.as_bytes().ct_eq(token.as_bytes())).then_some(user)
    }
}

impl fmt::Debug for TokenSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenSigner([redacted])")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn signer() -> TokenSigner {
        TokenSigner::new(SECRET).unwrap()
    }

    fn user(s: &str) -> UserId {
        UserId::parse(s).unwrap()
    }

    #[test]
    fn round_trip_and_shape() {
        let token = signer().mint(&user("alice"));
        assert!(token.starts_with("v1.YWxpY2U."), "{token}");
        assert_eq!(signer().verify(&token), Some(user("alice")));
    }

    #[test]
    fn other_secret_or_user_is_rejected() {
        let other = TokenSigner::new(b"another secret that is long enough!!").unwrap();
        let token = signer().mint(&user("alice"));
        assert_eq!(other.verify(&token), None);
        let bob_mac = signer().mint(&user("bob"));
        let forged = format!(
            "v1.{}.{}",
            URL_SAFE_NO_PAD.encode("alice"),
            bob_mac.rsplit('.').next().unwrap()
        );
        assert_eq!(signer().verify(&forged), None);
    }

    #[test]
    fn malformed_input_is_rejected() {
        for bad in [
            "",
            ".",
            "..",
            "v1",
            "v1..",
            "v2.YWxpY2U.AAAA",
            "v1.YWxpY2U",
            "v1.YWxpY2U.x.y",
            "v1.!!!.AAAA",
            "v1.Li4.AAAA",
            "\u{0}\u{0}",
            "v1.YWxpY2U.é",
        ] {
            assert_eq!(signer().verify(bad), None, "{bad:?}");
        }
        assert_eq!(signer().verify(&"a".repeat(10_000)), None);
    }

    #[test]
    fn short_secret_is_refused_and_debug_hides_it() {
        assert_eq!(
            TokenSigner::new(b"short").unwrap_err(),
            TokenSecretError::TooShort { len: 5 }
        );
        assert_eq!(format!("{:?}", signer()), "TokenSigner([redacted])");
    }

    fn user_strategy() -> impl Strategy<Value = UserId> {
        "[A-Za-z0-9_][A-Za-z0-9_-]{0,40}"
            .prop_filter_map("valid user id", |s| UserId::parse(&s).ok())
    }

    proptest! {
        #[test]
        fn verify_accepts_what_mint_produced(u in user_strategy()) {
            let token = signer().mint(&u);
            prop_assert_eq!(signer().verify(&token), Some(u));
        }

        #[test]
        fn verify_rejects_any_single_byte_change(
            u in user_strategy(),
            pos in any::<prop::sample::Index>(),
            replacement in any::<char>(),
        ) {
            let token = signer().mint(&u);
            let at = pos.index(token.len());
            let original = token[at..].chars().next().unwrap();
            prop_assume!(original != replacement);
            let mut mutated = token.clone();
            mutated.replace_range(at..at + original.len_utf8(), replacement.encode_utf8(&mut [0; 4]));
            prop_assert_eq!(signer().verify(&mutated), None);
        }

        #[test]
        fn verify_rejects_truncation_and_extension(u in user_strategy(), cut in 1usize..20, extra in "[A-Za-z0-9_.=-]{1,4}") {
            let token = signer().mint(&u);
            let cut = cut.min(token.len());
            prop_assert_eq!(signer().verify(&token[..token.len() - cut]), None);
            prop_assert_eq!(signer().verify(&format!("{token}{extra}")), None);
        }

        #[test]
        fn verify_never_panics(s in ".{0,300}") {
            let _ = signer().verify(&s);
        }
    }
}
