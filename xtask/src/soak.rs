//! `cargo xtask soak`: the reliability suite (RELIABILITY.md) with big numbers, in a release
//! build: hundreds of `kill -9` rounds, minutes-long outages, many proptest cases. Prints
//! the figures every case reports and writes them to `target/soak-report.txt`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};

#[derive(clap::Args)]
pub struct Options {
    /// `kill -9` rounds of the crash test.
    #[arg(long, default_value_t = 300)]
    rounds: u64,
    /// How long each network fault lasts, in seconds.
    #[arg(long, default_value_t = 120)]
    outage_secs: u64,
    /// Cases per parser property.
    #[arg(long, default_value_t = 20_000)]
    proptest_cases: u64,
    /// Cases of the watcher's git-differential property (each runs a watcher and real git;
    /// about a second each in a release build).
    #[arg(long, default_value_t = 2_000)]
    watcher_proptest_cases: u64,
    /// How long the whole-remote property runs (generated histories pushed through every
    /// transport, `git fsck` and a fresh clone after each push), in seconds.
    #[arg(long, default_value_t = 600)]
    whole_remote_secs: u64,
    /// Replays a run (the seed each randomised test printed).
    #[arg(long)]
    seed: Option<u64>,
}

/// The test targets of the suite, by package.
const SUITES: &[(&str, &[&str])] = &[
    (
        "project-watcher",
        &[
            "reliability_crash",
            "reliability_faults",
            "reliability_inotify",
            "reliability_hostile",
            "property",
            "rules_differential",
            "whole_remote_property",
        ],
    ),
    ("cloud-core", &["parsers_proptest"]),
    ("git-wire", &["report_proptest"]),
    ("e2e", &["reliability_manifest"]),
];

/// Figures the report must hold, from the cases that never skip: a figure a test prints where
/// the soak does not collect it (stderr) is missing, not silently left out.
const REQUIRED_FIGURES: &[&str] = &[
    "RELIABILITY crash:",
    "RELIABILITY network-faults:",
    "RELIABILITY hostile-trees:",
    "RELIABILITY inotify-watch-limit:",
    "RELIABILITY property:",
    "RELIABILITY rules-differential:",
    "RELIABILITY parser-report-status:",
    "RELIABILITY parser-manifest-text:",
];

pub fn run(options: Options) -> Result<()> {
    let started = Instant::now();
    let mut figures = Vec::new();
    for (package, tests) in SUITES {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let proptest_cases = if *package == "project-watcher" {
            options.watcher_proptest_cases
        } else {
            options.proptest_cases
        };
        let mut cmd = Command::new(&cargo);
        cmd.args(["test", "--release", "--locked", "-p", package]);
        for test in *tests {
            cmd.args(["--test", test]);
        }
        cmd.args(["--", "--nocapture"])
            .env("RELIABILITY_ROUNDS", options.rounds.to_string())
            .env("RELIABILITY_OUTAGE_SECS", options.outage_secs.to_string())
            // proptest lets PROPTEST_CASES override a test's own case count, so the watcher's
            // differential tests (a watcher and real git per case) get their own number here.
            .env("PROPTEST_CASES", proptest_cases.to_string())
            .env(
                "WATCHER_PROPTEST_CASES",
                options.watcher_proptest_cases.to_string(),
            )
            .env("WHOLE_REMOTE_SECS", options.whole_remote_secs.to_string())
            .stdout(Stdio::piped());
        if let Some(seed) = options.seed {
            cmd.env("RELIABILITY_SEED", seed.to_string());
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("running the {package} reliability tests"))?;
        let stdout = child.stdout.take().context("test output")?;
        for line in BufReader::new(stdout).lines() {
            let line = line.context("reading test output")?;
            println!("{line}");
            if line.starts_with("RELIABILITY ")
                || line.starts_with("SKIPPED")
                || line.contains("RELIABILITY_SEED=")
            {
                figures.push(line);
            }
        }
        let status = child.wait()?;
        if !status.success() {
            bail!(
                "the {package} reliability tests failed ({status}); figures so far:\n{}",
                figures.join("\n")
            );
        }
    }
    let missing: Vec<&str> = REQUIRED_FIGURES
        .iter()
        .copied()
        .filter(|prefix| !figures.iter().any(|line| line.starts_with(prefix)))
        .collect();
    if !missing.is_empty() {
        bail!(
            "the tests passed but printed no {} line; figures:\n{}",
            missing.join(", "),
            figures.join("\n")
        );
    }
    let report = format!(
        "soak finished in {} s (rounds={}, outage_secs={}, proptest_cases={}, watcher_proptest_cases={}, whole_remote_secs={})\n{}\n",
        started.elapsed().as_secs(),
        options.rounds,
        options.outage_secs,
        options.proptest_cases,
        options.watcher_proptest_cases,
        options.whole_remote_secs,
        figures.join("\n")
    );
    print!("\n{report}");
    std::fs::write("target/soak-report.txt", &report).context("writing target/soak-report.txt")?;
    Ok(())
}
