//! `serve`: builds the validated serve configuration from flags and env, then runs the server
//! until SIGINT or SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use cloud_core::e2b::E2bSettings;
use cloud_core::{
    API_KEY_ENV, ApiKeys, Config, ConnectionLimits, LocalSandboxes, ProjectPath, ProxyLimits,
    ServeConfig, ServeError, TokenSigner, UpstreamChoice, WEBHOOK_SECRET_ENV, WebConfig, serve,
    watcher_on_path, webhook_secret,
};
use serde_json::json;
use tokio::signal::unix::{SignalKind, signal};

use crate::outcome::{Failure, Outcome, Success};

#[derive(clap::Args)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks a free one; the bound address is printed).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Serve bare repositories (DIR/<user>.git, created on first use) instead of GitLab.
    #[arg(long, value_name = "DIR")]
    pub upstream_dir: Option<PathBuf>,
    /// Shell command run per external push, with SHMASTRA_USER, SHMASTRA_REF, SHMASTRA_NEW_OID.
    #[arg(long, value_name = "CMD")]
    pub on_external_push: Option<String>,
    /// Largest request body (a push's pack), in bytes.
    #[arg(long, default_value_t = 1 << 30)]
    pub max_request_bytes: u64,
    /// How long the upstream may take to start answering.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub upstream_timeout: Duration,
    /// Longest silence within a request or response body.
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    pub idle_timeout: Duration,
    /// Git requests one user may have in flight; past it, 429 with Retry-After.
    #[arg(long, default_value_t = 8)]
    pub max_requests_per_user: usize,
    /// Git requests in flight for everyone together; past it, 503 with Retry-After.
    #[arg(long, default_value_t = 64)]
    pub max_requests: usize,
    /// Open connections at most; past it, new connections get 503 and are closed.
    #[arg(long, default_value_t = 512)]
    pub max_connections: usize,
    /// Longest time to send a request's headers, and longest idle time between requests on a
    /// kept-alive connection.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub header_timeout: Duration,
    /// Embedded upstream: allow deleting and force-pushing main, recovery/* and tags (they are
    /// protected by default, as GitLab protects the default branch).
    #[arg(long)]
    pub allow_history_rewrite: bool,
    /// An env var the --on-external-push command inherits (besides PATH, HOME, USER, LANG,
    /// LC_ALL, TZ, TMPDIR and its SHMASTRA_* values); repeatable. Server secrets are refused.
    #[arg(long, value_name = "NAME")]
    pub sync_env: Vec<String>,
    /// How many --on-external-push runs (each for a different user) go on at once.
    #[arg(long, default_value_t = 4)]
    pub parallel_syncs: usize,
    /// PostgreSQL for the state every replica shares (sync jobs, recent pushes, webhook
    /// deliveries, statuses, token revocations); without it, in-process state for one replica.
    #[arg(long, env = "DATABASE_URL", value_name = "URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// How long a replica's claim on a sync job holds without renewal: the job of a replica
    /// that died mid-run is run by another within this time.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub sync_lease: Duration,
    /// With --database-url: how long this replica accepts project tokens while it cannot read
    /// the token revocations from the database; past it every git request gets 503 and
    /// /healthz says unhealthy (a revocation made meanwhile would be missed).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub token_state_max_age: Duration,
    /// How long a workspace page's live event stream may carry no status before it ends (the
    /// page opens it again). Streams are also capped: 4 per user, a quarter of
    /// --max-connections in all, so the rest stay for git.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub event_stream_idle: Duration,
    /// Run each user's sandbox on this machine, at DIR/<user>, with the watcher in it. As
    /// root, each sandbox runs as a uid of its own (200000 and up; its directory 0700), so its
    /// code reads neither this server nor another sandbox; not as root, DIR serves one user.
    /// The kernel, CPU, memory, disk and network stay shared: only a VM (E2B) separates those.
    #[arg(long, value_name = "DIR")]
    pub sandboxes_dir: Option<PathBuf>,
    /// The project-watcher binary the sandboxes run (default: from PATH).
    #[arg(long, value_name = "PATH")]
    pub watcher_bin: Option<PathBuf>,
    /// The dependency install command of a sandbox's sync (default: the lock file's manager).
    #[arg(long, value_name = "CMD")]
    pub install_cmd: Option<String>,
    /// Whether --database-url came on the command line (which every process here may read in
    /// `/proc/<pid>/cmdline`) rather than from `DATABASE_URL`.
    #[arg(skip)]
    pub database_url_on_command_line: bool,
    /// The dev server's health URL inside each E2B sandbox: "Ready" once it answers 2xx.
    #[arg(
        long,
        value_name = "URL",
        default_value = "http://localhost:4111/health"
    )]
    pub health_url: String,
    /// Where each user's GitLab project is: `<group>/` and a path around `<user>` (the user id)
    /// or `<user:N>` (its first N characters). A deployment whose projects exist under another
    /// naming keeps them: `<group>/shmastra-user-<user:8>`.
    #[arg(long, env = "GITLAB_PROJECT_PATH", value_name = "TEMPLATE", default_value = cloud_core::DEFAULT_PROJECT_PATH)]
    pub project_path: String,
    /// Where people reach this server (https://cloud.example): sign-in links, the clone URL,
    /// the cookie's Secure flag and the CSRF origin check use it.
    #[arg(long, env = crate::login_link::PUBLIC_URL_ENV, value_name = "URL")]
    pub public_url: Option<String>,
}

