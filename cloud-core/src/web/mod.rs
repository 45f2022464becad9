//! The workspace page served by `serve`: sign-in by one-time link, the status of the user's
//! sandbox live over server-sent events, the project link, the history of saves with their
//! diffs and "Restore this version", and the restore project form.
//!
//! Routes (all but `/login` and `/static/*` need the session cookie; `/u/<user>/...` needs it
//! to be `<user>`'s, else 403; every POST needs the session's CSRF token and, when the browser
//! sends one, an `Origin` equal to the server's):
//! `GET /login?t=LINK`, `POST /login`, `GET /`, `GET /u/<user>`, `GET /u/<user>/events`,
//! `GET /u/<user>/history`, `GET /u/<user>/saves/<commit>`, `POST /u/<user>/restore-version`,
//! `POST /u/<user>/restore-file`, `POST /u/<user>/restore-project`, `POST /u/<user>/sign-out`, `GET /static/page.js`,
//! `GET /static/page.css`.
//!
//! This module wires them; `session` checks who asks, `pages` and `actions` answer,
//! `background` runs what they start, `respond` and `flash` are how they answer.

mod actions;
mod background;
mod control;
mod flash;
mod history_cache;
mod pages;
mod respond;
pub mod sandboxes;
mod session;
pub mod signin;
pub mod statuses;
pub mod view;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::routing::{get, post};
use http::{HeaderMap, header};

use crate::admission::Admission;
use crate::e2b::{E2bError, E2bLifecycle, E2bProvider, E2bSettings};
use crate::event::{ExternalPush, OnExternalPush};
use crate::host::ProjectPages;
use crate::nonces::{NonceDir, Nonces, StoreNonces};
use crate::orchestrate::history::SaveHistory;
use crate::orchestrate::lifecycle::Lifecycle;
use crate::orchestrate::{Orchestrator, Persistence, SandboxLayout};
use crate::provider::{LocalProvider, SandboxProvider};
use crate::status::StatusSink;
use crate::store::Store;
use crate::store::memory::MemoryStore;
use crate::token::TokenSigner;
use crate::user::UserId;
use flash::Flashes;
use sandboxes::LocalSandboxes;
use signin::SignIn;
use statuses::{LocalStatuses, StatusBoard, StoreStatuses};

/// The page's settings.
#[derive(Debug, Clone, Default)]
pub struct WebConfig {
    /// Where people reach this server (`https://cloud.example`); links and the clone URL use
    /// it, an `https` one makes the cookie `Secure`, and POSTs must come from its origin.
    /// Without it, `http://<Host header>`.
    pub public_url: Option<String>,
    /// Run each user's sandbox on this machine.
    pub sandboxes: Option<LocalSandboxes>,
    /// The token state directory (`SHMASTRA_TOKEN_STATE`): without a database, used sign-in
    /// links and signed-out sessions are remembered there, across restarts. With neither, the
    /// page signs no one in.
    pub token_state: Option<std::path::PathBuf>,
    /// Bounds on the pages' live event streams.
    pub event_streams: EventStreamLimits,
    /// Run each user's sandbox at E2B (`E2B_API_KEY` and friends). Its watcher pushes to
    /// `<public_url>/api/git`, so it needs `public_url`.
    pub e2b: Option<E2bSettings>,
    /// The dev server's health URL inside an E2B sandbox (default: the template's,
    /// `http://localhost:4111/health`).
    pub health_url: Option<String>,
}

/// Bounds on `/u/<user>/events`: each stream holds a connection for as long as it is open, so
/// they are capped per user and in total (below serve's connection limit, which leaves the
/// rest to git and other pages), and one that carried no status for `idle` ends (the page's
/// `EventSource` opens it again).
#[derive(Debug, Clone)]
pub struct EventStreamLimits {
    /// Streams open at once, everyone together; past it, 503.
    pub total: usize,
    /// Streams one user may have open; past it, 429.
    pub per_user: usize,
    /// How long a stream may carry nothing but keep-alives.
    pub idle: std::time::Duration,
}

impl Default for EventStreamLimits {
    /// 128 in all (a quarter of serve's default 512 connections), 4 per user, 10 minutes.
    fn default() -> Self {
        EventStreamLimits {
            total: 128,
            per_user: 4,
            idle: std::time::Duration::from_secs(600),
        }
    }
}

