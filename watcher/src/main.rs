//! The `project-watcher` binary: parses the command line, sets up logging, builds a validated
//! `Config` and hands over to the library. Exit codes: 0 ok, 1 runtime failure, 2 usage or
//! configuration error, 3 another watcher holds the lock.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use clap::parser::ValueSource;
use clap::{Args, CommandFactory as _, FromArgMatches as _, Parser, Subcommand};
use project_watcher::config::{self, Config, LogFormat};
use project_watcher::daemon;
use project_watcher::history;
use project_watcher::logging::Verbosity;
use project_watcher::remote::{self, RemoteSettings};
use project_watcher::restore::{self, Restored};
use project_watcher::restore_at;
use project_watcher::sync::{self, SyncSettings};
use shmastra_contract::env;

/// Shown under every `--help`: what the exit code says, and every env var read.
const AFTER_HELP: &str = "\
Exit codes: 0 done, 1 it ran and failed, 2 a setting, an argument or the directory must
change (nothing was done), 3 `status`: no watcher is running; `watch`, `once`: another
watcher runs on the project.

Environment (a flag, when given, wins):
  PROJECT_DIR, PROJECT_REMOTE, PROJECT_BRANCH   --dir, --remote, --branch
  PROJECT_TOKEN                    the git password (basic auth); never a flag
  PROJECT_WATCHER_DEBOUNCE         --debounce (old name: WATCHER_DEBOUNCE)
  PROJECT_WATCHER_MAX_DELAY        --max-delay (old name: WATCHER_MAX_DELAY)
  PROJECT_WATCHER_NETWORK_TIMEOUT  a push or fetch without progress fails after this (30s)
  PROJECT_WATCHER_MIN_FREE_DISK    `status` warns below this free space (max(512MiB, 5%))
  PROJECT_WATCHER_SYNC_STEP_FILE   sync --step-file
  RUST_LOG                         log filter (default info); -q, -v adjust it";

#[derive(Parser)]
#[command(
    name = "project-watcher",
    version,
    about = "Saves a project directory to git as you work.",
    after_help = AFTER_HELP
)]
struct Cli {
    /// Log less: warnings and errors only (-qq: errors only).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    quiet: u8,
    /// Log more: debug (-vv: trace).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Watch the project and save every change to git (and push it), until SIGINT/SIGTERM.
    Watch(WatchArgs),
    /// Stage, commit and push what changed now, then exit.
    Once(OnceArgs),
    /// Print what the running watcher is doing.
    Status(StatusArgs),
    /// Make the working tree exactly the remote branch (a fresh sandbox). Ignored files stay;
    /// with no remote branch yet (a new user) nothing changes. With --at: go back to an
    /// earlier save (the whole tree, or only --path), as a new save on top.
    Restore(RestoreArgs),
    /// List the saves, newest first.
    History(HistoryArgs),
    /// Print what one save changed: a stat and the patch (--json: the same save as data).
    Show(ShowArgs),
    /// Bring the project to the remote branch after a push from elsewhere: back up unsaved
    /// work, stop, pull, reinstall dependencies if needed, start.
    Sync(SyncArgs),
}

/// Which project, and which remote branch it is saved to and restored from: the same flags
/// and env vars for every command that talks to the remote.
#[derive(Args)]
struct RemoteArgs {
    /// The project directory (top of a git working tree).
    #[arg(long, env = env::PROJECT_DIR, default_value = ".")]
    dir: PathBuf,
    /// The git remote (by name) the project is saved to and restored from.
    #[arg(long, env = env::PROJECT_REMOTE, default_value = env::DEFAULT_REMOTE)]
    remote: String,
    /// The branch on that remote.
    #[arg(long, env = env::PROJECT_BRANCH, default_value = env::DEFAULT_BRANCH)]
    branch: String,
}

impl RemoteArgs {
    fn into_settings(self) -> RemoteSettings {
        RemoteSettings {
            workdir: self.dir,
            remote: self.remote,
            branch: self.branch,
            token: remote::token_from_env(),
        }
    }
}

