//! `shmastra-cloud fsck --upstream-dir DIR`: `git fsck --full --strict` in every repository of
//! the embedded upstream (`DIR/<user>.git`), so an operator finds the ones missing objects (an
//! earlier watcher's push to a path could leave a ref pointing at commits whose objects were
//! never written). Exit 0 when all are whole, 1 when any is not, naming them.

use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow};
use serde_json::json;

use crate::outcome::{Failure, Outcome, Success};

#[derive(clap::Args)]
pub struct FsckArgs {
    /// The embedded upstream's directory (what `serve --upstream-dir` serves).
    #[arg(long)]
    upstream_dir: PathBuf,
}

/// One repository's verdict: `None` when whole, else what fsck said (its first lines).
struct Verdict {
    user: String,
    problem: Option<String>,
}

pub async fn run(args: FsckArgs) -> Outcome {
    let repos = repositories(&args.upstream_dir).map_err(Failure::config)?;
    let mut verdicts = Vec::new();
    for (user, dir) in repos {
        let problem = fsck(&dir).await.map_err(Failure::runtime)?;
        verdicts.push(Verdict { user, problem });
    }
    let broken: Vec<&Verdict> = verdicts.iter().filter(|v| v.problem.is_some()).collect();
    if !broken.is_empty() {
        let named: Vec<String> = broken
            .iter()
            .map(|v| format!("{}: {}", v.user, v.problem.as_deref().unwrap_or_default()))
            .collect();
        return Err(Failure::runtime(anyhow!(
            "{} of {} repositories are not whole: {}",
            broken.len(),
            verdicts.len(),
            named.join("; ")
        )));
    }
    Ok(Success {
        text: format!(
            "{} repositories in {}, every one whole (git fsck --full --strict)",
            verdicts.len(),
            args.upstream_dir.display()
        ),
        json: json!({
            "repositories": verdicts.len(),
            "users": verdicts.iter().map(|v| v.user.as_str()).collect::<Vec<_>>(),
        }),
    })
}

/// The `<user>.git` repositories in `dir`, sorted; the hooks folder and half-made (staging)
/// repositories are not users'.
fn repositories(dir: &Path) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let entries = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read the upstream directory {}", dir.display()))?;
    let mut repos = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("cannot read {}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(user) = name.strip_suffix(".git")
            && !name.starts_with('.')
            && entry.path().is_dir()
        {
            repos.push((user.to_owned(), entry.path()));
        }
    }
    repos.sort();
    Ok(repos)
}

/// `git fsck --full --strict` in `dir`, with git's own configuration cut off: `None` when
/// clean, else its first lines.
async fn fsck(dir: &Path) -> anyhow::Result<Option<String>> {
    let out = tokio::process::Command::new("git")
        .args([
            "fsck",
            "--full",
            "--strict",
            "--no-progress",
            "--no-dangling",
        ])
        .current_dir(dir)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .await
        .context("cannot run git fsck")?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let problems: Vec<&str> = said
        .lines()
        .filter(|l| !l.starts_with("notice:") && !l.trim().is_empty())
        .take(5)
        .collect();
    Ok((!out.status.success() || !problems.is_empty()).then(|| problems.join(" / ")))
}
