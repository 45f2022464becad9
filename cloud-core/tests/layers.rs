//! Tidy: cloud-core's modules stay in their layers. Every `crate::` path in the sources (use
//! lines, inline paths, test code; not comments) names the top-level module it reaches, and a
//! module may reach only its own layer or a lower one, with no cycle among the modules. A new
//! module must be given a layer here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Lowest first. Vocabulary: the words every layer shares. IO: tokens, secrets, sandboxes, the
/// state store, GitLab, E2B, git over CGI. Services: the git proxy, the webhook, orchestration.
/// Adapters: GitLab and the embedded upstream wired to every service's seams. Top: the
/// workspace page and the ready-made server.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "vocabulary",
        &[
            "admission",
            "client",
            "env_names",
            "event",
            "host",
            "patch",
            "project_path",
            "status",
            "user",
        ],
    ),
    (
        "io",
        &[
            "config",
            "e2b",
            "gitlab",
            "http_backend",
            "nonces",
            "process_group",
            "provider",
            "sandbox",
            "secrets",
            "store",
            "token",
        ],
    ),
    ("services", &["fleet", "orchestrate", "proxy", "webhook"]),
    ("adapters", &["hosts"]),
    ("top", &["api", "serve", "web"]),
];

#[test]
fn cloud_core_modules_import_only_their_own_layer_or_lower_ones() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut sources: BTreeMap<String, String> = BTreeMap::new();
    read_sources(&src, &src, &mut sources);
    let problems = check(LAYERS, &sources);
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

#[test]
fn the_check_finds_upward_imports_cycles_root_imports_and_unplaced_modules() {
    let layers: &[(&str, &[&str])] = &[("low", &["a", "b"]), ("high", &["c", "e"])];
    let case = |files: &[(&str, &str)]| {
        let sources = files
            .iter()
            .map(|(m, s)| (m.to_string(), s.to_string()))
            .collect();
        check(layers, &sources)
    };
    let fine = case(&[
        ("a", "use crate::b::X;\n// crate::c::Y in a comment\n"),
        ("b", "pub struct X;"),
        ("c", "use crate::{a::Z, b};\nfn f() { crate::c::g(); }"),
        ("e", "fn f() { let _ = crate::e::h(); }"),
    ]);
    assert_eq!(fine, Vec::<String>::new());
    let problems = case(&[
        ("a", "use crate::b::X;\nfn f() { let _ = crate::c::Y; }"),
        ("b", "use crate::{\n    a::Z,\n};"),
        ("c", "use crate::UserId;"),
        ("d", ""),
    ]);
    assert_eq!(
        problems,
        [
            "a (low) imports c (high)",
            "c imports crate::UserId through the crate root: name its module",
            "d is in no layer",
            "e is listed in a layer but has no source",
            "cycle: a -> b -> a",
        ]
    );
}

/// Every `.rs` file under `dir`, keyed by its top-level module below `src`, concatenated.
fn read_sources(src: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            read_sources(src, &path, out);
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let relative = path.strip_prefix(src).expect("under src");
        let first = relative.components().next().expect("a component");
        let module = first
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_owned();
        if module == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read source");
        out.entry(module).or_default().push_str(&text);
    }
}

/// What is wrong with `sources` (top-level module -> its code) against `layers`.
fn check(layers: &[(&str, &[&str])], sources: &BTreeMap<String, String>) -> Vec<String> {
    let layer_of: BTreeMap<&str, usize> = layers
        .iter()
        .enumerate()
        .flat_map(|(i, (_, modules))| modules.iter().map(move |m| (*m, i)))
        .collect();
    let mut problems = Vec::new();
    let mut edges: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for (module, text) in sources {
        let Some(&from) = layer_of.get(module.as_str()) else {
            problems.push(format!("{module} is in no layer"));
            continue;
        };
        for target in crate_paths(text) {
            if target == *module {
                continue;
            }
            let Some(&to) = layer_of.get(target.as_str()) else {
                problems.push(format!(
                    "{module} imports crate::{target} through the crate root: name its module"
                ));
                continue;
            };
            if to > from {
                problems.push(format!(
                    "{module} ({}) imports {target} ({})",
                    layers[from].0, layers[to].0
                ));
            }
            edges.entry(module).or_default().insert(target);
        }
    }
    for module in layer_of.keys() {
        if !sources.contains_key(*module) {
            problems.push(format!("{module} is listed in a layer but has no source"));
        }
    }
    problems.sort();
    problems.dedup();
    problems.extend(cycles(&edges));
    problems
}

/// The first segment of every `crate::` path in `text` outside comments (`crate::{a, b::c}`
/// gives `a` and `b`).
fn crate_paths(text: &str) -> Vec<String> {
    let code: String = text
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut found = Vec::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut item = String::new();
            let mut first = true;
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 1 => {
                        first = true;
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 {
                    break;
                }
                if depth == 1 && first {
                    if c.is_alphanumeric() || c == '_' {
                        item.push(c);
                    } else if !item.is_empty() {
                        found.push(std::mem::take(&mut item));
                        first = false;
                    }
                }
            }
            if first && !item.is_empty() {
                found.push(item);
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                found.push(name);
            }
        }
    }
    found
}

/// Each cycle among the modules, as `a -> b -> a`, found by a depth-first walk.
fn cycles(edges: &BTreeMap<&str, BTreeSet<String>>) -> Vec<String> {
    fn visit<'a>(
        node: &'a str,
        edges: &'a BTreeMap<&str, BTreeSet<String>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
        found: &mut Vec<String>,
    ) {
        if let Some(start) = path.iter().position(|n| *n == node) {
            let mut cycle: Vec<&str> = path[start..].to_vec();
            cycle.push(node);
            found.push(format!("cycle: {}", cycle.join(" -> ")));
            return;
        }
        if !done.insert(node) {
            return;
        }
        path.push(node);
        for next in edges.get(node).into_iter().flatten() {
            visit(next, edges, path, done, found);
        }
        path.pop();
    }
    let mut found = Vec::new();
    let mut done = BTreeSet::new();
    for node in edges.keys() {
        visit(node, edges, &mut Vec::new(), &mut done, &mut found);
    }
    found
}