/// The sandboxes the page brings up: where they come from, how they are laid out, and where
/// their watchers push.
pub struct PageSandboxes<P> {
    /// Creates and finds users' sandboxes.
    pub provider: P,
    /// Where things are in them.
    pub layout: SandboxLayout,
    /// The proxy's git URL as the sandboxes reach it (`<public URL>/api/git`; serve's own
    /// address for sandboxes on this machine).
    pub git_url: String,
    /// Users whose sandbox to bring up at once (sandboxes an earlier run left on this machine).
    pub resume: Vec<UserId>,
}

/// Where sandboxes come from on this server, if anywhere.
enum Backend<H, P> {
    Sandboxes(Box<Lifecycle<P, H>>),
    HistoryOnly(Box<Orchestrator<H>>),
}

impl<H: ProjectPages, P: SandboxProvider> Backend<H, P> {
    fn orchestrator(&self) -> &Orchestrator<H> {
        match self {
            Backend::Sandboxes(lifecycle) => lifecycle.orchestrator(),
            Backend::HistoryOnly(orchestrator) => orchestrator,
        }
    }

    fn lifecycle(&self) -> Option<&Lifecycle<P, H>> {
        match self {
            Backend::Sandboxes(lifecycle) => Some(lifecycle),
            Backend::HistoryOnly(_) => None,
        }
    }
}

/// The page's state, shared by every request.
struct Web<H, P> {
    sign_in: SignIn,
    /// Where used sign-in links and signed-out sessions are remembered: the shared store (a
    /// link signs in once across replicas), else the token state directory; `None`: nowhere
    /// durable, so sign-in is off.
    nonces: Option<Arc<dyn Nonces>>,
    signer: TokenSigner,
    statuses: Arc<dyn StatusBoard>,
    backend: Backend<H, P>,
    public_url: Option<String>,
    /// The users whose sandbox this process is bringing up now.
    starting: Mutex<HashSet<UserId>>,
    flashes: Flashes,
    /// The event streams open now.
    streams: Arc<Admission>,
    stream_idle: std::time::Duration,
    histories: history_cache::HistoryCache,
    /// What the open pages are told besides the status.
    page_events: tokio::sync::broadcast::Sender<PageEvent>,
}

/// What an open page is told besides its status, over its event stream.
#[derive(Debug, Clone)]
enum PageEvent {
    /// The user's history changed (a branch of their project moved): the page lists it again.
    Saved(UserId),
    /// A notice for the user (how a restore went).
    Notice(UserId, String),
}

impl PageEvent {
    fn user(&self) -> &UserId {
        match self {
            PageEvent::Saved(user) | PageEvent::Notice(user, _) => user,
        }
    }
}

/// The page's routes, what an external push does to a sandbox here, and the sandboxes to stop
/// at shutdown.
pub struct Workspace {
    /// The routes.
    pub router: Router,
    /// The page's state as the control API uses it.
    pub control: Arc<dyn crate::api::Control>,
    /// What an external push does here: the user's history is read again, and their sandbox
    /// synced when sandboxes run from here.
    pub on_push: OnExternalPush,
    /// What any push does here, the watcher's too: the user's history is read again and
    /// their open pages list it again.
    pub on_saved: OnExternalPush,
    /// Sandboxes on this machine, whose watchers serve stops at shutdown.
    pub sandboxes: Option<LocalSandboxes>,
}

/// Why the page cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    /// `--sandboxes-dir` cannot be used.
    #[error("cannot set up the sandboxes directory {dir}: {source}")]
    SandboxesDir {
        /// The directory.
        dir: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The E2B client cannot be made.
    #[error("cannot set up E2B: {0}")]
    E2b(#[from] E2bError),
    /// E2B sandboxes need a public URL to push to.
    #[error(
        "E2B sandboxes push their saves to this server over the internet: set SHMASTRA_PUBLIC_URL (or --public-url) to the URL they reach it at"
    )]
    E2bWithoutPublicUrl,
    /// Both kinds of sandboxes were asked for.
    #[error(
        "both --sandboxes-dir and E2B_API_KEY are set: sandboxes run either on this machine or at E2B; unset one"
    )]
    TwoProviders,
}

