//! Per-user project tokens: `PROJECT_TOKEN`s the proxy verifies without a database.
//!
//! A token is `v1.<user>.<mac>`: the user id and an HMAC-SHA256 over a versioned domain tag and
//! the user id, both base64url without padding. The version prefix lets a later format coexist;
//! base64url never contains `.`, so the parts split unambiguously.
//!
//! Revocation and rotation per user, without rotating the secret: each user has a token
//! *generation* (0 until first revoked). Generation 0 is the `v1` token above; generation `n > 0`
//! is `v2.<user>.<n>.<mac>` with the MAC over a second domain tag, the user id and `n`. A token
//! verifies only when its generation is the user's current one, so bumping the generation
//! (`token revoke`, `token rotate`) refuses every token minted before. The generations live
//! behind [`Generations`]: today [`GenerationDir`] (one small file per revoked user, read on
//! each verification, so a revocation takes effect at the next request without a restart); a
//! shared database can implement the same trait for several replicas.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretString};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::env_names::{TOKEN_SECRET_ENV, TOKEN_STATE_ENV};
use crate::user::UserId;

/// Fewest secret bytes accepted: below 32 a secret is guessable offline from one token.
pub const MIN_SECRET_LEN: usize = 32;

const VERSION: &str = "v1";
const DOMAIN: &[u8] = b"shmastra-project-token-v1\0";
const VERSION_2: &str = "v2";
const DOMAIN_2: &[u8] = b"shmastra-project-token-v2\0";

/// Why the token generations cannot be read or changed.
#[derive(Debug, thiserror::Error)]
pub enum GenerationError {
    /// A generation file could not be read.
    #[error("cannot read the token generation of {user} from {path}: {source}")]
    Read {
        /// Whose generation.
        user: UserId,
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A generation file that does not hold a number.
    #[error("the token generation file {path} does not hold a number")]
    Corrupt {
        /// The file.
        path: std::path::PathBuf,
    },
    /// The generations were last read too long ago to be trusted: a revocation made meanwhile
    /// would be missed, so every token is refused until they are read again.
    #[error(
        "the token revocations were last read from the database {age_secs}s ago, longer than the {limit_secs}s a replica trusts them: tokens are refused until the database answers"
    )]
    Stale {
        /// Seconds since the last read.
        age_secs: u64,
        /// The limit.
        limit_secs: u64,
    },
    /// A revocation with nowhere to record it.
    #[error("{TOKEN_STATE_ENV} is not set: there is nowhere to record a revocation")]
    NoStore,
    /// The generations are the database's; this signer cannot change them.
    #[error(
        "token generations are kept in the database: revoke with `shmastra-cloud token revoke` and DATABASE_URL"
    )]
    InDatabase,
    /// The database did not take the revocation.
    #[error("cannot record the revocation in the database now: {0}")]
    Unavailable(String),
    /// A generation file could not be written.
    #[error("cannot write the token generation of {user} to {path}: {source}")]
    Write {
        /// Whose generation.
        user: UserId,
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Where each user's current token generation is kept.
pub trait Generations: Send + Sync + 'static {
    /// The user's current generation; 0 for a user never revoked.
    fn current(&self, user: &UserId) -> Result<u64, GenerationError>;
    /// Moves the user to the next generation and returns it: every earlier token is refused.
    fn bump(&self, user: &UserId) -> Result<u64, GenerationError>;
}

/// Generations in a directory: `<dir>/<user>` holds the decimal generation of a revoked user;
/// no file means generation 0. Written by temp file + rename.
#[derive(Debug, Clone)]
pub struct GenerationDir {
    dir: std::path::PathBuf,
}

impl GenerationDir {
    /// Generations kept in `dir` (made on the first revocation).
    pub fn new(dir: impl Into<std::path::PathBuf>) -> GenerationDir {
        GenerationDir { dir: dir.into() }
    }
}

