//! `cargo xtask bench`: project-watcher against the usual inotifywait + git CLI shell loop,
//! on the same generated projects, in one run, reported as ratios (see BENCHMARKS.md).

#[cfg(test)]
mod baseline_check;
mod cases;
mod fixture;
mod git;
mod procs;
mod report;
mod side;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use serde::Serialize;

use cases::{Session, SideResults};
use fixture::{Fixture, Spec};
use report::FixtureResults;
use side::{Programs, Side};

#[derive(clap::Args)]
pub struct Options {
    /// A run of a few minutes on small fixtures, for working on the bench; without it, the
    /// full run that BENCHMARKS.md reports.
    #[arg(long)]
    quick: bool,
    /// Measure one side only (ratios need both).
    #[arg(long, value_enum)]
    only: Option<OnlySide>,
    /// Run only these tracked-file sizes of the plan (e.g. `--sizes 100000`), for profiling
    /// one size; the report then leaves out the figures of the others.
    #[arg(long, value_delimiter = ',')]
    sizes: Vec<usize>,
    /// Run only these cases (startup, one-edit, node-modules-burst, tracked-burst, idle).
    #[arg(long, value_delimiter = ',', value_parser = ["startup", "one-edit", "node-modules-burst", "tracked-burst", "idle"])]
    cases: Vec<String>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum OnlySide {
    Baseline,
    Watcher,
}

/// The sizes and durations of a run.
#[derive(Debug, Clone, Serialize)]
struct Plan {
    mode: &'static str,
    /// Tracked-file counts of the fixtures; each gets start-up and one-edit cases.
    tracked_sizes: Vec<usize>,
    /// The fixture the bursts and the idle case run on.
    main_size: usize,
    node_modules_files: usize,
    node_modules_burst_files: usize,
    tracked_burst_files: usize,
    idle_s: u64,
    one_edit_reps: usize,
    settle_s: u64,
}

impl Plan {
    fn new(quick: bool) -> Self {
        if quick {
            Self {
                mode: "quick",
                tracked_sizes: vec![1_000, 10_000],
                main_size: 1_000,
                node_modules_files: 10_000,
                node_modules_burst_files: 5_000,
                tracked_burst_files: 1_000,
                idle_s: 5,
                one_edit_reps: 3,
                settle_s: 3,
            }
        } else {
            Self {
                mode: "full",
                tracked_sizes: vec![1_000, 2_000, 10_000, 100_000],
                main_size: 10_000,
                node_modules_files: 50_000,
                node_modules_burst_files: 20_000,
                tracked_burst_files: 1_000,
                idle_s: 30,
                one_edit_reps: 7,
                settle_s: 3,
            }
        }
    }
}

/// Where the run happened, for reading its figures later.
#[derive(Debug, Serialize)]
struct Machine {
    cpu: String,
    cores: usize,
    memory_gib: f64,
    kernel: String,
    load_average_at_start: String,
    load_average_at_end: String,
    git: String,
    inotifywait: String,
    revision: String,
    /// Where the fixtures lived and on what file system (`fixtures_root`).
    fixtures_dir: String,
    fixtures_fs: String,
}

#[derive(Serialize)]
struct RunReport<'a> {
    started_at: String,
    duration_s: f64,
    plan: &'a Plan,
    machine: Machine,
    fixtures: Vec<&'a FixtureResults>,
    figures: Vec<report::Figure>,
    failures: &'a [String],
}

