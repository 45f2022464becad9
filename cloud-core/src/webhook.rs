//! The GitLab push webhook: pushes made directly to GitLab (not through the proxy) become the
//! same [`ExternalPush`] event the proxy fires. Pushes the proxy forwarded are echoes and skipped.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::{Method, StatusCode};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use subtle::ConstantTimeEq;

use crate::UserId;
use crate::proxy::events::{ExternalPush, OnExternalPush, RecentPushes};

/// The env var holding the expected `X-Gitlab-Token`.
pub const WEBHOOK_SECRET_ENV: &str = "GITLAB_WEBHOOK_SECRET";

/// GitLab's push payloads list at most 20 commits; this is far above any real one.
const MAX_PAYLOAD_BYTES: usize = 4 << 20;

/// What the webhook decided about one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// A push made directly to GitLab: the event fired.
    External(ExternalPush),
    /// The proxy forwarded this push already (and decided about it then).
    SeenByProxy,
    /// Not a branch update: another event kind, a tag, a deletion, a project of no user.
    Ignored(&'static str),
}

/// The subset of GitLab's push event payload the webhook reads.
#[derive(Debug, Deserialize)]
struct PushPayload {
    #[serde(rename = "ref")]
    refname: String,
    after: String,
    project: PayloadProject,
}

#[derive(Debug, Deserialize)]
struct PayloadProject {
    path_with_namespace: String,
}

/// Decides about one push payload. Pure apart from reading `recent`.
pub fn decide(payload: &[u8], recent: &RecentPushes) -> Result<Delivery, serde_json::Error> {
    #[derive(Deserialize)]
    struct Kind {
        object_kind: Option<String>,
    }
    let kind: Kind = serde_json::from_slice(payload)?;
    if kind.object_kind.as_deref() != Some("push") {
        return Ok(Delivery::Ignored("not a push event"));
    }
    let payload: PushPayload = serde_json::from_slice(payload)?;
    if !payload.refname.starts_with("refs/heads/") {
        return Ok(Delivery::Ignored("not a branch"));
    }
    if payload.after.bytes().all(|b| b == b'0') {
        return Ok(Delivery::Ignored("branch deleted"));
    }
    // Each user's project is `<group path>/<user id>` (see `gitlab::ensure_user_project`).
    let project_path = payload.project.path_with_namespace;
    let last = project_path.rsplit('/').next().unwrap_or_default();
    let Ok(user) = UserId::parse(last) else {
        return Ok(Delivery::Ignored("project path is not a user id"));
    };
    let push = ExternalPush {
        user,
        refname: payload.refname,
        new_oid: payload.after,
    };
    if recent.contains(&push) {
        return Ok(Delivery::SeenByProxy);
    }
    Ok(Delivery::External(push))
}

/// The webhook endpoint's state.
pub struct Webhook {
    secret: SecretString,
    recent: Arc<RecentPushes>,
    on_external_push: OnExternalPush,
}

impl Webhook {
    /// `recent`: the proxy's [`crate::proxy::Proxy::recent_pushes`].
    pub fn new(
        secret: SecretString,
        recent: Arc<RecentPushes>,
        on_external_push: OnExternalPush,
    ) -> Arc<Webhook> {
        Arc::new(Webhook {
            secret,
            recent,
            on_external_push,
        })
    }

    /// The webhook as a router answering `POST` at its mount point.
    pub fn router(self: &Arc<Self>) -> Router {
        Router::new().fallback(receive).with_state(Arc::clone(self))
    }

    fn token_matches(&self, presented: &[u8]) -> bool {
        let expected = self.secret.expose_secret().as_bytes();
        !expected.is_empty() && bool::from(expected.ct_eq(presented))
    }
}

