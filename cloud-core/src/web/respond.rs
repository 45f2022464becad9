//! How the page answers: HTML pages and messages, redirects, the refusals of the session
//! checks, and the security headers every answer carries.

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use maud::Markup;

use super::view;
use crate::user::UserId;

/// The page's headers on every answer: no caching (the form, the token), no framing, no
/// referrer to other sites (the sign-in link is in a URL; `no-referrer` would make browsers send
/// `Origin: null` on the page's own POSTs), scripts and styles only from this server.
pub(super) async fn security_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    let set = [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "same-origin"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::CACHE_CONTROL, "no-store"),
    ];
    for (name, value) in set {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

pub(super) fn html(status: StatusCode, markup: Markup) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        markup.into_string(),
    )
        .into_response()
}

pub(super) fn message(status: StatusCode, title: &str, text: &str) -> Response {
    message_for(status, title, text, None)
}

/// [`message`], with a link to `own`'s workspace when a valid session signs `own` in.
pub(super) fn message_for(
    status: StatusCode,
    title: &str,
    text: &str,
    own: Option<&UserId>,
) -> Response {
    html(
        status,
        view::message_page(title, text, own.map(UserId::as_str)),
    )
}

/// A request the page turns away: status, title, message, and the signed-in user when the
/// session is valid (the page then links to their own workspace).
pub(super) struct Refused(
    pub StatusCode,
    pub &'static str,
    pub &'static str,
    pub Option<UserId>,
);

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        message_for(self.0, self.1, self.2, self.3.as_ref())
    }
}

/// 429 with `Retry-After`: the user's other pages are still reading saves.
pub(super) fn busy_reading_saves() -> Response {
    let mut response = message(
        StatusCode::TOO_MANY_REQUESTS,
        "Busy",
        "Your other pages are still reading saves: try again in a moment.",
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
    response
}

pub(super) fn see_other(location: &str) -> Response {
    (StatusCode::SEE_OTHER, [(header::LOCATION, location)]).into_response()
}
