//! Process-wide libgit2 network settings: the User-Agent that tags the watcher's requests and
//! the timeouts that turn a stalled server into a retryable failure.
//!
//! libgit2 keeps these in C globals, so they are set once, before the first network call.

use std::sync::OnceLock;
use std::time::Duration;

use crate::status::VERSION;

/// How long a connect, or a read or write on an open connection, may take before the attempt
/// fails as a network error and is retried.
pub const DEFAULT_NETWORK_TIMEOUT: Duration = Duration::from_secs(30);

/// The product comment libgit2 puts in its User-Agent: `git/2.0 (project-watcher/<version>)`.
/// The cloud's proxy tells the watcher's pushes from everyone else's by this tag.
pub fn user_agent_tag() -> String {
    format!("project-watcher/{VERSION}")
}

static SETTINGS: OnceLock<Duration> = OnceLock::new();

/// Applies the settings once per process and returns the network timeout in force. Later calls
/// with a different timeout change nothing: the first caller (the binary's `main`, or a test
/// binary's first test) decides.
pub fn init(network_timeout: Duration) -> Duration {
    *SETTINGS.get_or_init(|| {
        apply(&user_agent_tag(), network_timeout);
        network_timeout
    })
}

#[allow(unsafe_code)]
fn apply(user_agent: &str, timeout: Duration) {
    let millis = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    let agent = std::ffi::CString::new(user_agent).expect("the user agent has no NUL byte");
    libgit2_sys::init();
    // SAFETY: libgit2 is initialised above. The options write libgit2 globals that only
    // network operations read, and this runs inside `OnceLock::get_or_init` before any of our
    // network operations; libgit2 copies the string, which outlives the call.
    let rc = unsafe {
        libgit2_sys::git_libgit2_opts(
            libgit2_sys::GIT_OPT_SET_USER_AGENT as libc::c_int,
            agent.as_ptr(),
        )
    };
    debug_assert!(rc >= 0, "GIT_OPT_SET_USER_AGENT failed");
    // SAFETY: as above; these options take one int argument.
    unsafe {
        libgit2_sys::git_libgit2_opts(
            libgit2_sys::GIT_OPT_SET_SERVER_CONNECT_TIMEOUT as libc::c_int,
            millis,
        );
        libgit2_sys::git_libgit2_opts(
            libgit2_sys::GIT_OPT_SET_SERVER_TIMEOUT as libc::c_int,
            millis,
        );
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn libgit2_is_built_with_https() {
        let version = git2::Version::get();
        assert!(
            version.https(),
            "libgit2 {:?} lacks https",
            version.libgit2_version()
        );
    }
}