pub fn run(options: Options) -> Result<()> {
    let mut plan = Plan::new(options.quick);
    if !options.sizes.is_empty() {
        if let Some(missing) = options
            .sizes
            .iter()
            .find(|s| !plan.tracked_sizes.contains(s))
        {
            bail!(
                "--sizes {missing}: the {} plan has {:?}",
                plan.mode,
                plan.tracked_sizes
            );
        }
        plan.tracked_sizes.retain(|s| options.sizes.contains(s));
        plan.mode = if options.quick {
            "quick-part"
        } else {
            "full-part"
        };
    }
    if !options.cases.is_empty() {
        plan.mode = if options.quick {
            "quick-part"
        } else {
            "full-part"
        };
    }
    let sides: Vec<Side> = match options.only {
        None => vec![Side::Baseline, Side::Watcher],
        Some(OnlySide::Baseline) => vec![Side::Baseline],
        Some(OnlySide::Watcher) => vec![Side::Watcher],
    };
    let root = workspace_root();
    let started = Instant::now();
    let started_at = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
    let load_at_start = load_average();

    if sides.contains(&Side::Baseline) {
        ensure_inotifywait()?;
    }
    let programs = Programs {
        baseline_script: root.join("xtask/bench/baseline.sh"),
        autorestart_script: root.join("xtask/bench/autorestart.sh"),
        watcher_binary: if sides.contains(&Side::Watcher) {
            build_watcher(&root)?
        } else {
            PathBuf::new()
        },
    };
    let fixtures_root = fixtures_root(&root);
    let scratch = fixtures_root.join("scratch");
    fs::create_dir_all(&scratch)?;
    eprintln!(
        "bench: fixtures in {} ({})",
        fixtures_root.display(),
        fs_name(&fixtures_root)
    );
    let run_tag = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)?
        .as_secs()
        .to_string();
    let mut session = Session::new(
        programs,
        Duration::from_secs(plan.settle_s),
        scratch,
        run_tag,
    );

    let mut results = BTreeMap::new();
    for &tracked in &plan.tracked_sizes {
        let spec = Spec {
            tracked_files: tracked,
            node_modules_files: plan.node_modules_files,
        };
        let fx = Fixture::at(&fixtures_root, spec);
        let t = Instant::now();
        fx.prepare()
            .with_context(|| format!("preparing the fixture with {tracked} tracked files"))?;
        eprintln!(
            "bench: fixture {tracked} tracked + {} node_modules files ready in {:.1} s",
            plan.node_modules_files,
            t.elapsed().as_secs_f64()
        );
        let mut by_side: BTreeMap<Side, SideResults> = BTreeMap::new();
        let main = tracked == plan.main_size;
        // Sides take turns case by case, so load from elsewhere on the machine falls on both.
        let cases: &[&str] = if main {
            &[
                "startup",
                "one-edit",
                "node-modules-burst",
                "tracked-burst",
                "idle",
            ]
        } else {
            &["startup", "one-edit"]
        };
        for &case in cases {
            if !options.cases.is_empty() && !options.cases.iter().any(|c| c == case) {
                continue;
            }
            for &side in &sides {
                eprintln!("bench: {tracked} tracked: {case}: {}", side.name());
                let r = by_side.entry(side).or_default();
                match case {
                    "startup" => session.startup(side, &fx, r)?,
                    "one-edit" => session.one_edit(side, &fx, r, plan.one_edit_reps)?,
                    "node-modules-burst" => {
                        session.node_modules_burst(side, &fx, r, plan.node_modules_burst_files)?
                    }
                    "tracked-burst" => {
                        session.tracked_burst(side, &fx, r, plan.tracked_burst_files)?
                    }
                    _ => session.idle(side, &fx, r, Duration::from_secs(plan.idle_s))?,
                }
            }
        }
        results.insert(
            tracked,
            FixtureResults {
                spec,
                kept_dirs: fx.kept_dirs()?,
                baseline: by_side.remove(&Side::Baseline).unwrap_or_default(),
                watcher: by_side.remove(&Side::Watcher).unwrap_or_default(),
            },
        );
    }

    let figures = report::figures(&results, plan.main_size);
    let table = report::table(&figures);
    let report = RunReport {
        started_at,
        duration_s: started.elapsed().as_secs_f64(),
        plan: &plan,
        machine: machine(&root, &fixtures_root, load_at_start),
        fixtures: results.values().collect(),
        figures,
        failures: &session.failures,
    };
    let out_dir = root.join("bench-results");
    fs::create_dir_all(&out_dir)?;
    let json_path = out_dir.join(format!("bench-{}.json", plan.mode));
    fs::write(&json_path, serde_json::to_vec_pretty(&report)?)
        .with_context(|| format!("writing {}", json_path.display()))?;

    println!("{table}");
    println!(
        "{} run, started {}, {:.0} s; load average {} at start, {} at end",
        plan.mode,
        report.started_at,
        report.duration_s,
        report.machine.load_average_at_start,
        report.machine.load_average_at_end
    );
    println!("JSON: {}", json_path.display());
    if !session.failures.is_empty() {
        eprintln!("\n================ BENCH FAILED ================");
        for f in &session.failures {
            eprintln!("\n{f}");
        }
        bail!(
            "{} case(s) failed, a watcher lost a change or broke: see above",
            session.failures.len()
        );
    }
    Ok(())
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits in the workspace root")
        .to_owned()
}

