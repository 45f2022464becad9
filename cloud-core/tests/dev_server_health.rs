//! "Ready" means the dev server answers: after re-provisioning a sandbox (`LocalProvider`,
//! the feature off, so starting is only the dev server), the status is `Starting` until its
//! health URL answers 2xx (polled with node from inside the sandbox), then `Ready`; a dev server
//! that never comes up is `Broken` at step `dev server health`, with the probe's last answer
//! and the dev server's log in the failure.

use std::sync::Arc;
use std::time::Duration;

use cloud_core::{
    EmbeddedUpstream, HEALTH_STEP, HealthCheck, Lifecycle, LocalProvider, OrchestrateError,
    Orchestrator, SandboxLayout, SandboxStatus,
};
use testkit::net::free_port;
use testkit::statuses::Statuses;

fn lifecycle(
    tmp: &std::path::Path,
    start_dev_server: String,
    port: u16,
) -> (Lifecycle<LocalProvider, EmbeddedUpstream>, Arc<Statuses>) {
    let template = tmp.join("template");
    std::fs::create_dir_all(template.join("shmastra")).unwrap();
    let mut layout = SandboxLayout::shmastra();
    layout.start_dev_server = start_dev_server;
    layout.health = Some(HealthCheck {
        url: format!("http://127.0.0.1:{port}/health"),
        timeout: Duration::from_secs(4),
        interval: Duration::from_millis(100),
        log: Some("dev.log".into()),
    });
    let statuses = Arc::new(Statuses::only_for("alice"));
    let lifecycle = Lifecycle::new(
        LocalProvider::new(tmp.join("sandboxes"), template),
        Orchestrator::new(None, layout),
        statuses.clone(),
    );
    (lifecycle, statuses)
}

fn alice() -> cloud_core::UserId {
    cloud_core::UserId::parse("alice").unwrap()
}

#[tokio::test]
async fn ready_waits_for_the_dev_server_to_answer_its_health_url() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    // Up a second after its start command returned, as a dev server compiling first is.
    let server = format!(
        "nohup node -e \"setTimeout(() => require('http').createServer((q, r) => r.end(q.url)).listen({port}, '127.0.0.1'), 1000)\" > \"$HOME/dev.log\" 2>&1 & echo $! > \"$HOME/dev.pid\""
    );
    let (lifecycle, statuses) = lifecycle(tmp.path(), server, port);
    let result = lifecycle.reprovision(&alice(), Vec::new()).await;
    let pid = std::fs::read_to_string(tmp.path().join("sandboxes/alice/dev.pid")).unwrap();
    let _ = std::process::Command::new("kill").arg(pid.trim()).status();
    result.unwrap();
    let all = statuses.all();
    assert_eq!(
        all[all.len() - 2..],
        [
            SandboxStatus::Starting {
                url: format!("http://127.0.0.1:{port}/health")
            },
            SandboxStatus::Ready
        ],
        "{all:?}"
    );
}

#[tokio::test]
async fn a_dev_server_that_never_answers_is_broken_at_its_own_step() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let crash = "echo 'Error: Cannot find module @mastra/core' > \"$HOME/dev.log\"".to_owned();
    let (lifecycle, statuses) = lifecycle(tmp.path(), crash, port);
    let err = lifecycle
        .reprovision(&alice(), Vec::new())
        .await
        .unwrap_err();
    let OrchestrateError::DevServerDown { failure } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(failure.step, HEALTH_STEP);
    assert!(
        failure.message.contains("did not answer") && failure.message.contains("within 4s"),
        "{failure:?}"
    );
    assert!(
        failure.tail.contains("ECONNREFUSED"),
        "the probe's last answer: {failure:?}"
    );
    assert!(
        failure
            .tail
            .contains("Error: Cannot find module @mastra/core"),
        "the dev server's log: {failure:?}"
    );
    assert_eq!(
        statuses.last(),
        Some(SandboxStatus::Broken {
            failure: failure.clone()
        })
    );
}
