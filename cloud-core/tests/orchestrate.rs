//! Orchestration against real processes: `LocalSandbox`, the fake GitLab, real git. The
//! watcher's PM2 controls are shell commands that keep a log, so each test can assert which
//! of them ran and in what order.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cloud_core::Config;
use cloud_core::GitLab;
use cloud_core::LocalSandbox;
use cloud_core::TokenSigner;
use cloud_core::UserId;
use cloud_core::contract::failure::TAIL_LINES;
use cloud_core::{
    BackfillOutcome, Orchestrator, Persistence, Provisioned, SandboxLayout, SandboxStatus,
    SyncFailure, SyncOutcome,
};
use futures_util::FutureExt;
use futures_util::future::join_all;
use secrecy::SecretString;
use testkit::fake_gitlab::{FakeGitLab, GROUP_ID, SERVICE_TOKEN};
use testkit::git::{git, hermetic_env, init_repo};
use testkit::statuses::Statuses;

struct World {
    tmp: tempfile::TempDir,
    gitlab: FakeGitLab,
    signer: TokenSigner,
}

impl World {
    async fn new() -> World {
        World {
            tmp: tempfile::tempdir().unwrap(),
            gitlab: FakeGitLab::start().await,
            signer: TokenSigner::new(&[7u8; 32]).unwrap(),
        }
    }

    fn repos(&self) -> PathBuf {
        self.tmp.path().join("repos")
    }

    fn orchestrator(&self, watcher_bin: &Path) -> Orchestrator<GitLab> {
        let config = Config::new(
            &self.gitlab.api_url(),
            GROUP_ID,
            SecretString::from(SERVICE_TOKEN),
        )
        .unwrap();
        let persistence = Persistence {
            host: GitLab::new(&config).unwrap(),
            signer: self.signer.clone(),
            git_url: self.repos().display().to_string(),
        };
        Orchestrator::new(Some(persistence), layout(watcher_bin))
    }

    /// A sandbox with its own home, the project folder holding a template file.
    fn sandbox(&self, id: &str) -> LocalSandbox {
        let home = self.tmp.path().join(id);
        fs::create_dir_all(home.join("project")).unwrap();
        fs::write(home.join("project/index.ts"), "template\n").unwrap();
        let mut sandbox = LocalSandbox::new(id, &home);
        for (name, value) in hermetic_env(&home) {
            if name != "HOME" {
                sandbox = sandbox.with_env(name, value.display().to_string());
            }
        }
        sandbox
    }
}

/// The watcher's PM2 controls become log lines and a marker file in the sandbox's home.
fn layout(watcher_bin: &Path) -> SandboxLayout {
    SandboxLayout {
        project_dir: "project".into(),
        watcher_env_file: ".project-watcher/.env".into(),
        watcher_bin: watcher_bin.display().to_string(),
        start_watcher: "echo start-watcher >> \"$HOME/log\" && touch \"$HOME/watcher-running\""
            .into(),
        stop_watcher: "echo stop-watcher >> \"$HOME/log\" && rm -f \"$HOME/watcher-running\""
            .into(),
        watcher_running: "test -f \"$HOME/watcher-running\"".into(),
        start_dev_server: "echo start-dev >> \"$HOME/log\"".into(),
        stop_dev_server: "echo stop-dev >> \"$HOME/log\"".into(),
        install_cmd: None,
        failure_file: "sync-failure".into(),
        command_timeout: Duration::from_secs(30),
        sync_timeout: testkit::wait::PATIENCE,
        health: None,
        exclude: Vec::new(),
    }
}

fn log(sandbox_home: &Path) -> String {
    fs::read_to_string(sandbox_home.join("log")).unwrap_or_default()
}

fn user(name: &str) -> UserId {
    UserId::parse(name).unwrap()
}

