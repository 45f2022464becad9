//! Serves one smart-HTTP git request by running `git http-backend` as a CGI program,
//! streaming the request body into it and its output back, never holding a whole pack.

use std::error::Error as StdError;
use std::path::Path;
use std::process::Stdio;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use bytes::{Buf, Bytes};
use futures_util::{StreamExt as _, TryStreamExt};
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Body, Frame};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio_util::io::ReaderStream;
use tokio_util::sync::CancellationToken;

/// The response body: the rest of http-backend's stdout, streamed.
pub type BoxBody = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

/// CGI headers larger than this mean http-backend misbehaves; the limit keeps a broken child
/// from growing memory without bound.
const MAX_CGI_HEADER_BYTES: usize = 64 * 1024;

/// The process groups of the `git http-backend` children still running, so a server that stops
/// can end them all ([`Children::kill_all`]). Cheap to clone; clones share the set.
#[derive(Debug, Clone, Default)]
pub(crate) struct Children {
    live: Arc<Mutex<HashSet<u32>>>,
}

impl Children {
    /// SIGKILLs every child's process group still running.
    pub(crate) fn kill_all(&self) {
        let groups: Vec<u32> = self.lock().drain().collect();
        for group in groups {
            crate::process_group::kill(group);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<u32>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Runs `git http-backend` for `req` against the bare repositories under `project_root`.
///
/// `path_info` is the part of the URL after the mount point, starting with the repository
/// (e.g. `/alice.git/info/refs`). `remote_user` is the authenticated user: pushing
/// (`git-receive-pack`) is enabled exactly when it is `Some`, whatever the repository's
/// config says. The child sees only a hermetic git config, so the host's `~/.gitconfig` and
/// `/etc/gitconfig` never change what is served.
pub async fn serve<B>(
    project_root: &Path,
    req: Request<B>,
    path_info: &str,
    remote_user: Option<&str>,
) -> Response<BoxBody>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn StdError + Send + Sync>> + Send,
{
    serve_with(
        &Children::default(),
        project_root,
        &[],
        req,
        path_info,
        remote_user,
    )
    .await
}

/// [`serve`], with the child registered in `children` while it runs and `extra_config` (git
/// config `key=value` pairs) added to the child's hermetic config.
///
/// The child runs in a process group of its own, which is SIGKILLed when the request ends
/// early: the request body fails (client gone, idle timeout, size limit) or the response body
/// is dropped before its end. http-backend gets no `CONTENT_LENGTH`, so it reads its stdin to
/// the end: with a length, git's fixed-length reader spins forever on an early EOF.
pub(crate) async fn serve_with<B>(
    children: &Children,
    project_root: &Path,
    extra_config: &[(&str, &str)],
    req: Request<B>,
    path_info: &str,
    remote_user: Option<&str>,
) -> Response<BoxBody>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn StdError + Send + Sync>> + Send,
{
    let (parts, body) = req.into_parts();
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };

    let mut config = vec![(
        "http.receivepack",
        if remote_user.is_some() {
            "true"
        } else {
            "false"
        },
    )];
    config.extend_from_slice(extra_config);
    let mut cmd = Command::new("git");
    cmd.arg("http-backend")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_COUNT", config.len().to_string())
        .env("GIT_PROJECT_ROOT", project_root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("GATEWAY_INTERFACE", "CGI/1.1")
        .env("REQUEST_METHOD", parts.method.as_str())
        .env("PATH_INFO", path_info)
        .env("QUERY_STRING", parts.uri.query().unwrap_or(""))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(false);
    for (i, (key, value)) in config.iter().enumerate() {
        cmd.env(format!("GIT_CONFIG_KEY_{i}"), key)
            .env(format!("GIT_CONFIG_VALUE_{i}"), value);
    }
    if let Some(user) = remote_user {
        cmd.env("REMOTE_USER", user);
    }
    if let Some(v) = header(CONTENT_TYPE.as_str()) {
        cmd.env("CONTENT_TYPE", v);
    }
    // http-backend inflates gzip bodies itself when told the encoding.
    if let Some(v) = header("content-encoding") {
        cmd.env("HTTP_CONTENT_ENCODING", v);
    }
    // Protocol v2 is negotiated through this header; older git reads only GIT_PROTOCOL.
    if let Some(v) = header("git-protocol") {
        cmd.env("HTTP_GIT_PROTOCOL", &v).env("GIT_PROTOCOL", v);
    }

    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            tracing::error!(error = %e, "cannot start git http-backend");
            return plain(
                StatusCode::INTERNAL_SERVER_ERROR,
                "cannot start git http-backend\n",
            );
        }
    };
    let Some(group) = child.id() else {
        return plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            "git http-backend exited\n",
        );
    };
    children.lock().insert(group);
    let early_end = CancellationToken::new();
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        early_end.cancel();
        tokio::spawn(reap(
            child,
            group,
            children.clone(),
            early_end,
            path_info.to_owned(),
        ));
        return plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            "git http-backend pipes\n",
        );
    };

    tokio::spawn(feed_stdin(body, stdin, early_end.clone()));
    let repo_path = path_info.to_owned();
    tokio::spawn(async move {
        let mut lines = BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            tracing::warn!(path = %repo_path, "git http-backend: {line}");
        }
    });
    tokio::spawn(reap(
        child,
        group,
        children.clone(),
        early_end.clone(),
        path_info.to_owned(),
    ));

    // Dropped before the output's end (the client went away): the child is ended.
    let unfinished = early_end.clone().drop_guard();
    let mut stdout = BufReader::new(stdout);
    let head = match read_cgi_head(&mut stdout).await {
        Ok(head) => head,
        Err(e) => {
            tracing::error!(path = %path_info, error = %e, "bad CGI output from git http-backend");
            return plain(StatusCode::BAD_GATEWAY, "git http-backend failed\n");
        }
    };
    let mut unfinished = Some(unfinished);
    let stream = ReaderStream::new(stdout)
        .chain(futures_util::stream::poll_fn(move |_| {
            // The whole output was read: nothing to end early any more.
            if let Some(guard) = unfinished.take() {
                guard.disarm();
            }
            std::task::Poll::Ready(None)
        }))
        .map_ok(Frame::data);
    let mut response = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    *response.status_mut() = head.status;
    *response.headers_mut() = head.headers;
    response
}

