//! The push stage: sends the newest commit of the branch to the remote in the background.
//!
//! Two halves along one seam. [`worker`] schedules: the daemon publishes every new head on a
//! `watch` channel (a newer head replaces a queued one), the worker pushes it, waits out the
//! backoff of [`crate::retry`] after a failure, and sends a non-fast-forward to
//! `refs/heads/recovery/<UTC timestamp>` (never forcing). [`remote`] talks to the server: over
//! HTTP(S) through [`send_pack`], the watcher's own receive-pack client, which sends only the
//! objects the new commits added ([`objects`]); to a repository on this machine (a path,
//! `file://`) by writing those objects into it, checking that the remote then holds every
//! object the new tip reaches ([`connected`]) and moving its ref in process ([`local`]). The
//! worker sees the remote only through the [`Remote`] trait, so its scheduling is tested with a
//! paused clock and no network.
//!
//! The server's verdict is believed: a pack refused for missing objects
//! ([`FailureKind::MissingObjects`]) is followed at once by a larger one ([`Pack::larger`]: the
//! full pack `git push` sends, then every object of the branch), each once, with a warning
//! naming the cause; the next success goes back to sending changes.

mod connected;
mod local;
mod objects;
mod remote;
mod send_pack;
mod worker;

use std::time::{Duration, SystemTime};

use git2::Oid;

use crate::remote::RemoteSettings;
use crate::retry::FailureKind;

pub(crate) use objects::Pack;
pub(crate) use remote::GitRemote;
pub use worker::PushHandle;

/// A commit to push, and the branch it is the tip of: a branch's saves go to the remote
/// branch of the same name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// The commit.
    pub oid: Oid,
    /// The local branch (`main`, not `refs/heads/main`).
    pub branch: String,
}

/// What the pusher tells the daemon. Messages never contain the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushEvent {
    /// An attempt started.
    Started,
    /// The remote branch now holds `oid`.
    Pushed {
        /// The commit the remote branch now holds.
        oid: git2::Oid,
        /// When the server confirmed it.
        at: SystemTime,
    },
    /// An attempt failed; the next one starts after `retry_in`.
    Failed {
        /// What went wrong, for people, with what the next attempt does.
        error: String,
        /// Which kind of failure it was.
        kind: FailureKind,
        /// The wait before the next attempt.
        retry_in: Duration,
    },
    /// The remote moved on: the local commits went to `recovery_ref` instead.
    Diverged {
        /// The remote branch the local commits went to.
        recovery_ref: String,
    },
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
    /// Pushes `head` to `dst` (a full ref name) without force, with a pack of `pack`'s kind.
    fn push(&self, head: Oid, dst: &str, pack: Pack) -> Result<(), PushFailure>;
    /// Makes a remote an earlier version left incomplete whole again, where that can be
    /// found out cheaply (a path remote); called once when the pusher starts.
    fn repair(&self) -> Result<(), PushFailure> {
        Ok(())
    }
    /// Fetches the remote `branch` and returns its tip.
    fn fetch_branch_tip(&self, branch: &str) -> Result<Oid, PushFailure>;
    /// Whether `head` is `tip` or has it in its history.
    fn contains(&self, head: Oid, tip: Oid) -> bool;
    /// The tip of the local `branch`, if it exists.
    fn local_head(&self, branch: &str) -> Option<Oid>;
    /// The checked-out branch's tip when its remote-tracking ref does not hold it.
    fn unpushed_head(&self) -> Option<Head>;
}

/// One push of `head` to `dst` (a full ref name), without retries or force: `sync` sends its
/// backups this way. A pack refused for missing objects is followed at once by a larger one.
/// The error is a message for people (no token, no URL credentials).
pub fn push_once(settings: &RemoteSettings, head: Oid, dst: &str) -> Result<(), String> {
    crate::transport::init(crate::transport::DEFAULT_NETWORK_TIMEOUT);
    let remote = GitRemote::new(settings.clone());
    let mut pack = Pack::Changes;
    loop {
        match remote.push(head, dst, pack) {
            Ok(()) => return Ok(()),
            Err(failure) => {
                let next = (failure.kind == FailureKind::MissingObjects)
                    .then(|| pack.larger())
                    .flatten();
                let message = refusal_words(&failure, next);
                match next {
                    Some(larger) => {
                        tracing::warn!("{message}");
                        pack = larger;
                    }
                    None => return Err(message),
                }
            }
        }
    }
}

/// A failure's message for the status and the log: for a pack refused for missing objects,
/// what is wrong first, then what the next attempt sends (`next`), or that even the largest
/// pack was refused.
pub(crate) fn refusal_words(failure: &PushFailure, next: Option<Pack>) -> String {
    if failure.kind != FailureKind::MissingObjects {
        return failure.message.clone();
    }
    let what = failure.kind.describe();
    match next {
        Some(pack) => format!("{what}; sending {} ({})", pack.describe(), failure.message),
        None => format!(
            "{what}, even for a pack of every object of the branch: a person has to look at the remote (README, \"A remote missing objects\") ({})",
            failure.message
        ),
    }
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
