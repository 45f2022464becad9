//! The workspace page served by `serve`: sign-in by one-time link, the status of the user's
//! sandbox live over server-sent events, the project link, the history of saves with their
//! diffs and "Restore this version", and the restore project form.
//!
//! Routes (all but `/login` and `/static/*` need the session cookie; `/u/<user>/...` needs it
//! to be `<user>`'s, else 403; every POST needs the session's CSRF token and, when the browser
//! sends one, an `Origin` equal to the server's):
//! `GET /login?t=LINK`, `GET /`, `GET /u/<user>`, `GET /u/<user>/events`,
//! `GET /u/<user>/history`, `GET /u/<user>/saves/<commit>`, `POST /u/<user>/restore-version`,
//! `POST /u/<user>/restore-project`, `GET /static/page.js`, `GET /static/page.css`.

pub mod sandboxes;
pub mod signin;
pub mod statuses;
pub mod view;

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Form, Path, Query, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::stream::{self, StreamExt};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use maud::Markup;

use crate::UserId;
use crate::gitlab::GitLab;
use crate::orchestrate::history::{HistoryError, RestoreToError, SaveHistory};
use crate::orchestrate::lifecycle::{Lifecycle, Reprovisioned};
use crate::orchestrate::{
    OrchestrateError, Orchestrator, Persistence, ProjectHost, SandboxStatus, StatusSink,
};
use crate::provider::{LocalProvider, SandboxProvider};
use crate::proxy::embedded::EmbeddedUpstream;
use crate::proxy::events::{ExternalPush, OnExternalPush};
use crate::secrets::{FormProblem, SecretValue};
use crate::store::Store;
use crate::store::memory::MemoryStore;
use crate::token::TokenSigner;
use sandboxes::LocalSandboxes;
use signin::{LinkError, Session, SignIn};
use statuses::{LocalStatuses, StatusBoard, StoreStatuses};
use view::{PageData, ProjectLink};

/// The session cookie's name.
const COOKIE: &str = "shmastra_session";
/// How many saves the page lists.
const HISTORY_LIMIT: usize = 30;
/// The most of a diff the page shows.
const MAX_DIFF_BYTES: usize = 1 << 20;

/// The page's settings.
#[derive(Debug, Clone, Default)]
pub struct WebConfig {
    /// Where people reach this server (`https://cloud.example`); links and the clone URL use
    /// it, an `https` one makes the cookie `Secure`, and POSTs must come from its origin.
    /// Without it, `http://<Host header>`.
    pub public_url: Option<String>,
    /// Run each user's sandbox on this machine.
    pub sandboxes: Option<LocalSandboxes>,
}

/// What the page needs from where projects live, beyond history.
pub trait ProjectPages: ProjectHost + SaveHistory + Sized + 'static {
    /// Where the project button leads.
    fn link(&self, user: &UserId) -> impl Future<Output = HostLink> + Send;
    /// One save's diff.
    fn diff(&self, user: &UserId, commit: &str) -> impl Future<Output = Diff> + Send;
}

/// Where a user's project is reached.
pub enum HostLink {
    /// A page of the host (GitLab's project page).
    WebUrl(String),
    /// Through this server's git proxy: the clone URL and the project token.
    CloneHere,
    /// The host cannot say now.
    Unavailable,
}

/// A save's diff: its text, or where it is shown.
pub enum Diff {
    Text(String),
    Elsewhere(String),
    Missing(String),
}

impl ProjectPages for GitLab {
    async fn link(&self, user: &UserId) -> HostLink {
        match self.ensure_user_project(user).await {
            Ok(project) if !project.web_url.is_empty() => HostLink::WebUrl(project.web_url),
            Ok(_) => HostLink::Unavailable,
            Err(e) => {
                tracing::warn!(user = %user, error = %e, "cannot find the GitLab project");
                HostLink::Unavailable
            }
        }
    }

    async fn diff(&self, user: &UserId, commit: &str) -> Diff {
        match self.link(user).await {
            HostLink::WebUrl(url) => Diff::Elsewhere(format!("{url}/-/commit/{commit}")),
            _ => Diff::Missing("the GitLab project cannot be reached".into()),
        }
    }
}

