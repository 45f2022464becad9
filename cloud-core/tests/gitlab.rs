//! The GitLab client against the fake GitLab: the smoke test's diagnoses, idempotent project
//! provisioning, the create race, retries, timeouts and the rejected-token latch.

use std::time::{Duration, Instant};

use cloud_core::Config;
use cloud_core::UserId;
use cloud_core::{GitLab, GitLabError, RetryPolicy};
use secrecy::SecretString;
use testkit::fake_gitlab::{FakeGitLab, Fault, GROUP_ID, GROUP_PATH, SERVICE_TOKEN};

fn fast_retries() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 3,
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(50),
        max_retry_after: Duration::from_secs(5),
    }
}

fn client_with(fake: &FakeGitLab, token: &str, timeout: Duration) -> GitLab {
    let mut config = Config::new(&fake.api_url(), GROUP_ID, SecretString::from(token)).unwrap();
    config.request_timeout = timeout;
    GitLab::with_retry_policy(&config, fast_retries()).unwrap()
}

fn client(fake: &FakeGitLab) -> GitLab {
    client_with(fake, SERVICE_TOKEN, Duration::from_secs(10))
}

fn alice() -> UserId {
    UserId::parse("alice").unwrap()
}

#[tokio::test]
async fn check_returns_the_group_and_sends_the_token_header() {
    let fake = FakeGitLab::start().await;
    let group = client(&fake).check().await.unwrap();
    assert_eq!((group.id, group.full_path.as_str()), (GROUP_ID, GROUP_PATH));
    let requests = fake.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(
        requests[0].path,
        format!("/api/v4/groups/{GROUP_ID}?with_projects=false")
    );
    assert_eq!(requests[0].private_token.as_deref(), Some(SERVICE_TOKEN));
    assert!(
        requests[0]
            .user_agent
            .as_deref()
            .unwrap()
            .starts_with("shmastra-cloud/")
    );
}

#[tokio::test]
async fn check_explains_a_missing_membership() {
    let fake = FakeGitLab::start().await;
    fake.set_member(false);
    let err = client(&fake).check().await.unwrap_err();
    assert!(
        matches!(
            err,
            GitLabError::GroupNotFound {
                group_id: GROUP_ID,
                ..
            }
        ),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("not a member") && text.contains("Maintainer"),
        "{text}"
    );
    assert!(!err.is_transient());
}

#[tokio::test]
async fn a_rejected_token_is_sent_once_and_never_again() {
    let fake = FakeGitLab::start().await;
    let gitlab = client_with(&fake, "glpat-wrong", Duration::from_secs(10));
    let err = gitlab.check().await.unwrap_err();
    assert!(matches!(err, GitLabError::Unauthorized { .. }), "{err:?}");
    assert!(err.to_string().contains("401"), "{err}");
    assert!(!err.to_string().contains("glpat-wrong"));

    let again = gitlab.clone().check().await.unwrap_err();
    assert!(matches!(again, GitLabError::Unauthorized { .. }));
    let ensure = gitlab.ensure_user_project(&alice()).await.unwrap_err();
    assert!(matches!(ensure, GitLabError::Unauthorized { .. }));
    assert_eq!(
        fake.requests().len(),
        1,
        "the rejected token went out again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_calls_send_a_wrong_token_once() {
    let fake = FakeGitLab::start().await;
    let gitlab = client_with(&fake, "glpat-wrong", Duration::from_secs(10));
    let calls: Vec<_> = (0..5)
        .map(|_| {
            let gitlab = gitlab.clone();
            tokio::spawn(async move { gitlab.check().await })
        })
        .collect();
    for call in calls {
        let err = call.await.unwrap().unwrap_err();
        assert!(matches!(err, GitLabError::Unauthorized { .. }), "{err:?}");
    }
    assert_eq!(fake.requests().len(), 1);
}

#[tokio::test]
async fn concurrent_calls_with_a_good_token_all_succeed() {
    let fake = FakeGitLab::start().await;
    let gitlab = client(&fake);
    let calls: Vec<_> = (0..5)
        .map(|i| {
            let gitlab = gitlab.clone();
            tokio::spawn(async move {
                gitlab
                    .ensure_user_project(&UserId::parse(&format!("user{i}")).unwrap())
                    .await
            })
        })
        .collect();
    for call in calls {
        call.await.unwrap().unwrap();
    }
    assert_eq!(fake.projects().len(), 5);
}

#[tokio::test]
async fn ensure_creates_a_private_project_on_miss_then_finds_it() {
    let fake = FakeGitLab::start().await;
    let gitlab = client(&fake);
    let created = gitlab.ensure_user_project(&alice()).await.unwrap();
    assert_eq!(created.path_with_namespace, format!("{GROUP_PATH}/alice"));
    assert!(
        created
            .http_url_to_repo
            .ends_with(&format!("/{GROUP_PATH}/alice.git")),
        "{created:?}"
    );

    let projects = fake.projects();
    assert_eq!(projects.len(), 1);
    assert_eq!(projects[0].id, created.id);
    assert_eq!(projects[0].namespace_id, GROUP_ID);
    assert_eq!(projects[0].visibility, "private");
    assert_eq!(
        fake.count("GET", &format!("/api/v4/projects/{GROUP_PATH}%2Falice")),
        1
    );

    let found = client(&fake).ensure_user_project(&alice()).await.unwrap();
    assert_eq!(found, created);
    assert_eq!(
        fake.count("POST", "/api/v4/projects"),
        1,
        "the second call created again"
    );
    assert_eq!(fake.projects().len(), 1);
}

#[tokio::test]
async fn an_existing_project_is_found_without_a_create() {
    let fake = FakeGitLab::start().await;
    let existing = fake.add_project("bob");
    let project = client(&fake)
        .ensure_user_project(&UserId::parse("bob").unwrap())
        .await
        .unwrap();
    assert_eq!(project.id, existing.id);
    assert_eq!(fake.count("POST", "/"), 0);
}

#[tokio::test]
async fn a_lost_create_race_counts_as_found() {
    let fake = FakeGitLab::start().await;
    fake.lose_next_create_race();
    let project = client(&fake).ensure_user_project(&alice()).await.unwrap();
    let projects = fake.projects();
    assert_eq!(projects.len(), 1);
    assert_eq!(project.id, projects[0].id);
    assert_eq!(fake.count("POST", "/api/v4/projects"), 1);
    assert_eq!(
        fake.count("GET", "/api/v4/projects/"),
        2,
        "looked up, created (lost), looked up again"
    );
}

#[tokio::test]
async fn no_right_to_create_projects_is_explained() {
    let fake = FakeGitLab::start().await;
    fake.set_can_create_projects(false);
    let err = client(&fake)
        .ensure_user_project(&alice())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            GitLabError::CannotCreateProjects {
                group_id: GROUP_ID,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("Maintainer"), "{err}");
    assert!(fake.projects().is_empty());
}

#[tokio::test]
async fn too_many_requests_waits_for_retry_after() {
    let fake = FakeGitLab::start().await;
    fake.push_fault(Fault::TooManyRequests {
        retry_after_secs: 1,
    });
    let started = Instant::now();
    let group = client(&fake).check().await.unwrap();
    assert_eq!(group.id, GROUP_ID);
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "retried before Retry-After: {:?}",
        started.elapsed()
    );
    assert_eq!(fake.count("GET", "/api/v4/groups/"), 2);
}

