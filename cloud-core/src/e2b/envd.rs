//! The daemon inside every E2B sandbox (envd, port 49983), reached through E2B's proxy:
//! commands through `process.Process/Start` (and `Connect`, to follow a process again after
//! its stream broke), files through `GET`/`POST /files` (`spec/envd/envd.yaml`).
//!
//! Every request carries `E2b-Sandbox-Id` and `E2b-Sandbox-Port` (the proxy routes by them
//! when the host does not name the sandbox: `packages/shared/pkg/proxy/host.go` in
//! e2b-dev/infra), `X-Access-Token` (the sandbox's `envdAccessToken`) and the user: as
//! `Authorization: Basic base64("user:")` for processes (`authenticationHeader` in the JS
//! SDK's `envd/rpc.ts`), as the `username` query parameter for files. A command's stream has
//! no total limit on the wire: envd gets the command's own limit as `Connect-Timeout-Ms` (it
//! kills the process at that deadline, `packages/envd/internal/services/process/start.go`),
//! sends a keepalive every `Keepalive-Ping-Interval` seconds of silence
//! (`permissions/keepalive.go`), and this client gives up on a stream only when nothing at all
//! arrived for the idle limit.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue, RETRY_AFTER};
use reqwest::{StatusCode, Url};
use secrecy::{ExposeSecret, SecretString};
use tokio::time::Instant;

use super::error::{E2bError, Refusal, classify, quote};
use super::rpc::{self, Event, Frame};
use crate::gitlab::RetryPolicy;

/// envd's port (`ConnectionConfig.envdPort`).
pub const ENVD_PORT: u16 = 49983;
/// The oldest envd with `application/octet-stream` uploads (`ENVD_OCTET_STREAM_UPLOAD` in the
/// JS SDK's `envd/versions.ts`).
pub const MIN_ENVD_VERSION: &str = "0.5.7";
/// How long past the command's own limit envd's deadline is set: this client gives up first,
/// and envd ends what is left shortly after.
const ENVD_DEADLINE_GRACE: Duration = Duration::from_secs(5);

/// How long to wait, and for what, on envd's streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamTimeouts {
    /// Asked of envd as `Keepalive-Ping-Interval` (the SDK asks for 50 s).
    pub keepalive: Duration,
    /// A stream silent for this long is broken. Longer than `keepalive`.
    pub idle: Duration,
    /// The limit for one request that is not a stream (a file), and for a stream's first
    /// answer.
    pub request: Duration,
}

impl Default for StreamTimeouts {
    fn default() -> Self {
        StreamTimeouts {
            keepalive: Duration::from_secs(50),
            idle: Duration::from_secs(120),
            request: Duration::from_secs(60),
        }
    }
}

/// One command line for `bash -l -c`, as the SDK's `commands.run` runs it.
#[derive(Debug, Clone)]
pub struct Command<'a> {
    /// The command line.
    pub line: &'a str,
    /// Its environment, on top of the sandbox's.
    pub envs: BTreeMap<&'a str, &'a str>,
    /// Its working directory (else the user's home).
    pub cwd: Option<&'a str>,
    /// How long it may run.
    pub timeout: Duration,
}

/// What a command printed so far, and its pid once envd said it started.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Collected {
    /// From the start event.
    pub pid: Option<u32>,
    /// Its standard output so far.
    pub stdout: Vec<u8>,
    /// Its standard error so far.
    pub stderr: Vec<u8>,
}

/// Why a command's stream stopped before its end event.
#[derive(Debug)]
pub enum Interrupted {
    /// The command's own limit passed.
    Deadline,
    /// The stream ended or broke without the end event, or envd answered an error.
    Broken(E2bError),
}

/// The envd client of one sandbox.
#[derive(Clone)]
pub struct Envd {
    http: reqwest::Client,
    base: Url,
    sandbox: String,
    /// The sandbox user, as `/files` takes it (`username`).
    user: String,
    headers: HeaderMap,
    timeouts: StreamTimeouts,
    retry: RetryPolicy,
}