#[derive(Args)]
struct RestoreArgs {
    #[command(flatten)]
    project: RemoteArgs,
    /// Go back to this save: a commit id or unique prefix, an RFC 3339 time, or a duration
    /// ago (`10m`, `2h`), meaning the newest save at or before then. Local only: no fetch.
    #[arg(long)]
    at: Option<String>,
    /// Restore only this path (a file or a folder, from the project's top); repeatable.
    #[arg(long = "path", requires = "at")]
    paths: Vec<PathBuf>,
    /// With --at: print the result as JSON.
    #[arg(long, requires = "at")]
    json: bool,
    /// With --at: unsaved files larger than this are not saved first (as `watch` leaves
    /// them out); they stay on disk.
    #[arg(long, requires = "at", default_value = "50MiB", value_parser = config::parse_size)]
    max_file_size: u64,
}

#[derive(Args)]
struct HistoryArgs {
    #[arg(long, env = env::PROJECT_DIR, default_value = ".")]
    dir: PathBuf,
    /// The remote whose branches say what was pushed.
    #[arg(long, env = env::PROJECT_REMOTE, default_value = env::DEFAULT_REMOTE)]
    remote: String,
    /// At most this many saves.
    #[arg(long, default_value_t = 50)]
    limit: usize,
    /// Only saves that changed this path (a file, or anything under a folder).
    #[arg(long)]
    path: Option<PathBuf>,
    /// One JSON array: commit, time, kind, files, pushed, subject (and ref for backups).
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct ShowArgs {
    /// The save: a commit id or unique prefix, an RFC 3339 time, or a duration ago.
    rev: String,
    #[arg(long, env = env::PROJECT_DIR, default_value = ".")]
    dir: PathBuf,
    /// One JSON object: commit, short, kind, subject, message, author (name, email), time,
    /// parents, and files, each with path, old_path (renames), change (added, modified,
    /// deleted, renamed, type_changed), binary, added and removed lines (null for a binary
    /// file) and its patch.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct SyncArgs {
    #[command(flatten)]
    project: RemoteArgs,
    /// Where a failed step leaves its name and output tail; removed on success.
    #[arg(long, default_value = shmastra_contract::failure::DEFAULT_FAILURE_FILE)]
    failure_file: PathBuf,
    /// Where the step under way is written while the sync runs; removed when it ends.
    #[arg(long, env = env::WATCHER_SYNC_STEP_FILE)]
    step_file: Option<PathBuf>,
    /// Stops the dev server before the tree changes.
    #[arg(long)]
    stop_cmd: Option<String>,
    /// Installs dependencies (default: the lock file's own manager) when a manifest changed.
    #[arg(long)]
    install_cmd: Option<String>,
    /// Starts the dev server at the end.
    #[arg(long)]
    start_cmd: Option<String>,
}

/// What `once` takes, and `watch` too.
#[derive(Args)]
struct OnceArgs {
    #[command(flatten)]
    project: RemoteArgs,
    /// Commit locally only (also what happens when the remote does not exist).
    #[arg(long)]
    no_push: bool,
    /// Leave out files larger than this (listed in the status file).
    #[arg(long, default_value = "50MiB", value_parser = config::parse_size)]
    max_file_size: u64,
    /// auto: pretty on a terminal, JSON lines otherwise.
    #[arg(long, default_value = "auto")]
    log_format: LogFormat,
}

#[derive(Args)]
struct WatchArgs {
    #[command(flatten)]
    once: OnceArgs,
    /// Commit once no change arrived for this long.
    #[arg(long, env = env::WATCHER_DEBOUNCE, default_value = "3s", value_parser = config::parse_duration)]
    debounce: Duration,
    /// Commit at the latest this long after the first unsaved change.
    #[arg(long, env = env::WATCHER_MAX_DELAY, default_value = "30s", value_parser = config::parse_duration)]
    max_delay: Duration,
    /// How long the final push may take on SIGINT/SIGTERM.
    #[arg(long, default_value = "8s", value_parser = config::parse_duration)]
    shutdown_timeout: Duration,
}

#[derive(Args)]
struct StatusArgs {
    #[arg(long, env = env::PROJECT_DIR, default_value = ".")]
    dir: PathBuf,
    /// Print the status file as it is.
    #[arg(long)]
    json: bool,
}

impl OnceArgs {
    fn into_config(self) -> Config {
        let mut config = Config::new(self.project.dir);
        config.remote = self.project.remote;
        config.branch = self.project.branch;
        config.push = !self.no_push;
        config.max_file_size = self.max_file_size;
        config.log_format = self.log_format;
        config.token = remote::token_from_env();
        config
    }
}

impl WatchArgs {
    /// A setting left at its default takes the value of its old env var name, when set.
    fn read_old_names(&mut self, given: &clap::ArgMatches) -> Result<(), String> {
        for (old, new) in env::OLD_NAMES {
            let (id, setting) = match new {
                env::WATCHER_DEBOUNCE => ("debounce", &mut self.debounce),
                env::WATCHER_MAX_DELAY => ("max_delay", &mut self.max_delay),
                _ => continue,
            };
            if given.value_source(id) == Some(ValueSource::DefaultValue)
                && let Ok(value) = std::env::var(old)
            {
                *setting = config::parse_duration(&value).map_err(|e| format!("{old}: {e}"))?;
            }
        }
        Ok(())
    }

