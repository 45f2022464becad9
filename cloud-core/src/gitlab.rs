//! The GitLab REST client: the smoke test (`check`) and one private project per user
//! (`ensure_user_project`), with retries for 429/5xx and a latch that stops sending credentials
//! GitLab has rejected (GitLab bans an IP after repeated failed authentications).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderValue, RETRY_AFTER};
use reqwest::{Method, StatusCode, Url};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use shmastra_contract::env::DEFAULT_BRANCH;
use tokio::sync::OnceCell;

use crate::config::Config;
use crate::project_path::{Owner, ProjectPath};
use crate::user::UserId;

/// Longest part of a GitLab response body quoted in an error.
const MAX_QUOTED_BODY: usize = 300;

/// A GitLab group, as `GET /groups/:id` describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Group {
    pub id: u64,
    pub name: String,
    pub path: String,
    pub full_path: String,
    #[serde(default)]
    pub web_url: String,
}

/// A GitLab project, as `GET /projects/:id` and `POST /projects` describe it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Project {
    pub id: u64,
    pub path_with_namespace: String,
    /// The HTTP clone URL; git traffic goes here with the service token as the password.
    pub http_url_to_repo: String,
    /// The project's page, for people.
    #[serde(default)]
    pub web_url: String,
    /// Set at creation to [`OWNER_MARK`] and the user id: who the project is for.
    #[serde(default)]
    pub description: Option<String>,
}

/// The start of the description of a project this crate created; the user id follows. A
/// template that holds only part of the user id (`<user:8>`) could give two users one path:
/// a project marked for another user is never used.
pub const OWNER_MARK: &str = "shmastra user ";

/// A commit as `GET /projects/:id/repository/commits` lists it (the fields this crate reads).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Commit {
    pub id: String,
    /// The whole message, trailers included.
    pub message: String,
    /// ISO 8601 with the committer's offset (`2026-11-30T14:05:12.000+01:00`).
    pub committed_date: String,
    /// Who wrote it.
    #[serde(default)]
    pub author_name: String,
}