impl Envd {
    /// A client for `sandbox`'s envd behind `base` (see [`super::envd_url`]), as the sandbox
    /// user `user`.
    pub fn new(
        base: Url,
        sandbox: &str,
        token: Option<&SecretString>,
        user: &str,
        timeouts: StreamTimeouts,
        retry: RetryPolicy,
    ) -> Result<Envd, E2bError> {
        let header = |value: &str| {
            HeaderValue::from_str(value).map_err(|_| E2bError::BadResponse {
                what: format!("reach sandbox {sandbox}"),
                reason: format!("{value:?} cannot be sent in an HTTP header"),
            })
        };
        let mut headers = HeaderMap::new();
        headers.insert("E2b-Sandbox-Id", header(sandbox)?);
        headers.insert("E2b-Sandbox-Port", HeaderValue::from(ENVD_PORT));
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("{user}:"));
        headers.insert(AUTHORIZATION, header(&format!("Basic {basic}"))?);
        if let Some(token) = token {
            let mut value = header(token.expose_secret())?;
            value.set_sensitive(true);
            headers.insert("X-Access-Token", value);
        }
        let http = reqwest::Client::builder()
            .user_agent(concat!("shmastra-cloud/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(timeouts.request)
            // The SDK follows envd's redirects; the access token must not, to another host.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(E2bError::Client)?;
        Ok(Envd {
            http,
            base,
            sandbox: sandbox.to_owned(),
            user: user.to_owned(),
            headers,
            timeouts,
            retry,
        })
    }

    /// The sandbox id.
    pub fn sandbox(&self) -> &str {
        &self.sandbox
    }

    /// Starts `command`. Answers before the process started (a 429, a 5xx from the proxy)
    /// are retried within the policy: envd sends its first bytes, the start event, only once
    /// the process runs, so an answer without them means nothing ran. No answer (none within
    /// the request limit, or a connection lost after sending) is not retried: the command may
    /// be running.
    pub async fn start(&self, command: &Command<'_>) -> Result<Stream, E2bError> {
        let request = rpc::StartRequest {
            process: rpc::ProcessConfig {
                cmd: "/bin/bash",
                args: vec!["-l", "-c", command.line],
                envs: command.envs.clone(),
                cwd: command.cwd,
            },
            stdin: false,
        };
        let body = serde_json::to_vec(&request).map_err(|e| self.bad("start", e))?;
        let deadline = command.timeout + ENVD_DEADLINE_GRACE;
        self.stream(
            "process.Process/Start",
            body,
            Some(deadline),
            command.line,
            Repeat::UntilSent,
        )
        .await
    }

    /// Follows the running (or just finished) process `pid` again: its output from now on
    /// and its end (envd keeps a finished process's end event for this).
    pub async fn reconnect(&self, pid: u32, line: &str) -> Result<Stream, E2bError> {
        let request = rpc::ConnectRequest {
            process: rpc::PidSelector { pid },
        };
        let body = serde_json::to_vec(&request).map_err(|e| self.bad("connect", e))?;
        self.stream("process.Process/Connect", body, None, line, Repeat::Safe)
            .await
    }

    async fn stream(
        &self,
        method: &str,
        body: Vec<u8>,
        deadline: Option<Duration>,
        line: &str,
        repeat: Repeat,
    ) -> Result<Stream, E2bError> {
        let url = self.url(method);
        let framed = rpc::envelope(&body);
        let what = format!("run `{}` in sandbox {}", short(line), self.sandbox);
        let response = self
            .send(&what, repeat, || {
                let mut request = self
                    .http
                    .post(url.clone())
                    .headers(self.headers.clone())
                    .header(CONTENT_TYPE, rpc::STREAM_CONTENT_TYPE)
                    .header("Connect-Protocol-Version", "1")
                    .header(
                        "Keepalive-Ping-Interval",
                        self.timeouts.keepalive.as_secs().max(1),
                    )
                    .body(framed.clone());
                if let Some(deadline) = deadline {
                    request = request.header("Connect-Timeout-Ms", deadline.as_millis() as u64);
                }
                request
            })
            .await?;
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if !content_type.starts_with("application/connect+") {
            return Err(self.bad(
                &what,
                format!("content type {content_type:?} is not a Connect stream"),
            ));
        }
        Ok(Stream {
            response,
            decoder: rpc::Decoder::default(),
            sandbox: self.sandbox.clone(),
            command: short(line),
            idle: self.timeouts.idle,
        })
    }

    /// A file's bytes, `None` when it does not exist.
    pub async fn read(&self, path: &str) -> Result<Option<Vec<u8>>, E2bError> {
        let what = format!("read {path} in sandbox {}", self.sandbox);
        let url = self.files_url(path);
        let response = self
            .send_allowing(&what, &[StatusCode::NOT_FOUND], Repeat::Safe, || {
                self.http
                    .get(url.clone())
                    .headers(self.headers.clone())
                    .timeout(self.timeouts.request)
            })
            .await?;
        if response.status() == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let bytes = response.bytes().await.map_err(|e| self.lost(&what, e))?;
        Ok(Some(bytes.to_vec()))
    }

    /// Replaces a file (envd creates its folders), as raw bytes.
    pub async fn write(&self, path: &str, contents: &[u8]) -> Result<(), E2bError> {
        let what = format!("write {path} in sandbox {}", self.sandbox);
        let url = self.files_url(path);
        let body = contents.to_vec();
        self.send(&what, Repeat::Safe, || {
            self.http
                .post(url.clone())
                .headers(self.headers.clone())
                .header(CONTENT_TYPE, "application/octet-stream")
                .timeout(self.timeouts.request)
                .body(body.clone())
        })
        .await?;
        Ok(())
    }

    fn url(&self, path: &str) -> Url {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .expect("the envd URL is a base")
            .pop_if_empty()
            .extend(path.split('/'));
        url
    }

    /// `/files?path=...&username=...`: the user files are read and written as (envd takes
    /// it from the query here, not from `Authorization`; `Filesystem.read` in the JS SDK).
    fn files_url(&self, path: &str) -> Url {
        let mut url = self.url("files");
        url.query_pairs_mut()
            .append_pair("path", path)
            .append_pair("username", &self.user);
        url
    }

    async fn send(
        &self,
        what: &str,
        repeat: Repeat,
        request: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, E2bError> {
        self.send_allowing(what, &[], repeat, request).await
    }

    /// Sends a request until it succeeds (or answers one of `allowed`), retrying rate limits,
    /// 5xx that are not "sandbox not found" and refused connections within the policy; and,
    /// for a [`Repeat::Safe`] request, answers that never came. No answer at all within the
    /// request limit (a stream's first bytes included) is a [`E2bError::Timeout`].
    async fn send_allowing(
        &self,
        what: &str,
        allowed: &[StatusCode],
        repeat: Repeat,
        request: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, E2bError> {
        let mut failed = 0;
        loop {
            failed += 1;
            let timed_out = || E2bError::Timeout {
                what: what.to_owned(),
                timeout: self.timeouts.request,
                attempts: failed,
            };
            let sent = match tokio::time::timeout(self.timeouts.request, request().send()).await {
                Ok(sent) => sent,
                Err(_) if repeat == Repeat::UntilSent => return Err(timed_out()),
                Err(_) => {
                    if !self.pause_before_retry(failed, None, &timed_out()).await {
                        return Err(timed_out());
                    }
                    continue;
                }
            };
            let (failure, retry_after) = match sent {
                Ok(response) if response.status().is_success() => return Ok(response),
                Ok(response) if allowed.contains(&response.status()) => return Ok(response),
                Ok(response) => {
                    let status = response.status();
                    let retry_after = response
                        .headers()
                        .get(RETRY_AFTER)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned);
                    let body = response.text().await.unwrap_or_default();
                    let refusal = classify(status.as_u16(), retry_after.as_deref(), &body);
                    let Some(wait) = refusal.retry() else {
                        return Err(self.refused(what, status, &body, refusal));
                    };
                    (
                        self.refused(what, status, &body, refusal)
                            .with_attempts(failed),
                        wait,
                    )
                }
                Err(e) if e.is_builder() => return Err(E2bError::Client(e)),
                Err(e) if e.is_timeout() => {
                    if repeat == Repeat::UntilSent {
                        return Err(timed_out());
                    }
                    (timed_out(), None)
                }
                Err(e) => {
                    // Sent, perhaps: the command may be running.
                    let maybe_sent = !e.is_connect();
                    let failure = E2bError::Unreachable {
                        what: what.to_owned(),
                        attempts: failed,
                        source: e.without_url(),
                    };
                    if repeat == Repeat::UntilSent && maybe_sent {
                        return Err(failure);
                    }
                    (failure, None)
                }
            };
            if !self.pause_before_retry(failed, retry_after, &failure).await {
                return Err(failure);
            }
        }
    }

    /// Waits before attempt `failed + 1`; `false` when the policy allows no more attempts.
    async fn pause_before_retry(
        &self,
        failed: u32,
        retry_after: Option<Duration>,
        failure: &E2bError,
    ) -> bool {
        let Some(wait) = self.retry.delay(failed, retry_after) else {
            return false;
        };
        tracing::warn!(error = %failure, retry_in = %shmastra_contract::duration::short_duration(wait), "envd request failed; retrying");
        tokio::time::sleep(wait).await;
        true
    }

    fn refused(&self, what: &str, status: StatusCode, body: &str, refusal: Refusal) -> E2bError {
        let sandbox = self.sandbox.clone();
        let what = what.to_owned();
        match refusal {
            Refusal::NotRunning { status, message } => E2bError::NotRunning {
                sandbox,
                status,
                message,
            },
            Refusal::Unauthorized(message) => E2bError::EnvdUnauthorized { sandbox, message },
            Refusal::Quota(message) => E2bError::Quota { what, message },
            Refusal::RateLimited { message, .. } => E2bError::RateLimited {
                what,
                attempts: 1,
                message,
            },
            Refusal::Unavailable { status, body } => E2bError::Unavailable {
                what,
                status,
                attempts: 1,
                body,
            },
            Refusal::BadRequest(message) => E2bError::BadRequest { what, message },
            Refusal::Conflict(message) => E2bError::Conflict {
                what,
                sandbox,
                message,
            },
            Refusal::NotFound(_) | Refusal::Other { .. } => E2bError::Unexpected {
                what,
                status: status.as_u16(),
                body: quote(body),
            },
        }
    }

    fn bad(&self, what: &str, reason: impl std::fmt::Display) -> E2bError {
        E2bError::BadResponse {
            what: what.to_owned(),
            reason: reason.to_string(),
        }
    }

    fn lost(&self, what: &str, e: reqwest::Error) -> E2bError {
        E2bError::StreamBroken {
            sandbox: self.sandbox.clone(),
            command: what.to_owned(),
            reason: e.without_url().to_string(),
        }
    }
}

impl E2bError {
    fn with_attempts(self, n: u32) -> E2bError {
        match self {
            E2bError::RateLimited { what, message, .. } => E2bError::RateLimited {
                what,
                attempts: n,
                message,
            },
            E2bError::Unavailable {
                what, status, body, ..
            } => E2bError::Unavailable {
                what,
                status,
                attempts: n,
                body,
            },
            other => other,
        }
    }
}

/// Whether a request may be sent again after a failure that leaves its effect unknown.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Repeat {
    /// Reads, a follow, a file replaced whole: the same again is harmless.
    Safe,
    /// A command's start: sent again only when it surely never arrived (a refused connection,
    /// an answer that it did not run).
    UntilSent,
}

/// One process's event stream.
pub struct Stream {
    response: reqwest::Response,
    decoder: rpc::Decoder,
    sandbox: String,
    command: String,
    idle: Duration,
}

impl Stream {
    /// Reads events into `collected` until the process ends (its end event), the stream
    /// breaks, or `deadline` passes.
    pub async fn wait(
        &mut self,
        collected: &mut Collected,
        deadline: Instant,
    ) -> Result<rpc::End, Interrupted> {
        loop {
            while let Some(frame) = self.decoder.next_frame().map_err(|e| self.broken(e))? {
                match frame {
                    Frame::Message(json) => {
                        match rpc::parse_event(&json).map_err(|e| self.broken(e))? {
                            Event::Start { pid } => collected.pid = Some(pid),
                            Event::Stdout(bytes) => collected.stdout.extend(bytes),
                            Event::Stderr(bytes) => collected.stderr.extend(bytes),
                            Event::End(end) => return Ok(end),
                            Event::Keepalive | Event::Other => {}
                        }
                    }
                    Frame::End(end) => {
                        return Err(match end.error {
                            Some(error) => Interrupted::Broken(E2bError::Rpc {
                                sandbox: self.sandbox.clone(),
                                code: error.code,
                                message: error.message,
                            }),
                            None => self.broken("the stream ended without the command's end"),
                        });
                    }
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Interrupted::Deadline);
            }
            let wait = self.idle.min(deadline - now);
            match tokio::time::timeout(wait, self.response.chunk()).await {
                Ok(Ok(Some(chunk))) => self.decoder.push(&chunk),
                Ok(Ok(None)) => {
                    return Err(self.broken(if self.decoder.pending() > 0 {
                        "the stream ended inside a message"
                    } else {
                        "the stream ended without the command's end"
                    }));
                }
                Ok(Err(e)) => return Err(self.broken(e.without_url())),
                Err(_) if Instant::now() >= deadline => return Err(Interrupted::Deadline),
                Err(_) => {
                    return Err(Interrupted::Broken(E2bError::StreamIdle {
                        sandbox: self.sandbox.clone(),
                        command: self.command.clone(),
                        idle: self.idle,
                    }));
                }
            }
        }
    }

