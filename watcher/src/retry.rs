//! The retry policy: what kind of failure a push met, and how long to wait before the next
//! attempt (capped exponential backoff with jitter; a long one for refused credentials); a
//! failed save (disk full, a held lock) waits on the same backoff over [`SAVE`].
//!
//! Pure: no clock and no randomness of its own, so every case is a table row.

use std::time::Duration;

/// Why a push failed, sorted by what the pusher does next. In the status file as
/// `last_push_failure` (`"missing_objects"`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// No connection, a reset, a timeout: retry soon.
    Network,
    /// The server answered 5xx: retry soon.
    Server,
    /// 401 or 403: the token is wrong or lacks access. Retrying soon would only repeat the
    /// refusal (and could get the token locked), so wait long.
    Auth,
    /// The server refused the ref update (a hook, a protected branch, a quota): a person has
    /// to act, so retry slowly.
    Rejected,
    /// The remote branch holds commits we do not have: never retried as is; the commits go to
    /// a recovery branch instead.
    NonFastForward,
    /// The server refused the pack for missing objects (`ng <ref> missing necessary objects`,
    /// any `unpack` failure; for a remote on this machine, the connectivity check): the next
    /// attempt sends a larger pack at once, the full pack `git push` would send, then every
    /// object of the branch.
    MissingObjects,
    /// The local setup is wrong (no such remote, unreadable repository): retry slowly, the
    /// next commit may find it fixed.
    Local,
}

/// Backoff series: `first` doubles on each consecutive failure up to `cap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Series {
    pub first: Duration,
    pub cap: Duration,
}

pub const TRANSIENT: Series = Series {
    first: Duration::from_secs(1),
    cap: Duration::from_secs(30),
};
pub const SLOW: Series = Series {
    first: Duration::from_secs(30),
    cap: Duration::from_secs(10 * 60),
};
/// A save that could not write the repository: soon, and never slower than once a minute.
pub const SAVE: Series = Series {
    first: Duration::from_secs(1),
    cap: Duration::from_secs(60),
};
pub const AUTH: Series = Series {
    first: Duration::from_secs(5 * 60),
    cap: Duration::from_secs(60 * 60),
};

impl FailureKind {
    /// The backoff series a failure of this kind waits on.
    pub(crate) fn series(self) -> Series {
        match self {
            Self::Network | Self::Server | Self::NonFastForward | Self::MissingObjects => TRANSIENT,
            Self::Rejected | Self::Local => SLOW,
            Self::Auth => AUTH,
        }
    }
}

impl std::fmt::Display for FailureKind {
    /// The status file's name of the kind (`missing_objects`), as log lines write it too.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match serde_json::to_value(self) {
            Ok(serde_json::Value::String(name)) => f.write_str(&name),
            _ => Err(std::fmt::Error),
        }
    }
}

impl FailureKind {
    /// A few words for the status: what is wrong.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Network => "the remote cannot be reached",
            Self::Server => "the remote had a server error",
            Self::Auth => "the remote refused the credentials",
            Self::Rejected => "the remote refused the push",
            Self::NonFastForward => "the remote branch has commits this one lacks",
            Self::MissingObjects => "the remote refused the push: missing objects",
            Self::Local => "the local repository or its settings are not usable",
        }
    }

    /// What an HTTP status other than 200 means for the pusher.
    pub fn of_http_status(status: u16) -> Self {
        match status {
            401 | 403 | 407 => Self::Auth,
            500..=599 => Self::Server,
            _ => Self::Rejected,
        }
    }
}

/// Consecutive failures so far. A success resets it.
#[derive(Debug, Clone, Default)]
pub struct Backoff {
    failures: u32,
}

impl Backoff {
    /// The wait before the next attempt after another failure of `kind`.
    ///
    /// `jitter` in `[0, 1]` picks a point in the upper half of the step ("equal jitter"):
    /// watchers that failed together spread out, yet never retry sooner than half the step.
    pub fn next_delay(&mut self, kind: FailureKind, jitter: f64) -> Duration {
        self.next_delay_in(kind.series(), jitter)
    }