/// What went wrong talking to GitLab, sorted by what the caller does about it.
#[derive(Debug, thiserror::Error)]
pub enum GitLabError {
    // A person must fix the setup; retrying cannot help.
    /// The service token was refused (401).
    #[error(
        "GitLab at {api_url} rejected the service token (401): it is wrong, expired or revoked; set a valid GITLAB_SERVICE_TOKEN with the `api` scope (this process sends it no more: repeated failed logins get the IP banned)"
    )]
    Unauthorized {
        /// The API root asked.
        api_url: String,
    },
    /// The group cannot be seen by the service account (404).
    #[error(
        "group {group_id} is not visible at {api_url} (404): the service account is not a member of the group; add it to the group as Maintainer (or fix GITLAB_GROUP_ID)"
    )]
    GroupNotFound {
        /// `GITLAB_GROUP_ID`.
        group_id: u64,
        /// The API root asked.
        api_url: String,
    },
    /// The service account lacks a right (403).
    #[error(
        "GitLab refused {what} (403): the service account needs the Maintainer role in group {group_id} and a token with the `api` scope; GitLab said: {body}"
    )]
    Forbidden {
        /// What was asked.
        what: String,
        /// `GITLAB_GROUP_ID`.
        group_id: u64,
        /// GitLab's answer, cut.
        body: String,
    },
    /// GitLab refused to create a project in the group.
    #[error(
        "the service account cannot create projects in group {group_path} (id {group_id}): GitLab answered that the namespace is not valid; give the account the Maintainer role in the group (or let Developers create projects)"
    )]
    CannotCreateProjects {
        /// `GITLAB_GROUP_ID`.
        group_id: u64,
        /// The group's full path.
        group_path: String,
    },
    /// A project path is taken by a project that cannot be read.
    #[error(
        "project path {path} is taken, but the project cannot be read (pending deletion, or a name clash): GitLab said: {body}"
    )]
    PathTaken {
        /// The project path.
        path: String,
        /// GitLab's answer, cut.
        body: String,
    },
    /// GitLab answered another project than the one asked for.
    #[error(
        "GitLab answered project {found} when asked for {asked}: project paths resolve case-insensitively, so this is another tenant's project; no git traffic goes to it"
    )]
    ProjectMismatch {
        /// The path asked for.
        asked: String,
        /// The path GitLab answered with.
        found: String,
    },
    /// The project at the user's path is marked for another user (a template with `<user:N>`
    /// gave two users one path).
    #[error(
        "project {path} belongs to user {owner}, not to {user}: the project path template gives both the same path; use a template with the whole <user>"
    )]
    ProjectTaken {
        /// The path.
        path: String,
        /// Whose it is.
        owner: String,
        /// Who asked.
        user: UserId,
    },
    /// The service token cannot be an HTTP header value.
    #[error("GITLAB_SERVICE_TOKEN contains characters that cannot be sent in an HTTP header")]
    InvalidServiceToken,
    /// GitLab redirected an API request (never followed: it could carry the token away).
    #[error(
        "{what}: GitLab redirected to {location}; set GITLAB_API_URL to the API root it redirects to"
    )]
    Redirected {
        /// What was asked.
        what: String,
        /// Where GitLab pointed.
        location: String,
    },

    // Transient: the caller may try again later.
    /// GitLab answered 429 or 5xx on every attempt.
    #[error("{what}: GitLab answered {status} {attempts} times; giving up for now: {body}")]
    Unavailable {
        /// What was asked.
        what: String,
        /// The last status.
        status: u16,
        /// How many attempts were made.
        attempts: u32,
        /// GitLab's last answer, cut.
        body: String,
    },
    /// No attempt was answered in time.
    #[error("{what}: no answer from GitLab within {timeout:?} ({attempts} attempts)")]
    Timeout {
        /// What was asked.
        what: String,
        /// The limit of each attempt.
        timeout: Duration,
        /// How many attempts were made.
        attempts: u32,
    },
    /// No attempt reached GitLab.
    #[error("{what}: cannot reach GitLab ({attempts} attempts)")]
    Unreachable {
        /// What was asked.
        what: String,
        /// How many attempts were made.
        attempts: u32,
        /// The last attempt's error.
        #[source]
        source: reqwest::Error,
    },

    // GitLab answered something this client does not understand.
    /// A status this client has no meaning for.
    #[error("{what}: GitLab answered {status}: {body}")]
    Unexpected {
        /// What was asked.
        what: String,
        /// The status.
        status: u16,
        /// GitLab's answer, cut.
        body: String,
    },
    /// An answer that is not the JSON expected.
    #[error("{what}: GitLab's answer is not the expected JSON: {reason}")]
    BadResponse {
        /// What was asked.
        what: String,
        /// What is wrong with the answer.
        reason: String,
    },
    /// The HTTP client could not be made (TLS setup).
    #[error("cannot build the HTTP client")]
    Client(#[source] reqwest::Error),
}

impl GitLabError {
    /// Whether the same call may succeed later without anyone changing the setup.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            GitLabError::Unavailable { .. }
                | GitLabError::Timeout { .. }
                | GitLabError::Unreachable { .. }
        )
    }
}

/// How often and how long to retry a 429, a 5xx, a timeout or a refused connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts per call, the first one included.
    pub max_attempts: u32,
    /// The wait after the first failure; it doubles with every further failure.
    pub initial_backoff: Duration,
    /// The longest wait between two attempts.
    pub max_backoff: Duration,
    /// A `Retry-After` longer than this ends the call instead of blocking it.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 4,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(10),
            max_retry_after: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// The wait before attempt `failed + 1` after `failed` failures, or `None` to give up.
    /// A server's `Retry-After` wins over the backoff: it knows when it will serve again.
    pub(crate) fn delay(&self, failed: u32, retry_after: Option<Duration>) -> Option<Duration> {
        if failed >= self.max_attempts {
            return None;
        }
        match retry_after {
            Some(wait) if wait > self.max_retry_after => None,
            Some(wait) => Some(wait),
            None => {
                let doublings = failed.saturating_sub(1).min(20);
                Some(
                    self.initial_backoff
                        .saturating_mul(1 << doublings)
                        .min(self.max_backoff),
                )
            }
        }
    }
}

