//! Reliability across the parts: whatever a user's `.env` holds, the `shmastra.json` the
//! watcher writes from it is one cloud-core accepts, listing the same names (a manifest the
//! cloud refused would make the project impossible to restore).

use cloud_core::manifest::Manifest;
use proptest::prelude::*;

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
            "\\.env\\.(local|production|development\\.local|[a-z]{1,6})",
            prop::collection::vec(env_line(), 0..4),
            0..3,
        ),
    ) {
        let text = lines.join("\n");
        let (names, _malformed) = project_watcher::manifest::env_names(text.as_bytes());
        let env_files: std::collections::BTreeMap<String, Vec<String>> = files
            .into_iter()
            .filter(|(file, _)| project_watcher::filter::is_env_file_name(file))
            .map(|(file, lines)| {
                let text = lines.join("\n");
                (file, project_watcher::manifest::env_names(text.as_bytes()).0)
            })
            .collect();
        let written = project_watcher::manifest::render_with_files(&names, &env_files);
        let parsed = Manifest::parse(&written);
        prop_assert!(parsed.is_ok(), "{text:?} -> {written}: {parsed:?}");
        let manifest = parsed.unwrap();
        prop_assert_eq!(manifest.env(), names.as_slice());
        prop_assert_eq!(manifest.env_files(), &env_files);
    }
}
