//! The embedded upstream: a directory of bare repositories, one per user (`<dir>/<user>.git`,
//! created on first use), served through `git http-backend`. It stands in for GitLab on one
//! machine with no accounts.
//!
//! Like GitLab's protected default branch, history is protected unless the operator allows
//! rewriting it: an `update` hook (installed under `<dir>/.shmastra-hooks`, which no user id can
//! name) refuses deleting or force-pushing `main`, and deleting or moving `recovery/*` branches
//! and tags other than by fast-forward.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use axum::body::Body;
use futures_util::future::BoxFuture;
use http::{Request, Response};
use tokio::process::Command;
use tokio::sync::Mutex;

use super::upstream::{Upstream, UpstreamError, UpstreamRequest};
use crate::UserId;
use crate::http_backend::{self, Children};
use crate::orchestrate::ProjectHost;
use crate::orchestrate::history::{HistoryError, SaveHistory};

/// The hook that protects history, run by `git receive-pack` once per ref.
const UPDATE_HOOK: &str = r#"#!/bin/sh
# Installed by shmastra-cloud serve (embedded upstream). `serve --allow-history-rewrite` removes it.
ref="$1"; old="$2"; new="$3"
zero=0000000000000000000000000000000000000000
case "$ref" in
refs/heads/main|refs/heads/recovery/*|refs/tags/*) ;;
*) exit 0 ;;
esac
if [ "$old" = "$zero" ]; then exit 0; fi
if [ "$new" = "$zero" ]; then
    echo "shmastra: $ref is protected: it cannot be deleted" >&2
    exit 1
fi
if ! git merge-base --is-ancestor "$old" "$new" 2>/dev/null; then
    echo "shmastra: $ref is protected: only fast-forward updates are accepted (no force-push)" >&2
    exit 1
fi
exit 0
"#;

/// Where the protecting hook lives under the upstream directory. A user id never starts with
/// `.`, so no repository is named like it.
const HOOKS_DIR: &str = ".shmastra-hooks";

pub struct EmbeddedUpstream {
    root: PathBuf,
    /// `core.hooksPath` for every request, unless history rewrites are allowed.
    hooks: Option<String>,
    children: Children,
    /// Serialises repository creation, so two first requests do not race `git init`.
    creating: Mutex<()>,
}

impl EmbeddedUpstream {
    /// Serves (and creates) repositories under `root`, which is created if missing, with
    /// `main`, `recovery/*` and tags protected.
    pub fn new(root: impl Into<PathBuf>) -> std::io::Result<EmbeddedUpstream> {
        EmbeddedUpstream::with_protection(root, true)
    }

    /// [`EmbeddedUpstream::new`]; `protect_history: false` lets any token holder delete or
    /// force-push every ref (`serve --allow-history-rewrite`).
    pub fn with_protection(
        root: impl Into<PathBuf>,
        protect_history: bool,
    ) -> std::io::Result<EmbeddedUpstream> {
        let root = std::path::absolute(root.into())?;
        std::fs::create_dir_all(&root)?;
        let hooks = if protect_history {
            let dir = root.join(HOOKS_DIR);
            std::fs::create_dir_all(&dir)?;
            let hook = dir.join("update");
            std::fs::write(&hook, UPDATE_HOOK)?;
            std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755))?;
            Some(dir.to_string_lossy().into_owned())
        } else {
            None
        };
        Ok(EmbeddedUpstream {
            root,
            hooks,
            children: Children::default(),
            creating: Mutex::new(()),
        })
    }

    /// The `git http-backend` children running now; the server ends them when it stops.
    pub(crate) fn children(&self) -> Children {
        self.children.clone()
    }

    /// Where `user`'s bare repository lives. `UserId` is a safe path component, so this never
    /// leaves `root`.
    pub(crate) fn repo_dir(&self, user: &UserId) -> PathBuf {
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
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
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
            let hooks_path = self.hooks.as_deref().map(|dir| ("core.hooksPath", dir));
            let response = http_backend::serve_with(
                &self.children,
                &self.root,
                hooks_path.as_slice(),
                cgi_request,
                &path_info,
                Some(request.user.as_str()),
            )
            .await;
            Ok(response.map(Body::new))
        })
    }
}

impl ProjectHost for EmbeddedUpstream {
    type Error = std::convert::Infallible;

    /// Nothing to do ahead of time: the embedded upstream creates a user's repository on the
    /// first request for it, which `restore` or the watcher's first push makes.
    async fn ensure_project(&self, _user: &UserId) -> Result<(), Self::Error> {
        Ok(())
    }

    fn is_transient(error: &Self::Error) -> bool {
        match *error {}
    }
}

impl SaveHistory for EmbeddedUpstream {
    async fn recent_commits(
        &self,
        user: &UserId,
        limit: usize,
    ) -> Result<Vec<(String, String, String)>, HistoryError> {
        let dir = self.repo_dir(user);
        if !dir.join("HEAD").exists() {
            return Ok(Vec::new());
        }
        let failed = |reason: String| HistoryError::Embedded {
            user: user.clone(),
            reason,
        };
        let out = tokio::process::Command::new("git")
            .arg("--git-dir")
            .arg(&dir)
            .args([
                "log",
                "--branches",
                "--date-order",
                &format!("--max-count={limit}"),
                "--format=%H%x00%cI%x00%B%x1e",
                "--",
            ])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .output()
            .await
            .map_err(|e| failed(format!("cannot run git: {e}")))?;
        // A repository without any branch yet lists nothing and succeeds.
        if !out.status.success() {
            return Err(failed(
                String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            ));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        Ok(text
            .split('\x1e')
            .map(|record| record.trim_start_matches('\n'))
            .filter(|record| !record.is_empty())
            .filter_map(|record| {
                let mut fields = record.splitn(3, '\0');
                Some((
                    fields.next()?.to_owned(),
                    fields.next()?.to_owned(),
                    fields.next()?.to_owned(),
                ))
            })
            .collect())
    }
}
