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
use std::sync::Arc;

use axum::body::Body;
use futures_util::future::BoxFuture;
use http::{Request, Response};
use shmastra_contract::env::DEFAULT_BRANCH;
use tokio::process::Command;
use tokio::sync::Mutex;

use super::bounded;
use crate::admission::Admission;
use crate::host::{Diff, HostLink, ProjectHost, ProjectPages};
use crate::http_backend::{self, Children};
use crate::orchestrate::history::{HistoryError, LoggedCommit, SaveHistory};
use crate::patch;
use crate::proxy::upstream::{Upstream, UpstreamError, UpstreamRequest};
use crate::user::UserId;

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

/// The git commands the page may run at once for one user (diffs, histories), and for all.
const PAGE_GIT_PER_USER: usize = 2;
const PAGE_GIT_TOTAL: usize = 16;

/// The embedded upstream: one bare repository per user under a directory.
pub struct EmbeddedUpstream {
    root: PathBuf,
    /// `core.hooksPath` for every request, unless history rewrites are allowed.
    hooks: Option<String>,
    children: Children,
    /// Serialises repository creation, so two first requests do not race `git init`.
    creating: Mutex<()>,
    /// The page's git commands running now.
    page_git: Arc<Admission>,
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
        // Only this server reads the repositories: a sandbox's code on this machine, running as
        // another user, must not read another user's project from the disk.
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700))?;
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
            page_git: Arc::new(Admission::new(PAGE_GIT_TOTAL, PAGE_GIT_PER_USER)),
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
    ) -> Result<Vec<LoggedCommit>, HistoryError> {
        let dir = self.repo_dir(user);
        if !dir.join("HEAD").exists() {
            return Ok(Vec::new());
        }
        let failed = |reason: String| HistoryError::Embedded {
            user: user.clone(),
            reason,
        };
        let Ok(_slot) = self.page_git.admit(user) else {
            return Err(failed(
                "too many git commands for this user at once".to_owned(),
            ));
        };
        let mut log = page_git(&dir);
        log.args([
            "log",
            "--branches",
            "--date-order",
            &format!("--max-count={limit}"),
            "--format=%H%x00%cI%x00%an%x00%B%x1e",
            "--",
        ]);
        // A repository without any branch yet lists nothing and succeeds.
        let (records, failed_or_cut) = bounded::log_records(log)
            .await
            .map_err(|e| failed(format!("cannot run git: {e}")))?;
        if failed_or_cut && records.is_empty() {
            return Err(failed("git log failed".to_owned()));
        }
        Ok(records)
    }

    async fn saved_file(&self, user: &UserId, path: &str) -> Result<Option<Vec<u8>>, HistoryError> {
        let dir = self.repo_dir(user);
        if !dir.join("HEAD").exists() {
            return Ok(None);
        }
        let failed = |reason: String| HistoryError::Embedded {
            user: user.clone(),
            reason,
        };
        let git = |args: &[&str]| page_git(&dir).args(args).output();
        let object = format!("refs/heads/{DEFAULT_BRANCH}:{path}");
        let found = git(&["rev-parse", "--verify", "--quiet", &object])
            .await
            .map_err(|e| failed(format!("cannot run git: {e}")))?;
        // No branch yet, or no such file on it.
        if !found.status.success() {
            return Ok(None);
        }
        let id = String::from_utf8_lossy(&found.stdout).trim().to_owned();
        let size = git(&["cat-file", "-s", &id])
            .await
            .map_err(|e| failed(format!("cannot run git: {e}")))?;
        let size: u64 = String::from_utf8_lossy(&size.stdout)
            .trim()
            .parse()
            .unwrap_or(u64::MAX);
        if size > MAX_SAVED_FILE {
            return Err(failed(format!(
                "{path} on the saved branch is {size} bytes, more than the {MAX_SAVED_FILE} read"
            )));
        }
        let out = git(&["cat-file", "blob", &id])
            .await
            .map_err(|e| failed(format!("cannot run git: {e}")))?;
        if !out.status.success() {
            return Err(failed(
                String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            ));
        }
        Ok(Some(out.stdout))
    }
}

/// `git --git-dir <dir>` for the page, with a cleared environment.
fn page_git(dir: &Path) -> Command {
    let mut command = Command::new("git");
    command
        .arg("--git-dir")
        .arg(dir)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null");
    command
}

/// Largest saved file read (the manifest is far smaller).
const MAX_SAVED_FILE: u64 = 1 << 20;

impl ProjectPages for EmbeddedUpstream {
    async fn link(&self, _user: &UserId) -> HostLink {
        HostLink::CloneHere
    }

    /// `git show` of the save, read up to 1 MiB (git is stopped there), per file; each
    /// binary's size in the save from `git ls-tree`.
    async fn diff(&self, user: &UserId, commit: &str) -> Diff {
        let Ok(_slot) = self.page_git.admit(user) else {
            return Diff::Busy;
        };
        let dir = self.repo_dir(user);
        let mut show = page_git(&dir);
        show.args(patch::SHOW_ARGS).args([commit, "--"]);
        let mut diff = match bounded::output_capped(show, bounded::MAX_DIFF_BYTES).await {
            Ok(out) if out.cut || out.success => patch::parse(&out.bytes, out.cut),
            _ => return Diff::Missing(format!("no save {commit} in this project")),
        };
        let binaries: Vec<String> = diff
            .files
            .iter()
            .filter(|f| f.binary.is_some() && f.change != patch::Change::Deleted)
            .map(|f| f.path.clone())
            .take(MAX_SIZED_BINARIES)
            .collect();
        if !binaries.is_empty() {
            let mut tree = page_git(&dir);
            tree.args(["ls-tree", "-l", "-z", "--full-tree", commit, "--"])
                .args(&binaries);
            if let Ok(out) = bounded::output_capped(tree, bounded::MAX_DIFF_BYTES).await {
                for (path, size) in tree_sizes(&out.bytes) {
                    if let Some(file) = diff.files.iter_mut().find(|f| f.path == path) {
                        file.binary = Some(Some(size));
                    }
                }
            }
        }
        Diff::Save(diff)
    }
}

/// The most binaries of one save whose size the page shows.
const MAX_SIZED_BINARIES: usize = 64;

/// `(path, size)` of each blob `git ls-tree -l -z` lists (`<mode> blob <id> <size>\t<path>`).
fn tree_sizes(bytes: &[u8]) -> Vec<(String, u64)> {
    String::from_utf8_lossy(bytes)
        .split('\0')
        .filter_map(|entry| {
            let (meta, path) = entry.split_once('\t')?;
            let mut meta = meta.split_whitespace();
            (meta.nth(1)? == "blob").then_some(())?;
            let size = meta.nth(1)?.parse().ok()?;
            Some((path.to_owned(), size))
        })
        .collect()
}
