//! The embedded upstream: a directory of bare repositories, one per user (`<dir>/<user>.git`,
//! created on first use), served through `git http-backend`. It stands in for GitLab on one
//! machine with no accounts.

use std::path::{Path, PathBuf};

use axum::body::Body;
use futures_util::future::BoxFuture;
use http::{Request, Response};
use tokio::process::Command;
use tokio::sync::Mutex;

use super::upstream::{Upstream, UpstreamError, UpstreamRequest};
use crate::UserId;
use crate::http_backend;

pub struct EmbeddedUpstream {
    root: PathBuf,
    /// Serialises repository creation, so two first requests do not race `git init`.
    creating: Mutex<()>,
}

impl EmbeddedUpstream {
    /// Serves (and creates) repositories under `root`, which is created if missing.
    pub fn new(root: impl Into<PathBuf>) -> std::io::Result<EmbeddedUpstream> {
        let root = root.into();
        std::fs::create_dir_all(&root)?;
        Ok(EmbeddedUpstream {
            root,
            creating: Mutex::new(()),
        })
    }

    /// Where `user`'s bare repository lives. `UserId` is a safe path component, so this never
    /// leaves `root`.
    pub fn repo_dir(&self, user: &UserId) -> PathBuf {
        self.root.join(format!("{user}.git"))
    }

    /// Creates `user`'s repository if it does not exist yet. A new user's first request may be a
    /// fetch (`restore` on a fresh sandbox); an empty repository answers it with no refs.
    async fn ensure_repo(&self, user: &UserId) -> Result<(), UpstreamError> {
        let dir = self.repo_dir(user);
        if dir.join("HEAD").exists() {
            return Ok(());
        }
        let _guard = self.creating.lock().await;
        if dir.join("HEAD").exists() {
            return Ok(());
        }
        init_bare(&dir)
            .await
            .map_err(|e| UpstreamError::Repository(format!("creating {}: {e}", dir.display())))?;
        tracing::info!(%user, repo = %dir.display(), "created embedded repository");
        Ok(())
    }
}

/// `git init --bare` into a temporary name, then rename, so a half-made repository is never
/// served.
async fn init_bare(dir: &Path) -> std::io::Result<()> {
    let staging = dir.with_extension(format!("git.init-{}", std::process::id()));
    let output = Command::new("git")
        .args(["init", "-q", "--bare", "-b", "main"])
        .arg(&staging)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .await?;
    if !output.status.success() {
        let _ = tokio::fs::remove_dir_all(&staging).await;
        return Err(std::io::Error::other(
            String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        ));
    }
    tokio::fs::rename(&staging, dir).await
}

impl Upstream for EmbeddedUpstream {
    fn forward(
        &self,
        request: UpstreamRequest,
    ) -> BoxFuture<'_, Result<Response<Body>, UpstreamError>> {
        Box::pin(async move {
            self.ensure_repo(&request.user).await?;
            let path_info = format!("/{}.git/{}", request.user, request.endpoint.service_path());
            let uri = format!(
                "/{}.git/{}",
                request.user,
                request.endpoint.path_and_query()
            );
            let mut builder = Request::builder()
                .method(request.endpoint.method())
                .uri(uri);
            if let Some(headers) = builder.headers_mut() {
                *headers = request.headers;
            }
            let cgi_request = builder
                .body(request.body)
                .map_err(|e| UpstreamError::Failed(e.to_string()))?;
            let response = http_backend::serve(
                &self.root,
                cgi_request,
                &path_info,
                Some(request.user.as_str()),
            )
            .await;
            Ok(response.map(Body::new))
        })
    }
}
