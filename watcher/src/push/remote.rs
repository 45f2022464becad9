//! The push stage's side of the server: one push of a head to a ref (over HTTP(S) with
//! [`super::send_pack`], to a path in process with [`super::local`]), the fetch of the branch after a non-fast-forward, and
//! failure messages that say what happened and never carry a credential.

use std::path::PathBuf;

use git2::{Oid, Repository};

use super::send_pack::{self, SendError, Sent};
use super::{PushFailure, Remote, redact_url, url_userinfo};
use crate::lock::{self, WorkMarker};
use crate::remote::RemoteSettings;
use crate::retry::{self, FailureKind};
use crate::smart_http::SmartHttp;

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

    fn tracking_ref(&self) -> String {
        format!(
            "refs/remotes/{}/{}",
            self.settings.remote, self.settings.branch
        )
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

    /// A failed fetch or push, classified. A 401 with no token to send means the token is
    /// missing, not refused.
    fn network_failure(&self, url: &str, e: &git2::Error) -> PushFailure {
        let status = retry::http_status_in(e.message());
        let no_token = self.settings.token.is_none() && status == Some(401);
        let kind = retry::classify_git_error(e.code(), e.class(), e.message());
        PushFailure {
            kind,
            message: self.describe(kind, url, e.message(), no_token),
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
        match result {
            Ok(Sent::UpToDate) => Ok(()),
            Ok(Sent::Updated { objects }) => {
                tracing::debug!(objects, "pushed");
                Ok(())
            }
            Err(SendError::Transport(e)) => Err(self.network_failure(
                url,
                &git2::Error::new(
                    git2::ErrorCode::GenericError,
                    git2::ErrorClass::Net,
                    e.to_string(),
                ),
            )),
            Err(e) => {
                let kind = match &e {
                    SendError::NonFastForward { .. } => FailureKind::NonFastForward,
                    SendError::Refused { reason, .. } => retry::classify_ref_rejection(reason),
                    SendError::Unpack { .. } | SendError::Fatal(_) | SendError::Store { .. } => {
                        FailureKind::Server
                    }
                    SendError::Protocol(_) => FailureKind::Rejected,
                    SendError::Local(_) | SendError::Transport(_) => FailureKind::Local,
                };
                Err(PushFailure {
                    kind,
                    message: self.describe(kind, url, &e.to_string(), false),
                })
            }
        }
    }

    /// Records a confirmed push as `git push` does: each fetch refspec of the remote that
    /// matches `dst` names a remote-tracking ref (`refs/remotes/<remote>/recovery/...` for a
    /// recovery branch), and the branch's own tracking ref is always written. The daemon counts
    /// unpushed commits against it. The pusher writes only these confirmed facts, never the
    /// branch, index or tree, so it does not take repo.lock.
    fn record(&self, repo: &Repository, head: Oid, dst: &str) -> Result<(), PushFailure> {
        let mut tracking: Vec<String> = self
            .find_remote(repo)?
            .refspecs()
            .filter(|spec| spec.direction() == git2::Direction::Fetch && spec.src_matches(dst))
            .filter_map(|spec| {
                let name = spec.transform(dst).ok()?;
                name.as_str().ok().map(str::to_owned)
            })
            .collect();
        if dst == format!("refs/heads/{}", self.settings.branch) {
            tracking.push(self.tracking_ref());
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

    /// A failure message that says what happened and what to do.
    fn describe(&self, kind: FailureKind, url: &str, detail: &str, no_token: bool) -> String {
        let remote = &self.settings.remote;
        let at = redact_url(url);
        let text = match kind {
            FailureKind::Auth if no_token => format!(
                "remote `{remote}` ({at}) asks for credentials and PROJECT_TOKEN is not set"
            ),
            FailureKind::Auth if retry::http_status_in(detail) == Some(403) => format!(
                "remote `{remote}` ({at}) denied access (HTTP 403): PROJECT_TOKEN may not push to this repository"
            ),
            FailureKind::Auth => format!(
                "remote `{remote}` ({at}) refused PROJECT_TOKEN (HTTP 401, authentication failed): check the token"
            ),
            FailureKind::Server => {
                format!("remote `{remote}` ({at}) had a server error: {detail}")
            }
            FailureKind::Network => format!("cannot reach remote `{remote}` ({at}): {detail}"),
            FailureKind::Rejected | FailureKind::NonFastForward | FailureKind::Local => {
                format!("push to remote `{remote}` ({at}) failed: {detail}")
            }
        };
        self.scrub(&text, url)
    }
}

impl Remote for GitRemote {
    fn push(&self, head: Oid, dst: &str) -> Result<(), PushFailure> {
        let repo = self.open()?;
        let _marker = self.begin(&repo);
        let remote = self.find_remote(&repo)?;
        let url = remote
            .pushurl()
            .ok()
            .flatten()
            .or_else(|| remote.url().ok())
            .unwrap_or("")
            .to_owned();
        if is_http(&url) {
            let http = SmartHttp::new(
                &crate::transport::client_settings(),
                self.settings.token.clone(),
            );
            let result = send_pack::send(&repo, &mut send_pack::Http::new(&http, &url), head, dst);
            self.sent(&url, result)?;
        } else {
            let result = super::local::push(&repo, &self.local_path(&url), head, dst);
            self.sent(&url, result)?;
        }
        self.record(&repo, head, dst)
    }

    fn fetch_branch_tip(&self) -> Result<Oid, PushFailure> {
        let repo = self.open()?;
        let _marker = self.begin(&repo);
        let url = self.find_remote(&repo)?.url().unwrap_or("").to_owned();
        let tip = crate::restore::fetch_branch(&repo, &self.settings).map_err(|e| match e {
            crate::restore::RestoreError::Fetch { source, .. } => {
                self.network_failure(&url, &source)
            }
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

    fn local_head(&self) -> Option<Oid> {
        let repo = self.open().ok()?;
        repo.refname_to_id(&format!("refs/heads/{}", self.settings.branch))
            .ok()
    }

    fn unpushed_head(&self) -> Option<Oid> {
        let local = self.local_head()?;
        let repo = self.open().ok()?;
        let tracking = repo.refname_to_id(&self.tracking_ref()).ok();
        (tracking != Some(local)).then_some(local)
    }

    fn branch(&self) -> &str {
        &self.settings.branch
    }
}
