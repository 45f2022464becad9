//! The git smart-HTTP proxy at `/api/git`: authenticates a project token, forwards to the
//! token owner's upstream repository with the service credentials, and reports external pushes.
//!
//! Mount [`Proxy::router`] with `Router::nest("/api/git", ...)`. Every request passes, in
//! order: `route::classify` (404), the token (401, answered here), the path's repository
//! name agreeing with the token (403), the size limit (413); only then is the upstream called.

pub(crate) mod events;
pub(crate) mod headers;
pub(crate) mod push_watch;
pub(crate) mod route;
pub(crate) mod stream;
pub(crate) mod upstream;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use futures_util::StreamExt as _;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};

use crate::admission::{Admission, Admitted, Busy};
use crate::client::client_of;
use crate::event::OnExternalPush;
use crate::token::{TokenRefusal, TokenSigner};
use crate::user::UserId;
use events::RecentPushes;
use push_watch::PushWatch;
use route::{Endpoint, Service};
use stream::ReadProgress;
use upstream::{Upstream, UpstreamError, UpstreamRequest};

/// Bounds on one proxied request.
#[derive(Debug, Clone)]
pub struct ProxyLimits {
    /// Largest request body (a push's pack); beyond it the request fails with 413.
    pub max_request_bytes: u64,
    /// How long the upstream may take to start its response once it has the whole request
    /// (the upload of a large pack does not count against it; the idle timeout covers that).
    pub upstream_timeout: Duration,
    /// Longest silence within a body, either direction.
    pub idle_timeout: Duration,
    /// Requests one user may have in flight; past it, 429 with `Retry-After`.
    pub max_requests_per_user: usize,
    /// Requests in flight for everyone together; past it, 503 with `Retry-After`.
    pub max_requests: usize,
}

impl Default for ProxyLimits {
    fn default() -> Self {
        ProxyLimits {
            max_request_bytes: 1 << 30,
            upstream_timeout: Duration::from_secs(300),
            idle_timeout: Duration::from_secs(120),
            max_requests_per_user: 8,
            max_requests: 64,
        }
    }
}

/// Seconds a client is asked to wait when the proxy is at its request limits.
const BUSY_RETRY_AFTER_SECS: u64 = 5;

/// The proxy's state, shared by every request.
pub struct Proxy {
    signer: TokenSigner,
    upstream: Arc<dyn Upstream>,
    limits: ProxyLimits,
    in_flight: Arc<Admission>,
    recent: Arc<RecentPushes>,
    on_external_push: OnExternalPush,
}

impl Proxy {
    /// A proxy verifying tokens with `signer`, forwarding to `upstream` within `limits`, and
    /// calling `on_external_push` for every branch update pushed by anyone but a watcher.
    pub fn new(
        signer: TokenSigner,
        upstream: Arc<dyn Upstream>,
        limits: ProxyLimits,
        on_external_push: OnExternalPush,
    ) -> Arc<Proxy> {
        Arc::new(Proxy {
            signer,
            upstream,
            in_flight: Arc::new(Admission::new(
                limits.max_requests,
                limits.max_requests_per_user,
            )),
            limits,
            recent: Arc::default(),
            on_external_push,
        })
    }

    /// Every push the proxy forwarded lately, for the webhook's de-duplication.
    pub fn recent_pushes(&self) -> Arc<RecentPushes> {
        self.recent.clone()
    }

    /// Whether the upstream can be used; the reason when not (for `/healthz`).
    pub fn health(&self) -> Result<(), String> {
        self.upstream.health()
    }

    /// The proxy as a router that handles every path below its mount point.
    pub fn router(self: &Arc<Self>) -> Router {
        Router::new().fallback(handle).with_state(Arc::clone(self))
    }
}