    /// [`Backoff::next_delay`] over a series of its own.
    pub fn next_delay_in(&mut self, series: Series, jitter: f64) -> Duration {
        let step = series
            .first
            .saturating_mul(1u32 << self.failures.min(20))
            .min(series.cap);
        self.failures = self.failures.saturating_add(1);
        let jitter = jitter.clamp(0.0, 1.0);
        step / 2 + step.mul_f64(jitter / 2.0)
    }

    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

/// A jitter value in `[0, 1]` from the standard library's per-process random hash keys.
pub fn random_jitter() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    );
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// The HTTP status in a libgit2 error message (`unexpected http status code: 503`): libgit2
/// keeps only the text of a transport's error, so the fetch's failures are read here.
pub fn http_status_in(message: &str) -> Option<u16> {
    let rest = message
        .to_ascii_lowercase()
        .split_once("http status code: ")?
        .1
        .to_owned();
    rest.get(..3)?.parse().ok()
}

/// What kind of failure a libgit2 fetch error is. The watcher's HTTP transport words an HTTP
/// failure as libgit2's own does (`unexpected http status code: 401`), so the status decides;
/// a refused or missing token is a 401.
pub fn classify_git_error(
    code: git2::ErrorCode,
    class: git2::ErrorClass,
    message: &str,
) -> FailureKind {
    if code == git2::ErrorCode::Auth {
        return FailureKind::Auth;
    }
    if code == git2::ErrorCode::NotFastForward {
        return FailureKind::NonFastForward;
    }
    if let Some(status) = http_status_in(message) {
        return FailureKind::of_http_status(status);
    }
    match class {
        git2::ErrorClass::Net
        | git2::ErrorClass::Os
        | git2::ErrorClass::Ssl
        | git2::ErrorClass::Http
        | git2::ErrorClass::Callback => FailureKind::Network,
        git2::ErrorClass::Repository
        | git2::ErrorClass::Reference
        | git2::ErrorClass::Config
        | git2::ErrorClass::Odb
        | git2::ErrorClass::Object => FailureKind::Local,
        _ => FailureKind::Network,
    }
}

