//! A fake GitLab REST API (v4) on `127.0.0.1:0`, answering as GitLab's documentation says:
//! `PRIVATE-TOKEN` auth, `GET /groups/:id`, `GET /projects/:id` (numeric or URL-encoded path),
//! `POST /projects`, `GET /projects/:id/repository/commits` and `.../repository/files/:path/raw`
//! (from a real bare repository),
//! with GitLab's status codes and JSON bodies. Like GitLab, it resolves project paths
//! case-insensitively (`group/Alice` is found as `group/alice`, and answers with its own
//! spelling) and refuses to create a path that differs from a taken one only in case. It
//! records every request and
//! has switches for the faults a client must survive: 429 with `Retry-After`, 500, a hung
//! answer, a lost create race, missing membership, no right to create projects.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// The token the fake accepts until [`FakeGitLab::set_token`] changes it.
pub const SERVICE_TOKEN: &str = "glpat-fake-service-token-0123456789";
/// The id of the fake's group.
pub const GROUP_ID: u64 = 4242;
/// The full path of the fake's group.
pub const GROUP_PATH: &str = "shmastra-users";

/// A fault the fake answers the next request with, before authentication and routing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// `429 Too Many Requests`, `Retry-After: <secs>`, body `Retry later`.
    TooManyRequests { retry_after_secs: u64 },
    /// `500 Internal Server Error`.
    ServerError,
    /// Accept the request and never answer.
    Hang,
}

/// One request as the fake received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedRequest {
    pub method: String,
    /// The raw path and query, percent-encoding kept (`/api/v4/projects/group%2Fuser`).
    pub path: String,
    pub private_token: Option<String>,
    pub user_agent: Option<String>,
    pub body: String,
}

/// A project the fake holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeProject {
    pub id: u64,
    pub path: String,
    pub path_with_namespace: String,
    pub namespace_id: u64,
    pub visibility: String,
    /// As created (`POST /projects`' `description`), else empty.
    pub description: String,
}

struct State {
    token: String,
    member: bool,
    can_create_projects: bool,
    lose_next_create_race: bool,
    faults: VecDeque<Fault>,
    projects: Vec<FakeProject>,
    next_project_id: u64,
    requests: Vec<RecordedRequest>,
    repo_base: String,
    web_base: String,
    /// Bare repositories behind projects (`path_with_namespace` -> directory), for the
    /// repository endpoints.
    repositories: std::collections::HashMap<String, std::path::PathBuf>,
}

/// The running fake. Dropping it stops the server and every open connection.
pub struct FakeGitLab {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    server: tokio::task::JoinHandle<()>,
}

impl FakeGitLab {
    /// Starts the fake with one group ([`GROUP_ID`], [`GROUP_PATH`]) whose member the service
    /// account ([`SERVICE_TOKEN`]) is, and no projects.
    pub async fn start() -> FakeGitLab {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind fake GitLab");
        let addr = listener.local_addr().expect("fake GitLab address");
        let base = format!("http://{addr}");
        let state = Arc::new(Mutex::new(State {
            token: SERVICE_TOKEN.to_owned(),
            member: true,
            can_create_projects: true,
            lose_next_create_race: false,
            faults: VecDeque::new(),
            projects: Vec::new(),
            next_project_id: 1001,
            requests: Vec::new(),
            repo_base: base.clone(),
            web_base: base,
            repositories: std::collections::HashMap::new(),
        }));
        let server = tokio::spawn(serve(listener, state.clone()));
        FakeGitLab {
            addr,
            state,
            server,
        }
    }

    /// The API root to configure a client with (`GITLAB_API_URL`).
    pub fn api_url(&self) -> String {
        format!("http://{}/api/v4", self.addr)
    }

    /// Makes `http_url_to_repo` point under `base` (e.g. a test git server), as
    /// `<base>/<group>/<user>.git`.
    pub fn set_repo_base(&self, base: &str) {
        self.state().repo_base = base.trim_end_matches('/').to_owned();
    }

    /// Changes the token the fake accepts (the old one then gets 401).
    pub fn set_token(&self, token: &str) {
        self.state().token = token.to_owned();
    }

    /// Whether the service account is a member of the group (not a member: the group and its
    /// projects are invisible, 404).
    pub fn set_member(&self, member: bool) {
        self.state().member = member;
    }

    /// Whether the service account may create projects in the group (not: `POST /projects`
    /// answers `{"message":{"namespace":["is not valid"]}}`).
    pub fn set_can_create_projects(&self, allowed: bool) {
        self.state().can_create_projects = allowed;
    }

    /// Answers the next request with `fault`; several queue up in order.
    pub fn push_fault(&self, fault: Fault) {
        self.state().faults.push_back(fault);
    }

