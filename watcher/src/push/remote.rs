//! The push stage's side of the server: one push of a head to a ref (over HTTP(S) with
//! [`super::send_pack`], to a path in process with [`super::local`]), the fetch of the branch
//! after a non-fast-forward, the repair of a path remote an earlier version left incomplete,
//! and failure messages that say what happened and never carry a credential.
//!
//! A failure's class comes from values: the [`SendError`] variant, the [`HttpStatus`] inside a
//! transport error (the status and which credentials the request carried). Only the fetch,
//! which goes through libgit2, is classified from its error's text.

use std::path::PathBuf;

use git2::{Oid, Repository};

use super::objects::Pack;
use super::send_pack::{self, SendError, Sent};
use super::{Head, PushFailure, Remote, redact_url, url_userinfo};
use crate::lock::{self, WorkMarker};
use crate::remote::RemoteSettings;
use crate::retry::{self, FailureKind};
use crate::smart_http::{self, HttpStatus, SmartHttp};

/// The real remote: the repository's configured remote.
pub(crate) struct GitRemote {
    settings: RemoteSettings,
}

/// Whether `url` is a smart-HTTP remote (any other is a repository on this machine).
fn is_http(url: &str) -> bool {
    let lower = url.to_ascii_lowercase();
    lower.starts_with("http://") || lower.starts_with("https://")
}

impl GitRemote {
    pub(crate) fn new(settings: RemoteSettings) -> Self {
        Self { settings }
    }

    fn open(&self) -> Result<Repository, PushFailure> {
        Repository::open(&self.settings.workdir).map_err(|e| PushFailure {
            kind: FailureKind::Local,
            message: format!(
                "cannot open the repository at {}: {}",
                self.settings.workdir.display(),
                e.message()
            ),
        })
    }

