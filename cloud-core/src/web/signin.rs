//! Sign-in without a user database: one-time links and session cookies, both signed with the
//! project-token secret (`SHMASTRA_TOKEN_SECRET`), so any replica can check them; and the
//! CSRF token bound to a session.
//!
//! A link is `l1.<user>.<expires>.<nonce>.<mac>`; a session is `s1.<user>.<expires>.<id>.<mac>`
//! (user, nonce, id and MAC base64url; `expires` Unix seconds). "One-time" needs the used
//! nonces remembered until their link expires: the state store keeps them
//! ([`Store::spend_link_nonce`]), so a link redeemed on one replica is refused on every other.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use subtle::ConstantTimeEq;

use crate::UserId;
use crate::orchestrate::short_duration;
use crate::store::Store;
use crate::token::TokenSigner;

const LINK_DOMAIN: &[u8] = b"shmastra-login-link-v1\0";
const SESSION_DOMAIN: &[u8] = b"shmastra-session-v1\0";
const CSRF_DOMAIN: &[u8] = b"shmastra-csrf-v1\0";
const LINK_VERSION: &str = "l1";
const SESSION_VERSION: &str = "s1";
/// The longest a sign-in link may live: it is a bearer credential sent over chat and mail.
pub const MAX_LINK_TTL: Duration = Duration::from_secs(24 * 3600);
/// How long a session lasts after sign-in.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Longer values are not ours; refused before any parsing.
const MAX_SIGNED_LEN: usize = 512;

/// Why a sign-in link was refused. The page shows each with its own status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    /// The store of used links did not answer: nothing was spent, the link works later.
    #[error("sign-in is not possible right now: try the same link again in a minute")]
    Unavailable,
    #[error("this sign-in link is not valid: it was not made by this server, or it was cut")]
    Invalid,
    #[error("this sign-in link expired: ask for a new one")]
    Expired,
    #[error("this sign-in link was already used: each link signs in once, ask for a new one")]
    Used,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a sign-in link lives at most {} (asked for {})", short_duration(MAX_LINK_TTL), short_duration(*asked))]
pub struct TtlTooLong {
    pub asked: Duration,
}

/// A signed-in user's session, as the cookie carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub user: UserId,
    /// Random, per sign-in: the CSRF token is bound to it.
    id: [u8; 16],
}

/// Makes and checks links, sessions and CSRF tokens with one signer.
#[derive(Clone)]
pub struct SignIn {
    signer: TokenSigner,
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn random16() -> [u8; 16] {
    let mut bytes = [0u8; 16];
    getrandom::getrandom(&mut bytes).expect("the OS random source is readable");
    bytes
}

/// The fields of `l1.<user>.<expires>.<random>.<mac>` after checking the MAC; `None` when
/// anything is off.
fn open(
    signer: &TokenSigner,
    domain: &[u8],
    version: &str,
    value: &str,
) -> Option<(UserId, u64, [u8; 16])> {
    if value.len() > MAX_SIGNED_LEN {
        return None;
    }
    let parts: Vec<&str> = value.split('.').collect();
    let [v, user, expires, random, mac] = parts.as_slice() else {
        return None;
    };
    if *v != version {
        return None;
    }
    let user =
        UserId::parse(std::str::from_utf8(&URL_SAFE_NO_PAD.decode(user).ok()?).ok()?).ok()?;
    let expires: u64 = expires.parse().ok()?;
    let random: [u8; 16] = URL_SAFE_NO_PAD.decode(random).ok()?.try_into().ok()?;
    let expected = signer.tag(
        domain,
        &[
            user.as_str().as_bytes(),
            expires.to_string().as_bytes(),
            &random,
        ],
    );
    let given = URL_SAFE_NO_PAD.decode(mac).ok()?;
    bool::from(expected.as_slice().ct_eq(&given)).then_some((user, expires, random))
}

fn seal(
    signer: &TokenSigner,
    domain: &[u8],
    version: &str,
    user: &UserId,
    expires: u64,
    random: &[u8; 16],
) -> String {
    let expires = expires.to_string();
    let mac = signer.tag(
        domain,
        &[user.as_str().as_bytes(), expires.as_bytes(), random],
    );
    format!(
        "{version}.{}.{expires}.{}.{}",
        URL_SAFE_NO_PAD.encode(user.as_str()),
        URL_SAFE_NO_PAD.encode(random),
        URL_SAFE_NO_PAD.encode(mac)
    )
}

impl SignIn {
    pub fn new(signer: TokenSigner) -> Self {
        Self { signer }
    }

    /// A one-time sign-in value for `user`, valid for `ttl` (at most `MAX_LINK_TTL`, a day).
    pub fn link(&self, user: &UserId, ttl: Duration) -> Result<String, TtlTooLong> {
        if ttl > MAX_LINK_TTL {
            return Err(TtlTooLong { asked: ttl });
        }
        let expires = now() + ttl.as_secs();
        Ok(seal(
            &self.signer,
            LINK_DOMAIN,
            LINK_VERSION,
            user,
            expires,
            &random16(),
        ))
    }

