//! The cloud driving E2B sandboxes, everything real but E2B: the fake E2B (`testkit::fake_e2b`)
//! runs each sandbox's commands for real in its own home on this machine, made from the
//! template by the template's own recipe (`testkit::template`); in it, real PM2 runs the
//! template's apps and the real watcher, which pushes through the real proxy (`serve` with the
//! embedded upstream). `Lifecycle` over `E2bProvider` provisions, loses, resumes and syncs.

use std::fs;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cloud_core::e2b::{E2bLifecycle, E2bProvider};
use cloud_core::store::Store;
use cloud_core::store::memory::MemoryStore;
use cloud_core::{
    ConnectionLimits, EmbeddedUpstream, HealthCheck, Lifecycle, Orchestrator, Persistence,
    ProxyLimits, Reprovisioned, Sandbox, SandboxLayout, SandboxProvider, SandboxStatus,
    SecretValue, ServeConfig, SyncOutcome, TokenSigner, UpstreamChoice, UserId, serve,
};
use shmastra_contract::failure::SYNC_STEPS;
use testkit::fake_e2b::{self, Fault, Route, State};
use testkit::git::{git, git_output, init_repo, tree_of, tree_of_add_all};
use testkit::statuses::Statuses;
use testkit::template::{ShmastraE2b, TEMPLATE_NAME};
use testkit::wait::until_async;

/// A flow here runs PM2, the watcher and git inside a sandbox, some steps several times.
const PATIENCE: Duration = testkit::wait::PATIENCE.saturating_mul(2);

struct World {
    tmp: tempfile::TempDir,
    e2b: ShmastraE2b,
    store: Arc<dyn Store>,
    git_url: String,
    upstream: PathBuf,
    events: PathBuf,
    signer: TokenSigner,
    statuses: Arc<Statuses>,
    stop_serve: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for World {
    fn drop(&mut self) {
        if let Some(stop) = self.stop_serve.take() {
            let _ = stop.send(());
        }
    }
}

fn alice() -> UserId {
    UserId::parse("alice").unwrap()
}

impl World {
    async fn new() -> World {
        let tmp = tempfile::tempdir().unwrap();
        let e2b = tokio::task::block_in_place(|| ShmastraE2b::start(tmp.path()));
        let upstream_dir = tmp.path().join("upstream");
        let events = tmp.path().join("external-pushes");
        let signer = TokenSigner::new(&[7u8; 32]).unwrap();
        let (addr_tx, addr_rx) = tokio::sync::oneshot::channel();
        let (stop_serve, serve_stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve(
            ServeConfig {
                listen: "127.0.0.1:0".parse().unwrap(),
                upstream: UpstreamChoice::Embedded(upstream_dir.clone()),
                signer: signer.clone(),
                webhook_secret: None,
                on_external_push: Some(format!(
                    "echo \"$SHMASTRA_USER $SHMASTRA_REF $SHMASTRA_NEW_OID\" >> '{}'",
                    events.display()
                )),
                limits: ProxyLimits::default(),
                connections: ConnectionLimits::default(),
                allow_history_rewrite: false,
                sync_env: Vec::new(),
                parallel_syncs: 4,
                database: None,
                sync_lease: Duration::from_secs(30),
                token_state_max_age: Duration::from_secs(30),
                web: Default::default(),
                api_keys: None,
            },
            move |addr| {
                let _ = addr_tx.send(addr);
            },
            async move {
                let _ = serve_stopped.await;
            },
        ));
        let git_url = format!("http://{}/api/git", addr_rx.await.unwrap());
        World {
            upstream: upstream_dir.join("alice.git"),
            tmp,
            e2b,
            store: Arc::new(MemoryStore::new()),
            git_url,
            events,
            signer,
            statuses: Arc::new(Statuses::only_for("alice")),
            stop_serve: Some(stop_serve),
        }
    }

    /// The template's layout, with the sync failure file under the sandbox home (the fake's
    /// sandboxes share this machine's `/tmp`), the test's dev server port, and an install that
    /// fails when told to.
    fn layout(&self) -> SandboxLayout {
        let mut layout = SandboxLayout::shmastra();
        layout.failure_file = "tmp/shmastra-sync-failure".into();
        layout.health = Some(HealthCheck {
            url: self.e2b.health_url(),
            timeout: Duration::from_secs(60),
            interval: Duration::from_millis(200),
            ..HealthCheck::shmastra()
        });
        layout.install_cmd = Some(
            "echo installing; if [ -f broken-dependency ]; then echo 'ERR_PNPM_NO_MATCHING_VERSION left-pad@99' >&2; exit 1; fi"
                .into(),
        );
        layout
    }

