//! `sandboxes provision --user U`, `sandboxes backfill` and `sandboxes status`: the operator's
//! commands over the users' E2B sandboxes (cloud-core's `Fleet`).

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::anyhow;
use cloud_core::e2b::{E2bLifecycle, E2bProvider, E2bSettings};
use cloud_core::fleet::{Fleet, SandboxReport};
use cloud_core::store::Store;
use cloud_core::store::memory::MemoryStore;
use cloud_core::store::postgres::{PostgresStore, pool};
use cloud_core::{
    BackfillEntry, BackfillOutcome, Config, EmbeddedUpstream, GitLab, Orchestrator, Persistence,
    ProjectHost, Provisioned, SandboxLayout, TokenSigner, UserId,
};
use serde_json::{Value, json};

use crate::outcome::{Failure, Outcome, Success};

/// What every `sandboxes` command needs besides E2B's settings (`E2B_API_KEY`, ...).
#[derive(clap::Args)]
pub struct FleetArgs {
    /// Where the sandboxes' watchers push (serve's public URL; they push to <URL>/api/git).
    #[arg(long, env = crate::login_link::PUBLIC_URL_ENV, value_name = "URL")]
    pub public_url: Option<String>,
    /// The embedded upstream serve uses (DIR/<user>.git) instead of GitLab.
    #[arg(long, value_name = "DIR")]
    pub upstream_dir: Option<PathBuf>,
    /// The store serve uses, where each user's sandbox id is recorded.
    #[arg(long, env = "DATABASE_URL", value_name = "URL", hide_env_values = true)]
    pub database_url: Option<String>,
}

/// The commands.
#[derive(clap::Subcommand)]
pub enum SandboxesCommand {
    /// Provision one user's sandbox (resumed when paused): the repository, PROJECT_TOKEN in the
    /// watcher's environment, the `project` remote, the watcher started. Creates nothing.
    Provision {
        /// The user's id, as the cloud names them (up to 64 letters, digits, `.`, `-`, `_`).
        #[arg(long)]
        user: String,
        /// The metadata key naming a sandbox's user (for sandboxes made before this cloud).
        #[arg(long, default_value = "shmastraUser")]
        user_key: String,
    },
    /// Provision every existing sandbox (idempotent; paused ones are resumed for it); a line
    /// per sandbox, a progress line per sandbox on a terminal.
    Backfill {
        /// The metadata key naming a sandbox's user (for sandboxes made before this cloud).
        #[arg(long, default_value = "shmastraUser")]
        user_key: String,
    },
    /// Every sandbox's state, its watcher's last push age and unpushed commits (paused ones
    /// are not resumed to look).
    Status {
        /// The metadata key naming a sandbox's user.
        #[arg(long, default_value = "shmastraUser")]
        user_key: String,
    },
}

/// Runs `command`.
pub async fn run(args: FleetArgs, command: SandboxesCommand) -> Outcome {
    let settings = E2bSettings::from_env(|name| std::env::var(name).ok())
        .map_err(Failure::config)?
        .ok_or_else(|| Failure::config(anyhow!("E2B is off: E2B_API_KEY is not set")))?;
    let signer = TokenSigner::from_env().map_err(Failure::config)?;
    let public_url = args.public_url.ok_or_else(|| {
        Failure::config(anyhow!(
            "the sandboxes push to serve: set SHMASTRA_PUBLIC_URL (or --public-url)"
        ))
    })?;
    let store: std::sync::Arc<dyn Store> = match args.database_url.filter(|u| !u.is_empty()) {
        Some(url) => PostgresStore::connect(pool(&url).map_err(Failure::config)?)
            .await
            .map_err(Failure::runtime)?,
        None => std::sync::Arc::new(MemoryStore::new()),
    };
    let provider =
        E2bProvider::new(settings, store, E2bLifecycle::default()).map_err(Failure::config)?;
    let git_url = format!("{}/api/git", public_url.trim_end_matches('/'));
    match (
        args.upstream_dir,
        Config::from_env().map_err(Failure::config)?,
    ) {
        (Some(dir), _) => {
            let host = EmbeddedUpstream::new(&dir).map_err(Failure::config)?;
            with_host(host, signer, git_url, provider, command).await
        }
        (None, Some(config)) => {
            let host = GitLab::new(&config).map_err(Failure::config)?;
            with_host(host, signer, git_url, provider, command).await
        }
        (None, None) => Err(Failure::config(anyhow!(
            "no upstream: set GITLAB_SERVICE_TOKEN and GITLAB_GROUP_ID, or pass --upstream-dir DIR"
        ))),
    }
}

