//! Sandboxes that vanish, with everything real: `LocalProvider` sandboxes (`DIR/<user>` copied
//! from a template directory), the real `project-watcher` saving and pushing over smart HTTP
//! (`git http-backend` behind `testkit::git_server`), and cloud-core's `Lifecycle` bringing a
//! wiped sandbox back: from the template, restored from the saved branch, secrets from the
//! secret source, the watcher started; bounded recovery when the provider keeps losing it.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use cloud_core::EmbeddedUpstream;
use cloud_core::RecoveryPolicy;
use cloud_core::SecretValue;
use cloud_core::SyncOutcome;
use cloud_core::TokenSigner;
use cloud_core::UserId;
use cloud_core::{Lifecycle, Reprovisioned};
use cloud_core::{LocalProvider, SandboxProvider};
use cloud_core::{LocalSandbox, SandboxError};
use cloud_core::{
    OrchestrateError, Orchestrator, Persistence, ProvisionStep, Provisioned, SandboxLayout,
    SandboxStatus,
};
use testkit::git::{git, git_output, hermetic_env, init_repo, tree_of, tree_of_add_all};
use testkit::git_server::GitServer;
use testkit::statuses::Statuses;
use testkit::wait::{PATIENCE, until_async};

const DEBOUNCE: Duration = Duration::from_millis(200);
const MAX_DELAY: Duration = Duration::from_secs(2);

/// `LocalProvider`, counting its calls; with `lose`, it loses the sandbox on every call
/// (connect finds the directory removed, and a created one is removed as soon as it exists).
struct Counted {
    inner: LocalProvider,
    lose: bool,
    connects: AtomicU32,
    creates: AtomicU32,
}

impl SandboxProvider for Counted {
    type Sandbox = LocalSandbox;

    async fn connect(&self, user: &UserId) -> Result<LocalSandbox, SandboxError> {
        self.connects.fetch_add(1, Ordering::SeqCst);
        if self.lose {
            let _ = fs::remove_dir_all(self.inner.dir_of(user));
        }
        self.inner.connect(user).await
    }

    async fn create(&self, user: &UserId) -> Result<LocalSandbox, SandboxError> {
        self.creates.fetch_add(1, Ordering::SeqCst);
        let sandbox = self.inner.create(user).await?;
        if self.lose {
            fs::remove_dir_all(self.inner.dir_of(user)).unwrap();
        }
        Ok(sandbox)
    }
}

struct World {
    tmp: tempfile::TempDir,
    server: GitServer,
    upstream: PathBuf,
    statuses: Arc<Statuses>,
}

impl World {
    /// alice's saved project in the upstream: her source, a `.gitignore`, and a manifest that
    /// names one secret. The template's `src/example.ts` is one she deleted.
    fn new() -> World {
        let tmp = tempfile::tempdir().unwrap();
        let server = GitServer::start(&tmp.path().join("repos"));
        let upstream = server.create_bare("alice.git");
        let saved = tmp.path().join("saved");
        init_repo(&saved);
        fs::create_dir_all(saved.join("src")).unwrap();
        fs::write(saved.join(".gitignore"), "node_modules/\n").unwrap();
        fs::write(saved.join("src/index.ts"), "console.log('mine');\n").unwrap();
        fs::write(
            saved.join("shmastra.json"),
            "{\n  \"version\": 1,\n  \"env\": [\n    \"DATABASE_URL\"\n  ]\n}\n",
        )
        .unwrap();
        git(&saved, ["add", "-A"]);
        git(&saved, ["commit", "-qm", "saved"]);
        git(&saved, ["push", "-q", upstream.to_str().unwrap(), "main"]);

        let template = tmp.path().join("template/project");
        fs::create_dir_all(template.join("src")).unwrap();
        fs::create_dir_all(template.join("node_modules/dep")).unwrap();
        fs::write(template.join(".gitignore"), "node_modules/\n").unwrap();
        fs::write(template.join("src/index.ts"), "console.log('template');\n").unwrap();
        fs::write(template.join("src/example.ts"), "the user deleted this\n").unwrap();
        fs::write(template.join("node_modules/dep/index.js"), "dep\n").unwrap();
        World {
            tmp,
            server,
            upstream,
            statuses: Arc::new(Statuses::only_for("alice")),
        }
    }

