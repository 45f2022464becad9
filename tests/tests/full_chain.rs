//! The whole loop on one machine: `serve` with the embedded upstream, a sandbox restored and
//! provisioned by the orchestrator, the real watcher pushing through the proxy, a developer's
//! push from a laptop clone firing the external-push command, and the sync that follows.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cloud_core::EmbeddedUpstream;
use cloud_core::LocalSandbox;
use cloud_core::ProxyLimits;
use cloud_core::TokenSigner;
use cloud_core::UserId;
use cloud_core::{ConnectionLimits, ServeConfig, UpstreamChoice, serve};
use cloud_core::{Orchestrator, Persistence, SandboxLayout, SandboxStatus, SyncOutcome};
use testkit::git::{git, git_output, hermetic_env, init_repo, tree_of, tree_of_add_all};
use testkit::statuses::Statuses;
use testkit::wait::{PATIENCE, until_async};

/// The watcher as a plain background process (PM2's part is covered by `pm2.rs`): started
/// from the environment file provision wrote, stopped with SIGINT and waited for.
fn layout(watcher: &Path) -> SandboxLayout {
    let watcher = watcher.display();
    SandboxLayout {
        project_dir: "project".into(),
        watcher_env_file: ".project-watcher/.env".into(),
        watcher_bin: watcher.to_string(),
        start_watcher: format!(
            "set -a; . \"$HOME/.project-watcher/.env\"; set +a; \
             nohup '{watcher}' watch --debounce 200ms --max-delay 2s >> \"$HOME/watcher.log\" 2>&1 & \
             echo $! > \"$HOME/watcher.pid\""
        ),
        stop_watcher: "pid=$(cat \"$HOME/watcher.pid\") && kill -INT $pid && \
             while kill -0 $pid 2>/dev/null; do sleep 0.05; done"
            .into(),
        watcher_running: "kill -0 $(cat \"$HOME/watcher.pid\" 2>/dev/null) 2>/dev/null".into(),
        start_dev_server: "echo start-dev >> \"$HOME/log\"".into(),
        stop_dev_server: "echo stop-dev >> \"$HOME/log\"".into(),
        install_cmd: Some("true".into()),
        failure_file: "sync-failure".into(),
        command_timeout: PATIENCE,
        sync_timeout: Duration::from_secs(120),
        health: None,
        exclude: Vec::new(),
    }
}

/// Stops the background watcher however the test ends.
struct KillWatcher(PathBuf);

impl Drop for KillWatcher {
    fn drop(&mut self) {
        if let Ok(pid) = fs::read_to_string(self.0.join("watcher.pid")) {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", pid.trim()])
                .status();
        }
    }
}

fn upstream_has(repo: &Path, path: &str) -> bool {
    git_output(repo, ["cat-file", "-e", &format!("main:{path}")])
        .status
        .success()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_from_a_laptop_reaches_the_running_sandbox_through_proxy_and_sync() {
    let tmp = tempfile::tempdir().unwrap();
    let upstream_dir = tmp.path().join("upstream");
    let events = tmp.path().join("external-pushes");
    let signer = TokenSigner::new(&[5u8; 32]).unwrap();
    let (addr_tx, addr_rx) = tokio::sync::oneshot::channel();
    let (stop_serve, serve_stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(
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
            sync_lease: std::time::Duration::from_secs(30),
            token_state_max_age: std::time::Duration::from_secs(30),
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

    let home = tmp.path().join("sandbox-home");
    let project = home.join("project");
    fs::create_dir_all(&project).unwrap();
    fs::write(project.join("index.ts"), "template\n").unwrap();
    let _kill = KillWatcher(home.clone());
    let mut sandbox = LocalSandbox::new("sbx", &home);
    for (name, value) in hermetic_env(&home) {
        if name != "HOME" {
            sandbox = sandbox.with_env(name, value.display().to_string());
        }
    }
    let orchestrator = Orchestrator::new(
        Some(Persistence {
            host: EmbeddedUpstream::new(&upstream_dir).unwrap(),
            signer: signer.clone(),
            git_url: git_url.clone(),
        }),
        layout(&testkit::cargo_bin::project_watcher()),
    );
    let alice = UserId::parse("alice").unwrap();
    let upstream = upstream_dir.join("alice.git");

    // A new user: nothing saved yet, no form; the watcher then saves the template.
    let plan = orchestrator.begin_restore(&sandbox, &alice).await.unwrap();
    assert!(plan.secret_names().is_empty());
    orchestrator
        .finish_restore(&sandbox, &plan, Vec::new())
        .await
        .unwrap();
    until_async(PATIENCE, "the watcher's first push", || async {
        upstream_has(&upstream, "index.ts").then_some(())
    })
    .await;

    // A developer pushes from a laptop clone with the project token.
    let token = signer.mint(&alice);
    let authed = git_url.replace("http://", &format!("http://dev:{token}@"));
    git(
        tmp.path(),
        ["clone", "-q", &format!("{authed}/alice.git"), "laptop"],
    );
    let laptop = tmp.path().join("laptop");
    init_repo(&laptop);
    fs::write(laptop.join("index.ts"), "from the laptop\n").unwrap();
    git(&laptop, ["commit", "-qam", "laptop change"]);
    git(&laptop, ["push", "-q", "origin", "main"]);
    let laptop_head = git(&laptop, ["rev-parse", "HEAD"]).trim().to_owned();
    let laptop_event = format!("alice refs/heads/main {laptop_head}\n");
    // The laptop's event is the sentinel: the commands run in arrival order, so by the time
    // it ran, one for the watcher's own earlier push would have run too.
    let event = until_async(PATIENCE, "the external-push command", || async {
        fs::read_to_string(&events)
            .ok()
            .filter(|e| e.contains(&laptop_head))
    })
    .await;
    assert_eq!(
        event, laptop_event,
        "the watcher's own push is not external"
    );

    // The cloud answers the event with a sync.
    let statuses = Statuses::default();
    assert_eq!(
        orchestrator.sync(&sandbox, &alice, &statuses).await,
        SyncOutcome::Synced {
            commit: Some(laptop_head.clone())
        }
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
        fs::read_to_string(project.join("index.ts")).unwrap(),
        "from the laptop\n"
    );
    assert_eq!(
        tree_of_add_all(&project),
        tree_of(&upstream, "main").unwrap()
    );

    // The watcher goes on saving on top of the laptop's commit, and that is not external.
    fs::write(project.join("next.ts"), "after the sync\n").unwrap();
    until_async(PATIENCE, "the watcher's push after the sync", || async {
        upstream_has(&upstream, "next.ts").then_some(())
    })
    .await;
    assert_eq!(
        git(&upstream, ["show", "main:index.ts"]),
        "from the laptop\n"
    );
    // Sentinel: a laptop push to another branch; once its command ran, one for the watcher's
    // push above would have run too.
    git(
        &laptop,
        ["push", "-q", "origin", "HEAD:refs/heads/sentinel"],
    );
    let sentinel_event = format!("alice refs/heads/sentinel {laptop_head}\n");
    let all = until_async(PATIENCE, "the sentinel's external-push command", || async {
        fs::read_to_string(&events)
            .ok()
            .filter(|e| e.contains("refs/heads/sentinel"))
    })
    .await;
    assert_eq!(
        all,
        format!("{laptop_event}{sentinel_event}"),
        "the watcher's push after the sync is not external"
    );

    orchestrator
        .with_watcher_stopped(&sandbox, || async { Ok::<(), ()>(()) })
        .await
        .unwrap()
        .unwrap();
    let _ = stop_serve.send(());
    server.await.unwrap().unwrap();
}