    /// The cloud's lifecycle over E2B, its sandboxes living as `e2b` says.
    fn lifecycle(&self, e2b: E2bLifecycle) -> Lifecycle<E2bProvider, EmbeddedUpstream> {
        let provider = E2bProvider::new(
            self.e2b.fake.settings(TEMPLATE_NAME),
            self.store.clone(),
            e2b,
        )
        .unwrap();
        let orchestrator = Orchestrator::new(
            Some(Persistence {
                host: EmbeddedUpstream::new(self.tmp.path().join("upstream")).unwrap(),
                signer: self.signer.clone(),
                git_url: self.git_url.clone(),
            }),
            self.layout(),
        );
        Lifecycle::new(provider, orchestrator, self.statuses.clone()).with_secrets(
            |_: &UserId, names: &[String]| {
                assert_eq!(names, ["OPENAI_API_KEY"]);
                vec![(
                    "OPENAI_API_KEY".to_owned(),
                    SecretValue::new("sk-from-the-store"),
                )]
            },
        )
    }

    /// The only sandbox the fake holds.
    fn sandbox(&self) -> fake_e2b::SandboxView {
        let all = self.e2b.fake.sandboxes();
        assert_eq!(all.len(), 1, "{all:?}");
        all.into_iter().next().unwrap()
    }

    fn project(&self) -> PathBuf {
        self.sandbox().home.join("shmastra")
    }

    fn creates(&self) -> usize {
        self.e2b
            .fake
            .requests()
            .iter()
            .filter(|r| r.method == "POST" && r.path == "/sandboxes")
            .count()
    }

    async fn pushed(&self, path: &str) {
        let upstream = self.upstream.clone();
        let path = path.to_owned();
        until_async(PATIENCE, &format!("{path} on the upstream"), || {
            let ok = git_output(&upstream, ["cat-file", "-e", &format!("main:{path}")])
                .status
                .success();
            async move { ok.then_some(()) }
        })
        .await;
    }

    /// The watcher PM2 runs in the sandbox, by `pm2 jlist` run there.
    async fn watcher_pid(&self, lifecycle: &Lifecycle<E2bProvider, EmbeddedUpstream>) -> u32 {
        let sandbox = lifecycle.provider().connect(&alice()).await.unwrap();
        let out = sandbox
            .exec(&cloud_core::Exec::new("pm2 jlist", Duration::from_secs(60)))
            .await
            .unwrap();
        let list: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        let app = list
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["name"] == "project-watcher")
            .expect("PM2 runs the watcher");
        assert_eq!(app["pm2_env"]["status"], "online");
        app["pid"].as_u64().unwrap() as u32
    }

    fn laptop_push(&self, files: &[(&str, &str)]) -> String {
        let laptop = self.tmp.path().join("laptop");
        if !laptop.exists() {
            let token = self.signer.mint(&alice());
            let authed = self
                .git_url
                .replace("http://", &format!("http://dev:{token}@"));
            git(
                self.tmp.path(),
                ["clone", "-q", &format!("{authed}/alice.git"), "laptop"],
            );
            init_repo(&laptop);
        }
        git(&laptop, ["pull", "-q", "--rebase", "origin", "main"]);
        for (path, text) in files {
            fs::write(laptop.join(path), text).unwrap();
        }
        git(&laptop, ["add", "-A"]);
        git(&laptop, ["commit", "-qm", "from the laptop"]);
        // The watcher may push in between, as it would for a developer: pull and push again.
        for _ in 0..10 {
            if git_output(&laptop, ["push", "-q", "origin", "HEAD:main"])
                .status
                .success()
            {
                return git(&laptop, ["rev-parse", "HEAD"]).trim().to_owned();
            }
            git(&laptop, ["pull", "-q", "--rebase", "origin", "main"]);
        }
        panic!("the laptop could not push");
    }
}