async fn handle(State(proxy): State<Arc<Proxy>>, request: Request) -> Response {
    let started = Instant::now();
    let client = client_of(&request);
    let (parts, body) = request.into_parts();
    let Some(route) = route::classify(&parts.method, parts.uri.path(), parts.uri.query()) else {
        tracing::info!(%client, status = 404, "not a git smart-HTTP endpoint");
        return answer(StatusCode::NOT_FOUND, "not a git smart-HTTP endpoint");
    };
    let user = match authenticate(&proxy.signer, &parts.headers) {
        Ok(user) => user,
        Err(TokenRefusal::Unavailable(why)) => {
            tracing::warn!(%client, status = 503, reason = %why, "git request refused: the token state cannot be trusted now");
            let mut response = answer(
                StatusCode::SERVICE_UNAVAILABLE,
                "project tokens cannot be checked on this server right now (its database does not answer); try again",
            );
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from(BUSY_RETRY_AFTER_SECS),
            );
            return response;
        }
        Err(TokenRefusal::Invalid) => {
            tracing::info!(%client, status = 401, "git request without a valid project token");
            let mut response = answer(
                StatusCode::UNAUTHORIZED,
                "a valid project token is required",
            );
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"shmastra git\""),
            );
            return response;
        }
    };
    if !route.names_repo_of(&user) {
        tracing::warn!(%client, %user, status = 403, "git request naming another user's repository");
        return answer(
            StatusCode::FORBIDDEN,
            "this project token does not grant access to that repository",
        );
    }
    let limit = proxy.limits.max_request_bytes;
    if content_length(&parts.headers).is_some_and(|len| len > limit) {
        tracing::warn!(%client, %user, status = 413, "git request body over the limit");
        return too_large(limit);
    }
    let endpoint = route.endpoint;
    // git never compresses a push; a compressed one would inflate past the size limit inside
    // the upstream and hide its commands from push detection.
    if endpoint == Endpoint::Rpc(Service::ReceivePack) && is_encoded(&parts.headers) {
        tracing::warn!(%client, %user, status = 415, "compressed push body refused");
        return answer(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "compressed push bodies are not accepted (git sends packs uncompressed)",
        );
    }
    let permit = match proxy.in_flight.admit(&user) {
        Ok(permit) => permit,
        Err(busy) => {
            let (status, message) = match busy {
                Busy::User => (
                    StatusCode::TOO_MANY_REQUESTS,
                    format!(
                        "too many git requests in flight for this user (limit {})",
                        proxy.limits.max_requests_per_user
                    ),
                ),
                Busy::Total => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!(
                        "the proxy is at its limit of {} git requests in flight",
                        proxy.limits.max_requests
                    ),
                ),
            };
            tracing::warn!(%client, %user, status = status.as_u16(), "git request refused: too many in flight");
            let mut response = answer(status, &message);
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from(BUSY_RETRY_AFTER_SECS),
            );
            return response;
        }
    };

    let watch = (endpoint == Endpoint::Rpc(Service::ReceivePack)).then(|| {
        let agent = parts
            .headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        PushWatch::new(
            user.clone(),
            agent,
            proxy.recent.clone(),
            proxy.on_external_push.clone(),
        )
    });
    let signals = BodySignals::new(endpoint);
    let body = signals.guard(body, &parts.headers, &proxy.limits, watch.clone());
    let request = UpstreamRequest {
        user: user.clone(),
        endpoint,
        headers: headers::to_upstream(&parts.headers),
        body,
    };
    // Its own task: when a pushing client hangs up, the push may still land upstream, and its
    // report must still be read (dropping a JoinHandle does not cancel the task).
    let progress = signals.progress.clone();
    let exchange = tokio::spawn(exchange(proxy.clone(), request, progress, watch, permit));
    let outcome = exchange
        .await
        .unwrap_or_else(|e| Err(UpstreamError::Failed(format!("proxy task failed: {e}"))));
    let service = endpoint.service().name();
    let endpoint_path = endpoint.service_path();
    let elapsed_ms = started.elapsed().as_millis() as u64;
    if signals.too_large() {
        tracing::warn!(%client, %user, status = 413, "git request body over the limit");
        return too_large(limit);
    }
    if signals.client_stalled(&outcome) {
        tracing::warn!(%client, %user, service, "the client stopped sending its request body");
        return answer(
            StatusCode::REQUEST_TIMEOUT,
            &format!(
                "the request body stalled for {:?}",
                proxy.limits.idle_timeout
            ),
        );
    }
    let response = match outcome {
        Ok(response) => response,
        Err(error) => {
            let status = match error {
                UpstreamError::Timeout => StatusCode::GATEWAY_TIMEOUT,
                UpstreamError::CredentialsRejected { .. } => StatusCode::SERVICE_UNAVAILABLE,
                _ => StatusCode::BAD_GATEWAY,
            };
            tracing::error!(%client, %user, service, endpoint = endpoint_path, status = status.as_u16(), elapsed_ms, %error, "git request failed upstream");
            let mut response = answer(status, error.public_message());
            if let UpstreamError::CredentialsRejected { retry_after } = error {
                response.headers_mut().insert(
                    header::RETRY_AFTER,
                    HeaderValue::from(retry_after.as_secs().max(1)),
                );
            }
            return response;
        }
    };
    let status = response.status();
    if matches!(
        status,
        StatusCode::UNAUTHORIZED
            | StatusCode::FORBIDDEN
            | StatusCode::PROXY_AUTHENTICATION_REQUIRED
    ) {
        tracing::error!(%user, service, upstream_status = status.as_u16(), "upstream rejected the service credentials");
        return answer(
            StatusCode::BAD_GATEWAY,
            "the upstream git server rejected the proxy's service credentials",
        );
    }
    if status.is_server_error() {
        tracing::error!(%user, service, upstream_status = status.as_u16(), elapsed_ms, "upstream failed");
        return answer(
            StatusCode::BAD_GATEWAY,
            &format!("the upstream git server failed ({status})"),
        );
    }
    tracing::info!(%user, service, endpoint = endpoint_path, status = status.as_u16(), elapsed_ms, "git request forwarded");
    let (upstream_parts, body) = response.into_parts();
    let mut response = Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = headers::to_client(&upstream_parts.headers);
    response
}