impl ProjectPages for EmbeddedUpstream {
    async fn link(&self, _user: &UserId) -> HostLink {
        HostLink::CloneHere
    }

    async fn diff(&self, user: &UserId, commit: &str) -> Diff {
        let out = tokio::process::Command::new("git")
            .arg("--git-dir")
            .arg(self.repo_dir(user))
            .args(["show", "--stat", "--patch", "--format=fuller", commit, "--"])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .output()
            .await;
        match out {
            Ok(out) if out.status.success() => {
                let text = &out.stdout[..out.stdout.len().min(MAX_DIFF_BYTES)];
                Diff::Text(String::from_utf8_lossy(text).into_owned())
            }
            _ => Diff::Missing(format!("no save {commit} in this project")),
        }
    }
}

/// Where sandboxes come from on this server, if anywhere.
enum Backend<H> {
    Sandboxes(Box<Lifecycle<LocalProvider, H>>),
    HistoryOnly(Box<Orchestrator<H>>),
}

impl<H: ProjectHost> Backend<H> {
    fn orchestrator(&self) -> &Orchestrator<H> {
        match self {
            Backend::Sandboxes(lifecycle) => lifecycle.orchestrator(),
            Backend::HistoryOnly(orchestrator) => orchestrator,
        }
    }

    fn lifecycle(&self) -> Option<&Lifecycle<LocalProvider, H>> {
        match self {
            Backend::Sandboxes(lifecycle) => Some(lifecycle),
            Backend::HistoryOnly(_) => None,
        }
    }
}

/// What the next page load shows once (Post/Redirect/Get): a notice, and the restore form's
/// problems (names only, never a value).
#[derive(Default)]
struct Flash {
    notice: Option<String>,
    problems: Vec<FormProblem>,
}

struct Web<H> {
    sign_in: SignIn,
    /// Where used sign-in links are remembered: the shared store, so a link signs in once
    /// across replicas.
    used: Arc<dyn Store>,
    signer: TokenSigner,
    statuses: Arc<dyn StatusBoard>,
    backend: Backend<H>,
    public_url: Option<String>,
    started: Mutex<HashSet<UserId>>,
    flash: Mutex<HashMap<UserId, Flash>>,
}

/// The page's routes, what an external push does to a sandbox here, and the sandboxes to stop
/// at shutdown.
pub struct Workspace {
    pub router: Router,
    pub on_push: Option<OnExternalPush>,
    pub sandboxes: Option<LocalSandboxes>,
}

