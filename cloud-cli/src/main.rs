//! `shmastra-cloud`: the ops binary over cloud-core. It only wires: parse the command line, set
//! up logging, run one command from the library, report the outcome and its exit code.

mod gitlab_commands;
mod login_link;
mod outcome;
mod serve_command;
mod token_commands;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use outcome::Outcome;

#[derive(Parser)]
#[command(
    name = "shmastra-cloud",
    version,
    about = "Operations for project persistence: GitLab provisioning and project tokens"
)]
struct Cli {
    /// Print the result (or the error) as one JSON object on stdout, for scripts.
    #[arg(long, global = true)]
    json: bool,
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
    /// The git proxy (/api/git), the GitLab push webhook (/api/gitlab/webhook) and /healthz.
    /// Reads SHMASTRA_TOKEN_SECRET, GITLAB_WEBHOOK_SECRET and the GitLab settings.
    Serve(Box<serve_command::ServeArgs>),
    /// Print a one-time sign-in URL for the workspace page (reads SHMASTRA_TOKEN_SECRET and
    /// SHMASTRA_PUBLIC_URL).
    LoginLink(login_link::LoginLinkArgs),
}

#[derive(Subcommand)]
enum GitlabCommand {
    /// Smoke test: can the service account see the group?
    Check,
    /// Make sure a user's project exists (idempotent) and print it.
    EnsureProject {
        #[arg(long)]
        user: String,
    },
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Print the user's PROJECT_TOKEN alone on stdout (their current generation, read from
    /// DATABASE_URL or SHMASTRA_TOKEN_STATE when set).
    Mint {
        #[arg(long)]
        user: String,
    },
    /// Refuse every token of the user minted so far, on every serve replica within seconds
    /// (needs DATABASE_URL or SHMASTRA_TOKEN_STATE, what serve reads); other users' tokens and
    /// the secret stay as they are.
    Revoke {
        #[arg(long)]
        user: String,
    },
    /// Revoke, then print the user's new PROJECT_TOKEN alone on stdout.
    Rotate {
        #[arg(long)]
        user: String,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // A server logs what it does (info, one JSON object a line off a terminal); one-shot
    // commands only warn.
    let serving = matches!(cli.command, Command::Serve(_));
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(if serving { "info" } else { "warn" })
    });
    let logs = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(filter);
    if serving && !std::io::stderr().is_terminal() {
        logs.json().init();
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
        Command::LoginLink(args) => login_link::run(args),
    };
    outcome::report(outcome, cli.json)
}