async fn receive(State(hook): State<Arc<Webhook>>, request: Request) -> Response {
    if request.method() != Method::POST || !matches!(request.uri().path(), "" | "/") {
        return (StatusCode::NOT_FOUND, "not found\n").into_response();
    }
    let presented = request
        .headers()
        .get("x-gitlab-token")
        .map(|v| v.as_bytes().to_vec())
        .unwrap_or_default();
    if !hook.token_matches(&presented) {
        tracing::warn!(status = 401, "webhook delivery with a wrong X-Gitlab-Token");
        return (StatusCode::UNAUTHORIZED, "wrong X-Gitlab-Token\n").into_response();
    }
    let body = match axum::body::to_bytes(Body::new(request.into_body()), MAX_PAYLOAD_BYTES).await {
        Ok(body) => body,
        Err(_) => {
            return (StatusCode::PAYLOAD_TOO_LARGE, "webhook payload too large\n").into_response();
        }
    };
    match decide(&body, &hook.recent) {
        Ok(Delivery::External(push)) => {
            tracing::info!(user = %push.user, git_ref = %push.refname, new_oid = %push.new_oid, source = "gitlab-webhook", "external push");
            (hook.on_external_push)(push);
            (StatusCode::OK, "external push\n").into_response()
        }
        Ok(Delivery::SeenByProxy) => {
            tracing::debug!("webhook push already seen by the proxy");
            (StatusCode::OK, "seen by the proxy\n").into_response()
        }
        Ok(Delivery::Ignored(why)) => {
            tracing::debug!(reason = why, "webhook delivery ignored");
            (StatusCode::OK, format!("ignored: {why}\n")).into_response()
        }
        Err(e) => {
            tracing::warn!(error = %e, "webhook payload is not a GitLab event");
            (
                StatusCode::BAD_REQUEST,
                format!("not a GitLab event payload: {e}\n"),
            )
                .into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OID: &str = "1111111111111111111111111111111111111111";

    fn payload(kind: &str, refname: &str, after: &str, project: &str) -> Vec<u8> {
        serde_json::json!({
            "object_kind": kind,
            "event_name": kind,
            "before": "0000000000000000000000000000000000000000",
            "after": after,
            "ref": refname,
            "user_username": "someone",
            "project": { "id": 7, "path_with_namespace": project },
            "commits": [],
        })
        .to_string()
        .into_bytes()
    }

    fn alice_push() -> ExternalPush {
        ExternalPush {
            user: UserId::parse("alice").expect("valid"),
            refname: "refs/heads/main".into(),
            new_oid: OID.into(),
        }
    }

    fn check(input: &[u8], recent: &RecentPushes, expected: Delivery) {
        assert_eq!(
            decide(input, recent).expect("parses"),
            expected,
            "{}",
            String::from_utf8_lossy(input)
        );
    }

    #[test]
    fn decides_a_table_of_deliveries() {
        let none = RecentPushes::default();
        let main = "refs/heads/main";
        check(
            &payload("push", main, OID, "shmastra/users/alice"),
            &none,
            Delivery::External(alice_push()),
        );
        check(
            &payload("tag_push", "refs/tags/v1", OID, "g/alice"),
            &none,
            Delivery::Ignored("not a push event"),
        );
        check(
            &payload("push", "refs/tags/v1", OID, "g/alice"),
            &none,
            Delivery::Ignored("not a branch"),
        );
        check(
            &payload("push", main, &"0".repeat(40), "g/alice"),
            &none,
            Delivery::Ignored("branch deleted"),
        );
        check(
            &payload("push", main, OID, "g/..evil"),
            &none,
            Delivery::Ignored("project path is not a user id"),
        );
        check(
            br#"{"object_kind":"merge_request"}"#,
            &none,
            Delivery::Ignored("not a push event"),
        );
        assert!(decide(b"not json", &none).is_err());
        assert!(decide(br#"{"object_kind":"push"}"#, &none).is_err());
    }

    #[test]
    fn a_push_the_proxy_forwarded_is_an_echo() {
        let recent = RecentPushes::default();
        recent.record(alice_push());
        check(
            &payload("push", "refs/heads/main", OID, "g/alice"),
            &recent,
            Delivery::SeenByProxy,
        );
    }

    #[test]
    fn the_token_must_match_exactly() {
        let hook = Webhook::new(
            SecretString::from("s3cret"),
            Arc::default(),
            Arc::new(|_| {}),
        );
        assert!(hook.token_matches(b"s3cret"));
        assert!(!hook.token_matches(b"s3cre"));
        assert!(!hook.token_matches(b"s3cret "));
        assert!(!hook.token_matches(b""));
    }
}