    fn find_remote<'r>(&self, repo: &'r Repository) -> Result<git2::Remote<'r>, PushFailure> {
        repo.find_remote(&self.settings.remote)
            .map_err(|e| PushFailure {
                kind: FailureKind::Local,
                message: format!(
                    "no usable remote named `{}`: {}",
                    self.settings.remote,
                    e.message()
                ),
            })
    }

    /// Clears the lock files under `refs/remotes/` that libgit2 or this pusher left when a
    /// watcher was killed while recording a push or a fetch (they would fail every later
    /// attempt), then marks the network operation as started.
    fn begin(&self, repo: &Repository) -> Option<WorkMarker> {
        let git_dir = repo.path();
        let died = WorkMarker::left_behind(git_dir, WorkMarker::PUSHING);
        lock::clear_stale_locks(lock::remote_ref_lock_files(git_dir), died);
        WorkMarker::begin(git_dir, WorkMarker::PUSHING).ok()
    }

    fn tracking_ref(&self, branch: &str) -> String {
        format!("refs/remotes/{}/{branch}", self.settings.remote)
    }

    /// Removes secrets from a message that may quote libgit2 or the server.
    fn scrub(&self, message: &str, url: &str) -> String {
        let mut text = message.replace(url, &redact_url(url));
        // The secret part of `user:secret@` (or a bare token used as the user name), wherever
        // libgit2 or the server quoted it; too short a string would mangle ordinary words.
        let secret = url_userinfo(url).map(|u| u.split_once(':').map_or(u, |(_, pw)| pw));
        if let Some(secret) = secret.filter(|s| s.len() >= 6) {
            text = text.replace(secret, "***");
        }
        if let Some(token) = self.settings.token.as_deref().filter(|t| !t.is_empty()) {
            text = text.replace(token, "[redacted]");
        }
        text
    }

    /// A failed fetch, classified. libgit2 keeps only its transport's error text, so the HTTP
    /// status is read back from it here; which credentials were sent comes from the settings.
    fn fetch_failure(&self, url: &str, e: &git2::Error) -> PushFailure {
        let kind = retry::classify_git_error(e.code(), e.class(), e.message());
        let http = retry::http_status_in(e.message()).map(|status| HttpStatus {
            status,
            sent: smart_http::Sent::for_remote(url, self.settings.token.as_deref()),
        });
        PushFailure {
            kind,
            message: self.describe(kind, url, e.message(), http),
        }
    }

    /// The repository directory a path or `file://` remote names; a relative path is taken
    /// from the project directory, where a person typing `git push` would be.
    fn local_path(&self, url: &str) -> PathBuf {
        let path = match url.strip_prefix("file://") {
            Some(rest) => PathBuf::from(
                percent_encoding::percent_decode_str(rest)
                    .decode_utf8_lossy()
                    .into_owned(),
            ),
            None => PathBuf::from(url),
        };
        self.settings.workdir.join(path)
    }

    /// The outcome of a push made with the watcher's own receive-pack client.
    fn sent(&self, url: &str, result: Result<Sent, SendError>) -> Result<(), PushFailure> {
        let e = match result {
            Ok(Sent::UpToDate) => return Ok(()),
            Ok(Sent::Updated { objects }) => {
                tracing::debug!(objects, "pushed");
                return Ok(());
            }
            Err(e) => e,
        };
        let http = match &e {
            SendError::Transport(io) => HttpStatus::of(io),
            _ => None,
        };
        let kind = match &e {
            SendError::Transport(_) => http.map_or(FailureKind::Network, |h| {
                FailureKind::of_http_status(h.status)
            }),
            SendError::NonFastForward { .. } => FailureKind::NonFastForward,
            SendError::Refused { reason, .. } => retry::classify_ref_rejection(reason),
            SendError::Unpack { .. } | SendError::Incomplete { .. } => FailureKind::MissingObjects,
            SendError::Fatal(_) | SendError::Store { .. } => FailureKind::Server,
            SendError::Protocol(_) => FailureKind::Rejected,
            SendError::Local(_) => FailureKind::Local,
        };
        Err(PushFailure {
            kind,
            message: self.describe(kind, url, &e.to_string(), http),
        })
    }

    /// Records a confirmed push as `git push` does: each fetch refspec of the remote that
    /// matches `dst` names a remote-tracking ref (`refs/remotes/<remote>/recovery/...` for a
    /// recovery branch), and a branch's own tracking ref (`refs/remotes/<remote>/<branch>`)
    /// is always written. The daemon counts
    /// unpushed commits against it. The pusher writes only these confirmed facts, never the
    /// branch, index or tree, so it does not take repo.lock.
    fn record(&self, repo: &Repository, head: Oid, dst: &str) -> Result<(), PushFailure> {
        // libgit2 makes a ref's missing folders, `.git` included: a project removed during the
        // push would come back as a `.git` holding one ref, which no one could clone into.
        // (git's own markers only: a repository the pusher is lent may have no state folder.)
        let common = repo.commondir();
        if !repo.path().join("HEAD").exists() || !common.join("refs").is_dir() {
            return Err(PushFailure {
                kind: FailureKind::Local,
                message: "pushed, but the repository is gone: nothing recorded".into(),
            });
        }
        let mut tracking: Vec<String> = self
            .find_remote(repo)?
            .refspecs()
            .filter(|spec| spec.direction() == git2::Direction::Fetch && spec.src_matches(dst))
            .filter_map(|spec| {
                let name = spec.transform(dst).ok()?;
                name.as_str().ok().map(str::to_owned)
            })
            .collect();
        if let Some(branch) = dst.strip_prefix("refs/heads/")
            && !branch.starts_with("recovery/")
        {
            tracking.push(self.tracking_ref(branch));
        }
        tracking.dedup();
        for name in tracking {
            repo.reference(&name, head, true, "project-watcher: push")
                .map_err(|e| PushFailure {
                    kind: FailureKind::Local,
                    message: format!("pushed, but cannot record it locally: {}", e.message()),
                })?;
        }
        Ok(())
    }

    /// A failure message that says what happened and what to do; `http` is the status the
    /// server answered with, if that is the failure.
    fn describe(
        &self,
        kind: FailureKind,
        url: &str,
        detail: &str,
        http: Option<HttpStatus>,
    ) -> String {
        let remote = &self.settings.remote;
        let at = redact_url(url);
        let text = match (kind, http) {
            (
                FailureKind::Auth,
                Some(HttpStatus {
                    status: 401,
                    sent: smart_http::Sent::Nothing,
                }),
            ) => format!(
                "remote `{remote}` ({at}) asks for credentials and PROJECT_TOKEN is not set"
            ),
            (
                FailureKind::Auth,
                Some(HttpStatus {
                    status: 401,
                    sent: smart_http::Sent::UrlCredentials,
                }),
            ) => format!(
                "remote `{remote}` ({at}) refused the credentials in its URL (HTTP 401, authentication failed): check them"
            ),
            (FailureKind::Auth, Some(HttpStatus { status: 403, .. })) => format!(
                "remote `{remote}` ({at}) denied access (HTTP 403): PROJECT_TOKEN may not push to this repository"
            ),
            (FailureKind::Auth, _) => format!(
                "remote `{remote}` ({at}) refused PROJECT_TOKEN (HTTP 401, authentication failed): check the token"
            ),
            (FailureKind::Server, _) => {
                format!("remote `{remote}` ({at}) had a server error: {detail}")
            }
            (FailureKind::Network, _) => format!("cannot reach remote `{remote}` ({at}): {detail}"),
            (
                FailureKind::Rejected
                | FailureKind::MissingObjects
                | FailureKind::NonFastForward
                | FailureKind::Local,
                _,
            ) => {
                format!("push to remote `{remote}` ({at}) failed: {detail}")
            }
        };
        self.scrub(&text, url)
    }

    /// The remote's push URL, else its URL.
    fn push_url(&self, repo: &Repository) -> Result<String, PushFailure> {
        let remote = self.find_remote(repo)?;
        Ok(remote
            .pushurl()
            .ok()
            .flatten()
            .or_else(|| remote.url().ok())
            .unwrap_or("")
            .to_owned())
    }
}