/// alice's saved project: her own code and a manifest that names one secret.
fn saved_project(world: &World) {
    let saved = world.tmp.path().join("saved");
    init_repo(&saved);
    fs::create_dir_all(saved.join("src")).unwrap();
    fs::write(saved.join(".gitignore"), "node_modules/\n").unwrap();
    fs::write(saved.join("package.json"), "{\"name\": \"shmastra\"}\n").unwrap();
    fs::write(saved.join("src/index.ts"), "export const agent = 'mine';\n").unwrap();
    fs::write(
        saved.join("shmastra.json"),
        "{\n  \"version\": 1,\n  \"env\": [\n    \"OPENAI_API_KEY\"\n  ]\n}\n",
    )
    .unwrap();
    git(&saved, ["add", "-A"]);
    git(&saved, ["commit", "-qm", "saved"]);
    let token = world.signer.mint(&alice());
    let authed = world
        .git_url
        .replace("http://", &format!("http://dev:{token}@"));
    git(
        &saved,
        ["push", "-q", &format!("{authed}/alice.git"), "HEAD:main"],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_sandbox_is_provisioned_again_from_the_saved_branch() {
    let w = World::new().await;
    let lifecycle = w.lifecycle(E2bLifecycle::default());
    saved_project(&w);
    let form = vec![(
        "OPENAI_API_KEY".to_owned(),
        SecretValue::new("sk-from-the-form"),
    )];

    // Provisioned through E2B: created from the template, restored, PM2 runs the watcher.
    assert_eq!(
        lifecycle.reprovision(&alice(), form).await.unwrap(),
        Reprovisioned::Created
    );
    let first = w.sandbox();
    assert_eq!(first.state, State::Running);
    assert!(first.auto_pause && first.auto_resume);
    let project = w.project();
    assert_eq!(
        tree_of_add_all(&project),
        tree_of(&w.upstream, "main").unwrap()
    );
    assert_eq!(
        fs::read_to_string(project.join(".env")).unwrap(),
        "OPENAI_API_KEY='sk-from-the-form'\n"
    );
    let pid = w.watcher_pid(&lifecycle).await;
    assert!(pid > 0);

    // An edit in the sandbox reaches the upstream through the proxy, as the watcher's.
    fs::write(project.join("src/edit.ts"), "edited in the sandbox\n").unwrap();
    w.pushed("src/edit.ts").await;
    let message = git(&w.upstream, ["log", "-1", "--format=%B", "main"]);
    assert!(message.contains("Saved-by: project-watcher/"), "{message}");
    // Sentinel: a push from elsewhere; once its command ran, one for the watcher's push above
    // would have run too (the commands run in arrival order).
    let sentinel = w.tmp.path().join("sentinel");
    let token = w.signer.mint(&alice());
    let authed = w
        .git_url
        .replace("http://", &format!("http://dev:{token}@"));
    git(
        w.tmp.path(),
        ["clone", "-q", &format!("{authed}/alice.git"), "sentinel"],
    );
    git(
        &sentinel,
        ["push", "-q", "origin", "HEAD:refs/heads/sentinel"],
    );
    let events = until_async(PATIENCE, "the sentinel's external-push command", || {
        let events = fs::read_to_string(&w.events).unwrap_or_default();
        async move { events.contains("refs/heads/sentinel").then_some(events) }
    })
    .await;
    let refs: Vec<&str> = events
        .lines()
        .map(|l| l.split(' ').nth(1).unwrap())
        .collect();
    assert_eq!(
        refs,
        ["refs/heads/main", "refs/heads/sentinel"],
        "the saved project's push and the sentinel, not the watcher's push: {events}"
    );
    let statuses = w.statuses.take();
    assert_eq!(statuses.last(), Some(&SandboxStatus::Ready), "{statuses:?}");
    // PM2's logs in the project are never saved, whatever the saved .gitignore says.
    assert!(project.join(".logs/project-watcher-error.log").exists());
    let saved = git(&w.upstream, ["ls-tree", "-r", "--name-only", "main"]);
    assert!(!saved.contains(".logs"), "{saved}");

    // Killed at E2B (its snapshot with it): the next operation provisions it again.
    w.e2b.fake.kill(&first.id);
    let saved_tree = tree_of(&w.upstream, "main").unwrap();
    lifecycle.provision(&alice()).await.unwrap();
    assert_eq!(w.creates(), 2);
    let second = w.sandbox();
    assert_ne!(second.id, first.id);
    let project = w.project();
    assert_eq!(
        tree_of_add_all(&project),
        saved_tree,
        "the tree equals the saved branch"
    );
    assert_eq!(
        fs::read_to_string(project.join(".env")).unwrap(),
        "OPENAI_API_KEY='sk-from-the-store'\n",
        "the restore form came from the secret source"
    );
    w.watcher_pid(&lifecycle).await;
    fs::write(project.join("src/after.ts"), "after the re-provisioning\n").unwrap();
    w.pushed("src/after.ts").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_sandbox_is_resumed_and_syncs_reach_it() {
    let w = World::new().await;
    // E2B's proxy does not resume this sandbox on traffic (made without autoResume, or one
    // the proxy could not resume): a command that reaches it paused is the proxy's 502.
    let lifecycle = w.lifecycle(E2bLifecycle {
        auto_resume: false,
        ..E2bLifecycle::default()
    });
    saved_project(&w);
    let form = vec![(
        "OPENAI_API_KEY".to_owned(),
        SecretValue::new("sk-from-the-form"),
    )];
    lifecycle.reprovision(&alice(), form).await.unwrap();
    let id = w.sandbox().id;
    let pid = w.watcher_pid(&lifecycle).await;

    // Its timeout passed: paused (memory kept). The next operation resumes it; nothing is
    // re-created and the same watcher goes on.
    w.e2b.fake.expire(&id);
    assert_eq!(w.sandbox().state, State::Paused);
    lifecycle.provision(&alice()).await.unwrap();
    assert_eq!(w.sandbox().state, State::Running);
    assert_eq!(w.watcher_pid(&lifecycle).await, pid);
    assert_eq!(w.creates(), 1);

    // A push from a laptop: the sync runs in the E2B sandbox, paused twice in the middle of
    // it: during a command (its stream breaks) and between two (the next one is the proxy's
    // 502), neither of which is a loss.
    let head = w.laptop_push(&[("src/laptop.ts", "from the laptop\n")]);
    w.statuses.take();
    w.e2b.fake.push_fault(
        Route::Start,
        Fault::PauseDuringCommand {
            after: Duration::from_millis(100),
        },
    );
    w.e2b
        .fake
        .push_fault(Route::Start, Fault::PauseBeforeCommand);
    let before = w.e2b.fake.requests().len();
    let outcome = lifecycle.sync(&alice()).await.unwrap();
    assert_eq!(outcome, SyncOutcome::Synced { commit: Some(head) });
    let during: Vec<_> = w.e2b.fake.requests().split_off(before);
    // The commands' 502s: a peek at the sync's step file that met the pause is not recovered
    // from (the command is), so it asks for no resume.
    let refused = during
        .iter()
        .filter(|r| r.listener == "envd" && r.status == 502 && !r.path.starts_with("/files"))
        .count();
    assert!(refused >= 1, "the proxy's 502 while paused: {during:#?}");
    // One resume for the pause during the command, one for each of the commands' 502s.
    let resumed = during
        .iter()
        .filter(|r| r.path.ends_with("/connect") && r.status == 201)
        .count();
    assert_eq!(
        resumed,
        refused + 1,
        "each pause resumed by connect: {during:#?}"
    );
    assert_eq!(w.creates(), 1, "nothing re-provisioned");
    assert_eq!(w.sandbox().id, id);
    assert_eq!(
        fs::read_to_string(w.project().join("src/laptop.ts")).unwrap(),
        "from the laptop\n"
    );
    assert_eq!(
        w.statuses.take(),
        [
            SandboxStatus::Syncing {
                since: None,
                step: None
            },
            // The sync restarted the dev server: ready once it answers.
            SandboxStatus::Starting {
                url: w.e2b.health_url()
            },
            SandboxStatus::Ready
        ]
    );
    // The steps the status showed as the sync went (how many depends on how long each took),
    // in the sync's order, each once.
    let steps = w.statuses.steps();
    let order: Vec<usize> = steps
        .iter()
        .map(|step| {
            SYNC_STEPS
                .iter()
                .position(|s| s == step)
                .expect("a sync step")
        })
        .collect();
    assert!(order.is_sorted_by(|a, b| a < b), "{steps:?}");

    // A push that breaks the install: the failure's tail in the sandbox's failure file and in
    // the status.
    w.laptop_push(&[
        ("package.json", "{\"name\": \"shmastra\", \"v\": 2}\n"),
        ("broken-dependency", ""),
    ]);
    let outcome = lifecycle.sync(&alice()).await.unwrap();
    let SyncOutcome::Failed { failure } = outcome else {
        panic!("{outcome:?}");
    };
    assert_eq!(failure.step, "install");
    assert!(
        failure
            .tail
            .contains("ERR_PNPM_NO_MATCHING_VERSION left-pad@99"),
        "{failure:?}"
    );
    let file = w.sandbox().home.join("tmp/shmastra-sync-failure");
    let written = fs::read_to_string(&file).unwrap();
    assert!(
        written.contains("ERR_PNPM_NO_MATCHING_VERSION"),
        "{written}"
    );
    let statuses = w.statuses.take();
    assert_eq!(
        statuses.last(),
        Some(&SandboxStatus::Broken {
            failure: failure.clone()
        }),
        "{statuses:?}"
    );
    assert_eq!(w.creates(), 1);
}
