//! `cloud_core::http_backend` against the real git client: clone, fetch and push over smart
//! HTTP, protocol v0 and v2, gzip and chunked bodies, and the receive-pack gate.

use std::fs;
use std::path::Path;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use testkit::git::{git, git_output, init_repo, tree_of};
use testkit::git_server::GitServer;

fn commit_file(repo: &Path, name: &str, contents: &[u8]) {
    fs::write(repo.join(name), contents).unwrap();
    git(repo, ["add", "-A"]);
    git(repo, ["commit", "-q", "-m", name]);
}

/// Bytes that do not compress, so a pack of them is as large as they are.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn push_then_clone_round_trips_with_both_protocol_versions() {
    let tmp = tempfile::tempdir().unwrap();
    let server = GitServer::start(&tmp.path().join("srv"));
    let bare = server.create_bare("alice.git");
    let work = tmp.path().join("work");
    init_repo(&work);
    commit_file(&work, "a.txt", b"hello\n");
    // A 3 MiB pack with a tiny post buffer forces a chunked request body.
    commit_file(&work, "big.bin", &noise(3 << 20, 7));
    git(
        &work,
        [
            "-c",
            "http.postBuffer=65536",
            "push",
            "-q",
            &server.url("alice.git"),
            "main",
        ],
    );
    assert_eq!(tree_of(&bare, "main"), tree_of(&work, "main"));

    for version in ["0", "2"] {
        let clone = tmp.path().join(format!("clone-v{version}"));
        let out = testkit::git::command(tmp.path())
            .env("GIT_TRACE_PACKET", "1")
            .args(["-c", &format!("protocol.version={version}")])
            .args(["clone", "-q", &server.url("alice.git")])
            .arg(&clone)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let trace = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            trace.contains("< version 2"),
            version == "2",
            "protocol v{version} negotiated as expected"
        );
        assert_eq!(tree_of(&clone, "HEAD"), tree_of(&work, "main"));
        assert_eq!(fs::read(clone.join("a.txt")).unwrap(), b"hello\n");
    }
}

#[test]
fn a_large_fetch_request_arrives_gzipped_and_still_works() {
    let tmp = tempfile::tempdir().unwrap();
    let server = GitServer::start(&tmp.path().join("srv"));
    server.create_bare("r.git");
    let work = tmp.path().join("work");
    init_repo(&work);
    // One tag per commit: a clone then wants 60 objects, a request over git's 1 KiB gzip line.
    for i in 0..60 {
        commit_file(&work, &format!("f{i}.txt"), format!("{i}\n").as_bytes());
        git(&work, ["tag", &format!("t{i}")]);
    }
    git(
        &work,
        ["push", "-q", "--tags", &server.url("r.git"), "main"],
    );

    let clone = tmp.path().join("clone");
    let out = testkit::git::command(tmp.path())
        .args([
            "-c",
            "protocol.version=0",
            "clone",
            "-q",
            &server.url("r.git"),
        ])
        .arg(&clone)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(git(&clone, ["tag"]).lines().count(), 60);
    assert!(
        server
            .requests()
            .iter()
            .any(|r| r.content_encoding.as_deref() == Some("gzip")),
        "git sent a gzipped request: {:?}",
        server.requests()
    );
}

#[test]
fn a_missing_repository_is_a_clear_failure() {
    let tmp = tempfile::tempdir().unwrap();
    let server = GitServer::start(&tmp.path().join("srv"));
    fs::create_dir_all(tmp.path().join("srv")).unwrap();
    let out = git_output(tmp.path(), ["ls-remote", &server.url("nobody.git")]);
    assert!(!out.status.success());
    let paths: Vec<_> = server.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(paths, ["/nobody.git/info/refs?service=git-upload-pack"]);
}

#[tokio::test]
async fn receive_pack_is_refused_without_a_remote_user_and_allowed_with_one() {
    let tmp = tempfile::tempdir().unwrap();
    testkit::git::init_bare(&tmp.path().join("r.git"));
    let advertise = || {
        Request::get("/r.git/info/refs?service=git-receive-pack")
            .body(Empty::<Bytes>::new())
            .unwrap()
    };
    let anonymous =
        cloud_core::http_backend::serve(tmp.path(), advertise(), "/r.git/info/refs", None).await;
    assert_eq!(anonymous.status(), StatusCode::FORBIDDEN);

    let alice =
        cloud_core::http_backend::serve(tmp.path(), advertise(), "/r.git/info/refs", Some("alice"))
            .await;
    assert_eq!(alice.status(), StatusCode::OK);
    assert_eq!(
        alice.headers()["content-type"],
        "application/x-git-receive-pack-advertisement"
    );
    let body = alice.into_body().collect().await.unwrap().to_bytes();
    assert!(
        body.starts_with(b"001f# service=git-receive-pack\n"),
        "{body:?}"
    );
}