impl Remote for GitRemote {
    fn push(&self, head: Oid, dst: &str, pack: Pack) -> Result<(), PushFailure> {
        let repo = self.open()?;
        let _marker = self.begin(&repo);
        let url = self.push_url(&repo)?;
        if is_http(&url) {
            let http = SmartHttp::new(
                &crate::transport::client_settings(),
                self.settings.token.clone(),
            );
            let mut conversation = send_pack::Http::new(&http, &url);
            let result = send_pack::send(&repo, &mut conversation, head, dst, pack);
            self.sent(&url, result)?;
        } else {
            let result = super::local::push(&repo, &self.local_path(&url), head, dst, pack);
            self.sent(&url, result)?;
        }
        self.record(&repo, head, dst)
    }

    /// A path remote is audited and repaired ([`super::local::repair`]). Over HTTP nothing is
    /// done: receive-pack refuses a push that would leave its repository incomplete, so no
    /// watcher could have left one so; one made incomplete some other way refuses the push
    /// that needs what it lacks, and the refusal makes the next attempts send a larger pack.
    /// The one way to ask an HTTP server whether it holds every object is to download them
    /// all (an `upload-pack` of the whole history), a cost not worth paying at every start.
    fn repair(&self) -> Result<(), PushFailure> {
        let repo = self.open()?;
        let url = self.push_url(&repo)?;
        if is_http(&url) {
            return Ok(());
        }
        let repaired = super::local::repair(&repo, &self.local_path(&url));
        self.sent(&url, repaired.map(|_| Sent::UpToDate))
    }

