//! The `project-watcher restore` and `sync` command lines the cloud runs in a sandbox, built
//! from typed fields. [`RestoreCommand::args`] and [`SyncCommand::args`] are the argument
//! lists (the watcher's own CLI tests parse them with its clap definitions);
//! `shell` renders them for `sh -c`, single-quoting every word that needs it. The token never appears here:
//! it travels in the [`crate::env::PROJECT_TOKEN`] environment variable.

use crate::env::{DEFAULT_BRANCH, DEFAULT_REMOTE};
use crate::failure::DEFAULT_FAILURE_FILE;

/// `project-watcher restore`: make the project exactly the remote branch, or, with `at`, go
/// back to an earlier save.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreCommand {
    pub dir: String,
    pub remote: String,
    pub branch: String,
    /// `--at REV`: a commit id or prefix, an RFC 3339 time, or a duration ago.
    pub at: Option<String>,
    /// `--path P` (with `at` only): restore only these paths.
    pub paths: Vec<String>,
    /// `--json` (with `at` only): print the result as JSON.
    pub json: bool,
}

impl RestoreCommand {
    /// A full restore of `dir` from the default remote and branch.
    pub fn new(dir: impl Into<String>) -> Self {
        Self {
            dir: dir.into(),
            remote: DEFAULT_REMOTE.to_owned(),
            branch: DEFAULT_BRANCH.to_owned(),
            at: None,
            paths: Vec::new(),
            json: false,
        }
    }

    /// Going back to `rev` (only `paths`, when there are any), with a JSON report.
    pub fn at(mut self, rev: impl Into<String>, paths: &[String]) -> Self {
        self.at = Some(rev.into());
        self.paths = paths.to_vec();
        self.json = true;
        self
    }

    /// The arguments after the program name.
    pub fn args(&self) -> Vec<String> {
        let mut args = vec![
            "restore".to_owned(),
            "--dir".to_owned(),
            self.dir.clone(),
            "--remote".to_owned(),
            self.remote.clone(),
            "--branch".to_owned(),
            self.branch.clone(),
        ];
        if let Some(at) = &self.at {
            args.extend(["--at".to_owned(), at.clone()]);
            for path in &self.paths {
                args.extend(["--path".to_owned(), path.clone()]);
            }
            if self.json {
                args.push("--json".to_owned());
            }
        }
        args
    }

    /// The command line for `sh -c`, running `program`.
    pub fn shell(&self, program: &str) -> String {
        shell_line(program, &self.args())
    }
}

/// `project-watcher sync`: bring a running sandbox to the remote branch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncCommand {
    pub dir: String,
    pub remote: String,
    pub branch: String,
    /// Where a failed step leaves a [`crate::SyncFailure`].
    pub failure_file: String,
    pub stop_cmd: Option<String>,
    /// Overrides the lock file's own package manager.
    pub install_cmd: Option<String>,
    pub start_cmd: Option<String>,
}

impl SyncCommand {
    /// A sync of `dir` from the default remote and branch, failures to the default file, no
    /// stop, install or start command.
    pub fn new(dir: impl Into<String>) -> Self {
        Self {
            dir: dir.into(),
            remote: DEFAULT_REMOTE.to_owned(),
            branch: DEFAULT_BRANCH.to_owned(),
            failure_file: DEFAULT_FAILURE_FILE.to_owned(),
            stop_cmd: None,
            install_cmd: None,
            start_cmd: None,
        }
    }

    /// The arguments after the program name.
    pub fn args(&self) -> Vec<String> {
        let mut args = vec![
            "sync".to_owned(),
            "--dir".to_owned(),
            self.dir.clone(),
            "--remote".to_owned(),
            self.remote.clone(),
            "--branch".to_owned(),
            self.branch.clone(),
            "--failure-file".to_owned(),
            self.failure_file.clone(),
        ];
        for (flag, value) in [
            ("--stop-cmd", &self.stop_cmd),
            ("--start-cmd", &self.start_cmd),
            ("--install-cmd", &self.install_cmd),
        ] {
            if let Some(value) = value {
                args.extend([flag.to_owned(), value.clone()]);
            }
        }
        args
    }