    /// The next `POST /projects` loses a race: another caller creates the project just before
    /// it, so it gets GitLab's "has already been taken" validation error.
    pub fn lose_next_create_race(&self) {
        self.state().lose_next_create_race = true;
    }

    /// Adds a project to the group as if someone had created it earlier.
    pub fn add_project(&self, path: &str) -> FakeProject {
        let mut state = self.state();
        insert_project(&mut state, path, "private")
    }

    /// Serves `GET /projects/:id/repository/commits` of the project at `path` (its path in
    /// the group) from the bare repository `dir`, read with the git CLI.
    pub fn set_repository(&self, path: &str, dir: &std::path::Path) {
        self.state()
            .repositories
            .insert(format!("{GROUP_PATH}/{path}"), dir.to_owned());
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.state().requests.clone()
    }

    /// How many requests had `method` and a path starting with `path_prefix`.
    pub fn count(&self, method: &str, path_prefix: &str) -> usize {
        self.state()
            .requests
            .iter()
            .filter(|r| r.method == method && r.path.starts_with(path_prefix))
            .count()
    }

    /// The projects the fake holds.
    pub fn projects(&self) -> Vec<FakeProject> {
        self.state().projects.clone()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("fake GitLab state")
    }
}

impl Drop for FakeGitLab {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn serve(listener: TcpListener, state: Arc<Mutex<State>>) {
    // Owning the connection tasks here means aborting `serve` closes hung connections too.
    let mut connections = JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let state = state.clone();
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |req| handle(req, state.clone()));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
        while connections.try_join_next().is_some() {}
    }
}

type Answer = Response<Full<Bytes>>;

async fn handle(req: Request<Incoming>, state: Arc<Mutex<State>>) -> Result<Answer, Infallible> {
    let method = req.method().to_string();
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let private_token = header("private-token");
    let user_agent = header("user-agent");
    let body = match req.into_body().collect().await {
        Ok(collected) => String::from_utf8_lossy(&collected.to_bytes()).into_owned(),
        Err(_) => String::new(),
    };
    let fault = {
        let mut state = state.lock().expect("fake GitLab state");
        state.requests.push(RecordedRequest {
            method: method.clone(),
            path: path.clone(),
            private_token: private_token.clone(),
            user_agent,
            body: body.clone(),
        });
        state.faults.pop_front()
    };
    match fault {
        Some(Fault::Hang) => std::future::pending::<()>().await,
        Some(Fault::TooManyRequests { retry_after_secs }) => {
            return Ok(Response::builder()
                .status(StatusCode::TOO_MANY_REQUESTS)
                .header("content-type", "text/plain")
                .header("retry-after", retry_after_secs.to_string())
                .body(Full::new(Bytes::from_static(b"Retry later\n")))
                .expect("response"));
        }
        Some(Fault::ServerError) => {
            return Ok(reply(
                StatusCode::INTERNAL_SERVER_ERROR,
                json!({"message": "500 Internal Server Error"}),
            ));
        }
        None => {}
    }
    let mut state = state.lock().expect("fake GitLab state");
    if private_token.as_deref() != Some(state.token.as_str()) {
        return Ok(reply(
            StatusCode::UNAUTHORIZED,
            json!({"message": "401 Unauthorized"}),
        ));
    }
    let route = path.split('?').next().unwrap_or_default();
    let Some(rest) = route.strip_prefix("/api/v4/") else {
        return Ok(not_found_route());
    };
    let segments: Vec<&str> = rest.split('/').collect();
    Ok(match (method.as_str(), segments.as_slice()) {
        ("GET", ["groups", id]) => get_group(&state, &percent_decode(id)),
        ("GET", ["projects", id]) => get_project(&state, &percent_decode(id)),
        ("GET", ["projects", id, "repository", "commits"]) => {
            list_commits(&state, &percent_decode(id), &path)
        }
        ("GET", ["projects", id, "repository", "files", file, "raw"]) => {
            raw_file(&state, &percent_decode(id), &percent_decode(file), &path)
        }
        ("POST", ["projects"]) => create_project(&mut state, &body),
        _ => not_found_route(),
    })
}

fn get_group(state: &State, id: &str) -> Answer {
    if !state.member || (id != GROUP_ID.to_string() && id != GROUP_PATH) {
        return reply(
            StatusCode::NOT_FOUND,
            json!({"message": "404 Group Not Found"}),
        );
    }
    reply(StatusCode::OK, group_json(state))
}

fn get_project(state: &State, id: &str) -> Answer {
    let found = state
        .projects
        .iter()
        .find(|p| p.id.to_string() == id || p.path_with_namespace.eq_ignore_ascii_case(id));
    match found {
        Some(project) if state.member => reply(StatusCode::OK, project_json(state, project)),
        _ => reply(
            StatusCode::NOT_FOUND,
            json!({"message": "404 Project Not Found"}),
        ),
    }
}

