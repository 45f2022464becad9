//! The push stage: sends the newest commit of the branch to the remote in the background.
//!
//! Two halves along one seam. [`worker`] schedules: the daemon publishes every new head on a
//! `watch` channel (a newer head replaces a queued one), the worker pushes it, waits out the
//! backoff of [`crate::retry`] after a failure, and sends a non-fast-forward to
//! `refs/heads/recovery/<UTC timestamp>` (never forcing). [`remote`] talks to the server: over
//! HTTP(S) through [`send_pack`], the watcher's own receive-pack client, which sends only the
//! objects the new commits added ([`objects`]); to a repository on this machine (a path,
//! `file://`) by writing those objects into it and moving its ref in process ([`local`]). The worker sees the remote only through the [`Remote`] trait, so its scheduling is
//! tested with a paused clock and no network.

mod local;
mod objects;
mod remote;
mod send_pack;
mod worker;

use std::time::{Duration, SystemTime};

use git2::Oid;

use crate::remote::RemoteSettings;
use crate::retry::FailureKind;

pub(crate) use remote::GitRemote;
pub use worker::PushHandle;

/// What the pusher tells the daemon. Messages never contain the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushEvent {
    /// An attempt started.
    Started,
    /// The remote branch now holds `oid`.
    Pushed { oid: git2::Oid, at: SystemTime },
    /// An attempt failed; the next one starts after `retry_in`.
    Failed { error: String, retry_in: Duration },
    /// The remote moved on: the local commits went to `recovery_ref` instead.
    Diverged { recovery_ref: String },
}

/// A failed push: what kind, and a message for people (no token, no URL credentials).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PushFailure {
    pub kind: FailureKind,
    pub message: String,
}

/// The pusher's view of git: blocking calls, run on the blocking pool. A seam, so the
/// scheduling below is tested with a paused clock and no network.
pub(crate) trait Remote: Send + Sync + 'static {
    /// Pushes `head` to `dst` (a full ref name) without force.
    fn push(&self, head: Oid, dst: &str) -> Result<(), PushFailure>;
    /// Fetches the remote branch and returns its tip.
    fn fetch_branch_tip(&self) -> Result<Oid, PushFailure>;
    /// Whether `head` is `tip` or has it in its history.
    fn contains(&self, head: Oid, tip: Oid) -> bool;
    /// The local branch tip, if the branch exists.
    fn local_head(&self) -> Option<Oid>;
    /// The local branch tip when the remote-tracking ref does not hold it.
    fn unpushed_head(&self) -> Option<Oid>;
    fn branch(&self) -> &str;
}

/// One push of `head` to `dst` (a full ref name), without retries or force: `sync` sends its
/// backups this way. The error is a message for people (no token, no URL credentials).
pub fn push_once(settings: &RemoteSettings, head: Oid, dst: &str) -> Result<(), String> {
    crate::transport::init(crate::transport::DEFAULT_NETWORK_TIMEOUT);
    GitRemote::new(settings.clone())
        .push(head, dst)
        .map_err(|f| f.message)
}

/// `refs/heads/recovery/20261129T231500Z`: a valid ref name (no `:`), sortable by time.
pub fn recovery_ref_name(at: SystemTime) -> String {
    let stamp: String = humantime::format_rfc3339_seconds(at)
        .to_string()
        .chars()
        .filter(|c| !matches!(c, '-' | ':'))
        .collect();
    format!("refs/heads/recovery/{stamp}")
}

/// `url` with any user name and password replaced by `***`, fit for messages and logs.
pub fn redact_url(url: &str) -> String {
    match url_userinfo(url) {
        Some(userinfo) => url.replacen(&format!("{userinfo}@"), "***@", 1),
        None => url.to_owned(),
    }
}

/// The `user:password` part of a URL, if it has one.
pub(crate) fn url_userinfo(url: &str) -> Option<&str> {
    let (_, rest) = url.split_once("://")?;
    let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
    authority.rfind('@').map(|at| &authority[..at])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery_names_are_valid_ref_names() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_994_100);
        let name = recovery_ref_name(at);
        assert_eq!(name, "refs/heads/recovery/20261129T231500Z");
        assert!(git2::Reference::is_valid_name(&name));
    }

    #[test]
    fn urls_lose_their_credentials() {
        for (url, expected) in [
            (
                "https://u:tok@h.example/a.git",
                "https://***@h.example/a.git",
            ),
            ("https://tok@h.example/a.git", "https://***@h.example/a.git"),
            ("https://h.example/a@b.git", "https://h.example/a@b.git"),
            ("http://127.0.0.1:8/x", "http://127.0.0.1:8/x"),
            ("/srv/git/a.git", "/srv/git/a.git"),
            ("file:///srv/a.git", "file:///srv/a.git"),
        ] {
            assert_eq!(redact_url(url), expected, "{url}");
        }
    }
}
