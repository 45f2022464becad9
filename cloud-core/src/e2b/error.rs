//! What E2B's answers mean, sorted by what the caller does about them, and [`E2bError`].
//!
//! The bodies come from e2b-dev/infra: the API answers `{"code": N, "message": "..."}`
//! (`packages/shared/pkg/apierrors/apierrors.go`); its rate limiter a 429 `Rate limit exceeded`
//! with `Retry-After` (`packages/api/internal/middleware/ratelimit/ratelimit.go`); the team's
//! concurrency limit a 429 "you have reached the maximum number of concurrent E2B sandboxes"
//! without one (`packages/api/internal/orchestrator/create_instance.go`). In front of envd the
//! client proxy answers a sandbox it cannot route to with a 502
//! `{"sandboxId": ..., "message": "The sandbox was not found", "code": 502}`, a sandbox whose
//! port is closed with the same plus `"port"`, the team's limit on auto-resume with a 429
//! (`packages/shared/pkg/proxy/template/*.go`); a browser gets HTML instead, and a load
//! balancer's own 502/504 is HTML or plain text. envd itself answers `{"code", "message"}`
//! (`packages/envd/internal/api/error.go`), a wrong `X-Access-Token` with 401.

use std::time::Duration;

use serde::Deserialize;

/// Longest part of a body quoted in an error.
const MAX_QUOTED_BODY: usize = 300;

