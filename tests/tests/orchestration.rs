//! Restore and sync end to end: cloud-core's orchestration drives the real `project-watcher
//! restore` and `sync` inside a `LocalSandbox`, with the fake GitLab and the saved project in a
//! real git remote. The restore form asks for exactly the names in `shmastra.json`; a sync
//! ends `ready` or `broken` with the failed step's output.

use std::fs;
use std::path::PathBuf;
use std::time::Duration;

use cloud_core::Config;
use cloud_core::GitLab;
use cloud_core::LocalSandbox;
use cloud_core::SecretValue;
use cloud_core::TokenSigner;
use cloud_core::UserId;
use cloud_core::{
    OrchestrateError, Orchestrator, Persistence, SandboxLayout, SandboxStatus, SyncOutcome,
};
use testkit::fake_gitlab::{FakeGitLab, GROUP_ID, SERVICE_TOKEN};
use testkit::git::{git, hermetic_env, init_bare, init_repo, tree_of, tree_of_add_all};
use testkit::statuses::Statuses;
use testkit::wait::PATIENCE;

struct World {
    tmp: tempfile::TempDir,
    gitlab: FakeGitLab,
}

impl World {
    async fn new() -> World {
        World {
            tmp: tempfile::tempdir().unwrap(),
            gitlab: FakeGitLab::start().await,
        }
    }

    fn repos(&self) -> PathBuf {
        self.tmp.path().join("repos")
    }

    fn home(&self) -> PathBuf {
        self.tmp.path().join("sandbox-home")
    }

    fn orchestrator(&self, enabled: bool) -> Orchestrator<GitLab> {
        self.orchestrator_with(enabled, layout())
    }

    fn orchestrator_with(&self, enabled: bool, layout: SandboxLayout) -> Orchestrator<GitLab> {
        let persistence = enabled.then(|| {
            let config = Config::new(
                &self.gitlab.api_url(),
                GROUP_ID,
                SERVICE_TOKEN.to_owned().into(),
            )
            .unwrap();
            Persistence {
                host: GitLab::new(&config).unwrap(),
                signer: TokenSigner::new(&[9u8; 32]).unwrap(),
                git_url: self.repos().display().to_string(),
            }
        });
        Orchestrator::new(persistence, layout)
    }

    /// The user's saved project, as the watcher left it in the remote.
    fn save_project(&self, user: &str) -> PathBuf {
        let remote = self.repos().join(format!("{user}.git"));
        init_bare(&remote);
        let work = self.tmp.path().join("saved");
        init_repo(&work);
        fs::create_dir_all(work.join("src")).unwrap();
        fs::write(work.join(".gitignore"), "node_modules/\n").unwrap();
        fs::write(work.join("src/index.ts"), "console.log('mine');\n").unwrap();
        fs::write(
            work.join("shmastra.json"),
            "{\n  \"version\": 1,\n  \"env\": [\n    \"DATABASE_URL\",\n    \"OPENAI_API_KEY\"\n  ]\n}\n",
        )
        .unwrap();
        git(&work, ["add", "-A"]);
        git(&work, ["commit", "-qm", "saved"]);
        git(&work, ["push", "-q", remote.to_str().unwrap(), "main"]);
        remote
    }

    /// A fresh sandbox from the template: not a repository yet, with installed dependencies.
    fn sandbox(&self) -> LocalSandbox {
        let project = self.home().join("project");
        fs::create_dir_all(project.join("src")).unwrap();
        fs::create_dir_all(project.join("node_modules/dep")).unwrap();
        fs::write(project.join(".gitignore"), "node_modules/\n").unwrap();
        fs::write(project.join("src/index.ts"), "console.log('template');\n").unwrap();
        fs::write(project.join("src/example.ts"), "the user deleted this\n").unwrap();
        fs::write(project.join("node_modules/dep/index.js"), "dep\n").unwrap();
        let mut sandbox = LocalSandbox::new("sbx", self.home());
        for (name, value) in hermetic_env(&self.home()) {
            if name != "HOME" {
                sandbox = sandbox.with_env(name, value.display().to_string());
            }
        }
        sandbox
    }

    fn log(&self) -> String {
        fs::read_to_string(self.home().join("log")).unwrap_or_default()
    }

    fn project(&self) -> PathBuf {
        self.home().join("project")
    }
}

