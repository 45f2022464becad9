//! A real smart-HTTP git server for tests: `git http-backend` (through
//! `cloud_core::http_backend`) behind a small hyper server on `127.0.0.1:0`, which records
//! every request and can be told to misbehave.
//!
//! It runs on its own runtime thread, so sync and async tests use it alike. [`GitServer::start_https`]
//! serves the same over TLS with a fixture certificate for `127.0.0.1`; point a client's
//! `SSL_CERT_FILE` (or git's `GIT_SSL_CAINFO`) at [`LOOPBACK_CA_FILE`] to trust it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{oneshot, watch};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

use cloud_core::http_backend::{self, BoxBody};

/// The test CA that signed the HTTPS server's certificate: the file a client trusts. A
/// test-only throwaway (valid until 2126; its key was discarded), as is the server's key.
pub const LOOPBACK_CA_FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/loopback-ca.pem");
/// The certificate the HTTPS server presents: an end-entity certificate for the IP
/// `127.0.0.1`, signed by the CA above. Strict verifiers (webpki, which rustls uses) refuse a
/// self-signed CA certificate presented as a server's own.
const LOOPBACK_CERT: &[u8] = include_bytes!("../fixtures/loopback-cert.pem");
const LOOPBACK_KEY: &[u8] = include_bytes!("../fixtures/loopback-key.pem");

/// One request as the server saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    pub method: String,
    /// Path and query, e.g. `/alice.git/info/refs?service=git-receive-pack`.
    pub path: String,
    pub user_agent: Option<String>,
    /// The raw `Authorization` header.
    pub authorization: Option<String>,
    pub content_encoding: Option<String>,
}

impl Recorded {
    /// The password of a basic `Authorization` header.
    pub fn basic_password(&self) -> Option<String> {
        basic_credentials(self.authorization.as_deref()?).map(|(_, pw)| pw)
    }
}

/// How the server misbehaves until told otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fault {
    #[default]
    None,
    /// Stop listening: connections are refused at the TCP level.
    RefuseConnections,
    /// Answer every request with 500.
    Status500,
    /// Answer every request with 403.
    Status403,
    /// Accept requests and never answer them.
    Stall,
    /// Serve fetches and ref advertisements, but stop reading a push's pack after its first
    /// 64 KiB and never answer: a connection that dies mid-pack without closing.
    StallMidPack,
}

struct Shared {
    root: PathBuf,
    requests: Mutex<Vec<Recorded>>,
    password: Mutex<Option<String>>,
    /// `(from, to)` repository names: requests below `/from/` are answered with a 301 to the
    /// same path below `/to/`.
    moved: Mutex<Vec<(String, String)>>,
    /// The fault the accept loop has put in force (listener dropped or bound again).
    applied: Mutex<Fault>,
    applied_changed: Condvar,
}