/// `GET /projects/:id/repository/commits` with GitLab's parameters `ref_name`, `all`,
/// `per_page` (default 20, at most 100) and `page`, newest first, in GitLab's commit JSON;
/// `X-Page`, `X-Per-Page` and `X-Next-Page` headers as GitLab sends them. A project without a
/// repository answers `404 Repository Not Found`, as GitLab does for an empty project.
fn list_commits(state: &State, id: &str, path_and_query: &str) -> Answer {
    let Some(project) = state
        .projects
        .iter()
        .find(|p| p.id.to_string() == id || p.path_with_namespace.eq_ignore_ascii_case(id))
        .filter(|_| state.member)
    else {
        return reply(
            StatusCode::NOT_FOUND,
            json!({"message": "404 Project Not Found"}),
        );
    };
    let params: Vec<(String, String)> = path_and_query
        .split_once('?')
        .map(|(_, q)| q)
        .unwrap_or_default()
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.to_owned(), percent_decode(v)))
        .collect();
    let param = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let per_page: usize = param("per_page")
        .and_then(|v| v.parse().ok())
        .unwrap_or(20)
        .clamp(1, 100);
    let page: usize = param("page")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1);
    let Some(dir) = state.repositories.get(&project.path_with_namespace) else {
        return reply(
            StatusCode::NOT_FOUND,
            json!({"message": "404 Repository Not Found"}),
        );
    };
    let mut args = vec![
        "log".to_owned(),
        "--date-order".to_owned(),
        format!("--skip={}", (page - 1) * per_page),
        format!("--max-count={}", per_page + 1),
        "--format=%H%x00%P%x00%an%x00%ae%x00%aI%x00%cn%x00%ce%x00%cI%x00%B%x1e".to_owned(),
    ];
    if param("all") == Some("true") {
        args.push("--branches".to_owned());
    } else {
        args.push(param("ref_name").unwrap_or("main").to_owned());
    }
    args.push("--".to_owned());
    let out = crate::git::git_output(dir, &args);
    if !out.status.success() {
        // An unknown ref_name gives an empty list in GitLab.
        return reply(StatusCode::OK, json!([]));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut commits: Vec<Value> = text
        .split('\x1e')
        .map(|record| record.trim_start_matches('\n'))
        .filter(|record| !record.is_empty())
        .map(|record| {
            let f: Vec<&str> = record.splitn(9, '\0').collect();
            let field = |i: usize| f.get(i).copied().unwrap_or_default();
            let message = field(8);
            json!({
                "id": field(0),
                "short_id": &field(0)[..8.min(field(0).len())],
                "created_at": field(7),
                "parent_ids": field(1).split_whitespace().collect::<Vec<_>>(),
                "title": message.lines().next().unwrap_or_default(),
                "message": message,
                "author_name": field(2),
                "author_email": field(3),
                "authored_date": field(4),
                "committer_name": field(5),
                "committer_email": field(6),
                "committed_date": field(7),
                "trailers": {},
                "extended_trailers": {},
                "web_url": format!("{}/{}/-/commit/{}", state.web_base, project.path_with_namespace, field(0)),
            })
        })
        .collect();
    let has_next = commits.len() > per_page;
    commits.truncate(per_page);
    let mut answer = reply(StatusCode::OK, Value::Array(commits));
    let headers = answer.headers_mut();
    headers.insert("x-page", page.into());
    headers.insert("x-per-page", per_page.into());
    let next = if has_next {
        (page + 1).to_string()
    } else {
        String::new()
    };
    headers.insert(
        "x-next-page",
        next.parse().expect("a page number is a header value"),
    );
    answer
}

/// `GET /projects/:id/repository/files/:file_path/raw?ref=REF` (default `main`): the file's
/// bytes from the project's repository, or GitLab's `404 File Not Found` (also for an unknown
/// ref, and `404 Repository Not Found` for a project without one).
fn raw_file(state: &State, id: &str, file: &str, path_and_query: &str) -> Answer {
    let Some(project) = state
        .projects
        .iter()
        .find(|p| p.id.to_string() == id || p.path_with_namespace.eq_ignore_ascii_case(id))
        .filter(|_| state.member)
    else {
        return reply(
            StatusCode::NOT_FOUND,
            json!({"message": "404 Project Not Found"}),
        );
    };
    let Some(dir) = state.repositories.get(&project.path_with_namespace) else {
        return reply(
            StatusCode::NOT_FOUND,
            json!({"message": "404 Repository Not Found"}),
        );
    };
    let reference = path_and_query
        .split_once('?')
        .map(|(_, q)| q)
        .unwrap_or_default()
        .split('&')
        .find_map(|pair| pair.strip_prefix("ref="))
        .map_or_else(|| "main".to_owned(), percent_decode);
    let out = crate::git::git_output(dir, ["show", &format!("{reference}:{file}")]);
    if !out.status.success() {
        return reply(
            StatusCode::NOT_FOUND,
            json!({"message": "404 File Not Found"}),
        );
    }
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from(out.stdout)))
        .expect("response")
}

