//! The page's `GET` handlers: sign-in, the workspace page, its event stream, the history
//! fragment and a save's diff.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Form, Path, Query, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, StreamExt};
use http::{HeaderMap, HeaderValue, StatusCode, header};

use tokio::sync::broadcast::error::RecvError;

use super::respond::{busy_reading_saves, html, message, message_for, see_other};
use super::session::{COOKIE, Owner, SIGN_IN_OFF, SignedIn};
use super::signin::{self, LinkError};
use super::view::{self, PageData, ProjectLink};
use super::{PageEvent, Web};
use crate::admission::Busy;
use crate::host::{Diff, HostLink, ProjectPages};
use crate::orchestrate::history::{HistoryError, Save, SaveHistory};
use crate::provider::SandboxProvider;
use crate::user::UserId;

/// How many saves the page lists.
const HISTORY_LIMIT: usize = 30;

#[derive(serde::Deserialize)]
pub(super) struct LoginQuery {
    t: Option<String>,
}

/// The page of a refused link: to the user's own workspace when the browser's session is
/// still valid (a link opened twice, an old link from a chat).
async fn link_refused<H: ProjectPages + SaveHistory, P: SandboxProvider + 'static>(
    web: &Web<H, P>,
    headers: &HeaderMap,
    e: &LinkError,
) -> Response {
    tracing::info!(reason = %e, "sign-in link refused");
    let status = match e {
        LinkError::Used => StatusCode::GONE,
        LinkError::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        LinkError::Invalid | LinkError::Expired | LinkError::Revoked => StatusCode::UNAUTHORIZED,
    };
    let own = web.session(headers).await.ok().map(|session| session.user);
    message_for(status, "Sign-in refused", &e.to_string(), own.as_ref())
}

/// `GET /login?t=LINK` (and `HEAD`): who the link signs in, and the button that does it.
/// Nothing is spent: a link preview or a mail scanner leaves the link for its user.
pub(super) async fn login_page<H: ProjectPages + SaveHistory, P: SandboxProvider + 'static>(
    State(web): State<Arc<Web<H, P>>>,
    headers: HeaderMap,
    Query(query): Query<LoginQuery>,
) -> Response {
    let Some(nonces) = &web.nonces else {
        return SIGN_IN_OFF.into_response();
    };
    let Some(link) = query.t.as_deref() else {
        return link_refused(&web, &headers, &LinkError::Invalid).await;
    };
    match web.sign_in.inspect(link, &**nonces).await {
        Ok(user) => html(StatusCode::OK, view::sign_in_page(user.as_str(), link)),
        Err(e) => link_refused(&web, &headers, &e).await,
    }
}

/// `POST /login` from the sign-in page: spends the link and sets the session cookie. Only
/// this server's own page may send it (`Origin`, or `Sec-Fetch-Site: same-origin` from a
/// browser that sends no `Origin`): another site cannot sign a browser in as someone else.
pub(super) async fn login<H: ProjectPages + SaveHistory, P: SandboxProvider + 'static>(
    State(web): State<Arc<Web<H, P>>>,
    headers: HeaderMap,
    Form(query): Form<LoginQuery>,
) -> Response {
    let Some(nonces) = &web.nonces else {
        return SIGN_IN_OFF.into_response();
    };
    let same_site_fetch = headers
        .get("sec-fetch-site")
        .is_some_and(|v| v.as_bytes() == b"same-origin");
    let from_here = match headers.get(header::ORIGIN) {
        Some(_) => web.same_origin(&headers),
        None => same_site_fetch,
    };
    if !from_here {
        tracing::warn!("refused: a sign-in that did not come from this server's page");
        return message(
            StatusCode::FORBIDDEN,
            "Sign-in refused",
            "This sign-in did not come from this server's sign-in page. Open your link again.",
        );
    }
    let redeemed = match query.t.as_deref() {
        Some(link) => web.sign_in.redeem(link, &**nonces).await,
        None => Err(LinkError::Invalid),
    };
    let user = match redeemed {
        Ok(user) => user,
        Err(e) => return link_refused(&web, &headers, &e).await,
    };
    let session = match web.sign_in.session(&user) {
        Ok(session) => session,
        Err(e) => {
            tracing::error!(user = %user, error = %e, "cannot bind a session to the token generation");
            return link_refused(&web, &headers, &LinkError::Unavailable).await;
        }
    };
    tracing::info!(user = %user, "signed in");
    let mut cookie = format!(
        "{COOKIE}={session}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}",
        signin::SESSION_TTL.as_secs()
    );
    if web.secure(&headers) {
        cookie.push_str("; Secure");
    }
    let mut response = html(StatusCode::OK, view::signed_in_page(user.as_str()));
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&cookie).expect("cookie is ASCII"),
    );
    response
}

