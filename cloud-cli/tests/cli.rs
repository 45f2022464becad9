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

#[tokio::test]
async fn fsck_names_the_upstream_repositories_missing_objects() {
    use testkit::git::{git, init_bare, init_repo};
    let tmp = tempfile::tempdir().unwrap();
    let upstream = tmp.path().join("repos");
    let work = tmp.path().join("work");
    init_repo(&work);
    std::fs::write(work.join("a.txt"), "a\n").unwrap();
    git(&work, ["add", "-A"]);
    git(&work, ["commit", "-qm", "first"]);
    for user in ["alice", "bob", "carol"] {
        let bare = upstream.join(format!("{user}.git"));
        init_bare(&bare);
        git(&bare, ["config", "receive.unpackLimit", "1000"]);
        if user != "carol" {
            git(&work, ["push", "-q", bare.to_str().unwrap(), "main"]);
        }
    }
    std::fs::create_dir_all(upstream.join(".shmastra-hooks")).unwrap();
    let blob = git(&work, ["rev-parse", "HEAD:a.txt"]);
    let blob = blob.trim();
    let lost = upstream
        .join("bob.git/objects")
        .join(&blob[..2])
        .join(&blob[2..]);
    std::fs::remove_file(&lost).unwrap();
    let path = std::env::var("PATH").unwrap();
    let env = [("PATH", path.as_str())];
    let dir = upstream.to_str().unwrap();

    let out = run(&["fsck", "--upstream-dir", dir], &env).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let said = diagnosis(&out);
    assert!(
        said.contains("1 of 3 repositories are not whole: bob: "),
        "{said}"
    );
    assert!(said.contains(blob), "names the missing object: {said}");
    assert!(!said.contains("alice") && !said.contains("carol"), "{said}");

    // Written back (as the sandbox's watcher does for a path remote), all are whole.
    let bob = upstream.join("bob.git");
    let object = tokio::process::Command::new("git")
        .args(["hash-object", "-w", "--stdin"])
        .current_dir(&bob)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut object = object;
    {
        use tokio::io::AsyncWriteExt as _;
        let mut stdin = object.stdin.take().unwrap();
        stdin.write_all(b"a\n").await.unwrap();
    }
    assert!(object.wait().await.unwrap().success());
    let out = run(&["--json", "fsck", "--upstream-dir", dir], &env).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let result = json(&out);
    assert_eq!(result["repositories"], 3);
    assert_eq!(
        result["users"],
        serde_json::json!(["alice", "bob", "carol"])
    );

    let missing = run(&["fsck", "--upstream-dir", "/nonexistent-upstream"], &env).await;
    assert_eq!(missing.status.code(), Some(2));
}

/// The top-level help of a binary: what its exit codes mean and every env var it reads,
/// each also in the README.
#[tokio::test]
async fn help_names_the_exit_codes_every_variable_and_what_serve_serves() {
    let help = stdout(&run(&["--help"], &[]).await);
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("the README");
    assert!(help.contains("Exit codes: 0"), "{help}");
    for var in [
        "GITLAB_API_URL",
        "GITLAB_GROUP_ID",
        "GITLAB_SERVICE_TOKEN",
        "GITLAB_PROJECT_PATH",
        "GITLAB_WEBHOOK_SECRET",
        "SHMASTRA_TOKEN_SECRET",
        "SHMASTRA_TOKEN_STATE",
        "SHMASTRA_API_KEY",
        "SHMASTRA_PUBLIC_URL",
        "DATABASE_URL",
        "E2B_API_KEY",
        "E2B_TEMPLATE",
        "E2B_API_URL",
        "E2B_DOMAIN",
        "E2B_SANDBOX_URL",
        "RUST_LOG",
    ] {
        assert!(help.contains(var), "--help lacks {var}");
        assert!(readme.contains(var), "the README lacks {var}");
    }
    let serve = stdout(&run(&["serve", "--help"], &[]).await);
    assert!(serve.contains("workspace page"), "{serve}");
    for sub in [
        &["gitlab", "ensure-project"][..],
        &["token", "mint"],
        &["token", "revoke"],
        &["token", "rotate"],
        &["login-link"],
        &["sandboxes", "provision"],
    ] {
        let args: Vec<&str> = sub.iter().copied().chain(["--help"]).collect();
        let text = stdout(&run(&args, &[]).await);
        let user = text
            .lines()
            .find(|l| l.trim_start().starts_with("--user"))
            .unwrap_or_else(|| panic!("{sub:?}: no --user in {text}"));
        assert!(user.contains("id"), "{sub:?}: --user undescribed: {user:?}");
    }
}

#[tokio::test]
async fn login_link_refuses_a_zero_ttl_and_says_a_day_as_1d() {
    let state = tempfile::tempdir().unwrap();
    let state = state.path().to_str().unwrap();
    let env = [
        ("SHMASTRA_TOKEN_SECRET", SECRET),
        ("SHMASTRA_TOKEN_STATE", state),
    ];
    let zero = run(&["login-link", "--user", "alice", "--ttl", "0s"], &env).await;
    assert_eq!(zero.status.code(), Some(2), "{}", stderr(&zero));
    assert!(
        stderr(&zero).contains("more than zero"),
        "{}",
        stderr(&zero)
    );
    let long = run(&["login-link", "--user", "alice", "--ttl", "25h"], &env).await;
    assert_eq!(long.status.code(), Some(2), "{}", stderr(&long));
    let said = diagnosis(&long);
    assert!(said.contains("at most 1d (asked for 1d 1h)"), "{said}");
    let fine = run(&["login-link", "--user", "alice", "--ttl", "1d"], &env).await;
    assert_eq!(fine.status.code(), Some(0), "{}", stderr(&fine));
}