    fn provider(&self, lose: bool) -> Counted {
        let mut inner = LocalProvider::new(self.sandboxes(), self.tmp.path().join("template"))
            .with_env(
                "XDG_CONFIG_HOME",
                self.tmp.path().join("xdg").display().to_string(),
            );
        for (name, value) in hermetic_env(self.tmp.path()) {
            if !matches!(name, "HOME" | "XDG_CONFIG_HOME") {
                inner = inner.with_env(name, value.display().to_string());
            }
        }
        Counted {
            inner,
            lose,
            connects: AtomicU32::new(0),
            creates: AtomicU32::new(0),
        }
    }

    fn lifecycle(
        &self,
        provider: Counted,
        layout: SandboxLayout,
        wait: Duration,
    ) -> Lifecycle<Counted, EmbeddedUpstream> {
        let orchestrator = Orchestrator::new(
            Some(Persistence {
                host: EmbeddedUpstream::new(self.tmp.path().join("repos")).unwrap(),
                signer: TokenSigner::new(&[3u8; 32]).unwrap(),
                git_url: self.server.base_url(),
            }),
            layout,
        );
        Lifecycle::new(provider, orchestrator, self.statuses.clone())
            .with_policy(RecoveryPolicy {
                wait,
                ..RecoveryPolicy::default()
            })
            // The backend's store also holds a name the saved manifest no longer lists.
            .with_secrets(|_: &UserId, names: &[String]| {
                assert_eq!(names, ["DATABASE_URL"]);
                vec![
                    ("DATABASE_URL".to_owned(), SecretValue::new("postgres://db")),
                    ("REMOVED_KEY".to_owned(), SecretValue::new("stale")),
                ]
            })
    }

    fn sandboxes(&self) -> PathBuf {
        self.tmp.path().join("sandboxes")
    }

    fn home(&self) -> PathBuf {
        self.sandboxes().join("alice")
    }

    fn project(&self) -> PathBuf {
        self.home().join("project")
    }

