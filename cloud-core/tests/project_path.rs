//! The project path template against the fake GitLab: a deployment whose projects are named
//! `shmastra-user-<first 8 of the user id>` keeps them (found, never created again; git, the
//! history, the saved manifest and the webhook all reach them), new users get a project at the
//! template's path marked with their id, and two users the template gives one path never share
//! a project.

use std::path::Path;

use cloud_core::{
    Config, GitLab, GitLabError, GroupPath, Orchestrator, Persistence, ProjectPath, RepoLocator,
    SandboxLayout, TokenSigner, UserId,
};
use secrecy::SecretString;
use testkit::fake_gitlab::{FakeGitLab, GROUP_ID, GROUP_PATH, SERVICE_TOKEN};
use testkit::git::git;

const LEGACY: &str = "<group>/shmastra-user-<user:8>";
const CAROL: &str = "3f2a9c1e-77b0-4c1e-9d2a-0123456789ab";
const CAROLS_TWIN: &str = "3f2a9c1e-0000-4000-8000-000000000000";

fn client(fake: &FakeGitLab, template: &str) -> GitLab {
    let mut config =
        Config::new(&fake.api_url(), GROUP_ID, SecretString::from(SERVICE_TOKEN)).unwrap();
    config.project_path = ProjectPath::parse(template).unwrap();
    GitLab::new(&config).unwrap()
}

fn user(id: &str) -> UserId {
    UserId::parse(id).unwrap()
}

/// A bare repository whose `main` holds `shmastra.json` naming `OPENAI_API_KEY`.
fn saved_repository(dir: &Path) {
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    testkit::git::init_repo(&work);
    std::fs::write(
        work.join("shmastra.json"),
        "{\n  \"version\": 1,\n  \"env\": [\n    \"OPENAI_API_KEY\"\n  ]\n}\n",
    )
    .unwrap();
    git(&work, ["add", "-A"]);
    git(&work, ["commit", "-qm", "saved"]);
    git(dir, ["clone", "-q", "--bare", "work", "bare.git"]);
}

#[tokio::test]
async fn an_existing_deployments_projects_are_kept() {
    let fake = FakeGitLab::start().await;
    let legacy = format!("{GROUP_PATH}/shmastra-user-3f2a9c1e");
    fake.add_project("shmastra-user-3f2a9c1e");
    let tmp = tempfile::tempdir().unwrap();
    saved_repository(tmp.path());
    fake.set_repository("shmastra-user-3f2a9c1e", &tmp.path().join("bare.git"));
    let gitlab = client(&fake, LEGACY);
    let carol = user(CAROL);

    // Before anyone looked the project up, a push webhook for it is no known user's.
    assert_eq!(GroupPath::owner_of(&gitlab, GROUP_PATH, &legacy), None);

    // The proxy's repository is the existing project; nothing is created.
    let url = gitlab.repo_url(&carol).await.unwrap();
    assert!(
        url.ends_with("/shmastra-users/shmastra-user-3f2a9c1e.git"),
        "{url}"
    );
    assert_eq!(fake.count("POST", "/api/v4/projects"), 0);
    assert_eq!(
        gitlab
            .ensure_user_project(&carol)
            .await
            .unwrap()
            .path_with_namespace,
        legacy
    );
    assert_eq!(fake.count("POST", "/api/v4/projects"), 0);

    // Now the webhook knows whose it is; other paths stay nobody's.
    assert_eq!(
        GroupPath::owner_of(&gitlab, GROUP_PATH, &legacy),
        Some(carol.clone())
    );
    for other in [
        format!("{GROUP_PATH}/{CAROL}"),
        format!("{GROUP_PATH}/shmastra-user-3f2a9c1"),
        "elsewhere/shmastra-user-3f2a9c1e".to_owned(),
    ] {
        assert_eq!(
            GroupPath::owner_of(&gitlab, GROUP_PATH, &other),
            None,
            "{other}"
        );
    }

    // The history and the saved manifest come from it too.
    let orchestrator = Orchestrator::new(
        Some(Persistence {
            host: gitlab.clone(),
            signer: TokenSigner::new(&[7; 32]).unwrap(),
            git_url: "http://127.0.0.1:1/api/git".into(),
        }),
        SandboxLayout::shmastra(),
    );
    let saves = orchestrator.history(&carol, 5).await.unwrap();
    assert_eq!(saves.len(), 1);
    assert_eq!(saves[0].subject, "saved");
    let manifest = orchestrator.saved_manifest(&carol).await.unwrap().unwrap();
    assert_eq!(manifest.form_names(), ["OPENAI_API_KEY"]);
    // A user without a project has no manifest, and none is created for asking.
    assert!(
        orchestrator
            .saved_manifest(&user("dave"))
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(fake.count("POST", "/api/v4/projects"), 0);
}

#[tokio::test]
async fn new_users_get_the_templates_path_and_never_share_a_project() {
    let fake = FakeGitLab::start().await;
    let gitlab = client(&fake, LEGACY);
    let project = gitlab.ensure_user_project(&user(CAROL)).await.unwrap();
    assert_eq!(
        project.path_with_namespace,
        format!("{GROUP_PATH}/shmastra-user-3f2a9c1e")
    );
    let created = fake.projects();
    assert_eq!(created.len(), 1);
    assert_eq!(created[0].description, format!("shmastra user {CAROL}"));

    // The same first 8 characters: the path is carol's, so her twin gets no project.
    let twin = gitlab
        .ensure_user_project(&user(CAROLS_TWIN))
        .await
        .unwrap_err();
    assert!(matches!(twin, GitLabError::ProjectTaken { .. }), "{twin}");
    // Nor on a client that never saw carol: the project's mark says whose it is.
    let fresh = client(&fake, LEGACY);
    let twin = fresh.repo_url(&user(CAROLS_TWIN)).await.unwrap_err();
    assert!(twin.to_string().contains(CAROL), "{twin}");
    assert_eq!(fake.projects().len(), 1);

    // The default template is `<group>/<user>`, as before.
    let plain = client(&fake, "<group>/<user>");
    let alice = plain.ensure_user_project(&user("alice")).await.unwrap();
    assert_eq!(alice.path_with_namespace, format!("{GROUP_PATH}/alice"));
    assert_eq!(
        GroupPath::owner_of(&plain, GROUP_PATH, &alice.path_with_namespace),
        Some(user("alice"))
    );
}
