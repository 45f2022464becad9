//! What the `serve_attacks_*` tests share: serve signed with their secret, tokens, raw HTTP,
//! hand-made receive-pack requests, the processes a test left, and a GitLab double with a git
//! server behind it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use base64::Engine as _;
use testkit::fake_gitlab::{FakeGitLab, GROUP_ID, GROUP_PATH, SERVICE_TOKEN};
use testkit::git_server::GitServer;

use super::Serve;

pub const SECRET: &str = "serve-attack-secret-0123456789abcdef";
pub const WEBHOOK_SECRET: &str = "webhook-attack-secret-0123456789";
pub const ZERO: &str = "0000000000000000000000000000000000000000";

/// serve signed with this file's secret; its sync command records each event.
pub fn serve(args: &[&str], env: &[(&str, &str)]) -> Serve {
    Serve::start(SECRET, args, env, "true")
}

/// Like `serve`, with `sync_extra` run by the sync command after it recorded the event.
pub fn serve_with(args: &[&str], env: &[(&str, &str)], sync_extra: &str) -> Serve {
    Serve::start(SECRET, args, env, sync_extra)
}

/// `token mint --user USER` with the test secret and `env`.
pub fn token(user: &str, env: &[(&str, &str)]) -> String {
    let out = token_command("mint", user, env);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .trim()
        .to_owned()
}

pub fn token_command(action: &str, user: &str, env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shmastra-cloud"))
        .args(["token", action, "--user", user])
        .env_clear()
        .env("SHMASTRA_TOKEN_SECRET", SECRET)
        .envs(env.iter().copied())
        .output()
        .expect("shmastra-cloud token")
}

pub fn basic(token: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("x:{token}"))
    )
}

/// Sends `head` (the request line and headers, without the blank line) and `body`.
pub fn send_raw(stream: &mut TcpStream, head: &str, body: &[u8]) {
    stream
        .write_all(format!("{head}\r\n\r\n").as_bytes())
        .expect("send head");
    // The server may answer (413, 415) and close before it read the body.
    let _ = stream.write_all(body);
}