/// The running server. Dropping it stops the server.
pub struct GitServer {
    addr: SocketAddr,
    scheme: &'static str,
    shared: Arc<Shared>,
    fault: watch::Sender<Fault>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl GitServer {
    /// Serves the bare repositories under `root` (e.g. `root/alice.git`) over plain HTTP.
    pub fn start(root: &Path) -> Self {
        Self::start_with(root, None)
    }

    /// The same over HTTPS, with a certificate signed by the CA in [`LOOPBACK_CA_FILE`].
    pub fn start_https(root: &Path) -> Self {
        let cert = CertificateDer::from_pem_slice(LOOPBACK_CERT).expect("fixture certificate");
        let key = PrivateKeyDer::from_pem_slice(LOOPBACK_KEY).expect("fixture key");
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .expect("TLS server config");
        Self::start_with(root, Some(TlsAcceptor::from(Arc::new(config))))
    }

    fn start_with(root: &Path, tls: Option<TlsAcceptor>) -> Self {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let shared = Arc::new(Shared {
            root: root.to_owned(),
            requests: Mutex::new(Vec::new()),
            password: Mutex::new(None),
            moved: Mutex::new(Vec::new()),
            applied: Mutex::new(Fault::None),
            applied_changed: Condvar::new(),
        });
        let (fault, fault_rx) = watch::channel(Fault::None);
        let (stop, stop_rx) = oneshot::channel();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("git-server".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .enable_all()
                    .build()
                    .expect("git server runtime");
                rt.block_on(async move {
                    let listener = bind("127.0.0.1:0".parse().expect("loopback address"))
                        .expect("bind 127.0.0.1:0");
                    let addr = listener.local_addr().expect("local addr");
                    addr_tx.send(addr).expect("report address");
                    tokio::select! {
                        _ = accept_loop(listener, addr, thread_shared, fault_rx, tls) => {}
                        _ = stop_rx => {}
                    }
                });
                rt.shutdown_timeout(Duration::from_secs(1));
            })
            .expect("spawn git server thread");
        let addr = addr_rx.recv().expect("git server started");
        Self {
            addr,
            scheme,
            shared,
            fault,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// The server's root URL, `http://127.0.0.1:PORT` (or `https://`).
    pub fn base_url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    /// The URL of the repository `name` (a directory under the root, e.g. `alice.git`).
    pub fn url(&self, name: &str) -> String {
        format!("{}/{name}", self.base_url())
    }

    /// Creates the bare repository `name` under the root, with `main` as HEAD.
    pub fn create_bare(&self, name: &str) -> PathBuf {
        let dir = self.shared.root.join(name);
        crate::git::init_bare(&dir);
        dir
    }

    /// Every request so far, oldest first.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.requests.lock().expect("requests lock").clone()
    }

    /// From now on, a request without this basic-auth password gets 401.
    pub fn require_password(&self, password: &str) {
        *self.shared.password.lock().expect("password lock") = Some(password.to_owned());
    }

    /// From now on, every request below repository `from` (e.g. `old.git`) is answered with
    /// `301 Moved Permanently` to the same request below `to`, as a renamed project is.
    pub fn redirect(&self, from: &str, to: &str) {
        self.shared
            .moved
            .lock()
            .expect("moved lock")
            .push((from.to_owned(), to.to_owned()));
    }

    /// Switches the fault; when this returns, the server behaves the new way (a refused
    /// port listens again, a listening one refuses).
    pub fn set_fault(&self, fault: Fault) {
        self.fault.send_replace(fault);
        let applied = self.shared.applied.lock().expect("fault lock");
        let (applied, timeout) = self
            .shared
            .applied_changed
            .wait_timeout_while(applied, Duration::from_secs(10), |a| *a != fault)
            .expect("fault lock");
        assert!(
            !timeout.timed_out(),
            "the git server did not switch to {fault:?} (still {:?})",
            *applied
        );
    }

    /// Makes pushes to `repo` fail in its `pre-receive` hook, which prints `message`.
    pub fn install_pre_receive_reject(&self, repo: &str, message: &str) {
        let quoted = message.replace('\'', r"'\''");
        let script = format!("#!/bin/sh\necho '{quoted}' >&2\nexit 1\n");
        self.write_hook(repo, &script);
    }

    /// Removes the hook [`Self::install_pre_receive_reject`] installed.
    pub fn remove_pre_receive(&self, repo: &str) {
        let _ = std::fs::remove_file(self.shared.root.join(repo).join("hooks/pre-receive"));
    }

    fn write_hook(&self, repo: &str, script: &str) {
        use std::os::unix::fs::PermissionsExt as _;
        let hooks = self.shared.root.join(repo).join("hooks");
        std::fs::create_dir_all(&hooks).expect("hooks dir");
        let path = hooks.join("pre-receive");
        std::fs::write(&path, script).expect("write hook");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
            .expect("chmod hook");
    }
}

impl Drop for GitServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Binds with SO_REUSEADDR so the same port can be listened on again after a refusal spell.
fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(128)
}

