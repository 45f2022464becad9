//! Reliability: cloud-core's parsers of untrusted input (manifest, restore form and `.env`
//! render, project tokens, receive-pack report-status) under proptest. None panics; each
//! accepts exactly the well-formed inputs an independent oracle describes.

use std::collections::BTreeSet;

use cloud_core::manifest::{Manifest, validate_name};
use cloud_core::proxy::report_status::{ReportParser, ReportState};
use cloud_core::secrets::{MAX_VALUE_BYTES, RestoreForm, SecretValue, render_env};
use cloud_core::token::TokenSigner;
use cloud_core::user::UserId;
use proptest::prelude::*;

/// Names as people type them into `.env`: mostly valid, often not.
fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        "[A-Za-z_][A-Za-z0-9_.]{0,12}",
        "[0-9 =#'\"$.-][A-Za-z0-9_]{0,6}",
        any::<String>(),
    ]
}

/// The oracle for `Manifest::parse` on a JSON object: version exactly 1, exactly the keys
/// `version` and `env`, `env` a list of unique valid names.
fn manifest_is_well_formed(
    version: &serde_json::Value,
    names: &[serde_json::Value],
    extra: bool,
) -> bool {
    let strings: Option<Vec<&str>> = names.iter().map(|n| n.as_str()).collect();
    let Some(strings) = strings else { return false };
    let unique: BTreeSet<&str> = strings.iter().copied().collect();
    version.as_u64() == Some(1)
        && !extra
        && unique.len() == strings.len()
        && strings.iter().all(|n| validate_name(n).is_ok())
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    prop_oneof![
        Just(serde_json::json!(1)),
        Just(serde_json::json!(1.0)),
        Just(serde_json::json!("1")),
        any::<i64>().prop_map(|n| serde_json::json!(n)),
        Just(serde_json::Value::Null),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(512)
    ))]

    #[test]
    fn manifest_text_never_panics_and_what_it_accepts_is_canonical(text in any::<String>()) {
        if let Ok(manifest) = Manifest::parse(&text) {
            prop_assert!(manifest.env().iter().all(|n| validate_name(n).is_ok()));
            let again = Manifest::parse(&manifest.to_json()).unwrap();
            prop_assert_eq!(again.env(), manifest.env());
        }
    }

    #[test]
    fn manifest_objects_are_accepted_exactly_when_well_formed(
        version in json_value(),
        names in prop::collection::vec(
            prop_oneof![name().prop_map(serde_json::Value::from), Just(serde_json::json!(7))],
            0..6,
        ),
        extra in any::<bool>(),
    ) {
        let mut object = serde_json::json!({"version": version, "env": names});
        if extra {
            object["values"] = serde_json::json!({"A": "leak"});
        }
        let accepted = Manifest::parse(&object.to_string()).is_ok();
        prop_assert_eq!(accepted, manifest_is_well_formed(&version, &names, extra), "{}", object);
    }

    #[test]
    fn a_restore_form_is_accepted_exactly_when_it_matches_and_renders_losslessly(
        listed in prop::collection::btree_set("[A-Z_][A-Z0-9_]{0,6}", 0..5),
        submitted in prop::collection::vec(
            ("[A-Z_][A-Z0-9_]{0,6}", prop_oneof![any::<String>(), "[^\u{0}]{0,20}"]),
            0..6,
        ),
    ) {
        let manifest = Manifest::new(listed.iter().cloned()).unwrap();
        let names: Vec<&String> = submitted.iter().map(|(n, _)| n).collect();
        let unique: BTreeSet<&String> = names.iter().copied().collect();
        let well_formed = unique.len() == names.len()
            && unique.iter().copied().eq(listed.iter())
            && submitted.iter().all(|(_, v)| !v.contains('\0') && v.len() <= MAX_VALUE_BYTES);
        let form = submitted.iter().map(|(n, v)| (n.clone(), SecretValue::from(v.as_str())));
        match RestoreForm::validate(&manifest, form) {
            Ok(form) => {
                prop_assert!(well_formed);
                let env = render_env(&form);
                let read: Vec<(String, String)> = dotenvy::from_read_iter(env.expose().as_bytes())
                    .collect::<Result<_, _>>()
                    .unwrap();
                let mut expected = submitted.clone();
                expected.sort();
                prop_assert_eq!(read, expected);
            }
            Err(_) => prop_assert!(!well_formed),
        }
    }

    #[test]
    fn tokens_that_were_not_minted_are_refused(
        text in prop_oneof![
            any::<String>(),
            "v1\\.[A-Za-z0-9_-]{0,12}\\.[A-Za-z0-9_-]{0,50}",
        ],
    ) {
        let signer = TokenSigner::new(b"a secret of at least thirty-two bytes!!").unwrap();
        if let Some(user) = signer.verify(&text) {
            prop_assert_eq!(signer.mint(&user), text);
        }
    }

    #[test]
    fn user_ids_accept_only_safe_path_components(text in any::<String>()) {
        if let Ok(user) = UserId::parse(&text) {
            let s = user.as_str();
            prop_assert!(!s.is_empty() && s.len() <= 64);
            prop_assert!(s.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)));
            prop_assert!(!s.starts_with('.') && !s.starts_with('-') && !s.contains(".."));
        }
    }

    #[test]
    fn a_report_never_names_a_ref_that_is_not_in_the_response(
        bytes in prop::collection::vec(any::<u8>(), 0..400),
        sideband in any::<bool>(),
    ) {
        let mut parser = ReportParser::new(sideband);
        parser.feed(&bytes);
        if let ReportState::Done(report) = parser.state() {
            let text = String::from_utf8_lossy(&bytes);
            prop_assert!(text.contains("unpack "));
            for r in &report.ok_refs {
                prop_assert!(text.contains(&format!("ok {r}")), "{r:?} from {text:?}");
            }
        }
    }
}