fn layout() -> SandboxLayout {
    let log = |what: &str| format!("echo {what} >> \"$HOME/log\"");
    SandboxLayout {
        project_dir: "project".into(),
        watcher_env_file: ".project-watcher/.env".into(),
        watcher_bin: testkit::cargo_bin::project_watcher().display().to_string(),
        start_watcher: log("start-watcher"),
        stop_watcher: log("stop-watcher"),
        watcher_running: "false".into(),
        start_dev_server: log("start-dev"),
        stop_dev_server: log("stop-dev"),
        install_cmd: None,
        failure_file: "sync-failure".into(),
        command_timeout: PATIENCE,
        sync_timeout: Duration::from_secs(120),
        health: None,
        exclude: Vec::new(),
    }
}

fn secrets(pairs: &[(&str, &str)]) -> Vec<(String, SecretValue)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), SecretValue::new(*v)))
        .collect()
}

fn alice() -> UserId {
    UserId::parse("alice").unwrap()
}

#[tokio::test]
async fn restore_asks_for_the_manifest_secrets_then_writes_env_and_starts_everything() {
    let world = World::new().await;
    let remote = world.save_project("alice");
    let orchestrator = world.orchestrator(true);
    let sandbox = world.sandbox();

    let plan = orchestrator
        .begin_restore(&sandbox, &alice())
        .await
        .unwrap();

    assert_eq!(plan.secret_names(), ["DATABASE_URL", "OPENAI_API_KEY"]);
    assert_eq!(
        tree_of_add_all(&world.project()),
        tree_of(&remote, "main").unwrap()
    );
    assert!(!world.project().join("src/example.ts").exists());
    assert_eq!(
        fs::read_to_string(world.project().join("node_modules/dep/index.js")).unwrap(),
        "dep\n"
    );
    assert_eq!(world.log(), "", "nothing starts before the form is in");

    let missing_one = orchestrator
        .finish_restore(
            &sandbox,
            &plan,
            secrets(&[("DATABASE_URL", "postgres://db")]),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(missing_one, OrchestrateError::Form(_)),
        "{missing_one}"
    );
    assert!(missing_one.to_string().contains("OPENAI_API_KEY"));
    assert!(!world.project().join(".env").exists());
    assert_eq!(world.log(), "");

    orchestrator
        .finish_restore(
            &sandbox,
            &plan,
            secrets(&[
                ("OPENAI_API_KEY", "sk-test 'quoted' #not-a-comment"),
                ("DATABASE_URL", "postgres://db"),
            ]),
        )
        .await
        .unwrap();

    let env = fs::read_to_string(world.project().join(".env")).unwrap();
    assert!(env.starts_with("DATABASE_URL="), "{env}");
    assert!(env.contains("\nOPENAI_API_KEY="), "{env}");
    assert_eq!(world.log(), "start-dev\nstart-watcher\n");
    assert_eq!(
        git(&world.project(), ["status", "--porcelain"]),
        "",
        ".env stays out of git"
    );
}

#[tokio::test]
async fn a_new_user_gets_no_form_and_keeps_the_template() {
    let world = World::new().await;
    init_bare(&world.repos().join("alice.git"));
    let orchestrator = world.orchestrator(true);
    let sandbox = world.sandbox();

    let plan = orchestrator
        .begin_restore(&sandbox, &alice())
        .await
        .unwrap();

    assert!(plan.secret_names().is_empty());
    assert!(world.project().join("src/example.ts").exists());
    orchestrator
        .finish_restore(&sandbox, &plan, Vec::new())
        .await
        .unwrap();
    assert_eq!(world.log(), "start-dev\nstart-watcher\n");
    assert_eq!(world.gitlab.projects().len(), 1);
}

#[tokio::test]
async fn with_the_feature_off_restore_only_starts_the_dev_server() {
    let world = World::new().await;
    let orchestrator = world.orchestrator(false);
    let sandbox = world.sandbox();

    let plan = orchestrator
        .begin_restore(&sandbox, &alice())
        .await
        .unwrap();
    assert!(plan.secret_names().is_empty());
    orchestrator
        .finish_restore(&sandbox, &plan, Vec::new())
        .await
        .unwrap();

    assert_eq!(world.log(), "start-dev\n");
    assert!(!world.project().join(".git").exists());
    assert!(!world.home().join(".project-watcher").exists());
    assert!(world.gitlab.requests().is_empty());
}

