//! `shmastra-cloud serve` attacked by one tenant against another: look-alike user ids,
//! rewritten history, revoked tokens, against the real binary, real git and a GitLab double
//! that resolves project paths case-insensitively as GitLab does.

mod common;

use testkit::git::{git, git_output};

use common::attack::*;
use common::work_tree;

/// GitLab resolves `group/alice` to a project named `group/Alice`. An upper-case id is refused
/// at the edge, and the project GitLab answers with is checked against the one asked for
/// before any git traffic goes to it.
#[test]
fn user_ids_differing_in_case_never_reach_another_tenants_project() {
    let setup = GitLabSetup::start();
    let victim = setup.project("Alice");
    let seed = tempfile::tempdir().expect("tempdir");
    let secret_head = work_tree(seed.path(), victim.to_str().expect("utf-8"));
    git(seed.path(), ["push", "-q", "origin", "main"]);

    let out = token_command("mint", "Alice", &[]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("upper-case"), "{stderr}");

    let serve = setup.serve(&[]);
    let git_requests = setup.server.requests().len();
    let out = git_output(serve.tmp.path(), ["ls-remote", &serve.remote_url("alice")]);
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success(),
        "alice listed Alice's project: {listed}"
    );
    assert!(!listed.contains(&secret_head));
    assert_eq!(
        setup.server.requests().len(),
        git_requests,
        "no git traffic went to another tenant's project"
    );
    assert!(
        serve.logs().contains("another tenant's project"),
        "{}",
        serve.logs()
    );
    assert!(
        setup.gitlab.projects().iter().all(|p| p.path != "alice"),
        "no look-alike project was created either"
    );
}

/// Any token holder could force-push `main` to an unrelated root and delete `recovery/*`
/// branches and tags. The embedded upstream protects them as GitLab protects the default
/// branch; `--allow-history-rewrite` is the documented switch.
#[test]
fn history_is_protected_unless_the_operator_allows_rewriting_it() {
    for allow in [false, true] {
        let extra: &[&str] = if allow {
            &["--allow-history-rewrite"]
        } else {
            &[]
        };
        let (serve, up_dir) = embedded(extra);
        let up = up_dir.path();
        let bare = up.join("alice.git");
        let work = serve.tmp.path().join("work");
        let head = work_tree(&work, &serve.remote_url("alice"));
        git(&work, ["tag", "v1"]);
        git(
            &work,
            [
                "push",
                "-q",
                "origin",
                "main",
                "main:refs/heads/recovery/20260101T000000Z",
                "main:refs/heads/feature",
                "v1",
            ],
        );
        git(&work, ["checkout", "-q", "--orphan", "unrelated"]);
        std::fs::write(work.join("a.txt"), "rewritten\n").expect("write");
        git(&work, ["commit", "-qam", "unrelated root"]);
        let root = git(&work, ["rev-parse", "HEAD"]).trim().to_owned();
        let attempts: [&[&str]; 3] = [
            &["push", "-q", "-f", "origin", "unrelated:main"],
            &[
                "push",
                "-q",
                "origin",
                ":refs/heads/recovery/20260101T000000Z",
            ],
            &["push", "-q", "origin", ":refs/tags/v1"],
        ];
        for attempt in attempts {
            let out = git_output(&work, attempt);
            assert_eq!(
                out.status.success(),
                allow,
                "{attempt:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            if !allow {
                assert!(String::from_utf8_lossy(&out.stderr).contains("is protected"));
            }
        }
        let refs = git(&bare, ["for-each-ref", "--format=%(refname) %(objectname)"]);
        if allow {
            assert!(
                !refs.contains("refs/tags/v1") && !refs.contains("recovery/"),
                "{refs}"
            );
        } else {
            assert!(refs.contains(&format!("refs/heads/main {head}")), "{refs}");
            assert!(
                refs.contains("refs/heads/recovery/20260101T000000Z"),
                "{refs}"
            );
            assert!(refs.contains("refs/tags/v1"), "{refs}");
            // Other branches stay the user's to delete; main still moves forward.
            git(&work, ["push", "-q", "origin", ":feature"]);
            git(&work, ["checkout", "-q", "main"]);
            std::fs::write(work.join("c.txt"), "c\n").expect("write");
            git(&work, ["add", "-A"]);
            git(&work, ["commit", "-qm", "forward"]);
            git(&work, ["push", "-q", "origin", "main"]);
        }
        // The refused force-push fired no event with the unrelated root.
        if !allow {
            let events = serve.events();
            assert!(!events.iter().any(|e| e.contains(&root)), "{events:?}");
        }
    }
}

/// Tokens were valid forever and could not be revoked per user. Revoking (or rotating) one
/// user's token refuses it at the next request, without a restart, while every other user's
/// token and the signing secret stay as they are.
#[test]
fn a_revoked_token_is_refused_at_once_and_other_users_keep_theirs() {
    let state = tempfile::tempdir().expect("tempdir");
    let state_dir = state.path().to_str().expect("utf-8");
    let env = [("SHMASTRA_TOKEN_STATE", state_dir)];
    let up = tempfile::tempdir().expect("tempdir");
    let serve = serve(
        &["--upstream-dir", up.path().to_str().expect("utf-8")],
        &env,
    );
    let refs = |user: &str| {
        format!(
            "{}/api/git/{user}.git/info/refs?service=git-upload-pack",
            serve.url("")
        )
    };
    let leaked = token("alice", &env);
    let bobs = token("bob", &env);
    assert_eq!(get_with(&refs("alice"), Some(&leaked)).0, 200);

    let out = token_command("rotate", "alice", &env);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rotated = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert_ne!(rotated, leaked);
    assert_eq!(
        get_with(&refs("alice"), Some(&leaked)).0,
        401,
        "the leaked token is refused"
    );
    assert_eq!(get_with(&refs("alice"), Some(&rotated)).0, 200);
    assert_eq!(
        get_with(&refs("bob"), Some(&bobs)).0,
        200,
        "bob's token still works"
    );
    assert_eq!(
        token("alice", &env),
        rotated,
        "mint prints the current token"
    );

    let out = token_command("revoke", "alice", &env);
    assert!(out.status.success());
    assert_eq!(get_with(&refs("alice"), Some(&rotated)).0, 401);
    // Without the state directory there is nowhere to record a revocation: a usage error.
    let out = token_command("revoke", "alice", &[]);
    assert_eq!(out.status.code(), Some(2));
}
