//! Sign-in without a user database: one-time links and session cookies, both signed with the
//! project-token secret (`SHMASTRA_TOKEN_SECRET`) and bound to the user's token generation, so
//! any replica can check them and `token rotate`/`revoke` ends every earlier link and session;
//! and the CSRF token bound to a session.
//!
//! A link is `l2.<user>.<generation>.<expires>.<nonce>.<mac>`; a session is
//! `s2.<user>.<generation>.<expires>.<id>.<mac>` (user, nonce, id and MAC base64url; `expires`
//! Unix seconds). "One-time" needs the used nonces remembered until their link expires, and a
//! signed-out session its id until it expires: [`Nonces`] keeps both durably (the state store,
//! or the token state directory), so a link redeemed on one replica is refused on every other,
//! and after a restart.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use subtle::ConstantTimeEq;

use crate::nonces::Nonces;
use crate::token::{GenerationError, TokenSigner};
use crate::user::UserId;
use shmastra_contract::duration::short_duration;

const LINK_DOMAIN: &[u8] = b"shmastra-login-link-v2\0";
const SESSION_DOMAIN: &[u8] = b"shmastra-session-v2\0";
const CSRF_DOMAIN: &[u8] = b"shmastra-csrf-v1\0";
const LINK_VERSION: &str = "l2";
const SESSION_VERSION: &str = "s2";
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
    /// Not a link of this server's, or cut.
    #[error("this sign-in link is not valid: it was not made by this server, or it was cut")]
    Invalid,
    /// Past its expiry.
    #[error("this sign-in link expired: ask for a new one")]
    Expired,
    /// Made before the user's token was rotated or revoked.
    #[error("this sign-in link was made before your project token was replaced: ask for a new one")]
    Revoked,
    /// Redeemed before, on any replica.
    #[error("this sign-in link was already used: each link signs in once, ask for a new one")]
    Used,
}

/// Why a sign-in link cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum MintLinkError {
    /// A lifetime over a day.
    #[error(transparent)]
    TtlTooLong(#[from] TtlTooLong),
    /// The user's token generation cannot be read, so the link cannot be bound to it.
    #[error(transparent)]
    Generation(#[from] GenerationError),
}

/// A sign-in link asked for with a lifetime past 24 hours.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a sign-in link lives at most {} (asked for {})", short_duration(MAX_LINK_TTL), short_duration(*asked))]
pub struct TtlTooLong {
    /// The lifetime asked for.
    pub asked: Duration,
}

/// A signed-in user's session, as the cookie carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub user: UserId,
    /// Random, per sign-in: the CSRF token is bound to it, and sign-out spends it.
    id: [u8; 16],
    expires: u64,
}

/// Why a session cookie does not sign anyone in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SessionError {
    /// Forged, expired, of an earlier token generation, or signed out.
    Invalid,
    /// The generations or the signed-out sessions cannot be read now.
    Unavailable,
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

/// What a signed value holds.
struct Opened {
    user: UserId,
    generation: u64,
    expires: u64,
    random: [u8; 16],
}

/// The fields of `<version>.<user>.<generation>.<expires>.<random>.<mac>` after checking the
/// MAC; `None` when anything is off.
fn open(signer: &TokenSigner, domain: &[u8], version: &str, value: &str) -> Option<Opened> {
    if value.len() > MAX_SIGNED_LEN {
        return None;
    }
    let parts: Vec<&str> = value.split('.').collect();
    let [v, user, generation, expires, random, mac] = parts.as_slice() else {
        return None;
    };
    if *v != version {
        return None;
    }
    let user =
        UserId::parse(std::str::from_utf8(&URL_SAFE_NO_PAD.decode(user).ok()?).ok()?).ok()?;
    let generation: u64 = generation.parse().ok()?;
    let expires: u64 = expires.parse().ok()?;
    let random: [u8; 16] = URL_SAFE_NO_PAD.decode(random).ok()?.try_into().ok()?;
    let expected = signer.tag(
        domain,
        &[
            user.as_str().as_bytes(),
            generation.to_string().as_bytes(),
            expires.to_string().as_bytes(),
            &random,
        ],
    );
    let given = URL_SAFE_NO_PAD.decode(mac).ok()?;
    bool::from(expected.as_slice().ct_eq(&given)).then_some(Opened {
        user,
        generation,
        expires,
        random,
    })
}

fn seal(
    signer: &TokenSigner,
    domain: &[u8],
    version: &str,
    user: &UserId,
    generation: u64,
    expires: u64,
    random: &[u8; 16],
) -> String {
    let (generation, expires) = (generation.to_string(), expires.to_string());
    let mac = signer.tag(
        domain,
        &[
            user.as_str().as_bytes(),
            generation.as_bytes(),
            expires.as_bytes(),
            random,
        ],
    );
    format!(
        "{version}.{}.{generation}.{expires}.{}.{}",
        URL_SAFE_NO_PAD.encode(user.as_str()),
        URL_SAFE_NO_PAD.encode(random),
        URL_SAFE_NO_PAD.encode(mac)
    )
}