/// A sandbox restored from alice's saved project, running (as far as the log knows).
async fn restored(world: &World) -> (Orchestrator<GitLab>, LocalSandbox, PathBuf) {
    let remote = world.save_project("alice");
    let orchestrator = world.orchestrator(true);
    let sandbox = world.sandbox();
    let plan = orchestrator
        .begin_restore(&sandbox, &alice())
        .await
        .unwrap();
    orchestrator
        .finish_restore(
            &sandbox,
            &plan,
            secrets(&[("DATABASE_URL", "db"), ("OPENAI_API_KEY", "key")]),
        )
        .await
        .unwrap();
    (orchestrator, sandbox, remote)
}

fn push_from_laptop(world: &World, remote: &std::path::Path, path: &str, body: &str) {
    let laptop = world.tmp.path().join("laptop");
    if !laptop.exists() {
        git(
            world.tmp.path(),
            ["clone", "-q", remote.to_str().unwrap(), "laptop"],
        );
        init_repo(&laptop);
    }
    fs::write(laptop.join(path), body).unwrap();
    git(&laptop, ["add", "-A"]);
    git(&laptop, ["commit", "-qm", "from the laptop"]);
    git(&laptop, ["push", "-q", "origin", "main"]);
}

#[tokio::test]
async fn sync_with_unsaved_edits_backs_them_up_and_ends_ready() {
    let world = World::new().await;
    let (orchestrator, sandbox, remote) = restored(&world).await;
    push_from_laptop(&world, &remote, "src/index.ts", "console.log('laptop');\n");
    fs::write(world.project().join("src/index.ts"), "unsaved edit\n").unwrap();
    let statuses = Statuses::default();

    let outcome = orchestrator.sync(&sandbox, &alice(), &statuses).await;

    assert_eq!(
        outcome,
        SyncOutcome::Synced {
            commit: Some(git(&remote, ["rev-parse", "main"]).trim().to_owned())
        },
        "the laptop's commit"
    );
    assert_eq!(
        statuses.all(),
        [
            SandboxStatus::Syncing {
                since: None,
                step: None
            },
            SandboxStatus::Ready
        ]
    );
    assert_eq!(
        tree_of_add_all(&world.project()),
        tree_of(&remote, "main").unwrap()
    );
    let backups = git(
        &world.project(),
        [
            "for-each-ref",
            "--format=%(refname)",
            "refs/project-watcher/backup/",
        ],
    );
    let backup = backups.trim();
    assert!(!backup.is_empty(), "a backup ref");
    assert_eq!(
        git(
            &world.project(),
            ["show", &format!("{backup}:src/index.ts")]
        ),
        "unsaved edit\n"
    );
    assert!(!world.home().join("sync-failure").exists());
    assert!(
        world.log().ends_with("stop-dev\nstart-dev\n"),
        "{}",
        world.log()
    );
}

#[tokio::test]
async fn sync_with_a_failing_install_ends_broken_with_the_install_output() {
    let world = World::new().await;
    let (_, sandbox, remote) = restored(&world).await;
    let mut layout = layout();
    layout.install_cmd = Some("echo 'npm ERR! 404 left-pad not found'; exit 1".into());
    let orchestrator = world.orchestrator_with(true, layout);
    push_from_laptop(&world, &remote, "package.json", "{\"name\": \"app\"}\n");
    let statuses = Statuses::default();

    let outcome = orchestrator.sync(&sandbox, &alice(), &statuses).await;

    let last = statuses.last().unwrap();
    let SandboxStatus::Broken { failure } = last else {
        panic!("expected broken, got {last:?}");
    };
    assert_eq!(
        outcome,
        SyncOutcome::Failed {
            failure: failure.clone()
        }
    );
    assert_eq!(failure.step, "install", "{failure:?}");
    assert_eq!(
        failure.tail, "npm ERR! 404 left-pad not found",
        "{failure:?}"
    );
    let file = fs::read_to_string(world.home().join("sync-failure")).unwrap();
    assert_eq!(file, failure.render());
    let json = serde_json::to_value(SandboxStatus::Broken {
        failure: failure.clone(),
    })
    .unwrap();
    assert_eq!(json["state"], "broken");
    assert_eq!(json["failure"]["step"], "install");
}
