//! Log output for the binary: JSON lines for PM2 and machines, human lines on a terminal.
//! The JSON shape is `shmastra-cloud`'s too: one object a line, `timestamp`, `level`,
//! `message`, the event's fields beside them (flattened), `target`.

use std::io::IsTerminal;

use shmastra_contract::log_level;
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// How talkative: `-q` and `-v` counts (see [`log_level::directive`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Verbosity {
    /// `-q` given this many times.
    pub quiet: u8,
    /// `-v` given this many times.
    pub verbose: u8,
}

/// Installs the global subscriber, writing to stderr, at `info` moved by `-q`/`-v`, or as
/// `RUST_LOG` says without them. Calling it twice is harmless (the second call does nothing).
pub fn init(format: LogFormat, verbosity: Verbosity) {
    let rust_log = std::env::var("RUST_LOG").ok();
    let directive = log_level::directive(
        "info",
        verbosity.quiet,
        verbosity.verbose,
        rust_log.as_deref(),
    );
    let filter = EnvFilter::try_new(directive).unwrap_or_else(|_| EnvFilter::new("info"));
    let json = match format {
        LogFormat::Json => true,
        LogFormat::Pretty => false,
        LogFormat::Auto => !std::io::stderr().is_terminal(),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if json {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.with_target(false).try_init()
    };
}
