//! The GitLab push webhook: pushes made directly to GitLab (not through the proxy) become the
//! same [`ExternalPush`] event the proxy fires. Pushes the proxy forwarded are echoes and skipped;
//! only projects directly in the configured group count; a delivery GitLab sends again (same
//! `Idempotency-Key` or `X-Gitlab-Event-UUID`) fires once.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::{Method, StatusCode};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use subtle::ConstantTimeEq;

use crate::client::client_of;
use crate::env_names::WEBHOOK_SECRET_ENV;
use crate::event::{ExternalPush, OnExternalPush};
use crate::project_path::{Owner, ProjectPath};
use crate::proxy::events::RecentPushes;
use crate::store::Store;
use crate::token::{MIN_DISTINCT_BYTES, distinct_bytes};
use crate::user::UserId;

/// Fewest bytes of a webhook secret: it is a bearer token anyone who learns it can use.
pub const MIN_WEBHOOK_SECRET_LEN: usize = 16;

/// How many delivery ids are remembered to recognise GitLab sending one again.
const REMEMBERED_DELIVERIES: usize = 4096;

/// Why a webhook secret is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WebhookSecretError {
    /// Fewer than 16 bytes.
    #[error(
        "{WEBHOOK_SECRET_ENV} is {len} bytes; at least {MIN_WEBHOOK_SECRET_LEN} are needed (generate one with `openssl rand -hex 32`)"
    )]
    TooShort {
        /// Its length.
        len: usize,
    },
    /// Fewer than 8 different byte values.
    #[error(
        "{WEBHOOK_SECRET_ENV} uses only {distinct} different characters; it must be random (generate one with `openssl rand -hex 32`)"
    )]
    Weak {
        /// How many different byte values it uses.
        distinct: usize,
    },
}

/// Validates a webhook secret: long enough and not a repeated character or short pattern.
pub fn webhook_secret(value: &str) -> Result<SecretString, WebhookSecretError> {
    if value.len() < MIN_WEBHOOK_SECRET_LEN {
        return Err(WebhookSecretError::TooShort { len: value.len() });
    }
    let distinct = distinct_bytes(value.as_bytes());
    if distinct < MIN_DISTINCT_BYTES {
        return Err(WebhookSecretError::Weak { distinct });
    }
    Ok(SecretString::from(value))
}

/// Where the webhook learns the full path of the group that holds the user projects, and
/// whose project a pushed path is.
pub trait GroupPath: Send + Sync + 'static {
    /// The group's full path (`shmastra/users`), or why it cannot be had now.
    fn group_path(&self) -> BoxFuture<'_, Result<String, String>>;

    /// The user whose project `path` is, in the group `group`; by default the project path
    /// template's default, `<group>/<user>`.
    fn owner_of(&self, group: &str, path: &str) -> Option<UserId> {
        match ProjectPath::default().owner(group, path) {
            Owner::User(user) => Some(user),
            Owner::Prefix(_) | Owner::Nobody => None,
        }
    }
}

/// A fixed group path (tests, and deployments that know it).
impl GroupPath for String {
    fn group_path(&self) -> BoxFuture<'_, Result<String, String>> {
        let path = self.clone();
        Box::pin(async move { Ok(path) })
    }
}

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

/// The delivery ids GitLab sent lately, bounded.
#[derive(Debug, Default)]
struct Deliveries {
    seen: Mutex<(HashSet<String>, VecDeque<String>)>,
}

impl Deliveries {
    fn contains_any(&self, ids: &[String]) -> bool {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        ids.iter().any(|id| seen.0.contains(id))
    }

    fn record(&self, ids: Vec<String>) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let (set, order) = &mut *seen;
        for id in ids {
            if set.insert(id.clone()) {
                order.push_back(id);
            }
            while order.len() > REMEMBERED_DELIVERIES {
                if let Some(old) = order.pop_front() {
                    set.remove(&old);
                }
            }
        }
    }
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