/// A stand-in for `project-watcher sync` that records its arguments, can be held until a
/// file appears, and fails like the real one (failure file, exit 1) when told to.
fn stub_watcher(dir: &Path) -> PathBuf {
    let path = dir.join("stub-watcher");
    fs::write(
        &path,
        r#"#!/bin/sh
echo "$@" >> "$HOME/watcher-args"
fail=; [ -f "$HOME/fail-install" ] && fail=1
echo run >> "$HOME/sync-runs"
while [ -f "$HOME/hold-sync" ]; do sleep 0.02; done
if [ -f "$HOME/crash-sync" ]; then
  echo 'npm ERR! Missing: left-pad@1.3.0 from lock file' >&2
  i=0; while [ $i -lt 60 ]; do i=$((i+1)); echo "npm usage: --omit <dep type> ($i)" >&2; done
  exit 1
fi
if [ -n "$fail" ]; then
  while [ $# -gt 0 ]; do [ "$1" = --failure-file ] && ff="$2"; shift; done
  printf 'step: install\nerror: `npm ci` failed (exit status: 1)\nnpm ERR! missing script\n' > "$ff"
  exit 1
fi
exit 0
"#,
    )
    .unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[tokio::test]
async fn provision_sets_everything_up_once_and_a_second_run_changes_nothing() {
    let world = World::new().await;
    let orchestrator = world.orchestrator(&stub_watcher(world.tmp.path()));
    let sandbox = world.sandbox("sbx-alice");
    let home = world.tmp.path().join("sbx-alice");
    let alice = user("alice");

    let first = orchestrator.provision(&sandbox, &alice).await.unwrap();

    assert_eq!(
        first,
        Provisioned {
            repository_created: true,
            env_written: true,
            remote_configured: true,
            watcher_started: true,
        }
    );
    let env = fs::read_to_string(home.join(".project-watcher/.env")).unwrap();
    assert!(
        env.contains(&format!("PROJECT_TOKEN={}\n", world.signer.mint(&alice))),
        "{env}"
    );
    assert!(env.contains(&format!("PROJECT_DIR={}\n", home.join("project").display())));
    let mode = fs::metadata(home.join(".project-watcher/.env"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(
        git(&home.join("project"), ["remote", "get-url", "project"]).trim(),
        world.repos().join("alice.git").display().to_string()
    );
    assert_eq!(world.gitlab.projects().len(), 1);
    assert_eq!(world.gitlab.projects()[0].path, "alice");
    assert_eq!(log(&home), "start-watcher\n");

    let second = orchestrator.provision(&sandbox, &alice).await.unwrap();

    assert_eq!(second, Provisioned::default());
    assert!(!second.changed_anything());
    assert_eq!(log(&home), "start-watcher\n", "no second start");
    assert_eq!(world.gitlab.projects().len(), 1);
}

#[tokio::test]
async fn provision_restarts_a_running_watcher_when_its_token_changes() {
    let world = World::new().await;
    let orchestrator = world.orchestrator(&stub_watcher(world.tmp.path()));
    let sandbox = world.sandbox("sbx");
    let home = world.tmp.path().join("sbx");
    orchestrator
        .provision(&sandbox, &user("alice"))
        .await
        .unwrap();
    fs::write(home.join(".project-watcher/.env"), "PROJECT_TOKEN=stale\n").unwrap();

    let again = orchestrator
        .provision(&sandbox, &user("alice"))
        .await
        .unwrap();

    assert!(again.env_written && again.watcher_started);
    assert_eq!(log(&home), "start-watcher\nstop-watcher\nstart-watcher\n");
}

#[tokio::test]
async fn feature_off_provisions_nothing() {
    let world = World::new().await;
    let orchestrator: Orchestrator<GitLab> =
        Orchestrator::new(None, layout(Path::new("project-watcher")));
    let sandbox = world.sandbox("sbx");
    let home = world.tmp.path().join("sbx");

    let done = orchestrator
        .provision(&sandbox, &user("alice"))
        .await
        .unwrap();

    assert_eq!(done, Provisioned::default());
    assert!(!home.join("project/.git").exists());
    assert!(!home.join(".project-watcher").exists());
    assert_eq!(log(&home), "");
    assert!(world.gitlab.requests().is_empty());
}

#[tokio::test]
async fn the_watcher_is_started_again_after_a_failure_and_after_a_panic() {
    let world = World::new().await;
    let orchestrator = Arc::new(world.orchestrator(&stub_watcher(world.tmp.path())));
    let sandbox = world.sandbox("sbx");
    let home = world.tmp.path().join("sbx");

    let failed = orchestrator
        .with_watcher_stopped(&sandbox, || async {
            fs::write(home.join("log"), format!("{}update\n", log(&home))).unwrap();
            Err::<(), _>("update failed")
        })
        .await
        .unwrap();
    assert_eq!(failed, Err("update failed"));
    assert_eq!(log(&home), "stop-watcher\nupdate\nstart-watcher\n");

    let panicked = tokio::spawn({
        let (orchestrator, sandbox) = (orchestrator.clone(), sandbox.clone());
        async move {
            orchestrator
                .with_watcher_stopped(&sandbox, || async {
                    if true {
                        panic!("update blew up");
                    }
                    Ok::<(), ()>(())
                })
                .await
        }
    })
    .await;
    assert!(panicked.unwrap_err().is_panic());
    assert_eq!(
        log(&home),
        "stop-watcher\nupdate\nstart-watcher\nstop-watcher\nstart-watcher\n"
    );
    assert!(home.join("watcher-running").exists());
}

/// The failure the stub watcher's `sync` writes while `fail-install` exists.
fn install_failure() -> SyncFailure {
    SyncFailure::new("install", "`npm ci` failed (exit status: 1)")
        .with_tail(["npm ERR! missing script"])
}

#[tokio::test]
async fn sync_returns_the_commit_it_reached_or_the_failure_and_sets_the_status() {
    let world = World::new().await;
    let orchestrator = world.orchestrator(&stub_watcher(world.tmp.path()));
    let sandbox = world.sandbox("sbx");
    let home = world.tmp.path().join("sbx");
    let project = home.join("project");
    init_repo(&project);
    git(&project, ["add", "-A"]);
    git(&project, ["commit", "-qm", "saved"]);
    let head = git(&project, ["rev-parse", "HEAD"]).trim().to_owned();
    let statuses = Statuses::default();

    let outcome = orchestrator.sync(&sandbox, &user("alice"), &statuses).await;
    assert_eq!(outcome, SyncOutcome::Synced { commit: Some(head) });
    assert_eq!(
        statuses.of("sbx"),
        [
            SandboxStatus::Syncing {
                since: None,
                step: None
            },
            SandboxStatus::Ready
        ]
    );
    let args = fs::read_to_string(home.join("watcher-args")).unwrap();
    let expected = format!(
        "sync --dir {} --remote project --branch main --failure-file {} --stop-cmd echo stop-dev >> \"$HOME/log\" --start-cmd echo start-dev >> \"$HOME/log\"\n",
        home.join("project").display(),
        home.join("sync-failure").display()
    );
    assert_eq!(args, expected);

    fs::write(home.join("fail-install"), "").unwrap();
    let outcome = orchestrator.sync(&sandbox, &user("alice"), &statuses).await;
    assert_eq!(
        outcome,
        SyncOutcome::Failed {
            failure: install_failure()
        }
    );
    assert_eq!(
        statuses.of("sbx").pop(),
        Some(SandboxStatus::Broken {
            failure: install_failure()
        })
    );
}

#[tokio::test]
async fn a_sync_that_fails_without_a_failure_file_shows_its_first_error_lines_and_tail() {
    let world = World::new().await;
    let orchestrator = world.orchestrator(&stub_watcher(world.tmp.path()));
    let sandbox = world.sandbox("sbx");
    let home = world.tmp.path().join("sbx");
    fs::write(home.join("crash-sync"), "").unwrap();
    let statuses = Statuses::default();

    let SyncOutcome::Failed { failure } =
        orchestrator.sync(&sandbox, &user("alice"), &statuses).await
    else {
        panic!("the sync did not fail");
    };
    assert_eq!(failure.step, "sync");
    assert_eq!(
        failure.first,
        "npm ERR! Missing: left-pad@1.3.0 from lock file"
    );
    let tail: Vec<&str> = failure.tail.lines().collect();
    assert_eq!(tail.len(), TAIL_LINES, "{}", failure.tail);
    assert_eq!(tail[0], "npm usage: --omit <dep type> (11)");
    assert_eq!(
        statuses.of("sbx").pop(),
        Some(SandboxStatus::Broken { failure })
    );
}

#[tokio::test]
async fn triggers_during_a_sync_coalesce_into_one_more_run_whose_outcome_they_get() {
    let world = World::new().await;
    let orchestrator = world.orchestrator(&stub_watcher(world.tmp.path()));
    let sandbox = world.sandbox("sbx");
    let home = world.tmp.path().join("sbx");
    let statuses = Statuses::default();
    let alice = user("alice");
    fs::write(home.join("hold-sync"), "").unwrap();
    let sync = || Box::pin(orchestrator.sync(&sandbox, &alice, &statuses));

    // Polled once each, in order: the first starts the run, the other three coalesce.
    let mut first = sync();
    assert_eq!(first.as_mut().now_or_never(), None);
    let mut coalesced = [sync(), sync(), sync()];
    for caller in &mut coalesced {
        assert_eq!(caller.as_mut().now_or_never(), None);
    }
    let driver = async {
        testkit::wait::until_async(Duration::from_secs(30), "the first sync to start", || {
            let started = home.join("sync-runs").exists();
            async move { started.then_some(()) }
        })
        .await;
        // The first run goes on and succeeds; the run after it fails at its install.
        fs::write(home.join("fail-install"), "").unwrap();
        fs::remove_file(home.join("hold-sync")).unwrap();
    };
    let (first, coalesced, ()) = tokio::join!(first, join_all(coalesced), driver);

    assert_eq!(
        first,
        SyncOutcome::Synced { commit: None },
        "the first caller's own run (the project is no repository: no commit)"
    );
    assert_eq!(
        coalesced,
        vec![
            SyncOutcome::Failed {
                failure: install_failure()
            };
            3
        ],
        "each coalesced caller gets the run that covered it"
    );
    assert_eq!(
        fs::read_to_string(home.join("sync-runs")).unwrap(),
        "run\nrun\n"
    );
    assert_eq!(
        statuses.of("sbx"),
        [
            SandboxStatus::Syncing {
                since: None,
                step: None
            },
            SandboxStatus::Ready,
            SandboxStatus::Syncing {
                since: None,
                step: None
            },
            SandboxStatus::Broken {
                failure: install_failure()
            }
        ]
    );
}

#[tokio::test]
async fn backfill_goes_on_past_a_failure_and_a_second_run_finds_everything_done() {
    let world = World::new().await;
    let orchestrator = world.orchestrator(&stub_watcher(world.tmp.path()));
    let sandboxes = vec![
        (user("alice"), world.sandbox("sbx-alice")),
        (user("bob"), world.sandbox("sbx-bob")),
        (user("carol"), world.sandbox("sbx-carol")),
    ];
    // Bob's project folder is a file: his sandbox cannot be set up.
    let bob_project = world.tmp.path().join("sbx-bob/project");
    fs::remove_dir_all(&bob_project).unwrap();
    fs::write(&bob_project, "not a folder").unwrap();

    let report = orchestrator.backfill(&sandboxes).await;

    let outcomes: Vec<_> = report
        .iter()
        .map(|e| (e.sandbox.as_str(), &e.outcome))
        .collect();
    assert!(matches!(
        outcomes[0],
        ("sbx-alice", BackfillOutcome::Provisioned(_))
    ));
    assert!(matches!(
        outcomes[1],
        ("sbx-bob", BackfillOutcome::Failed(_))
    ));
    assert!(matches!(
        outcomes[2],
        ("sbx-carol", BackfillOutcome::Provisioned(_))
    ));
    assert!(world.tmp.path().join("sbx-carol/project/.git").exists());

    fs::remove_file(&bob_project).unwrap();
    let again = orchestrator.backfill(&sandboxes).await;

    let outcomes: Vec<_> = again
        .iter()
        .map(|e| (e.sandbox.as_str(), &e.outcome))
        .collect();
    assert!(matches!(
        outcomes[0],
        ("sbx-alice", BackfillOutcome::AlreadyDone)
    ));
    assert!(matches!(
        outcomes[1],
        ("sbx-bob", BackfillOutcome::Provisioned(_))
    ));
    assert!(matches!(
        outcomes[2],
        ("sbx-carol", BackfillOutcome::AlreadyDone)
    ));
}
