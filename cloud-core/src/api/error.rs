//! How the control API refuses: every error is `{"error": {"code", "message"}}` with the
//! status that says what to do (4xx: change the request; 409: not now; 5xx: try again later),
//! plus the problems of a form, field by field.

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde::Serialize;
use utoipa::ToSchema;

use crate::secrets::FormProblem;

/// An error answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// What went wrong, for a program (`code`) and for a person (`message`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// A stable word for programs: `unauthorized`, `invalid_user`, `invalid_request`,
    /// `invalid_form`, `not_found`, `no_sandboxes`, `no_sandbox`,
    /// `idempotency_key_reused`, `too_many_operations`, `token_state_off`, `persistence_off`,
    /// `invalid_manifest`, `needs_attention`, `sandbox_gone`, `refused`, `failed`, `unavailable`,
    /// `internal`.
    pub code: String,
    /// A sentence for a person.
    pub message: String,
    /// With `invalid_form`: every problem, each naming its field. Values never appear.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<FieldProblem>,
}

/// One problem of a submitted form.
#[derive(Debug, Clone, Serialize, ToSchema, PartialEq, Eq)]
pub struct FieldProblem {
    /// The field, as the request names it: `secrets.OPENAI_API_KEY`, `at`, `paths[2]`; `secrets`
    /// for a problem of the whole set.
    pub field: String,
    /// `missing`, `unexpected`, `duplicate`, `contains_nul`, `no_exact_form`, `too_large`,
    /// `total_too_large`, `invalid`.
    pub problem: String,
    /// A sentence for a person.
    pub message: String,
}

impl FieldProblem {
    /// The problem of a restore form field, named `secrets.<NAME>`.
    pub fn of_secret(problem: &FormProblem) -> FieldProblem {
        let (field, word) = match problem {
            FormProblem::Missing { name } => (format!("secrets.{name}"), "missing"),
            FormProblem::Unexpected { name } => (format!("secrets.{name}"), "unexpected"),
            FormProblem::Duplicate { name } => (format!("secrets.{name}"), "duplicate"),
            FormProblem::ContainsNul { name } => (format!("secrets.{name}"), "contains_nul"),
            FormProblem::NoExactForm { name } => (format!("secrets.{name}"), "no_exact_form"),
            FormProblem::TooLarge { name, .. } => (format!("secrets.{name}"), "too_large"),
            FormProblem::TotalTooLarge { .. } => ("secrets".to_owned(), "total_too_large"),
        };
        FieldProblem {
            field,
            problem: word.to_owned(),
            message: problem.to_string(),
        }
    }

    /// A field whose value is not acceptable.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> FieldProblem {
        FieldProblem {
            field: field.into(),
            problem: "invalid".to_owned(),
            message: message.into(),
        }
    }
}

/// An error answer on its way out.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    problems: Vec<FieldProblem>,
}

impl ApiError {
    /// An answer with `status`, `code` and `message`.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            problems: Vec::new(),
        }
    }

    /// 422 `invalid_form` with every problem.
    pub fn form(problems: Vec<FieldProblem>) -> ApiError {
        ApiError {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            code: "invalid_form",
            message: format!(
                "the request has {} problem(s): {}",
                problems.len(),
                problems
                    .iter()
                    .map(|p| p.message.as_str())
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
            problems,
        }
    }

    /// 404 `not_found`.
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// 503 `unavailable`: try again later.
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
    }

    /// The status it answers with.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The body it answers with.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                code: self.code.to_owned(),
                message: self.message.clone(),
                problems: self.problems.clone(),
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                http::header::WWW_AUTHENTICATE,
                http::HeaderValue::from_static("Bearer realm=\"shmastra\""),
            );
        }
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(
                http::header::RETRY_AFTER,
                http::HeaderValue::from_static("5"),
            );
        }
        response
    }
}

/// A body that is not the JSON the route takes: 400 (415 without the JSON content type), in
/// the API's own shape rather than axum's plain text.
impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> ApiError {
        let status = match rejection {
            JsonRejection::MissingJsonContentType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            JsonRejection::BytesRejection(_) => StatusCode::PAYLOAD_TOO_LARGE,
            _ => StatusCode::BAD_REQUEST,
        };
        ApiError::new(status, "invalid_request", rejection.body_text())
    }
}
