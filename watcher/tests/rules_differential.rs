//! Property: the watcher's reading of ignore rules is git's. Random `.gitignore` lines built
//! from the characters and bytes that make globs interesting (stars of any count, classes and
//! `[:class:]`es, braces, escapes, bytes that are not UTF-8, CRs), in the top's `.gitignore`
//! and a nested one (sometimes a symbolic link, which git does not follow), on a tree of
//! awkward names; the oracle is real git (`git ls-files -o -i --exclude-standard`), never a
//! model of it.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use project_watcher::filter::Filter;
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};
use testkit::git::{git, init_repo};
use testkit::proptest_check::assert_share;

const FILES: &[&str] = &[
    "a.js",
    "a.map",
    "a.{js,map}",
    "[abc",
    "abc",
    "b",
    "#hash",
    "!bang",
    " lead",
    "trail ",
    "A.TXT",
    "x/deep/y/z.txt",
    "x/a.js",
    "x/abc",
    "y/x/a.js",
    "build/out.txt",
    "sub/build",
    "q?.txt",
    "star*.txt",
    "back\\slash",
    "a{b",
    "x/a/b/z.txt",
    "ab/b",
    "a/c/b",
    "Up.txt",
    "f\u{fffd}x",
    "cr\r",
];

/// Names that are not UTF-8 (made from bytes).
const BYTE_FILES: &[&[u8]] = &[b"f\xffx", b"x/\xfe.js"];

const PIECES: &[&str] = &[
    "*",
    "**",
    "***",
    "?",
    "[",
    "]",
    "[!a]",
    "[a-c]",
    "!",
    "\\",
    "/",
    "{",
    "}",
    ",",
    "a",
    "b",
    "c",
    "js",
    "map",
    ".",
    "x",
    "deep",
    "build",
    "#",
    " ",
    "txt",
    "TXT",
    "[[:alpha:]]",
    "[[:upper:]]",
    "[:digit:]]",
    "[[:nope:]]",
    "\r",
    "\u{fffd}",
];

/// Whole rules people write (each matches some of [`FILES`]), to be mixed with random pieces.
const RULES: &[&str] = &[
    "*.{js,map}",
    "a.*",
    "*.js",
    "[abc",
    "[ab]bc",
    "x/",
    "**/deep/**",
    "/b",
    "!a.js",
    "\\#hash",
    "\\!bang",
    "\\ lead",
    "trail\\ ",
    "A.TXT",
    "q?.txt",
    "star\\*.txt",
    "back\\\\slash",
    "build/",
    "sub/build",
    "x/**/z.txt",
    "y/**",
    "!x/",
    "a.{js,map}",
    "***/z.txt",
    "x/***/z.txt",
    "a**/b",
    "a{b",
    "[[:upper:]]*",
    "*.[[:alpha:]]s",
];

/// Whole rules as bytes that are not UTF-8.
const BYTE_RULES: &[&[u8]] = &[b"f\xff*", b"*\xfe*", b"x/\xfe.js", b"!f\xffx"];

fn line() -> impl Strategy<Value = Vec<u8>> {
    let pieces = prop::collection::vec(prop::sample::select(PIECES), 1..5).prop_map(|p| p.concat());
    prop_oneof![
        3 => prop::sample::select(RULES).prop_map(|r| r.as_bytes().to_vec()),
        1 => prop::sample::select(BYTE_RULES).prop_map(<[u8]>::to_vec),
        1 => pieces.clone().prop_map(String::into_bytes),
        1 => (prop::sample::select(RULES), pieces).prop_map(|(r, p)| format!("{r}{p}").into_bytes()),
    ]
}

fn joined(lines: &[Vec<u8>]) -> Vec<u8> {
    let mut text = lines.join(&b'\n');
    text.push(b'\n');
    text
}

fn all_files() -> impl Iterator<Item = &'static [u8]> {
    FILES
        .iter()
        .map(|f| f.as_bytes())
        .chain(BYTE_FILES.iter().copied())
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