/// What went wrong talking to E2B, sorted by what the caller does about it: fix the setup,
/// re-create the sandbox, ask again later, or read the message.
#[derive(Debug, thiserror::Error)]
pub enum E2bError {
    // A person must fix the setup; retrying cannot help.
    /// The control plane refused the API key (401 or 403).
    #[error(
        "E2B at {api_url} refused E2B_API_KEY ({status}): {message}; set a valid key from the E2B dashboard"
    )]
    Unauthorized {
        /// The API root asked.
        api_url: String,
        /// 401 or 403.
        status: u16,
        /// E2B's message.
        message: String,
    },
    /// A create named a template E2B does not have for this key (404).
    #[error(
        "E2B has no template {template} for this API key (404): {message}; build it (see ARCHITECTURE.md, \"template/\") or fix E2B_TEMPLATE"
    )]
    TemplateNotFound {
        /// `E2B_TEMPLATE`.
        template: String,
        /// E2B's message.
        message: String,
    },
    /// E2B refused the request as malformed or out of the team's limits (400).
    #[error("{what}: E2B refused the request (400): {message}")]
    BadRequest {
        /// What was asked.
        what: String,
        /// E2B's message.
        message: String,
    },
    /// The team runs as many sandboxes as its plan allows. Asking again at once cannot help,
    /// so it is not retried: a sandbox must be killed or the plan raised.
    #[error(
        "{what}: E2B's limit of concurrent sandboxes is reached (429): {message}; kill unused sandboxes or raise the team's limit"
    )]
    Quota {
        /// What was asked.
        what: String,
        /// E2B's message, with the limit.
        message: String,
    },
    /// The sandbox's envd is older than this client needs.
    #[error(
        "sandbox {sandbox} runs envd {version}, older than {minimum}, which this client needs; rebuild the template"
    )]
    EnvdTooOld {
        /// The sandbox id.
        sandbox: String,
        /// Its `envdVersion`.
        version: String,
        /// The oldest this client works with.
        minimum: &'static str,
    },
    /// `E2B_API_KEY` cannot be an HTTP header value.
    #[error("E2B_API_KEY contains characters that cannot be sent in an HTTP header")]
    InvalidApiKey,

    // The sandbox itself.
    /// The control plane does not know the sandbox: it was killed, or it was paused and its
    /// snapshot is gone. Nothing brings it back.
    #[error(
        "sandbox {sandbox} does not exist at E2B (404): it was killed, or its snapshot expired"
    )]
    NotFound {
        /// The sandbox id.
        sandbox: String,
    },
    /// The sandbox is changing state (409: being killed, paused or snapshotted).
    #[error("{what}: sandbox {sandbox} is changing state (409): {message}")]
    Conflict {
        /// What was asked.
        what: String,
        /// The sandbox id.
        sandbox: String,
        /// E2B's message.
        message: String,
    },
    /// E2B's proxy found no running sandbox to send the request to (502), or found it
    /// still being paused or resumed (409). It may be gone, paused or briefly unroutable:
    /// the control plane says which.
    #[error("sandbox {sandbox} is not running behind E2B's proxy ({status} \"{message}\")")]
    NotRunning {
        /// The sandbox id.
        sandbox: String,
        /// The proxy's status.
        status: u16,
        /// The proxy's message.
        message: String,
    },
    /// envd refused the access token (401).
    #[error("sandbox {sandbox}: envd refused the access token (401): {message}")]
    EnvdUnauthorized {
        /// The sandbox id.
        sandbox: String,
        /// envd's message.
        message: String,
    },

    // Transient: the same call may succeed later.
    /// Every attempt was rate-limited (429, not the quota).
    #[error("{what}: E2B rate-limited all {attempts} attempts (429 {message})")]
    RateLimited {
        /// What was asked.
        what: String,
        /// How many requests were sent.
        attempts: u32,
        /// E2B's message.
        message: String,
    },
    /// Every attempt got a 5xx (or the proxy's "port is not open").
    #[error("{what}: E2B answered {status} {attempts} times; giving up for now: {body}")]
    Unavailable {
        /// What was asked.
        what: String,
        /// The last status.
        status: u16,
        /// How many requests were sent.
        attempts: u32,
        /// The last body, cut to one line.
        body: String,
    },
    /// No attempt got an answer in time.
    #[error("{what}: no answer from E2B within {timeout:?} ({attempts} attempts)")]
    Timeout {
        /// What was asked.
        what: String,
        /// The limit of one request.
        timeout: Duration,
        /// How many requests were sent.
        attempts: u32,
    },
    /// No attempt reached E2B (refused, reset, DNS).
    #[error("{what}: cannot reach E2B ({attempts} attempts)")]
    Unreachable {
        /// What was asked.
        what: String,
        /// How many requests were tried.
        attempts: u32,
        /// The last transport error, its URL removed.
        #[source]
        source: reqwest::Error,
    },
    /// No byte (not even a keepalive) arrived for longer than the idle limit.
    #[error("sandbox {sandbox}: `{command}` sent nothing for {idle:?}, not even a keepalive")]
    StreamIdle {
        /// The sandbox id.
        sandbox: String,
        /// The command, shortened.
        command: String,
        /// The idle limit.
        idle: Duration,
    },
    /// The stream ended, or broke, before the command's end event.
    #[error(
        "sandbox {sandbox}: the stream of `{command}` broke before the command ended: {reason}"
    )]
    StreamBroken {
        /// The sandbox id.
        sandbox: String,
        /// The command, shortened.
        command: String,
        /// How it broke.
        reason: String,
    },

    // envd or E2B answered something else.
    /// A Connect error code from envd (`deadline_exceeded`, `invalid_argument`, ...).
    #[error("sandbox {sandbox}: envd answered {code}: {message}")]
    Rpc {
        /// The sandbox id.
        sandbox: String,
        /// connect-go's name of the code.
        code: String,
        /// envd's message.
        message: String,
    },
    /// A status this client does not expect from that call.
    #[error("{what}: E2B answered {status}: {body}")]
    Unexpected {
        /// What was asked.
        what: String,
        /// The status.
        status: u16,
        /// The body, cut to one line.
        body: String,
    },
    /// A success whose body is not what E2B's spec describes.
    #[error("{what}: E2B's answer is not what its API describes: {reason}")]
    BadResponse {
        /// What was asked.
        what: String,
        /// What did not parse.
        reason: String,
    },
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client")]
    Client(#[source] reqwest::Error),
}

impl E2bError {
    /// Whether the same call may succeed later without anyone changing anything.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            E2bError::RateLimited { .. }
                | E2bError::Unavailable { .. }
                | E2bError::Timeout { .. }
                | E2bError::Unreachable { .. }
                | E2bError::StreamIdle { .. }
                | E2bError::StreamBroken { .. }
                | E2bError::Conflict { .. }
        )
    }

    /// Whether a person must change the setup (key, template, plan) before anything works.
    pub fn is_setup(&self) -> bool {
        matches!(
            self,
            E2bError::Unauthorized { .. }
                | E2bError::TemplateNotFound { .. }
                | E2bError::BadRequest { .. }
                | E2bError::Quota { .. }
                | E2bError::EnvdTooOld { .. }
                | E2bError::InvalidApiKey
        )
    }
}

/// What one answer says, before the caller knows which call it answered: the pure part of
/// classifying E2B's errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// 401 or 403.
    Unauthorized(String),
    /// 400.
    BadRequest(String),
    /// 404.
    NotFound(String),
    /// 409.
    Conflict(String),
    /// A 429 for the team's concurrency limit: not retried.
    Quota(String),
    /// Any other 429: retried, after `Retry-After` when it is given.
    RateLimited {
        message: String,
        retry_after: Option<Duration>,
    },
    /// The proxy's JSON 502 for a sandbox it cannot route to, or its 409 for one still
    /// transitioning (`sandbox_still_transitioning.go` in infra's proxy templates).
    NotRunning { status: u16, message: String },
    /// 5xx, the proxy's "port is not open", HTML or text from a load balancer: retried.
    Unavailable { status: u16, body: String },
    /// Anything else.
    Other { status: u16, body: String },
}

