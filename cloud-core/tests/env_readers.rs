//! The restore form's `.env` against the readers that load it: dotenvy and Node's `dotenv` (the
//! version Next.js ships and the newest, from npm, run by node). Generated values made of every
//! character the quoting rules care about: each one the form accepts is read back exactly by
//! all three; the rest are refused for having no exact form.

use std::process::Command;

use cloud_core::{FormProblem, Manifest, RestoreForm, SecretValue, render_env};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::TestRunner;

const DOTENV_VERSIONS: [&str; 2] = ["16.4.5", "18.0.10"];
const VALUES: usize = 3000;

#[test]
fn every_accepted_value_reads_back_exactly_in_dotenvy_and_node_dotenv() {
    let strategy = proptest::collection::vec(r#"['"\\$#` \n\r\t={}aé]{0,12}"#, VALUES);
    let values = strategy
        .new_tree(&mut TestRunner::deterministic())
        .expect("values")
        .current();
    let mut accepted = Vec::new();
    for value in values {
        let form = RestoreForm::validate(
            &Manifest::new(["K"]).expect("manifest"),
            [("K".to_owned(), SecretValue::new(value.clone()))],
        );
        match form {
            Ok(_) => accepted.push(value),
            Err(refused) => assert_eq!(
                refused.problems,
                [FormProblem::NoExactForm { name: "K".into() }],
                "{value:?}"
            ),
        }
    }
    println!(
        "RELIABILITY env-readers: values={VALUES} accepted={}",
        accepted.len()
    );
    assert!(
        accepted.len() * 3 > VALUES,
        "only {} of {VALUES} accepted",
        accepted.len()
    );

    let dir = tempfile::tempdir().expect("tempdir");
    // A manifest names at most 1000 variables.
    for (chunk, values) in accepted.chunks(500).enumerate() {
        let path = dir.path().join(format!(".env.{chunk}"));
        check_readers(values, &path);
    }
}

/// `values` as one form's `.env` at `path`, read by dotenvy and each `dotenv`.
fn check_readers(values: &[String], path: &std::path::Path) {
    let names: Vec<String> = (0..values.len()).map(|i| format!("K{i:04}")).collect();
    let form = RestoreForm::validate(
        &Manifest::new(names.iter().cloned()).expect("manifest"),
        names
            .iter()
            .zip(values)
            .map(|(k, v)| (k.clone(), SecretValue::new(v.clone()))),
    )
    .expect("every value accepted alone is accepted together");
    std::fs::write(path, render_env(&form).expose()).expect("write .env");
    let expected: serde_json::Map<String, serde_json::Value> = names
        .iter()
        .cloned()
        .zip(values.iter().map(|v| v.clone().into()))
        .collect();

    let dotenvy: serde_json::Map<String, serde_json::Value> = dotenvy::from_path_iter(path)
        .expect("open .env")
        .map(|item| {
            let (k, v) = item.expect("dotenvy reads .env");
            (k, v.into())
        })
        .collect();
    assert_eq!(dotenvy, expected, "dotenvy");
    for version in DOTENV_VERSIONS {
        let module = testkit::npm::package("dotenv", version);
        let out = Command::new("node")
            .arg("-e")
            .arg("process.stdout.write(JSON.stringify(require(process.argv[1]).parse(require('fs').readFileSync(process.argv[2]))))")
            .arg(&module)
            .arg(path)
            .output()
            .expect("node is installed");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let node: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(&out.stdout).expect("dotenv's JSON");
        for name in &names {
            assert_eq!(
                node.get(name),
                expected.get(name),
                "dotenv {version}: {name}"
            );
        }
        assert_eq!(
            node.len(),
            expected.len(),
            "dotenv {version} read other names"
        );
    }
}