    fn broken(&self, reason: impl std::fmt::Display) -> Interrupted {
        Interrupted::Broken(E2bError::StreamBroken {
            sandbox: self.sandbox.clone(),
            command: self.command.clone(),
            reason: reason.to_string(),
        })
    }
}

/// A command line as errors name it: its first line, at most 80 characters.
fn short(line: &str) -> String {
    let first = line.lines().next().unwrap_or_default();
    match first.char_indices().nth(80) {
        Some((cut, _)) => format!("{}...", &first[..cut]),
        None if line.lines().nth(1).is_some() => format!("{first} ..."),
        None => first.to_owned(),
    }
}

/// Whether `version` (envd's `x.y.z`) is at least `minimum`; an unreadable one is not.
pub fn version_at_least(version: &str, minimum: &str) -> bool {
    let parse = |v: &str| -> Option<Vec<u64>> {
        v.trim_start_matches('v')
            .split(['.', '-', '+'])
            .take(3)
            .map(|p| p.parse().ok())
            .collect()
    };
    match (parse(version), parse(minimum)) {
        (Some(v), Some(m)) => v >= m,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_numerically() {
        assert!(version_at_least("0.5.7", MIN_ENVD_VERSION));
        assert!(version_at_least("0.10.0", MIN_ENVD_VERSION));
        assert!(version_at_least("1.0.0", MIN_ENVD_VERSION));
        assert!(!version_at_least("0.5.6", MIN_ENVD_VERSION));
        assert!(!version_at_least("0.4.99", MIN_ENVD_VERSION));
        assert!(!version_at_least("", MIN_ENVD_VERSION));
        assert!(!version_at_least("dev", MIN_ENVD_VERSION));
    }

    #[test]
    fn commands_are_named_by_their_first_line() {
        assert_eq!(short("pm2 stop shmastra"), "pm2 stop shmastra");
        assert_eq!(short("set -e\ngit fetch"), "set -e ...");
        assert_eq!(short(&"x".repeat(100)), format!("{}...", "x".repeat(80)));
    }
}
