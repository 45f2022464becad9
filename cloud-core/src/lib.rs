//! cloud-core: the cloud side of project persistence, linked by the cloud backend.
//!
//! Each user's sandbox runs `project-watcher`, which saves the project to git and pushes it
//! through this crate's git proxy to the user's project (GitLab, or a directory of bare
//! repositories on one machine). Everything a backend needs is re-exported here:
//!
//! - **orchestration**: [`Orchestrator`] (`provision`, `begin_restore`/`finish_restore`,
//!   `sync`, `with_watcher_stopped`, `backfill`, `history`, `restore_to`) over a
//!   [`Sandbox`], reporting [`SandboxStatus`] changes (a failed sync is
//!   [`SandboxStatus::Broken`] with a [`SyncFailure`]) to a [`StatusSink`]; `sync` returns
//!   the [`SyncOutcome`] of the run that covered the call (synced with its commit, or failed
//!   with the [`SyncFailure`]), `sync_queued` the same across replicas; [`Lifecycle`]
//!   adds re-provisioning of lost sandboxes from a [`SandboxProvider`] under a
//!   [`RecoveryPolicy`];
//! - **sandboxes**: the [`Sandbox`] trait (run a command, read and write files),
//!   [`LocalSandbox`] and [`LocalProvider`] for one machine and tests;
//! - **projects**: [`ProjectHost`], implemented by the [`GitLab`] client (configured by
//!   [`Config::from_env`]) and by [`EmbeddedUpstream`];
//! - **the git proxy and the webhook**: [`Proxy::router`] (mount at `/api/git`) and
//!   [`Webhook::router`] (GitLab's push webhook), both reporting an [`ExternalPush`];
//! - **tokens**: [`TokenSigner`] mints and verifies each user's `PROJECT_TOKEN`; revocation
//!   keeps a generation per user behind [`Generations`] ([`GenerationDir`] on one machine);
//! - **the manifest and the restore form**: [`Manifest`] (`shmastra.json`, defined in the
//!   contract crate the watcher shares, re-exported as [`contract`]), [`RestoreForm`] and
//!   [`SecretValue`];
//! - **the ready-made server**: [`serve`] with a [`ServeConfig`] (what `shmastra-cloud serve`
//!   runs), or [`app`] to mount the same routes in a backend's own server; with a
//!   [`WebConfig`], the workspace page (sign-in links from [`SignIn`], one
//!   [`LocalSandboxes`] sandbox per user on one machine).
//!
//! The state every replica shares (sync jobs, recent pushes, webhook deliveries, statuses,
//! token generations) is the [`store`] module: one trait, in-process or PostgreSQL.
//!
//! # A backend, wired
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use cloud_core::{
//!     EmbeddedUpstream, ExternalPush, LocalSandbox, Orchestrator, Persistence, Proxy,
//!     ProxyLimits, SandboxLayout, SandboxStatus, SecretValue, StatusSink, SyncOutcome,
//!     TokenSigner, UserId,
//! };
//!
//! /// Where statuses go: the backend's database; here, the log.
//! struct Statuses;
//!
//! impl StatusSink for Statuses {
//!     fn set_status(&self, sandbox: &str, status: SandboxStatus) {
//!         println!("{sandbox}: {}", serde_json::to_string(&status).unwrap());
//!     }
//! }
//!
//! # async fn wire() -> Result<(), Box<dyn std::error::Error>> {
//! let signer = TokenSigner::from_env()?; // SHMASTRA_TOKEN_SECRET
//! let repos = "/var/lib/shmastra/repos";
//!
//! // The git proxy: a push from anywhere but the sandbox's watcher asks for a sync.
//! let on_push = Arc::new(|push: ExternalPush| println!("sync {} at {}", push.user, push.new_oid));
//! let proxy = Proxy::new(
//!     signer.clone(),
//!     Arc::new(EmbeddedUpstream::new(repos)?),
//!     ProxyLimits::default(),
//!     on_push,
//! );
//! let app: axum::Router = axum::Router::new().nest("/api/git", proxy.router());
//!
//! // Orchestration of the user's sandbox.
//! let orchestrator = Orchestrator::new(
//!     Some(Persistence {
//!         host: EmbeddedUpstream::new(repos)?,
//!         signer,
//!         git_url: "https://cloud.example/api/git".into(),
//!     }),
//!     SandboxLayout::shmastra(),
//! );
//! let alice = UserId::parse("alice")?;
//! let sandbox = LocalSandbox::new("alice", "/srv/sandboxes/alice");
//! let plan = orchestrator.begin_restore(&sandbox, &alice).await?;
//! // Ask the user for `plan.secret_names()`, then:
//! let form = vec![("OPENAI_API_KEY".to_owned(), SecretValue::new("sk-...".to_owned()))];
//! orchestrator.finish_restore(&sandbox, &plan, form).await?;
//! // After an external push (pushes during a sync coalesce into one more run; each caller
//! // gets the outcome of the run that covered it):
//! match orchestrator.sync(&sandbox, &alice, &Statuses).await {
//!     SyncOutcome::Synced { commit } => println!("alice's sandbox is at {commit:?}"),
//!     SyncOutcome::Failed { failure } => {
//!         println!("{} failed: {}\n{}", failure.step, failure.message, failure.tail)
//!     }
//! }
//! # drop(app);
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]