impl Refusal {
    /// Whether to try again, and the wait the server asked for.
    pub(crate) fn retry(&self) -> Option<Option<Duration>> {
        match self {
            Refusal::RateLimited { retry_after, .. } => Some(*retry_after),
            Refusal::Unavailable { .. } => Some(None),
            _ => None,
        }
    }
}

/// `{"code": N, "message": "..."}`, with the proxy's `sandboxId` and `port` when present.
#[derive(Deserialize)]
struct ErrorBody {
    #[serde(default)]
    message: Option<String>,
    #[serde(default, rename = "sandboxId")]
    sandbox_id: Option<String>,
    #[serde(default)]
    port: Option<u64>,
}

/// Classifies a non-2xx answer from its status, `Retry-After` and body.
pub(crate) fn classify(status: u16, retry_after: Option<&str>, body: &str) -> Refusal {
    let json: Option<ErrorBody> = serde_json::from_str(body).ok();
    let message = json
        .as_ref()
        .and_then(|b| b.message.clone())
        .unwrap_or_else(|| quote(body));
    match status {
        400 => Refusal::BadRequest(message),
        401 | 403 => Refusal::Unauthorized(message),
        404 => Refusal::NotFound(message),
        409 if json.as_ref().is_some_and(|b| b.sandbox_id.is_some()) => {
            Refusal::NotRunning { status, message }
        }
        409 => Refusal::Conflict(message),
        429 if message.contains("maximum number of concurrent") => Refusal::Quota(message),
        // The proxy's "team sandbox limit" page for an auto-resume.
        429 if json.as_ref().is_some_and(|b| b.sandbox_id.is_some()) => Refusal::Quota(message),
        429 => Refusal::RateLimited {
            message,
            retry_after: retry_after.and_then(parse_retry_after),
        },
        502 if json
            .as_ref()
            .is_some_and(|b| b.sandbox_id.is_some() && b.port.is_none()) =>
        {
            Refusal::NotRunning { status, message }
        }
        // envd's "not enough disk space": waiting does not free any.
        507 => Refusal::Other {
            status,
            body: message,
        },
        500..=599 => Refusal::Unavailable {
            status,
            body: message,
        },
        _ => Refusal::Other {
            status,
            body: message,
        },
    }
}

