//! E2B's control plane (`spec/openapi.yml` in e2b-dev/E2B): create a sandbox from a template,
//! connect (which resumes a paused one), get, list by metadata, set the timeout, pause, kill.
//! `X-API-Key` on every request; 429s and 5xx are retried within the [`RetryPolicy`]
//! (`Retry-After` honoured), the concurrency quota never.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderValue, RETRY_AFTER};
use reqwest::{Method, StatusCode, Url};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};

use super::error::{E2bError, Refusal, classify, quote};
use crate::gitlab::RetryPolicy;

/// The header the API key travels in (`components.securitySchemes.ApiKeyAuth`).
const API_KEY_HEADER: &str = "X-API-Key";
/// The page size of `GET /v2/sandboxes` (`paginationLimit`: at most 100).
const LIST_PAGE: &str = "100";

/// What a new sandbox is created with (`NewSandbox`).
#[derive(Debug, Clone)]
pub struct NewSandbox {
    /// The template id or alias (`E2B_TEMPLATE`).
    pub template: String,
    /// How long the sandbox lives without being extended.
    pub timeout: Duration,
    /// Pause instead of kill when the timeout passes (`autoPause`).
    pub auto_pause: bool,
    /// Resume a paused sandbox when traffic reaches it (`autoResume.enabled`; needs
    /// `auto_pause`).
    pub auto_resume: bool,
    /// Searchable with [`ControlPlane::list`]. [`ControlPlane::create`] finds a sandbox it
    /// created by these when an answer was lost, so they must name this one create.
    pub metadata: BTreeMap<String, String>,
    /// The environment of every process in the sandbox (`envVars`).
    pub env_vars: BTreeMap<String, String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct NewSandboxBody<'a> {
    #[serde(rename = "templateID")]
    template_id: &'a str,
    timeout: u64,
    auto_pause: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    auto_resume: Option<AutoResume>,
    /// The SDK's default: envd then requires the `envdAccessToken` this returns.
    secure: bool,
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: bool,
    metadata: &'a BTreeMap<String, String>,
    env_vars: &'a BTreeMap<String, String>,
}

#[derive(Serialize)]
struct AutoResume {
    enabled: bool,
}

#[derive(Serialize)]
struct TimeoutBody {
    timeout: u64,
}

/// How to reach one sandbox's envd (`Sandbox` in the spec: the answer to create and connect).
#[derive(Clone)]
pub struct SandboxAccess {
    /// The sandbox id.
    pub sandbox_id: String,
    /// `envdVersion`.
    pub envd_version: String,
    /// Sent as `X-Access-Token` to envd; `None` for a sandbox created without `secure`.
    pub envd_access_token: Option<SecretString>,
    /// The domain its traffic goes through, when it is not the configured one.
    pub domain: Option<String>,
}

impl std::fmt::Debug for SandboxAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxAccess")
            .field("sandbox_id", &self.sandbox_id)
            .field("envd_version", &self.envd_version)
            .field(
                "envd_access_token",
                &self.envd_access_token.as_ref().map(|_| "***"),
            )
            .field("domain", &self.domain)
            .finish()
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SandboxBody {
    #[serde(rename = "sandboxID")]
    sandbox_id: String,
    #[serde(default)]
    envd_version: String,
    #[serde(default)]
    envd_access_token: Option<String>,
    #[serde(default)]
    domain: Option<String>,
}

impl From<SandboxBody> for SandboxAccess {
    fn from(body: SandboxBody) -> Self {
        SandboxAccess {
            sandbox_id: body.sandbox_id,
            envd_version: body.envd_version,
            envd_access_token: body.envd_access_token.map(SecretString::from),
            domain: body.domain.filter(|d| !d.is_empty()),
        }
    }
}

/// `SandboxState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxState {
    /// Running (or being paused: E2B reports a pausing sandbox as paused).
    Running,
    /// Paused: memory and files kept, nothing running.
    Paused,
}

