//! Process-wide libgit2 network settings: the watcher's own smart-HTTP transport for `http://`
//! and `https://` remotes (rustls, no OpenSSL; see [`crate::smart_http`]) with the User-Agent
//! that tags its requests and the timeouts that turn a stalled server into a retryable
//! failure, and pack-file mapping limits sized for a long-running daemon.
//!
//! libgit2 keeps these in C globals, so they are set once, before the first network call.
//! The credentials are per operation: [`with_token`] lends them to the transport for one
//! libgit2 fetch on the calling thread; the push's own client gets them with its
//! [`SmartHttp`] ([`client_settings`] gives it the same User-Agent and timeout).

use std::cell::RefCell;
use std::sync::OnceLock;
use std::time::Duration;

use git2::transport::Transport;

use crate::smart_http::{ClientSettings, SmartHttp};
use crate::status::VERSION;

/// How long a connect, or a read or write on an open connection, may take before the attempt
/// fails as a network error and is retried.
pub const DEFAULT_NETWORK_TIMEOUT: Duration = Duration::from_secs(30);

/// The environment variable that sets the network timeout (a duration such as `10s`; documented
/// for operators, used by the fault tests to end a stalled push within a short outage).
pub const NETWORK_TIMEOUT_ENV: &str = "PROJECT_WATCHER_NETWORK_TIMEOUT";

/// The network timeout [`NETWORK_TIMEOUT_ENV`] asks for: [`DEFAULT_NETWORK_TIMEOUT`] when it is
/// unset, an error naming the variable when it is not a duration above zero.
pub fn network_timeout_from_env() -> Result<Duration, String> {
    let Ok(value) = std::env::var(NETWORK_TIMEOUT_ENV) else {
        return Ok(DEFAULT_NETWORK_TIMEOUT);
    };
    match crate::config::parse_duration(&value) {
        Ok(timeout) if !timeout.is_zero() => Ok(timeout),
        _ => Err(format!(
            "{NETWORK_TIMEOUT_ENV}={value:?} is not a duration above zero (such as 30s)"
        )),
    }
}

/// The largest piece of a pack file libgit2 maps at once (its default is 1 GiB on 64-bit).
pub(crate) const PACK_WINDOW_SIZE: usize = 4 << 20;

/// The most pack-file bytes libgit2 keeps mapped (its default is 8 GiB on 64-bit): beyond
/// this it unmaps the least recently used windows. An operation that reads a whole pack (a
/// restore's checkout, a fetch's indexing) otherwise keeps every page of it resident until the
/// repository is closed: restoring a 100k-file project (a 96 MB pack) peaked at 152 MiB RSS
/// with libgit2's defaults and 87 MiB with these.
pub(crate) const PACK_MAPPED_LIMIT: usize = 32 << 20;

/// The product comment of the watcher's User-Agent, `git/2.0 (project-watcher/<version>)`.
/// The cloud's proxy tells the watcher's pushes from everyone else's by this tag.
pub(crate) fn user_agent_tag() -> String {
    format!("project-watcher/{VERSION}")
}

/// The User-Agent of every HTTP request the watcher makes. The `git/` product is what
/// servers expect from a git client (libgit2 sends the same).
pub fn user_agent() -> String {
    format!("git/2.0 ({})", user_agent_tag())
}

static SETTINGS: OnceLock<Duration> = OnceLock::new();

/// Applies the settings once per process and returns the network timeout in force. Later calls
/// with a different timeout change nothing: the first caller (the binary's `main`, or a test
/// binary's first test) decides. Call it before any thread starts a libgit2 network operation.
pub fn init(network_timeout: Duration) -> Duration {
    *SETTINGS.get_or_init(|| {
        apply(network_timeout);
        network_timeout
    })
}

/// The settings of the watcher's own HTTP requests (the push's receive-pack client): the
/// same User-Agent and timeout as libgit2's operations get.
pub(crate) fn client_settings() -> ClientSettings {
    ClientSettings {
        user_agent: user_agent(),
        timeout: init(DEFAULT_NETWORK_TIMEOUT),
    }
}

thread_local! {
    /// The token of the operation running on this thread, read when libgit2 creates the
    /// transport (synchronously, on the thread that called fetch or push).
    static OPERATION_TOKEN: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Runs `operation` (libgit2 network calls on this thread) with `token` as the basic-auth
/// password its HTTP requests carry.
pub fn with_token<T>(token: Option<&str>, operation: impl FnOnce() -> T) -> T {
    struct Restore(Option<String>);
    impl Drop for Restore {
        fn drop(&mut self) {
            OPERATION_TOKEN.set(self.0.take());
        }
    }
    let _restore = Restore(OPERATION_TOKEN.replace(token.map(str::to_owned)));
    operation()
}

fn operation_token() -> Option<String> {
    OPERATION_TOKEN.with_borrow(Clone::clone)
}

#[allow(unsafe_code)]
fn apply(timeout: Duration) {
    let client = ClientSettings {
        user_agent: user_agent(),
        timeout,
    };
    for scheme in ["http", "https"] {
        let client = client.clone();
        // SAFETY: libgit2's transport registry is a global vector without a lock; this runs
        // once, inside `OnceLock::get_or_init`, and every caller of a libgit2 network
        // operation calls `init` first, so no transport is being looked up meanwhile.
        let registered = unsafe {
            git2::transport::register(scheme, move |remote| {
                Transport::smart(remote, true, SmartHttp::new(&client, operation_token()))
            })
        };
        registered.expect("registering the smart-HTTP transport once");
    }
    // SAFETY: as above: these options write libgit2 globals read when a pack is mapped, and
    // they are set before any repository is opened for a network operation.
    unsafe {
        git2::opts::set_mwindow_size(PACK_WINDOW_SIZE)
            .expect("GIT_OPT_SET_MWINDOW_SIZE takes a size");
        git2::opts::set_mwindow_mapped_limit(PACK_MAPPED_LIMIT)
            .expect("GIT_OPT_SET_MWINDOW_MAPPED_LIMIT takes a size");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operation_token_is_lent_for_the_call_only() {
        assert_eq!(operation_token(), None);
        let seen = with_token(Some("t1"), || {
            let inner = with_token(None, operation_token);
            (operation_token(), inner)
        });
        assert_eq!(seen, (Some("t1".to_owned()), None));
        assert_eq!(operation_token(), None);
        let _ = std::panic::catch_unwind(|| with_token(Some("t2"), || panic!("network failed")));
        assert_eq!(operation_token(), None, "restored after a panic too");
    }

    #[test]
    #[allow(unsafe_code)]
    fn init_sizes_the_pack_windows_for_a_daemon() {
        init(DEFAULT_NETWORK_TIMEOUT);
        // SAFETY: reads the globals `init` set above.
        let (size, limit) = unsafe {
            (
                git2::opts::get_mwindow_size().unwrap(),
                git2::opts::get_mwindow_mapped_limit().unwrap(),
            )
        };
        assert_eq!((size, limit), (PACK_WINDOW_SIZE, PACK_MAPPED_LIMIT));
    }

    #[test]
    fn the_user_agent_carries_the_tag() {
        assert!(user_agent().starts_with("git/"));
        assert!(user_agent().contains(&format!("project-watcher/{VERSION}")));
    }
}
