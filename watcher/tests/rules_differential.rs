//! Property: the watcher's reading of ignore rules is git's. Random `.gitignore` lines built
//! from the characters that make globs interesting, on a tree of awkward names; the oracle is
//! real git (`git ls-files -o -i --exclude-standard`), never a model of it.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use project_watcher::filter::Filter;
use proptest::prelude::*;
use testkit::git::{git, init_repo};

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
];

const PIECES: &[&str] = &[
    "*", "**", "?", "[", "]", "[!a]", "[a-c]", "!", "\\", "/", "{", "}", ",", "a", "b", "c", "js",
    "map", ".", "x", "deep", "build", "#", " ", "txt", "TXT",
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
];

fn line() -> impl Strategy<Value = String> {
    let pieces = prop::collection::vec(prop::sample::select(PIECES), 1..5).prop_map(|p| p.concat());
    prop_oneof![
        3 => prop::sample::select(RULES).prop_map(str::to_owned),
        1 => pieces.clone(),
        1 => (prop::sample::select(RULES), pieces).prop_map(|(r, p)| format!("{r}{p}")),
    ]
}

/// Cases where git ignored at least one file: the comparison had something to compare.
static REACHED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        max_shrink_iters: 200,
        ..ProptestConfig::default()
    })]

    #[test]
    fn filter_ignores_exactly_what_git_ignores(
        lines in prop::collection::vec(line(), 1..5),
        nested in prop::option::of(prop::collection::vec(line(), 1..3)),
        ignore_case in prop::bool::weighted(0.2),
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("p");
        init_repo(&root);
        if ignore_case {
            git(&root, ["config", "core.ignoreCase", "true"]);
        }
        for file in FILES {
            let path = root.join(file);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, "x").unwrap();
        }
        fs::write(root.join(".gitignore"), lines.join("\n") + "\n").unwrap();
        if let Some(nested) = &nested {
            fs::write(root.join("x/.gitignore"), nested.join("\n") + "\n").unwrap();
        }
        let git_ignored: BTreeSet<String> =
            git(&root, ["ls-files", "-o", "-i", "--exclude-standard", "-z"])
                .split('\0')
                .filter(|p| !p.is_empty())
                .map(str::to_owned)
                .collect();
        let (mut filter, _) = Filter::new(&root, &root.join(".git"), None, ignore_case);
        for dir in ["", "x", "x/deep", "x/deep/y", "y", "y/x", "build", "sub"] {
            filter.load_dir(Path::new(dir));
        }
        let mut ours = BTreeSet::new();
        for file in FILES.iter().chain([".gitignore"].iter()) {
            if !filter.is_kept(&PathBuf::from(file), false) {
                ours.insert((*file).to_owned());
            }
        }
        if nested.is_some() && !filter.is_kept(Path::new("x/.gitignore"), false) {
            ours.insert("x/.gitignore".to_owned());
        }
        // The walk's way: each path's directories and then itself judged one listing at a
        // time by that directory's rules, looked up once.
        let mut by_listing = BTreeSet::new();
        for file in FILES.iter().chain([".gitignore", "x/.gitignore"].iter()) {
            if *file == "x/.gitignore" && nested.is_none() {
                continue;
            }
            if !kept_by_listings(&filter, Path::new(file)) {
                by_listing.insert((*file).to_owned());
            }
        }
        prop_assert_eq!(&by_listing, &git_ignored, "by listing: lines {:?} nested {:?}", lines, nested);
        if !git_ignored.is_empty() {
            let reached = REACHED.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            if reached.is_multiple_of(64) {
                eprintln!("rules differential: {reached} cases where git ignored something");
            }
        }
        prop_assert_eq!(ours, git_ignored, "lines {:?} nested {:?}", lines, nested);
    }
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
