//! The control API's handlers, each with the `#[utoipa::path]` the OpenAPI document is
//! generated from. Every handler checks the path's user id first (400), then its body (422
//! field by field), and only then acts.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, StreamExt};
use http::{HeaderMap, StatusCode, header};

use super::Api;
use super::control::LinkRefused;
use super::error::{ApiError, ErrorBody, FieldProblem};
use super::model::{
    HistoryView, LoginLink, LoginLinkRequest, ManifestView, ProvisionRequest, ProvisionResult,
    RestoreRequest, RestoreResult, RotatedToken, SandboxView, SaveView, SyncResult,
};
use super::operations::{Operation, OperationKind, Outcome, idempotency_key};
use crate::orchestrate::OrchestrateError;
use crate::orchestrate::history::{HistoryError, RestoreToError, SavedManifestError, rfc3339};
use crate::sandbox::SandboxError;
use crate::secrets::RestoreForm;
use crate::token::GenerationError;
use crate::user::UserId;

/// Saves a history answers at most.
const MAX_HISTORY: usize = 500;
/// A sign-in link's default lifetime.
const DEFAULT_LINK_TTL: Duration = Duration::from_secs(900);
/// Most paths one restore names.
const MAX_RESTORE_PATHS: usize = 100;
/// Longest `at` or path.
const MAX_REV_LEN: usize = 256;
const MAX_PATH_LEN: usize = 4096;

/// The path's user id, or 400.
fn user_of(raw: &str) -> Result<UserId, ApiError> {
    UserId::parse(raw).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_user",
            format!("{e} (user ids are 1 to 64 of a-z, 0-9, '.', '_', '-')"),
        )
    })
}

/// The body as the route's JSON type, or the API's own 400/415.
fn body<T>(json: Result<Json<T>, JsonRejection>) -> Result<T, ApiError> {
    json.map(|Json(t)| t).map_err(ApiError::from)
}

/// 202 with the operation and its status URL in `Location`.
fn accepted(op: Operation) -> Response {
    let location = op.status_url.clone();
    let mut response = (StatusCode::ACCEPTED, Json(op)).into_response();
    if let Ok(value) = http::HeaderValue::from_str(&location) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    response
}

impl Api {
    /// 409 when this server runs no sandboxes.
    fn sandboxes(&self) -> Result<(), ApiError> {
        if self.control.runs_sandboxes() {
            return Ok(());
        }
        Err(ApiError::new(
            StatusCode::CONFLICT,
            "no_sandboxes",
            "this server runs no sandboxes (serve --sandboxes-dir, or E2B_API_KEY for E2B)",
        ))
    }

    /// 409 when the user has no sandbox.
    async fn existing_sandbox(&self, user: &UserId) -> Result<(), ApiError> {
        self.sandboxes()?;
        if self.control.has_sandbox(user).await {
            return Ok(());
        }
        Err(ApiError::new(
            StatusCode::CONFLICT,
            "no_sandbox",
            format!(
                "user {user} has no sandbox: provision it first (POST /api/v1/users/{user}/sandbox)"
            ),
        ))
    }
}

/// An orchestration failure as an operation's error.
fn orchestrate_error(error: OrchestrateError) -> ApiError {
    match error {
        OrchestrateError::Form(e) => {
            ApiError::form(e.problems.iter().map(FieldProblem::of_secret).collect())
        }
        OrchestrateError::NeedsAttention { .. } => {
            ApiError::new(StatusCode::CONFLICT, "needs_attention", error.to_string())
        }
        OrchestrateError::Sandbox(SandboxError::Gone { .. }) => {
            ApiError::new(StatusCode::CONFLICT, "sandbox_gone", error.to_string())
        }
        e if e.is_transient() => ApiError::unavailable(e.to_string()),
        e => ApiError::new(StatusCode::BAD_GATEWAY, "failed", e.to_string()),
    }
}

fn history_error(error: HistoryError) -> ApiError {
    match error {
        HistoryError::Off => {
            ApiError::new(StatusCode::CONFLICT, "persistence_off", error.to_string())
        }
        e => {
            tracing::warn!(error = %e, "control API: cannot read saves");
            ApiError::unavailable(format!("the saves cannot be read now: {e}"))
        }
    }
}

