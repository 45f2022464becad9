//! GitLab as every service's host: where projects are created (`ProjectHost`), where saves are
//! read (`SaveHistory`), where the proxy finds a user's repository (`RepoLocator`), where the
//! webhook learns the group's path (`GroupPath`), and what the page links to (`ProjectPages`).

use futures_util::future::BoxFuture;

use crate::gitlab::{GitLab, GitLabError};
use crate::host::{Diff, HostLink, ProjectHost, ProjectPages};
use crate::orchestrate::history::{HistoryError, LoggedCommit, SaveHistory};
use crate::proxy::upstream::{CREDENTIAL_RETRY, RepoLocator, UpstreamError};
use crate::user::UserId;
use crate::webhook::GroupPath;

impl ProjectHost for GitLab {
    type Error = GitLabError;

    async fn ensure_project(&self, user: &UserId) -> Result<(), GitLabError> {
        self.ensure_user_project(user).await.map(|_| ())
    }

    fn is_transient(error: &GitLabError) -> bool {
        error.is_transient()
    }
}

impl SaveHistory for GitLab {
    async fn recent_commits(
        &self,
        user: &UserId,
        limit: usize,
    ) -> Result<Vec<LoggedCommit>, HistoryError> {
        Ok(GitLab::recent_commits(self, user, limit)
            .await?
            .into_iter()
            .map(|c| LoggedCommit {
                id: c.id,
                time: c.committed_date,
                author: c.author_name,
                message: c.message,
            })
            .collect())
    }

    async fn saved_file(&self, user: &UserId, path: &str) -> Result<Option<Vec<u8>>, HistoryError> {
        Ok(GitLab::saved_file(self, user, path)
            .await?
            .map(String::into_bytes))
    }
}

/// Each user's project in the group, created on first use and then cached.
impl RepoLocator for GitLab {
    fn repo_url(&self, user: &UserId) -> BoxFuture<'_, Result<String, UpstreamError>> {
        let user = user.clone();
        Box::pin(async move {
            let project = self.user_project(&user).await.map_err(|e| match e {
                GitLabError::Unauthorized { .. } => UpstreamError::CredentialsRejected {
                    retry_after: CREDENTIAL_RETRY,
                },
                e => UpstreamError::Repository(e.to_string()),
            })?;
            Ok(project.http_url_to_repo)
        })
    }

    fn forget(&self, user: &UserId) {
        GitLab::forget(self, user);
    }
}

impl GroupPath for GitLab {
    fn group_path(&self) -> BoxFuture<'_, Result<String, String>> {
        Box::pin(async move { GitLab::group_path(self).await.map_err(|e| e.to_string()) })
    }

    fn owner_of(&self, group: &str, path: &str) -> Option<UserId> {
        GitLab::owner_of(self, group, path)
    }
}

impl ProjectPages for GitLab {
    /// The project's page, from the client's cache after the first load (the service
    /// account's API calls are everyone's: a page load must not spend one).
    async fn link(&self, user: &UserId) -> HostLink {
        match self.user_project(user).await {
            Ok(project) if !project.web_url.is_empty() => HostLink::WebUrl(project.web_url),
            Ok(_) => HostLink::Unavailable,
            Err(e) => {
                tracing::warn!(user = %user, error = %e, "cannot find the GitLab project");
                HostLink::Unavailable
            }
        }
    }

    async fn diff(&self, user: &UserId, commit: &str) -> Diff {
        match self.link(user).await {
            HostLink::WebUrl(url) => Diff::Elsewhere(format!("{url}/-/commit/{commit}")),
            _ => Diff::Missing("the GitLab project cannot be reached".into()),
        }
    }
}
