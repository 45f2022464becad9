//! `cargo xtask`: the project's developer tasks (ci, and more as they land).

mod bench;
mod demo;
mod soak;

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "Developer tasks for project-watcher and cloud-core")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// What CI runs: format check, clippy with warnings denied, every test.
    Ci,
    /// project-watcher against the inotifywait + git CLI baseline, as ratios (BENCHMARKS.md).
    Bench(bench::Options),
    /// The whole system on one machine: proxy, watcher, an edit saved, an external push synced.
    Demo,
    /// The reliability suite with big numbers in a release build (RELIABILITY.md).
    Soak(soak::Options),
}

fn main() -> Result<()> {
    match Cli::parse().task {
        Task::Ci => ci(),
        Task::Bench(options) => bench::run(options),
        Task::Demo => demo::run(),
        Task::Soak(options) => soak::run(options),
    }
}

fn ci() -> Result<()> {
    cargo(&["fmt", "--all", "--", "--check"])?;
    cargo(&[
        "clippy",
        "--workspace",
        "--all-targets",
        "--locked",
        "--",
        "-D",
        "warnings",
    ])?;
    let skipped = Path::new(&std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into()))
        .join("tmp/skipped-tests.txt");
    let _ = std::fs::remove_file(&skipped);
    // Every test binary runs even after one fails, so one CI run shows every failure.
    let tests = cargo(&["test", "--workspace", "--locked", "--no-fail-fast"]);
    // A skipped case passes, and cargo hides a passing test's output: say it last.
    if let Ok(list) = std::fs::read_to_string(&skipped) {
        println!(
            "\n{} test case(s) did not run on this machine (REQUIRE_PRIVILEGED=1 makes that a failure):\n{list}",
            list.lines().count()
        );
    }
    tests
}

fn cargo(args: &[&str]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(&cargo)
        .args(args)
        .status()
        .with_context(|| format!("running {cargo} {}", args.join(" ")))?;
    if !status.success() {
        bail!("`cargo {}` failed ({status})", args.join(" "));
    }
    Ok(())
}