/// Reads one whole response (until the server closes or the status line and body arrived).
pub fn read_response(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                out.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&out);
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    let len = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                        })
                        .unwrap_or(usize::MAX);
                    if body.len() >= len {
                        break;
                    }
                }
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Reads up to the end of a response head.
pub fn read_head(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut byte = [0u8; 1];
    while !out.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => out.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub fn status_of(response: &str) -> u16 {
    response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"))
}

/// The head of a receive-pack POST with a declared length.
pub fn receive_pack_head(user: &str, token: &str, len: usize, extra: &str) -> String {
    format!(
        "POST /api/git/{user}.git/git-receive-pack HTTP/1.1\r\nHost: x\r\nAuthorization: {}\r\nContent-Type: application/x-git-receive-pack-request\r\nContent-Length: {len}{extra}",
        basic(token)
    )
}

pub fn pkt(line: &str) -> Vec<u8> {
    let mut out = format!("{:04x}", line.len() + 4).into_bytes();
    out.extend_from_slice(line.as_bytes());
    out
}

/// A receive-pack request body: `commands` (old, new, ref), then the pack of `revs` made in
/// `work`.
pub fn push_body(work: &Path, commands: &[(&str, &str, &str)], revs: &str) -> Vec<u8> {
    let mut body = Vec::new();
    for (i, (old, new, refname)) in commands.iter().enumerate() {
        let line = if i == 0 {
            format!("{old} {new} {refname}\0report-status side-band-64k\n")
        } else {
            format!("{old} {new} {refname}\n")
        };
        body.extend(pkt(&line));
    }
    body.extend_from_slice(b"0000");
    let mut pack = testkit::git::command(work)
        // Stored, not deflated: the pack is as large as its content.
        .args([
            "-c",
            "pack.compression=0",
            "pack-objects",
            "--stdout",
            "-q",
            "--revs",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("git pack-objects");
    pack.stdin
        .take()
        .expect("stdin")
        .write_all(format!("{revs}\n").as_bytes())
        .expect("revs");
    let out = pack.wait_with_output().expect("pack");
    assert!(out.status.success());
    body.extend(out.stdout);
    body
}

/// Processes whose environment holds `needle` (`NAME=value`): the CGI children of one test's
/// upstream directory carry `GIT_PROJECT_ROOT=<dir>`.
pub fn processes_with_env(needle: &str) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        if environ.split(|&b| b == 0).any(|v| v == needle.as_bytes()) {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            found.push((pid, String::from_utf8_lossy(&cmdline).replace('\0', " ")));
        }
    }
    found
}

/// Whether the server closes `stream` (EOF or reset) within `within`; whatever it sends first
/// is read and skipped.
pub fn closed_by_server(mut stream: &TcpStream, within: Duration) -> bool {
    stream.set_read_timeout(Some(within)).expect("read timeout");
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

pub fn embedded(extra: &[&str]) -> (Serve, tempfile::TempDir) {
    let up = tempfile::tempdir().expect("tempdir");
    let mut args = vec!["--upstream-dir", up.path().to_str().expect("utf-8")];
    args.extend_from_slice(extra);
    (serve(&args, &[]), up)
}

/// The fake GitLab API and a real git server holding the group's repositories, which only
/// accepts the service token.
pub struct GitLabSetup {
    pub gitlab: FakeGitLab,
    pub server: GitServer,
    _repos: tempfile::TempDir,
    _runtime: tokio::runtime::Runtime,
}

impl GitLabSetup {
    pub fn start() -> GitLabSetup {
        let repos = tempfile::tempdir().expect("tempdir");
        let server = GitServer::start(repos.path());
        server.require_password(SERVICE_TOKEN);
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        let gitlab = runtime.block_on(FakeGitLab::start());
        gitlab.set_repo_base(&server.base_url());
        GitLabSetup {
            gitlab,
            server,
            _repos: repos,
            _runtime: runtime,
        }
    }

    /// A user project in the group, known to the API and present on the git server.
    pub fn project(&self, path: &str) -> PathBuf {
        self.gitlab.add_project(path);
        self.server.create_bare(&format!("{GROUP_PATH}/{path}.git"))
    }

    pub fn serve(&self, extra_env: &[(&str, &str)]) -> Serve {
        let group = GROUP_ID.to_string();
        let api = self.gitlab.api_url();
        let mut env = vec![
            ("GITLAB_SERVICE_TOKEN", SERVICE_TOKEN),
            ("GITLAB_GROUP_ID", group.as_str()),
            ("GITLAB_API_URL", api.as_str()),
            ("GITLAB_WEBHOOK_SECRET", WEBHOOK_SECRET),
        ];
        env.extend_from_slice(extra_env);
        serve(&[], &env)
    }
}

pub fn http() -> (tokio::runtime::Runtime, reqwest::Client) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    (runtime, reqwest::Client::new())
}

/// GET `url` with `token` as the basic-auth password: status and body.
pub fn get_with(url: &str, token: Option<&str>) -> (u16, String) {
    let (runtime, client) = http();
    runtime.block_on(async {
        let mut request = client.get(url);
        if let Some(token) = token {
            request = request.basic_auth("x", Some(token));
        }
        let response = request.send().await.expect("serve answers");
        let status = response.status().as_u16();
        (status, response.text().await.expect("body"))
    })
}

pub fn post_webhook(serve: &Serve, headers: &[(&str, &str)], body: String) -> (u16, String) {
    let (runtime, client) = http();
    runtime.block_on(async {
        let mut request = client
            .post(serve.url("/api/gitlab/webhook"))
            .header("x-gitlab-token", WEBHOOK_SECRET)
            .header("x-gitlab-event", "Push Hook")
            .body(body);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await.expect("webhook answers");
        let status = response.status().as_u16();
        (status, response.text().await.expect("body"))
    })
}

pub fn push_payload(project: &str, refname: &str, new_oid: &str) -> String {
    serde_json::json!({
        "object_kind": "push",
        "ref": refname,
        "before": ZERO,
        "after": new_oid,
        "project": { "path_with_namespace": project },
    })
    .to_string()
}