/// Whether the body carries a content coding other than identity.
fn is_encoded(headers: &HeaderMap) -> bool {
    headers.get_all(header::CONTENT_ENCODING).iter().any(|v| {
        !v.to_str()
            .is_ok_and(|v| v.trim().eq_ignore_ascii_case("identity"))
    })
}

/// Sends `request` upstream and starts its response body on the way back. While the upstream
/// reads the request body it may take as long as the upload does, as long as it keeps reading;
/// once it has the body, `upstream_timeout` bounds its answer.
async fn exchange(
    proxy: Arc<Proxy>,
    request: UpstreamRequest,
    progress: Arc<ReadProgress>,
    watch: Option<Arc<PushWatch>>,
    admitted: Admitted,
) -> Result<Response<Body>, UpstreamError> {
    let forward = proxy.upstream.forward(request);
    tokio::pin!(forward);
    let response = loop {
        let patience = if progress.ended() {
            proxy.limits.upstream_timeout
        } else {
            proxy.limits.idle_timeout
        };
        tokio::select! {
            result = &mut forward => break result?,
            () = progress.changed() => {}
            () = tokio::time::sleep(patience) => return Err(UpstreamError::Timeout),
        }
    };
    let (parts, body) = response.into_parts();
    // The request counts as in flight until its response has been read.
    let body_stream = stream::idle_timeout(body.into_data_stream(), proxy.limits.idle_timeout).map(
        move |chunk| {
            let _counted = &admitted;
            chunk
        },
    );
    let body = match watch {
        Some(watch) if parts.status.is_success() => {
            Body::from_stream(stream::pumped(body_stream, watch.response_inspector()))
        }
        _ => Body::from_stream(body_stream),
    };
    Ok(Response::from_parts(parts, body))
}

