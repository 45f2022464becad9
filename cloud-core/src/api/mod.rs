//! The control API for the cloud's backend: `/api/v1/...`, JSON in and out, authenticated by a
//! service key (`Authorization: Bearer $SHMASTRA_API_KEY`). It provisions, syncs and restores
//! users' sandboxes (long operations: `202` and a status URL), reads their status (also as
//! server-sent events), history and saved manifest, makes sign-in links and rotates project
//! tokens. Everything goes through the workspace page's own state ([`Control`], implemented in
//! `web/control.rs`): one `Lifecycle`, one status board, one sign-in.
//!
//! `keys` checks the service key, `routes` answers (each handler carries the `#[utoipa::path]`
//! its part of the OpenAPI document comes from), `operations` runs and joins long operations,
//! `model` is the wire format, `error` the error answers.

mod control;
mod error;
pub mod keys;
mod model;
mod operations;
mod routes;

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, StatusCode, header};
use utoipa::OpenApi;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use control::{Control, LinkRefused};
use error::ApiError;
use keys::ApiKeys;
use operations::Operations;

use crate::client::client_of;
use crate::store::Store;
use crate::token::{GenerationError, TokenSigner};
use crate::user::UserId;

/// Where the document is served (without a key: it is no secret).
pub const OPENAPI_PATH: &str = "/api/v1/openapi.json";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Shmastra control API",
        description = "Provision, sync and restore users' sandboxes, read their status, history and saved manifest, make sign-in links and rotate project tokens. Every route but this document needs `Authorization: Bearer <SHMASTRA_API_KEY>`. Errors are `{\"error\": {\"code\", \"message\"}}`.",
        license(name = "MIT OR Apache-2.0"),
    ),
    modifiers(&BearerKey),
    tags(
        (name = "sandbox", description = "The user's sandbox: status, events, long operations"),
        (name = "saves", description = "The saved project, read without a sandbox"),
        (name = "users", description = "Sign-in links and project tokens"),
    )
)]
struct Document;

struct BearerKey;

impl utoipa::Modify for BearerKey {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

/// The control API's state.
pub struct Api {
    keys: Option<ApiKeys>,
    control: Arc<dyn Control>,
    operations: Arc<Operations>,
    signer: TokenSigner,
    /// The replicas' store, where token generations live when there is a database.
    store: Option<Arc<dyn Store>>,
    public_url: Option<String>,
}

/// Every route with its OpenAPI operation.
fn routes() -> OpenApiRouter<Arc<Api>> {
    OpenApiRouter::with_openapi(Document::openapi())
        .routes(routes!(routes::get_sandbox, routes::provision))
        .routes(routes!(routes::sandbox_events))
        .routes(routes!(routes::sync))
        .routes(routes!(routes::restore))
        .routes(routes!(routes::operation))
        .routes(routes!(routes::history))
        .routes(routes!(routes::manifest))
        .routes(routes!(routes::login_link))
        .routes(routes!(routes::rotate_token))
}

/// The OpenAPI 3.1 document of the control API, as `/api/v1/openapi.json` serves it (pretty
/// JSON, one trailing newline): `clients/typescript/openapi.json` is this, committed.
pub fn document() -> String {
    let mut openapi = routes().into_openapi();
    openapi.info.version = env!("CARGO_PKG_VERSION").to_owned();
    let mut text = openapi
        .to_pretty_json()
        .expect("the document is serialisable");
    text.push('\n');
    text
}

/// The control API's router. Without `keys` every route but the document answers 404 with a
/// message saying the API is off.
pub fn router(
    keys: Option<ApiKeys>,
    control: Arc<dyn Control>,
    signer: TokenSigner,
    store: Option<Arc<dyn Store>>,
    public_url: Option<String>,
) -> Router {
    let api = Arc::new(Api {
        keys,
        control,
        operations: Arc::default(),
        signer,
        store,
        public_url: public_url.map(|u| u.trim_end_matches('/').to_owned()),
    });
    let document = document();
    let (routes, _) = routes().split_for_parts();
    routes
        .fallback(|| async {
            ApiError::not_found("no such route in the control API (see /api/v1/openapi.json)")
        })
        .layer(axum::middleware::from_fn_with_state(api.clone(), authorize))
        .with_state(api)
        .route(
            OPENAPI_PATH,
            axum::routing::get(move || async move {
                ([(header::CONTENT_TYPE, "application/json")], document)
            }),
        )
}

/// The service key check, before any handler: 401 without `Authorization: Bearer <key>` or
/// with a key that is not one of [`ApiKeys`]. The key is never logged.
async fn authorize(State(api): State<Arc<Api>>, request: Request, next: Next) -> Response {
    let Some(keys) = &api.keys else {
        return ApiError::not_found(format!(
            "the control API is off on this server: set {} (see the README)",
            keys::API_KEY_ENV
        ))
        .into_response();
    };
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let refusal = match presented {
        None => "no `Authorization: Bearer <key>` header",
        Some(key) if keys.accepts(key.as_bytes()) => return next.run(request).await,
        Some(_) => "a key that is not this server's",
    };
    tracing::warn!(client = %client_of(&request), status = 401, path = %request.uri().path(), "control API refused: {refusal}");
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        format!(
            "the control API needs `Authorization: Bearer <{}>`: {refusal}",
            keys::API_KEY_ENV
        ),
    )
    .into_response()
}

impl Api {
    /// Where people reach this server: the public URL, else `http://<Host>`.
    fn base_url(&self, headers: &HeaderMap) -> String {
        self.public_url.clone().unwrap_or_else(|| {
            let host = headers
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or("127.0.0.1");
            format!("http://{host}")
        })
    }

    /// Moves the user to the next token generation and mints its token: through the database
    /// when there is one, else the token state directory.
    async fn rotate(&self, user: &UserId) -> Result<(u64, String), GenerationError> {
        match self.signer.rotate(user) {
            Ok(token) => Ok((self.signer.generation(user)?, token)),
            Err(GenerationError::InDatabase) => {
                let store = self.store.as_ref().ok_or(GenerationError::NoStore)?;
                let generation = store
                    .bump_token_generation(user.clone())
                    .await
                    .map_err(|e| GenerationError::Unavailable(e.to_string()))?;
                Ok((generation, self.signer.mint_at(user, generation)))
            }
            Err(e) => Err(e),
        }
    }
}