/// What kind of failure a ref update the server refused is, from the reason of its
/// `ng <ref> <reason>` (receive-pack's words: `missing necessary objects`, `non-fast-forward`).
/// receive-pack's `failed to update ref` and `failed to lock` are the server's own trouble,
/// most often a lock another receive-pack still holds (one whose client was killed mid-push):
/// tried again within a second, as a server error, not after a refusal's half minute. So is
/// `unable to migrate objects to permanent storage`: the pack arrived whole, and the server
/// could not move its quarantine into the repository (seen once in 100 `kill -9` rounds, a
/// push right after a killed one).
pub fn classify_ref_rejection(message: &str) -> FailureKind {
    let m = message.to_ascii_lowercase();
    if m.contains("non-fast-forward") || m.contains("fetch first") || m.contains("stale info") {
        FailureKind::NonFastForward
    } else if m.contains("missing necessary objects") || m.contains("unpacker error") {
        FailureKind::MissingObjects
    } else if m.contains("failed to update ref")
        || m.contains("failed to lock")
        || m.contains("unable to migrate objects")
    {
        FailureKind::Server
    } else {
        FailureKind::Rejected
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use git2::{ErrorClass as C, ErrorCode as E};

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn a_kind_prints_as_the_status_file_names_it() {
        for kind in [
            FailureKind::Network,
            FailureKind::MissingObjects,
            FailureKind::NonFastForward,
        ] {
            let json = serde_json::to_value(kind).unwrap();
            assert_eq!(json.as_str(), Some(kind.to_string().as_str()));
        }
        assert_eq!(FailureKind::MissingObjects.to_string(), "missing_objects");
    }

    #[test]
    fn a_failed_save_waits_one_second_first_and_a_minute_at_most() {
        let mut backoff = Backoff::default();
        let got: Vec<u64> = (0..8)
            .map(|_| backoff.next_delay_in(SAVE, 1.0).as_secs())
            .collect();
        assert_eq!(got, [1, 2, 4, 8, 16, 32, 60, 60]);
        backoff.reset();
        assert_eq!(backoff.next_delay_in(SAVE, 0.0), Duration::from_millis(500));
    }

    #[test]
    fn delays_double_up_to_the_cap_and_jitter_stays_in_the_upper_half() {
        let check = |kind: FailureKind, jitter: f64, expected: &[u64]| {
            let mut backoff = Backoff::default();
            let got: Vec<_> = expected
                .iter()
                .map(|_| backoff.next_delay(kind, jitter).as_millis() as u64)
                .collect();
            assert_eq!(got, expected, "{kind:?} jitter {jitter}");
        };
        check(
            FailureKind::Network,
            1.0,
            &[1000, 2000, 4000, 8000, 16000, 30000, 30000],
        );
        check(
            FailureKind::Server,
            0.0,
            &[500, 1000, 2000, 4000, 8000, 15000],
        );
        check(FailureKind::Server, 0.5, &[750, 1500, 3000]);
        check(
            FailureKind::Auth,
            1.0,
            &[300_000, 600_000, 1_200_000, 2_400_000, 3_600_000, 3_600_000],
        );
        check(FailureKind::Rejected, 1.0, &[30_000, 60_000, 120_000]);
        check(FailureKind::Network, 7.0, &[1000]);
        check(FailureKind::Network, -3.0, &[500]);
    }

    #[test]
    fn an_auth_failure_never_waits_less_than_minutes() {
        let mut backoff = Backoff::default();
        for _ in 0..50 {
            assert!(backoff.next_delay(FailureKind::Auth, 0.0) >= secs(150));
        }
    }

    #[test]
    fn reset_starts_the_series_again() {
        let mut backoff = Backoff::default();
        for _ in 0..10 {
            backoff.next_delay(FailureKind::Network, 1.0);
        }
        backoff.reset();
        assert_eq!(backoff.next_delay(FailureKind::Network, 1.0), secs(1));
    }

    #[test]
    fn many_failures_do_not_overflow() {
        let mut backoff = Backoff {
            failures: u32::MAX - 1,
        };
        assert_eq!(backoff.next_delay(FailureKind::Auth, 1.0), secs(3600));
        assert_eq!(backoff.next_delay(FailureKind::Auth, 1.0), secs(3600));
    }

    #[test]
    fn jitter_is_in_range() {
        for _ in 0..100 {
            let j = random_jitter();
            assert!((0.0..=1.0).contains(&j), "{j}");
        }
    }

    #[test]
    fn git_errors_are_classified() {
        let check = |code, class, message: &str, expected| {
            assert_eq!(
                classify_git_error(code, class, message),
                expected,
                "{message}"
            );
        };
        use FailureKind::*;
        check(
            E::GenericError,
            C::Net,
            "failed to connect to 127.0.0.1: Connection refused",
            Network,
        );
        check(
            E::GenericError,
            C::Net,
            "could not read from socket: timed out",
            Network,
        );
        check(E::GenericError, C::Os, "failed to resolve address", Network);
        check(
            E::GenericError,
            C::Http,
            "unexpected http status code: 500",
            Server,
        );
        check(
            E::GenericError,
            C::Http,
            "unexpected http status code: 503",
            Server,
        );
        check(
            E::GenericError,
            C::Http,
            "unexpected http status code: 403",
            Auth,
        );
        check(
            E::GenericError,
            C::Http,
            "unexpected http status code: 404",
            Rejected,
        );
        check(E::Auth, C::Http, "unexpected authentication failure", Auth);
        check(
            E::GenericError,
            C::Net,
            "unexpected http status code: 401 (the credentials were refused)",
            Auth,
        );
        check(
            E::GenericError,
            C::Net,
            "timed out: the server did not answer within 30s",
            Network,
        );
        check(
            E::NotFastForward,
            C::Reference,
            "cannot push non-fastforwardable reference",
            NonFastForward,
        );
        check(
            E::NotFound,
            C::Config,
            "remote 'project' does not exist",
            Local,
        );
    }

    #[test]
    fn ref_rejections_are_classified() {
        use FailureKind::*;
        for (message, expected) in [
            ("pre-receive hook declined", Rejected),
            ("deny updating a hidden ref", Rejected),
            ("non-fast-forward", NonFastForward),
            ("fetch first", NonFastForward),
            ("stale info", NonFastForward),
            ("missing necessary objects", MissingObjects),
            ("unpacker error", MissingObjects),
            (
                "failed to update ref (remote said: error: cannot lock ref 'HEAD': Unable to create '/srv/user.git/./HEAD.lock': File exists.)",
                Server,
            ),
            ("failed to lock", Server),
            ("unable to migrate objects to permanent storage", Server),
        ] {
            assert_eq!(classify_ref_rejection(message), expected, "{message}");
        }
    }

    #[test]
    fn http_status_is_read_from_libgit2_messages() {
        assert_eq!(
            http_status_in("unexpected http status code: 502"),
            Some(502)
        );
        assert_eq!(
            http_status_in("Unexpected HTTP status code: 401 x"),
            Some(401)
        );
        assert_eq!(http_status_in("failed to connect"), None);
        assert_eq!(http_status_in("http status code: 5"), None);
    }
}