/// Runs the property; counts the cases where git ignored at least one file (the comparison had
/// something to compare) and fails below a minimum share of them, as
/// `testkit::proptest_check::check` does. Prints `RELIABILITY rules-differential: ...` with the
/// seconds it took.
#[test]
fn filter_ignores_exactly_what_git_ignores() {
    let started = Instant::now();
    let (run, reached) = (AtomicU64::new(0), AtomicU64::new(0));
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        max_shrink_iters: 200,
        source_file: Some(file!()),
        failure_persistence: Some(Box::new(FileFailurePersistence::SourceParallel(
            "proptest-regressions",
        ))),
        ..Config::default()
    });
    let strategy = (
        prop::collection::vec(line(), 1..5),
        prop::option::of(prop::collection::vec(line(), 1..3)),
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.2),
    );
    let outcome = runner.run(
        &strategy,
        |(lines, nested, nested_is_a_link, ignore_case)| {
            let git_ignored = one_case(&lines, nested.as_deref(), nested_is_a_link, ignore_case)?;
            run.fetch_add(1, Ordering::Relaxed);
            if !git_ignored.is_empty() {
                reached.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        },
    );
    if let Err(e) = outcome {
        panic!("{e}\n{runner}");
    }
    let (run, reached) = (run.into_inner(), reached.into_inner());
    println!(
        "RELIABILITY rules-differential: cases={run} git_ignored_something={reached} seconds={}",
        started.elapsed().as_secs()
    );
    assert_share(
        "rules-differential",
        "a file git ignores",
        reached,
        run,
        0.5,
    );
}

/// One case: the files of [`FILES`] and [`BYTE_FILES`] under these rules (the nested ones in
/// `x/.gitignore`, maybe a symbolic link to them); returns what git ignored, after checking
/// that the filter (both ways of asking it) ignores exactly that.
fn one_case(
    lines: &[Vec<u8>],
    nested: Option<&[Vec<u8>]>,
    nested_is_a_link: bool,
    ignore_case: bool,
) -> Result<BTreeSet<Vec<u8>>, TestCaseError> {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("p");
    init_repo(&root);
    if ignore_case {
        git(&root, ["config", "core.ignoreCase", "true"]);
    }
    for file in all_files() {
        let path = root.join(OsStr::from_bytes(file));
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, "x").unwrap();
    }
    fs::write(root.join(".gitignore"), joined(lines)).unwrap();
    if let Some(nested) = nested {
        if nested_is_a_link {
            fs::write(tmp.path().join("nested-rules"), joined(nested)).unwrap();
            std::os::unix::fs::symlink(tmp.path().join("nested-rules"), root.join("x/.gitignore"))
                .unwrap();
        } else {
            fs::write(root.join("x/.gitignore"), joined(nested)).unwrap();
        }
    }
    let out = testkit::git::command(&root)
        .args([
            "-c",
            "core.quotePath=false",
            "ls-files",
            "-o",
            "-i",
            "--exclude-standard",
            "-z",
        ])
        .output()
        .unwrap();
    prop_assert!(out.status.success());
    let git_ignored: BTreeSet<Vec<u8>> = out
        .stdout
        .split(|&b| b == 0)
        .filter(|p| !p.is_empty())
        .map(<[u8]>::to_vec)
        .collect();
    let (mut filter, _) = Filter::new(&root, &root.join(".git"), None, ignore_case);
    for dir in [
        "", "x", "x/deep", "x/deep/y", "x/a", "x/a/b", "y", "y/x", "build", "sub", "ab", "a", "a/c",
    ] {
        filter.load_dir(Path::new(dir));
    }
    let candidates: Vec<&[u8]> = all_files()
        .chain([b".gitignore".as_slice()])
        .chain(nested.is_some().then_some(b"x/.gitignore".as_slice()))
        .collect();
    let mut ours = BTreeSet::new();
    for file in &candidates {
        if !filter.is_kept(Path::new(OsStr::from_bytes(file)), false) {
            ours.insert(file.to_vec());
        }
    }
    // The walk's way: each path's directories and then itself judged one listing at a
    // time by that directory's rules, looked up once.
    let mut by_listing = BTreeSet::new();
    for file in &candidates {
        if !kept_by_listings(&filter, Path::new(OsStr::from_bytes(file))) {
            by_listing.insert(file.to_vec());
        }
    }
    let show = |l: &[Vec<u8>]| {
        l.iter()
            .map(|l| String::from_utf8_lossy(l).into_owned())
            .collect::<Vec<_>>()
    };
    prop_assert_eq!(
        &by_listing,
        &git_ignored,
        "by listing: lines {:?} nested {:?} (link: {})",
        show(lines),
        nested.map(show),
        nested_is_a_link
    );
    prop_assert_eq!(
        &ours,
        &git_ignored,
        "lines {:?} nested {:?} (link: {})",
        show(lines),
        nested.map(show),
        nested_is_a_link
    );
    Ok(git_ignored)
}

/// Whether a top-down walk keeps `rel`: every directory on the way and then `rel` itself are
/// judged by [`Filter::dir_rules`] of their parent.
fn kept_by_listings(filter: &Filter, rel: &Path) -> bool {
    let mut dir = PathBuf::new();
    let names: Vec<_> = rel.iter().collect();
    for (i, name) in names.iter().enumerate() {
        let is_dir = i + 1 < names.len();
        if filter.dir_rules(&dir).is_ignored(name, is_dir) {
            return false;
        }
        dir.push(name);
    }
    true
}
