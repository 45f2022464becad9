//! Turns the raw results into figures: both sides, the ratio, the target and whether
//! this run met it, as a Markdown table for people and JSON for tools.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::Serialize;

use super::cases::SideResults;
use super::fixture::Spec;

/// One fixture's results for both sides.
#[derive(Debug, Clone, Serialize)]
pub struct FixtureResults {
    pub spec: Spec,
    pub kept_dirs: u64,
    pub baseline: SideResults,
    pub watcher: SideResults,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Met,
    Missed,
    /// A side did not produce this figure (a failed case, or one side run alone).
    NotMeasured,
    /// Shown for context; the issue sets no target on it.
    NoTarget,
}

#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    pub name: String,
    pub unit: &'static str,
    pub baseline: Option<f64>,
    pub watcher: Option<f64>,
    /// watcher / baseline.
    pub ratio: Option<f64>,
    pub target: String,
    pub verdict: Verdict,
}

type Check = Box<dyn Fn(f64, f64) -> bool>;

struct Row {
    name: String,
    unit: &'static str,
    baseline: Option<f64>,
    watcher: Option<f64>,
    target: Option<(String, Check)>,
}

impl Row {
    fn new(name: impl Into<String>, unit: &'static str, b: Option<f64>, w: Option<f64>) -> Self {
        Self {
            name: name.into(),
            unit,
            baseline: b,
            watcher: w,
            target: None,
        }
    }

    fn target(
        mut self,
        text: impl Into<String>,
        check: impl Fn(f64, f64) -> bool + 'static,
    ) -> Self {
        self.target = Some((text.into(), Box::new(check)));
        self
    }

    fn into_figure(self) -> Figure {
        let ratio = match (self.baseline, self.watcher) {
            (Some(b), Some(w)) if b != 0.0 => Some(w / b),
            _ => None,
        };
        let (target, verdict) = match self.target {
            None => (String::new(), Verdict::NoTarget),
            Some((text, check)) => {
                let verdict = match (self.baseline, self.watcher) {
                    (Some(b), Some(w)) if check(b, w) => Verdict::Met,
                    (Some(_), Some(_)) => Verdict::Missed,
                    _ => Verdict::NotMeasured,
                };
                (text, verdict)
            }
        };
        Figure {
            name: self.name,
            unit: self.unit,
            baseline: self.baseline,
            watcher: self.watcher,
            ratio,
            target,
            verdict,
        }
    }
}

pub fn median(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = values.into_iter().collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len().is_multiple_of(2) {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    })
}

fn mib(kib: f64) -> f64 {
    kib / 1024.0
}