pub(super) async fn home(SignedIn(session): SignedIn) -> Response {
    see_other(&format!("/u/{}", session.user))
}

pub(super) async fn workspace_page<H: ProjectPages + SaveHistory, P: SandboxProvider + 'static>(
    State(web): State<Arc<Web<H, P>>>,
    Owner(session): Owner,
    headers: HeaderMap,
) -> Response {
    let user = session.user.clone();
    web.ensure_sandbox(&user);
    let flash = web.flashes.take(&user);
    let status = web.statuses.status(user.as_str()).await;
    let link = match web.backend.orchestrator().host() {
        Some(host) => host.link(&user).await,
        None => HostLink::Unavailable,
    };
    let project = match link {
        HostLink::WebUrl(web_url) => Some(ProjectLink::GitLab { web_url }),
        HostLink::CloneHere => Some(ProjectLink::Embedded {
            clone_url: format!("{}/api/git/{user}.git", web.base_url(&headers)),
            token: web
                .signer
                .mint_current(&user)
                .unwrap_or_else(|_| web.signer.mint(&user)),
        }),
        HostLink::Unavailable => None,
    };
    let csrf = web.sign_in.csrf(&session);
    let data = PageData {
        user: user.as_str(),
        csrf: &csrf,
        status: status.as_ref(),
        sandboxes: web.backend.lifecycle().is_some(),
        project,
        history: web.history_of(&user).await,
        notice: flash.notice.as_deref(),
        problems: &flash.problems,
    };
    html(StatusCode::OK, view::page(&data))
}

/// The live status of the user's sandbox (server-sent events): the status fragment at once
/// and on every change. Capped per user and in total (429/503 with `Retry-After`), and ended
/// after [`super::EventStreamLimits::idle`] with no change.
pub(super) async fn events<H: ProjectPages + SaveHistory, P: SandboxProvider + 'static>(
    State(web): State<Arc<Web<H, P>>>,
    Owner(session): Owner,
) -> Response {
    let slot = match web.streams.admit(&session.user) {
        Ok(slot) => slot,
        Err(busy) => {
            let (status, text) = match busy {
                Busy::User => (
                    StatusCode::TOO_MANY_REQUESTS,
                    "You have too many live pages open: close some.",
                ),
                Busy::Total => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "Too many live pages are open on this server right now: try again in a minute.",
                ),
            };
            tracing::warn!(user = %session.user, status = status.as_u16(), "event stream refused: too many open");
            let mut response = message(status, "Too many live pages", text);
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("30"));
            return response;
        }
    };
    let changes = web.statuses.subscribe();
    let page_events = web.page_events.subscribe();
    let csrf = web.sign_in.csrf(&session);
    let idle = web.stream_idle;
    let render = || Render {
        web: web.clone(),
        user: session.user.clone(),
        csrf: csrf.clone(),
    };
    // A notice that came before this stream did (a restore done while the page loaded)
    // comes first; later ones come over `page_events`, subscribed to above.
    let first = {
        let render = render();
        stream::once(async move {
            let mut events = vec![render.status().await];
            if let Some(text) = render.web.flashes.take_notice_alone(&render.user) {
                events.push(Ok(Event::default().event("notice").data(text)));
            }
            stream::iter(events)
        })
        .flatten()
    };
    let render = render();
    let user = session.user.clone();
    // The slot travels with the stream and is freed when the client goes or the stream ends.
    let later = stream::unfold(
        (changes, page_events, render, user, slot),
        move |(mut changes, mut page_events, render, user, slot)| async move {
            // Other users' changes do not keep this stream alive.
            let deadline = tokio::time::Instant::now() + idle;
            loop {
                let events = tokio::select! {
                    change = tokio::time::timeout_at(deadline, changes.recv()) => match change {
                        Err(_) => return None,
                        Ok(Ok(change)) if change.sandbox != user.as_str() => continue,
                        // Behind: the latest status is all the page needs. A status change may
                        // come with saves (a sync, a restore): the history goes with it.
                        Ok(Ok(_)) | Ok(Err(RecvError::Lagged(_))) => {
                            vec![render.status().await, render.history().await]
                        }
                        Ok(Err(RecvError::Closed)) => return None,
                    },
                    event = page_events.recv() => match event {
                        Ok(event) if event.user() != &user => continue,
                        Ok(PageEvent::Saved(_)) | Err(RecvError::Lagged(_)) => {
                            vec![render.history().await]
                        }
                        Ok(PageEvent::Notice(_, text)) => {
                            // The page shows it now, so the next load does not show it again;
                            // another of the user's pages may have taken it first.
                            if !render.web.flashes.take_notice(&user, &text) {
                                continue;
                            }
                            vec![Ok(Event::default().event("notice").data(text))]
                        }
                        Err(RecvError::Closed) => return None,
                    },
                };
                return Some((
                    stream::iter(events),
                    (changes, page_events, render, user, slot),
                ));
            }
        },
    )
    .flatten();
    Sse::new(first.chain(later))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