/// Builds the page over `host`. `listen` is serve's bound address: sandboxes on this machine
/// push through it. With the replicas' shared `store`, statuses and used sign-in links are
/// every replica's; without, this process's own.
pub fn workspace<H: ProjectPages>(
    host: H,
    signer: TokenSigner,
    config: &WebConfig,
    listen: SocketAddr,
    store: Option<Arc<dyn Store>>,
) -> std::io::Result<Workspace> {
    let (statuses, used): (Arc<dyn StatusBoard>, Arc<dyn Store>) = match store {
        Some(store) => (Arc::new(StoreStatuses::new(store.clone())), store),
        None => (
            Arc::new(LocalStatuses::default()),
            Arc::new(MemoryStore::new()),
        ),
    };
    let loopback = match listen.ip() {
        ip if ip.is_unspecified() => SocketAddr::new([127, 0, 0, 1].into(), listen.port()),
        _ => listen,
    };
    let persistence = Persistence {
        host,
        signer: signer.clone(),
        git_url: format!("http://{loopback}/api/git"),
    };
    let backend = match &config.sandboxes {
        Some(local) => {
            let orchestrator = Orchestrator::new(Some(persistence), local.layout());
            let sink: Arc<dyn StatusSink> = statuses.clone();
            Backend::Sandboxes(Box::new(Lifecycle::new(
                local.provider()?,
                orchestrator,
                sink,
            )))
        }
        None => Backend::HistoryOnly(Box::new(Orchestrator::new(
            Some(persistence),
            crate::orchestrate::SandboxLayout::shmastra(),
        ))),
    };
    let web = Arc::new(Web {
        sign_in: SignIn::new(signer.clone()),
        used,
        signer,
        statuses,
        backend,
        public_url: config
            .public_url
            .as_ref()
            .map(|u| u.trim_end_matches('/').to_owned()),
        started: Mutex::new(HashSet::new()),
        flash: Mutex::new(HashMap::new()),
    });
    let on_push = config.sandboxes.as_ref().map(|_| {
        let web = web.clone();
        Arc::new(move |push: ExternalPush| {
            let web = web.clone();
            tokio::spawn(async move { web.sync_after_push(push.user).await });
        }) as OnExternalPush
    });
    if let Some(local) = &config.sandboxes {
        // Sandboxes left from an earlier run get their watcher back.
        for entry in std::fs::read_dir(&local.root)?.flatten() {
            if let Ok(user) = UserId::parse(&entry.file_name().to_string_lossy()) {
                web.ensure_sandbox(&user);
            }
        }
    }
    let router = Router::new()
        .route("/login", get(login::<H>))
        .route("/", get(home::<H>))
        .route("/u/{user}", get(workspace_page::<H>))
        .route("/u/{user}/events", get(events::<H>))
        .route("/u/{user}/history", get(history::<H>))
        .route("/u/{user}/saves/{commit}", get(save_diff::<H>))
        .route("/u/{user}/restore-version", post(restore_version::<H>))
        .route("/u/{user}/restore-project", post(restore_project::<H>))
        .route(
            "/static/page.js",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
                    view::PAGE_JS,
                )
            }),
        )
        .route(
            "/static/page.css",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
                    view::PAGE_CSS,
                )
            }),
        )
        .layer(axum::middleware::map_response(security_headers))
        .with_state(web);
    Ok(Workspace {
        router,
        on_push,
        sandboxes: config.sandboxes.clone(),
    })
}

/// The page's headers on every answer: no caching (the form, the token), no framing, no
/// referrer to other sites (the sign-in link is in a URL; `no-referrer` would make browsers send
/// `Origin: null` on the page's own POSTs), scripts and styles only from this server.
async fn security_headers(mut response: Response) -> Response {
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

fn html(status: StatusCode, markup: Markup) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        markup.into_string(),
    )
        .into_response()
}

fn message(status: StatusCode, title: &str, text: &str) -> Response {
    html(status, view::message_page(title, text))
}

/// A request the page turns away: status, title, message.
struct Refused(StatusCode, &'static str, &'static str);

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        message(self.0, self.1, self.2)
    }
}

fn see_other(location: &str) -> Response {
    (StatusCode::SEE_OTHER, [(header::LOCATION, location)]).into_response()
}

fn cookie_value<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

impl<H: ProjectPages> Web<H> {
    /// The signed-in session, or the page that says to sign in.
    fn session(&self, headers: &HeaderMap) -> Result<Session, Refused> {
        cookie_value(headers, COOKIE)
            .and_then(|v| self.sign_in.check_session(v))
            .ok_or(Refused(
                StatusCode::UNAUTHORIZED,
                "Sign in",
                "You are not signed in, or your session ended. Ask for a sign-in link (shmastra-cloud login-link --user YOU) and open it.",
            ))
    }

    /// The session, which must be `user`'s own: anyone else gets 403.
    fn owner(&self, headers: &HeaderMap, user: &str) -> Result<Session, Refused> {
        let session = self.session(headers)?;
        if session.user.as_str() != user {
            tracing::warn!(signed_in = %session.user, asked = user, "refused: another user's project");
            return Err(Refused(
                StatusCode::FORBIDDEN,
                "Not your project",
                "This project belongs to another user.",
            ));
        }
        Ok(session)
    }