/// A sandbox as `GET /sandboxes/{id}` and `GET /v2/sandboxes` describe it (the fields read).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxInfo {
    /// The sandbox id.
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    /// The template it was made from.
    #[serde(rename = "templateID", default)]
    pub template_id: String,
    /// Running or paused.
    pub state: SandboxState,
    /// The metadata it was created with.
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
    /// RFC 3339: when the sandbox pauses or is killed unless extended.
    #[serde(default)]
    pub end_at: String,
    /// RFC 3339: when it was created.
    #[serde(default)]
    pub started_at: String,
}

/// How `connect` found the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Connected {
    /// 200: it was running.
    Running,
    /// 201: it was paused and is running again.
    Resumed,
}

/// One answer that was not retried away.
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

/// Whether a request may be sent again after a failure that leaves its effect unknown.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Repeat {
    Safe,
    /// `POST /sandboxes`: a lost answer may hide a created sandbox.
    Unsafe,
}

/// The control-plane client. Cheap to clone.
#[derive(Clone)]
pub struct ControlPlane {
    http: reqwest::Client,
    api_url: Url,
    api_key: HeaderValue,
    retry: RetryPolicy,
    timeout: Duration,
}

impl ControlPlane {
    /// A client of the API at `api_url`, each request limited to `request_timeout`.
    pub fn new(
        api_url: Url,
        api_key: &SecretString,
        request_timeout: Duration,
        retry: RetryPolicy,
    ) -> Result<ControlPlane, E2bError> {
        let mut api_key =
            HeaderValue::from_str(api_key.expose_secret()).map_err(|_| E2bError::InvalidApiKey)?;
        api_key.set_sensitive(true);
        let http = reqwest::Client::builder()
            .user_agent(concat!("shmastra-cloud/", env!("CARGO_PKG_VERSION")))
            .timeout(request_timeout)
            .connect_timeout(request_timeout)
            // A redirect could carry the API key to another host.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(E2bError::Client)?;
        Ok(ControlPlane {
            http,
            api_url,
            api_key,
            retry,
            timeout: request_timeout,
        })
    }

    /// The API root.
    pub fn api_url(&self) -> &Url {
        &self.api_url
    }

    /// `POST /sandboxes`. When the answer is lost (a 5xx, a timeout, a dropped connection),
    /// the sandbox may exist all the same: it is looked for by `metadata` before another
    /// attempt, so one call never leaves two sandboxes.
    pub async fn create(&self, new: &NewSandbox) -> Result<SandboxAccess, E2bError> {
        let what = format!("create a sandbox from template {}", new.template);
        let body = serde_json::to_value(NewSandboxBody {
            template_id: &new.template,
            timeout: seconds(new.timeout),
            auto_pause: new.auto_pause,
            auto_resume: new.auto_resume.then_some(AutoResume { enabled: true }),
            secure: true,
            allow_internet_access: true,
            metadata: &new.metadata,
            env_vars: &new.env_vars,
        })
        .map_err(|e| bad(&what, e))?;
        let mut failed = 0;
        loop {
            let lost = match self
                .send(
                    &what,
                    Method::POST,
                    self.url(&["sandboxes"]),
                    Some(&body),
                    Repeat::Unsafe,
                )
                .await
            {
                Ok(answer) if answer.status == StatusCode::CREATED => {
                    let created: SandboxBody = parse(&what, &answer.body)?;
                    return Ok(created.into());
                }
                Ok(answer) => {
                    return Err(match self.refusal(&answer) {
                        Refusal::NotFound(message) => E2bError::TemplateNotFound {
                            template: new.template.clone(),
                            message,
                        },
                        refusal => self.error(&what, None, &answer, refusal),
                    });
                }
                Err(lost) => lost,
            };
            if new.metadata.is_empty() {
                return Err(lost);
            }
            failed += 1;
            tracing::warn!(error = %lost, "the answer to a sandbox create was lost; looking for the sandbox");
            let found = self.list(&new.metadata).await?;
            if let Some(sandbox) = found.into_iter().next() {
                let (_, access) = self.connect(&sandbox.sandbox_id, new.timeout).await?;
                return Ok(access);
            }
            match self.retry.delay(failed, None) {
                Some(wait) => tokio::time::sleep(wait).await,
                None => return Err(lost),
            }
        }
    }

