//! How a command's result reaches the operator: plain text or one JSON object on stdout, a
//! one-line diagnosis on stderr, and the exit code (0 success, 1 runtime failure, 2 usage or
//! configuration error).

use std::process::ExitCode;

use serde_json::{Value, json};

/// A command's result.
pub type Outcome = Result<Success, Failure>;

/// What a command prints on success: `text` for people, `json` (merged into `{"ok": true}`) for
/// scripts.
pub struct Success {
    pub text: String,
    pub json: Value,
}

/// Why a command failed, and which exit code says so; `report` is what it did before it
/// failed (a back-fill's lines), printed as a success's would be.
pub struct Failure {
    pub exit_code: u8,
    pub error: anyhow::Error,
    pub report: Option<Success>,
}

impl Failure {
    /// A setting or an argument must change: exit code 2.
    pub fn config(error: impl Into<anyhow::Error>) -> Failure {
        Failure {
            exit_code: 2,
            error: error.into(),
            report: None,
        }
    }

    /// The command ran and failed: exit code 1.
    pub fn runtime(error: impl Into<anyhow::Error>) -> Failure {
        Failure {
            exit_code: 1,
            error: error.into(),
            report: None,
        }
    }

    /// The command ran, part of it failed, and `report` says what each part did: exit code 1.
    pub fn partial(report: Success, error: impl Into<anyhow::Error>) -> Failure {
        Failure {
            report: Some(report),
            ..Failure::runtime(error)
        }
    }
}

pub fn report(outcome: Outcome, as_json: bool) -> ExitCode {
    match outcome {
        Ok(success) => {
            if as_json {
                let mut object = json!({ "ok": true });
                if let (Value::Object(out), Value::Object(fields)) = (&mut object, success.json) {
                    out.extend(fields);
                }
                println!("{object}");
            } else {
                println!("{}", success.text);
            }
            ExitCode::SUCCESS
        }
        Err(failure) => {
            let diagnosis = format!("{:#}", failure.error).replace(['\n', '\r'], " ");
            if let (Some(report), false) = (&failure.report, as_json) {
                println!("{}", report.text);
            }
            eprintln!("shmastra-cloud: error: {diagnosis}");
            if as_json {
                let mut object =
                    json!({ "ok": false, "error": diagnosis, "exit_code": failure.exit_code });
                if let (Value::Object(out), Some(Value::Object(fields))) =
                    (&mut object, failure.report.map(|r| r.json))
                {
                    out.extend(fields);
                }
                println!("{object}");
            }
            ExitCode::from(failure.exit_code)
        }
    }
}