    /// [`Web::owner`] for a state-changing request: the CSRF token must be the session's and
    /// the browser's `Origin`, when sent, this server's.
    fn owner_posting(
        &self,
        headers: &HeaderMap,
        user: &str,
        csrf: Option<&str>,
    ) -> Result<Session, Refused> {
        let session = self.owner(headers, user)?;
        let origin_ok = match headers.get(header::ORIGIN) {
            None => true,
            Some(origin) => origin
                .to_str()
                .is_ok_and(|o| Some(o) == self.origin(headers).as_deref()),
        };
        if !origin_ok || !csrf.is_some_and(|t| self.sign_in.csrf_ok(&session, t)) {
            tracing::warn!(user = %session.user, origin_ok, "refused: a form without this session's CSRF token or from another origin");
            return Err(Refused(
                StatusCode::FORBIDDEN,
                "Refused",
                "This form did not come from your workspace page. Reload the page and try again.",
            ));
        }
        Ok(session)
    }

    /// This server's origin: the public URL's, else `http://<Host>`.
    fn origin(&self, headers: &HeaderMap) -> Option<String> {
        match &self.public_url {
            Some(url) => Some(origin_of(url)),
            None => headers
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(|host| format!("http://{host}")),
        }
    }

    fn base_url(&self, headers: &HeaderMap) -> String {
        self.public_url
            .clone()
            .or_else(|| self.origin(headers))
            .unwrap_or_default()
    }

    fn secure(&self, headers: &HeaderMap) -> bool {
        self.public_url
            .as_deref()
            .is_some_and(|u| u.starts_with("https://"))
            || headers
                .get("x-forwarded-proto")
                .is_some_and(|p| p.as_bytes().eq_ignore_ascii_case(b"https"))
    }

    fn take_flash(&self, user: &UserId) -> Flash {
        self.flash
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(user)
            .unwrap_or_default()
    }

    fn put_flash(&self, user: &UserId, flash: Flash) {
        self.flash
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(user.clone(), flash);
    }

    /// Once per user and server run: brings the user's sandbox up (created and restored when
    /// there is none, the watcher started), in the background; the status shows each step.
    fn ensure_sandbox(self: &Arc<Self>, user: &UserId) {
        if self.backend.lifecycle().is_none()
            || !self
                .started
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(user.clone())
        {
            return;
        }
        let web = self.clone();
        let user = user.clone();
        tokio::spawn(async move {
            let Some(lifecycle) = web.backend.lifecycle() else {
                return;
            };
            match lifecycle.reprovision(&user, Vec::new()).await {
                Ok(Reprovisioned::Present(_)) => {
                    if web.statuses.status(user.as_str()).await.is_none() {
                        web.statuses.set_status(user.as_str(), SandboxStatus::Ready);
                    }
                }
                Ok(_) => {}
                // The status says it (NeedsSecrets, Broken): the page shows it.
                Err(e) => tracing::info!(user = %user, error = %e, "the sandbox is not up yet"),
            }
        });
    }

    async fn sync_after_push(&self, user: UserId) {
        let Some(lifecycle) = self.backend.lifecycle() else {
            return;
        };
        if lifecycle.provider().connect(&user).await.is_err() {
            return;
        }
        // A failed sync is in the status (the page shows it); only a lost sandbox is more.
        if let Err(e) = lifecycle.sync(&user).await {
            tracing::warn!(user = %user, error = %e, "sync after an external push failed");
        }
    }