    /// `POST /sandboxes/{id}/connect`: a running sandbox's access (its timeout extended to at
    /// least `timeout`, never shortened), or a paused one resumed. 404: the sandbox and its
    /// snapshot are gone; 409: it is being killed.
    pub async fn connect(
        &self,
        sandbox: &str,
        timeout: Duration,
    ) -> Result<(Connected, SandboxAccess), E2bError> {
        let what = format!("connect to sandbox {sandbox}");
        let body = serde_json::json!({ "timeout": seconds(timeout) });
        let url = self.url(&["sandboxes", sandbox, "connect"]);
        let answer = self
            .send(&what, Method::POST, url, Some(&body), Repeat::Safe)
            .await?;
        let connected = match answer.status {
            StatusCode::OK => Connected::Running,
            StatusCode::CREATED => Connected::Resumed,
            _ => return Err(self.sandbox_error(&what, sandbox, &answer)),
        };
        let access: SandboxBody = parse(&what, &answer.body)?;
        Ok((connected, access.into()))
    }

    /// `GET /sandboxes/{id}`; `None` when E2B does not know it (404).
    pub async fn get(&self, sandbox: &str) -> Result<Option<SandboxInfo>, E2bError> {
        let what = format!("get sandbox {sandbox}");
        let answer = self
            .send(
                &what,
                Method::GET,
                self.url(&["sandboxes", sandbox]),
                None,
                Repeat::Safe,
            )
            .await?;
        match answer.status {
            StatusCode::OK => parse(&what, &answer.body).map(Some),
            StatusCode::NOT_FOUND => Ok(None),
            _ => Err(self.sandbox_error(&what, sandbox, &answer)),
        }
    }

    /// Every sandbox, running or paused, whose metadata holds all of `metadata`, through all
    /// pages of `GET /v2/sandboxes` (`X-Next-Token`).
    pub async fn list(
        &self,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Vec<SandboxInfo>, E2bError> {
        let what = "list sandboxes".to_owned();
        // The SDK's encoding (`SandboxPaginator.nextItems`): `k=v&...` with each side encoded,
        // sent as one query parameter; the API unescapes the whole, then each side
        // (`parseFilters` in infra's `packages/api/internal/utils/sandboxes_list.go`).
        let filter = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(metadata)
            .finish();
        let mut all = Vec::new();
        let mut next: Option<String> = None;
        loop {
            let mut url = self.url(&["v2", "sandboxes"]);
            {
                let mut query = url.query_pairs_mut();
                if !filter.is_empty() {
                    query.append_pair("metadata", &filter);
                }
                query.append_pair("limit", LIST_PAGE);
                if let Some(token) = &next {
                    query.append_pair("nextToken", token);
                }
            }
            let answer = self
                .send(&what, Method::GET, url, None, Repeat::Safe)
                .await?;
            if answer.status != StatusCode::OK {
                let refusal = self.refusal(&answer);
                return Err(self.error(&what, None, &answer, refusal));
            }
            let page: Vec<SandboxInfo> = parse(&what, &answer.body)?;
            next = answer
                .headers
                .get("x-next-token")
                .and_then(|v| v.to_str().ok())
                .filter(|v| !v.is_empty())
                .map(str::to_owned);
            let empty = page.is_empty();
            all.extend(page);
            if next.is_none() || empty {
                return Ok(all);
            }
        }
    }

    /// `POST /sandboxes/{id}/timeout`: the sandbox now lives `timeout` from now (longer or
    /// shorter than before).
    pub async fn set_timeout(&self, sandbox: &str, timeout: Duration) -> Result<(), E2bError> {
        let what = format!("set the timeout of sandbox {sandbox}");
        let body = serde_json::to_value(TimeoutBody {
            timeout: seconds(timeout),
        })
        .map_err(|e| bad(&what, e))?;
        let url = self.url(&["sandboxes", sandbox, "timeout"]);
        let answer = self
            .send(&what, Method::POST, url, Some(&body), Repeat::Safe)
            .await?;
        match answer.status {
            StatusCode::NO_CONTENT | StatusCode::OK => Ok(()),
            _ => Err(self.sandbox_error(&what, sandbox, &answer)),
        }
    }

    /// `POST /sandboxes/{id}/pause` with a memory snapshot; `false` when it was paused
    /// already (409, as the SDK's `pause` reads it).
    pub async fn pause(&self, sandbox: &str) -> Result<bool, E2bError> {
        let what = format!("pause sandbox {sandbox}");
        let body = serde_json::json!({ "memory": true });
        let url = self.url(&["sandboxes", sandbox, "pause"]);
        let answer = self
            .send(&what, Method::POST, url, Some(&body), Repeat::Safe)
            .await?;
        match answer.status {
            StatusCode::NO_CONTENT | StatusCode::OK => Ok(true),
            StatusCode::CONFLICT => Ok(false),
            _ => Err(self.sandbox_error(&what, sandbox, &answer)),
        }
    }

    /// `DELETE /sandboxes/{id}`; `false` when it did not exist. Its snapshot goes with it.
    pub async fn kill(&self, sandbox: &str) -> Result<bool, E2bError> {
        let what = format!("kill sandbox {sandbox}");
        let answer = self
            .send(
                &what,
                Method::DELETE,
                self.url(&["sandboxes", sandbox]),
                None,
                Repeat::Safe,
            )
            .await?;
        match answer.status {
            StatusCode::NO_CONTENT | StatusCode::OK => Ok(true),
            StatusCode::NOT_FOUND => Ok(false),
            _ => Err(self.sandbox_error(&what, sandbox, &answer)),
        }
    }

    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.api_url.clone();
        url.path_segments_mut()
            .expect("the API URL is a base")
            .pop_if_empty()
            .extend(segments);
        url
    }