/// The baseline needs inotify-tools; the normal tests do not, so only the bench installs it.
fn ensure_inotifywait() -> Result<()> {
    let found = Command::new("sh")
        .args(["-c", "command -v inotifywait"])
        .output()?
        .status
        .success();
    if found {
        return Ok(());
    }
    eprintln!("bench: installing inotify-tools for the baseline");
    for args in [
        &["update", "-q"][..],
        &["install", "-y", "-q", "inotify-tools"][..],
    ] {
        let status = Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .context("running apt-get to install inotify-tools")?;
        if !status.success() {
            bail!(
                "`apt-get {}` failed ({status}): install inotify-tools by hand",
                args.join(" ")
            );
        }
    }
    Ok(())
}

/// The bench measures the release build.
fn build_watcher(root: &Path) -> Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(&cargo)
        .args(["build", "--release", "-p", "project-watcher"])
        .current_dir(root)
        .status()
        .with_context(|| format!("running {cargo} build --release -p project-watcher"))?;
    if !status.success() {
        bail!("building project-watcher failed ({status})");
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    Ok(target.join("release/project-watcher"))
}

const TMPFS_MAGIC: u64 = 0x0102_1994;

/// Fixtures live on tmpfs when the machine has room there, else under `target/`. On ext4
/// without a journal (the bench machine's root), creating an inode within minutes of a
/// mass deletion checks every recently freed one (`recently_deleted` in ext4's
/// `find_inode_bit`), and the bench deletes thousands of files itself (the node_modules burst,
/// a remote's gc prune): the side that ran next paid up to 4x for the file system, not for
/// its own work. tmpfs keeps inodes in memory and has no such scan.
fn fixtures_root(root: &Path) -> PathBuf {
    const NEEDED: u64 = 4 << 30;
    let shm = Path::new("/dev/shm");
    match rustix::fs::statfs(shm) {
        Ok(st)
            if st.f_type as u64 == TMPFS_MAGIC
                && st.f_bavail.saturating_mul(st.f_bsize as u64) >= NEEDED =>
        {
            shm.join("project-watcher-bench")
        }
        _ => root.join("target/bench-fixtures"),
    }
}

/// The file system holding `path`, by name where it is a common one.
fn fs_name(path: &Path) -> String {
    match rustix::fs::statfs(path).map(|st| st.f_type as u64) {
        Ok(TMPFS_MAGIC) => "tmpfs".into(),
        Ok(0xEF53) => "ext2/3/4".into(),
        Ok(0x5846_5342) => "xfs".into(),
        Ok(0x9123_683E) => "btrfs".into(),
        Ok(0x794C_7630) => "overlayfs".into(),
        Ok(magic) => format!("file system magic {magic:#x}"),
        Err(e) => format!("unknown ({e})"),
    }
}

fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn first_line_of(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .map(|o| {
            let text = if o.stdout.is_empty() {
                o.stderr
            } else {
                o.stdout
            };
            String::from_utf8_lossy(&text)
                .lines()
                .next()
                .unwrap_or_default()
                .to_owned()
        })
        .unwrap_or_default()
}

fn machine(root: &Path, fixtures: &Path, load_at_start: String) -> Machine {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let meminfo = fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kib: f64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    Machine {
        cpu: cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
            .unwrap_or_default(),
        cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
        memory_gib: (mem_kib / 1024.0 / 1024.0 * 10.0).round() / 10.0,
        kernel: fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_owned(),
        load_average_at_start: load_at_start,
        load_average_at_end: load_average(),
        git: first_line_of("git", &["--version"]),
        inotifywait: first_line_of("inotifywait", &["--help"]),
        revision: first_line_of(
            "git",
            &[
                "-C",
                &root.to_string_lossy(),
                "describe",
                "--always",
                "--dirty",
            ],
        ),
        fixtures_dir: fixtures.display().to_string(),
        fixtures_fs: fs_name(fixtures),
    }
}