    /// The command line for `sh -c`, running `program`.
    pub fn shell(&self, program: &str) -> String {
        shell_line(program, &self.args())
    }
}

fn shell_line(program: &str, args: &[String]) -> String {
    std::iter::once(program)
        .chain(args.iter().map(String::as_str))
        .map(quote)
        .collect::<Vec<_>>()
        .join(" ")
}

/// One word for `sh`: as it is when it holds only characters `sh` takes literally, else in
/// single quotes, which keep everything literal (a `'` is closed, escaped and reopened).
fn quote(word: &str) -> String {
    let plain = |b: u8| b.is_ascii_alphanumeric() || b"_-./:=@%+,".contains(&b);
    if !word.is_empty() && word.bytes().all(plain) {
        return word.to_owned();
    }
    format!("'{}'", word.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::process::Command;

    /// What `sh` hands the program: each argument on its own, NUL-separated.
    fn words_through_sh(line: &str) -> Vec<String> {
        let out = Command::new("sh")
            .arg("-c")
            .arg(line)
            .env_clear()
            .output()
            .expect("sh runs");
        assert!(out.status.success(), "{line}: {out:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        text.split('\0')
            .map(str::to_owned)
            .collect::<Vec<_>>()
            .split_last()
            .map(|(_, words)| words.to_vec())
            .unwrap_or_default()
    }

    const PRINT_ARGS: &str = "printf '%s\\0' \"$@\"";

    #[test]
    fn shell_words_are_quoted_only_when_needed() {
        let mut sync = SyncCommand::new("/home/user/my project");
        sync.failure_file = "/tmp/f".into();
        sync.stop_cmd = Some("pm2 stop dev-server".into());
        sync.install_cmd = Some("echo 'hi'".into());
        assert_eq!(
            sync.shell("project-watcher"),
            "project-watcher sync --dir '/home/user/my project' --remote project --branch main \
             --failure-file /tmp/f --stop-cmd 'pm2 stop dev-server' --install-cmd 'echo '\\''hi'\\'''"
        );
        assert_eq!(
            RestoreCommand::new("").shell("w"),
            "w restore --dir '' --remote project --branch main"
        );
    }

    #[test]
    fn defaults_are_the_contract_defaults() {
        let sync = SyncCommand::new("/home/user/shmastra");
        assert_eq!(
            sync.args(),
            [
                "sync",
                "--dir",
                "/home/user/shmastra",
                "--remote",
                "project",
                "--branch",
                "main",
                "--failure-file",
                "/tmp/shmastra-sync-failure"
            ]
        );
        let restore = RestoreCommand::new("/p").at("10m", &["src/a.ts".to_owned()]);
        assert_eq!(
            restore.args(),
            [
                "restore", "--dir", "/p", "--remote", "project", "--branch", "main", "--at", "10m",
                "--path", "src/a.ts", "--json"
            ]
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(
            std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64)
        ))]

        /// Whatever the paths and commands hold (quotes, `$`, spaces, newlines), `sh` gives
        /// the program exactly the argument list.
        #[test]
        fn the_shell_line_carries_every_argument_exactly(
            dir in "[^\0]{0,20}",
            stop in proptest::option::of("[^\0]{0,20}"),
            install in proptest::option::of("[^\0]{0,20}"),
            rev in "[^\0]{0,10}",
            paths in prop::collection::vec("[^\0]{0,10}", 0..3),
        ) {
            let mut sync = SyncCommand::new(dir.clone());
            sync.stop_cmd = stop;
            sync.install_cmd = install;
            let line = format!("set -- {}; {PRINT_ARGS}", sync.shell("prog").trim_start_matches("prog "));
            prop_assert_eq!(words_through_sh(&line), sync.args());
            let restore = RestoreCommand::new(dir).at(rev, &paths);
            let line = format!("set -- {}; {PRINT_ARGS}", restore.shell("prog").trim_start_matches("prog "));
            prop_assert_eq!(words_through_sh(&line), restore.args());
        }
    }
}
