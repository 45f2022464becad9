//! How the page answers: HTML pages and messages, redirects, the refusals of the session
//! checks, and the security headers every answer carries.

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use maud::Markup;

use super::view;

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
    html(status, view::message_page(title, text))
}

/// A request the page turns away: status, title, message.
pub(super) struct Refused(pub StatusCode, pub &'static str, pub &'static str);

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        message(self.0, self.1, self.2)
    }
}

pub(super) fn see_other(location: &str) -> Response {
    (StatusCode::SEE_OTHER, [(header::LOCATION, location)]).into_response()
}
