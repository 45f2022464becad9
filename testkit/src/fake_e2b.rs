//! A fake E2B on two `127.0.0.1:0` listeners that answers as E2B does, built from its
//! published sources (e2b-dev/E2B `spec/openapi.yml`, `spec/envd/envd.yaml`,
//! `spec/envd/process/process.proto`; the server side in e2b-dev/infra):
//!
//! - the control plane: `POST /sandboxes`, `POST /sandboxes/{id}/connect` (200 running, 201
//!   resumed, 404 gone, 409 being killed), `GET /sandboxes/{id}`, `GET /v2/sandboxes`
//!   (metadata filter as the API parses it, pages of at most 100 with `X-Next-Token`),
//!   `POST /sandboxes/{id}/timeout`, `POST /sandboxes/{id}/pause`, `DELETE /sandboxes/{id}`;
//!   `X-API-Key`; `{"code", "message"}` error bodies; a clock that pauses (`autoPause`) or
//!   kills a sandbox whose timeout passed; the team's concurrency quota;
//! - envd behind E2B's proxy: routing by `E2b-Sandbox-Id`/`E2b-Sandbox-Port` (the host is an
//!   IP) or by a `49983-<id>.<domain>` host, the proxy's JSON 502 for a sandbox it cannot
//!   route to (and auto-resume of a paused one created with `autoResume`), `X-Access-Token`,
//!   `process.Process/Start` and `/Connect` as Connect-RPC JSON server streams (start, data,
//!   keepalive every `Keepalive-Ping-Interval` seconds of silence, end; `Connect-Timeout-Ms`
//!   kills the process), `GET`/`POST /files`.
//!
//! Commands run for real, `bash -c` (the SDK's `-l` dropped: this machine's login profile is
//! not the template's) in the sandbox's own home directory on this machine,
//! `<root>/<id>/home`, a copy of the template directory, with `HOME` and `USER=user`, and
//! `TMPDIR=<home>/tmp`: sandboxes share this machine's `/tmp`, so anything a test would put
//! in a sandbox's `/tmp` goes to `<home>/tmp` instead (a layout's `tmp/...`, relative to the
//! home). Paths `/files` reads or writes must lie inside `<root>/<id>`. Every process a
//! sandbox runs, and whatever it starts (PM2's daemon included), carries
//! `E2B_FAKE_SANDBOX=<id>` in its environment: a pause freezes them all with SIGSTOP (a
//! resume SIGCONTs them, as a memory snapshot keeps them), a kill SIGKILLs them and removes
//! the home directory. Open streams of a paused or killed sandbox break.
//!
//! Faults ([`Fault`]) queue per [`Route`]: a status with E2B's or a load balancer's body
//! (429 with `Retry-After`, HTML 502, plain-text 504, ...), a hung request, a stream dropped
//! mid-command, a sandbox paused or killed while a command runs, or paused just before one.
//! Every request is recorded.
//! It runs on its own runtime thread, so sync and async tests use it alike; dropping it kills
//! every sandbox's processes.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, Request, Response};
use base64::Engine;
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;
use tokio::sync::{broadcast, mpsc, oneshot, watch};

/// The API key the fake accepts.
pub const API_KEY: &str = "e2b_fake_0123456789abcdef0123456789abcdef";
/// The environment variable that marks every process of a sandbox.
pub const SANDBOX_MARKER: &str = "E2B_FAKE_SANDBOX";
/// envd's port.
const ENVD_PORT: u16 = 49983;
/// How often the clock looks for sandboxes whose timeout passed.
const CLOCK_TICK: Duration = Duration::from_millis(50);
/// envd's keepalive interval when the request names none (`permissions/keepalive.go`).
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(90);

/// Where a fault applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Any control-plane request.
    Api,
    /// `POST /sandboxes` only.
    Create,
    /// `process.Process/Start`.
    Start,
    /// `GET`/`POST /files`.
    Files,
}

/// A fault answered to the next request on its [`Route`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// This status, headers and body instead of the real answer.
    Status {
        status: u16,
        content_type: &'static str,
        body: String,
        retry_after: Option<u64>,
    },
    /// Accept the request and never answer.
    Hang,
    /// (control plane) do what the request asks this long after it came, as a create
    /// that boots a VM takes its time.
    Slow { delay: Duration },
    /// (control plane) do what the request asks, then answer a plain-text 504 as a gateway
    /// that gave up waiting would: the effect happened, the answer is lost.
    AnswerLost,
    /// (Start) the stream breaks this long after the start event; the process goes on.
    DropStream { after: Duration },
    /// (Start) the sandbox is paused this long after the start event.
    PauseDuringCommand { after: Duration },
    /// (Start) the sandbox is paused just before this request reaches the proxy (its timeout
    /// passed between two commands), which then answers as it does for a paused sandbox:
    /// resumed when it was created with `autoResume`, else its 502.
    PauseBeforeCommand,
    /// (Start) the sandbox is killed this long after the start event.
    KillDuringCommand { after: Duration },
}

impl Fault {
    /// The API's rate limiter: 429, `Retry-After`, `{"code":429,"message":"Rate limit exceeded"}`.
    pub fn rate_limited(retry_after_secs: u64) -> Fault {
        Fault::Status {
            status: 429,
            content_type: "application/json; charset=utf-8",
            body: json!({"code": 429, "message": "Rate limit exceeded"}).to_string(),
            retry_after: Some(retry_after_secs),
        }
    }

    /// A JSON 500 from the API.
    pub fn server_error() -> Fault {
        Fault::Status {
            status: 500,
            content_type: "application/json; charset=utf-8",
            body: json!({"code": 500, "message": "Error when creating sandbox"}).to_string(),
            retry_after: None,
        }
    }

    /// A load balancer's HTML 502.
    pub fn html_bad_gateway() -> Fault {
        Fault::Status {
            status: 502,
            content_type: "text/html",
            body: "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>\r\n</body>\r\n</html>\r\n".into(),
            retry_after: None,
        }
    }

    /// A plain-text 503.
    pub fn text_unavailable() -> Fault {
        Fault::Status {
            status: 503,
            content_type: "text/plain",
            body: "no healthy upstream".into(),
            retry_after: None,
        }
    }

    /// The proxy's 409 for sandbox `id` while it is being paused or resumed
    /// (`sandbox_still_transitioning.go` in e2b-dev/infra).
    pub fn still_transitioning(id: &str) -> Fault {
        Fault::Status {
            status: 409,
            content_type: "application/json",
            body: json!({
                "sandboxId": id,
                "message": "The sandbox is still transitioning. Try again in a moment.",
                "code": 409,
            })
            .to_string(),
            retry_after: None,
        }
    }