/// The status of the user's sandbox, as the workspace page shows it.
#[utoipa::path(
    get,
    path = "/api/v1/users/{user}/sandbox",
    tag = "sandbox",
    params(("user" = String, Path, description = "The user id (1 to 64 of a-z, 0-9, `.`, `_`, `-`)")),
    responses(
        (status = 200, description = "The status", body = SandboxView),
        (status = 400, description = "Not a user id", body = ErrorBody),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(super) async fn get_sandbox(
    State(api): State<Arc<Api>>,
    Path(user): Path<String>,
) -> Result<Json<SandboxView>, ApiError> {
    let user = user_of(&user)?;
    Ok(Json(api.view(&user).await))
}

impl Api {
    async fn view(&self, user: &UserId) -> SandboxView {
        SandboxView {
            user: user.to_string(),
            sandboxes: self.control.runs_sandboxes(),
            status: self.control.status(user).await.map(Into::into),
        }
    }
}

/// Makes sure the user's sandbox is up: a new one restored from the saved branch with the
/// restore form's secrets, an unfinished restore finished, or the watcher checked. Answers 202
/// with the operation; the same request while it runs gets the same operation.
#[utoipa::path(
    post,
    path = "/api/v1/users/{user}/sandbox",
    tag = "sandbox",
    params(
        ("user" = String, Path, description = "The user id"),
        ("Idempotency-Key" = Option<String>, Header, description = "A repeat with this key gets the first request's operation"),
    ),
    request_body(content = ProvisionRequest, description = "The restore form's secrets, when the project needs them"),
    responses(
        (status = 202, description = "Started, or joined", body = Operation,
            headers(("Location" = String, description = "The operation's status URL"))),
        (status = 400, description = "Not a user id, or not JSON", body = ErrorBody),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
        (status = 409, description = "This server runs no sandboxes", body = ErrorBody),
        (status = 422, description = "The secrets do not fit the saved manifest, field by field; or an Idempotency-Key reused", body = ErrorBody),
        (status = 429, description = "Too many operations queued for the user", body = ErrorBody),
        (status = 503, description = "The saved manifest cannot be read now", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(super) async fn provision(
    State(api): State<Arc<Api>>,
    Path(user): Path<String>,
    headers: HeaderMap,
    json: Result<Json<ProvisionRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let user = user_of(&user)?;
    let key = idempotency_key(headers.get("idempotency-key"))?;
    let request = match json {
        Err(JsonRejection::MissingJsonContentType(_))
            if headers.get(header::CONTENT_LENGTH).is_none_or(|l| l == "0") =>
        {
            ProvisionRequest::default()
        }
        other => body(other)?,
    };
    api.sandboxes()?;
    let secrets = request.secrets.map(|s| s.0);
    // A form (even an empty one) is another request than none.
    let mut identity: Vec<u8> = vec![u8::from(secrets.is_some())];
    if let Some(secrets) = &secrets {
        // The form is checked now, against the saved manifest, by the page's own check; the
        // sandbox checks it again against the manifest it restores.
        let manifest = api
            .control
            .manifest(user.clone())
            .await
            .map_err(manifest_error)?
            .unwrap_or_default();
        RestoreForm::validate(&manifest, secrets.iter().cloned()).map_err(|e| {
            ApiError::form(e.problems.iter().map(FieldProblem::of_secret).collect())
        })?;
        for (name, value) in secrets {
            identity.extend_from_slice(&(name.len() as u64).to_be_bytes());
            identity.extend_from_slice(name.as_bytes());
            identity.extend_from_slice(&(value.len() as u64).to_be_bytes());
            identity.extend_from_slice(value.expose().as_bytes());
        }
    }
    let control = api.control.clone();
    let who = user.clone();
    let op = api.operations.start(
        &user,
        OperationKind::Provision,
        &identity,
        key,
        Box::new(move || {
            Box::pin(async move {
                control
                    .reprovision(who, secrets.unwrap_or_default())
                    .await
                    .map(|done| Outcome::Provision(ProvisionResult::from(done)))
                    .map_err(orchestrate_error)
            })
        }),
    )?;
    Ok(accepted(op))
}

fn manifest_error(error: SavedManifestError) -> ApiError {
    match error {
        SavedManifestError::History(e) => history_error(e),
        SavedManifestError::Invalid(e) => ApiError::new(
            StatusCode::CONFLICT,
            "invalid_manifest",
            format!("the saved shmastra.json is not valid: {e}"),
        ),
    }
}

/// Server-sent events: `event: status` with the sandbox's view at connect and on every change.
#[utoipa::path(
    get,
    path = "/api/v1/users/{user}/sandbox/events",
    tag = "sandbox",
    params(("user" = String, Path, description = "The user id")),
    responses(
        (status = 200, description = "`text/event-stream`: each `status` event's data is a SandboxView", content_type = "text/event-stream", body = SandboxView),
        (status = 400, description = "Not a user id", body = ErrorBody),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(super) async fn sandbox_events(
    State(api): State<Arc<Api>>,
    Path(user): Path<String>,
) -> Result<Response, ApiError> {
    let user = user_of(&user)?;
    let changes = api.control.status_changes();
    let render = {
        let (api, user) = (api.clone(), user.clone());
        move || {
            let (api, user) = (api.clone(), user.clone());
            async move {
                let view = api.view(&user).await;
                Ok::<_, Infallible>(
                    Event::default()
                        .event("status")
                        .json_data(view)
                        .unwrap_or_else(|_| Event::default().event("status")),
                )
            }
        }
    };
    let first = stream::once(render());
    let later = stream::unfold(
        (changes, render, user.to_string()),
        |(mut changes, render, user)| async move {
            loop {
                match changes.recv().await {
                    Ok(change) if change.sandbox != user => continue,
                    // Behind: the latest status is all a follower needs.
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        let event = render().await;
                        return Some((event, (changes, render, user)));
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                }
            }
        },
    );
    Ok(Sse::new(first.chain(later))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}

/// Syncs the sandbox to the saved branch (after a push made elsewhere): the run that covers
/// this request. A request while an earlier sync runs gets the next run.
#[utoipa::path(
    post,
    path = "/api/v1/users/{user}/sync",
    tag = "sandbox",
    params(
        ("user" = String, Path, description = "The user id"),
        ("Idempotency-Key" = Option<String>, Header, description = "A repeat with this key gets the first request's operation"),
    ),
    responses(
        (status = 202, description = "Started, or joined", body = Operation,
            headers(("Location" = String, description = "The operation's status URL"))),
        (status = 400, description = "Not a user id", body = ErrorBody),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
        (status = 409, description = "No sandbox to sync", body = ErrorBody),
        (status = 422, description = "An Idempotency-Key reused for another request", body = ErrorBody),
        (status = 429, description = "Too many operations queued for the user", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(super) async fn sync(
    State(api): State<Arc<Api>>,
    Path(user): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let user = user_of(&user)?;
    let key = idempotency_key(headers.get("idempotency-key"))?;
    api.existing_sandbox(&user).await?;
    let control = api.control.clone();
    let who = user.clone();
    let op = api.operations.start(
        &user,
        OperationKind::Sync,
        b"",
        key,
        Box::new(move || {
            Box::pin(async move {
                control
                    .sync(who)
                    .await
                    .map(|outcome| Outcome::Sync(SyncResult::from(outcome)))
                    .map_err(orchestrate_error)
            })
        }),
    )?;
    Ok(accepted(op))
}

/// Checks a restore request field by field.
fn check_restore(request: &RestoreRequest) -> Result<(), ApiError> {
    let mut problems = Vec::new();
    let at = request.at.as_str();
    if at.trim().is_empty() {
        problems.push(FieldProblem {
            field: "at".into(),
            problem: "missing".into(),
            message: "at: a save id, an RFC 3339 time or a duration ago is needed".into(),
        });
    } else if at.len() > MAX_REV_LEN || at.starts_with('-') || at.chars().any(char::is_control) {
        problems.push(FieldProblem::invalid(
            "at",
            format!("at: not a save id, time or duration (at most {MAX_REV_LEN} characters, no control characters, not starting with '-')"),
        ));
    }
    if request.paths.len() > MAX_RESTORE_PATHS {
        problems.push(FieldProblem::invalid(
            "paths",
            format!(
                "paths: {} paths, at most {MAX_RESTORE_PATHS}",
                request.paths.len()
            ),
        ));
    }
    for (i, path) in request.paths.iter().enumerate().take(MAX_RESTORE_PATHS) {
        let bad = path.is_empty()
            || path.len() > MAX_PATH_LEN
            || path.starts_with('/')
            || path.starts_with('-')
            || path.chars().any(char::is_control)
            || path.split('/').any(|part| part == "..");
        if bad {
            problems.push(FieldProblem::invalid(
                format!("paths[{i}]"),
                format!("paths[{i}]: not a relative path inside the project (no '..', no leading '/' or '-', no control characters)"),
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(ApiError::form(problems))
    }
}

/// Goes back to an earlier save, as a new save (history is never rewritten).
#[utoipa::path(
    post,
    path = "/api/v1/users/{user}/restore",
    tag = "sandbox",
    params(
        ("user" = String, Path, description = "The user id"),
        ("Idempotency-Key" = Option<String>, Header, description = "A repeat with this key gets the first request's operation"),
    ),
    request_body = RestoreRequest,
    responses(
        (status = 202, description = "Started, or joined", body = Operation,
            headers(("Location" = String, description = "The operation's status URL"))),
        (status = 400, description = "Not a user id, or not JSON", body = ErrorBody),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
        (status = 409, description = "No sandbox to restore in", body = ErrorBody),
        (status = 422, description = "A bad field, field by field; or an Idempotency-Key reused", body = ErrorBody),
        (status = 429, description = "Too many operations queued for the user", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(super) async fn restore(
    State(api): State<Arc<Api>>,
    Path(user): Path<String>,
    headers: HeaderMap,
    json: Result<Json<RestoreRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let user = user_of(&user)?;
    let key = idempotency_key(headers.get("idempotency-key"))?;
    let request = body(json)?;
    check_restore(&request)?;
    api.existing_sandbox(&user).await?;
    let identity = serde_json::to_vec(&(&request.at, &request.paths)).unwrap_or_default();
    let control = api.control.clone();
    let who = user.clone();
    let op = api.operations.start(
        &user,
        OperationKind::Restore,
        &identity,
        key,
        Box::new(move || {
            Box::pin(async move {
                control
                    .restore(who, request.at, request.paths)
                    .await
                    .map(|done| Outcome::Restore(RestoreResult::from(done)))
                    .map_err(|e| match e {
                        RestoreToError::Refused { message } => {
                            ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "refused", message)
                        }
                        RestoreToError::Off => {
                            ApiError::new(StatusCode::CONFLICT, "persistence_off", e.to_string())
                        }
                        RestoreToError::Orchestrate(e) => orchestrate_error(e),
                        e => ApiError::new(StatusCode::BAD_GATEWAY, "failed", e.to_string()),
                    })
            })
        }),
    )?;
    Ok(accepted(op))
}

/// One operation, as its status URL answers.
#[utoipa::path(
    get,
    path = "/api/v1/users/{user}/operations/{id}",
    tag = "sandbox",
    params(
        ("user" = String, Path, description = "The user id"),
        ("id" = String, Path, description = "The operation's id"),
    ),
    responses(
        (status = 200, description = "The operation", body = Operation),
        (status = 400, description = "Not a user id", body = ErrorBody),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
        (status = 404, description = "No such operation of this user (or forgotten: finished ones are kept an hour)", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(super) async fn operation(
    State(api): State<Arc<Api>>,
    Path((user, id)): Path<(String, String)>,
) -> Result<Json<Operation>, ApiError> {
    let user = user_of(&user)?;
    api.operations
        .get(&user, &id)
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("user {user} has no operation {id}")))
}

#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct HistoryQuery {
    /// How many saves, newest first (default 30, at most 500).
    limit: Option<usize>,
}

/// The newest saves, from the saved project (a sandbox is not needed).
#[utoipa::path(
    get,
    path = "/api/v1/users/{user}/history",
    tag = "saves",
    params(("user" = String, Path, description = "The user id"), HistoryQuery),
    responses(
        (status = 200, description = "The saves, newest first", body = HistoryView),
        (status = 400, description = "Not a user id, or a bad limit", body = ErrorBody),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
        (status = 503, description = "The saves cannot be read now", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(super) async fn history(
    State(api): State<Arc<Api>>,
    Path(user): Path<String>,
    query: Result<Query<HistoryQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<HistoryView>, ApiError> {
    let user = user_of(&user)?;
    let Query(query) = query
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", e.body_text()))?;
    let limit = query.limit.unwrap_or(30);
    if !(1..=MAX_HISTORY).contains(&limit) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            format!("limit must be 1 to {MAX_HISTORY}"),
        ));
    }
    let saves = api
        .control
        .history(user, limit)
        .await
        .map_err(history_error)?;
    Ok(Json(HistoryView {
        saves: saves.into_iter().map(SaveView::from).collect(),
    }))
}

/// The names the restore form must ask for, from the saved branch's `shmastra.json` (before
/// any sandbox exists).
#[utoipa::path(
    get,
    path = "/api/v1/users/{user}/manifest",
    tag = "saves",
    params(("user" = String, Path, description = "The user id")),
    responses(
        (status = 200, description = "The manifest's names", body = ManifestView),
        (status = 400, description = "Not a user id", body = ErrorBody),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
        (status = 409, description = "The saved shmastra.json is not valid", body = ErrorBody),
        (status = 503, description = "The saved project cannot be read now", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(super) async fn manifest(
    State(api): State<Arc<Api>>,
    Path(user): Path<String>,
) -> Result<Json<ManifestView>, ApiError> {
    let user = user_of(&user)?;
    let manifest = api.control.manifest(user).await.map_err(manifest_error)?;
    Ok(Json(ManifestView::of(manifest)))
}

/// A one-use sign-in link to the user's workspace page, for the backend's own signed-in user.
#[utoipa::path(
    post,
    path = "/api/v1/users/{user}/login-links",
    tag = "users",
    params(("user" = String, Path, description = "The user id")),
    request_body(content = LoginLinkRequest, description = "Optional"),
    responses(
        (status = 201, description = "The link", body = LoginLink),
        (status = 400, description = "Not a user id, or not JSON", body = ErrorBody),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
        (status = 422, description = "A lifetime past 24 hours", body = ErrorBody),
        (status = 503, description = "No link now: the token generations cannot be read, or nothing durable (a database, SHMASTRA_TOKEN_STATE) records a link's use", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(super) async fn login_link(
    State(api): State<Arc<Api>>,
    Path(user): Path<String>,
    headers: HeaderMap,
    json: Result<Json<LoginLinkRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let user = user_of(&user)?;
    let request = match json {
        Err(JsonRejection::MissingJsonContentType(_))
            if headers.get(header::CONTENT_LENGTH).is_none_or(|l| l == "0") =>
        {
            LoginLinkRequest::default()
        }
        other => body(other)?,
    };
    let ttl = request
        .ttl_seconds
        .map_or(DEFAULT_LINK_TTL, Duration::from_secs);
    let base = api.base_url(&headers);
    let url = api
        .control
        .login_link(&user, ttl, &base)
        .map_err(|refused| match refused {
            LinkRefused::Ttl(message) => ApiError::form(vec![FieldProblem::invalid(
                "ttl_seconds",
                format!("ttl_seconds: {message}"),
            )]),
            LinkRefused::Unavailable(message) => ApiError::unavailable(message),
        })?;
    tracing::info!(user = %user, ttl_seconds = ttl.as_secs(), "control API: sign-in link made");
    let link = LoginLink {
        url,
        expires_at: rfc3339(SystemTime::now() + ttl),
    };
    Ok((StatusCode::CREATED, Json(link)).into_response())
}

/// Refuses every project token of the user minted so far and answers the new one; the
/// sandbox's watcher gets it through a provision.
#[utoipa::path(
    post,
    path = "/api/v1/users/{user}/token/rotate",
    tag = "users",
    params(("user" = String, Path, description = "The user id")),
    responses(
        (status = 200, description = "The new token (and the provision giving it to the sandbox)", body = RotatedToken),
        (status = 400, description = "Not a user id", body = ErrorBody),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
        (status = 409, description = "Revocation needs DATABASE_URL or SHMASTRA_TOKEN_STATE", body = ErrorBody),
        (status = 503, description = "The token state cannot be written now", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub(super) async fn rotate_token(
    State(api): State<Arc<Api>>,
    Path(user): Path<String>,
) -> Result<Json<RotatedToken>, ApiError> {
    let user = user_of(&user)?;
    let (generation, token) = api.rotate(&user).await.map_err(|e| match e {
        GenerationError::NoStore => ApiError::new(
            StatusCode::CONFLICT,
            "token_state_off",
            "token revocation needs DATABASE_URL or SHMASTRA_TOKEN_STATE on this server",
        ),
        e => ApiError::unavailable(e.to_string()),
    })?;
    tracing::info!(user = %user, generation, "control API: project token rotated");
    let operation = if api.control.runs_sandboxes() && api.control.has_sandbox(&user).await {
        let (control, signer, who) = (api.control.clone(), api.signer.clone(), user.clone());
        Some(api.operations.start(
            &user,
            OperationKind::Provision,
            &generation.to_be_bytes(),
            None,
            Box::new(move || {
                Box::pin(async move {
                    // With a database the signer follows the new generation within a second:
                    // the watcher must get the new token, not the one just revoked.
                    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
                    while signer.generation(&who).unwrap_or(0) < generation
                        && tokio::time::Instant::now() < deadline
                    {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    control
                        .provision(who)
                        .await
                        .map(|done| {
                            Outcome::Provision(ProvisionResult {
                                outcome: super::model::ProvisionOutcome::Present,
                                watcher_started: done.watcher_started,
                            })
                        })
                        .map_err(orchestrate_error)
                })
            }),
        )?)
    } else {
        None
    };
    Ok(Json(RotatedToken {
        generation,
        token,
        operation,
    }))
}
