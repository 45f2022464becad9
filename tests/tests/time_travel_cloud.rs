//! The cloud's time travel end to end. `Orchestrator::history` reads the upstream alone (the
//! fake GitLab's commits endpoint over a real bare repository, and the embedded upstream) and
//! must agree with the watcher's own `history` of the same saves; `restore_to` drives the real
//! `project-watcher restore --at` in a `LocalSandbox`, with the status showing it.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use cloud_core::Config;
use cloud_core::EmbeddedUpstream;
use cloud_core::GitLab;
use cloud_core::LocalSandbox;
use cloud_core::TokenSigner;
use cloud_core::UserId;
use cloud_core::{Orchestrator, Persistence, ProjectHost, SandboxLayout, SandboxStatus};
use cloud_core::{RestoreToError, Save, SaveKind};
use serde_json::Value;
use testkit::fake_gitlab::{FakeGitLab, GROUP_ID, SERVICE_TOKEN};
use testkit::git::{git, hermetic_env, init_bare, init_repo, tree_of};
use testkit::statuses::Statuses;
use testkit::wait::PATIENCE;

struct World {
    tmp: tempfile::TempDir,
    remote: PathBuf,
    project: PathBuf,
}

impl World {
    fn home(&self) -> PathBuf {
        self.tmp.path().join("home")
    }

    fn repos(&self) -> PathBuf {
        self.tmp.path().join("repos")
    }

    fn watcher(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(testkit::cargo_bin::project_watcher());
        for (k, v) in hermetic_env(&self.home()) {
            cmd.env(k, v);
        }
        cmd.env_remove("PROJECT_TOKEN")
            .env_remove("PROJECT_DIR")
            .args(args)
            .arg("--dir")
            .arg(&self.project)
            .output()
            .unwrap()
    }