async fn accept_loop(
    listener: TcpListener,
    addr: SocketAddr,
    shared: Arc<Shared>,
    mut fault: watch::Receiver<Fault>,
    tls: Option<TlsAcceptor>,
) {
    let mut listener = Some(listener);
    loop {
        let current = *fault.borrow_and_update();
        if current == Fault::RefuseConnections {
            listener = None;
        } else if listener.is_none() {
            match bind(addr) {
                Ok(l) => listener = Some(l),
                Err(e) => panic!("git server cannot listen on {addr} again: {e}"),
            }
        }
        *shared.applied.lock().expect("fault lock") = current;
        shared.applied_changed.notify_all();
        let Some(active) = listener.as_ref() else {
            if fault.changed().await.is_err() {
                return;
            }
            continue;
        };
        tokio::select! {
            changed = fault.changed() => if changed.is_err() { return },
            accepted = active.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let shared = Arc::clone(&shared);
                let fault = fault.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    match tls {
                        Some(tls) => {
                            if let Ok(stream) = tls.accept(stream).await {
                                serve_connection(stream, shared, fault).await;
                            }
                        }
                        None => serve_connection(stream, shared, fault).await,
                    }
                });
            }
        }
    }
}

async fn serve_connection<S>(stream: S, shared: Arc<Shared>, fault: watch::Receiver<Fault>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req| {
        let shared = Arc::clone(&shared);
        let fault = *fault.borrow();
        async move { Ok::<_, std::convert::Infallible>(handle(&shared, fault, req).await) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

async fn handle(shared: &Shared, fault: Fault, req: Request<Incoming>) -> Response<BoxBody> {
    let header = |name: header::HeaderName| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let recorded = Recorded {
        method: req.method().to_string(),
        path: req
            .uri()
            .path_and_query()
            .map_or_else(|| req.uri().path().to_owned(), |p| p.as_str().to_owned()),
        user_agent: header(header::USER_AGENT),
        authorization: header(header::AUTHORIZATION),
        content_encoding: header(header::CONTENT_ENCODING),
    };
    shared
        .requests
        .lock()
        .expect("requests lock")
        .push(recorded.clone());

    match fault {
        Fault::Status500 => return plain(StatusCode::INTERNAL_SERVER_ERROR),
        Fault::Status403 => return plain(StatusCode::FORBIDDEN),
        Fault::Stall => std::future::pending::<()>().await,
        Fault::StallMidPack
            if recorded.method == "POST" && recorded.path.ends_with("/git-receive-pack") =>
        {
            let mut body = req.into_body();
            let mut read = 0;
            while read < 64 * 1024 {
                match body.frame().await {
                    Some(Ok(frame)) => read += frame.data_ref().map_or(0, |d| d.len()),
                    _ => break,
                }
            }
            return std::future::pending().await;
        }
        Fault::None | Fault::RefuseConnections | Fault::StallMidPack => {}
    }

    let moved = shared
        .moved
        .lock()
        .expect("moved lock")
        .iter()
        .find_map(|(from, to)| {
            let rest = recorded.path.strip_prefix(&format!("/{from}/"))?;
            Some(format!("/{to}/{rest}"))
        });
    if let Some(location) = moved {
        let mut resp = plain(StatusCode::MOVED_PERMANENTLY);
        resp.headers_mut().insert(
            header::LOCATION,
            header::HeaderValue::from_str(&location).expect("a valid location"),
        );
        return resp;
    }

    let required = shared.password.lock().expect("password lock").clone();
    let user = match (required, recorded.authorization.as_deref()) {
        (None, auth) => auth
            .and_then(basic_credentials)
            .map_or_else(|| "anonymous".to_owned(), |(user, _)| user),
        (Some(required), auth) => match auth.and_then(basic_credentials) {
            Some((user, pw)) if pw == required => user,
            _ => {
                let mut resp = plain(StatusCode::UNAUTHORIZED);
                resp.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    header::HeaderValue::from_static("Basic realm=\"git\""),
                );
                return resp;
            }
        },
    };
    let path_info = req.uri().path().to_owned();
    http_backend::serve(&shared.root, req, &path_info, Some(&user)).await
}

fn basic_credentials(authorization: &str) -> Option<(String, String)> {
    let encoded = authorization.strip_prefix("Basic ")?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, pw) = text.split_once(':')?;
    Some((user.to_owned(), pw.to_owned()))
}

fn plain(status: StatusCode) -> Response<BoxBody> {
    let body = Full::new(Bytes::from(format!("{status}\n")))
        .map_err(|never| match never {})
        .boxed();
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    resp
}