    fn into_config(self) -> Config {
        let mut config = self.once.into_config();
        config.debounce = self.debounce;
        config.max_delay = self.max_delay;
        config.shutdown_timeout = self.shutdown_timeout;
        config
    }
}

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let (Command::Watch(args), Some(("watch", given))) = (&mut cli.command, matches.subcommand())
        && let Err(problem) = args.read_old_names(given)
    {
        eprintln!("project-watcher: {problem}");
        return ExitCode::from(2);
    }
    // Before any thread or network call: every request carries the watcher's User-Agent.
    match project_watcher::transport::network_timeout_from_env() {
        Ok(timeout) => project_watcher::transport::init(timeout),
        Err(problem) => {
            eprintln!("project-watcher: {problem}");
            return ExitCode::from(2);
        }
    };
    let verbosity = Verbosity {
        quiet: cli.quiet,
        verbose: cli.verbose,
    };
    match cli.command {
        Command::Watch(args) => with_config(args.into_config(), verbosity, |config| {
            runtime()?.block_on(async {
                let shutdown = shutdown_signal().map_err(daemon::DaemonError::Runtime)?;
                daemon::run(config, shutdown).await
            })
        }),
        Command::Once(args) => with_config(args.into_config(), verbosity, |config| {
            runtime()?.block_on(daemon::once(config))
        }),
        Command::Status(args) => status(args),
        Command::Restore(args) => match &args.at {
            Some(at) => restore_at_command(&args, at),
            None => restore_command(args.project, verbosity),
        },
        Command::History(args) => history_command(args),
        Command::Show(args) => show_command(args),
        Command::Sync(args) => sync_command(args, verbosity),
    }
}

fn restore_command(args: RemoteArgs, verbosity: Verbosity) -> ExitCode {
    project_watcher::logging::init(LogFormat::Auto, verbosity);
    match restore::restore(&args.into_settings()) {
        Ok(Restored::Commit(commit)) => {
            tracing::info!(%commit, "restored the working tree");
            ExitCode::SUCCESS
        }
        Ok(Restored::NothingSaved) => {
            tracing::info!("the remote has no such branch yet: nothing to restore");
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e, e.is_configuration()),
    }
}

fn restore_at_command(args: &RestoreArgs, at: &str) -> ExitCode {
    let done = restore_at::restore_at(
        &args.project.dir,
        at,
        &args.paths,
        args.max_file_size,
        SystemTime::now(),
    );
    match done {
        Ok(done) if args.json => print_json(&done),
        Ok(done) => {
            if let Some(saved) = done.saved_first {
                println!("saved unsaved edits first as {}", short(saved));
            }
            let from = short(done.from);
            match done.commit {
                Some(commit) => println!(
                    "restored {} file(s) as at {from} ({}); new save {}",
                    done.files.len(),
                    done.from_time,
                    short(commit)
                ),
                None => println!(
                    "nothing to restore: already as at {from} ({})",
                    done.from_time
                ),
            }
            if done.commit.is_some() && !done.watcher_running {
                println!("no watcher is running here: `project-watcher once` pushes the new save");
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e, e.is_usage()),
    }
}

fn history_command(args: HistoryArgs) -> ExitCode {
    let query = history::Query {
        limit: args.limit,
        path: args.path,
        remote: args.remote,
    };
    match history::open(&args.dir).and_then(|repo| history::history(&repo, &query)) {
        Ok(entries) if args.json => print_json(&entries),
        Ok(entries) => emit(&history::render(&entries)),
        Err(e) => fail(&e, e.is_usage()),
    }
}

fn show_command(args: ShowArgs) -> ExitCode {
    let repo = match history::open(&args.dir) {
        Ok(repo) => repo,
        Err(e) => return fail(&e, e.is_usage()),
    };
    let shown = if args.json {
        history::show_save(&repo, &args.rev).map(|save| print_json(&save))
    } else {
        history::show(&repo, &args.rev).map(|text| emit(&text))
    };
    shown.unwrap_or_else(|e| fail(&e, e.is_usage()))
}

/// The one plain line on stderr that ends a command (never a log line: the same text whether
/// stderr is a terminal or PM2's log); exit 2 for bad input, 1 for a failure.
fn fail(e: &dyn std::fmt::Display, usage: bool) -> ExitCode {
    eprintln!("project-watcher: {e}");
    ExitCode::from(if usage { 2 } else { 1 })
}

fn print_json(value: &impl serde::Serialize) -> ExitCode {
    match serde_json::to_string_pretty(value) {
        Ok(json) => emit(&format!("{json}\n")),
        Err(e) => fail(&e, false),
    }
}

/// Writes `text` to stdout; a reader that went away (`history | head`) is not an error.
fn emit(text: &str) -> ExitCode {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => fail(&e, false),
    }
}