/// Decides about one push payload. Pure apart from reading `recent`. `owner` says whose
/// project a `path_with_namespace` is (`None`: no user's, e.g. outside the group).
pub fn decide(
    payload: &[u8],
    owner: &dyn Fn(&str) -> Option<UserId>,
    recent: &RecentPushes,
) -> Result<Delivery, serde_json::Error> {
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
    // Each user's project is where the project path template puts it in the group (see
    // `gitlab::ensure_user_project`), spelled exactly as GitLab spells the group.
    let Some(user) = owner(&payload.project.path_with_namespace) else {
        return Ok(Delivery::Ignored(
            "project is no user's (not in the group, or not at a path the project path template gives)",
        ));
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
    group: Arc<dyn GroupPath>,
    recent: Arc<RecentPushes>,
    deliveries: Deliveries,
    /// Delivery ids shared with the other replicas.
    store: Option<Arc<dyn Store>>,
    on_external_push: OnExternalPush,
}

impl Webhook {
    /// `recent`: the proxy's [`crate::proxy::Proxy::recent_pushes`].
    pub fn new(
        secret: SecretString,
        group: Arc<dyn GroupPath>,
        recent: Arc<RecentPushes>,
        on_external_push: OnExternalPush,
    ) -> Arc<Webhook> {
        Arc::new(Webhook {
            secret,
            group,
            recent,
            deliveries: Deliveries::default(),
            store: None,
            on_external_push,
        })
    }

    /// [`Webhook::new`], sharing the handled delivery ids with every replica through `store`
    /// (attach the same store to `recent` so echoes are known across replicas too).
    pub fn shared(
        secret: SecretString,
        group: Arc<dyn GroupPath>,
        recent: Arc<RecentPushes>,
        on_external_push: OnExternalPush,
        store: Arc<dyn Store>,
    ) -> Arc<Webhook> {
        Arc::new(Webhook {
            secret,
            group,
            recent,
            deliveries: Deliveries::default(),
            store: Some(store),
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
    let client = client_of(&request);
    if request.method() != Method::POST || !matches!(request.uri().path(), "" | "/") {
        tracing::info!(%client, status = 404, "not the webhook endpoint");
        return (StatusCode::NOT_FOUND, "not found\n").into_response();
    }
    let presented = request
        .headers()
        .get("x-gitlab-token")
        .map(|v| v.as_bytes().to_vec())
        .unwrap_or_default();
    if !hook.token_matches(&presented) {
        tracing::warn!(%client, status = 401, "webhook delivery with a wrong X-Gitlab-Token");
        return (StatusCode::UNAUTHORIZED, "wrong X-Gitlab-Token\n").into_response();
    }
    // GitLab keeps `Idempotency-Key` across retries of one delivery and `X-Gitlab-Event-UUID`
    // across the hooks one event triggers: either seen before means this push was handled.
    let ids: Vec<String> = ["idempotency-key", "x-gitlab-event-uuid"]
        .iter()
        .filter_map(|name| request.headers().get(*name)?.to_str().ok())
        .filter(|id| !id.is_empty())
        .map(|id| id.chars().take(128).collect())
        .collect();
    if hook.deliveries.contains_any(&ids) {
        tracing::info!(%client, "webhook delivery already handled; not firing again");
        return (StatusCode::OK, "already handled\n").into_response();
    }
    let body = match axum::body::to_bytes(Body::new(request.into_body()), MAX_PAYLOAD_BYTES).await {
        Ok(body) => body,
        Err(_) => {
            tracing::warn!(%client, status = 413, "webhook payload too large");
            return (StatusCode::PAYLOAD_TOO_LARGE, "webhook payload too large\n").into_response();
        }
    };
    let group_path = match hook.group.group_path().await {
        Ok(path) => path,
        Err(e) => {
            tracing::error!(error = %e, "cannot learn the GitLab group's path; webhook delivery not handled");
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                "the group of user projects cannot be looked up now\n",
            )
                .into_response();
        }
    };
    let owner = |path: &str| hook.group.owner_of(&group_path, path);
    let mut decided = decide(&body, &owner, &hook.recent);
    if decided.is_ok() {
        hook.deliveries.record(ids.clone());
        if let Some(store) = &hook.store {
            match store.first_delivery(ids).await {
                Ok(true) => {}
                Ok(false) => {
                    tracing::info!(%client, "webhook delivery already handled by a replica; not firing again");
                    return (StatusCode::OK, "already handled\n").into_response();
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot share the webhook delivery id; de-duplicating in this replica only")
                }
            }
        }
    }
    if let Ok(Delivery::External(push)) = &decided
        && hook.recent.seen_anywhere(push).await
    {
        decided = Ok(Delivery::SeenByProxy);
    }
    match decided {
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
            tracing::warn!(%client, status = 400, error = %e, "webhook payload is not a GitLab event");
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
    const NOBODYS: &str =
        "project is no user's (not in the group, or not at a path the project path template gives)";

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

    fn owner(path: &str) -> Option<UserId> {
        "shmastra/users".to_owned().owner_of("shmastra/users", path)
    }

    fn check(input: &[u8], recent: &RecentPushes, expected: Delivery) {
        assert_eq!(
            decide(input, &owner, recent).expect("parses"),
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
        for elsewhere in [
            "attacker/alice",
            "shmastra/alice",
            "shmastra/users/sub/alice",
            "shmastra/users-x/alice",
            "Shmastra/Users/alice",
            "shmastra/usersalice",
        ] {
            check(
                &payload("push", main, OID, elsewhere),
                &none,
                Delivery::Ignored(NOBODYS),
            );
        }
        check(
            &payload("tag_push", "refs/tags/v1", OID, "shmastra/users/alice"),
            &none,
            Delivery::Ignored("not a push event"),
        );
        check(
            &payload("push", "refs/tags/v1", OID, "shmastra/users/alice"),
            &none,
            Delivery::Ignored("not a branch"),
        );
        check(
            &payload("push", main, &"0".repeat(40), "shmastra/users/alice"),
            &none,
            Delivery::Ignored("branch deleted"),
        );
        check(
            &payload("push", main, OID, "shmastra/users/..evil"),
            &none,
            Delivery::Ignored(NOBODYS),
        );
        check(
            br#"{"object_kind":"merge_request"}"#,
            &none,
            Delivery::Ignored("not a push event"),
        );
        assert!(decide(b"not json", &owner, &none).is_err());
        assert!(decide(br#"{"object_kind":"push"}"#, &owner, &none).is_err());
    }

    #[test]
    fn a_push_the_proxy_forwarded_is_an_echo() {
        let recent = RecentPushes::default();
        recent.record(alice_push());
        check(
            &payload("push", "refs/heads/main", OID, "shmastra/users/alice"),
            &recent,
            Delivery::SeenByProxy,
        );
    }

    #[test]
    fn the_token_must_match_exactly() {
        let hook = Webhook::new(
            SecretString::from("s3cret"),
            Arc::new("g".to_owned()),
            Arc::default(),
            Arc::new(|_| {}),
        );
        assert!(hook.token_matches(b"s3cret"));
        assert!(!hook.token_matches(b"s3cre"));
        assert!(!hook.token_matches(b"s3cret "));
        assert!(!hook.token_matches(b""));
    }

    #[test]
    fn weak_secrets_are_refused() {
        assert_eq!(
            webhook_secret("x").unwrap_err(),
            WebhookSecretError::TooShort { len: 1 }
        );
        assert_eq!(
            webhook_secret(&"a".repeat(64)).unwrap_err(),
            WebhookSecretError::Weak { distinct: 1 }
        );
        assert!(webhook_secret("0123456789abcdef").is_ok());
    }
}