    /// Every watcher any sandbox started, for the cleanup and for counting.
    fn watcher_pids(&self) -> Vec<String> {
        fs::read_to_string(self.tmp.path().join("watcher-pids"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// What a wipe does to a sandbox: its processes die and its disk is gone.
    fn wipe(&self) {
        if let Ok(pid) = fs::read_to_string(self.home().join("watcher.pid")) {
            kill(pid.trim());
        }
        fs::remove_dir_all(self.home()).unwrap();
    }

    fn upstream_head(&self) -> String {
        git(&self.upstream, ["rev-parse", "main"]).trim().to_owned()
    }

    fn upstream_file(&self, path: &str) -> Option<String> {
        let out = git_output(&self.upstream, ["show", &format!("main:{path}")]);
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The sandbox holds exactly the saved project (plus the template's ignored files and the
    /// restored `.env`), and its watcher runs: it saves and pushes a new edit.
    async fn assert_restored_and_watched(&self, probe: &str) {
        assert_eq!(
            tree_of_add_all(&self.project()),
            tree_of(&self.upstream, "main").unwrap(),
            "the sandbox holds the saved tree"
        );
        assert!(!self.project().join("src/example.ts").exists());
        assert_eq!(
            fs::read_to_string(self.project().join("node_modules/dep/index.js")).unwrap(),
            "dep\n"
        );
        let env = fs::read_to_string(self.project().join(".env")).unwrap();
        assert!(env.starts_with("DATABASE_URL="), "{env}");
        let pid = fs::read_to_string(self.home().join("watcher.pid")).unwrap();
        assert!(alive(pid.trim()), "the watcher runs");
        fs::write(self.project().join("src/probe.ts"), probe).unwrap();
        until_async(PATIENCE, "the new watcher to push an edit", || async {
            (self.upstream_file("src/probe.ts").as_deref() == Some(probe)).then_some(())
        })
        .await;
    }
}

impl Drop for World {
    fn drop(&mut self) {
        for pid in self.watcher_pids() {
            kill(&pid);
        }
    }
}

fn kill(pid: &str) {
    let _ = std::process::Command::new("kill")
        .args(["-KILL", pid])
        .stderr(std::process::Stdio::null())
        .status();
}

/// Whether the process runs (a zombie waiting for its parent to reap it does not).
fn alive(pid: &str) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z'))
    })
}

/// The watcher as a plain background process (PM2's part is covered by `pm2.rs`), started
/// from the environment file provision wrote; its pid in the sandbox and in `watcher-pids`
/// beside the sandboxes. `stop_dev_server` is the test's hook into the middle of a sync.
fn layout(root: &Path, stop_dev_server: String) -> SandboxLayout {
    let watcher = testkit::cargo_bin::project_watcher();
    let watcher = watcher.display();
    let pids = root.join("watcher-pids");
    let pids = pids.display();
    SandboxLayout {
        project_dir: "project".into(),
        watcher_env_file: ".project-watcher/.env".into(),
        watcher_bin: watcher.to_string(),
        start_watcher: format!(
            "set -a; . \"$HOME/.project-watcher/.env\"; set +a; \
             nohup '{watcher}' watch --debounce {}ms --max-delay {}ms >> \"$HOME/watcher.log\" 2>&1 & \
             echo $! > \"$HOME/watcher.pid\"; echo $! >> '{pids}'",
            DEBOUNCE.as_millis(),
            MAX_DELAY.as_millis()
        ),
        stop_watcher: "pid=$(cat \"$HOME/watcher.pid\") && kill -INT $pid && \
             while kill -0 $pid 2>/dev/null; do sleep 0.05; done"
            .into(),
        watcher_running: "kill -0 $(cat \"$HOME/watcher.pid\" 2>/dev/null) 2>/dev/null".into(),
        start_dev_server: "echo start-dev >> \"$HOME/log\"".into(),
        stop_dev_server,
        install_cmd: Some("true".into()),
        failure_file: "sync-failure".into(),
        command_timeout: PATIENCE,
        sync_timeout: Duration::from_secs(120),
        health: None,
        exclude: Vec::new(),
    }
}

fn plain_stop() -> String {
    "echo stop-dev >> \"$HOME/log\"".into()
}

/// The restore form for alice's saved project.
fn secrets() -> Vec<(String, SecretValue)> {
    vec![("DATABASE_URL".into(), SecretValue::new("postgres://db"))]
}

fn alice() -> UserId {
    UserId::parse("alice").unwrap()
}

fn reprovisioned() -> Vec<SandboxStatus> {
    [
        ProvisionStep::Creating,
        ProvisionStep::Restoring,
        ProvisionStep::Starting,
    ]
    .into_iter()
    .map(|step| SandboxStatus::Provisioning { step })
    .chain([SandboxStatus::Ready])
    .collect()
}

fn push_from_laptop(world: &World, path: &str, body: &str) {
    let laptop = world.tmp.path().join("laptop");
    if !laptop.exists() {
        git(
            world.tmp.path(),
            ["clone", "-q", world.upstream.to_str().unwrap(), "laptop"],
        );
        init_repo(&laptop);
    }
    fs::write(laptop.join(path), body).unwrap();
    git(&laptop, ["add", "-A"]);
    git(&laptop, ["commit", "-qm", "from the laptop"]);
    git(&laptop, ["push", "-q", "origin", "main"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_wiped_under_its_watcher_comes_back_with_the_saved_project_on_the_next_sync() {
    let world = World::new();
    let lifecycle = world.lifecycle(
        world.provider(false),
        layout(world.tmp.path(), plain_stop()),
        Duration::from_millis(1500),
    );

    let done = lifecycle.reprovision(&alice(), secrets()).await.unwrap();
    assert_eq!(done, Reprovisioned::Created);
    assert_eq!(world.statuses.take(), reprovisioned());
    world.assert_restored_and_watched("before the wipe\n").await;
    let old_watcher = fs::read_to_string(world.home().join("watcher.pid")).unwrap();

    // Only the directory goes; the old watcher notices and stops by itself. It may write its
    // status file while `rm -rf` runs, so a second pass finishes.
    until_async(PATIENCE, "the sandbox directory removed", || async {
        fs::remove_dir_all(world.home()).ok()
    })
    .await;
    let started = Instant::now();
    let synced = lifecycle.sync(&alice()).await.unwrap();
    let took = started.elapsed();

    assert_eq!(
        synced,
        SyncOutcome::Synced {
            commit: Some(world.upstream_head())
        },
        "the sync reached the saved branch"
    );
    let mut expected = reprovisioned();
    expected.extend([
        SandboxStatus::Syncing {
            since: None,
            step: None,
        },
        SandboxStatus::Ready,
    ]);
    assert_eq!(world.statuses.take(), expected);
    assert!(
        took >= Duration::from_millis(1500),
        "waited first: {took:?}"
    );
    assert_eq!(
        fs::read_to_string(world.project().join("src/probe.ts")).unwrap(),
        "before the wipe\n",
        "what the old watcher pushed is back"
    );
    world.assert_restored_and_watched("after the wipe\n").await;
    assert_eq!(lifecycle.provider().creates.load(Ordering::SeqCst), 2);
    until_async(PATIENCE, "the old watcher to stop by itself", || async {
        (!alive(old_watcher.trim())).then_some(())
    })
    .await;
    eprintln!("wiped sandbox back and synced in {took:?} (1.5 s of it the recovery wait)");

    // Wiped again; this time the page asks for a restore. As in a real wipe, the sandbox's
    // watcher is gone before the new sandbox is made.
    let second_watcher = fs::read_to_string(world.home().join("watcher.pid")).unwrap();
    until_async(PATIENCE, "the sandbox directory removed", || async {
        fs::remove_dir_all(world.home()).ok()
    })
    .await;
    until_async(PATIENCE, "the second watcher to stop by itself", || async {
        (!alive(second_watcher.trim())).then_some(())
    })
    .await;
    assert!(
        !world.home().exists(),
        "a watcher wrote into its removed sandbox"
    );
    let done = lifecycle.reprovision(&alice(), secrets()).await.unwrap();
    assert_eq!(done, Reprovisioned::Created);
    assert_eq!(world.statuses.take(), reprovisioned());
    assert_eq!(
        fs::read_to_string(world.project().join("src/probe.ts")).unwrap(),
        "after the wipe\n"
    );
    world
        .assert_restored_and_watched("after the second wipe\n")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_wiped_in_the_middle_of_a_sync_is_recovered_and_the_sync_completes() {
    let world = World::new();
    // The sync's stop step is where the sandbox vanishes (once): its watcher is killed and
    // its directory removed while `project-watcher sync` is between its backup and its fetch.
    let flag = world.tmp.path().join("wiped-once");
    let wipe_mid_sync = format!(
        "if [ ! -e '{flag}' ]; then touch '{flag}'; kill -KILL $(cat \"$HOME/watcher.pid\"); rm -rf \"$HOME\"; fi; \
         echo stop-dev >> \"$HOME/log\"",
        flag = flag.display()
    );
    let lifecycle = world.lifecycle(
        world.provider(false),
        layout(world.tmp.path(), wipe_mid_sync),
        Duration::from_millis(100),
    );
    lifecycle.reprovision(&alice(), secrets()).await.unwrap();
    world.statuses.take();
    push_from_laptop(&world, "src/index.ts", "console.log('laptop');\n");

    let synced = lifecycle.sync(&alice()).await.unwrap();

    assert!(flag.exists(), "the sandbox was wiped during the sync");
    assert_eq!(
        synced,
        SyncOutcome::Synced {
            commit: Some(world.upstream_head())
        },
        "the sync reached the saved branch"
    );
    let mut expected = vec![SandboxStatus::Syncing {
        since: None,
        step: None,
    }];
    expected.extend(reprovisioned());
    expected.extend([
        SandboxStatus::Syncing {
            since: None,
            step: None,
        },
        SandboxStatus::Ready,
    ]);
    assert_eq!(world.statuses.take(), expected);
    assert_eq!(
        fs::read_to_string(world.project().join("src/index.ts")).unwrap(),
        "console.log('laptop');\n"
    );
    assert_eq!(
        fs::read_to_string(world.home().join("log")).unwrap(),
        "start-dev\nstop-dev\nstart-dev\n",
        "the new sandbox started its dev server, then the retried sync stopped and started it"
    );
    world.assert_restored_and_watched("after the sync\n").await;
    assert_eq!(lifecycle.provider().creates.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_loses_the_sandbox_on_every_call_gets_three_recoveries_then_a_hard_error() {
    let world = World::new();
    let wait = Duration::from_millis(100);
    let lifecycle = world.lifecycle(
        world.provider(true),
        layout(world.tmp.path(), plain_stop()),
        wait,
    );

    let started = Instant::now();
    let mut errors = Vec::new();
    for _ in 0..6 {
        errors.push(lifecycle.sync(&alice()).await.unwrap_err());
    }
    let took = started.elapsed();

    for err in &errors[..3] {
        assert!(err.is_gone(), "{err}");
    }
    for err in &errors[3..] {
        assert!(
            matches!(err, OrchestrateError::NeedsAttention { count: 3, .. }),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            "the sandbox of user alice was lost and re-created 3 times within 15m; recovery stopped, it needs attention"
        );
    }
    let provider = lifecycle.provider();
    assert_eq!(provider.creates.load(Ordering::SeqCst), 3);
    // Three recovered calls: connect, then connect and create inside re-provisioning. Three
    // stopped calls: one connect each, no wait.
    assert_eq!(provider.connects.load(Ordering::SeqCst), 3 * 2 + 3);
    assert!(took >= 3 * wait, "{took:?}");
    assert_eq!(
        world.statuses.take().last(),
        Some(&SandboxStatus::NeedsAttention {
            reason: errors[3].to_string()
        })
    );
    assert!(world.watcher_pids().is_empty(), "nothing ever started");
    assert!(!world.home().exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_reprovisions_at_once_make_one_sandbox_with_one_watcher() {
    let world = World::new();
    let lifecycle = world.lifecycle(
        world.provider(false),
        layout(world.tmp.path(), plain_stop()),
        Duration::from_millis(100),
    );
    let user = alice();
    let (a, b) = tokio::join!(
        lifecycle.reprovision(&user, secrets()),
        lifecycle.reprovision(&user, secrets())
    );

    let mut outcomes = [a.unwrap(), b.unwrap()];
    outcomes.sort_by_key(|o| matches!(o, Reprovisioned::Present(_)));
    assert_eq!(
        outcomes,
        [
            Reprovisioned::Created,
            Reprovisioned::Present(Provisioned::default())
        ]
    );
    assert_eq!(lifecycle.provider().creates.load(Ordering::SeqCst), 1);
    let names: Vec<_> = fs::read_dir(world.sandboxes())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["alice"]);
    assert_eq!(world.watcher_pids().len(), 1, "one watcher started");
    assert_eq!(world.statuses.take(), reprovisioned());
    world.assert_restored_and_watched("once\n").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saved_project_that_needs_secrets_waits_for_them_without_starting_anything() {
    let world = World::new();
    let provider = world.provider(false);
    let orchestrator = Orchestrator::new(
        Some(Persistence {
            host: EmbeddedUpstream::new(world.tmp.path().join("repos")).unwrap(),
            signer: TokenSigner::new(&[3u8; 32]).unwrap(),
            git_url: world.server.base_url(),
        }),
        layout(world.tmp.path(), plain_stop()),
    );
    let lifecycle = Lifecycle::new(provider, orchestrator, world.statuses.clone());

    let err = lifecycle
        .reprovision(&alice(), Vec::new())
        .await
        .unwrap_err();

    assert!(matches!(err, OrchestrateError::Form(_)), "{err}");
    assert!(err.to_string().contains("DATABASE_URL"), "{err}");
    assert_eq!(
        world.statuses.take().last(),
        Some(&SandboxStatus::NeedsSecrets {
            names: vec!["DATABASE_URL".into()]
        })
    );
    assert!(world.watcher_pids().is_empty());
    assert!(!world.home().join("log").exists(), "no dev server");

    let done = lifecycle.reprovision(&alice(), secrets()).await.unwrap();
    assert_eq!(done, Reprovisioned::Restored);
    assert_eq!(lifecycle.provider().creates.load(Ordering::SeqCst), 1);
    world.assert_restored_and_watched("with secrets\n").await;
}

/// Writes `file` (a sequence number) every 50 ms until stopped, as editors save: a temp file
/// in an ignored folder renamed over it, so the watcher never sees it half written; returns
/// when each number was written.
fn keep_editing(file: PathBuf, stop: Arc<std::sync::atomic::AtomicBool>) -> Vec<Instant> {
    let tmp = file.parent().unwrap().join("../node_modules/.clock.tmp");
    let mut written = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        fs::write(&tmp, format!("{}\n", written.len())).unwrap();
        fs::rename(&tmp, &file).unwrap();
        written.push(Instant::now());
        std::thread::sleep(Duration::from_millis(50));
    }
    written
}

/// The measurement behind the docs' "what a lost sandbox can cost": the time from one edit to
/// the upstream holding it (debounce + commit + one push), and, with edits every 50 ms, how
/// much editing time a wipe loses (bounded by `--max-delay` + one push, since the debounce
/// never settles while edits keep coming). Each round edits for longer than that bound (plus
/// slack), so a restore that lost everything the round wrote fails every round; the wipes land
/// at four points of the `--max-delay` cycle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wipe_loses_only_what_the_watcher_had_not_pushed() {
    let world = World::new();
    let lifecycle = world.lifecycle(
        world.provider(false),
        layout(world.tmp.path(), plain_stop()),
        Duration::from_millis(100),
    );
    lifecycle.reprovision(&alice(), secrets()).await.unwrap();

    let mut to_upstream = Vec::new();
    for i in 0..5 {
        let body = format!("single {i}\n");
        let written = Instant::now();
        fs::write(world.project().join("src/single.ts"), &body).unwrap();
        until_async(PATIENCE, "a single edit upstream", || async {
            (world.upstream_file("src/single.ts").as_deref() == Some(&body)).then_some(())
        })
        .await;
        to_upstream.push(written.elapsed());
    }
    to_upstream.sort();
    eprintln!("one edit -> upstream, debounce {DEBOUNCE:?}: {to_upstream:?}");
    let slowest_push = *to_upstream.last().unwrap();
    // Slack for a loaded machine.
    let bound = MAX_DELAY + slowest_push + Duration::from_secs(2);

    for (round, past_bound) in [300, 800, 1300, 1800]
        .map(Duration::from_millis)
        .into_iter()
        .enumerate()
    {
        let editing_for = bound + past_bound;
        let name = format!("src/clock-{round}.ts");
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let editor = std::thread::spawn({
            let (file, stop) = (world.project().join(&name), Arc::clone(&stop));
            move || keep_editing(file, stop)
        });
        tokio::time::sleep(editing_for).await;
        stop.store(true, Ordering::SeqCst);
        let written = editor.join().unwrap();
        let wiped_at = Instant::now();
        world.wipe();
        assert_eq!(
            lifecycle.reprovision(&alice(), secrets()).await.unwrap(),
            Reprovisioned::Created
        );

        let first_lost = match fs::read_to_string(world.project().join(&name)) {
            Ok(kept) => kept.trim().parse::<usize>().unwrap() + 1,
            Err(_) => 0,
        };
        let lost = written
            .get(first_lost)
            .map_or(Duration::ZERO, |&at| wiped_at - at);
        eprintln!(
            "edits every 50 ms for {editing_for:?}, then a wipe: {} of {} lost, the last {lost:?} of editing",
            written.len() - first_lost,
            written.len()
        );
        assert_eq!(
            tree_of_add_all(&world.project()),
            tree_of(&world.upstream, "main").unwrap()
        );
        // A restore that lost the round's pushed work loses all of its editing time, more than
        // the bound.
        assert!(
            lost <= bound,
            "lost {lost:?} of {editing_for:?} of editing: more than --max-delay {MAX_DELAY:?} + one push ({slowest_push:?}) + 2 s"
        );
    }
}
