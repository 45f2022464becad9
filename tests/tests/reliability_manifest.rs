//! Reliability across the parts: whatever a user's env files hold, the `shmastra.json` the
//! watcher writes for them (its real `manifest::sync`, on disk) is one cloud-core accepts and
//! lists every name dotenvy reads (a manifest the cloud refused would make the project
//! impossible to restore; a name left out would lose its secret at the next restore).
//!
//! The expected names are computed here, from dotenvy itself and the contract's rules as
//! `design.md` words them, never with the watcher's own parsing.

use std::collections::BTreeMap;

use cloud_core::Manifest;
use proptest::prelude::*;

/// The names dotenvy reads from `text` (a UTF-8 byte order mark first, as Windows editors write
/// it, is no part of the first name) that the cloud can ask for: `[A-Za-z_][A-Za-z0-9_.]*`, at
/// most 256 bytes. Sorted, each once.
fn expected_names(text: &str) -> Vec<String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut names: Vec<String> = dotenvy::from_read_iter(text.as_bytes())
        .filter_map(|item| item.ok().map(|(name, _value)| name))
        .filter(|name| {
            let mut bytes = name.bytes();
            name.len() <= 256
                && bytes
                    .next()
                    .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
                && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Whether a root file is an env file with its own list: `.env.<anything>` but the templates
/// (`.env.example`, `.env.sample`, `.env.template`, also after another suffix), which are saved.
fn is_secret_env_file(name: &str) -> bool {
    name.strip_prefix(".env.").is_some_and(|rest| {
        let template = ["example", "sample", "template"]
            .iter()
            .any(|t| rest == *t || rest.ends_with(&format!(".{t}")));
        !rest.is_empty() && !template
    })
}

/// `.env` lines as people write them, well-formed or not.
fn env_line() -> impl Strategy<Value = String> {
    prop_oneof![
        "[A-Za-z_][A-Za-z0-9_.]{0,10}=[a-z0-9 ]{0,10}",
        "export [A-Za-z_][A-Za-z0-9_]{0,8}='[^']{0,10}'",
        "[A-Za-z0-9_.]{1,8}=\"[^\"\\\\]{0,10}\"",
        "[0-9][A-Za-z0-9_]{0,6}=x",
        "#[^\n]{0,20}",
        "[^\n]{0,30}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(1024)
    ))]

    #[test]
    fn every_manifest_the_watcher_writes_is_one_the_cloud_accepts(
        lines in prop::collection::vec(env_line(), 0..8),
        files in prop::collection::btree_map(
            "\\.env\\.(local|production|development\\.local|example|sample|template|production\\.example|[a-z]{1,6})",
            prop::collection::vec(env_line(), 0..4),
            0..3,
        ),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let text = lines.join("\n");
        std::fs::write(dir.path().join(".env"), &text).unwrap();
        let names = expected_names(&text);
        let mut env_files = BTreeMap::new();
        for (file, lines) in files {
            let text = lines.join("\n");
            std::fs::write(dir.path().join(&file), &text).unwrap();
            if is_secret_env_file(&file) {
                env_files.insert(file, expected_names(&text));
            }
        }
        project_watcher::manifest::sync(dir.path()).unwrap();
        let parsed = Manifest::read(&dir.path().join(cloud_core::contract::MANIFEST_FILE));
        prop_assert!(parsed.is_ok(), "{text:?}: {parsed:?}");
        let manifest = parsed.unwrap();
        prop_assert_eq!(manifest.env(), names.as_slice());
        prop_assert_eq!(manifest.env_files(), &env_files);
    }
}
