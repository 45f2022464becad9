//! `shmastra-cloud` as an operator runs it: exit codes, one-line diagnoses, `--json` output,
//! against the fake GitLab.

use std::process::Output;

use cloud_core::TokenSigner;
use cloud_core::UserId;
use serde_json::Value;
use testkit::fake_gitlab::{FakeGitLab, GROUP_ID, GROUP_PATH, SERVICE_TOKEN};

const SECRET: &str = "cli-test-secret-cli-test-secret-0123";

async fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_shmastra-cloud"))
        .args(args)
        .env_clear()
        .env("RUST_LOG", "trace")
        .envs(env.iter().copied())
        .output()
        .await
        .unwrap()
}

fn gitlab_env(fake: &FakeGitLab, token: &'static str) -> Vec<(&'static str, String)> {
    vec![
        ("GITLAB_SERVICE_TOKEN", token.to_owned()),
        ("GITLAB_GROUP_ID", GROUP_ID.to_string()),
        ("GITLAB_API_URL", fake.api_url()),
    ]
}

async fn run_gitlab(fake: &FakeGitLab, token: &'static str, args: &[&str]) -> Output {
    let env = gitlab_env(fake, token);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    run(args, &env).await
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8(out.stderr.clone()).unwrap()
}

/// The one diagnosis line on stderr (the other lines are trace logs).
fn diagnosis(out: &Output) -> String {
    let err = stderr(out);
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("shmastra-cloud: error: "))
        .collect();
    assert_eq!(lines.len(), 1, "{err}");
    lines[0].to_owned()
}

fn json(out: &Output) -> Value {
    serde_json::from_str(stdout(out).trim()).unwrap_or_else(|e| panic!("{e}: {}", stdout(out)))
}

#[tokio::test]
async fn gitlab_check_succeeds() {
    let fake = FakeGitLab::start().await;
    let out = run_gitlab(&fake, SERVICE_TOKEN, &["gitlab", "check"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with(&format!("ok: group {GROUP_PATH} (id {GROUP_ID})")),
        "{}",
        stdout(&out)
    );
    assert!(!stderr(&out).contains(SERVICE_TOKEN));

    let out = run_gitlab(&fake, SERVICE_TOKEN, &["--json", "gitlab", "check"]).await;
    let value = json(&out);
    assert_eq!(value["ok"], true);
    assert_eq!(value["group"]["id"], GROUP_ID);
    assert_eq!(value["group"]["full_path"], GROUP_PATH);
}

#[tokio::test]
async fn gitlab_check_diagnoses_membership_and_bad_tokens() {
    let fake = FakeGitLab::start().await;
    fake.set_member(false);
    let out = run_gitlab(&fake, SERVICE_TOKEN, &["gitlab", "check"]).await;
    assert_eq!(out.status.code(), Some(1));
    let line = diagnosis(&out);
    assert!(
        line.contains("not a member") && line.contains("Maintainer"),
        "{line}"
    );

    let out = run_gitlab(
        &fake,
        "glpat-bad-token-do-not-print",
        &["--json", "gitlab", "check"],
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(diagnosis(&out).contains("401"), "{}", stderr(&out));
    let value = json(&out);
    assert_eq!(value["ok"], false);
    assert_eq!(value["exit_code"], 1);
    assert!(value["error"].as_str().unwrap().contains("401"));
    assert!(!stderr(&out).contains("do-not-print") && !stdout(&out).contains("do-not-print"));
}

#[tokio::test]
async fn gitlab_commands_without_configuration_exit_2() {
    let out = run(&["gitlab", "check"], &[]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(diagnosis(&out).contains("GitLab is off: GITLAB_SERVICE_TOKEN is not set"));

    let out = run(&["gitlab", "check"], &[("GITLAB_SERVICE_TOKEN", "glpat-x")]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(diagnosis(&out).contains("GITLAB_GROUP_ID"));

    let out = run(
        &["gitlab", "check"],
        &[
            ("GITLAB_SERVICE_TOKEN", "glpat-x"),
            ("GITLAB_GROUP_ID", "my-group"),
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(2));
    assert!(diagnosis(&out).contains("numeric id"));
}

#[tokio::test]
async fn ensure_project_creates_once() {
    let fake = FakeGitLab::start().await;
    let out = run_gitlab(
        &fake,
        SERVICE_TOKEN,
        &["--json", "gitlab", "ensure-project", "--user", "alice"],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let value = json(&out);
    assert_eq!(
        value["project"]["path_with_namespace"],
        format!("{GROUP_PATH}/alice")
    );
    assert!(
        value["project"]["http_url_to_repo"]
            .as_str()
            .unwrap()
            .ends_with("/alice.git")
    );

    let out = run_gitlab(
        &fake,
        SERVICE_TOKEN,
        &["gitlab", "ensure-project", "--user", "alice"],
    )
    .await;
    assert_eq!(out.status.code(), Some(0));
    assert!(
        stdout(&out).starts_with(&format!("ok: project {GROUP_PATH}/alice")),
        "{}",
        stdout(&out)
    );
    assert_eq!(fake.count("POST", "/api/v4/projects"), 1);
    assert_eq!(fake.projects().len(), 1);
}

#[tokio::test]
async fn ensure_project_rejects_a_bad_user_id_without_calling_gitlab() {
    let fake = FakeGitLab::start().await;
    let out = run_gitlab(
        &fake,
        SERVICE_TOKEN,
        &["gitlab", "ensure-project", "--user", "../etc"],
    )
    .await;
    assert_eq!(out.status.code(), Some(2));
    assert!(diagnosis(&out).contains("invalid user id"));
    assert!(fake.requests().is_empty());
}

#[tokio::test]
async fn token_mint_prints_the_token_alone() {
    let out = run(
        &["token", "mint", "--user", "alice"],
        &[("SHMASTRA_TOKEN_SECRET", SECRET)],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let printed = stdout(&out);
    let token = printed.strip_suffix('\n').unwrap();
    assert!(!token.contains(char::is_whitespace));
    let signer = TokenSigner::new(SECRET.as_bytes()).unwrap();
    assert_eq!(signer.verify(token), Some(UserId::parse("alice").unwrap()));
    assert!(!stderr(&out).contains(SECRET));

    let out = run(
        &["--json", "token", "mint", "--user", "alice"],
        &[("SHMASTRA_TOKEN_SECRET", SECRET)],
    )
    .await;
    let value = json(&out);
    assert_eq!(value["user"], "alice");
    assert_eq!(value["token"], token);
}

#[tokio::test]
async fn token_mint_without_a_usable_secret_exits_2() {
    let out = run(&["token", "mint", "--user", "alice"], &[]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(diagnosis(&out).contains("SHMASTRA_TOKEN_SECRET is not set"));
    assert!(stdout(&out).is_empty());

    let out = run(
        &["token", "mint", "--user", "alice"],
        &[("SHMASTRA_TOKEN_SECRET", "short")],
    )
    .await;
    assert_eq!(out.status.code(), Some(2));
    assert!(diagnosis(&out).contains("at least 32"));
}

#[tokio::test]
async fn usage_errors_exit_2() {
    let out = run(&["token", "mint"], &[]).await;
    assert_eq!(out.status.code(), Some(2));
    let out = run(&["nonsense"], &[]).await;
    assert_eq!(out.status.code(), Some(2));
}