/// What the guarded request body reports back about itself.
struct BodySignals {
    over_limit: Arc<AtomicBool>,
    went_idle: Arc<AtomicBool>,
    progress: Arc<ReadProgress>,
}

impl BodySignals {
    fn new(endpoint: Endpoint) -> BodySignals {
        BodySignals {
            over_limit: Arc::default(),
            went_idle: Arc::default(),
            progress: match endpoint.method() {
                Method::GET => ReadProgress::finished(),
                _ => Arc::default(),
            },
        }
    }

    /// The client's body as the upstream reads it: idle timeout, size limit, read progress, and
    /// the push parser's tap when `watch` is given.
    fn guard(
        &self,
        body: Body,
        headers: &HeaderMap,
        limits: &ProxyLimits,
        watch: Option<Arc<PushWatch>>,
    ) -> Body {
        let client = stream::watch_client(body.into_data_stream(), self.progress.clone());
        let went_idle = self.went_idle.clone();
        let idle = stream::idle_timeout(client, limits.idle_timeout).inspect(move |item| {
            if matches!(item, Err(stream::StreamError::Idle(_))) {
                went_idle.store(true, Ordering::SeqCst);
            }
        });
        let limited = stream::limited(idle, limits.max_request_bytes, self.over_limit.clone());
        let declared = content_length(headers);
        let read = stream::report_progress(limited, self.progress.clone(), declared);
        match watch {
            Some(watch) => Body::from_stream(stream::tapped(read, move |chunk| {
                watch.request_chunk(chunk)
            })),
            None => Body::from_stream(read),
        }
    }

    fn too_large(&self) -> bool {
        self.over_limit.load(Ordering::SeqCst)
    }

    /// The exchange failed because the client stopped sending, not because the upstream did.
    fn client_stalled(&self, outcome: &Result<Response<Body>, UpstreamError>) -> bool {
        self.went_idle.load(Ordering::SeqCst)
            || (matches!(outcome, Err(UpstreamError::Timeout))
                && !self.progress.ended()
                && self.progress.waiting_on_client())
    }
}

/// The user whose project token is the basic-auth password. The username is ignored: git
/// clients put whatever the remote URL says there.
fn authenticate(signer: &TokenSigner, headers: &HeaderMap) -> Result<UserId, TokenRefusal> {
    let password = (|| {
        let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
        let (scheme, encoded) = value.split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("basic") {
            return None;
        }
        let decoded = STANDARD.decode(encoded.trim()).ok()?;
        let decoded = String::from_utf8(decoded).ok()?;
        let (_, password) = decoded.split_once(':')?;
        Some(password.to_owned())
    })()
    .ok_or(TokenRefusal::Invalid)?;
    signer.check(&password)
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

fn too_large(limit: u64) -> Response {
    answer(
        StatusCode::PAYLOAD_TOO_LARGE,
        &format!("the request body exceeds the proxy's limit of {limit} bytes"),
    )
}

/// A plain-text answer made by the proxy itself (git prints the body to the user).
fn answer(status: StatusCode, message: &str) -> Response {
    (status, format!("{message}\n")).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_identity_is_an_uncompressed_body() {
        let check = |values: &[&str], encoded: bool| {
            let mut headers = HeaderMap::new();
            for v in values {
                headers.append(header::CONTENT_ENCODING, HeaderValue::from_str(v).unwrap());
            }
            assert_eq!(is_encoded(&headers), encoded, "{values:?}");
        };
        check(&[], false);
        check(&["identity"], false);
        check(&[" Identity "], false);
        check(&["gzip"], true);
        check(&["identity", "gzip"], true);
        check(&["x-gzip"], true);
        check(&["deflate"], true);
    }
}