    /// Checks a link and spends its nonce in `used`: a second use, on any replica sharing the
    /// store, is [`LinkError::Used`].
    pub(crate) async fn redeem(&self, link: &str, used: &dyn Store) -> Result<UserId, LinkError> {
        let (user, expires, nonce) =
            open(&self.signer, LINK_DOMAIN, LINK_VERSION, link).ok_or(LinkError::Invalid)?;
        if now() >= expires {
            return Err(LinkError::Expired);
        }
        let until = UNIX_EPOCH + Duration::from_secs(expires);
        match used
            .spend_link_nonce(URL_SAFE_NO_PAD.encode(nonce), until)
            .await
        {
            Ok(true) => Ok(user),
            Ok(false) => Err(LinkError::Used),
            Err(e) => {
                tracing::error!(error = %e, "cannot record a used sign-in link");
                Err(LinkError::Unavailable)
            }
        }
    }

    /// A new session cookie value for `user`.
    pub(crate) fn session(&self, user: &UserId) -> String {
        seal(
            &self.signer,
            SESSION_DOMAIN,
            SESSION_VERSION,
            user,
            now() + SESSION_TTL.as_secs(),
            &random16(),
        )
    }

    /// The session a cookie value stands for, unless forged or expired.
    pub(crate) fn check_session(&self, value: &str) -> Option<Session> {
        let (user, expires, id) = open(&self.signer, SESSION_DOMAIN, SESSION_VERSION, value)?;
        (now() < expires).then_some(Session { user, id })
    }

    /// The CSRF token of `session`: forms carry it, and a POST without it is refused.
    pub(crate) fn csrf(&self, session: &Session) -> String {
        URL_SAFE_NO_PAD.encode(self.signer.tag(CSRF_DOMAIN, &[&session.id]))
    }

    /// Whether `token` is the CSRF token of `session` (constant time).
    pub(crate) fn csrf_ok(&self, session: &Session, token: &str) -> bool {
        bool::from(self.csrf(session).as_bytes().ct_eq(token.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::store::memory::MemoryStore;

    fn sign_in() -> SignIn {
        SignIn::new(TokenSigner::new(&[7u8; 32]).unwrap())
    }

    fn alice() -> UserId {
        UserId::parse("alice").unwrap()
    }

    #[tokio::test]
    async fn a_link_signs_in_once() {
        let s = sign_in();
        let used = MemoryStore::new();
        let link = s.link(&alice(), Duration::from_secs(60)).unwrap();
        assert_eq!(s.redeem(&link, &used).await, Ok(alice()));
        assert_eq!(s.redeem(&link, &used).await, Err(LinkError::Used));
        let other = s.link(&alice(), Duration::from_secs(60)).unwrap();
        assert_eq!(s.redeem(&other, &used).await, Ok(alice()));
    }

    #[tokio::test]
    async fn expired_forged_and_foreign_links_are_refused() {
        let s = sign_in();
        let used = MemoryStore::new();
        let expired = s.link(&alice(), Duration::ZERO).unwrap();
        assert_eq!(s.redeem(&expired, &used).await, Err(LinkError::Expired));
        let link = s.link(&alice(), Duration::from_secs(60)).unwrap();
        let other_secret = SignIn::new(TokenSigner::new(&[8u8; 32]).unwrap());
        assert_eq!(
            other_secret.redeem(&link, &used).await,
            Err(LinkError::Invalid)
        );
        // Another user's name under alice's MAC.
        let mut parts: Vec<String> = link.split('.').map(str::to_owned).collect();
        parts[1] = URL_SAFE_NO_PAD.encode("bob");
        assert_eq!(
            s.redeem(&parts.join("."), &used).await,
            Err(LinkError::Invalid)
        );
        // A later expiry under the same MAC.
        let mut parts: Vec<String> = link.split('.').map(str::to_owned).collect();
        parts[2] = (parts[2].parse::<u64>().unwrap() + 3600).to_string();
        assert_eq!(
            s.redeem(&parts.join("."), &used).await,
            Err(LinkError::Invalid)
        );
        // A session is not a link, nor a link a session.
        assert_eq!(
            s.redeem(&s.session(&alice()), &used).await,
            Err(LinkError::Invalid)
        );
        assert_eq!(s.check_session(&link), None);
        assert!(
            s.link(&alice(), MAX_LINK_TTL + Duration::from_secs(1))
                .is_err()
        );
    }

    #[test]
    fn csrf_is_bound_to_the_session() {
        let s = sign_in();
        let one = s.check_session(&s.session(&alice())).unwrap();
        let two = s.check_session(&s.session(&alice())).unwrap();
        assert!(s.csrf_ok(&one, &s.csrf(&one)));
        assert!(!s.csrf_ok(&one, &s.csrf(&two)));
        assert!(!s.csrf_ok(&one, ""));
    }
}