/// `Retry-After` in delay-seconds form, which GitLab sends; an HTTP date falls back to backoff.
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

/// Why GitLab refused to create a project, read from its validation error body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateRefusal {
    /// `{"message": {"path": ["has already been taken"], ..}}`: someone created it first.
    AlreadyTaken,
    /// `{"message": {"namespace": ["is not valid"]}}`: no right to create in the group.
    NamespaceNotValid,
    Other,
}

/// Classifies a `400` answer to `POST /projects`.
pub fn classify_create_refusal(body: &str) -> CreateRefusal {
    let Ok(serde_json::Value::Object(top)) = serde_json::from_str::<serde_json::Value>(body) else {
        return CreateRefusal::Other;
    };
    let Some(serde_json::Value::Object(fields)) = top.get("message") else {
        return CreateRefusal::Other;
    };
    let says = |field: &serde_json::Value, text: &str| match field {
        serde_json::Value::Array(items) => items
            .iter()
            .any(|m| m.as_str().is_some_and(|m| m.contains(text))),
        serde_json::Value::String(m) => m.contains(text),
        _ => false,
    };
    if fields.iter().any(|(name, msgs)| {
        matches!(name.as_str(), "path" | "name" | "project_namespace.name")
            && says(msgs, "has already been taken")
    }) {
        return CreateRefusal::AlreadyTaken;
    }
    if fields
        .get("namespace")
        .is_some_and(|msgs| says(msgs, "is not valid"))
    {
        return CreateRefusal::NamespaceNotValid;
    }
    CreateRefusal::Other
}

/// A GitLab REST client bound to one group. Cheap to clone; clones share the rejected-token
/// latch and the caches.
#[derive(Clone)]
pub struct GitLab {
    inner: Arc<Inner>,
}

struct Inner {
    http: reqwest::Client,
    api_url: Url,
    group_id: u64,
    service_token: SecretString,
    retry: RetryPolicy,
    timeout: Duration,
    credentials_rejected: AtomicBool,
    credentials_accepted: AtomicBool,
    /// Held by the one request in flight until GitLab has accepted the token once.
    first_use: tokio::sync::Mutex<()>,
    group: OnceCell<Group>,
    projects: Mutex<HashMap<UserId, Project>>,
    project_path: ProjectPath,
}

/// One answer from GitLab that was neither a 401 nor a retryable failure.
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    /// At most [`MAX_ANSWER_BYTES`] of the body.
    body: String,
    /// The body went on past [`MAX_ANSWER_BYTES`]; the rest was not read.
    cut: bool,
}

/// The most of one answer read: a page of 100 commits is far below it, and a page of commits
/// with huge messages (pushed to make pages expensive) is refused, not held.
const MAX_ANSWER_BYTES: usize = 8 << 20;

impl GitLab {
    /// A client for the group in `config`, with the default retry policy.
    pub fn new(config: &Config) -> Result<GitLab, GitLabError> {
        GitLab::with_retry_policy(config, RetryPolicy::default())
    }

    /// A client with an explicit retry policy.
    pub fn with_retry_policy(config: &Config, retry: RetryPolicy) -> Result<GitLab, GitLabError> {
        let http = reqwest::Client::builder()
            .user_agent(concat!("shmastra-cloud/", env!("CARGO_PKG_VERSION")))
            .timeout(config.request_timeout)
            .connect_timeout(config.request_timeout)
            // A redirect could carry PRIVATE-TOKEN to another host; refuse and explain instead.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(GitLabError::Client)?;
        Ok(GitLab {
            inner: Arc::new(Inner {
                http,
                api_url: config.api_url.clone(),
                group_id: config.group_id,
                service_token: config.service_token.clone(),
                retry,
                timeout: config.request_timeout,
                credentials_rejected: AtomicBool::new(false),
                credentials_accepted: AtomicBool::new(false),
                first_use: tokio::sync::Mutex::new(()),
                group: OnceCell::new(),
                projects: Mutex::new(HashMap::new()),
                project_path: config.project_path.clone(),
            }),
        })
    }