/// Builds the page over `host`, with the sandboxes `config` names: on this machine, at E2B,
/// or none (history only). `listen` is serve's bound address: sandboxes on this machine push
/// through it. With the replicas' shared `store`, statuses, used sign-in links and the users'
/// E2B sandbox ids are every replica's; without, this process's own.
pub fn workspace<H: ProjectPages + SaveHistory>(
    host: H,
    signer: TokenSigner,
    config: &WebConfig,
    listen: SocketAddr,
    store: Option<Arc<dyn Store>>,
) -> Result<Workspace, WorkspaceError> {
    match (&config.sandboxes, &config.e2b) {
        (Some(_), Some(_)) => Err(WorkspaceError::TwoProviders),
        (Some(local), None) => {
            let dir = |source| WorkspaceError::SandboxesDir {
                dir: local.root.clone(),
                source,
            };
            let provider = local.provider().map_err(dir)?;
            // Sandboxes left from an earlier run get their watcher back.
            let resume = std::fs::read_dir(&local.root)
                .map_err(dir)?
                .flatten()
                .filter_map(|entry| UserId::parse(&entry.file_name().to_string_lossy()).ok())
                .collect();
            let sandboxes = PageSandboxes {
                provider,
                layout: local.layout(),
                git_url: format!("http://{}/api/git", loopback(listen)),
                resume,
            };
            let mut page = workspace_with(host, signer, config, store, Some(sandboxes));
            page.sandboxes = Some(local.clone());
            Ok(page)
        }
        (None, Some(settings)) => {
            let public_url = config
                .public_url
                .as_deref()
                .ok_or(WorkspaceError::E2bWithoutPublicUrl)?;
            let ids: Arc<dyn Store> = store
                .clone()
                .unwrap_or_else(|| Arc::new(MemoryStore::new()));
            let provider = E2bProvider::new(settings.clone(), ids, E2bLifecycle::default())?;
            tracing::info!(template = %settings.template, api_url = %settings.api_url, "sandboxes: E2B");
            let mut layout = SandboxLayout::shmastra();
            if let (Some(url), Some(health)) = (&config.health_url, layout.health.as_mut()) {
                health.url = url.clone();
            }
            let sandboxes = PageSandboxes {
                provider,
                layout,
                git_url: format!("{}/api/git", public_url.trim_end_matches('/')),
                resume: Vec::new(),
            };
            Ok(workspace_with(host, signer, config, store, Some(sandboxes)))
        }
        (None, None) => Ok(workspace_with::<H, LocalProvider>(
            host, signer, config, store, None,
        )),
    }
}