pub async fn run(args: ServeArgs) -> Outcome {
    let signer = TokenSigner::from_env().map_err(Failure::config)?;
    let gitlab = Config::from_env().map_err(Failure::config)?;
    let upstream = match (args.upstream_dir, gitlab) {
        (Some(dir), gitlab) => {
            if gitlab.is_some() {
                tracing::warn!("--upstream-dir given: GitLab settings are ignored");
            }
            UpstreamChoice::Embedded(dir)
        }
        (None, Some(mut config)) => {
            config.project_path =
                ProjectPath::parse(&args.project_path).map_err(Failure::config)?;
            UpstreamChoice::GitLab(config)
        }
        (None, None) => {
            return Err(Failure::config(anyhow::anyhow!(
                "no upstream: set GITLAB_SERVICE_TOKEN and GITLAB_GROUP_ID, or pass --upstream-dir DIR for the embedded one"
            )));
        }
    };
    let api_keys = ApiKeys::from_env().map_err(Failure::config)?;
    if api_keys.is_none() {
        tracing::info!("{API_KEY_ENV} is not set: the control API (/api/v1/) is off");
    }
    let webhook_secret = std::env::var(WEBHOOK_SECRET_ENV)
        .ok()
        .filter(|s| !s.is_empty())
        .map(|s| webhook_secret(&s))
        .transpose()
        .map_err(Failure::config)?;
    if args.max_requests == 0 || args.max_requests_per_user == 0 || args.max_connections == 0 {
        return Err(Failure::config(anyhow::anyhow!(
            "--max-requests, --max-requests-per-user and --max-connections must be at least 1"
        )));
    }
    if args.sync_lease < Duration::from_millis(300) {
        return Err(Failure::config(anyhow::anyhow!(
            "--sync-lease must be at least 300ms (it is renewed every third of it)"
        )));
    }
    if args.database_url.as_ref().is_some_and(|u| !u.is_empty())
        && std::env::var_os(cloud_core::TOKEN_STATE_ENV).is_some_and(|d| !d.is_empty())
    {
        return Err(Failure::config(anyhow::anyhow!(
            "both --database-url and {} are set: token generations live in one place; unset one",
            cloud_core::TOKEN_STATE_ENV
        )));
    }
    if args.sandboxes_dir.is_some()
        && args.database_url_on_command_line
        && args
            .database_url
            .as_deref()
            .is_some_and(cloud_core::store::postgres::has_password)
    {
        return Err(Failure::config(anyhow::anyhow!(
            "--database-url carries a password on the command line, which every process on this machine may read (/proc/<pid>/cmdline), the sandboxes' code included: pass it in DATABASE_URL instead"
        )));
    }
    let database = args
        .database_url
        .filter(|url| !url.is_empty())
        .map(|url| cloud_core::store::postgres::pool(&url))
        .transpose()
        .map_err(Failure::config)?;
    let sandboxes = match args.sandboxes_dir {
        None => None,
        Some(root) => {
            let watcher = args.watcher_bin.or_else(watcher_on_path).ok_or_else(|| {
                Failure::config(anyhow::anyhow!(
                    "--sandboxes-dir needs project-watcher: put it on PATH or pass --watcher-bin"
                ))
            })?;
            let absolute = |path: PathBuf| {
                std::path::absolute(&path)
                    .with_context(|| format!("cannot resolve {}", path.display()))
                    .map_err(Failure::config)
            };
            let (root, watcher) = (absolute(root)?, absolute(watcher)?);
            Some(LocalSandboxes {
                root,
                watcher_bin: watcher.display().to_string(),
                install_cmd: args.install_cmd,
                gate: Default::default(),
            })
        }
    };
    // E2B when E2B_API_KEY is set; half the settings are an error here, not at first use.
    let e2b = E2bSettings::from_env(|name| std::env::var(name).ok()).map_err(Failure::config)?;
    let config = ServeConfig {
        listen: args.listen,
        upstream,
        signer,
        webhook_secret,
        on_external_push: args.on_external_push,
        limits: ProxyLimits {
            max_request_bytes: args.max_request_bytes,
            upstream_timeout: args.upstream_timeout,
            idle_timeout: args.idle_timeout,
            max_requests_per_user: args.max_requests_per_user,
            max_requests: args.max_requests,
        },
        connections: ConnectionLimits {
            max_connections: args.max_connections,
            header_timeout: args.header_timeout,
            ..ConnectionLimits::default()
        },
        allow_history_rewrite: args.allow_history_rewrite,
        sync_env: args.sync_env,
        parallel_syncs: args.parallel_syncs,
        database,
        sync_lease: args.sync_lease,
        token_state_max_age: args.token_state_max_age,
        web: WebConfig {
            public_url: args.public_url,
            sandboxes,
            token_state: std::env::var_os(cloud_core::TOKEN_STATE_ENV)
                .filter(|dir| !dir.is_empty())
                .map(PathBuf::from),
            event_streams: cloud_core::EventStreamLimits {
                total: (args.max_connections / 4).max(1),
                per_user: 4,
                idle: args.event_stream_idle,
            },
            e2b,
            health_url: Some(args.health_url),
        },
        api_keys,
    };
    let mut terminate = signal(SignalKind::terminate())
        .context("installing the SIGTERM handler")
        .map_err(Failure::runtime)?;
    let shutdown = async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
        tracing::info!("shutting down");
    };
    // Scripts and tests read the bound address (port 0 becomes a real one) from this line.
    let announce = |addr: SocketAddr| println!("listening on {addr}");
    serve(config, announce, shutdown)
        .await
        .map_err(|e| match e {
            ServeError::SecretInSyncEnv(_) | ServeError::Workspace(_) => Failure::config(e),
            e => Failure::runtime(e),
        })?;
    Ok(Success {
        text: "stopped".into(),
        json: json!({ "stopped": true }),
    })
}