/// What an event stream renders for its user.
struct Render<H, P> {
    web: Arc<Web<H, P>>,
    user: UserId,
    csrf: String,
}

impl<H: ProjectPages + SaveHistory, P: SandboxProvider + 'static> Render<H, P> {
    /// The `status` event: the status fragment.
    async fn status(&self) -> Result<Event, Infallible> {
        let status = self.web.statuses.status(self.user.as_str()).await;
        Ok(Event::default()
            .event("status")
            .data(view::to_event_data(view::status_fragment(
                self.user.as_str(),
                &self.csrf,
                status.as_ref(),
                self.web.backend.lifecycle().is_some(),
                &[],
            ))))
    }

    /// The `history` event: the history fragment.
    async fn history(&self) -> Result<Event, Infallible> {
        let saves = self.web.history_of(&self.user).await;
        let status = self.web.statuses.status(self.user.as_str()).await;
        Ok(Event::default()
            .event("history")
            .data(view::to_event_data(view::history_fragment(
                self.user.as_str(),
                &self.csrf,
                &saves,
                view::can_restore(status.as_ref(), self.web.backend.lifecycle().is_some()),
            ))))
    }
}

pub(super) async fn history<H: ProjectPages + SaveHistory, P: SandboxProvider + 'static>(
    State(web): State<Arc<Web<H, P>>>,
    Owner(session): Owner,
) -> Response {
    let saves = web.history_of(&session.user).await;
    let csrf = web.sign_in.csrf(&session);
    let status = web.statuses.status(session.user.as_str()).await;
    html(
        StatusCode::OK,
        view::history_fragment(
            session.user.as_str(),
            &csrf,
            &saves,
            view::can_restore(status.as_ref(), web.backend.lifecycle().is_some()),
        ),
    )
}

/// A commit id or unique prefix: hex, 4 to 64 digits.
pub(super) fn is_commit_id(text: &str) -> bool {
    (4..=64).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_hexdigit())
}

pub(super) async fn save_diff<H: ProjectPages + SaveHistory, P: SandboxProvider + 'static>(
    State(web): State<Arc<Web<H, P>>>,
    Owner(session): Owner,
    Path((_, commit)): Path<(String, String)>,
) -> Response {
    if !is_commit_id(&commit) {
        return message(
            StatusCode::NOT_FOUND,
            "No such save",
            "That is not a save id.",
        );
    }
    let Some(host) = web.backend.orchestrator().host() else {
        return message(
            StatusCode::NOT_FOUND,
            "No history",
            "Project persistence is off.",
        );
    };
    match host.diff(&session.user, &commit).await {
        Diff::Save(diff) => {
            let status = web.statuses.status(session.user.as_str()).await;
            let restore = view::can_restore(status.as_ref(), web.backend.lifecycle().is_some());
            html(
                StatusCode::OK,
                view::diff_page(
                    session.user.as_str(),
                    &web.sign_in.csrf(&session),
                    restore,
                    &diff,
                ),
            )
        }
        Diff::Elsewhere(url) => see_other(&url),
        Diff::Missing(why) => message(StatusCode::NOT_FOUND, "No such save", &why),
        Diff::Busy => busy_reading_saves(),
    }
}

impl<H: ProjectPages + SaveHistory, P: SandboxProvider + 'static> Web<H, P> {
    /// The saves the page lists, or what to say instead.
    async fn history_of(&self, user: &UserId) -> Result<Vec<Save>, String> {
        self.histories.get(user, || self.read_history(user)).await
    }

    /// The history from the host, bypassing the cache.
    async fn read_history(&self, user: &UserId) -> Result<Vec<Save>, String> {
        self.backend
            .orchestrator()
            .history(user, HISTORY_LIMIT)
            .await
            .map_err(|e| match e {
                HistoryError::Off => e.to_string(),
                e => {
                    tracing::warn!(user = %user, error = %e, "cannot read the history");
                    "The history cannot be read right now.".to_owned()
                }
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_ids_are_hex() {
        assert!(is_commit_id("1a2b3c4d"));
        assert!(!is_commit_id("HEAD"));
        assert!(!is_commit_id("1a2"));
        assert!(!is_commit_id("--output=x"));
    }
}