    async fn history_of(
        &self,
        user: &UserId,
    ) -> Result<Vec<crate::orchestrate::history::Save>, String> {
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

/// `scheme://host[:port]` of a URL.
fn origin_of(url: &str) -> String {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    match url[after_scheme..].find(['/', '?', '#']) {
        Some(end) => url[..after_scheme + end].to_owned(),
        None => url.to_owned(),
    }
}

#[derive(serde::Deserialize)]
struct LoginQuery {
    t: Option<String>,
}

async fn login<H: ProjectPages>(
    State(web): State<Arc<Web<H>>>,
    headers: HeaderMap,
    Query(query): Query<LoginQuery>,
) -> Response {
    let redeemed = match query.t.as_deref() {
        Some(link) => web.sign_in.redeem(link, &*web.used).await,
        None => Err(LinkError::Invalid),
    };
    let user = match redeemed {
        Ok(user) => user,
        Err(e) => {
            tracing::info!(reason = %e, "sign-in link refused");
            let status = match e {
                LinkError::Used => StatusCode::GONE,
                LinkError::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
                LinkError::Invalid | LinkError::Expired => StatusCode::UNAUTHORIZED,
            };
            return message(status, "Sign-in refused", &e.to_string());
        }
    };
    tracing::info!(user = %user, "signed in");
    let mut cookie = format!(
        "{COOKIE}={}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}",
        web.sign_in.session(&user),
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

async fn home<H: ProjectPages>(State(web): State<Arc<Web<H>>>, headers: HeaderMap) -> Response {
    match web.session(&headers) {
        Ok(session) => see_other(&format!("/u/{}", session.user)),
        Err(refused) => refused.into_response(),
    }
}

async fn workspace_page<H: ProjectPages>(
    State(web): State<Arc<Web<H>>>,
    headers: HeaderMap,
    Path(user): Path<String>,
) -> Response {
    let session = match web.owner(&headers, &user) {
        Ok(session) => session,
        Err(refused) => return refused.into_response(),
    };
    let user = session.user.clone();
    web.ensure_sandbox(&user);
    let flash = web.take_flash(&user);
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

async fn events<H: ProjectPages>(
    State(web): State<Arc<Web<H>>>,
    headers: HeaderMap,
    Path(user): Path<String>,
) -> Response {
    let session = match web.owner(&headers, &user) {
        Ok(session) => session,
        Err(refused) => return refused.into_response(),
    };
    let changes = web.statuses.subscribe();
    let csrf = web.sign_in.csrf(&session);
    let render = {
        let web = web.clone();
        let user = session.user.clone();
        move || {
            let (web, user, csrf) = (web.clone(), user.clone(), csrf.clone());
            async move {
                let status = web.statuses.status(user.as_str()).await;
                Ok::<_, Infallible>(Event::default().event("status").data(view::to_event_data(
                    view::status_fragment(
                        user.as_str(),
                        &csrf,
                        status.as_ref(),
                        web.backend.lifecycle().is_some(),
                        &[],
                    ),
                )))
            }
        }
    };
    let first = stream::once(render());
    let user = session.user.to_string();
    let later = stream::unfold(
        (changes, render, user),
        |(mut changes, render, user)| async move {
            loop {
                match changes.recv().await {
                    Ok(change) if change.sandbox != user => continue,
                    // Behind: the latest status is all the page needs.
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        let event = render().await;
                        return Some((event, (changes, render, user)));
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                }
            }
        },
    );
    Sse::new(first.chain(later))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

async fn history<H: ProjectPages>(
    State(web): State<Arc<Web<H>>>,
    headers: HeaderMap,
    Path(user): Path<String>,
) -> Response {
    let session = match web.owner(&headers, &user) {
        Ok(session) => session,
        Err(refused) => return refused.into_response(),
    };
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
fn is_commit_id(text: &str) -> bool {
    (4..=64).contains(&text.len()) && text.bytes().all(|b| b.is_ascii_hexdigit())
}

async fn save_diff<H: ProjectPages>(
    State(web): State<Arc<Web<H>>>,
    headers: HeaderMap,
    Path((user, commit)): Path<(String, String)>,
) -> Response {
    let session = match web.owner(&headers, &user) {
        Ok(session) => session,
        Err(refused) => return refused.into_response(),
    };
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
        Diff::Text(text) => html(
            StatusCode::OK,
            view::diff_page(session.user.as_str(), &commit, &text),
        ),
        Diff::Elsewhere(url) => see_other(&url),
        Diff::Missing(why) => message(StatusCode::NOT_FOUND, "No such save", &why),
    }
}

#[derive(serde::Deserialize)]
struct RestoreVersionForm {
    csrf: Option<String>,
    commit: String,
}

async fn restore_version<H: ProjectPages>(
    State(web): State<Arc<Web<H>>>,
    headers: HeaderMap,
    Path(user): Path<String>,
    Form(form): Form<RestoreVersionForm>,
) -> Response {
    let session = match web.owner_posting(&headers, &user, form.csrf.as_deref()) {
        Ok(session) => session,
        Err(refused) => return refused.into_response(),
    };
    let page = format!("/u/{}", session.user);
    if !is_commit_id(&form.commit) {
        return message(
            StatusCode::BAD_REQUEST,
            "Not a save",
            "That is not a save id.",
        );
    }
    let status = web.statuses.status(session.user.as_str()).await;
    if !view::can_restore(status.as_ref(), web.backend.lifecycle().is_some()) {
        return message(
            StatusCode::CONFLICT,
            "Not now",
            "Your sandbox is not up on this server: an earlier version can be restored once it is.",
        );
    }
    let user = session.user;
    tokio::spawn(async move {
        let Some(lifecycle) = web.backend.lifecycle() else {
            return;
        };
        let outcome = match lifecycle.provider().connect(&user).await {
            Ok(sandbox) => lifecycle
                .orchestrator()
                .restore_to(&sandbox, &user, &form.commit, &[], &web.statuses)
                .await
                .map(|done| done.from),
            Err(e) => Err(RestoreToError::Orchestrate(OrchestrateError::Sandbox(e))),
        };
        let notice = match outcome {
            Ok(from) => format!("Restored the version {}.", &from[..from.len().min(12)]),
            Err(e) => {
                tracing::warn!(user = %user, error = %e, "restore to an earlier save failed");
                e.to_string()
            }
        };
        web.put_flash(
            &user,
            Flash {
                notice: Some(notice),
                problems: Vec::new(),
            },
        );
    });
    see_other(&page)
}

/// The form's secret fields are named `env.<NAME>`; an empty field counts as not given.
const SECRET_FIELD: &str = "env.";

async fn restore_project<H: ProjectPages>(
    State(web): State<Arc<Web<H>>>,
    headers: HeaderMap,
    Path(user): Path<String>,
    Form(fields): Form<Vec<(String, String)>>,
) -> Response {
    let csrf = fields
        .iter()
        .find(|(name, _)| name == "csrf")
        .map(|(_, value)| value.as_str());
    let session = match web.owner_posting(&headers, &user, csrf) {
        Ok(session) => session,
        Err(refused) => return refused.into_response(),
    };
    let user = session.user;
    let page = format!("/u/{user}");
    let Some(lifecycle) = web.backend.lifecycle() else {
        return see_other(&page);
    };
    if !matches!(
        web.statuses.status(user.as_str()).await,
        Some(SandboxStatus::NeedsSecrets { .. })
    ) {
        web.put_flash(
            &user,
            Flash {
                notice: Some("Your project does not wait for secrets.".into()),
                problems: Vec::new(),
            },
        );
        return see_other(&page);
    }
    let submitted: Vec<(String, SecretValue)> = fields
        .into_iter()
        .filter_map(|(name, value)| {
            let name = name.strip_prefix(SECRET_FIELD)?.to_owned();
            (!value.is_empty()).then(|| (name, SecretValue::new(value)))
        })
        .collect();
    match lifecycle.reprovision(&user, submitted).await {
        Ok(_) => {}
        Err(OrchestrateError::Form(e)) => web.put_flash(
            &user,
            Flash {
                notice: None,
                problems: e.problems,
            },
        ),
        Err(e) => web.put_flash(
            &user,
            Flash {
                notice: Some(e.to_string()),
                problems: Vec::new(),
            },
        ),
    }
    see_other(&page)
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn origins() {
        assert_eq!(
            origin_of("https://cloud.example/x?y"),
            "https://cloud.example"
        );
        assert_eq!(origin_of("http://127.0.0.1:8080"), "http://127.0.0.1:8080");
    }

    #[test]
    fn save_ids_are_hex() {
        assert!(is_commit_id("1a2b3c4d"));
        assert!(!is_commit_id("HEAD"));
        assert!(!is_commit_id("1a2"));
        assert!(!is_commit_id("--output=x"));
    }
}