/// [`workspace`] over any provider (a backend's own): `sandboxes` `None` is history only.
pub fn workspace_with<H: ProjectPages + SaveHistory, P: SandboxProvider + 'static>(
    host: H,
    signer: TokenSigner,
    config: &WebConfig,
    store: Option<Arc<dyn Store>>,
    sandboxes: Option<PageSandboxes<P>>,
) -> Workspace {
    let (statuses, nonces): (Arc<dyn StatusBoard>, Option<Arc<dyn Nonces>>) = match store {
        Some(store) => (
            Arc::new(StoreStatuses::new(store.clone())),
            Some(Arc::new(StoreNonces(store))),
        ),
        None => (
            Arc::new(LocalStatuses::default()),
            config
                .token_state
                .as_ref()
                .map(|dir| Arc::new(NonceDir::new(dir)) as Arc<dyn Nonces>),
        ),
    };
    if nonces.is_none() {
        tracing::warn!(
            "neither --database-url nor SHMASTRA_TOKEN_STATE is set: nothing durable remembers used sign-in links, so the workspace page signs no one in"
        );
    }
    let mut resume = Vec::new();
    let backend = match sandboxes {
        Some(sandboxes) => {
            let persistence = Persistence {
                host,
                signer: signer.clone(),
                git_url: sandboxes.git_url,
            };
            let orchestrator = Orchestrator::new(Some(persistence), sandboxes.layout);
            let sink: Arc<dyn StatusSink> = statuses.clone();
            resume = sandboxes.resume;
            Backend::Sandboxes(Box::new(Lifecycle::new(
                sandboxes.provider,
                orchestrator,
                sink,
            )))
        }
        None => Backend::HistoryOnly(Box::new(Orchestrator::new(
            Some(Persistence {
                host,
                signer: signer.clone(),
                git_url: String::new(),
            }),
            SandboxLayout::shmastra(),
        ))),
    };
    let has_sandboxes = backend.lifecycle().is_some();
    let web = Arc::new(Web {
        sign_in: SignIn::new(signer.clone()),
        nonces,
        signer,
        statuses,
        backend,
        public_url: config
            .public_url
            .as_ref()
            .map(|u| u.trim_end_matches('/').to_owned()),
        starting: Mutex::new(HashSet::new()),
        flashes: Flashes::default(),
        streams: Arc::new(Admission::new(
            config.event_streams.total,
            config.event_streams.per_user,
        )),
        stream_idle: config.event_streams.idle,
        histories: history_cache::HistoryCache::default(),
        page_events: tokio::sync::broadcast::channel(64).0,
    });
    let on_saved = {
        let web = web.clone();
        Arc::new(move |push: ExternalPush| web.saved(&push.user)) as OnExternalPush
    };
    let on_push = {
        let web = web.clone();
        let syncs = has_sandboxes;
        Arc::new(move |push: ExternalPush| {
            web.saved(&push.user);
            if syncs {
                let web = web.clone();
                tokio::spawn(async move { web.sync_after_push(push.user).await });
            }
        }) as OnExternalPush
    };
    // A user's status changing (a sync, a restore, a new sandbox) means their history may
    // have: the next load reads it again.
    tokio::spawn({
        let mut changes = web.statuses.subscribe();
        let web = Arc::downgrade(&web);
        async move {
            loop {
                let change = changes.recv().await;
                let Some(web) = web.upgrade() else { return };
                match change {
                    Ok(change) => {
                        if let Ok(user) = UserId::parse(&change.sandbox) {
                            web.histories.forget(&user);
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        web.histories.forget_all()
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        }
    });
    for user in &resume {
        web.ensure_sandbox(user);
    }
    let router = Router::new()
        .route(
            "/login",
            get(pages::login_page::<H, P>).post(pages::login::<H, P>),
        )
        .route("/", get(pages::home))
        .route("/u/{user}", get(pages::workspace_page::<H, P>))
        .route("/u/{user}/events", get(pages::events::<H, P>))
        .route("/u/{user}/history", get(pages::history::<H, P>))
        .route("/u/{user}/saves/{commit}", get(pages::save_diff::<H, P>))
        .route(
            "/u/{user}/restore-version",
            post(actions::restore_version::<H, P>),
        )
        .route(
            "/u/{user}/restore-file",
            post(actions::restore_file::<H, P>),
        )
        .route(
            "/u/{user}/restore-project",
            post(actions::restore_project::<H, P>),
        )
        .route("/u/{user}/sign-out", post(actions::sign_out::<H, P>))
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
        .layer(axum::middleware::map_response(respond::security_headers))
        .with_state(web.clone());
    Workspace {
        router,
        control: web.clone(),
        on_push,
        on_saved,
        sandboxes: None,
    }
}

/// `listen`, with an unspecified address (`0.0.0.0`) made loopback.
fn loopback(listen: SocketAddr) -> SocketAddr {
    match listen.ip() {
        ip if ip.is_unspecified() => SocketAddr::new([127, 0, 0, 1].into(), listen.port()),
        _ => listen,
    }
}

impl<H, P> Web<H, P> {
    /// The user's history changed: it is read again, and their open pages list it again.
    fn saved(&self, user: &UserId) {
        self.histories.forget(user);
        let _ = self.page_events.send(PageEvent::Saved(user.clone()));
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

    /// Whether the request's `Origin` is this server's.
    fn same_origin(&self, headers: &HeaderMap) -> bool {
        headers
            .get(header::ORIGIN)
            .and_then(|o| o.to_str().ok())
            .is_some_and(|o| Some(o) == self.origin(headers).as_deref())
    }

    /// Where people reach this server: the public URL, else this server's origin.
    fn base_url(&self, headers: &HeaderMap) -> String {
        self.public_url
            .clone()
            .or_else(|| self.origin(headers))
            .unwrap_or_default()
    }

    /// Whether people reach this server over HTTPS (the session cookie is then `Secure`).
    fn secure(&self, headers: &HeaderMap) -> bool {
        self.public_url
            .as_deref()
            .is_some_and(|u| u.starts_with("https://"))
            || headers
                .get("x-forwarded-proto")
                .is_some_and(|p| p.as_bytes().eq_ignore_ascii_case(b"https"))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins() {
        assert_eq!(
            origin_of("https://cloud.example/x?y"),
            "https://cloud.example"
        );
        assert_eq!(origin_of("http://127.0.0.1:8080"), "http://127.0.0.1:8080");
    }
}