    fn fetch_branch_tip(&self, branch: &str) -> Result<Oid, PushFailure> {
        let repo = self.open()?;
        let _marker = self.begin(&repo);
        let url = self.find_remote(&repo)?.url().unwrap_or("").to_owned();
        let settings = RemoteSettings {
            branch: branch.to_owned(),
            ..self.settings.clone()
        };
        let tip = crate::restore::fetch_branch(&repo, &settings).map_err(|e| match e {
            crate::restore::RestoreError::Fetch { source, .. } => self.fetch_failure(&url, &source),
            other => PushFailure {
                kind: FailureKind::Local,
                message: other.to_string(),
            },
        })?;
        tip.ok_or_else(|| PushFailure {
            kind: FailureKind::Local,
            message: "the remote branch vanished after a rejected push".to_owned(),
        })
    }

    fn contains(&self, head: Oid, tip: Oid) -> bool {
        head == tip
            || self
                .open()
                .ok()
                .and_then(|repo| repo.graph_descendant_of(head, tip).ok())
                .unwrap_or(false)
    }

    fn local_head(&self, branch: &str) -> Option<Oid> {
        let repo = self.open().ok()?;
        repo.refname_to_id(&format!("refs/heads/{branch}")).ok()
    }

    fn unpushed_head(&self) -> Option<Head> {
        let repo = self.open().ok()?;
        let head = repo.head().ok().filter(|h| h.is_branch())?;
        let branch = head.shorthand().ok()?.to_owned();
        let local = head.target()?;
        let tracking = repo.refname_to_id(&self.tracking_ref(&branch)).ok();
        (tracking != Some(local)).then_some(Head { oid: local, branch })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::smart_http::Sent as Carried;

    fn remote(token: Option<&str>) -> GitRemote {
        GitRemote::new(RemoteSettings {
            workdir: PathBuf::from("/nowhere"),
            remote: "project".into(),
            branch: "main".into(),
            token: token.map(str::to_owned),
        })
    }

    #[test]
    fn an_auth_failure_is_worded_from_the_status_and_what_the_request_carried() {
        let url = "https://h.example/r.git";
        let said = |token, status, sent| {
            let http = HttpStatus { status, sent };
            remote(token).describe(FailureKind::Auth, url, &http.to_string(), Some(http))
        };
        assert!(
            said(None, 401, Carried::Nothing)
                .contains("asks for credentials and PROJECT_TOKEN is not set")
        );
        assert!(
            said(Some("t0ken-value"), 401, Carried::Token)
                .contains("refused PROJECT_TOKEN (HTTP 401")
        );
        // No token, but the URL carried credentials: those were refused, not a missing token.
        assert!(
            said(None, 401, Carried::UrlCredentials)
                .contains("refused the credentials in its URL (HTTP 401")
        );
        assert!(
            said(Some("t0ken-value"), 403, Carried::Token).contains("denied access (HTTP 403)")
        );
    }

    #[test]
    fn a_transport_failure_is_classified_from_the_status_it_holds() {
        let r = remote(Some("t0ken-value"));
        let url = "https://h.example/r.git";
        let failure =
            |error: std::io::Error| r.sent(url, Err(SendError::Transport(error))).unwrap_err();
        let status = |status| {
            std::io::Error::other(HttpStatus {
                status,
                sent: Carried::Token,
            })
        };
        assert_eq!(failure(status(503)).kind, FailureKind::Server);
        assert_eq!(failure(status(401)).kind, FailureKind::Auth);
        assert_eq!(failure(status(404)).kind, FailureKind::Rejected);
        // Words alone decide nothing: a message that looks like a status is a network error.
        let lookalike = std::io::Error::other("unexpected http status code: 401");
        assert_eq!(failure(lookalike).kind, FailureKind::Network);
        let timeout = std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out");
        assert_eq!(failure(timeout).kind, FailureKind::Network);
        assert_eq!(
            r.sent(
                url,
                Err(SendError::Refused {
                    refname: "refs/heads/main".into(),
                    reason: "missing necessary objects".into(),
                    said: String::new(),
                })
            )
            .unwrap_err()
            .kind,
            FailureKind::MissingObjects
        );
        assert_eq!(
            r.sent(
                url,
                Err(SendError::Unpack {
                    said: "index-pack abnormal exit".into()
                })
            )
            .unwrap_err()
            .kind,
            FailureKind::MissingObjects
        );
    }
}