    /// The API root this client talks to.
    pub fn api_url(&self) -> &Url {
        &self.inner.api_url
    }

    /// The smoke test: `GET /groups/:id`. Returns the group, or a diagnosis a person can act on.
    pub async fn check(&self) -> Result<Group, GitLabError> {
        let group_id = self.inner.group_id;
        let mut url = self.endpoint(&["groups", &group_id.to_string()]);
        // Older GitLab versions list every project of the group unless told not to.
        url.set_query(Some("with_projects=false"));
        let answer = self.send(Method::GET, url, None).await?;
        match answer.status {
            StatusCode::OK => {
                let group: Group = parse_json("GET group", &answer.body)?;
                tracing::debug!(group_id, full_path = %group.full_path, "GitLab group is reachable");
                Ok(group)
            }
            StatusCode::NOT_FOUND => Err(GitLabError::GroupNotFound {
                group_id,
                api_url: self.inner.api_url.to_string(),
            }),
            StatusCode::FORBIDDEN => Err(GitLabError::Forbidden {
                what: format!("GET /groups/{group_id}"),
                group_id,
                body: quote(&answer.body),
            }),
            _ => Err(self.unexpected(format!("GET /groups/{group_id}"), &answer)),
        }
    }

    /// Makes sure `user` has a private project in the group and returns it. Idempotent and safe
    /// to race: a concurrent create answered with "has already been taken" counts as found.
    pub async fn ensure_user_project(&self, user: &UserId) -> Result<Project, GitLabError> {
        let group = self.group().await?;
        let full_path = self.inner.project_path.render(&group.full_path, user);
        if let Some(project) = self.find_project(&full_path).await? {
            tracing::debug!(user = %user, project_id = project.id, "GitLab project exists");
            return self.remember(user, &full_path, project);
        }
        let project = self.create_project(&group, user, &full_path).await?;
        self.remember(user, &full_path, project)
    }

    /// The full path of the group that holds the user projects, as GitLab spells it.
    pub(crate) async fn group_path(&self) -> Result<String, GitLabError> {
        Ok(self.group().await?.full_path)
    }

    /// The user's project from this client's cache, else [`GitLab::ensure_user_project`]: the
    /// cheap way to find where a user's git traffic goes.
    pub async fn user_project(&self, user: &UserId) -> Result<Project, GitLabError> {
        if let Some(project) = self.cached(user) {
            return Ok(project);
        }
        self.ensure_user_project(user).await
    }

