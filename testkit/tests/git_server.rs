//! The test git server's faults, seen by the real git client.

use std::path::Path;

use testkit::git::{git, git_output, init_repo};
use testkit::git_server::{Fault, GitServer};

fn repo_with_a_commit(dir: &Path) {
    init_repo(dir);
    std::fs::write(dir.join("a.txt"), "a\n").unwrap();
    git(dir, ["add", "-A"]);
    git(dir, ["commit", "-q", "-m", "a"]);
}

fn push(work: &Path, url: &str) -> (bool, String) {
    let out = git_output(
        work,
        [
            "-c",
            "http.lowSpeedLimit=1",
            "-c",
            "http.lowSpeedTime=1",
            "push",
            url,
            "main",
        ],
    );
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn each_fault_fails_a_push_and_clearing_it_lets_the_push_through() {
    let tmp = tempfile::tempdir().unwrap();
    let server = GitServer::start(&tmp.path().join("srv"));
    let bare = server.create_bare("r.git");
    let work = tmp.path().join("work");
    repo_with_a_commit(&work);
    let url = server.url("r.git");

    let cases = [
        (Fault::RefuseConnections, "Failed to connect"),
        (Fault::Status500, "500"),
        (Fault::Status403, "403"),
        (Fault::Stall, "Operation too slow"),
    ];
    for (fault, expected) in cases {
        server.set_fault(fault);
        let (ok, stderr) = push(&work, &url);
        assert!(!ok, "{fault:?} must fail the push");
        assert!(stderr.contains(expected), "{fault:?}: {stderr}");
        assert!(testkit::git::tree_of(&bare, "main").is_none());
    }
    server.set_fault(Fault::None);
    let (ok, stderr) = push(&work, &url);
    assert!(ok, "{stderr}");
    assert_eq!(
        testkit::git::tree_of(&bare, "main"),
        testkit::git::tree_of(&work, "main")
    );
}

#[test]
fn a_required_password_is_checked_and_recorded() {
    let tmp = tempfile::tempdir().unwrap();
    let server = GitServer::start(&tmp.path().join("srv"));
    server.create_bare("r.git");
    let work = tmp.path().join("work");
    repo_with_a_commit(&work);
    server.require_password("s3cret");
    let base = server.base_url();
    let host = base.trim_start_matches("http://");

    let (ok, stderr) = push(&work, &format!("http://u:wrong@{host}/r.git"));
    assert!(!ok);
    assert!(stderr.contains("Authentication failed"), "{stderr}");

    let (ok, stderr) = push(&work, &format!("http://u:s3cret@{host}/r.git"));
    assert!(ok, "{stderr}");
    let last = server.requests().pop().unwrap();
    assert_eq!(last.basic_password().as_deref(), Some("s3cret"));
    assert!(last.user_agent.unwrap().starts_with("git/"));
}

#[test]
fn a_pre_receive_rejection_reaches_the_client_with_its_message() {
    let tmp = tempfile::tempdir().unwrap();
    let server = GitServer::start(&tmp.path().join("srv"));
    let bare = server.create_bare("r.git");
    let work = tmp.path().join("work");
    repo_with_a_commit(&work);
    server.install_pre_receive_reject("r.git", "quota exceeded: it's full");

    let (ok, stderr) = push(&work, &server.url("r.git"));
    assert!(!ok);
    assert!(stderr.contains("quota exceeded: it's full"), "{stderr}");
    assert!(stderr.contains("pre-receive hook declined"), "{stderr}");
    assert!(testkit::git::tree_of(&bare, "main").is_none());

    server.remove_pre_receive("r.git");
    let (ok, stderr) = push(&work, &server.url("r.git"));
    assert!(ok, "{stderr}");
}

#[test]
fn https_serves_the_same_to_a_client_that_trusts_the_fixture_certificate() {
    let tmp = tempfile::tempdir().unwrap();
    let server = GitServer::start_https(&tmp.path().join("srv"));
    let bare = server.create_bare("r.git");
    let work = tmp.path().join("work");
    repo_with_a_commit(&work);
    let url = server.url("r.git");
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");

    let untrusted = git_output(&work, ["push", &url, "main"]);
    assert!(
        !untrusted.status.success(),
        "an unknown certificate is refused"
    );

    let out = testkit::git::command(&work)
        .env("GIT_SSL_CAINFO", testkit::git_server::LOOPBACK_CA_FILE)
        .args(["push", &url, "main"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        testkit::git::tree_of(&bare, "main"),
        testkit::git::tree_of(&work, "main")
    );
}
