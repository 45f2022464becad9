//! `shmastra-cloud`: the ops binary over cloud-core. It only wires: parse the command line, set
//! up logging, run one command from the library, report the outcome and its exit code.

mod fsck_command;
mod gitlab_commands;
mod login_link;
mod outcome;
mod sandbox_commands;
mod serve_command;
mod token_commands;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use outcome::Outcome;

/// Shown under every `--help`: what the exit code says, and every env var read.
const AFTER_HELP: &str = "\
Exit codes: 0 done, 1 it ran and failed, 2 a setting or an argument must change.

Environment:
  GITLAB_API_URL, GITLAB_GROUP_ID, GITLAB_SERVICE_TOKEN  the GitLab API, group and service token
  GITLAB_PROJECT_PATH     where each user's project is (serve --project-path)
  GITLAB_WEBHOOK_SECRET   the push webhook's secret (serve)
  SHMASTRA_TOKEN_SECRET   signs project tokens, sessions and sign-in links (32 bytes or more)
  SHMASTRA_TOKEN_STATE    a folder for token generations when there is no DATABASE_URL
  SHMASTRA_API_KEY        the backend's key to the HTTP API (serve)
  SHMASTRA_PUBLIC_URL     where people reach serve (serve, login-link --public-url)
  DATABASE_URL            PostgreSQL, the state every serve replica shares
  E2B_API_KEY             run each user's sandbox at E2B (serve, sandboxes), with
  E2B_TEMPLATE, E2B_API_URL, E2B_DOMAIN, E2B_SANDBOX_URL  the template and E2B's addresses
  RUST_LOG                log filter (default: info for serve, warn otherwise); -q, -v adjust it";

#[derive(Parser)]
#[command(
    name = "shmastra-cloud",
    version,
    about = "Operations for project persistence: GitLab provisioning, project tokens, and the \
             server (git proxy, webhook, HTTP API and workspace page)",
    after_help = AFTER_HELP
)]
struct Cli {
    /// Print the result (or the error) as one JSON object on stdout, for scripts.
    #[arg(long, global = true)]
    json: bool,
    /// Log less (-q: errors only when the default is warn).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    quiet: u8,
    /// Log more: one step per -v (info, debug, trace).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// GitLab: reads GITLAB_SERVICE_TOKEN, GITLAB_GROUP_ID, GITLAB_API_URL.
    #[command(subcommand)]
    Gitlab(GitlabCommand),
    /// Project tokens: reads SHMASTRA_TOKEN_SECRET, and DATABASE_URL or SHMASTRA_TOKEN_STATE.
    #[command(subcommand)]
    Token(TokenCommand),
    /// The server: the git proxy (/api/git), the GitLab push webhook (/api/gitlab/webhook),
    /// the HTTP API, the workspace page users sign in to (/login, /) and /healthz. Reads
    /// SHMASTRA_TOKEN_SECRET, GITLAB_WEBHOOK_SECRET, the GitLab settings, and with
    /// E2B_API_KEY the E2B settings (E2B_TEMPLATE, E2B_API_URL, E2B_DOMAIN,
    /// E2B_SANDBOX_URL): each user's sandbox then runs at E2B.
    Serve(Box<serve_command::ServeArgs>),
    /// Print a one-time sign-in URL for the workspace page (reads SHMASTRA_TOKEN_SECRET and
    /// SHMASTRA_PUBLIC_URL).
    LoginLink(login_link::LoginLinkArgs),
    /// The users' E2B sandboxes: reads the E2B settings, SHMASTRA_TOKEN_SECRET,
    /// SHMASTRA_PUBLIC_URL, DATABASE_URL and the GitLab settings (or --upstream-dir).
    Sandboxes {
        #[command(flatten)]
        fleet: sandbox_commands::FleetArgs,
        #[command(subcommand)]
        command: sandbox_commands::SandboxesCommand,
    },
    /// `git fsck --full --strict` in every repository of the embedded upstream: exit 1 naming
    /// the ones missing objects.
    Fsck(fsck_command::FsckArgs),
}

#[derive(Subcommand)]
enum GitlabCommand {
    /// Smoke test: can the service account see the group?
    Check,
    /// Make sure a user's project exists (idempotent) and print it.
    EnsureProject {
        /// The user's id, as the cloud names them (up to 64 letters, digits, `.`, `-`, `_`).
        #[arg(long)]
        user: String,
    },
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Print the user's PROJECT_TOKEN alone on stdout (their current generation, read from
    /// DATABASE_URL or SHMASTRA_TOKEN_STATE when set).
    Mint {
        /// The user's id, as the cloud names them (up to 64 letters, digits, `.`, `-`, `_`).
        #[arg(long)]
        user: String,
    },
    /// Refuse every token of the user minted so far, on every serve replica within seconds
    /// (needs DATABASE_URL or SHMASTRA_TOKEN_STATE, what serve reads); other users' tokens and
    /// the secret stay as they are.
    Revoke {
        /// The user's id, as the cloud names them (up to 64 letters, digits, `.`, `-`, `_`).
        #[arg(long)]
        user: String,
    },
    /// Revoke, then print the user's new PROJECT_TOKEN alone on stdout.
    Rotate {
        /// The user's id, as the cloud names them (up to 64 letters, digits, `.`, `-`, `_`).
        #[arg(long)]
        user: String,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let (Command::Serve(args), Some(("serve", serve))) = (&mut cli.command, matches.subcommand())
    {
        args.database_url_on_command_line =
            serve.value_source("database_url") == Some(clap::parser::ValueSource::CommandLine);
    }
    // A server logs what it does (info, one JSON object a line off a terminal, in the
    // watcher's shape: the event's fields flattened beside `message`); one-shot commands
    // only warn.
    let serving = matches!(cli.command, Command::Serve(_));
    let rust_log = std::env::var("RUST_LOG").ok();
    let directive = shmastra_contract::log_level::directive(
        if serving { "info" } else { "warn" },
        cli.quiet,
        cli.verbose,
        rust_log.as_deref(),
    );
    let filter = tracing_subscriber::EnvFilter::try_new(directive)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let logs = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(filter);
    if serving && !std::io::stderr().is_terminal() {
        logs.json().flatten_event(true).init();
    } else {
        logs.init();
    }
    let outcome: Outcome = match cli.command {
        Command::Gitlab(GitlabCommand::Check) => gitlab_commands::check().await,
        Command::Gitlab(GitlabCommand::EnsureProject { user }) => {
            gitlab_commands::ensure_project(&user).await
        }
        Command::Token(TokenCommand::Mint { user }) => token_commands::mint(&user).await,
        Command::Token(TokenCommand::Revoke { user }) => token_commands::revoke(&user, false).await,
        Command::Token(TokenCommand::Rotate { user }) => token_commands::revoke(&user, true).await,
        Command::Serve(args) => serve_command::run(*args).await,
        Command::LoginLink(args) => login_link::run(args).await,
        Command::Sandboxes { fleet, command } => sandbox_commands::run(fleet, command).await,
        Command::Fsck(args) => fsck_command::run(args).await,
    };
    outcome::report(outcome, cli.json)
}