    /// The newest `limit` commits of `user`'s project on every branch (the project's branch and
    /// the `recovery/` branches), newest first, paging through GitLab's answers. A user without
    /// a project, or a project without a repository yet, has none. Never creates anything.
    pub(crate) async fn recent_commits(
        &self,
        user: &UserId,
        limit: usize,
    ) -> Result<Vec<Commit>, GitLabError> {
        let Some(project) = self.existing_project(user).await? else {
            return Ok(Vec::new());
        };
        let what = || format!("GET commits of project {}", project.path_with_namespace);
        let per_page = limit.clamp(1, 100).to_string();
        let mut commits = Vec::new();
        let mut page = 1u32;
        while commits.len() < limit {
            let mut url =
                self.endpoint(&["projects", &project.id.to_string(), "repository", "commits"]);
            url.query_pairs_mut()
                .append_pair("all", "true")
                .append_pair("per_page", &per_page)
                .append_pair("page", &page.to_string());
            let answer = self.send(Method::GET, url, None).await?;
            match answer.status {
                StatusCode::OK => {}
                // GitLab's answer for a project whose repository has no commit yet.
                StatusCode::NOT_FOUND => break,
                StatusCode::FORBIDDEN => {
                    return Err(GitLabError::Forbidden {
                        what: what(),
                        group_id: self.inner.group_id,
                        body: quote(&answer.body),
                    });
                }
                _ => return Err(self.unexpected(what(), &answer)),
            }
            if answer.cut {
                return Err(GitLabError::BadResponse {
                    what: what(),
                    reason: format!("the answer is over {MAX_ANSWER_BYTES} bytes"),
                });
            }
            let batch: Vec<Commit> = parse_json("GET commits", &answer.body)?;
            let more = answer
                .headers
                .get("x-next-page")
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| !v.trim().is_empty());
            let empty = batch.is_empty();
            commits.extend(batch);
            if !more || empty {
                break;
            }
            page += 1;
        }
        commits.truncate(limit);
        Ok(commits)
    }

    /// The text of `path` on the saved branch of `user`'s project (`GET
    /// /projects/:id/repository/files/:path/raw?ref=main`); `None` without a project, a
    /// repository, the branch or the file. Never creates anything.
    pub(crate) async fn saved_file(
        &self,
        user: &UserId,
        path: &str,
    ) -> Result<Option<String>, GitLabError> {
        let Some(project) = self.existing_project(user).await? else {
            return Ok(None);
        };
        let what = || format!("GET {path} of project {}", project.path_with_namespace);
        let mut url = self.endpoint(&[
            "projects",
            &project.id.to_string(),
            "repository",
            "files",
            path,
            "raw",
        ]);
        url.query_pairs_mut().append_pair("ref", DEFAULT_BRANCH);
        let answer = self.send(Method::GET, url, None).await?;
        match answer.status {
            StatusCode::OK => Ok(Some(answer.body)),
            // No file, no branch, or an empty repository.
            StatusCode::NOT_FOUND => Ok(None),
            StatusCode::FORBIDDEN => Err(GitLabError::Forbidden {
                what: what(),
                group_id: self.inner.group_id,
                body: quote(&answer.body),
            }),
            _ => Err(self.unexpected(what(), &answer)),
        }
    }

    /// The user's project if it exists (cached, else looked up), never created.
    async fn existing_project(&self, user: &UserId) -> Result<Option<Project>, GitLabError> {
        if let Some(project) = self.cached(user) {
            return Ok(Some(project));
        }
        let group = self.group().await?;
        let full_path = self.inner.project_path.render(&group.full_path, user);
        match self.find_project(&full_path).await? {
            // Another tenant's project (found by a path differing in case) is never read.
            Some(project) => self.remember(user, &full_path, project).map(Some),
            None => Ok(None),
        }
    }

    /// Whose project `path` (a `path_with_namespace` in the group `group`) is, by the project
    /// path template; for a template holding part of the user id, the user whose project this
    /// client looked up with that path (the proxy looks it up at the user's first git request).
    pub(crate) fn owner_of(&self, group: &str, path: &str) -> Option<UserId> {
        match self.inner.project_path.owner(group, path) {
            Owner::User(user) => Some(user),
            Owner::Prefix(_) => self
                .inner
                .projects
                .lock()
                .expect("project cache lock")
                .iter()
                .find(|(_, p)| p.path_with_namespace == path)
                .map(|(user, _)| user.clone()),
            Owner::Nobody => None,
        }
    }

    /// Drops the cached project of `user` (e.g. after GitLab answered 404 for its repository).
    pub fn forget(&self, user: &UserId) {
        self.inner
            .projects
            .lock()
            .expect("project cache lock")
            .remove(user);
    }

    fn cached(&self, user: &UserId) -> Option<Project> {
        self.inner
            .projects
            .lock()
            .expect("project cache lock")
            .get(user)
            .cloned()
    }

    /// Caches `project` as `user`'s once its path is exactly `full_path`: GitLab finds
    /// `group/Alice` when asked for `group/alice`, and that project belongs to someone else.
    fn remember(
        &self,
        user: &UserId,
        full_path: &str,
        project: Project,
    ) -> Result<Project, GitLabError> {
        if project.path_with_namespace != full_path {
            tracing::error!(user = %user, asked = full_path, found = %project.path_with_namespace, "GitLab answered another project's path");
            return Err(GitLabError::ProjectMismatch {
                asked: full_path.to_owned(),
                found: project.path_with_namespace,
            });
        }
        let marked = project
            .description
            .as_deref()
            .and_then(|d| d.strip_prefix(OWNER_MARK))
            .map(str::trim);
        let mut projects = self.inner.projects.lock().expect("project cache lock");
        let cached_owner = projects
            .iter()
            .find(|(other, p)| p.id == project.id && *other != user)
            .map(|(other, _)| other.to_string());
        if let Some(owner) =
            cached_owner.or(marked.filter(|m| *m != user.as_str()).map(str::to_owned))
        {
            tracing::error!(user = %user, path = %project.path_with_namespace, owner, "the project at the user's path is another user's");
            return Err(GitLabError::ProjectTaken {
                path: project.path_with_namespace,
                owner,
                user: user.clone(),
            });
        }
        projects.insert(user.clone(), project.clone());
        Ok(project)
    }

    async fn group(&self) -> Result<Group, GitLabError> {
        self.inner
            .group
            .get_or_try_init(|| self.check())
            .await
            .cloned()
    }

    async fn find_project(&self, full_path: &str) -> Result<Option<Project>, GitLabError> {
        let answer = self
            .send(Method::GET, self.endpoint(&["projects", full_path]), None)
            .await?;
        match answer.status {
            StatusCode::OK => parse_json("GET project", &answer.body).map(Some),
            StatusCode::NOT_FOUND => Ok(None),
            StatusCode::FORBIDDEN => Err(GitLabError::Forbidden {
                what: format!("GET project {full_path}"),
                group_id: self.inner.group_id,
                body: quote(&answer.body),
            }),
            _ => Err(self.unexpected(format!("GET project {full_path}"), &answer)),
        }
    }

    async fn create_project(
        &self,
        group: &Group,
        user: &UserId,
        full_path: &str,
    ) -> Result<Project, GitLabError> {
        let name = self.inner.project_path.name(user);
        let body = serde_json::json!({
            "name": name,
            "path": name,
            "namespace_id": group.id,
            "visibility": "private",
            "description": format!("{OWNER_MARK}{user}"),
        });
        let answer = self
            .send(Method::POST, self.endpoint(&["projects"]), Some(body))
            .await?;
        let refused_namespace = || GitLabError::CannotCreateProjects {
            group_id: group.id,
            group_path: group.full_path.clone(),
        };
        match answer.status {
            StatusCode::CREATED | StatusCode::OK => {
                let project: Project = parse_json("POST project", &answer.body)?;
                tracing::info!(user = %user, project_id = project.id, path = %project.path_with_namespace, "created GitLab project");
                Ok(project)
            }
            StatusCode::BAD_REQUEST => match classify_create_refusal(&answer.body) {
                CreateRefusal::AlreadyTaken => {
                    tracing::debug!(user = %user, "project created concurrently; reading it");
                    self.find_project(full_path)
                        .await?
                        .ok_or_else(|| GitLabError::PathTaken {
                            path: full_path.to_owned(),
                            body: quote(&answer.body),
                        })
                }
                CreateRefusal::NamespaceNotValid => Err(refused_namespace()),
                CreateRefusal::Other => {
                    Err(self.unexpected(format!("POST project {full_path}"), &answer))
                }
            },
            StatusCode::FORBIDDEN => Err(refused_namespace()),
            StatusCode::NOT_FOUND => Err(GitLabError::GroupNotFound {
                group_id: group.id,
                api_url: self.inner.api_url.to_string(),
            }),
            _ => Err(self.unexpected(format!("POST project {full_path}"), &answer)),
        }
    }

    /// `api_url` plus path segments, each percent-encoded (so `group/user` becomes
    /// `group%2Fuser`, the form GitLab wants for a project path).
    fn endpoint(&self, segments: &[&str]) -> Url {
        let mut url = self.inner.api_url.clone();
        url.path_segments_mut()
            .expect("the API URL was validated as a base")
            .pop_if_empty()
            .extend(segments);
        url
    }

    fn unexpected(&self, what: String, answer: &Answer) -> GitLabError {
        if answer.status.is_redirection() {
            let location = answer
                .headers
                .get(reqwest::header::LOCATION)
                .and_then(|l| l.to_str().ok())
                .unwrap_or("(no Location)")
                .to_owned();
            return GitLabError::Redirected { what, location };
        }
        GitLabError::Unexpected {
            what,
            status: answer.status.as_u16(),
            body: quote(&answer.body),
        }
    }

    /// Sends one request, retrying what may pass later. A 401 trips the latch: from then on no
    /// request carries the rejected token.
    async fn send(
        &self,
        method: Method,
        url: Url,
        body: Option<serde_json::Value>,
    ) -> Result<Answer, GitLabError> {
        let inner = &self.inner;
        let what = format!("{method} {url}");
        let unauthorized = || GitLabError::Unauthorized {
            api_url: inner.api_url.to_string(),
        };
        let mut token = HeaderValue::from_str(inner.service_token.expose_secret())
            .map_err(|_| GitLabError::InvalidServiceToken)?;
        token.set_sensitive(true);
        // Until GitLab has accepted the token once, requests go one at a time: a wrong token is
        // then sent once even when many callers start together.
        let _first_use = if inner.credentials_accepted.load(Ordering::SeqCst) {
            None
        } else {
            Some(inner.first_use.lock().await)
        };
        let mut failed = 0;
        loop {
            if inner.credentials_rejected.load(Ordering::SeqCst) {
                return Err(unauthorized());
            }
            let mut request = inner
                .http
                .request(method.clone(), url.clone())
                .header("PRIVATE-TOKEN", token.clone());
            if let Some(body) = &body {
                request = request.json(body);
            }
            failed += 1;
            let (failure, retry_after) = match send_once(request).await {
                Ok(answer) if answer.status == StatusCode::UNAUTHORIZED => {
                    inner.credentials_rejected.store(true, Ordering::SeqCst);
                    tracing::error!(api_url = %inner.api_url, "GitLab rejected the service token; not sending it again");
                    return Err(unauthorized());
                }
                Ok(answer)
                    if answer.status == StatusCode::TOO_MANY_REQUESTS
                        || answer.status.is_server_error() =>
                {
                    let retry_after = answer
                        .headers
                        .get(RETRY_AFTER)
                        .and_then(|v| v.to_str().ok())
                        .and_then(parse_retry_after);
                    let failure = GitLabError::Unavailable {
                        what: what.clone(),
                        status: answer.status.as_u16(),
                        attempts: failed,
                        body: quote(&answer.body),
                    };
                    (failure, retry_after)
                }
                Ok(answer) => {
                    inner.credentials_accepted.store(true, Ordering::SeqCst);
                    return Ok(answer);
                }
                Err(e) if e.is_timeout() => {
                    let failure = GitLabError::Timeout {
                        what: what.clone(),
                        timeout: inner.timeout,
                        attempts: failed,
                    };
                    (failure, None)
                }
                Err(e) if e.is_builder() => return Err(GitLabError::Client(e)),
                Err(e) => {
                    let failure = GitLabError::Unreachable {
                        what: what.clone(),
                        attempts: failed,
                        source: e.without_url(),
                    };
                    (failure, None)
                }
            };
            match inner.retry.delay(failed, retry_after) {
                Some(wait) => {
                    tracing::warn!(error = %with_causes(&failure), retry_in = %shmastra_contract::duration::short_duration(wait), "GitLab request failed; retrying");
                    tokio::time::sleep(wait).await;
                }
                None => return Err(failure),
            }
        }
    }
}