    fn save(&self, rel: &str, body: &str) {
        fs::write(self.project.join(rel), body).unwrap();
        let out = self.watcher(&["once"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn head(&self) -> String {
        git(&self.project, ["rev-parse", "HEAD"]).trim().to_owned()
    }

    /// `project-watcher history --json` of the sandbox's repository: commit -> (time, kind).
    fn watcher_history(&self) -> BTreeMap<String, (String, String)> {
        let out = self.watcher(&["history", "--json", "--limit", "1000"]);
        assert!(out.status.success());
        let saves: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
        saves
            .into_iter()
            .map(|s| {
                (
                    s["commit"].as_str().unwrap().to_owned(),
                    (
                        s["time"].as_str().unwrap().to_owned(),
                        s["kind"].as_str().unwrap().to_owned(),
                    ),
                )
            })
            .collect()
    }

    fn sandbox(&self) -> LocalSandbox {
        let mut sandbox = LocalSandbox::new("sbx", self.home());
        for (name, value) in hermetic_env(&self.home()) {
            if name != "HOME" {
                sandbox = sandbox.with_env(name, value.display().to_string());
            }
        }
        sandbox
    }
}

/// A sandbox project saved by the real watcher to `repos/alice.git`: two autosaves, a restore
/// and a commit a person pushed.
fn world() -> World {
    let tmp = tempfile::tempdir().unwrap();
    let remote = tmp.path().join("repos/alice.git");
    let project = tmp.path().join("home/project");
    init_bare(&remote);
    init_repo(&project);
    git(
        &project,
        ["remote", "add", "project", remote.to_str().unwrap()],
    );
    let w = World {
        tmp,
        remote,
        project,
    };
    w.save("a.txt", "one\n");
    w.save("a.txt", "two\n");
    let out = w.watcher(&["restore", "--at", "HEAD~1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    w.save("b.txt", "b\n");
    fs::write(w.project.join("c.txt"), "by hand\n").unwrap();
    git(&w.project, ["add", "c.txt"]);
    git(&w.project, ["commit", "-qm", "a commit a person made"]);
    git(&w.project, ["push", "-q", "project", "main"]);
    w
}

fn alice() -> UserId {
    UserId::parse("alice").unwrap()
}

fn gitlab(fake: &FakeGitLab) -> GitLab {
    let config = Config::new(&fake.api_url(), GROUP_ID, SERVICE_TOKEN.to_owned().into()).unwrap();
    GitLab::new(&config).unwrap()
}

fn orchestrator<H: ProjectHost>(host: H) -> Orchestrator<H> {
    Orchestrator::new(
        Some(Persistence {
            host,
            signer: TokenSigner::new(&[9u8; 32]).unwrap(),
            git_url: "http://127.0.0.1:9/api/git".into(),
        }),
        layout(),
    )
}

fn layout() -> SandboxLayout {
    SandboxLayout {
        project_dir: "project".into(),
        watcher_env_file: ".project-watcher/.env".into(),
        watcher_bin: testkit::cargo_bin::project_watcher().display().to_string(),
        start_watcher: "true".into(),
        stop_watcher: "true".into(),
        watcher_running: "false".into(),
        start_dev_server: "true".into(),
        stop_dev_server: "true".into(),
        install_cmd: None,
        failure_file: "sync-failure".into(),
        command_timeout: PATIENCE,
        sync_timeout: Duration::from_secs(120),
        health: None,
        exclude: Vec::new(),
    }
}

/// The cloud's list must be the watcher's, save for save: same commits, times and kinds.
fn assert_agrees_with_the_watcher(w: &World, saves: &[Save]) {
    let expected = w.watcher_history();
    let got: BTreeMap<String, (String, String)> = saves
        .iter()
        .map(|s| {
            let kind = serde_json::to_value(s.kind).unwrap();
            (
                s.commit.clone(),
                (s.time.clone(), kind.as_str().unwrap().to_owned()),
            )
        })
        .collect();
    assert_eq!(got, expected);
    let kinds: Vec<SaveKind> = saves.iter().map(|s| s.kind).collect();
    for kind in [SaveKind::Autosave, SaveKind::Restore, SaveKind::Other] {
        assert!(kinds.contains(&kind), "{saves:#?}");
    }
    assert!(
        saves.windows(2).all(|p| p[0].time >= p[1].time),
        "newest first: {saves:#?}"
    );
    assert_eq!(saves[0].subject, "a commit a person made");
}

#[tokio::test]
async fn gitlab_history_matches_the_watchers_own_and_creates_nothing() {
    let w = world();
    let fake = FakeGitLab::start().await;
    fake.add_project("alice");
    fake.set_repository("alice", &w.remote);
    let orchestrator = orchestrator(gitlab(&fake));

    let saves = orchestrator.history(&alice(), 50).await.unwrap();
    assert_agrees_with_the_watcher(&w, &saves);
    let two = orchestrator.history(&alice(), 2).await.unwrap();
    assert_eq!(two, saves[..2]);

    let bob = UserId::parse("bob").unwrap();
    assert_eq!(orchestrator.history(&bob, 20).await.unwrap(), []);
    assert_eq!(fake.count("POST", "/api/v4/projects"), 0);
}

#[tokio::test]
async fn gitlab_history_pages_through_more_than_a_hundred_saves() {
    let tmp = tempfile::tempdir().unwrap();
    let bare = tmp.path().join("alice.git");
    init_bare(&bare);
    let mut stream = String::new();
    for i in 0..130u64 {
        let message =
            "autosave: f.txt\n\nf.txt\n\nSaved-by: project-watcher/0.1.0\nSave-kind: autosave\n";
        let body = format!("{i}\n");
        stream.push_str(&format!(
            "commit refs/heads/main\ncommitter W <w@x> {} +0100\ndata {}\n{message}M 100644 inline f.txt\ndata {}\n{body}\n",
            1_800_000_000 + i,
            message.len(),
            body.len()
        ));
    }
    let mut child = testkit::git::command(&bare)
        .args(["fast-import", "--quiet"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stream.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success());
    let fake = FakeGitLab::start().await;
    let project = fake.add_project("alice");
    fake.set_repository("alice", &bare);

    let saves = orchestrator(gitlab(&fake))
        .history(&alice(), 120)
        .await
        .unwrap();

    let expected: Vec<String> = git(&bare, ["log", "--format=%H", "--max-count=120", "main"])
        .lines()
        .map(str::to_owned)
        .collect();
    let got: Vec<String> = saves.iter().map(|s| s.commit.clone()).collect();
    assert_eq!(got, expected);
    // +0100 in the commit, UTC in the answer: 1_800_000_129 is 2027-01-15T08:02:09Z.
    assert_eq!(saves[0].time, "2027-01-15T08:02:09Z");
    assert_eq!(
        fake.count(
            "GET",
            &format!("/api/v4/projects/{}/repository/commits", project.id)
        ),
        2,
        "two pages of 100"
    );
}

#[tokio::test]
async fn embedded_history_reads_the_bare_repository() {
    let w = world();
    let orchestrator = orchestrator(EmbeddedUpstream::new(w.repos()).unwrap());
    let saves = orchestrator.history(&alice(), 50).await.unwrap();
    assert_agrees_with_the_watcher(&w, &saves);
    let carol = UserId::parse("carol").unwrap();
    assert_eq!(orchestrator.history(&carol, 20).await.unwrap(), []);
    init_bare(&w.repos().join("carol.git"));
    assert_eq!(orchestrator.history(&carol, 20).await.unwrap(), []);
}

#[tokio::test]
async fn a_syncs_backup_outlives_the_sandbox_in_the_cloud_history() {
    let w = world();
    let laptop = w.tmp.path().join("laptop");
    git(
        w.tmp.path(),
        ["clone", "-q", w.remote.to_str().unwrap(), "laptop"],
    );
    init_repo(&laptop);
    fs::write(laptop.join("a.txt"), "from the laptop\n").unwrap();
    git(&laptop, ["commit", "-qam", "from the laptop"]);
    git(&laptop, ["push", "-q", "origin", "main"]);
    fs::write(w.project.join("b.txt"), "unsaved sandbox work\n").unwrap();
    let failure = w.tmp.path().join("failure");
    let out = w.watcher(&[
        "sync",
        "--install-cmd",
        "true",
        "--failure-file",
        failure.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The sandbox is wiped: only the upstream is left.
    fs::remove_dir_all(&w.project).unwrap();

    let orchestrator = orchestrator(EmbeddedUpstream::new(w.repos()).unwrap());
    let saves = orchestrator.history(&alice(), 50).await.unwrap();
    let backup = saves
        .iter()
        .find(|s| s.kind == SaveKind::Backup)
        .unwrap_or_else(|| panic!("{saves:#?}"));
    // The subject without the kind the watcher starts it with (`backup: `).
    assert!(
        backup.subject.starts_with("unsaved work before sync"),
        "{backup:#?}"
    );
    assert_eq!(
        git(&w.remote, ["show", &format!("{}:b.txt", backup.commit)]),
        "unsaved sandbox work\n"
    );
    assert!(
        saves.iter().any(|s| s.subject == "from the laptop"),
        "{saves:#?}"
    );
}

fn tree(dir: &Path, rev: &str) -> String {
    tree_of(dir, rev).unwrap()
}

#[tokio::test]
async fn restore_to_runs_the_watchers_restore_in_the_sandbox_and_reports_it() {
    let w = world();
    let orchestrator = orchestrator(EmbeddedUpstream::new(w.repos()).unwrap());
    let sandbox = w.sandbox();
    let statuses = Statuses::default();
    let first = git(&w.project, ["rev-list", "--max-parents=0", "HEAD"])
        .trim()
        .to_owned();
    let before = w.head();

    let done = orchestrator
        .restore_to(&sandbox, &alice(), &first[..9], &[], &statuses)
        .await
        .unwrap();
    assert_eq!(
        statuses.take(),
        [
            SandboxStatus::Restoring { since: None },
            SandboxStatus::Ready
        ]
    );
    assert_eq!(done.from, first);
    assert_eq!(done.commit.as_deref(), Some(w.head().as_str()));
    assert_eq!(done.saved_first, None);
    assert!(!done.watcher_running);
    assert_eq!(tree(&w.project, "HEAD"), tree(&w.project, &first));
    assert_eq!(git(&w.project, ["rev-parse", "HEAD~1"]).trim(), before);
    let mut files = done.files.clone();
    files.sort();
    assert_eq!(files, ["b.txt", "c.txt"]);

    // One path, from the save before the restore: only it changes.
    let done = orchestrator
        .restore_to(
            &sandbox,
            &alice(),
            &before,
            &["c.txt".to_owned()],
            &statuses,
        )
        .await
        .unwrap();
    assert_eq!(done.files, ["c.txt"]);
    assert_eq!(
        fs::read_to_string(w.project.join("c.txt")).unwrap(),
        "by hand\n"
    );
    assert!(!w.project.join("b.txt").exists());

    // Refused input changes nothing and leaves the sandbox ready.
    statuses.take();
    let head = w.head();
    let err = orchestrator
        .restore_to(&sandbox, &alice(), "no-such-save", &[], &statuses)
        .await
        .unwrap_err();
    match &err {
        RestoreToError::Refused { message } => {
            assert!(
                message.contains("`no-such-save` is not a save"),
                "{message}"
            );
        }
        other => panic!("expected Refused, got {other}"),
    }
    assert_eq!(
        statuses.take(),
        [
            SandboxStatus::Restoring { since: None },
            SandboxStatus::Ready
        ]
    );
    assert_eq!(w.head(), head);

    let off: Orchestrator<EmbeddedUpstream> = Orchestrator::new(None, layout());
    assert!(matches!(
        off.restore_to(&sandbox, &alice(), &first, &[], &statuses)
            .await,
        Err(RestoreToError::Off)
    ));
    assert!(statuses.take().is_empty());
}
