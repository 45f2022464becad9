//! The git CLI for the bench's own bookkeeping (fixtures, checks), cut off from the machine's
//! git config so a developer's settings change no figure.

use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

#[derive(Clone)]
pub struct Git {
    home: PathBuf,
}

impl Git {
    pub fn new(home: &Path) -> Self {
        Self {
            home: home.to_owned(),
        }
    }

    /// The hermetic environment, also given to both watchers under test.
    pub fn env(&self) -> Vec<(&'static str, PathBuf)> {
        testkit::git::hermetic_env(&self.home)
    }

    pub fn command(&self, dir: &Path) -> Command {
        let mut cmd = Command::new("git");
        cmd.current_dir(dir)
            .envs(self.env())
            .env_remove("GIT_DIR")
            .env_remove("GIT_WORK_TREE")
            .env_remove("GIT_INDEX_FILE");
        cmd
    }

    /// Runs git in `dir` and returns its stdout, or an error carrying git's stderr.
    pub fn run<I, S>(&self, dir: &Path, args: I) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.run_with(self.command(dir).args(args), None)
    }

    /// Runs a prepared git command, feeding `stdin` when given.
    pub fn run_with(&self, cmd: &mut Command, stdin: Option<&[u8]>) -> Result<String> {
        let what = format!("{cmd:?}");
        cmd.stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = cmd.spawn().with_context(|| format!("starting {what}"))?;
        if let Some(input) = stdin {
            let mut pipe = child.stdin.take().context("git stdin")?;
            pipe.write_all(input)
                .with_context(|| format!("feeding {what}"))?;
        }
        let out = child
            .wait_with_output()
            .with_context(|| format!("waiting for {what}"))?;
        if !out.status.success() {
            bail!(
                "{what} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The tree `git add -A` would commit for `project`, staged in a scratch copy of its index
    /// with a scratch object store, so that neither the repository nor the watcher holding it
    /// is touched.
    pub fn tree_of_add_all(&self, project: &Path, scratch_dir: &Path) -> Result<String> {
        let index = scratch_dir.join("check.index");
        let objects = scratch_dir.join("check-objects");
        std::fs::create_dir_all(&objects)?;
        // A copy of the live index keeps the stat cache, so unchanged files are not re-read;
        // a missing or half-written one only makes git hash more.
        if std::fs::copy(project.join(".git/index"), &index).is_err() {
            let _ = std::fs::remove_file(&index);
        }
        let run = |args: &[&str]| {
            self.run_with(
                self.command(project)
                    .env("GIT_INDEX_FILE", &index)
                    .env("GIT_OBJECT_DIRECTORY", &objects)
                    .env(
                        "GIT_ALTERNATE_OBJECT_DIRECTORIES",
                        project.join(".git/objects"),
                    )
                    .args(args),
                None,
            )
        };
        let tree = run(&["add", "-A"]).and_then(|_| run(&["write-tree"]));
        let _ = std::fs::remove_file(&index);
        let _ = std::fs::remove_dir_all(&objects);
        Ok(tree?.trim().to_owned())
    }

    /// The tree of `rev` in `repo`.
    pub fn tree_of(&self, repo: &Path, rev: &str) -> Result<String> {
        Ok(self
            .run(repo, ["rev-parse", &format!("{rev}^{{tree}}")])?
            .trim()
            .to_owned())
    }
}