/// Waits for the child; when the request ends early first, SIGKILLs its process group (git
/// http-backend runs `git receive-pack`/`upload-pack` below it) and then reaps it.
async fn reap(
    mut child: Child,
    group: u32,
    children: Children,
    early_end: CancellationToken,
    path: String,
) {
    let status = tokio::select! {
        status = child.wait() => status,
        () = early_end.cancelled() => {
            tracing::info!(path = %path, "request ended early; ending its git http-backend");
            crate::process_group::kill(group);
            child.wait().await
        }
    };
    children.lock().remove(&group);
    match status {
        Ok(status) if !status.success() => {
            tracing::debug!(path = %path, %status, "git http-backend exited");
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(path = %path, error = %e, "waiting for git http-backend"),
    }
}

/// Copies the request body into http-backend's stdin, then closes it so the child sees EOF.
/// A body that fails ends the request early.
async fn feed_stdin<B>(body: B, mut stdin: ChildStdin, early_end: CancellationToken)
where
    B: Body,
    B::Error: Into<Box<dyn StdError + Send + Sync>>,
{
    let mut body = std::pin::pin!(body);
    while let Some(frame) = body.frame().await {
        let bytes = match frame.map(Frame::into_data) {
            Ok(Ok(mut data)) => data.copy_to_bytes(data.remaining()),
            Ok(Err(_trailers)) => continue,
            Err(e) => {
                tracing::debug!(error = %e.into(), "request body ended early");
                early_end.cancel();
                return;
            }
        };
        if stdin.write_all(&bytes).await.is_err() {
            // The child stopped reading (it answered with an error); its stdout says why.
            return;
        }
    }
    let _ = stdin.shutdown().await;
}

/// The status line and headers of a CGI response.
#[derive(Debug)]
struct CgiHead {
    status: StatusCode,
    headers: http::HeaderMap,
}

#[derive(Debug, thiserror::Error)]
enum CgiError {
    #[error("reading CGI output: {0}")]
    Io(#[from] std::io::Error),
    #[error("CGI output ended before the blank line that ends its headers")]
    Truncated,
    #[error("CGI headers exceed {MAX_CGI_HEADER_BYTES} bytes")]
    TooLarge,
    #[error("malformed CGI header line {0:?}")]
    Malformed(String),
}

async fn read_cgi_head<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
) -> Result<CgiHead, CgiError> {
    let mut status = StatusCode::OK;
    let mut headers = http::HeaderMap::new();
    let mut seen = 0usize;
    let mut line = String::new();
    loop {
        line.clear();
        let n = reader.read_line(&mut line).await?;
        if n == 0 {
            return Err(CgiError::Truncated);
        }
        seen += n;
        if seen > MAX_CGI_HEADER_BYTES {
            return Err(CgiError::TooLarge);
        }
        let text = line.trim_end_matches(['\r', '\n']);
        if text.is_empty() {
            return Ok(CgiHead { status, headers });
        }
        let (name, value) = text
            .split_once(':')
            .ok_or_else(|| CgiError::Malformed(text.to_owned()))?;
        let value = value.trim();
        if name.eq_ignore_ascii_case("status") {
            let code = value.split_whitespace().next().unwrap_or_default();
            status = code
                .parse::<u16>()
                .ok()
                .and_then(|c| StatusCode::from_u16(c).ok())
                .ok_or_else(|| CgiError::Malformed(text.to_owned()))?;
        } else {
            let name = HeaderName::from_bytes(name.trim().as_bytes())
                .map_err(|_| CgiError::Malformed(text.to_owned()))?;
            let value =
                HeaderValue::from_str(value).map_err(|_| CgiError::Malformed(text.to_owned()))?;
            headers.append(name, value);
        }
    }
}

fn plain(status: StatusCode, text: &'static str) -> Response<BoxBody> {
    let body = Full::new(Bytes::from_static(text.as_bytes()))
        .map_err(|never| match never {})
        .boxed();
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn head_of(raw: &[u8]) -> Result<CgiHead, CgiError> {
        read_cgi_head(&mut BufReader::new(raw)).await
    }

    #[tokio::test]
    async fn status_header_sets_the_status_and_is_not_forwarded() {
        let head = head_of(b"Status: 404 Not Found\r\nContent-Type: text/plain\r\n\r\nbody")
            .await
            .unwrap();
        assert_eq!(head.status, StatusCode::NOT_FOUND);
        assert_eq!(head.headers.get("content-type").unwrap(), "text/plain");
        assert!(head.headers.get("status").is_none());
    }

    #[tokio::test]
    async fn bare_newlines_and_missing_status_mean_200() {
        let head = head_of(b"Content-Type: application/x-git-upload-pack-advertisement\n\n")
            .await
            .unwrap();
        assert_eq!(head.status, StatusCode::OK);
    }

    #[tokio::test]
    async fn truncated_and_malformed_heads_are_errors() {
        assert!(matches!(
            head_of(b"Content-Type: x\r\n").await,
            Err(CgiError::Truncated)
        ));
        assert!(matches!(
            head_of(b"no colon here\r\n\r\n").await,
            Err(CgiError::Malformed(_))
        ));
        assert!(matches!(
            head_of(b"Status: abc\r\n\r\n").await,
            Err(CgiError::Malformed(_))
        ));
    }
}
