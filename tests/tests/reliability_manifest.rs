//! Reliability across the parts: whatever a user's env files hold, the `shmastra.json` the
//! watcher writes for them (its real `manifest::sync`, on disk) is one cloud-core accepts and
//! lists every name dotenvy reads (a manifest the cloud refused would make the project
//! impossible to restore; a name left out would lose its secret at the next restore).

use cloud_core::Manifest;
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
        let dir = tempfile::tempdir().unwrap();
        let text = lines.join("\n");
        std::fs::write(dir.path().join(".env"), &text).unwrap();
        let (names, _malformed) = project_watcher::manifest::env_names(text.as_bytes());
        let mut env_files = std::collections::BTreeMap::new();
        for (file, lines) in files {
            let text = lines.join("\n");
            std::fs::write(dir.path().join(&file), &text).unwrap();
            if cloud_core::contract::manifest::is_env_file_name(&file) {
                env_files.insert(file, project_watcher::manifest::env_names(text.as_bytes()).0);
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