impl Generations for GenerationDir {
    fn current(&self, user: &UserId) -> Result<u64, GenerationError> {
        let path = self.dir.join(user.as_str());
        match std::fs::read_to_string(&path) {
            Ok(text) => text
                .trim()
                .parse()
                .map_err(|_| GenerationError::Corrupt { path }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(source) => Err(GenerationError::Read {
                user: user.clone(),
                path,
                source,
            }),
        }
    }

    fn bump(&self, user: &UserId) -> Result<u64, GenerationError> {
        let next = self.current(user)? + 1;
        let path = self.dir.join(user.as_str());
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(&self.dir)?;
            let tmp = self
                .dir
                .join(format!(".{}.tmp.{}", user.as_str(), std::process::id()));
            std::fs::write(&tmp, format!("{next}\n"))?;
            std::fs::rename(&tmp, &path)
        };
        write().map_err(|source| GenerationError::Write {
            user: user.clone(),
            path: path.clone(),
            source,
        })?;
        Ok(next)
    }
}
/// Longer input cannot be a token; rejecting it first bounds the work an attacker can cause.
const MAX_TOKEN_LEN: usize = 256;

/// Why a secret cannot sign tokens.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenSecretError {
    /// No secret is set.
    #[error("{TOKEN_SECRET_ENV} is not set (generate one with `openssl rand -hex 32`)")]
    Missing,
    /// Fewer than 32 bytes.
    #[error(
        "{TOKEN_SECRET_ENV} is {len} bytes; at least {MIN_SECRET_LEN} are needed (generate one with `openssl rand -hex 32`)"
    )]
    TooShort {
        /// Its length.
        len: usize,
    },
    /// Fewer than 8 different byte values.
    #[error(
        "{TOKEN_SECRET_ENV} uses only {distinct} different characters; a secret must be random (generate one with `openssl rand -hex 32`)"
    )]
    Weak {
        /// How many different byte values it uses.
        distinct: usize,
    },
}

/// Fewest different byte values a secret must use: a repeated character or a short repeated
/// pattern has the length but not the entropy (a random hex secret of 32 uses about 16).
pub const MIN_DISTINCT_BYTES: usize = 8;

/// How many different byte values `secret` uses.
pub fn distinct_bytes(secret: &[u8]) -> usize {
    let mut seen = [false; 256];
    for &b in secret {
        seen[usize::from(b)] = true;
    }
    seen.iter().filter(|&&s| s).count()
}

/// Why a project token is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenRefusal {
    /// Not a token of this server's, or one of an earlier generation.
    Invalid,
    /// The generations cannot be read now (or are too old to trust): the token may be valid;
    /// try again later.
    Unavailable(String),
}

/// Mints and verifies project tokens with one server secret.
#[derive(Clone)]
pub struct TokenSigner {
    keyed: Hmac<Sha256>,
    generations: Option<std::sync::Arc<dyn Generations>>,
}

impl TokenSigner {
    /// A signer keyed with `secret`, which must hold at least `MIN_SECRET_LEN` (32) bytes (a key
    /// the caller made; an operator's secret goes through [`TokenSigner::from_secret`]).
    pub fn new(secret: &[u8]) -> Result<TokenSigner, TokenSecretError> {
        if secret.len() < MIN_SECRET_LEN {
            return Err(TokenSecretError::TooShort { len: secret.len() });
        }
        let keyed =
            Hmac::<Sha256>::new_from_slice(secret).expect("HMAC accepts keys of any length");
        Ok(TokenSigner {
            keyed,
            generations: None,
        })
    }

    /// This signer, minting and accepting only each user's current generation from
    /// `generations` (without it, every user is at generation 0).
    pub fn with_generations(mut self, generations: std::sync::Arc<dyn Generations>) -> Self {
        self.generations = Some(generations);
        self
    }

    /// The user's current generation; 0 without a generation store.
    pub fn generation(&self, user: &UserId) -> Result<u64, GenerationError> {
        match &self.generations {
            Some(generations) => generations.current(user),
            None => Ok(0),
        }
    }

    /// Revokes every token of `user` and returns the new one.
    pub fn rotate(&self, user: &UserId) -> Result<String, GenerationError> {
        let generations = self.generations.as_ref().ok_or(GenerationError::NoStore)?;
        let generation = generations.bump(user)?;
        Ok(self.mint_generation(user, generation))
    }