fn create_project(state: &mut State, body: &str) -> Answer {
    let Ok(params) = serde_json::from_str::<Value>(body) else {
        return reply(
            StatusCode::BAD_REQUEST,
            json!({"error": "name, path are missing, at least one parameter must be provided"}),
        );
    };
    let text = |key: &str| params.get(key).and_then(Value::as_str).map(str::to_owned);
    let Some(path) = text("path").or_else(|| text("name")) else {
        return reply(
            StatusCode::BAD_REQUEST,
            json!({"error": "name, path are missing, at least one parameter must be provided"}),
        );
    };
    let namespace_id = params.get("namespace_id").and_then(|v| {
        v.as_u64()
            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
    });
    if namespace_id != Some(GROUP_ID) || !state.member || !state.can_create_projects {
        return reply(
            StatusCode::BAD_REQUEST,
            json!({"message": {"namespace": ["is not valid"]}}),
        );
    }
    if !valid_project_path(&path) {
        return reply(
            StatusCode::BAD_REQUEST,
            json!({"message": {"path": ["can contain only letters, digits, '_', '-' and '.'. Cannot start with '-', end in '.git' or end in '.atom'"]}}),
        );
    }
    if std::mem::take(&mut state.lose_next_create_race) {
        insert_project(state, &path, "private");
    }
    if state
        .projects
        .iter()
        .any(|p| p.path.eq_ignore_ascii_case(&path))
    {
        return reply(
            StatusCode::BAD_REQUEST,
            json!({"message": {
                "project_namespace.name": ["has already been taken"],
                "name": ["has already been taken"],
                "path": ["has already been taken"],
            }}),
        );
    }
    let visibility = text("visibility").unwrap_or_else(|| "private".to_owned());
    let mut project = insert_project(state, &path, &visibility);
    project.description = text("description").unwrap_or_default();
    if let Some(kept) = state.projects.iter_mut().find(|p| p.id == project.id) {
        kept.description = project.description.clone();
    }
    reply(StatusCode::CREATED, project_json(state, &project))
}

fn insert_project(state: &mut State, path: &str, visibility: &str) -> FakeProject {
    let project = FakeProject {
        id: state.next_project_id,
        path: path.to_owned(),
        path_with_namespace: format!("{GROUP_PATH}/{path}"),
        namespace_id: GROUP_ID,
        visibility: visibility.to_owned(),
        description: String::new(),
    };
    state.next_project_id += 1;
    state.projects.push(project.clone());
    project
}

fn valid_project_path(path: &str) -> bool {
    !path.is_empty()
        && path
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        && !path.starts_with(['-', '.'])
        && !path.ends_with(".git")
        && !path.ends_with(".atom")
}

fn group_json(state: &State) -> Value {
    json!({
        "id": GROUP_ID,
        "name": GROUP_PATH,
        "path": GROUP_PATH,
        "full_name": GROUP_PATH,
        "full_path": GROUP_PATH,
        "description": "",
        "visibility": "private",
        "parent_id": null,
        "web_url": format!("{}/groups/{GROUP_PATH}", state.web_base),
    })
}

fn project_json(state: &State, project: &FakeProject) -> Value {
    json!({
        "id": project.id,
        "name": project.path,
        "path": project.path,
        "name_with_namespace": format!("{GROUP_PATH} / {}", project.path),
        "path_with_namespace": project.path_with_namespace,
        "visibility": project.visibility,
        "description": project.description,
        "default_branch": null,
        "empty_repo": true,
        "http_url_to_repo": format!("{}/{}.git", state.repo_base, project.path_with_namespace),
        "ssh_url_to_repo": format!("git@127.0.0.1:{}.git", project.path_with_namespace),
        "web_url": format!("{}/{}", state.web_base, project.path_with_namespace),
        "namespace": {
            "id": project.namespace_id,
            "name": GROUP_PATH,
            "path": GROUP_PATH,
            "kind": "group",
            "full_path": GROUP_PATH,
        },
    })
}

fn not_found_route() -> Answer {
    reply(StatusCode::NOT_FOUND, json!({"error": "404 Not Found"}))
}

fn reply(status: StatusCode, body: Value) -> Answer {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("response")
}

fn percent_decode(segment: &str) -> String {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