async fn with_host<H: ProjectHost>(
    host: H,
    signer: TokenSigner,
    git_url: String,
    provider: E2bProvider,
    command: SandboxesCommand,
) -> Outcome {
    let orchestrator = Orchestrator::new(
        Some(Persistence {
            host,
            signer,
            git_url,
        }),
        SandboxLayout::shmastra(),
    );
    let fleet = Fleet::new(provider, orchestrator);
    match command {
        SandboxesCommand::Provision { user, user_key } => {
            let user = UserId::parse(&user).map_err(Failure::config)?;
            let done = fleet
                .with_user_key(&user_key)
                .provision(&user)
                .await
                .map_err(Failure::runtime)?;
            Ok(Success {
                text: format!("{user}: {}", provisioned_text(&done)),
                json: json!({ "user": user.as_str(), "provisioned": provisioned_json(&done) }),
            })
        }
        SandboxesCommand::Backfill { user_key } => {
            let fleet = fleet.with_user_key(&user_key);
            let terminal = std::io::stderr().is_terminal();
            let report = fleet
                .backfill(|n, count, entry| {
                    if terminal {
                        eprintln!("[{n}/{count}] {}", entry_text(entry));
                    }
                })
                .await
                .map_err(Failure::runtime)?;
            backfill_outcome(&report)
        }
        SandboxesCommand::Status { user_key } => {
            let reports = fleet
                .with_user_key(&user_key)
                .status()
                .await
                .map_err(Failure::runtime)?;
            Ok(Success {
                text: if reports.is_empty() {
                    "no sandboxes".to_owned()
                } else {
                    reports
                        .iter()
                        .map(status_text)
                        .collect::<Vec<_>>()
                        .join("\n")
                },
                json: json!({ "sandboxes": reports }),
            })
        }
    }
}

fn backfill_outcome(report: &[BackfillEntry]) -> Outcome {
    let failed = report
        .iter()
        .filter(|e| matches!(e.outcome, BackfillOutcome::Failed(_)))
        .count();
    let done = report
        .iter()
        .filter(|e| matches!(e.outcome, BackfillOutcome::Provisioned(_)))
        .count();
    let mut lines: Vec<String> = report.iter().map(entry_text).collect();
    lines.push(format!(
        "{} sandboxes: {done} provisioned, {} already done, {failed} failed",
        report.len(),
        report.len() - done - failed
    ));
    let success = Success {
        text: lines.join("\n"),
        json: json!({ "sandboxes": report.iter().map(entry_json).collect::<Vec<_>>() }),
    };
    if failed > 0 {
        return Err(Failure::partial(
            success,
            anyhow!("{failed} of {} sandboxes failed to back-fill", report.len()),
        ));
    }
    Ok(success)
}

fn entry_text(entry: &BackfillEntry) -> String {
    let what = match &entry.outcome {
        BackfillOutcome::Provisioned(done) => provisioned_text(done),
        BackfillOutcome::AlreadyDone => "already done".to_owned(),
        BackfillOutcome::Failed(why) => format!("failed: {why}"),
    };
    format!("{} ({}): {what}", entry.user, entry.sandbox)
}

fn entry_json(entry: &BackfillEntry) -> Value {
    let (outcome, detail) = match &entry.outcome {
        BackfillOutcome::Provisioned(done) => ("provisioned", provisioned_json(done)),
        BackfillOutcome::AlreadyDone => ("already_done", Value::Null),
        BackfillOutcome::Failed(why) => ("failed", json!(why)),
    };
    json!({
        "user": entry.user.as_str(),
        "sandbox": entry.sandbox,
        "outcome": outcome,
        "detail": detail,
    })
}

fn provisioned_text(done: &Provisioned) -> String {
    let changed: Vec<&str> = [
        (done.repository_created, "repository created"),
        (done.env_written, "token written"),
        (done.remote_configured, "remote configured"),
        (done.watcher_started, "watcher started"),
    ]
    .into_iter()
    .filter_map(|(yes, what)| yes.then_some(what))
    .collect();
    if changed.is_empty() {
        "already done".to_owned()
    } else {
        format!("provisioned ({})", changed.join(", "))
    }
}

fn provisioned_json(done: &Provisioned) -> Value {
    json!({
        "repository_created": done.repository_created,
        "env_written": done.env_written,
        "remote_configured": done.remote_configured,
        "watcher_started": done.watcher_started,
    })
}

fn status_text(report: &SandboxReport) -> String {
    let sandbox = &report.sandbox;
    let state = match sandbox.state {
        Some(state) => serde_json::to_value(state)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default(),
        None => "unknown".to_owned(),
    };
    let detail = match (&report.watcher, &report.note) {
        (Some(w), _) => {
            let pushed = match w.last_push_age_secs {
                Some(secs) => format!("last push {} ago", human(secs)),
                None => "never pushed".to_owned(),
            };
            let watcher = if w.running {
                "watcher running"
            } else {
                "watcher stopped"
            };
            let error = w
                .last_push_error
                .as_deref()
                .map(|e| format!(", push failing: {e}"))
                .unwrap_or_default();
            format!(
                "{watcher} ({}), {pushed}, {} unpushed commits{error}",
                w.state, w.unpushed_commits
            )
        }
        (None, Some(note)) => note.clone(),
        (None, None) => String::new(),
    };
    format!(
        "{} ({}): {state}; {detail}",
        sandbox.user, sandbox.sandbox_id
    )
}

/// `90` as `1m30s`.
fn human(secs: u64) -> String {
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m{:02}s", s / 60, s % 60),
        s if s < 86_400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        s => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
    }
}
