//! Who is asking: the session cookie checked once, as axum extractors. [`SignedIn`] is any
//! signed-in session (401 without one); [`Owner`] is the session of the user the path names
//! (`/u/{user}/...`; another user's gets 403); [`Posted`] is an owner's form whose CSRF token is
//! the session's and whose `Origin`, when the browser sends one, is this server's (403).

use std::sync::Arc;

use axum::extract::{Form, FromRequest, FromRequestParts, RawPathParams, Request};
use axum::response::{IntoResponse, Response};
use http::request::Parts;
use http::{HeaderMap, StatusCode, header};
use serde::de::DeserializeOwned;

use super::Web;
use super::respond::Refused;
use super::signin::{Session, SessionError};
use crate::host::ProjectPages;
use crate::provider::SandboxProvider;

/// The session cookie's name.
pub(super) const COOKIE: &str = "shmastra_session";

/// The answer when nothing durable remembers used links and ended sessions.
pub(super) const SIGN_IN_OFF: Refused = Refused(
    StatusCode::SERVICE_UNAVAILABLE,
    "Sign-in is off",
    "This server has nowhere durable to remember used sign-in links (no --database-url and no SHMASTRA_TOKEN_STATE), so it signs no one in.",
    None,
);

/// A signed-in session.
pub(super) struct SignedIn(pub Session);

/// The session of the user whose pages the path names.
pub(super) struct Owner(pub Session);

/// A state-changing form from the owner's own page.
pub(super) struct Posted<F> {
    pub session: Session,
    pub form: F,
}

/// A form that carries the page's CSRF token.
pub(super) trait CsrfForm {
    /// The submitted token, if any.
    fn csrf(&self) -> Option<&str>;
}

/// A form read as its fields in order: the token is the `csrf` field.
impl CsrfForm for Vec<(String, String)> {
    fn csrf(&self) -> Option<&str> {
        self.iter()
            .find(|(name, _)| name == "csrf")
            .map(|(_, value)| value.as_str())
    }
}

impl<H: ProjectPages, P: SandboxProvider + 'static> FromRequestParts<Arc<Web<H, P>>> for SignedIn {
    type Rejection = Refused;

    async fn from_request_parts(parts: &mut Parts, web: &Arc<Web<H, P>>) -> Result<Self, Refused> {
        web.session(&parts.headers).await.map(SignedIn)
    }
}

impl<H: ProjectPages, P: SandboxProvider + 'static> FromRequestParts<Arc<Web<H, P>>> for Owner {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, web: &Arc<Web<H, P>>) -> Result<Self, Response> {
        let user = path_user(parts, web).await?;
        web.owner(&parts.headers, &user)
            .await
            .map(Owner)
            .map_err(IntoResponse::into_response)
    }
}

impl<H, P, F> FromRequest<Arc<Web<H, P>>> for Posted<F>
where
    H: ProjectPages,
    P: SandboxProvider + 'static,
    F: DeserializeOwned + CsrfForm + Send,
{
    type Rejection = Response;

    async fn from_request(request: Request, web: &Arc<Web<H, P>>) -> Result<Self, Response> {
        let (mut parts, body) = request.into_parts();
        let user = path_user(&mut parts, web).await?;
        let headers = parts.headers.clone();
        let Form(form) = Form::<F>::from_request(Request::from_parts(parts, body), web)
            .await
            .map_err(IntoResponse::into_response)?;
        let session = web
            .owner_posting(&headers, &user, form.csrf())
            .await
            .map_err(IntoResponse::into_response)?;
        Ok(Posted { session, form })
    }
}

/// The `{user}` of the matched route, percent-decoded.
async fn path_user<H: ProjectPages, P: SandboxProvider + 'static>(
    parts: &mut Parts,
    web: &Arc<Web<H, P>>,
) -> Result<String, Response> {
    let params = RawPathParams::from_request_parts(parts, web)
        .await
        .map_err(IntoResponse::into_response)?;
    Ok(params
        .iter()
        .find(|(name, _)| *name == "user")
        .map(|(_, value)| value.to_owned())
        .unwrap_or_default())
}

impl<H: ProjectPages, P: SandboxProvider + 'static> Web<H, P> {
    /// The signed-in session, or the page that says to sign in (or why no one can now).
    pub(super) async fn session(&self, headers: &HeaderMap) -> Result<Session, Refused> {
        let not_signed_in = Refused(
            StatusCode::UNAUTHORIZED,
            "Sign in",
            "You are not signed in, or your session ended. Ask for a sign-in link (shmastra-cloud login-link --user YOU) and open it.",
            None,
        );
        let Some(nonces) = &self.nonces else {
            return Err(SIGN_IN_OFF);
        };
        let cookie = cookie_value(headers, COOKIE).ok_or(not_signed_in)?;
        match self.sign_in.check_session(cookie, &**nonces).await {
            Ok(session) => Ok(session),
            Err(SessionError::Invalid) => Err(Refused(
                StatusCode::UNAUTHORIZED,
                "Sign in",
                "You are not signed in, or your session ended. Ask for a sign-in link (shmastra-cloud login-link --user YOU) and open it.",
                None,
            )),
            Err(SessionError::Unavailable) => Err(Refused(
                StatusCode::SERVICE_UNAVAILABLE,
                "Try again",
                "Your session cannot be checked right now: reload the page in a minute.",
                None,
            )),
        }
    }

    /// The session, which must be `user`'s own: anyone else gets 403.
    async fn owner(&self, headers: &HeaderMap, user: &str) -> Result<Session, Refused> {
        let session = self.session(headers).await?;
        if session.user.as_str() != user {
            tracing::warn!(signed_in = %session.user, asked = user, "refused: another user's project");
            return Err(Refused(
                StatusCode::FORBIDDEN,
                "Not your project",
                "This project belongs to another user.",
                Some(session.user),
            ));
        }
        Ok(session)
    }

    /// [`Web::owner`] for a state-changing request: the CSRF token must be the session's and
    /// the browser's `Origin`, when sent, this server's.
    async fn owner_posting(
        &self,
        headers: &HeaderMap,
        user: &str,
        csrf: Option<&str>,
    ) -> Result<Session, Refused> {
        let session = self.owner(headers, user).await?;
        let origin_ok = match headers.get(header::ORIGIN) {
            None => true,
            Some(_) => self.same_origin(headers),
        };
        if !origin_ok || !csrf.is_some_and(|t| self.sign_in.csrf_ok(&session, t)) {
            tracing::warn!(user = %session.user, origin_ok, "refused: a form without this session's CSRF token or from another origin");
            return Err(Refused(
                StatusCode::FORBIDDEN,
                "Refused",
                "This form did not come from your workspace page. Reload the page and try again.",
                Some(session.user),
            ));
        }
        Ok(session)
    }
}

pub(super) fn cookie_value<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn cookies_are_found_by_name() {
        let mut headers = HeaderMap::new();
        headers.append(
            header::COOKIE,
            HeaderValue::from_static("a=1; shmastra_session=x.y"),
        );
        headers.append(header::COOKIE, HeaderValue::from_static("b=2"));
        assert_eq!(cookie_value(&headers, COOKIE), Some("x.y"));
        assert_eq!(cookie_value(&headers, "b"), Some("2"));
        assert_eq!(cookie_value(&headers, "c"), None);
    }
}