    /// A plain-text 504.
    pub fn text_gateway_timeout() -> Fault {
        Fault::Status {
            status: 504,
            content_type: "text/plain",
            body: "upstream request timeout".into(),
            retry_after: None,
        }
    }

    fn route_matches(route: Route, asked: Route) -> bool {
        route == asked || (route == Route::Api && asked == Route::Create)
    }
}

/// A sandbox's state, as the control plane reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Running,
    Paused,
}

/// One request as the fake received it, with the status it answered (0: never answered).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// `api` or `envd`.
    pub listener: &'static str,
    pub method: String,
    /// Path and query, as sent.
    pub path: String,
    /// The sandbox an envd request was routed to.
    pub sandbox: Option<String>,
    pub status: u16,
}

/// A sandbox the fake holds, as a test sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxView {
    pub id: String,
    pub template: String,
    pub state: State,
    pub home: PathBuf,
    pub metadata: BTreeMap<String, String>,
    pub env_vars: BTreeMap<String, String>,
    pub auto_pause: bool,
    pub auto_resume: bool,
    /// Time left before the clock pauses or kills it (zero once paused).
    pub remaining: Duration,
}

struct Process {
    events: broadcast::Sender<Ev>,
    end: Option<Value>,
}

#[derive(Debug, Clone)]
enum Ev {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    End(Value),
}

struct Sandbox {
    template: String,
    dir: PathBuf,
    token: String,
    state: State,
    killing: bool,
    end_at: Instant,
    auto_pause: bool,
    auto_resume: bool,
    metadata: BTreeMap<String, String>,
    env_vars: BTreeMap<String, String>,
    started_at: SystemTime,
    seq: u64,
    /// Bumped on pause and kill: every open stream of the sandbox breaks.
    breaks: watch::Sender<u64>,
    processes: BTreeMap<u32, Process>,
}

impl Sandbox {
    fn home(&self) -> PathBuf {
        self.dir.join("home")
    }
}

struct World {
    root: PathBuf,
    templates: BTreeMap<String, PathBuf>,
    env: BTreeMap<String, String>,
    sandboxes: BTreeMap<String, Sandbox>,
    /// Sandboxes killed or whose snapshot expired: 404 from now on.
    gone: BTreeSet<String>,
    faults: VecDeque<(Route, Fault)>,
    requests: Vec<Recorded>,
    next: u64,
    concurrency_limit: Option<usize>,
    envd_version: String,
}

type Shared = Arc<Mutex<World>>;

