//! The validated settings of one `watch` or `once` run, and the parsers for their values.
//!
//! The binary turns flags and env vars into a [`Config`]; everything past this point trusts it.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use shmastra_contract::env::{DEFAULT_BRANCH, DEFAULT_REMOTE};

/// How log lines look. `Auto` is pretty on a terminal and JSON otherwise (PM2 collects logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Pretty on a terminal, JSON lines otherwise.
    #[default]
    Auto,
    /// One JSON object per line.
    Json,
    /// For people.
    Pretty,
}

impl FromStr for LogFormat {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "json" => Ok(Self::Json),
            "pretty" => Ok(Self::Pretty),
            other => Err(ConfigError::LogFormat(other.to_owned())),
        }
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Json => "json",
            Self::Pretty => "pretty",
        })
    }
}

/// A setting the watcher refuses, with what was given (exit 2).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// Not a duration humantime reads.
    #[error("invalid duration {value:?}: {reason} (examples: 3s, 500ms, 1m)")]
    Duration {
        /// What was given.
        value: String,
        /// Why it was refused.
        reason: String,
    },
    /// Not a size (the value given).
    #[error("invalid size {0:?} (examples: 50MiB, 10MB, 1048576)")]
    Size(String),
    /// Not `auto`, `json` or `pretty` (the value given).
    #[error("invalid log format {0:?}: expected auto, json or pretty")]
    LogFormat(String),
    /// `--debounce 0`.
    #[error("--debounce must be more than zero")]
    ZeroDebounce,
    /// A cap shorter than the wait it caps.
    #[error("--max-delay ({max_delay:?}) must not be shorter than --debounce ({debounce:?})")]
    MaxDelayBelowDebounce {
        /// `--debounce`.
        debounce: Duration,
        /// `--max-delay`.
        max_delay: Duration,
    },
    /// `--max-file-size 0`.
    #[error("--max-file-size must be more than zero")]
    ZeroMaxFileSize,
}

/// See [`Config::event_buffer`].
pub(crate) const DEFAULT_EVENT_BUFFER: usize = 4096;

/// Everything the daemon needs. Build it with [`Config::new`] and adjust the public fields;
/// [`Config::validate`] checks the combinations.
#[derive(Clone)]
pub struct Config {
    /// The project directory: the top of a git working tree.
    pub dir: PathBuf,
    /// The remote to push to; missing remote means commits stay local.
    pub remote: String,
    /// The branch of that remote the saves go to.
    pub branch: String,
    /// Commit once no relevant event arrived for this long.
    pub debounce: Duration,
    /// ... or once this long has passed since the first unsaved change.
    pub max_delay: Duration,
    /// Push at all (`--no-push`: commits stay local).
    pub push: bool,
    /// Files larger than this many bytes are left out of the commits.
    pub max_file_size: u64,
    /// How long the final push may take on SIGINT/SIGTERM.
    pub shutdown_timeout: Duration,
    /// How log lines look.
    pub log_format: LogFormat,
    /// From `PROJECT_TOKEN` only; never printed.
    pub token: Option<String>,
    /// Raw inotify events buffered before the watch stage; when full, everything is
    /// rescanned. Not a flag: tests lower it to force that path.
    pub event_buffer: usize,
    /// How long the watcher stays quiet after a save before it writes `.git/index` (the
    /// commit does not wait for it). Not a flag: tests change it to hold the window open.
    pub index_quiet: Duration,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("dir", &self.dir)
            .field("remote", &self.remote)
            .field("branch", &self.branch)
            .field("debounce", &self.debounce)
            .field("max_delay", &self.max_delay)
            .field("push", &self.push)
            .field("max_file_size", &self.max_file_size)
            .field("shutdown_timeout", &self.shutdown_timeout)
            .field("log_format", &self.log_format)
            .field("token", &self.token.as_ref().map(|_| "[redacted]"))
            .finish()
    }
}

pub(crate) const DEFAULT_DEBOUNCE: Duration = Duration::from_secs(3);
pub(crate) const DEFAULT_MAX_DELAY: Duration = Duration::from_secs(30);
pub(crate) const DEFAULT_MAX_FILE_SIZE: u64 = 50 * 1024 * 1024;
pub(crate) const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(8);
pub(crate) const DEFAULT_INDEX_QUIET: Duration = Duration::from_secs(2);

impl Config {
    /// The documented defaults for `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            remote: DEFAULT_REMOTE.to_owned(),
            branch: DEFAULT_BRANCH.to_owned(),
            debounce: DEFAULT_DEBOUNCE,
            max_delay: DEFAULT_MAX_DELAY,
            push: true,
            max_file_size: DEFAULT_MAX_FILE_SIZE,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            log_format: LogFormat::Auto,
            token: None,
            event_buffer: DEFAULT_EVENT_BUFFER,
            index_quiet: DEFAULT_INDEX_QUIET,
        }
    }

    /// The same settings, or the first combination that makes no sense.
    pub fn validate(self) -> Result<Self, ConfigError> {
        if self.debounce.is_zero() {
            return Err(ConfigError::ZeroDebounce);
        }
        if self.max_delay < self.debounce {
            return Err(ConfigError::MaxDelayBelowDebounce {
                debounce: self.debounce,
                max_delay: self.max_delay,
            });
        }
        if self.max_file_size == 0 {
            return Err(ConfigError::ZeroMaxFileSize);
        }
        Ok(self)
    }
}

/// `3s`, `500ms`, `1m 30s`: humantime's syntax.
pub fn parse_duration(value: &str) -> Result<Duration, ConfigError> {
    humantime::parse_duration(value.trim()).map_err(|e| ConfigError::Duration {
        value: value.to_owned(),
        reason: e.to_string(),
    })
}

/// A byte count with an optional unit: `1048576`, `512KiB`, `50MiB`, `1GiB`, `10MB`, `2k`.
/// Binary units (KiB) are powers of 1024, decimal ones (KB) of 1000; single letters are binary.
pub fn parse_size(value: &str) -> Result<u64, ConfigError> {
    let err = || ConfigError::Size(value.to_owned());
    let trimmed = value.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let number: u64 = number.parse().map_err(|_| err())?;
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        _ => return Err(err()),
    };
    number.checked_mul(multiplier).ok_or_else(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        let check = |input: &str, expected: Option<u64>| {
            assert_eq!(parse_size(input).ok(), expected, "{input}");
        };
        check("50MiB", Some(50 * 1024 * 1024));
        check("10MB", Some(10_000_000));
        check("1048576", Some(1_048_576));
        check("2k", Some(2048));
        check("1 GiB", Some(1 << 30));
        check("", None);
        check("MiB", None);
        check("-1", None);
        check("5 parsecs", None);
        check("99999999999999999999GiB", None);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("3s").unwrap(), Duration::from_secs(3));
        assert_eq!(parse_duration("200ms").unwrap(), Duration::from_millis(200));
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn validation_rejects_contradictions() {
        let mut c = Config::new(".");
        c.max_delay = Duration::from_secs(1);
        assert!(matches!(
            c.validate(),
            Err(ConfigError::MaxDelayBelowDebounce { .. })
        ));
        let mut c = Config::new(".");
        c.debounce = Duration::ZERO;
        assert_eq!(c.validate().unwrap_err(), ConfigError::ZeroDebounce);
        assert!(Config::new(".").validate().is_ok());
    }

    #[test]
    fn debug_never_shows_the_token() {
        let mut c = Config::new(".");
        c.token = Some("hunter2".into());
        assert!(!format!("{c:?}").contains("hunter2"));
    }
}