    fn refusal(&self, answer: &Answer) -> Refusal {
        let retry_after = answer
            .headers
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok());
        classify(answer.status.as_u16(), retry_after, &answer.body)
    }

    /// An answer about one sandbox that was not success: a 404 means the sandbox is gone.
    fn sandbox_error(&self, what: &str, sandbox: &str, answer: &Answer) -> E2bError {
        let refusal = self.refusal(answer);
        self.error(what, Some(sandbox), answer, refusal)
    }

    fn error(
        &self,
        what: &str,
        sandbox: Option<&str>,
        answer: &Answer,
        refusal: Refusal,
    ) -> E2bError {
        let what = what.to_owned();
        match (refusal, sandbox) {
            (Refusal::Unauthorized(message), _) => E2bError::Unauthorized {
                api_url: self.api_url.to_string(),
                status: answer.status.as_u16(),
                message,
            },
            (Refusal::BadRequest(message), _) => E2bError::BadRequest { what, message },
            (Refusal::NotFound(_), Some(sandbox)) => E2bError::NotFound {
                sandbox: sandbox.to_owned(),
            },
            (Refusal::Conflict(message), Some(sandbox)) => E2bError::Conflict {
                what,
                sandbox: sandbox.to_owned(),
                message,
            },
            (Refusal::Quota(message), _) => E2bError::Quota { what, message },
            _ => E2bError::Unexpected {
                what,
                status: answer.status.as_u16(),
                body: quote(&answer.body),
            },
        }
    }

    /// Sends one request, retrying rate limits, 5xx, timeouts and refused connections within
    /// the policy. An [`Repeat::Unsafe`] request is not sent again once it may have reached
    /// E2B: that failure is returned for the caller to resolve.
    async fn send(
        &self,
        what: &str,
        method: Method,
        url: Url,
        body: Option<&serde_json::Value>,
        repeat: Repeat,
    ) -> Result<Answer, E2bError> {
        let mut failed = 0;
        loop {
            let mut request = self
                .http
                .request(method.clone(), url.clone())
                .header(API_KEY_HEADER, self.api_key.clone());
            if let Some(body) = body {
                request = request.json(body);
            }
            failed += 1;
            let (failure, retry_after, maybe_applied) = match send_once(request).await {
                Ok(answer) if answer.status.is_success() => return Ok(answer),
                Ok(answer) => {
                    let refusal = self.refusal(&answer);
                    let Some(retry_after) = refusal.retry() else {
                        return Ok(answer);
                    };
                    let failure = match refusal {
                        Refusal::RateLimited { message, .. } => E2bError::RateLimited {
                            what: what.to_owned(),
                            attempts: failed,
                            message,
                        },
                        _ => E2bError::Unavailable {
                            what: what.to_owned(),
                            status: answer.status.as_u16(),
                            attempts: failed,
                            body: quote(&answer.body),
                        },
                    };
                    let applied = answer.status != StatusCode::TOO_MANY_REQUESTS;
                    (failure, retry_after, applied)
                }
                Err(e) if e.is_builder() => return Err(E2bError::Client(e)),
                Err(e) if e.is_timeout() => {
                    let failure = E2bError::Timeout {
                        what: what.to_owned(),
                        timeout: self.timeout,
                        attempts: failed,
                    };
                    (failure, None, true)
                }
                Err(e) => {
                    let applied = !e.is_connect();
                    let failure = E2bError::Unreachable {
                        what: what.to_owned(),
                        attempts: failed,
                        source: e.without_url(),
                    };
                    (failure, None, applied)
                }
            };
            if repeat == Repeat::Unsafe && maybe_applied {
                return Err(failure);
            }
            match self.retry.delay(failed, retry_after) {
                Some(wait) => {
                    tracing::warn!(error = %failure, retry_in = %shmastra_contract::duration::short_duration(wait), "E2B request failed; retrying");
                    tokio::time::sleep(wait).await;
                }
                None => return Err(failure),
            }
        }
    }
}