// The modules in layers, each importing only from its own layer or the layers listed before it
// (`tests/layers.rs` holds the order and checks it).
//
// Vocabulary: the words every layer shares.
mod admission;
mod client;
mod env_names;
mod event;
mod host;
mod patch;
mod project_path;
mod status;
mod user;
// IO: tokens, secrets, sandboxes, the state store, GitLab, E2B, git over CGI.
mod config;
pub mod e2b;
mod gitlab;
/// `git http-backend` as CGI behind an HTTP handler: the embedded upstream's engine, public
/// for test servers (`testkit`).
pub mod http_backend;
mod nonces;
mod process_group;
mod provider;
mod sandbox;
mod secrets;
pub mod store;
mod token;
// Services: the git proxy, the webhook, orchestration, the operator's view of the sandboxes.
/// The operator's commands over every user's sandbox at E2B.
pub mod fleet;
mod orchestrate;
mod proxy;
mod webhook;
// Adapters: GitLab and the embedded upstream, wired to every service's seams.
mod hosts;
// The workspace page, the control API and the ready-made server.
mod api;
mod serve;
mod web;

pub use shmastra_contract as contract;
pub use shmastra_contract::{Manifest, ManifestError, SyncFailure};

pub use client::ClientAddr;
pub use env_names::{SERVICE_TOKEN_ENV, TOKEN_SECRET_ENV, TOKEN_STATE_ENV, WEBHOOK_SECRET_ENV};
pub use event::{ExternalPush, OnExternalPush};
pub use host::{Diff, HostLink, ProjectHost, ProjectPages};
pub use project_path::{DEFAULT_PROJECT_PATH, Owner, ProjectPath, ProjectPathError};
pub use status::{ProvisionStep, SandboxStatus, StatusSink, SyncOutcome};
pub use user::{InvalidUserId, UserId};

pub use orchestrate::history::{
    HistoryError, RestoreToError, RestoredTo, Save, SaveHistory, SaveKind,
};
pub use orchestrate::lifecycle::{Lifecycle, Reprovisioned, SecretSource};
pub use orchestrate::provision::{BackfillEntry, BackfillOutcome, Provisioned, RestorePlan};
pub use orchestrate::queued::QueuedSyncError;
pub use orchestrate::recovery::RecoveryPolicy;
pub use orchestrate::{
    HEALTH_STEP, HealthCheck, OrchestrateError, Orchestrator, Persistence, SandboxLayout,
};

pub use provider::{LocalProvider, SandboxProvider};
pub use sandbox::{Exec, ExecOutput, LocalSandbox, Sandbox, SandboxError};

pub use config::{Config, ConfigError};
pub use gitlab::{GitLab, GitLabError, RetryPolicy};

pub use hosts::embedded::EmbeddedUpstream;
pub use proxy::events::RecentPushes;
pub use proxy::route::{Endpoint, Service};
pub use proxy::upstream::{
    HttpUpstream, RepoLocator, RepoPerUser, Upstream, UpstreamError, UpstreamRequest,
};
pub use proxy::{Proxy, ProxyLimits};
pub use webhook::{GroupPath, Webhook, WebhookSecretError, webhook_secret};

pub use token::{
    GenerationDir, GenerationError, Generations, TokenRefusal, TokenSecretError, TokenSigner,
};

pub use secrets::{FormProblem, RestoreForm, RestoreFormError, SecretValue, render_env};

pub use api::document as control_api_document;
pub use api::keys::{API_KEY_ENV, ApiKeyError, ApiKeys};
pub use serve::{ConnectionLimits, ServeConfig, ServeError, UpstreamChoice, app, serve};
pub use web::sandboxes::{LocalSandboxes, watcher_on_path};
pub use web::signin::{MintLinkError, SignIn, TtlTooLong};
pub use web::{
    EventStreamLimits, PageSandboxes, WebConfig, Workspace, WorkspaceError, workspace,
    workspace_with,
};