    /// A signer keyed with an operator's secret string (its UTF-8 bytes): at least
    /// `MIN_SECRET_LEN` (32) bytes, of at least `MIN_DISTINCT_BYTES` (8) different values.
    pub fn from_secret(secret: &SecretString) -> Result<TokenSigner, TokenSecretError> {
        let bytes = secret.expose_secret().as_bytes();
        if bytes.len() >= MIN_SECRET_LEN {
            let distinct = distinct_bytes(bytes);
            if distinct < MIN_DISTINCT_BYTES {
                return Err(TokenSecretError::Weak { distinct });
            }
        }
        TokenSigner::new(bytes)
    }

    /// A signer keyed with [`TOKEN_SECRET_ENV`], with the generations in [`TOKEN_STATE_ENV`]
    /// when it is set.
    pub fn from_env() -> Result<TokenSigner, TokenSecretError> {
        let signer = match std::env::var(TOKEN_SECRET_ENV) {
            Ok(secret) if !secret.is_empty() => {
                TokenSigner::from_secret(&SecretString::from(secret))?
            }
            _ => return Err(TokenSecretError::Missing),
        };
        Ok(match std::env::var_os(TOKEN_STATE_ENV) {
            Some(dir) if !dir.is_empty() => {
                signer.with_generations(std::sync::Arc::new(GenerationDir::new(dir)))
            }
            _ => signer,
        })
    }

    /// The project token for `user` at generation 0. The same user and secret always give the
    /// same token.
    pub fn mint(&self, user: &UserId) -> String {
        self.mint_generation(user, 0)
    }

    /// The user's token at their current generation.
    pub fn mint_current(&self, user: &UserId) -> Result<String, GenerationError> {
        Ok(self.mint_generation(user, self.generation(user)?))
    }

    /// The user's token at `generation` (the one the store just moved them to).
    pub(crate) fn mint_at(&self, user: &UserId, generation: u64) -> String {
        self.mint_generation(user, generation)
    }

    fn mint_generation(&self, user: &UserId, generation: u64) -> String {
        let mut mac = self.keyed.clone();
        let encoded_user = URL_SAFE_NO_PAD.encode(user.as_str());
        if generation == 0 {
            mac.update(DOMAIN);
            mac.update(user.as_str().as_bytes());
            let tag = mac.finalize().into_bytes();
            return format!("{VERSION}.{encoded_user}.{}", URL_SAFE_NO_PAD.encode(tag));
        }
        mac.update(DOMAIN_2);
        mac.update(user.as_str().as_bytes());
        mac.update(b"\0");
        mac.update(generation.to_string().as_bytes());
        let tag = mac.finalize().into_bytes();
        format!(
            "{VERSION_2}.{encoded_user}.{generation}.{}",
            URL_SAFE_NO_PAD.encode(tag)
        )
    }