fn short(id: git2::Oid) -> String {
    id.to_string()[..7].to_owned()
}

fn sync_command(args: SyncArgs, verbosity: Verbosity) -> ExitCode {
    project_watcher::logging::init(LogFormat::Auto, verbosity);
    let settings = SyncSettings {
        restore: args.project.into_settings(),
        failure_file: args.failure_file,
        step_file: args.step_file,
        stop_cmd: args.stop_cmd,
        install_cmd: args.install_cmd,
        start_cmd: args.start_cmd,
    };
    match sync::sync(&settings) {
        Ok(report) => {
            // Plain values, and no field at all for what did not happen (never `None`).
            let commit = report.commit.map(|c| c.to_string());
            tracing::info!(
                commit = commit.as_deref(),
                backup = report.backup_ref.as_deref(),
                backup_pushed = report.backup_pushed.as_deref(),
                installed_with = report.installed_with.as_deref(),
                "sync done"
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e, e.configuration),
    }
}

fn with_config(
    config: Config,
    verbosity: Verbosity,
    run: impl FnOnce(Config) -> Result<(), daemon::DaemonError>,
) -> ExitCode {
    let config = match config.validate() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("project-watcher: {e}");
            return ExitCode::from(2);
        }
    };
    project_watcher::logging::init(config.log_format, verbosity);
    match run(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("project-watcher: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// One thread is plenty: git work runs on the save thread and the blocking pool, and every
/// extra worker thread costs memory (its stack and malloc arena) in each sandbox.
fn runtime() -> Result<tokio::runtime::Runtime, daemon::DaemonError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(daemon::DaemonError::Runtime)
}

/// Listens for SIGINT (PM2's stop signal) and SIGTERM from now on; the future resolves on
/// the first of them.
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
    })
}