/// `Retry-After` in delay-seconds form, which E2B's rate limiter sends; an HTTP date is not
/// understood and falls back to the backoff.
pub(crate) fn parse_retry_after(value: &str) -> Option<Duration> {
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

/// A body shortened for an error message, on one line.
pub(crate) fn quote(body: &str) -> String {
    let one_line: String = body.split_whitespace().collect::<Vec<_>>().join(" ");
    match one_line.char_indices().nth(MAX_QUOTED_BODY) {
        Some((cut, _)) => format!("{}...", &one_line[..cut]),
        None => one_line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(status: u16, retry_after: Option<&str>, body: &str, expected: Refusal) {
        assert_eq!(
            classify(status, retry_after, body),
            expected,
            "{status} {body}"
        );
    }

    #[test]
    fn every_answer_has_its_own_kind() {
        use Refusal::*;
        let s = |m: &str| m.to_owned();
        check(
            400,
            None,
            r#"{"code":400,"message":"Timeout cannot be greater than 24 hours"}"#,
            BadRequest(s("Timeout cannot be greater than 24 hours")),
        );
        check(
            401,
            None,
            r#"{"code":401,"message":"Invalid API key"}"#,
            Unauthorized(s("Invalid API key")),
        );
        check(403, None, "forbidden", Unauthorized(s("forbidden")));
        check(
            404,
            None,
            r#"{"code":404,"message":"Sandbox \"i1\" doesn't exist or you don't have access to it"}"#,
            NotFound(s(
                "Sandbox \"i1\" doesn't exist or you don't have access to it",
            )),
        );
        check(
            409,
            None,
            r#"{"code":409,"message":"Sandbox \"i1\" is being killed"}"#,
            Conflict(s("Sandbox \"i1\" is being killed")),
        );
        check(
            409,
            None,
            r#"{"sandboxId":"i1","message":"The sandbox is still transitioning. Try again in a moment.","code":409}"#,
            NotRunning {
                status: 409,
                message: s("The sandbox is still transitioning. Try again in a moment."),
            },
        );
        check(
            429,
            None,
            r#"{"code":429,"message":"you have reached the maximum number of concurrent E2B sandboxes (20). If you need more, please visit 'https://e2b.dev/docs/billing'"}"#,
            Quota(s(
                "you have reached the maximum number of concurrent E2B sandboxes (20). If you need more, please visit 'https://e2b.dev/docs/billing'",
            )),
        );
        check(
            429,
            None,
            r#"{"sandboxId":"i1","message":"Sandbox limit reached","code":429}"#,
            Quota(s("Sandbox limit reached")),
        );
        check(
            429,
            Some("7"),
            r#"{"code":429,"message":"Rate limit exceeded"}"#,
            RateLimited {
                message: s("Rate limit exceeded"),
                retry_after: Some(Duration::from_secs(7)),
            },
        );
        check(
            429,
            Some("Wed, 21 Oct 2026 07:28:00 GMT"),
            "slow down",
            RateLimited {
                message: s("slow down"),
                retry_after: None,
            },
        );
        check(
            502,
            None,
            r#"{"sandboxId":"i1","message":"The sandbox was not found","code":502}"#,
            NotRunning {
                status: 502,
                message: s("The sandbox was not found"),
            },
        );
        check(
            502,
            None,
            r#"{"sandboxId":"i1","message":"The sandbox is running but port is not open","port":49983,"code":502}"#,
            Unavailable {
                status: 502,
                body: s("The sandbox is running but port is not open"),
            },
        );
        check(
            502,
            None,
            "<html><body><h1>502 Bad Gateway</h1>\n</body></html>",
            Unavailable {
                status: 502,
                body: s("<html><body><h1>502 Bad Gateway</h1> </body></html>"),
            },
        );
        check(
            504,
            None,
            "upstream request timeout",
            Unavailable {
                status: 504,
                body: s("upstream request timeout"),
            },
        );
        check(
            500,
            None,
            r#"{"code":500,"message":"Error when getting snapshot"}"#,
            Unavailable {
                status: 500,
                body: s("Error when getting snapshot"),
            },
        );
        check(
            503,
            None,
            "",
            Unavailable {
                status: 503,
                body: s(""),
            },
        );
        check(
            507,
            None,
            r#"{"code":507,"message":"not enough disk space available"}"#,
            Other {
                status: 507,
                body: s("not enough disk space available"),
            },
        );
        check(
            418,
            None,
            "teapot",
            Other {
                status: 418,
                body: s("teapot"),
            },
        );
    }

    #[test]
    fn only_rate_limits_and_unavailability_are_retried() {
        assert_eq!(
            classify(429, Some("3"), "{}").retry(),
            Some(Some(Duration::from_secs(3)))
        );
        assert_eq!(classify(503, None, "x").retry(), Some(None));
        assert_eq!(classify(429, None, r#"{"message":"you have reached the maximum number of concurrent E2B sandboxes (1)"}"#).retry(), None);
        assert_eq!(
            classify(
                502,
                None,
                r#"{"sandboxId":"i1","message":"The sandbox was not found","code":502}"#
            )
            .retry(),
            None
        );
        assert_eq!(classify(404, None, "{}").retry(), None);
    }

    #[test]
    fn quoted_bodies_are_one_short_line() {
        assert_eq!(quote("a\n  b\tc"), "a b c");
        let long = "x".repeat(1000);
        assert_eq!(quote(&long).len(), MAX_QUOTED_BODY + 3);
        assert_eq!(quote(&"é".repeat(400)).chars().count(), MAX_QUOTED_BODY + 3);
    }

    #[test]
    fn errors_say_what_to_do_and_sort_by_it() {
        let quota = E2bError::Quota {
            what: "create a sandbox".into(),
            message: "max 20".into(),
        };
        assert!(quota.is_setup() && !quota.is_transient());
        assert!(
            quota.to_string().contains("kill unused sandboxes"),
            "{quota}"
        );
        let gone = E2bError::NotFound {
            sandbox: "i1".into(),
        };
        assert!(!gone.is_setup() && !gone.is_transient());
        let limited = E2bError::RateLimited {
            what: "get".into(),
            attempts: 4,
            message: "Rate limit exceeded".into(),
        };
        assert!(limited.is_transient());
        let not_running = E2bError::NotRunning {
            sandbox: "i1".into(),
            status: 502,
            message: "The sandbox was not found".into(),
        };
        assert!(
            !not_running.is_transient() && !not_running.is_setup(),
            "to be confirmed, not retried blindly"
        );
    }
}
