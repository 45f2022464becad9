//! The watcher and the proxy together: the watcher's `project` remote is the proxy, its
//! `PROJECT_TOKEN` a minted project token, the upstream the embedded directory of bare
//! repositories behind real `git http-backend`. The watcher's saves fire no external-push
//! event; a developer's push from a plain clone fires exactly one.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cloud_core::EmbeddedUpstream;
use cloud_core::TokenSigner;
use cloud_core::UserId;
use cloud_core::{ExternalPush, Proxy, ProxyLimits};
use project_watcher::config::Config;
use project_watcher::daemon;
use testkit::git::{git, init_repo, tree_of, tree_of_add_all};
use testkit::wait::{PATIENCE, until};

const SECRET: &[u8] = b"e2e-proxy-watcher-secret-0123456789abcdef";

#[test]
fn watcher_saves_through_the_proxy_silently_and_a_developer_push_fires_one_event() {
    project_watcher::transport::init(project_watcher::transport::DEFAULT_NETWORK_TIMEOUT);
    let tmp = tempfile::tempdir().expect("tempdir");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");

    let signer = TokenSigner::new(SECRET).expect("secret");
    let alice = UserId::parse("alice").expect("user id");
    let token = signer.mint(&alice);
    let events: Arc<Mutex<Vec<ExternalPush>>> = Arc::default();
    let sink = events.clone();
    let upstream_dir = tmp.path().join("upstream");
    let proxy = Proxy::new(
        signer,
        Arc::new(EmbeddedUpstream::new(&upstream_dir).expect("upstream dir")),
        ProxyLimits::default(),
        Arc::new(move |push| sink.lock().expect("events").push(push)),
    );
    let app = axum_router(&proxy);
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    runtime.spawn(async move { axum::serve(listener, app).await });
    let remote = format!("http://{addr}/api/git/alice.git");

    let project = tmp.path().join("project");
    init_repo(&project);
    git(&project, ["remote", "add", "project", &remote]);
    let mut config = Config::new(&project);
    config.debounce = Duration::from_millis(150);
    config.max_delay = Duration::from_secs(2);
    config.token = Some(token.clone());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let watcher = runtime.spawn(daemon::run(config.validate().expect("config"), async {
        let _ = stopped.await;
    }));

    std::fs::write(project.join("index.ts"), "export const answer = 42;\n").expect("write");
    let bare = upstream_dir.join("alice.git");
    until(PATIENCE, "the edit to reach the upstream", || {
        // The embedded upstream creates the repository on the watcher's first request.
        if !bare.join("HEAD").exists() {
            return None;
        }
        let expected = tree_of_add_all(&project);
        (tree_of(&bare, "main").as_deref() == Some(expected.as_str())).then_some(())
    });
    assert_eq!(
        git(&bare, ["show", "main:index.ts"]),
        "export const answer = 42;\n"
    );
    assert!(
        events.lock().expect("events").is_empty(),
        "the watcher's own push fired {:?}",
        events.lock().expect("events")
    );

    // Stop the watcher first: its reaction to the developer's push is the sync's business.
    stop.send(()).expect("watcher running");
    runtime
        .block_on(watcher)
        .expect("watcher task")
        .expect("watcher exits cleanly");

    let clone = tmp.path().join("clone");
    let with_token = remote.replacen("http://", &format!("http://dev:{token}@"), 1);
    git(
        tmp.path(),
        [
            "clone".as_ref(),
            "-q".as_ref(),
            with_token.as_ref(),
            clone.as_os_str(),
        ],
    );
    std::fs::write(clone.join("index.ts"), "export const answer = 43;\n").expect("write");
    git(&clone, ["commit", "-qam", "from a laptop"]);
    git(&clone, ["push", "-q", "origin", "main"]);
    let pushed = git(&clone, ["rev-parse", "HEAD"]).trim().to_owned();

    assert_eq!(git(&bare, ["rev-parse", "main"]).trim(), pushed);
    assert_eq!(
        *events.lock().expect("events"),
        vec![ExternalPush {
            user: alice,
            refname: "refs/heads/main".into(),
            new_oid: pushed,
        }]
    );
}

fn axum_router(proxy: &Arc<Proxy>) -> axum::Router {
    axum::Router::new().nest("/api/git", proxy.router())
}