fn status(args: StatusArgs) -> ExitCode {
    let git_dir = match daemon::git_dir_of(&args.dir) {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("project-watcher: {e}");
            return ExitCode::from(e.exit_code());
        }
    };
    let running = project_watcher::lock::watcher_running(&git_dir);
    let mut read = project_watcher::status::read(&git_dir);
    match (&mut read, running) {
        // The figures of now, not of the watcher's last status write (it idles silently).
        (Ok(status), true) => status.measure(&git_dir),
        (Ok(status), false) => {
            if let Ok(repo) = project_watcher::project_dir::open(&args.dir) {
                status.as_stopped(&repo);
            }
        }
        (Err(project_watcher::status::StatusError::Missing(_)), false) => {
            if let Ok(repo) = project_watcher::project_dir::open(&args.dir) {
                read = Ok(project_watcher::status::Status::never_ran(&repo));
            }
        }
        (Err(_), _) => {}
    }
    if let Ok(status) = &read {
        let shown = if args.json {
            let mut shown = status.clone();
            if !running {
                shown.state = project_watcher::status::State::Stopped;
            }
            serde_json::to_string_pretty(&shown).map_err(|e| e.to_string())
        } else if running {
            Ok(status.to_string())
        } else {
            Ok(status.stopped().to_string())
        };
        match shown {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("project-watcher: {e}");
                return ExitCode::from(1);
            }
        }
    }
    if !running {
        eprintln!(
            "project-watcher: no watcher is running on {}{}",
            args.dir.display(),
            match &read {
                Ok(status) if status.state == project_watcher::status::State::Stopped =>
                    " (none has run on it)",
                Ok(_) => " (shown: the last status the stopped watcher wrote)",
                Err(_) => "",
            }
        );
        return ExitCode::from(3);
    }
    match read {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("project-watcher: {e}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    //! The command lines the cloud builds (`shmastra_contract::command`) against this binary's
    //! own clap definitions: every field arrives where the builder meant it, and the
    //! builder's defaults are the flags' defaults.

    use super::*;
    use clap::CommandFactory;
    use shmastra_contract::{RestoreCommand, SyncCommand};

    fn parse(args: Vec<String>) -> Command {
        let argv = std::iter::once("project-watcher".to_owned()).chain(args);
        match Cli::try_parse_from(argv) {
            Ok(cli) => cli.command,
            Err(e) => panic!("the watcher refuses the cloud's command line: {e}"),
        }
    }

    #[test]
    fn the_clouds_sync_command_line_means_what_it_says() {
        let built = SyncCommand {
            dir: "/home/user/my project".into(),
            remote: "origin".into(),
            branch: "trunk".into(),
            failure_file: "/tmp/sync failure".into(),
            stop_cmd: Some("pm2 stop dev-server".into()),
            install_cmd: Some("npm ci --prefer-offline".into()),
            start_cmd: Some("echo '--dir'".into()),
        };
        let Command::Sync(args) = parse(built.args()) else {
            panic!("not a sync");
        };
        assert_eq!(args.project.dir, PathBuf::from(&built.dir));
        assert_eq!(args.project.remote, built.remote);
        assert_eq!(args.project.branch, built.branch);
        assert_eq!(args.failure_file, PathBuf::from(&built.failure_file));
        assert_eq!(args.stop_cmd, built.stop_cmd);
        assert_eq!(args.install_cmd, built.install_cmd);
        assert_eq!(args.start_cmd, built.start_cmd);

        let bare = SyncCommand::new("/p");
        let Command::Sync(args) = parse(bare.args()) else {
            panic!("not a sync");
        };
        assert_eq!(
            (args.stop_cmd, args.install_cmd, args.start_cmd),
            (None, None, None)
        );
    }

    #[test]
    fn the_clouds_restore_command_lines_mean_what_they_say() {
        let Command::Restore(args) = parse(RestoreCommand::new("/p").args()) else {
            panic!("not a restore");
        };
        assert_eq!(args.project.dir, PathBuf::from("/p"));
        assert_eq!(args.at, None);
        assert!(!args.json);

        let paths = vec!["src/a b.ts".to_owned(), "docs".to_owned()];
        let at = RestoreCommand::new("/p").at("2h", &paths);
        let Command::Restore(args) = parse(at.args()) else {
            panic!("not a restore");
        };
        assert_eq!(args.at.as_deref(), Some("2h"));
        assert_eq!(
            args.paths,
            paths.iter().map(PathBuf::from).collect::<Vec<_>>()
        );
        assert!(args.json);
    }

    #[test]
    fn the_builders_defaults_and_env_names_are_the_flags() {
        let cli = Cli::command();
        let arg = |sub: &str, id: &str| {
            cli.find_subcommand(sub)
                .and_then(|s| s.get_arguments().find(|a| a.get_id() == id))
                .unwrap_or_else(|| panic!("{sub} has no --{id}"))
                .clone()
        };
        let default = |sub: &str, id: &str| {
            arg(sub, id)
                .get_default_values()
                .iter()
                .map(|v| v.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
        };
        let env_of = |sub: &str, id: &str| {
            arg(sub, id)
                .get_env()
                .map(|e| e.to_string_lossy().into_owned())
        };
        let sync = SyncCommand::new("/p");
        let restore = RestoreCommand::new("/p");
        for sub in ["sync", "restore", "watch", "once"] {
            assert_eq!(default(sub, "remote"), [sync.remote.as_str()], "{sub}");
            assert_eq!(default(sub, "branch"), [sync.branch.as_str()], "{sub}");
            assert_eq!(env_of(sub, "dir").as_deref(), Some(env::PROJECT_DIR));
            assert_eq!(env_of(sub, "remote").as_deref(), Some(env::PROJECT_REMOTE));
            assert_eq!(env_of(sub, "branch").as_deref(), Some(env::PROJECT_BRANCH));
        }
        assert_eq!((restore.remote, restore.branch), (sync.remote, sync.branch));
        assert_eq!(
            default("sync", "failure_file"),
            [sync.failure_file.as_str()]
        );
    }
}