async fn send_once(request: reqwest::RequestBuilder) -> Result<Answer, reqwest::Error> {
    let mut response = request.send().await?;
    let status = response.status();
    let headers = response.headers().clone();
    let mut body = Vec::new();
    let mut cut = false;
    while let Some(chunk) = response.chunk().await? {
        if body.len() + chunk.len() > MAX_ANSWER_BYTES {
            cut = true;
            break;
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
        cut,
    })
}

fn parse_json<T: serde::de::DeserializeOwned>(what: &str, body: &str) -> Result<T, GitLabError> {
    serde_json::from_str(body).map_err(|e| GitLabError::BadResponse {
        what: what.to_owned(),
        reason: e.to_string(),
    })
}

/// `error` and its causes on one line, as a log field.
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut line = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        line.push_str(": ");
        line.push_str(&c.to_string());
        cause = c.source();
    }
    line
}

/// A response body cut to a length that fits in one error line.
fn quote(body: &str) -> String {
    let body = body.trim();
    match body.char_indices().nth(MAX_QUOTED_BODY) {
        Some((cut, _)) => format!("{}...", &body[..cut]),
        None => body.to_owned(),
    }
}

impl std::fmt::Debug for GitLab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GitLab")
            .field("api_url", &self.inner.api_url.as_str())
            .field("group_id", &self.inner.group_id)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delays() {
        let policy = RetryPolicy::default();
        let ms = Duration::from_millis;
        let check = |failed, retry_after, expected| {
            assert_eq!(
                policy.delay(failed, retry_after),
                expected,
                "{failed} {retry_after:?}"
            )
        };
        check(1, None, Some(ms(500)));
        check(2, None, Some(ms(1000)));
        check(3, None, Some(ms(2000)));
        check(4, None, None);
        check(1, Some(ms(7000)), Some(ms(7000)));
        check(1, Some(Duration::from_secs(61)), None);
        check(4, Some(ms(1000)), None);
        let long = RetryPolicy {
            max_attempts: 100,
            ..RetryPolicy::default()
        };
        assert_eq!(long.delay(60, None), Some(Duration::from_secs(10)));
    }

    #[test]
    fn retry_after_forms() {
        assert_eq!(parse_retry_after("30"), Some(Duration::from_secs(30)));
        assert_eq!(parse_retry_after(" 0 "), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(parse_retry_after("-1"), None);
    }

    #[test]
    fn create_refusals() {
        let check =
            |body: &str, expected| assert_eq!(classify_create_refusal(body), expected, "{body}");
        check(
            r#"{"message":{"path":["has already been taken"]}}"#,
            CreateRefusal::AlreadyTaken,
        );
        check(
            r#"{"message":{"project_namespace.name":["has already been taken"],"name":["has already been taken"],"path":["has already been taken"]}}"#,
            CreateRefusal::AlreadyTaken,
        );
        check(
            r#"{"message":{"namespace":["is not valid"]}}"#,
            CreateRefusal::NamespaceNotValid,
        );
        check(
            r#"{"message":{"name":["can contain only letters"]}}"#,
            CreateRefusal::Other,
        );
        check(
            r#"{"error":"name, path are missing"}"#,
            CreateRefusal::Other,
        );
        check("<html>", CreateRefusal::Other);
    }

    #[test]
    fn endpoints_keep_the_api_root_and_encode_project_paths() {
        let check = |api_url: &str, segments: &[&str], expected: &str| {
            let config = Config::new(api_url, 7, SecretString::from("t")).unwrap();
            let gitlab = GitLab::new(&config).unwrap();
            assert_eq!(gitlab.endpoint(segments).as_str(), expected);
        };
        check(
            "https://gitlab.com/api/v4",
            &["groups", "7"],
            "https://gitlab.com/api/v4/groups/7",
        );
        check(
            "https://git.example.com/gitlab/api/v4/",
            &["projects", "team/sub/alice"],
            "https://git.example.com/gitlab/api/v4/projects/team%2Fsub%2Falice",
        );
    }

    #[test]
    fn quoted_bodies_are_cut() {
        assert_eq!(quote("  short \n"), "short");
        assert_eq!(quote(&"é".repeat(400)).chars().count(), MAX_QUOTED_BODY + 3);
    }
}