#[tokio::test]
async fn a_retry_after_beyond_the_cap_gives_up_at_once() {
    let fake = FakeGitLab::start().await;
    fake.push_fault(Fault::TooManyRequests {
        retry_after_secs: 3600,
    });
    let err = client(&fake).check().await.unwrap_err();
    assert!(
        matches!(
            err,
            GitLabError::Unavailable {
                status: 429,
                attempts: 1,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.is_transient());
    assert_eq!(fake.requests().len(), 1);
}

#[tokio::test]
async fn a_server_error_is_retried_then_succeeds() {
    let fake = FakeGitLab::start().await;
    fake.push_fault(Fault::ServerError);
    fake.push_fault(Fault::ServerError);
    let project = client(&fake).ensure_user_project(&alice()).await.unwrap();
    assert_eq!(project.path_with_namespace, format!("{GROUP_PATH}/alice"));
    assert_eq!(fake.count("GET", "/api/v4/groups/"), 3);
}

#[tokio::test]
async fn persistent_server_errors_give_up_after_the_policy_attempts() {
    let fake = FakeGitLab::start().await;
    for _ in 0..3 {
        fake.push_fault(Fault::ServerError);
    }
    let err = client(&fake).check().await.unwrap_err();
    assert!(
        matches!(
            err,
            GitLabError::Unavailable {
                status: 500,
                attempts: 3,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("500 Internal Server Error"),
        "{err}"
    );
    assert_eq!(fake.requests().len(), 3);
}

#[tokio::test]
async fn a_hung_server_times_out() {
    let fake = FakeGitLab::start().await;
    for _ in 0..3 {
        fake.push_fault(Fault::Hang);
    }
    let started = Instant::now();
    let err = client_with(&fake, SERVICE_TOKEN, Duration::from_millis(300))
        .check()
        .await
        .unwrap_err();
    assert!(
        matches!(err, GitLabError::Timeout { attempts: 3, .. }),
        "{err:?}"
    );
    assert!(err.is_transient());
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_hang_then_an_answer_recovers() {
    let fake = FakeGitLab::start().await;
    fake.push_fault(Fault::Hang);
    let group = client_with(&fake, SERVICE_TOKEN, Duration::from_millis(300))
        .check()
        .await
        .unwrap();
    assert_eq!(group.id, GROUP_ID);
}

#[tokio::test]
async fn user_project_is_served_from_the_cache() {
    let fake = FakeGitLab::start().await;
    let gitlab = client(&fake);
    let first = gitlab.user_project(&alice()).await.unwrap();
    let sent = fake.requests().len();
    assert_eq!(gitlab.user_project(&alice()).await.unwrap(), first);
    assert_eq!(
        fake.requests().len(),
        sent,
        "a cached project cost a request"
    );
    gitlab.forget(&alice());
    assert_eq!(gitlab.user_project(&alice()).await.unwrap(), first);
    assert!(fake.requests().len() > sent);
}

#[tokio::test]
async fn an_unreachable_gitlab_is_transient() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/api/v4", listener.local_addr().unwrap());
    drop(listener);
    let config = Config::new(&url, GROUP_ID, SecretString::from(SERVICE_TOKEN)).unwrap();
    let err = GitLab::with_retry_policy(&config, fast_retries())
        .unwrap()
        .check()
        .await
        .unwrap_err();
    assert!(
        matches!(err, GitLabError::Unreachable { attempts: 3, .. }),
        "{err:?}"
    );
}