fn thousands(n: usize) -> String {
    if n >= 1000 && n.is_multiple_of(1000) {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}

/// The figures of a run, in table order. `main` is the tracked-file count the bursts and the
/// idle case ran at.
pub fn figures(results: &BTreeMap<usize, FixtureResults>, main: usize) -> Vec<Figure> {
    let mut rows = Vec::new();
    let per_side = |f: &FixtureResults, get: &dyn Fn(&SideResults) -> Option<f64>| {
        (get(&f.baseline), get(&f.watcher))
    };
    let ready = |s: &SideResults| median(s.startups.iter().map(|x| x.ready_s));
    let watches = |s: &SideResults| median(s.startups.iter().map(|x| x.watches as f64));
    let rss = |s: &SideResults| median(s.startups.iter().map(|x| mib(x.rss_kib as f64)));
    let startup_cpu = |s: &SideResults| median(s.startups.iter().map(|x| x.cpu_s));
    let edit_ms = |s: &SideResults| median(s.one_edit.as_ref()?.beyond_settle_ms.iter().copied());

    for (&n, f) in results {
        let size = thousands(n);
        let (b, w) = per_side(f, &ready);
        rows.push(
            Row::new(
                format!("start-up: seconds until ready, {size} tracked"),
                "s",
                b,
                w,
            )
            .target("watcher <= baseline", |b, w| w <= b),
        );
        let (b, w) = per_side(f, &watches);
        let kept = f.kept_dirs as f64;
        rows.push(
            Row::new(
                format!("start-up: inotify watches, {size} tracked"),
                "watches",
                b,
                w,
            )
            .target(
                format!(
                    "watcher = kept dirs ({}) + `.git` + `.git/info`",
                    f.kept_dirs
                ),
                // `.git` holds `HEAD`, `index` and the operation markers, whose changes begin
                // and end a pause for the user's git; `.git/info` holds `exclude`, whose change
                // re-reads the ignore rules.
                move |_, w| w == kept + 2.0,
            ),
        );
        let (b, w) = per_side(f, &rss);
        let rss_row = Row::new(
            format!("start-up: RSS of the process tree, {size} tracked"),
            "MiB",
            b,
            w,
        );
        // 2k tracked files is the size of a real `npm install @mastra/core zod` project.
        rows.push(match n {
            2_000 => rss_row.target("watcher <= baseline", |b, w| w <= b),
            100_000.. => rss_row.target("watcher <= 32 MiB", |_, w| w <= 32.0),
            _ => rss_row,
        });
        let (b, w) = per_side(f, &startup_cpu);
        rows.push(Row::new(
            format!("start-up: CPU until ready + 1 s, {size} tracked"),
            "s",
            b,
            w,
        ));
    }

    for (&n, f) in results {
        let (b, w) = per_side(f, &edit_ms);
        let row = Row::new(
            format!("one edit: ms beyond settle, {} tracked", thousands(n)),
            "ms",
            b,
            w,
        );
        rows.push(match n {
            ..=2_000 => row.target("watcher <= 1/2 baseline", |b, w| w <= b / 2.0),
            100_000.. => row.target("watcher <= 1/10 baseline", |b, w| w <= b / 10.0),
            _ => row,
        });
    }
    if let (Some(small), Some(large)) = (results.values().next(), results.values().next_back())
        && small.spec.tracked_files < large.spec.tracked_files
    {
        let growth = |s: &dyn Fn(&FixtureResults) -> &SideResults| {
            Some(edit_ms(s(large))? / edit_ms(s(small))?)
        };
        rows.push(
            Row::new(
                format!(
                    "one edit: {} tracked / {} tracked",
                    thousands(large.spec.tracked_files),
                    thousands(small.spec.tracked_files)
                ),
                "x",
                growth(&|f| &f.baseline),
                growth(&|f| &f.watcher),
            )
            .target("watcher < 2", |_, w| w < 2.0),
        );
    }

    if let Some(f) = results.get(&main) {
        let size = thousands(main);
        let nm = |s: &SideResults| s.node_modules_burst.clone();
        let files = nm(&f.watcher).or(nm(&f.baseline)).map_or(0, |x| x.files);
        let (b, w) = per_side(f, &|s| Some(nm(s)?.cpu_s));
        rows.push(
            Row::new(
                format!(
                    "node_modules burst ({} files): CPU, {size} tracked",
                    thousands(files)
                ),
                "s",
                b,
                w,
            )
            .target("watcher 0", |_, w| w == 0.0),
        );
        let (b, w) = per_side(f, &|s| Some(nm(s)?.commits as f64));
        rows.push(
            Row::new("node_modules burst: commits", "commits", b, w)
                .target("0 on both sides", |b, w| b == 0.0 && w == 0.0),
        );
        let (b, w) = per_side(f, &|s| {
            let x = nm(s)?;
            Some(x.watches_after as f64 - x.watches_before as f64)
        });
        rows.push(
            Row::new("node_modules burst: inotify watches added", "watches", b, w)
                .target("watcher 0", |_, w| w == 0.0),
        );

        let tb = |s: &SideResults| s.tracked_burst.clone();
        let edits = tb(&f.watcher).or(tb(&f.baseline)).map_or(0, |x| x.files);
        let (b, w) = per_side(f, &|s| Some(tb(s)?.beyond_settle_s));
        rows.push(
            Row::new(
                format!(
                    "{} tracked edits: s beyond settle until all on remote, {size} tracked",
                    thousands(edits)
                ),
                "s",
                b,
                w,
            )
            .target("watcher <= 1/3 baseline", |b, w| w <= b / 3.0),
        );
        let (b, w) = per_side(f, &|s| Some(tb(s)?.commits as f64));
        rows.push(
            Row::new(
                format!("{} tracked edits: commits", thousands(edits)),
                "commits",
                b,
                w,
            )
            .target("watcher 1", |_, w| w == 1.0),
        );
        let (b, w) = per_side(f, &|s| Some(tb(s)?.cpu_s));
        rows.push(
            Row::new(
                format!("{} tracked edits: CPU", thousands(edits)),
                "s",
                b,
                w,
            )
            .target("watcher <= 1/3 baseline", |b, w| w <= b / 3.0),
        );

        let idle = |s: &SideResults| s.idle.clone();
        let secs = idle(&f.watcher)
            .or(idle(&f.baseline))
            .map_or(0.0, |x| x.seconds);
        let (b, w) = per_side(f, &|s| Some(idle(s)?.cpu_s));
        rows.push(
            Row::new(format!("idle {secs:.0} s: CPU, {size} tracked"), "s", b, w)
                .target("watcher 0", |_, w| w == 0.0),
        );
        let (b, w) = per_side(f, &|s| Some(mib(idle(s)?.rss_kib as f64)));
        let rss_row = Row::new(
            format!("idle: RSS of the process tree, {size} tracked"),
            "MiB",
            b,
            w,
        );
        rows.push(if main == 10_000 {
            rss_row.target("watcher < 16 MiB", |_, w| w < 16.0)
        } else {
            rss_row
        });
        let (b, w) = per_side(f, &|s| Some(mib(idle(s)?.rss_anon_kib as f64)));
        rows.push(Row::new(
            format!("idle: anonymous RSS (no mapped files), {size} tracked"),
            "MiB",
            b,
            w,
        ));
    }
    rows.into_iter().map(Row::into_figure).collect()
}

fn number(v: Option<f64>) -> String {
    match v {
        None => "—".to_owned(),
        Some(v) if v == v.trunc() && v.abs() < 1e9 => format!("{v:.0}"),
        Some(v) if v.abs() >= 100.0 => format!("{v:.0}"),
        Some(v) if v.abs() >= 1.0 => format!("{v:.2}"),
        Some(v) => format!("{v:.3}"),
    }
}

/// The Markdown table BENCHMARKS.md carries.
pub fn table(figures: &[Figure]) -> String {
    let mut out = String::from(
        "| figure | unit | baseline | watcher | watcher / baseline | target | verdict |\n|---|---|---:|---:|---:|---|---|\n",
    );
    for f in figures {
        let verdict = match f.verdict {
            Verdict::Met => "met",
            Verdict::Missed => "**MISSED**",
            Verdict::NotMeasured => "not measured",
            Verdict::NoTarget => "",
        };
        let ratio = f.ratio.map_or("—".to_owned(), |r| format!("{r:.2}"));
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            f.name,
            f.unit,
            number(f.baseline),
            number(f.watcher),
            ratio,
            f.target,
            verdict
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::cases::{OneEdit, Startup};

    fn side(ready: f64, watches: u64, edit_ms: &[f64]) -> SideResults {
        SideResults {
            startups: vec![Startup {
                case: "startup".into(),
                ready_s: ready,
                watches,
                rss_kib: 4096,
                rss_anon_kib: 1024,
                cpu_s: 0.1,
                processes: 1,
            }],
            one_edit: Some(OneEdit {
                beyond_settle_ms: edit_ms.to_vec(),
            }),
            ..SideResults::default()
        }
    }

    fn fixture(n: usize, baseline: SideResults, watcher: SideResults) -> (usize, FixtureResults) {
        (
            n,
            FixtureResults {
                spec: Spec {
                    tracked_files: n,
                    node_modules_files: 0,
                },
                kept_dirs: 10,
                baseline,
                watcher,
            },
        )
    }

    fn find<'a>(figures: &'a [Figure], name: &str) -> &'a Figure {
        figures
            .iter()
            .find(|f| f.name == name)
            .unwrap_or_else(|| panic!("no figure {name}"))
    }

    #[test]
    fn targets_are_judged_on_medians_and_ratios() {
        let results: BTreeMap<_, _> = [
            fixture(
                1_000,
                side(0.5, 70, &[80.0, 90.0, 1000.0]),
                side(0.2, 12, &[30.0, 35.0, 40.0]),
            ),
            fixture(100_000, side(5.0, 900, &[400.0]), side(6.0, 13, &[70.0])),
        ]
        .into_iter()
        .collect();
        let figures = figures(&results, 10_000);

        let edit = find(&figures, "one edit: ms beyond settle, 1k tracked");
        assert_eq!((edit.baseline, edit.watcher), (Some(90.0), Some(35.0)));
        assert_eq!(edit.verdict, Verdict::Met);
        let edit = find(&figures, "one edit: ms beyond settle, 100k tracked");
        assert_eq!(edit.verdict, Verdict::Missed, "70 > 400 / 10");
        let growth = find(&figures, "one edit: 100k tracked / 1k tracked");
        assert_eq!(growth.watcher, Some(2.0));
        assert_eq!(growth.verdict, Verdict::Missed, "2.0 is not < 2");

        assert_eq!(
            find(&figures, "start-up: seconds until ready, 1k tracked").verdict,
            Verdict::Met
        );
        assert_eq!(
            find(&figures, "start-up: seconds until ready, 100k tracked").verdict,
            Verdict::Missed
        );
        assert_eq!(
            find(&figures, "start-up: inotify watches, 1k tracked").verdict,
            Verdict::Met
        );
        assert_eq!(
            find(&figures, "start-up: inotify watches, 100k tracked").verdict,
            Verdict::Missed,
            "13 watches for 10 kept dirs, .git and .git/info"
        );
        let rss = find(&figures, "start-up: RSS of the process tree, 100k tracked");
        assert_eq!(rss.watcher, Some(4.0));
        assert_eq!(rss.verdict, Verdict::Met, "4 MiB <= 32 MiB");
        assert_eq!(
            find(&figures, "start-up: RSS of the process tree, 1k tracked").verdict,
            Verdict::NoTarget
        );
        assert!(
            !figures.iter().any(|f| f.name.contains("burst")),
            "no main-size fixture, so no burst rows"
        );
    }

    #[test]
    fn a_missing_side_is_not_measured_and_the_table_says_so() {
        let results: BTreeMap<_, _> = [fixture(
            1_000,
            side(0.5, 70, &[80.0]),
            SideResults::default(),
        )]
        .into_iter()
        .collect();
        let figures = figures(&results, 1_000);
        let edit = find(&figures, "one edit: ms beyond settle, 1k tracked");
        assert_eq!(edit.verdict, Verdict::NotMeasured);
        assert_eq!(edit.ratio, None);
        let table = table(&figures);
        assert!(
            table.contains("| one edit: ms beyond settle, 1k tracked | ms | 80 | — | — | watcher <= 1/2 baseline | not measured |"),
            "{table}"
        );
    }

    #[test]
    fn memory_at_2k_is_judged_against_the_baseline_and_at_100k_against_32_mib() {
        let with_rss = |mib: u64| {
            let mut s = side(0.5, 10, &[10.0]);
            s.startups[0].rss_kib = mib * 1024;
            s
        };
        let results: BTreeMap<_, _> = [
            fixture(2_000, with_rss(5), with_rss(6)),
            fixture(100_000, with_rss(14), with_rss(31)),
        ]
        .into_iter()
        .collect();
        let figs = figures(&results, 10_000);
        let at_2k = find(&figs, "start-up: RSS of the process tree, 2k tracked");
        assert_eq!(
            (at_2k.verdict, at_2k.target.as_str()),
            (Verdict::Missed, "watcher <= baseline")
        );
        let at_100k = find(&figs, "start-up: RSS of the process tree, 100k tracked");
        assert_eq!(
            at_100k.verdict,
            Verdict::Met,
            "31 MiB <= 32 MiB, whatever the baseline"
        );
        let results: BTreeMap<_, _> = [fixture(2_000, with_rss(6), with_rss(6))]
            .into_iter()
            .collect();
        let figs = figures(&results, 10_000);
        assert_eq!(
            find(&figs, "start-up: RSS of the process tree, 2k tracked").verdict,
            Verdict::Met
        );
    }

    #[test]
    fn median_of_even_and_odd_counts() {
        assert_eq!(median([3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median([4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median([]), None);
    }
}