/// The key a link's nonce is spent under.
fn link_key(nonce: &[u8; 16]) -> String {
    format!("l:{}", URL_SAFE_NO_PAD.encode(nonce))
}

/// The key a signed-out session's id is spent under.
fn session_key(id: &[u8; 16]) -> String {
    format!("s:{}", URL_SAFE_NO_PAD.encode(id))
}

fn at(seconds: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(seconds)
}

impl SignIn {
    /// Links and sessions signed with `signer`'s secret.
    pub fn new(signer: TokenSigner) -> Self {
        Self { signer }
    }

    /// A one-time sign-in value for `user` at their current token generation, valid for
    /// `ttl` (at most `MAX_LINK_TTL`, a day).
    pub fn link(&self, user: &UserId, ttl: Duration) -> Result<String, MintLinkError> {
        if ttl > MAX_LINK_TTL {
            return Err(TtlTooLong { asked: ttl }.into());
        }
        let generation = self.signer.generation(user)?;
        let expires = now() + ttl.as_secs();
        Ok(seal(
            &self.signer,
            LINK_DOMAIN,
            LINK_VERSION,
            user,
            generation,
            expires,
            &random16(),
        ))
    }

    /// The user a link signs in, checked (MAC, expiry, generation, not spent) but not spent:
    /// what the sign-in page shows before anyone presses its button.
    pub(crate) async fn inspect(&self, link: &str, used: &dyn Nonces) -> Result<UserId, LinkError> {
        let opened = self.valid_link(link)?;
        match used.spent(link_key(&opened.random)).await {
            Ok(false) => Ok(opened.user),
            Ok(true) => Err(LinkError::Used),
            Err(e) => {
                tracing::error!(error = %e, "cannot read the used sign-in links");
                Err(LinkError::Unavailable)
            }
        }
    }

    /// Checks a link and spends its nonce in `used`: a second use, on any replica sharing the
    /// store, or after a restart, is [`LinkError::Used`].
    pub(crate) async fn redeem(&self, link: &str, used: &dyn Nonces) -> Result<UserId, LinkError> {
        let opened = self.valid_link(link)?;
        match used
            .spend(link_key(&opened.random), at(opened.expires))
            .await
        {
            Ok(true) => Ok(opened.user),
            Ok(false) => Err(LinkError::Used),
            Err(e) => {
                tracing::error!(error = %e, "cannot record a used sign-in link");
                Err(LinkError::Unavailable)
            }
        }
    }

    fn valid_link(&self, link: &str) -> Result<Opened, LinkError> {
        let opened =
            open(&self.signer, LINK_DOMAIN, LINK_VERSION, link).ok_or(LinkError::Invalid)?;
        if now() >= opened.expires {
            return Err(LinkError::Expired);
        }
        match self.signer.generation(&opened.user) {
            Ok(current) if current == opened.generation => Ok(opened),
            Ok(_) => Err(LinkError::Revoked),
            Err(e) => {
                tracing::error!(error = %e, "cannot read the token generation for a sign-in link");
                Err(LinkError::Unavailable)
            }
        }
    }

    /// A new session cookie value for `user`, at their current token generation.
    pub(crate) fn session(&self, user: &UserId) -> Result<String, GenerationError> {
        Ok(seal(
            &self.signer,
            SESSION_DOMAIN,
            SESSION_VERSION,
            user,
            self.signer.generation(user)?,
            now() + SESSION_TTL.as_secs(),
            &random16(),
        ))
    }

    /// The session a cookie value stands for, unless forged, expired, of an earlier token
    /// generation, or signed out.
    pub(crate) async fn check_session(
        &self,
        value: &str,
        ended: &dyn Nonces,
    ) -> Result<Session, SessionError> {
        let opened = open(&self.signer, SESSION_DOMAIN, SESSION_VERSION, value)
            .ok_or(SessionError::Invalid)?;
        if now() >= opened.expires {
            return Err(SessionError::Invalid);
        }
        match self.signer.generation(&opened.user) {
            Ok(current) if current == opened.generation => {}
            Ok(_) => return Err(SessionError::Invalid),
            Err(e) => {
                tracing::error!(error = %e, "cannot read the token generation for a session");
                return Err(SessionError::Unavailable);
            }
        }
        match ended.spent(session_key(&opened.random)).await {
            Ok(false) => Ok(Session {
                user: opened.user,
                id: opened.random,
                expires: opened.expires,
            }),
            Ok(true) => Err(SessionError::Invalid),
            Err(e) => {
                tracing::error!(error = %e, "cannot read the signed-out sessions");
                Err(SessionError::Unavailable)
            }
        }
    }