async fn send_once(request: reqwest::RequestBuilder) -> Result<Answer, reqwest::Error> {
    let response = request.send().await?;
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.text().await?;
    Ok(Answer {
        status,
        headers,
        body,
    })
}

/// Whole seconds, rounded up: E2B's timeouts are `int32` seconds.
fn seconds(timeout: Duration) -> u64 {
    timeout.as_secs() + u64::from(timeout.subsec_nanos() > 0)
}

fn parse<T: serde::de::DeserializeOwned>(what: &str, body: &str) -> Result<T, E2bError> {
    serde_json::from_str(body).map_err(|e| bad(what, e))
}

fn bad(what: &str, e: impl std::fmt::Display) -> E2bError {
    E2bError::BadResponse {
        what: what.to_owned(),
        reason: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_create_body_is_the_specs_new_sandbox() {
        let metadata = BTreeMap::from([("shmastraUser".to_owned(), "alice".to_owned())]);
        let env = BTreeMap::new();
        let body = serde_json::to_value(NewSandboxBody {
            template_id: "shmastra",
            timeout: seconds(Duration::from_millis(600_001)),
            auto_pause: true,
            auto_resume: Some(AutoResume { enabled: true }),
            secure: true,
            allow_internet_access: true,
            metadata: &metadata,
            env_vars: &env,
        })
        .unwrap();
        assert_eq!(
            body,
            serde_json::json!({
                "templateID": "shmastra",
                "timeout": 601,
                "autoPause": true,
                "autoResume": {"enabled": true},
                "secure": true,
                "allow_internet_access": true,
                "metadata": {"shmastraUser": "alice"},
                "envVars": {}
            })
        );
    }

    #[test]
    fn answers_parse_as_the_spec_describes_them() {
        let access: SandboxAccess = serde_json::from_str::<SandboxBody>(
            r#"{"templateID":"t","sandboxID":"i1","clientID":"c","envdVersion":"0.5.7","envdAccessToken":"tok","domain":null}"#,
        )
        .unwrap()
        .into();
        assert_eq!(access.sandbox_id, "i1");
        assert_eq!(
            access.envd_access_token.as_ref().unwrap().expose_secret(),
            "tok"
        );
        assert_eq!(access.domain, None);
        assert!(!format!("{access:?}").contains("tok\""), "{access:?}");
        let info: SandboxInfo = serde_json::from_str(
            r#"{"templateID":"t","sandboxID":"i1","clientID":"c","startedAt":"2026-01-01T00:00:00Z","endAt":"2026-01-01T00:10:00Z","cpuCount":2,"memoryMB":512,"diskSizeMB":1024,"state":"paused","envdVersion":"0.5.7","metadata":{"shmastraUser":"alice"}}"#,
        )
        .unwrap();
        assert_eq!(info.state, SandboxState::Paused);
        assert_eq!(info.metadata.unwrap()["shmastraUser"], "alice");
    }
}