    /// An HMAC-SHA256 under this signer's secret over `domain` and then each of `parts`
    /// length-prefixed, for the other values the server signs (sign-in links, sessions). Each
    /// use has its own domain tag, so no signed value can stand in for another kind.
    pub(crate) fn tag(&self, domain: &[u8], parts: &[&[u8]]) -> [u8; 32] {
        let mut mac = self.keyed.clone();
        mac.update(domain);
        for part in parts {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
        mac.finalize().into_bytes().into()
    }

    /// The user `token` was minted for, or `None` for anything this signer did not mint, and
    /// for a token of an earlier generation than the user's current one. A generation store
    /// that cannot be read refuses the token (and logs why).
    pub fn verify(&self, token: &str) -> Option<UserId> {
        self.check(token).ok()
    }

    /// [`TokenSigner::verify`], telling a token that is not valid from one that cannot be
    /// judged now (the generations cannot be read, or are too old to trust).
    pub fn check(&self, token: &str) -> Result<UserId, TokenRefusal> {
        self.check_signature(token).ok_or(TokenRefusal::Invalid)
            .and_then(|(user, generation)| match self.generation(&user) {
                Ok(current) if current == generation => Ok(user),
                Ok(_) => {
                    tracing::info!(%user, generation, "a revoked project token was presented");
                    Err(TokenRefusal::Invalid)
                }
                Err(e) => {
                    tracing::error!(%user, error = %e, "cannot check the token generation; refusing the token");
                    Err(TokenRefusal::Unavailable(e.to_string()))
                }
            })
    }

    /// The user and generation of a token this signer minted, whatever the current generation.
    fn check_signature(&self, token: &str) -> Option<(UserId, u64)> {
        if token.len() > MAX_TOKEN_LEN {
            return None;
        }
        let parts: Vec<&str> = token.split('.').collect();
        let (user_part, generation) = match parts.as_slice() {
            [VERSION, user, _] => (*user, 0),
            [VERSION_2, user, generation, _] => {
                let n: u64 = generation.parse().ok()?;
                (*user, n)
            }
            _ => return None,
        };
        let user_bytes = URL_SAFE_NO_PAD.decode(user_part).ok()?;
        let user = UserId::parse(std::str::from_utf8(&user_bytes).ok()?).ok()?;
        // Comparing the whole canonical token accepts exactly what `mint` produced: any other
        // spelling of the same bytes (padding, trailing bits, a leading zero) fails too.
        let expected = self.mint_generation(&user, generation);
        if !bool::from(expected.as_bytes().ct_eq(token.as_bytes())) {
            return None;
        }
        Some((user, generation))
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
    fn rotation_refuses_every_earlier_token_of_that_user_only() {
        let dir = tempfile::tempdir().unwrap();
        let signer = signer().with_generations(std::sync::Arc::new(GenerationDir::new(dir.path())));
        let (alice, bob) = (user("alice"), user("bob"));
        let first = signer.mint_current(&alice).unwrap();
        assert_eq!(first, signer.mint(&alice), "generation 0 is the v1 token");
        let bobs = signer.mint_current(&bob).unwrap();
        let second = signer.rotate(&alice).unwrap();
        assert!(second.starts_with("v2.YWxpY2U.1."), "{second}");
        assert_eq!(signer.verify(&first), None, "revoked");
        assert_eq!(signer.verify(&second), Some(alice.clone()));
        assert_eq!(signer.verify(&bobs), Some(bob), "other users keep theirs");
        let third = signer.rotate(&alice).unwrap();
        assert_eq!(signer.verify(&second), None);
        assert_eq!(signer.verify(&third), Some(alice.clone()));
        // A generation the store never reached is refused, however well signed.
        assert_eq!(signer.verify(&signer.mint_generation(&alice, 9)), None);
        // A leading zero is another spelling of the same generation: refused.
        assert_eq!(signer.verify(&third.replacen(".2.", ".02.", 1)), None);
        // Without the store, only generation 0 is current.
        assert_eq!(super::tests::signer().verify(&third), None);
        std::fs::write(dir.path().join("alice"), "not a number").unwrap();
        assert_eq!(signer.verify(&third), None, "an unreadable store refuses");
    }

    #[test]
    fn short_secret_is_refused_and_debug_hides_it() {
        assert_eq!(
            TokenSigner::new(b"short").unwrap_err(),
            TokenSecretError::TooShort { len: 5 }
        );
        let operator = |s: &str| TokenSigner::from_secret(&SecretString::from(s.to_owned()));
        assert_eq!(
            operator(&"a".repeat(64)).unwrap_err(),
            TokenSecretError::Weak { distinct: 1 }
        );
        assert_eq!(
            operator("abcdabcdabcdabcdabcdabcdabcdabcd").unwrap_err(),
            TokenSecretError::Weak { distinct: 4 }
        );
        assert_eq!(
            operator("short").unwrap_err(),
            TokenSecretError::TooShort { len: 5 }
        );
        assert!(operator("0123456789abcdef0123456789abcdef").is_ok());
        assert_eq!(format!("{:?}", signer()), "TokenSigner([redacted])");
    }

    fn user_strategy() -> impl Strategy<Value = UserId> {
        "[a-z0-9_][a-z0-9_-]{0,40}".prop_filter_map("valid user id", |s| UserId::parse(&s).ok())
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