/// The running fake.
pub struct FakeE2b {
    api: SocketAddr,
    envd: SocketAddr,
    world: Shared,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeE2b {
    /// Starts the fake. Sandboxes live under `root`; `templates` maps template names to the
    /// directories a new sandbox's home is copied from (`cp -a`).
    pub fn start(root: &Path, templates: &[(&str, &Path)]) -> FakeE2b {
        let mut env = BTreeMap::new();
        for name in ["PATH", "LANG", "LC_ALL"] {
            if let Ok(value) = std::env::var(name) {
                env.insert(name.to_owned(), value);
            }
        }
        let world = Arc::new(Mutex::new(World {
            root: root.to_owned(),
            templates: templates
                .iter()
                .map(|(name, dir)| (name.to_string(), dir.to_path_buf()))
                .collect(),
            env,
            sandboxes: BTreeMap::new(),
            gone: BTreeSet::new(),
            faults: VecDeque::new(),
            requests: Vec::new(),
            next: 0,
            concurrency_limit: None,
            envd_version: "0.5.7".into(),
        }));
        let (addrs_tx, addrs_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("fake-e2b".into())
            .spawn({
                let world = world.clone();
                move || {
                    let rt = tokio::runtime::Builder::new_multi_thread()
                        .worker_threads(2)
                        .enable_all()
                        .build()
                        .expect("fake E2B runtime");
                    rt.block_on(async move {
                        let api = tokio::net::TcpListener::bind("127.0.0.1:0")
                            .await
                            .expect("bind");
                        let envd = tokio::net::TcpListener::bind("127.0.0.1:0")
                            .await
                            .expect("bind");
                        addrs_tx
                            .send((
                                api.local_addr().expect("addr"),
                                envd.local_addr().expect("addr"),
                            ))
                            .expect("report addresses");
                        let api_app = axum::Router::new().fallback({
                            let world = world.clone();
                            move |req: Request<Body>| api_handler(world.clone(), req)
                        });
                        let envd_app = axum::Router::new().fallback({
                            let world = world.clone();
                            move |req: Request<Body>| envd_handler(world.clone(), req)
                        });
                        tokio::select! {
                            _ = axum::serve(api, api_app) => {}
                            _ = axum::serve(envd, envd_app) => {}
                            _ = clock(world.clone()) => {}
                            _ = stopped => {}
                        }
                    });
                    rt.shutdown_timeout(Duration::from_secs(1));
                }
            })
            .expect("spawn the fake E2B");
        let (api, envd) = addrs_rx.recv().expect("the fake E2B started");
        FakeE2b {
            api,
            envd,
            world,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// `E2B_API_URL`.
    pub fn api_url(&self) -> String {
        format!("http://{}", self.api)
    }

    /// `E2B_SANDBOX_URL`: envd of every sandbox, routed by the `E2b-Sandbox-*` headers.
    pub fn sandbox_url(&self) -> String {
        format!("http://{}", self.envd)
    }

    /// An environment variable every sandbox process gets (a hermetic git configuration,
    /// the test's `PATH`).
    pub fn set_env(&self, name: &str, value: &str) {
        self.world().env.insert(name.to_owned(), value.to_owned());
    }

    /// Answers the next request on `route` with `fault`; several queue up in order.
    pub fn push_fault(&self, route: Route, fault: Fault) {
        self.world().faults.push_back((route, fault));
    }

    /// At most `limit` running sandboxes: a create or resume past it is the quota's 429.
    pub fn set_concurrency_limit(&self, limit: Option<usize>) {
        self.world().concurrency_limit = limit;
    }

    /// The envd version new sandboxes report.
    pub fn set_envd_version(&self, version: &str) {
        self.world().envd_version = version.to_owned();
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.world().requests.clone()
    }

    /// How many requests had `method` and a path starting with `prefix`.
    pub fn count(&self, method: &str, prefix: &str) -> usize {
        self.world()
            .requests
            .iter()
            .filter(|r| r.method == method && r.path.starts_with(prefix))
            .count()
    }

    /// Every sandbox that exists (running or paused).
    pub fn sandboxes(&self) -> Vec<SandboxView> {
        let world = self.world();
        let now = Instant::now();
        world
            .sandboxes
            .iter()
            .map(|(id, s)| SandboxView {
                id: id.clone(),
                template: s.template.clone(),
                state: s.state,
                home: s.home(),
                metadata: s.metadata.clone(),
                env_vars: s.env_vars.clone(),
                auto_pause: s.auto_pause,
                auto_resume: s.auto_resume,
                remaining: match s.state {
                    State::Running => s.end_at.saturating_duration_since(now),
                    State::Paused => Duration::ZERO,
                },
            })
            .collect()
    }

    pub fn sandbox(&self, id: &str) -> Option<SandboxView> {
        self.sandboxes().into_iter().find(|s| s.id == id)
    }

    /// Pauses a running sandbox as its timeout or `POST /pause` would.
    pub fn pause(&self, id: &str) {
        pause(&mut self.world(), id);
    }

    /// Kills a sandbox: its processes, its files and its snapshot are gone.
    pub fn kill(&self, id: &str) {
        kill(&mut self.world(), id);
    }

    /// Makes the clock fire for `id` now: paused with `autoPause`, killed without.
    pub fn expire(&self, id: &str) {
        let mut world = self.world();
        if let Some(sandbox) = world.sandboxes.get_mut(id) {
            sandbox.end_at = Instant::now();
        }
        expire_due(&mut world);
    }

    /// A paused sandbox's snapshot expires: it is gone for good.
    pub fn expire_snapshot(&self, id: &str) {
        kill(&mut self.world(), id);
    }

    /// The settings cloud-core reaches this fake with, creating from `template`: the key, the
    /// API URL and every sandbox's envd at this fake (`E2B_SANDBOX_URL`), retries and stream
    /// limits short enough for tests.
    pub fn settings(&self, template: &str) -> cloud_core::e2b::E2bSettings {
        let env = self.env(template);
        let mut settings = cloud_core::e2b::E2bSettings::from_env(|name| {
            env.iter().find(|(n, _)| *n == name).map(|(_, v)| v.clone())
        })
        .expect("the fake's settings")
        .expect("E2B on");
        settings.retry = cloud_core::RetryPolicy {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(100),
            max_retry_after: Duration::from_secs(5),
        };
        settings.streams.keepalive = Duration::from_secs(1);
        settings.streams.idle = Duration::from_secs(3);
        settings
    }

    /// The same settings as the environment `serve` and the `sandboxes` commands read.
    pub fn env(&self, template: &str) -> Vec<(&'static str, String)> {
        vec![
            ("E2B_API_KEY", API_KEY.to_owned()),
            ("E2B_TEMPLATE", template.to_owned()),
            ("E2B_API_URL", self.api_url()),
            ("E2B_SANDBOX_URL", self.sandbox_url()),
        ]
    }

    fn world(&self) -> MutexGuard<'_, World> {
        lock(&self.world)
    }
}

impl Drop for FakeE2b {
    fn drop(&mut self) {
        {
            let mut world = self.world();
            let ids: Vec<String> = world.sandboxes.keys().cloned().collect();
            for id in ids {
                signal_all(&id, "KILL");
                world.sandboxes.remove(&id);
            }
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn lock(world: &Shared) -> MutexGuard<'_, World> {
    world.lock().unwrap_or_else(|p| p.into_inner())
}

async fn clock(world: Shared) {
    let mut tick = tokio::time::interval(CLOCK_TICK);
    loop {
        tick.tick().await;
        expire_due(&mut lock(&world));
    }
}

fn expire_due(world: &mut World) {
    let now = Instant::now();
    let due: Vec<(String, bool)> = world
        .sandboxes
        .iter()
        .filter(|(_, s)| s.state == State::Running && s.end_at <= now)
        .map(|(id, s)| (id.clone(), s.auto_pause))
        .collect();
    for (id, auto_pause) in due {
        if auto_pause {
            pause(world, &id);
        } else {
            kill(world, &id);
        }
    }
}

fn pause(world: &mut World, id: &str) {
    let Some(sandbox) = world.sandboxes.get_mut(id) else {
        return;
    };
    if sandbox.state == State::Paused {
        return;
    }
    signal_all(id, "STOP");
    sandbox.state = State::Paused;
    sandbox.breaks.send_modify(|n| *n += 1);
}

fn resume(world: &mut World, id: &str, timeout: Duration) {
    if let Some(sandbox) = world.sandboxes.get_mut(id) {
        signal_all(id, "CONT");
        sandbox.state = State::Running;
        sandbox.end_at = Instant::now() + timeout;
    }
}

fn kill(world: &mut World, id: &str) {
    let Some(mut sandbox) = world.sandboxes.remove(id) else {
        return;
    };
    sandbox.killing = true;
    signal_all(id, "KILL");
    sandbox.breaks.send_modify(|n| *n += 1);
    let _ = std::fs::remove_dir_all(&sandbox.dir);
    world.gone.insert(id.to_owned());
}

/// Sends `signal` to every process whose environment marks it as `id`'s, until a pass finds
/// none it has not signalled (a process may fork while the first pass runs).
fn signal_all(id: &str, signal: &str) {
    let mut signalled = BTreeSet::new();
    for _ in 0..20 {
        let fresh: Vec<u32> = marked_pids(id)
            .into_iter()
            .filter(|pid| signal == "KILL" || !signalled.contains(pid))
            .collect();
        if fresh.is_empty() {
            return;
        }
        let _ = std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .args(fresh.iter().map(u32::to_string))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        signalled.extend(fresh);
        if signal == "KILL" {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn marked_pids(id: &str) -> Vec<u32> {
    let marker = format!("{SANDBOX_MARKER}={id}");
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
                return false;
            };
            let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z')))
                .unwrap_or(true);
            !zombie
                && environ
                    .split(|b| *b == 0)
                    .any(|var| var == marker.as_bytes())
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Answers

fn respond(status: u16, content_type: &str, body: impl Into<Body>) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(body.into())
        .expect("response")
}

/// The API's and envd's error body (`apierrors.go`, envd's `error.go`).
fn error(status: u16, message: &str) -> Response<Body> {
    respond(
        status,
        "application/json; charset=utf-8",
        json!({"code": status, "message": message}).to_string(),
    )
}

fn json_answer(status: u16, value: &Value) -> Response<Body> {
    respond(status, "application/json; charset=utf-8", value.to_string())
}

fn fault_answer(fault: &Fault) -> Option<Response<Body>> {
    let Fault::Status {
        status,
        content_type,
        body,
        retry_after,
    } = fault
    else {
        return None;
    };
    let mut answer = respond(*status, content_type, body.clone());
    if let Some(secs) = retry_after {
        answer
            .headers_mut()
            .insert("retry-after", secs.to_string().parse().expect("header"));
    }
    Some(answer)
}

fn not_found_message(id: &str) -> String {
    format!("Sandbox {id:?} doesn't exist or you don't have access to it")
}

fn take_fault(world: &mut World, route: Route) -> Option<Fault> {
    let at = world
        .faults
        .iter()
        .position(|(r, _)| Fault::route_matches(*r, route))?;
    world.faults.remove(at).map(|(_, f)| f)
}

fn record(
    world: &Shared,
    listener: &'static str,
    method: &Method,
    path: &str,
    sandbox: Option<&str>,
    status: u16,
) {
    lock(world).requests.push(Recorded {
        listener,
        method: method.to_string(),
        path: path.to_owned(),
        sandbox: sandbox.map(str::to_owned),
        status,
    });
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Go's `url.QueryUnescape`: `+` is a space, `%XX` a byte.
fn query_unescape(text: &str) -> String {
    percent_encoding::percent_decode_str(&text.replace('+', " "))
        .decode_utf8_lossy()
        .into_owned()
}

fn query(uri: &axum::http::Uri) -> BTreeMap<String, String> {
    url::form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes())
        .into_owned()
        .collect()
}

// ---------------------------------------------------------------------------------------
// The control plane

async fn api_handler(world: Shared, req: Request<Body>) -> Response<Body> {
    let method = req.method().clone();
    let uri = req.uri().clone();
    let path = uri
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    let key = header(req.headers(), "x-api-key").map(str::to_owned);
    let body = axum::body::to_bytes(req.into_body(), 1 << 20)
        .await
        .unwrap_or_default();
    let segments: Vec<String> = uri
        .path()
        .trim_matches('/')
        .split('/')
        .map(str::to_owned)
        .collect();
    let route = if method == Method::POST && segments == ["sandboxes"] {
        Route::Create
    } else {
        Route::Api
    };
    let fault = take_fault(&mut lock(&world), route);
    if fault == Some(Fault::Hang) {
        record(&world, "api", &method, &path, None, 0);
        std::future::pending::<()>().await;
    }
    if let Some(Fault::Slow { delay }) = fault {
        tokio::time::sleep(delay).await;
    }
    let answer = match fault.as_ref().and_then(fault_answer) {
        Some(answer) => answer,
        None if key.as_deref() != Some(API_KEY) => error(
            401,
            "Invalid API key, please visit https://e2b.dev/docs/api-key for more information.",
        ),
        None => {
            let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
            let answer = api_route(&world, &method, &segments, &uri, &body);
            match fault {
                Some(Fault::AnswerLost) => {
                    fault_answer(&Fault::text_gateway_timeout()).expect("a status fault")
                }
                _ => answer,
            }
        }
    };
    record(
        &world,
        "api",
        &method,
        &path,
        None,
        answer.status().as_u16(),
    );
    answer
}

fn api_route(
    world: &Shared,
    method: &Method,
    segments: &[&str],
    uri: &axum::http::Uri,
    body: &[u8],
) -> Response<Body> {
    let body: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let timeout = |body: &Value| {
        body.get("timeout")
            .and_then(Value::as_u64)
            .map(Duration::from_secs)
    };
    let mut world = lock(world);
    match (method.as_str(), segments) {
        ("POST", ["sandboxes"]) => create(&mut world, &body),
        ("GET", ["v2", "sandboxes"]) => list(&world, uri),
        ("GET", ["sandboxes", id]) => match world.sandboxes.get(*id) {
            Some(sandbox) => json_answer(200, &detail(id, sandbox, &world.envd_version)),
            None => error(404, &not_found_message(id)),
        },
        ("DELETE", ["sandboxes", id]) => {
            if world.sandboxes.contains_key(*id) {
                kill(&mut world, id);
                respond(204, "text/plain", Body::empty())
            } else {
                error(404, &not_found_message(id))
            }
        }
        ("POST", ["sandboxes", id, "connect"]) => {
            let Some(timeout) = timeout(&body) else {
                return error(400, "Error when parsing request: timeout is required");
            };
            connect(&mut world, id, timeout)
        }
        ("POST", ["sandboxes", id, "timeout"]) => {
            let Some(timeout) = timeout(&body) else {
                return error(400, "Error when parsing request: timeout is required");
            };
            match world.sandboxes.get_mut(*id) {
                Some(sandbox) if sandbox.state == State::Running => {
                    sandbox.end_at = Instant::now() + timeout;
                    respond(204, "text/plain", Body::empty())
                }
                _ => error(404, &not_found_message(id)),
            }
        }
        ("POST", ["sandboxes", id, "pause"]) => match world.sandboxes.get(*id).map(|s| s.state) {
            Some(State::Running) => {
                pause(&mut world, id);
                respond(204, "text/plain", Body::empty())
            }
            Some(State::Paused) => error(409, &format!("Sandbox {id:?} is already paused")),
            None => error(404, &not_found_message(id)),
        },
        _ => error(404, "Not found"),
    }
}

fn running_count(world: &World) -> usize {
    world
        .sandboxes
        .values()
        .filter(|s| s.state == State::Running)
        .count()
}

fn quota_refusal(world: &World) -> Option<Response<Body>> {
    let limit = world.concurrency_limit?;
    (running_count(world) >= limit).then(|| {
        error(
            429,
            &format!(
                "you have reached the maximum number of concurrent E2B sandboxes ({limit}). If you need more, please visit 'https://e2b.dev/docs/billing'"
            ),
        )
    })
}

fn create(world: &mut World, body: &Value) -> Response<Body> {
    let Some(template) = body.get("templateID").and_then(Value::as_str) else {
        return error(400, "Error when parsing request: templateID is required");
    };
    let Some(source) = world.templates.get(template).cloned() else {
        return error(404, &format!("template '{template}' not found"));
    };
    let auto_pause = body
        .get("autoPause")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let auto_resume = body
        .pointer("/autoResume/enabled")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if auto_resume && !auto_pause {
        return error(400, "autoResume requires autoPause");
    }
    if let Some(refusal) = quota_refusal(world) {
        return refusal;
    }
    let strings = |field: &str| -> BTreeMap<String, String> {
        body.get(field)
            .and_then(Value::as_object)
            .map(|o| {
                o.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                    .collect()
            })
            .unwrap_or_default()
    };
    // Unique across every fake in this process and across processes: kills find processes
    // by the id in their environment.
    static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    world.next += 1;
    let seq = world.next;
    let n = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let id = format!("i{:08}x{:010}", std::process::id(), n);
    let dir = world.root.join(&id);
    let home = dir.join("home");
    let copied = std::fs::create_dir_all(&dir).and_then(|()| {
        let out = std::process::Command::new("cp")
            .arg("-a")
            .arg("--")
            .arg(&source)
            .arg(&home)
            .output()?;
        if !out.status.success() {
            return Err(std::io::Error::other(
                String::from_utf8_lossy(&out.stderr).into_owned(),
            ));
        }
        std::fs::create_dir_all(home.join("tmp"))
    });
    if let Err(e) = copied {
        return error(500, &format!("Failed to create sandbox: {e}"));
    }
    let timeout = body.get("timeout").and_then(Value::as_u64).unwrap_or(15);
    let secure = body.get("secure").and_then(Value::as_bool).unwrap_or(false);
    let token = format!("envd-token-{id}-{seq}");
    let (breaks, _) = watch::channel(0);
    world.sandboxes.insert(
        id.clone(),
        Sandbox {
            template: template.to_owned(),
            dir,
            token: token.clone(),
            state: State::Running,
            killing: false,
            end_at: Instant::now() + Duration::from_secs(timeout),
            auto_pause,
            auto_resume,
            metadata: strings("metadata"),
            env_vars: strings("envVars"),
            started_at: SystemTime::now(),
            seq,
            breaks,
            processes: BTreeMap::new(),
        },
    );
    json_answer(
        201,
        &access(&id, template, &world.envd_version, secure.then_some(&token)),
    )
}

fn access(id: &str, template: &str, envd_version: &str, token: Option<&String>) -> Value {
    json!({
        "templateID": template,
        "sandboxID": id,
        "clientID": "6532622b",
        "envdVersion": envd_version,
        "envdAccessToken": token,
        "trafficAccessToken": null,
        "domain": null,
    })
}

fn connect(world: &mut World, id: &str, timeout: Duration) -> Response<Body> {
    let Some(sandbox) = world.sandboxes.get(id) else {
        return error(404, &not_found_message(id));
    };
    if sandbox.killing {
        return error(409, &format!("Sandbox {id:?} is being killed"));
    }
    let (state, template, token) = (
        sandbox.state,
        sandbox.template.clone(),
        sandbox.token.clone(),
    );
    let status = match state {
        State::Running => {
            let sandbox = world.sandboxes.get_mut(id).expect("present");
            // "TTL is only extended."
            sandbox.end_at = sandbox.end_at.max(Instant::now() + timeout);
            200
        }
        State::Paused => {
            if let Some(refusal) = quota_refusal(world) {
                return refusal;
            }
            resume(world, id, timeout);
            201
        }
    };
    json_answer(
        status,
        &access(id, &template, &world.envd_version, Some(&token)),
    )
}

fn rfc3339(time: SystemTime) -> String {
    let secs = time
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since the epoch (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn detail(id: &str, sandbox: &Sandbox, envd_version: &str) -> Value {
    let remaining = sandbox.end_at.saturating_duration_since(Instant::now());
    json!({
        "templateID": sandbox.template,
        "sandboxID": id,
        "clientID": "6532622b",
        "startedAt": rfc3339(sandbox.started_at),
        "endAt": rfc3339(SystemTime::now() + remaining),
        "cpuCount": 2,
        "memoryMB": 512,
        "diskSizeMB": 1024,
        "state": match sandbox.state { State::Running => "running", State::Paused => "paused" },
        "envdVersion": envd_version,
        "envdAccessToken": sandbox.token,
        "metadata": sandbox.metadata,
        "lifecycle": {
            "autoResume": sandbox.auto_resume,
            "onTimeout": if sandbox.auto_pause { "pause" } else { "kill" },
        },
    })
}

/// `GET /v2/sandboxes`: newest first, the metadata filter parsed as the API parses it
/// (`parseFilters`: the parameter unescaped whole, split on `&` and `=`, each side
/// unescaped again; a pair without `=` is a 400), `limit` 1..=100 (default 100).
fn list(world: &World, uri: &axum::http::Uri) -> Response<Body> {
    let query = query(uri);
    let mut filter = BTreeMap::new();
    if let Some(raw) = query.get("metadata") {
        for pair in query_unescape(raw).split('&') {
            let parts: Vec<&str> = pair.split('=').collect();
            let [key, value] = parts.as_slice() else {
                return error(
                    400,
                    "error parsing metadata: invalid key value pair in query",
                );
            };
            filter.insert(query_unescape(key), query_unescape(value));
        }
    }
    let limit = match query.get("limit").map(|l| l.parse::<usize>()) {
        None => 100,
        Some(Ok(n)) if (1..=100).contains(&n) => n,
        Some(_) => return error(400, "limit must be between 1 and 100"),
    };
    let start = match query.get("nextToken") {
        None => 0,
        Some(token) => match base64::engine::general_purpose::URL_SAFE
            .decode(token)
            .ok()
            .and_then(|t| String::from_utf8(t).ok())
            .and_then(|t| {
                t.strip_prefix("offset__")
                    .and_then(|n| n.parse::<usize>().ok())
            }) {
            Some(n) => n,
            None => return error(400, "Invalid next token"),
        },
    };
    let mut matching: Vec<(&String, &Sandbox)> = world
        .sandboxes
        .iter()
        .filter(|(_, s)| filter.iter().all(|(k, v)| s.metadata.get(k) == Some(v)))
        .collect();
    matching.sort_by_key(|(_, s)| std::cmp::Reverse(s.seq));
    let page: Vec<Value> = matching
        .iter()
        .skip(start)
        .take(limit)
        .map(|(id, s)| detail(id, s, &world.envd_version))
        .collect();
    let mut answer = json_answer(200, &Value::Array(page));
    if start + limit < matching.len() {
        let token =
            base64::engine::general_purpose::URL_SAFE.encode(format!("offset__{}", start + limit));
        answer
            .headers_mut()
            .insert("x-next-token", token.parse().expect("header"));
    }
    answer
}

// ---------------------------------------------------------------------------------------
// envd behind the proxy

/// Which sandbox and port a request is for, as `GetTargetFromRequest` reads it: the
/// `E2b-Sandbox-*` headers when the host is an IP, `localhost` or `sandbox.<domain>`, else
/// `<port>-<id>.<domain>`.
fn target(headers: &HeaderMap) -> Result<(String, u16), &'static str> {
    let host = header(headers, "host").unwrap_or_default();
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.parse::<u16>().is_ok() => name,
        _ => host,
    };
    let shared = name == "localhost"
        || name.parse::<std::net::IpAddr>().is_ok()
        || name.starts_with("sandbox.");
    if shared
        && (headers.contains_key("e2b-sandbox-id") || headers.contains_key("e2b-sandbox-port"))
    {
        let (Some(id), Some(port)) = (
            header(headers, "e2b-sandbox-id"),
            header(headers, "e2b-sandbox-port"),
        ) else {
            return Err("missing header");
        };
        let port = port.parse().map_err(|_| "Invalid sandbox port")?;
        return Ok((id.to_owned(), port));
    }
    let (first, _) = name.split_once('.').ok_or("Invalid host")?;
    let mut parts = first.split('-');
    let (Some(port), Some(id)) = (parts.next(), parts.next()) else {
        return Err("Invalid host");
    };
    let port = port.parse().map_err(|_| "Invalid sandbox port")?;
    Ok((id.to_owned(), port))
}

fn proxy_not_found(id: &str) -> Response<Body> {
    json_answer(
        502,
        &json!({"sandboxId": id, "message": "The sandbox was not found", "code": 502}),
    )
}

async fn envd_handler(world: Shared, req: Request<Body>) -> Response<Body> {
    let method = req.method().clone();
    let uri = req.uri().clone();
    let path = uri
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    let headers = req.headers().clone();
    let body = axum::body::to_bytes(req.into_body(), 64 << 20)
        .await
        .unwrap_or_default();
    let route = if uri.path() == "/files" {
        Route::Files
    } else {
        Route::Start
    };
    let is_start = uri.path() == "/process.Process/Start";
    let fault = {
        let mut w = lock(&world);
        if route == Route::Files || is_start {
            take_fault(&mut w, route)
        } else {
            None
        }
    };
    if fault == Some(Fault::Hang) {
        let id = target(&headers).ok().map(|(id, _)| id);
        record(&world, "envd", &method, &path, id.as_deref(), 0);
        std::future::pending::<()>().await;
    }
    let (id, answer) = envd_answer(&world, &method, &uri, &headers, body, fault).await;
    record(
        &world,
        "envd",
        &method,
        &path,
        id.as_deref(),
        answer.status().as_u16(),
    );
    answer
}

async fn envd_answer(
    world: &Shared,
    method: &Method,
    uri: &axum::http::Uri,
    headers: &HeaderMap,
    body: Bytes,
    fault: Option<Fault>,
) -> (Option<String>, Response<Body>) {
    let (id, port) = match target(headers) {
        Ok(target) => target,
        // Go's `http.Error`: the text and a newline.
        Err(text) => {
            return (
                None,
                respond(400, "text/plain; charset=utf-8", format!("{text}\n")),
            );
        }
    };
    if let Some(answer) = fault.as_ref().and_then(fault_answer) {
        return (Some(id), answer);
    }
    let (dir, token, breaks) = {
        let mut w = lock(world);
        if fault == Some(Fault::PauseBeforeCommand) {
            pause(&mut w, &id);
        }
        let paused_resumable = w
            .sandboxes
            .get(&id)
            .is_some_and(|s| s.state == State::Paused && s.auto_resume);
        if paused_resumable {
            // The client proxy's auto-resume (`handlePausedSandbox`), within the quota.
            if quota_refusal(&w).is_some() {
                return (
                    Some(id.clone()),
                    json_answer(
                        429,
                        &json!({"sandboxId": id, "message": "Sandbox limit reached", "code": 429}),
                    ),
                );
            }
            resume(&mut w, &id, Duration::from_secs(300));
        }
        match w.sandboxes.get(&id) {
            Some(s) if s.state == State::Running => {
                (s.dir.clone(), s.token.clone(), s.breaks.subscribe())
            }
            _ => return (Some(id.clone()), proxy_not_found(&id)),
        }
    };
    if port != ENVD_PORT {
        return (
            Some(id.clone()),
            json_answer(
                502,
                &json!({"sandboxId": id, "message": "The sandbox is running but port is not open", "port": port, "code": 502}),
            ),
        );
    }
    if uri.path() == "/health" {
        return (Some(id), respond(204, "text/plain", Body::empty()));
    }
    let token_ok = header(headers, "x-access-token") == Some(token.as_str());
    let process_user = basic_user(headers);
    if uri.path() != "/files"
        && let Some(refusal) = process_user.as_deref().and_then(user_refusal)
    {
        return (Some(id), refusal);
    }
    let answer = match (method.as_str(), uri.path()) {
        ("GET", "/files") | ("POST", "/files") => {
            if !token_ok {
                let message = if headers.contains_key("x-access-token") {
                    "access token present in header but does not match"
                } else {
                    "missing signature query parameter"
                };
                return (Some(id), error(401, message));
            }
            // The `username` parameter, else the default user (`ResolveDefaultUsername`).
            let user = query(uri).get("username").cloned();
            if let Some(refusal) = user_refusal(user.as_deref().unwrap_or("user")) {
                return (Some(id), refusal);
            }
            files(&dir, method, uri, headers, &body)
        }
        _ if !token_ok => error(
            401,
            "unauthorized access, please provide a valid access token or method signing if supported",
        ),
        ("POST", "/process.Process/Start") => {
            start(world, &id, &dir, headers, &body, breaks, fault)
        }
        ("POST", "/process.Process/Connect") => reconnect(world, &id, headers, &body, breaks),
        _ => error(404, "404 page not found"),
    };
    (Some(id), answer)
}

/// The user a process request runs as: `Authorization: Basic base64("<user>:")`.
fn basic_user(headers: &HeaderMap) -> Option<String> {
    let basic = header(headers, "authorization")?.strip_prefix("Basic ")?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(basic)
        .ok()?;
    Some(
        String::from_utf8_lossy(&decoded)
            .trim_end_matches(':')
            .to_owned(),
    )
}

/// envd's answer for a user the sandbox does not have; this fake's sandboxes have one,
/// `user`.
fn user_refusal(user: &str) -> Option<Response<Body>> {
    (user != "user").then(|| {
        error(
            401,
            &format!("error looking up user '{user}': user: unknown user {user}"),
        )
    })
}

fn files(
    dir: &Path,
    method: &Method,
    uri: &axum::http::Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> Response<Body> {
    let query = query(uri);
    let Some(raw) = query.get("path") else {
        return error(400, "path is required");
    };
    let home = dir.join("home");
    let path = if Path::new(raw).is_absolute() {
        PathBuf::from(raw)
    } else {
        home.join(raw)
    };
    if !path.starts_with(dir)
        || path
            .components()
            .any(|c| c == std::path::Component::ParentDir)
    {
        return error(400, &format!("path '{raw}' is outside this fake sandbox"));
    }
    if *method == Method::GET {
        return match std::fs::read(&path) {
            Ok(bytes) => respond(200, "application/octet-stream", bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                error(404, &format!("path '{}' does not exist", path.display()))
            }
            Err(_) if path.is_dir() => {
                error(400, &format!("path '{}' is a directory", path.display()))
            }
            Err(e) => error(
                500,
                &format!("error opening file '{}': {e}", path.display()),
            ),
        };
    }
    let content_type = header(headers, "content-type").unwrap_or_default();
    if !content_type.starts_with("application/octet-stream") {
        return error(
            400,
            &format!(
                "unsupported content type: {content_type}, expected multipart/form-data or application/octet-stream"
            ),
        );
    }
    if path.is_dir() {
        return error(400, &format!("path is a directory: {}", path.display()));
    }
    // envd's upload: parents made, `O_WRONLY|O_CREATE|O_TRUNC` with mode 0666 (so an existing
    // file keeps its mode), the umask applied.
    let written = path
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::write(&path, body));
    match written {
        Ok(()) => json_answer(
            200,
            &json!([{
                "path": path.display().to_string(),
                "name": path.file_name().map(|n| n.to_string_lossy().into_owned()),
                "type": "file",
            }]),
        ),
        Err(e) => error(500, &format!("error writing file: {e}")),
    }
}

// ---------------------------------------------------------------------------------------
// Processes

fn envelope(flags: u8, value: &Value) -> Bytes {
    let json = value.to_string();
    let mut out = Vec::with_capacity(5 + json.len());
    out.push(flags);
    out.extend_from_slice(&(json.len() as u32).to_be_bytes());
    out.extend_from_slice(json.as_bytes());
    Bytes::from(out)
}

/// The one message of a request body.
fn request_message(body: &[u8]) -> Option<Value> {
    let (header, rest) = body.split_at_checked(5)?;
    let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    (header[0] == 0 && rest.len() == len).then(|| serde_json::from_slice(rest).ok())?
}

fn stream_response(rx: mpsc::Receiver<Result<Bytes, std::io::Error>>) -> Response<Body> {
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    Response::builder()
        .status(200)
        .header("content-type", "application/connect+json")
        .body(Body::from_stream(stream))
        .expect("response")
}

/// A Connect error for a stream: HTTP 200 and the error in the end-of-stream envelope.
fn stream_error(code: &str, message: &str) -> Response<Body> {
    respond(
        200,
        "application/connect+json",
        envelope(2, &json!({"error": {"code": code, "message": message}})),
    )
}

fn keepalive_interval(headers: &HeaderMap) -> Duration {
    header(headers, "keepalive-ping-interval")
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(DEFAULT_KEEPALIVE, Duration::from_secs)
}

fn connect_protocol_refusal(headers: &HeaderMap) -> Option<Response<Body>> {
    if !header(headers, "content-type")
        .unwrap_or_default()
        .starts_with("application/connect+json")
    {
        return Some(respond(415, "text/plain", "unsupported content type"));
    }
    if header(headers, "connect-protocol-version") != Some("1") {
        return Some(stream_error(
            "invalid_argument",
            "missing required header: set Connect-Protocol-Version to \"1\"",
        ));
    }
    None
}

fn start(
    world: &Shared,
    id: &str,
    dir: &Path,
    headers: &HeaderMap,
    body: &[u8],
    breaks: watch::Receiver<u64>,
    fault: Option<Fault>,
) -> Response<Body> {
    if let Some(refusal) = connect_protocol_refusal(headers) {
        return refusal;
    }
    let Some(request) = request_message(body) else {
        return stream_error("invalid_argument", "cannot read the request message");
    };
    let deadline = match header(headers, "connect-timeout-ms").map(str::parse::<u64>) {
        None => None,
        Some(Ok(ms)) => Some(Duration::from_millis(ms)),
        Some(Err(e)) => return stream_error("invalid_argument", &e.to_string()),
    };
    let process = &request["process"];
    let cmd = process["cmd"].as_str().unwrap_or_default().to_owned();
    let mut args: Vec<String> = process["args"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let program = if cmd.ends_with("bash") {
        args.retain(|a| a != "-l");
        "bash".to_owned()
    } else {
        cmd
    };
    let home = dir.join("home");
    let cwd = process["cwd"].as_str().map_or(home.clone(), PathBuf::from);
    let (base_env, sandbox_env) = {
        let w = lock(world);
        let sandbox_env = w
            .sandboxes
            .get(id)
            .map(|s| s.env_vars.clone())
            .unwrap_or_default();
        (w.env.clone(), sandbox_env)
    };
    let mut command = tokio::process::Command::new(&program);
    command
        .args(&args)
        .env_clear()
        .envs(&base_env)
        .envs(&sandbox_env)
        .env("HOME", &home)
        .env("USER", "user")
        .env("TMPDIR", home.join("tmp"))
        .env(SANDBOX_MARKER, id)
        .current_dir(&cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    if let Some(envs) = process["envs"].as_object() {
        command.envs(envs.iter().filter_map(|(k, v)| Some((k, v.as_str()?))));
    }
    let (events, subscription) = broadcast::channel(4096);
    let child = {
        let mut w = lock(world);
        match command.spawn() {
            Ok(child) => {
                let pid = child.id().unwrap_or_default();
                if let Some(sandbox) = w.sandboxes.get_mut(id) {
                    sandbox.processes.insert(
                        pid,
                        Process {
                            events: events.clone(),
                            end: None,
                        },
                    );
                }
                child
            }
            Err(e) => {
                return stream_error("invalid_argument", &format!("error starting process: {e}"));
            }
        }
    };
    let pid = child.id().unwrap_or_default();
    tokio::spawn(run_process(
        world.clone(),
        id.to_owned(),
        pid,
        child,
        events,
        deadline,
    ));
    let (tx, rx) = mpsc::channel(64);
    let drop_after = match fault {
        Some(Fault::DropStream { after }) => Some(after),
        _ => None,
    };
    tokio::spawn(stream_events(
        pid,
        None,
        subscription,
        keepalive_interval(headers),
        (breaks, drop_after),
        tx,
    ));
    if let Some(fault) = fault {
        let world = world.clone();
        let id = id.to_owned();
        tokio::spawn(async move {
            match fault {
                Fault::PauseDuringCommand { after } => {
                    tokio::time::sleep(after).await;
                    pause(&mut lock(&world), &id);
                }
                Fault::KillDuringCommand { after } => {
                    tokio::time::sleep(after).await;
                    kill(&mut lock(&world), &id);
                }
                Fault::DropStream { .. }
                | Fault::Status { .. }
                | Fault::Hang
                | Fault::Slow { .. }
                | Fault::AnswerLost
                | Fault::PauseBeforeCommand => {}
            }
        });
    }
    stream_response(rx)
}

fn reconnect(
    world: &Shared,
    id: &str,
    headers: &HeaderMap,
    body: &[u8],
    breaks: watch::Receiver<u64>,
) -> Response<Body> {
    if let Some(refusal) = connect_protocol_refusal(headers) {
        return refusal;
    }
    let Some(pid) = request_message(body)
        .and_then(|r| r.pointer("/process/pid").and_then(Value::as_u64))
        .and_then(|p| u32::try_from(p).ok())
    else {
        return stream_error("invalid_argument", "a pid is required");
    };
    let w = lock(world);
    let Some(process) = w.sandboxes.get(id).and_then(|s| s.processes.get(&pid)) else {
        return stream_error("not_found", &format!("process with pid {pid} not found"));
    };
    let (end, subscription) = (process.end.clone(), process.events.subscribe());
    drop(w);
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(stream_events(
        pid,
        end,
        subscription,
        keepalive_interval(headers),
        (breaks, None),
        tx,
    ));
    stream_response(rx)
}

async fn run_process(
    world: Shared,
    id: String,
    pid: u32,
    mut child: tokio::process::Child,
    events: broadcast::Sender<Ev>,
    deadline: Option<Duration>,
) {
    let pump = |mut pipe: Box<dyn tokio::io::AsyncRead + Unpin + Send>, wrap: fn(Vec<u8>) -> Ev| {
        let events = events.clone();
        async move {
            let mut buf = vec![0u8; 32 * 1024];
            while let Ok(n) = pipe.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                let _ = events.send(wrap(buf[..n].to_vec()));
            }
        }
    };
    let stdout = pump(Box::new(child.stdout.take().expect("piped")), Ev::Stdout);
    let stderr = pump(Box::new(child.stderr.take().expect("piped")), Ev::Stderr);
    let finished = async {
        tokio::join!(stdout, stderr);
        child.wait().await
    };
    let status = match deadline {
        None => finished.await,
        Some(limit) => match tokio::time::timeout(limit, finished).await {
            Ok(status) => status,
            Err(_) => {
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", "--", &format!("-{pid}")])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
                child.wait().await
            }
        },
    };
    let end = match status {
        Ok(status) => end_event(status),
        Err(e) => json!({"exitCode": -1, "status": "", "error": e.to_string()}),
    };
    let mut w = lock(&world);
    if let Some(process) = w
        .sandboxes
        .get_mut(&id)
        .and_then(|s| s.processes.get_mut(&pid))
    {
        process.end = Some(end.clone());
    }
    let _ = events.send(Ev::End(end));
}

/// envd's end event from Go's `ProcessState`: `exitCode` (left out when 0), `exited`, `status`
/// (`exit status N`, `signal: killed`), `error` (the same text when the process failed).
fn end_event(status: std::process::ExitStatus) -> Value {
    use std::os::unix::process::ExitStatusExt;
    let mut end = serde_json::Map::new();
    match (status.code(), status.signal()) {
        (Some(code), _) => {
            end.insert("exited".into(), json!(true));
            let text = format!("exit status {code}");
            if code != 0 {
                end.insert("exitCode".into(), json!(code));
                end.insert("error".into(), json!(text));
            }
            end.insert("status".into(), json!(text));
        }
        (None, signal) => {
            let name = match signal {
                Some(9) => "killed".to_owned(),
                Some(15) => "terminated".to_owned(),
                Some(2) => "interrupt".to_owned(),
                Some(n) => format!("signal {n}"),
                None => "unknown".to_owned(),
            };
            let text = format!("signal: {name}");
            end.insert("exitCode".into(), json!(-1));
            end.insert("status".into(), json!(text));
            end.insert("error".into(), json!(text));
        }
    }
    Value::Object(end)
}

/// One stream: the start event, the process's events as they come (keepalives in the
/// silences), its end and the end of the stream; broken (the connection reset) when the
/// sandbox is paused or killed, or `drop_after` the start when a fault says so.
async fn stream_events(
    pid: u32,
    ended: Option<Value>,
    mut events: broadcast::Receiver<Ev>,
    keepalive: Duration,
    (mut breaks, drop_after): (watch::Receiver<u64>, Option<Duration>),
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
) {
    let event = |e: Value| envelope(0, &json!({"event": e}));
    if tx
        .send(Ok(event(json!({"start": {"pid": pid}}))))
        .await
        .is_err()
    {
        return;
    }
    if let Some(end) = ended {
        let _ = tx.send(Ok(event(json!({"end": end})))).await;
        let _ = tx.send(Ok(envelope(2, &json!({})))).await;
        return;
    }
    breaks.mark_unchanged();
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + keepalive, keepalive);
    let dropped = tokio::time::sleep(drop_after.unwrap_or(Duration::MAX / 4));
    tokio::pin!(dropped);
    let reset = || {
        Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "connection reset",
        ))
    };
    loop {
        let frame = tokio::select! {
            received = events.recv() => match received {
                Ok(Ev::Stdout(bytes)) => {
                    ticker.reset();
                    event(json!({"data": {"stdout": b64(&bytes)}}))
                }
                Ok(Ev::Stderr(bytes)) => {
                    ticker.reset();
                    event(json!({"data": {"stderr": b64(&bytes)}}))
                }
                Ok(Ev::End(end)) => {
                    let _ = tx.send(Ok(event(json!({"end": end})))).await;
                    let _ = tx.send(Ok(envelope(2, &json!({})))).await;
                    return;
                }
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return,
            },
            _ = ticker.tick() => event(json!({"keepalive": {}})),
            _ = breaks.changed() => {
                let _ = tx.send(reset()).await;
                return;
            }
            _ = &mut dropped => {
                let _ = tx.send(reset()).await;
                return;
            }
        };
        if tx.send(Ok(frame)).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_utc() {
        assert_eq!(rfc3339(SystemTime::UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339(SystemTime::UNIX_EPOCH + Duration::from_secs(1_780_000_000)),
            "2026-05-28T20:26:40Z"
        );
    }

    #[test]
    fn requests_are_routed_by_headers_on_a_shared_host_else_by_the_host() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.insert(*name, value.parse().unwrap());
            }
            map
        };
        let by_headers = [("e2b-sandbox-id", "i1"), ("e2b-sandbox-port", "49983")];
        for host in ["127.0.0.1:4000", "localhost", "sandbox.e2b.app"] {
            let mut all = vec![("host", host)];
            all.extend(by_headers);
            assert_eq!(
                target(&headers(&all)),
                Ok(("i1".to_owned(), 49983)),
                "{host}"
            );
        }
        assert_eq!(
            target(&headers(&[("host", "49983-i2.e2b.example")])),
            Ok(("i2".to_owned(), 49983))
        );
        assert_eq!(
            target(&headers(&[("host", "127.0.0.1"), ("e2b-sandbox-id", "i1")])),
            Err("missing header")
        );
        assert_eq!(
            target(&headers(&[("host", "x-i2.e2b.example")])),
            Err("Invalid sandbox port")
        );
    }

    #[test]
    fn the_metadata_filter_is_unescaped_as_go_does() {
        assert_eq!(
            query_unescape("shmastraUser%3Dalice%26x%3Dy"),
            "shmastraUser=alice&x=y"
        );
        assert_eq!(query_unescape("a+b"), "a b");
    }
}
