//! The control API's service keys: `SHMASTRA_API_KEY`, one key or several separated by commas
//! (several during a rotation: add the new key, move the backend to it, drop the old one).
//! Each key is at least 32 bytes of at least 8 different values; a presented key is compared
//! with every configured key in constant time, and no key is ever logged or shown.

use std::fmt;

use subtle::ConstantTimeEq;

use crate::token::{MIN_DISTINCT_BYTES, distinct_bytes};

/// The environment variable holding the key (or the keys, comma-separated).
pub const API_KEY_ENV: &str = "SHMASTRA_API_KEY";
/// Fewest bytes of a key.
pub const MIN_API_KEY_LEN: usize = 32;
/// Most keys accepted at once: a rotation needs two.
const MAX_KEYS: usize = 8;

/// Why `SHMASTRA_API_KEY` is refused. The message names the key by its position, never by
/// its value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiKeyError {
    /// An empty entry (`a,,b` or a trailing comma).
    #[error("{API_KEY_ENV}: key {position} is empty (separate keys with single commas)")]
    Empty {
        /// 1-based position in the list.
        position: usize,
    },
    /// Fewer than 32 bytes.
    #[error(
        "{API_KEY_ENV}: key {position} is {len} bytes; at least {MIN_API_KEY_LEN} are needed (generate one with `openssl rand -hex 32`)"
    )]
    TooShort {
        /// 1-based position in the list.
        position: usize,
        /// Its length.
        len: usize,
    },
    /// Fewer than 8 different byte values.
    #[error(
        "{API_KEY_ENV}: key {position} uses only {distinct} different characters; it must be random (generate one with `openssl rand -hex 32`)"
    )]
    Weak {
        /// 1-based position in the list.
        position: usize,
        /// How many different byte values it uses.
        distinct: usize,
    },
    /// Whitespace or a control character inside a key (a header value cannot carry it intact).
    #[error("{API_KEY_ENV}: key {position} holds whitespace or a control character")]
    BadCharacter {
        /// 1-based position in the list.
        position: usize,
    },
    /// More keys than a rotation needs.
    #[error("{API_KEY_ENV}: {count} keys; at most {MAX_KEYS} are accepted at once")]
    TooMany {
        /// How many were given.
        count: usize,
    },
}

/// The keys the API accepts. `Debug` shows how many, never a key.
#[derive(Clone)]
pub struct ApiKeys {
    keys: Vec<Vec<u8>>,
}

impl fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ApiKeys({} key(s), redacted)", self.keys.len())
    }
}

impl ApiKeys {
    /// Parses `value`: one key, or several separated by commas (spaces around a comma are
    /// allowed).
    pub fn parse(value: &str) -> Result<ApiKeys, ApiKeyError> {
        let entries: Vec<&str> = value.split(',').map(str::trim).collect();
        if entries.len() > MAX_KEYS {
            return Err(ApiKeyError::TooMany {
                count: entries.len(),
            });
        }
        let mut keys = Vec::with_capacity(entries.len());
        for (i, key) in entries.into_iter().enumerate() {
            let position = i + 1;
            if key.is_empty() {
                return Err(ApiKeyError::Empty { position });
            }
            if key
                .bytes()
                .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
            {
                return Err(ApiKeyError::BadCharacter { position });
            }
            if key.len() < MIN_API_KEY_LEN {
                return Err(ApiKeyError::TooShort {
                    position,
                    len: key.len(),
                });
            }
            let distinct = distinct_bytes(key.as_bytes());
            if distinct < MIN_DISTINCT_BYTES {
                return Err(ApiKeyError::Weak { position, distinct });
            }
            keys.push(key.as_bytes().to_vec());
        }
        Ok(ApiKeys { keys })
    }

    /// The keys in [`API_KEY_ENV`]; `None` when it is unset or empty (the API is off).
    pub fn from_env() -> Result<Option<ApiKeys>, ApiKeyError> {
        match std::env::var(API_KEY_ENV) {
            Ok(value) if !value.trim().is_empty() => ApiKeys::parse(&value).map(Some),
            _ => Ok(None),
        }
    }

    /// Whether `presented` is one of the keys. Every key is compared, in constant time for
    /// keys of its length, so the time taken says neither which key matched nor how much of
    /// one did.
    pub fn accepts(&self, presented: &[u8]) -> bool {
        self.keys
            .iter()
            .fold(subtle::Choice::from(0), |found, key| {
                found | key.as_slice().ct_eq(presented)
            })
            .into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "0123456789abcdef0123456789abcdef";
    const B: &str = "fedcba9876543210fedcba9876543210";

    #[test]
    fn one_key_or_several_during_a_rotation() {
        let one = ApiKeys::parse(A).unwrap();
        assert!(one.accepts(A.as_bytes()));
        assert!(!one.accepts(B.as_bytes()));
        let both = ApiKeys::parse(&format!("{A}, {B}")).unwrap();
        assert!(both.accepts(A.as_bytes()));
        assert!(both.accepts(B.as_bytes()));
        assert!(!both.accepts(format!("{A},{B}").as_bytes()));
        assert!(!both.accepts(&A.as_bytes()[..31]));
        assert!(!both.accepts(format!("{A}x").as_bytes()));
        assert!(!both.accepts(b""));
    }

    #[test]
    fn bad_keys_are_refused_by_position_without_their_value() {
        let check = |value: &str, expected: ApiKeyError| {
            let error = ApiKeys::parse(value).unwrap_err();
            assert_eq!(error, expected, "{value}");
            assert!(!error.to_string().contains(A), "{error}");
        };
        check(
            "short",
            ApiKeyError::TooShort {
                position: 1,
                len: 5,
            },
        );
        check(&format!("{A},"), ApiKeyError::Empty { position: 2 });
        check(
            &"ab".repeat(20),
            ApiKeyError::Weak {
                position: 1,
                distinct: 2,
            },
        );
        check(
            &format!("{A},{} x", &B[..20]),
            ApiKeyError::BadCharacter { position: 2 },
        );
        check(&[A; 9].join(","), ApiKeyError::TooMany { count: 9 });
        assert!(!format!("{:?}", ApiKeys::parse(A).unwrap()).contains(A));
    }
}
