//! Where the proxy forwards to: the [`Upstream`] seam, and [`HttpUpstream`], a smart-HTTP git
//! server reached over the network with the service credentials (GitLab in production).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use futures_util::TryStreamExt;
use futures_util::future::BoxFuture;
use http::{HeaderMap, Response};
use secrecy::{ExposeSecret, SecretString};
use tokio::time::Instant;

use super::route::Endpoint;
use crate::user::UserId;

/// One request to forward, already authenticated and stripped of the client's credentials.
pub struct UpstreamRequest {
    /// The token's owner: the only input that chooses the repository.
    pub user: UserId,
    /// Which of the three smart-HTTP endpoints.
    pub endpoint: Endpoint,
    /// The client's headers that may cross (content type and encoding, length, accept,
    /// user agent, git protocol); never its credentials or cookies.
    pub headers: HeaderMap,
    /// Streams; never collected.
    pub body: Body,
}

/// Why forwarding failed. The messages name no secret; they may name internal hosts, so they
/// go to the log, and clients get [`UpstreamError::public_message`].
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// No connection to the upstream (502).
    #[error("the upstream git server could not be reached: {0}")]
    Unreachable(String),
    /// The upstream did not answer in time (504).
    #[error("the upstream git server did not answer in time")]
    Timeout,
    /// The user's repository could not be found or made (502).
    #[error("the upstream repository for this user could not be prepared: {0}")]
    Repository(String),
    /// Anything else the upstream did wrong (502).
    #[error("the upstream git server failed: {0}")]
    Failed(String),
    /// The service credentials were refused and are held back (503).
    #[error(
        "the upstream rejected the proxy's service credentials; they are not sent again for {retry_after:?} (fix GITLAB_SERVICE_TOKEN and restart serve)"
    )]
    CredentialsRejected {
        /// How long until one request may try them again.
        retry_after: Duration,
    },
}

impl UpstreamError {
    /// What failed, for the client: no host, URL or upstream text.
    pub fn public_message(&self) -> &'static str {
        match self {
            UpstreamError::Unreachable(_) => "the upstream git server could not be reached",
            UpstreamError::Timeout => "the upstream git server did not answer in time",
            UpstreamError::Repository(_) => {
                "the upstream repository for this user could not be prepared"
            }
            UpstreamError::Failed(_) => "the upstream git server failed",
            UpstreamError::CredentialsRejected { .. } => {
                "the git service is unavailable: the upstream rejected the proxy's credentials, and an operator must fix them"
            }
        }
    }
}

/// A git smart-HTTP server the proxy forwards to.
pub trait Upstream: Send + Sync + 'static {
    /// Sends `request` to `request.user`'s repository and returns the response unread, so its
    /// body streams to the client.
    fn forward(
        &self,
        request: UpstreamRequest,
    ) -> BoxFuture<'_, Result<Response<Body>, UpstreamError>>;

    /// Whether the upstream can be used now; the reason when it cannot (for `/healthz`).
    fn health(&self) -> Result<(), String> {
        Ok(())
    }
}

/// How long the git path leaves rejected service credentials alone before one request may
/// try them again. GitLab bans an IP after 30 failed logins in 3 minutes.
pub const CREDENTIAL_RETRY: Duration = Duration::from_secs(15 * 60);

/// After the upstream answered 401, the credentials are not sent again until `retry_every`
/// has passed; then exactly one request tries them (and latches again if they still fail).
#[derive(Debug)]
pub struct CredentialLatch {
    retry_every: Duration,
    rejected_at: Mutex<Option<Instant>>,
}

impl CredentialLatch {
    pub fn new(retry_every: Duration) -> CredentialLatch {
        CredentialLatch {
            retry_every,
            rejected_at: Mutex::new(None),
        }
    }

    /// `Ok` when a request may carry the credentials now. Taking the one retry slot counts as
    /// a new rejection until [`CredentialLatch::accepted`] clears it.
    pub fn admit(&self) -> Result<(), UpstreamError> {
        let mut rejected_at = self.lock();
        match *rejected_at {
            None => Ok(()),
            Some(at) if at.elapsed() >= self.retry_every => {
                *rejected_at = Some(Instant::now());
                Ok(())
            }
            Some(at) => Err(UpstreamError::CredentialsRejected {
                retry_after: self.retry_every.saturating_sub(at.elapsed()),
            }),
        }
    }

    pub fn rejected(&self) {
        *self.lock() = Some(Instant::now());
    }

    pub fn accepted(&self) {
        *self.lock() = None;
    }