    /// Ends `session` on every replica: its cookie no longer signs in, even if kept.
    pub(crate) async fn end(&self, session: &Session, ended: &dyn Nonces) -> Result<(), ()> {
        ended
            .spend(session_key(&session.id), at(session.expires))
            .await
            .map(|_| ())
            .map_err(|e| tracing::error!(error = %e, "cannot record a signed-out session"))
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

    use std::sync::Arc;

    use crate::nonces::StoreNonces;
    use crate::store::memory::MemoryStore;
    use crate::token::Generations;

    fn sign_in() -> SignIn {
        SignIn::new(TokenSigner::new(&[7u8; 32]).unwrap())
    }

    fn alice() -> UserId {
        UserId::parse("alice").unwrap()
    }

    fn nonces() -> StoreNonces {
        StoreNonces(Arc::new(MemoryStore::new()))
    }

    #[tokio::test]
    async fn a_link_signs_in_once_and_looking_at_it_spends_nothing() {
        let s = sign_in();
        let used = nonces();
        let link = s.link(&alice(), Duration::from_secs(60)).unwrap();
        assert_eq!(s.inspect(&link, &used).await, Ok(alice()));
        assert_eq!(s.inspect(&link, &used).await, Ok(alice()));
        assert_eq!(s.redeem(&link, &used).await, Ok(alice()));
        assert_eq!(s.redeem(&link, &used).await, Err(LinkError::Used));
        assert_eq!(s.inspect(&link, &used).await, Err(LinkError::Used));
        let other = s.link(&alice(), Duration::from_secs(60)).unwrap();
        assert_eq!(s.redeem(&other, &used).await, Ok(alice()));
    }

    #[tokio::test]
    async fn expired_forged_and_foreign_links_are_refused() {
        let s = sign_in();
        let used = nonces();
        let expired = s.link(&alice(), Duration::ZERO).unwrap();
        assert_eq!(s.redeem(&expired, &used).await, Err(LinkError::Expired));
        let link = s.link(&alice(), Duration::from_secs(60)).unwrap();
        let other_secret = SignIn::new(TokenSigner::new(&[8u8; 32]).unwrap());
        assert_eq!(
            other_secret.redeem(&link, &used).await,
            Err(LinkError::Invalid)
        );
        let tampered = |field: usize, value: String| {
            let mut parts: Vec<String> = link.split('.').map(str::to_owned).collect();
            parts[field] = value;
            parts.join(".")
        };
        // Another user's name, a later generation, a later expiry under the same MAC.
        for forged in [
            tampered(1, URL_SAFE_NO_PAD.encode("bob")),
            tampered(2, "1".to_owned()),
            tampered(3, (now() + 7200).to_string()),
        ] {
            assert_eq!(s.redeem(&forged, &used).await, Err(LinkError::Invalid));
        }
        // A session is not a link, nor a link a session.
        let session = s.session(&alice()).unwrap();
        assert_eq!(s.redeem(&session, &used).await, Err(LinkError::Invalid));
        assert_eq!(
            s.check_session(&link, &used).await,
            Err(SessionError::Invalid)
        );
        assert!(matches!(
            s.link(&alice(), MAX_LINK_TTL + Duration::from_secs(1)),
            Err(MintLinkError::TtlTooLong(_))
        ));
    }

    struct Bumped(std::sync::atomic::AtomicU64);

    impl Generations for Bumped {
        fn current(&self, _user: &UserId) -> Result<u64, GenerationError> {
            Ok(self.0.load(std::sync::atomic::Ordering::SeqCst))
        }
        fn bump(&self, _user: &UserId) -> Result<u64, GenerationError> {
            Ok(self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1)
        }
    }

    #[tokio::test]
    async fn a_rotated_token_ends_earlier_links_and_sessions_and_sign_out_ends_one() {
        let generations = Arc::new(Bumped(0.into()));
        let s = SignIn::new(
            TokenSigner::new(&[7u8; 32])
                .unwrap()
                .with_generations(generations.clone()),
        );
        let used = nonces();
        let link = s.link(&alice(), Duration::from_secs(60)).unwrap();
        let cookie = s.session(&alice()).unwrap();
        let other = s.session(&alice()).unwrap();
        let session = s.check_session(&cookie, &used).await.unwrap();
        s.end(&session, &used).await.unwrap();
        assert_eq!(
            s.check_session(&cookie, &used).await,
            Err(SessionError::Invalid)
        );
        assert!(s.check_session(&other, &used).await.is_ok());

        generations.bump(&alice()).unwrap();
        assert_eq!(s.inspect(&link, &used).await, Err(LinkError::Revoked));
        assert_eq!(
            s.check_session(&other, &used).await,
            Err(SessionError::Invalid)
        );
        let fresh = s.session(&alice()).unwrap();
        assert!(s.check_session(&fresh, &used).await.is_ok());
    }

    #[tokio::test]
    async fn csrf_is_bound_to_the_session() {
        let s = sign_in();
        let used = nonces();
        let one = s
            .check_session(&s.session(&alice()).unwrap(), &used)
            .await
            .unwrap();
        let two = s
            .check_session(&s.session(&alice()).unwrap(), &used)
            .await
            .unwrap();
        assert!(s.csrf_ok(&one, &s.csrf(&one)));
        assert!(!s.csrf_ok(&one, &s.csrf(&two)));
        assert!(!s.csrf_ok(&one, ""));
    }
}