    pub fn state(&self) -> Result<(), String> {
        match *self.lock() {
            None => Ok(()),
            Some(at) => Err(format!(
                "the upstream rejected the service credentials {}s ago; they are not sent again for {}s (fix GITLAB_SERVICE_TOKEN and restart serve)",
                at.elapsed().as_secs(),
                self.retry_every.saturating_sub(at.elapsed()).as_secs()
            )),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.rejected_at.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Finds (and if need be creates) the clone URL of a user's repository.
pub trait RepoLocator: Send + Sync + 'static {
    /// The clone URL of `user`'s repository (`https://host/group/alice.git`).
    fn repo_url(&self, user: &UserId) -> BoxFuture<'_, Result<String, UpstreamError>>;

    /// The upstream answered 404 for `user`'s repository: a remembered location is stale.
    fn forget(&self, _user: &UserId) {}
}

/// A locator for servers that lay repositories out as `<base>/<user>.git`.
pub struct RepoPerUser {
    /// The URL the repositories are under.
    pub base_url: String,
}

impl RepoLocator for RepoPerUser {
    fn repo_url(&self, user: &UserId) -> BoxFuture<'_, Result<String, UpstreamError>> {
        let url = format!("{}/{user}.git", self.base_url.trim_end_matches('/'));
        Box::pin(async move { Ok(url) })
    }
}

/// A remote smart-HTTP server, authenticated with basic auth (for GitLab: username `oauth2`,
/// the service token as password).
pub struct HttpUpstream {
    client: reqwest::Client,
    locator: Arc<dyn RepoLocator>,
    username: String,
    password: SecretString,
    latch: CredentialLatch,
}

impl HttpUpstream {
    /// Forwards to where `locator` says, with `username` and `password` as basic auth.
    pub fn new(
        locator: Arc<dyn RepoLocator>,
        username: impl Into<String>,
        password: SecretString,
    ) -> Result<HttpUpstream, UpstreamError> {
        let client = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(10))
            // A redirect would carry the service credentials to a host the locator never named.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| UpstreamError::Failed(e.to_string()))?;
        Ok(HttpUpstream {
            client,
            locator,
            username: username.into(),
            password,
            latch: CredentialLatch::new(CREDENTIAL_RETRY),
        })
    }
}

impl Upstream for HttpUpstream {
    fn forward(
        &self,
        request: UpstreamRequest,
    ) -> BoxFuture<'_, Result<Response<Body>, UpstreamError>> {
        Box::pin(async move {
            self.latch.admit()?;
            let repo = match self.locator.repo_url(&request.user).await {
                Err(UpstreamError::CredentialsRejected { .. }) => {
                    self.latch.rejected();
                    return Err(self.latch.admit().expect_err("just latched"));
                }
                other => other?,
            };
            let url = format!("{repo}/{}", request.endpoint.path_and_query());
            let mut builder = self
                .client
                .request(request.endpoint.method(), url)
                .headers(request.headers)
                .basic_auth(&self.username, Some(self.password.expose_secret()));
            if request.endpoint.method() == http::Method::POST {
                builder = builder.body(reqwest::Body::wrap_stream(request.body.into_data_stream()));
            }
            let response = builder.send().await.map_err(describe)?;
            if response.status() == http::StatusCode::UNAUTHORIZED {
                self.latch.rejected();
                tracing::error!(user = %request.user, "the upstream rejected the service credentials (401); not sending them again for a while");
                return Err(self.latch.admit().expect_err("just latched"));
            }
            self.latch.accepted();
            if response.status() == http::StatusCode::NOT_FOUND {
                self.locator.forget(&request.user);
            }
            let mut out = Response::builder().status(response.status());
            if let Some(headers) = out.headers_mut() {
                *headers = response.headers().clone();
            }
            let body = Body::from_stream(response.bytes_stream().map_err(describe));
            out.body(body)
                .map_err(|e| UpstreamError::Failed(e.to_string()))
        })
    }

    fn health(&self) -> Result<(), String> {
        self.latch.state()
    }
}

/// reqwest's errors name the URL; ours carry no credentials, so the text is safe to show.
fn describe(e: reqwest::Error) -> UpstreamError {
    let text = std::error::Error::source(&e)
        .map(|s| format!("{e}: {s}"))
        .unwrap_or_else(|| e.to_string());
    if e.is_timeout() {
        UpstreamError::Timeout
    } else if e.is_connect() {
        UpstreamError::Unreachable(text)
    } else {
        UpstreamError::Failed(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn rejected_credentials_are_tried_once_per_retry_period() {
        let latch = CredentialLatch::new(Duration::from_secs(900));
        assert!(latch.admit().is_ok() && latch.state().is_ok());
        latch.rejected();
        for _ in 0..35 {
            assert!(matches!(
                latch.admit(),
                Err(UpstreamError::CredentialsRejected { .. })
            ));
        }
        assert!(latch.state().is_err());
        tokio::time::advance(Duration::from_secs(899)).await;
        assert!(latch.admit().is_err());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(latch.admit().is_ok(), "one request may try again");
        assert!(latch.admit().is_err(), "and only one");
        latch.accepted();
        assert!(latch.admit().is_ok() && latch.admit().is_ok());
        assert!(latch.state().is_ok());
    }
}
