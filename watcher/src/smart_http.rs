//! libgit2's smart-HTTP subtransport for `http://` and `https://` remotes: git's requests made
//! with a blocking client (ureq) over rustls, so the watcher links no OpenSSL.
//!
//! libgit2 speaks the git protocol and hands this module one stream per request: a GET of
//! `info/refs` (the advertisement), then POSTs to `git-upload-pack` or `git-receive-pack`.
//! Every request carries the User-Agent with the watcher's tag and the operation's basic-auth
//! credentials (sent with the first request, as git's `http.proactiveAuth`, and never again
//! after a refusal). Connect, and each read or write on a connection, time out, so a stalled
//! server fails the attempt and the pusher retries. A redirect is followed only by the first
//! GET and only within the configured origin; anything else is refused with a clear error.
//!
//! A non-200 answer is an `io::Error` holding an [`HttpStatus`]: the status and which
//! credentials the request carried, as values the push's own client reads back
//! ([`HttpStatus::of`]). libgit2 (the fetch) keeps only an error's text, so its text is worded
//! as libgit2's own transport words it (`unexpected http status code: NNN`), which
//! [`crate::retry::http_status_in`] reads at that boundary. A timeout is
//! `io::ErrorKind::TimedOut`. No message contains the credentials.

use std::io::{self, Read, Write};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use base64::Engine as _;
use git2::transport::{Service, SmartSubtransport, SmartSubtransportStream};
use url::Url;

/// How many redirects the first request of an operation follows (git follows a few).
const MAX_REDIRECTS: usize = 5;

/// How many written chunks of a POST body may wait for the connection: bounds the memory a
/// push holds while the network is slower than the pack writer.
const BODY_CHUNKS_IN_FLIGHT: usize = 8;

/// Basic-auth credentials for one operation.
#[derive(Clone)]
pub(crate) struct Credentials {
    user: String,
    password: String,
    source: Sent,
}

/// Which credentials a request carried, for the words of a 401.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sent {
    Nothing,
    UrlCredentials,
    Token,
}

impl Sent {
    /// What an operation on `url` (the configured remote URL) sends with `token`.
    pub(crate) fn for_remote(url: &str, token: Option<&str>) -> Self {
        Url::parse(url)
            .ok()
            .and_then(|url| Credentials::for_url(&url, token))
            .map_or(Self::Nothing, |c| c.source)
    }
}

/// A request the server answered with a status other than 200, and what it had sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("unexpected http status code: {status}{}", self.detail())]
pub(crate) struct HttpStatus {
    pub status: u16,
    pub sent: Sent,
}

impl HttpStatus {
    /// The status inside an error of this module, if it is one.
    pub(crate) fn of(error: &io::Error) -> Option<Self> {
        error.get_ref()?.downcast_ref::<Self>().copied()
    }

    fn detail(&self) -> &'static str {
        match (self.status, self.sent) {
            (401, Sent::Token) => " (PROJECT_TOKEN was refused)",
            (401, Sent::UrlCredentials) => " (the credentials in the remote's URL were refused)",
            (401, Sent::Nothing) => {
                " (the server asks for credentials and PROJECT_TOKEN is not set)"
            }
            _ => "",
        }
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"[redacted]")
            .finish()
    }
}

impl Credentials {
    /// What one operation answers with: the remote URL's own `user:password` when it has one
    /// (as git and libgit2 use it), else `token` with the URL's user name, if any.
    fn for_url(url: &Url, token: Option<&str>) -> Option<Self> {
        let user = decode(url.username());
        match url.password() {
            Some(password) => Some(Self {
                user,
                password: decode(password),
                source: Sent::UrlCredentials,
            }),
            None => token.map(|token| Self {
                user: if user.is_empty() {
                    "project-watcher".to_owned()
                } else {
                    user
                },
                password: token.to_owned(),
                source: Sent::Token,
            }),
        }
    }

    fn header(&self) -> String {
        let pair = format!("{}:{}", self.user, self.password);
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        )
    }
}

/// A URL's user name or password as written before percent-encoding.
fn decode(component: &str) -> String {
    percent_encoding::percent_decode_str(component)
        .decode_utf8_lossy()
        .into_owned()
}

/// The process-wide settings every subtransport uses.
#[derive(Debug, Clone)]
pub(crate) struct ClientSettings {
    pub user_agent: String,
    pub timeout: Duration,
}

/// One libgit2 operation's way to a remote (a push, a fetch): its agent (every request on a
/// connection of its own, see [`SmartHttp::new`]), credentials and, after a redirect, the
/// repository's new URL.
pub(crate) struct SmartHttp {
    agent: ureq::Agent,
    token: Option<String>,
    timeout: Duration,
    /// The repository URL the first request ended at, once a redirect moved it.
    redirected: Arc<Mutex<Option<Url>>>,
}

impl SmartHttp {
    pub(crate) fn new(settings: &ClientSettings, token: Option<String>) -> Self {
        let agent = ureq::AgentBuilder::new()
            .user_agent(&settings.user_agent)
            .timeout_connect(settings.timeout)
            .timeout_read(settings.timeout)
            .timeout_write(settings.timeout)
            .redirects(0)
            // ureq clears a connection's socket timeouts when it pools it and sets only the read
            // timeout again on reuse: a POST on a pooled connection could block forever on a
            // server that stops reading. Every request gets a fresh connection instead.
            .max_idle_connections(0)
            .build();
        Self {
            agent,
            token,
            timeout: settings.timeout,
            redirected: Arc::default(),
        }
    }
}

impl SmartSubtransport for SmartHttp {
    fn action(
        &self,
        url: &str,
        action: Service,
    ) -> Result<Box<dyn SmartSubtransportStream>, git2::Error> {
        let configured = Url::parse(url).map_err(|e| {
            git2::Error::new(
                git2::ErrorCode::Invalid,
                git2::ErrorClass::Http,
                format!("the remote URL is not a valid URL: {e}"),
            )
        })?;
        let credentials = Credentials::for_url(&configured, self.token.as_deref());
        let mut repo = strip_credentials(&configured);
        let (service, request) = match action {
            Service::UploadPackLs => ("upload-pack", Request::Advertisement),
            Service::ReceivePackLs => ("receive-pack", Request::Advertisement),
            Service::UploadPack => ("upload-pack", Request::Rpc),
            Service::ReceivePack => ("receive-pack", Request::Rpc),
        };
        match request {
            // A new operation starts from the configured URL.
            Request::Advertisement => *lock(&self.redirected) = None,
            Request::Rpc => {
                if let Some(moved) = lock(&self.redirected).clone() {
                    repo = moved;
                }
            }
        }
        Ok(Box::new(Stream {
            agent: self.agent.clone(),
            origin: origin(&configured),
            repo,
            service,
            request,
            authorization: credentials.as_ref().map(Credentials::header),
            sent: credentials.map_or(Sent::Nothing, |c| c.source),
            timeout: self.timeout,
            redirected: Arc::clone(&self.redirected),
            state: State::Ready,
        }))
    }

    fn close(&self) -> Result<(), git2::Error> {
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Request {
    /// `GET info/refs?service=git-<service>`
    Advertisement,
    /// `POST git-<service>` with the stream's writes as the body.
    Rpc,
}

enum State {
    Ready,
    /// A POST whose body is being written: a thread runs the request and reads the body from
    /// the channel.
    Sending {
        body: SyncSender<Chunk>,
        request: JoinHandle<io::Result<ureq::Response>>,
    },
    Receiving(Box<dyn Read + Send + Sync>),
    /// The request failed; libgit2 was told why and gets nothing more from it.
    Failed,
}

/// One request and its response, as libgit2 writes and reads it.
struct Stream {
    agent: ureq::Agent,
    origin: String,
    /// The repository URL without credentials, e.g. `https://host/alice.git`.
    repo: Url,
    service: &'static str,
    request: Request,
    authorization: Option<String>,
    sent: Sent,
    timeout: Duration,
    redirected: Arc<Mutex<Option<Url>>>,
    state: State,
}

impl Stream {
    fn rpc_url(&self) -> Url {
        join(&self.repo, &format!("git-{}", self.service))
    }

    fn rpc_request(&self) -> ureq::Request {
        let mut request = self
            .agent
            .request_url("POST", &self.rpc_url())
            .set(
                "Content-Type",
                &format!("application/x-git-{}-request", self.service),
            )
            .set(
                "Accept",
                &format!("application/x-git-{}-result", self.service),
            );
        if let Some(authorization) = &self.authorization {
            request = request.set("Authorization", authorization);
        }
        request
    }

    /// GETs the advertisement, following redirects within the origin.
    fn advertisement(&self) -> io::Result<ureq::Response> {
        let suffix = format!("info/refs?service=git-{}", self.service);
        let mut url = join(&self.repo, &suffix);
        for _ in 0..=MAX_REDIRECTS {
            let mut request = self.agent.request_url("GET", &url).set(
                "Accept",
                &format!("application/x-git-{}-advertisement", self.service),
            );
            if let Some(authorization) = &self.authorization {
                request = request.set("Authorization", authorization);
            }
            let response = request.call().map_err(|e| self.failure(e))?;
            if !(300..400).contains(&response.status()) {
                return Ok(response);
            }
            let moved = redirect_target(&url, &response, &self.origin)?;
            let repo = moved
                .as_str()
                .strip_suffix(&suffix)
                .and_then(|base| Url::parse(base).ok())
                .ok_or_else(|| {
                    refused(format!(
                        "the server redirected to {}, which is not a git repository's advertisement",
                        strip_credentials(&moved)
                    ))
                })?;
            *lock(&self.redirected) = Some(repo);
            url = moved;
        }
        Err(refused(format!(
            "the server redirected more than {MAX_REDIRECTS} times"
        )))
    }

    /// Starts the POST on a thread that reads its body from a channel, so libgit2's writes
    /// stream to the server (chunked) instead of piling up in memory.
    fn start_rpc(&mut self) -> io::Result<()> {
        let (body, chunks) = sync_channel(BODY_CHUNKS_IN_FLIGHT);
        let request = self.rpc_request();
        let failure = self.failure_context();
        let request = std::thread::Builder::new()
            .name("git-http-post".into())
            .spawn(move || {
                request
                    .send(ChannelReader::new(chunks))
                    .map_err(|e| failure.describe(e))
            })?;
        self.state = State::Sending { body, request };
        Ok(())
    }

    /// Ends the request (if its body was being written) and checks the response.
    fn response(&mut self) -> io::Result<Box<dyn Read + Send + Sync>> {
        let response = match std::mem::replace(&mut self.state, State::Failed) {
            State::Ready => match self.request {
                Request::Advertisement => self.advertisement()?,
                Request::Rpc => self
                    .rpc_request()
                    .send_bytes(&[])
                    .map_err(|e| self.failure(e))?,
            },
            State::Sending { body, request } => {
                drop(body);
                join_request(request)?
            }
            State::Receiving(reader) => return Ok(reader),
            State::Failed => return Err(io::Error::other("the request failed earlier")),
        };
        let expected = match self.request {
            Request::Advertisement => format!("application/x-git-{}-advertisement", self.service),
            Request::Rpc => format!("application/x-git-{}-result", self.service),
        };
        if response.status() != 200 {
            return Err(status_error(response.status(), self.sent));
        }
        if response.content_type() != expected {
            return Err(refused(format!(
                "the server is not a git smart-HTTP server: it answered with Content-Type `{}`, not `{expected}`",
                response.content_type()
            )));
        }
        Ok(response.into_reader())
    }

    fn failure_context(&self) -> FailureContext {
        FailureContext {
            sent: self.sent,
            timeout: self.timeout,
        }
    }

    fn failure(&self, error: ureq::Error) -> io::Error {
        self.failure_context().describe(error)
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let context = self.failure_context();
        let mut reader = self.response()?;
        let read = reader.read(buf).map_err(|e| context.describe_io(e));
        self.state = match read {
            Ok(_) => State::Receiving(reader),
            Err(_) => State::Failed,
        };
        read
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.request != Request::Rpc {
            return Err(io::Error::other(
                "libgit2 wrote to an advertisement request",
            ));
        }
        if matches!(self.state, State::Ready) {
            self.start_rpc()
                .inspect_err(|_| self.state = State::Failed)?;
        }
        let State::Sending { body, .. } = &self.state else {
            return Err(io::Error::other("libgit2 wrote after reading the response"));
        };
        if body.send(Some(buf.to_vec())).is_ok() {
            return Ok(buf.len());
        }
        // The request ended before its body did: report why.
        let State::Sending { request, .. } = std::mem::replace(&mut self.state, State::Failed)
        else {
            return Err(io::Error::other("libgit2 wrote after reading the response"));
        };
        Err(match join_request(request) {
            Ok(response) if response.status() != 200 => status_error(response.status(), self.sent),
            Ok(_) => io::Error::other("the server answered before the request body ended"),
            Err(e) => e,
        })
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn join_request(request: JoinHandle<io::Result<ureq::Response>>) -> io::Result<ureq::Response> {
    request
        .join()
        .map_err(|_| io::Error::other("the HTTP request thread panicked"))?
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let State::Sending { body, .. } = &self.state {
            // libgit2 gave up mid-body (it reads the response otherwise): the request must
            // fail, not end like a complete one with a truncated pack. Bounded: the request
            // thread drops the channel when its write times out.
            let _ = body.send(None);
        }
    }
}

/// A piece of a request body, or `None`: the writer abandoned the body.
type Chunk = Option<Vec<u8>>;

/// The request body: what libgit2 writes, chunk by chunk, until the writer hangs up.
struct ChannelReader {
    chunks: Receiver<Chunk>,
    current: io::Cursor<Vec<u8>>,
}

impl ChannelReader {
    fn new(chunks: Receiver<Chunk>) -> Self {
        Self {
            chunks,
            current: io::Cursor::new(Vec::new()),
        }
    }
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let read = self.current.read(buf)?;
            if read > 0 || buf.is_empty() {
                return Ok(read);
            }
            match self.chunks.recv() {
                Ok(Some(chunk)) => self.current = io::Cursor::new(chunk),
                Ok(None) => {
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "the request body was abandoned",
                    ));
                }
                Err(_) => return Ok(0),
            }
        }
    }
}

/// What a failure message needs to know about the request it ends.
#[derive(Debug, Clone, Copy)]
struct FailureContext {
    sent: Sent,
    timeout: Duration,
}

impl FailureContext {
    fn describe(self, error: ureq::Error) -> io::Error {
        match error {
            ureq::Error::Status(status, _) => status_error(status, self.sent),
            ureq::Error::Transport(transport) if timed_out(&transport) => self.timed_out(),
            ureq::Error::Transport(transport) => io::Error::other(transport_message(&transport)),
        }
    }

    /// An error while reading a response body.
    fn describe_io(self, error: io::Error) -> io::Error {
        if is_timeout(&error) {
            self.timed_out()
        } else {
            error
        }
    }

    fn timed_out(self) -> io::Error {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "timed out: the server did not answer within {:?}",
                self.timeout
            ),
        )
    }
}

/// The text of a connection failure, without the URL ureq puts in front (the caller names
/// the remote) and with the cause (e.g. the certificate problem) spelled out.
fn transport_message(transport: &ureq::Transport) -> String {
    let mut text = transport
        .message()
        .map_or_else(|| transport.kind().to_string(), str::to_owned);
    let mut source = std::error::Error::source(transport);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text = format!("{text}: {cause_text}");
        }
        source = cause.source();
    }
    text
}

fn timed_out(transport: &ureq::Transport) -> bool {
    let mut source = std::error::Error::source(transport);
    while let Some(cause) = source {
        if cause.downcast_ref::<io::Error>().is_some_and(is_timeout) {
            return true;
        }
        source = cause.source();
    }
    false
}

/// A socket timeout: Linux reports `SO_RCVTIMEO`/`SO_SNDTIMEO` expiry as `EAGAIN`.
fn is_timeout(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
    )
}

/// A non-200 answer: an [`HttpStatus`] inside an `io::Error`.
fn status_error(status: u16, sent: Sent) -> io::Error {
    io::Error::other(HttpStatus { status, sent })
}

fn refused(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

/// Where a 3xx sends the request, if it may go there: the same scheme, host and port (the
/// credentials are for this origin only).
fn redirect_target(
    from: &Url,
    response: &ureq::Response,
    origin_of_remote: &str,
) -> io::Result<Url> {
    let location = response.header("Location").ok_or_else(|| {
        refused(format!(
            "the server answered {} without a Location",
            response.status()
        ))
    })?;
    let target = from
        .join(location)
        .map_err(|e| refused(format!("the server redirected to an invalid URL: {e}")))?;
    if origin(&target) != origin_of_remote {
        return Err(refused(format!(
            "the server redirected to another origin ({}); the watcher sends credentials only to the remote's own origin, so set the remote's URL to the new location",
            origin(&target)
        )));
    }
    Ok(target)
}

/// `scheme://host:port`, the unit the credentials belong to.
fn origin(url: &Url) -> String {
    format!(
        "{}://{}:{}",
        url.scheme(),
        url.host_str().unwrap_or_default(),
        url.port_or_known_default().unwrap_or_default()
    )
}

fn strip_credentials(url: &Url) -> Url {
    let mut url = url.clone();
    let _ = url.set_username("");
    let _ = url.set_password(None);
    url
}

/// `repo` + `/` + `suffix`, whether or not the repository URL ends with a slash.
fn join(repo: &Url, suffix: &str) -> Url {
    let base = repo.as_str().trim_end_matches('/');
    Url::parse(&format!("{base}/{suffix}")).unwrap_or_else(|_| repo.clone())
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_come_from_the_url_else_the_token() {
        let check = |url: &str, token: Option<&str>, expected: Option<(&str, &str)>| {
            let got = Credentials::for_url(&Url::parse(url).unwrap(), token);
            assert_eq!(
                got.map(|c| (c.user, c.password)),
                expected.map(|(u, p)| (u.to_owned(), p.to_owned())),
                "{url} {token:?}"
            );
        };
        check("https://h/r.git", None, None);
        check(
            "https://h/r.git",
            Some("tok"),
            Some(("project-watcher", "tok")),
        );
        check("https://alice@h/r.git", Some("tok"), Some(("alice", "tok")));
        check(
            "https://alice:p%40ss@h/r.git",
            Some("tok"),
            Some(("alice", "p@ss")),
        );
        check("https://alice:pw@h/r.git", None, Some(("alice", "pw")));
    }

    #[test]
    fn the_authorization_header_is_basic_and_debug_hides_the_password() {
        let credentials = Credentials {
            user: "project-watcher".into(),
            password: "s3cret".into(),
            source: Sent::Token,
        };
        assert_eq!(
            credentials.header(),
            "Basic cHJvamVjdC13YXRjaGVyOnMzY3JldA=="
        );
        assert!(!format!("{credentials:?}").contains("s3cret"));
    }

    #[test]
    fn requests_go_below_the_repository_url() {
        for repo in ["https://h:8443/a/r.git", "https://h:8443/a/r.git/"] {
            let repo = Url::parse(repo).unwrap();
            assert_eq!(
                join(&repo, "info/refs?service=git-receive-pack").as_str(),
                "https://h:8443/a/r.git/info/refs?service=git-receive-pack"
            );
        }
        let with_user = Url::parse("https://u:pw@h/r.git").unwrap();
        assert_eq!(strip_credentials(&with_user).as_str(), "https://h/r.git");
    }

    #[test]
    fn origins_compare_scheme_host_and_port() {
        let o = |u: &str| origin(&Url::parse(u).unwrap());
        assert_eq!(o("https://h/r.git"), o("https://h:443/other.git"));
        assert_ne!(o("https://h/r.git"), o("http://h/r.git"));
        assert_ne!(o("https://h/r.git"), o("https://evil.example/r.git"));
        assert_ne!(o("http://127.0.0.1:80/r"), o("http://127.0.0.1:81/r"));
    }

    #[test]
    fn status_errors_carry_the_status_and_what_was_sent_as_values() {
        for (status, sent, kind) in [
            (401, Sent::Token, crate::retry::FailureKind::Auth),
            (401, Sent::UrlCredentials, crate::retry::FailureKind::Auth),
            (401, Sent::Nothing, crate::retry::FailureKind::Auth),
            (403, Sent::Token, crate::retry::FailureKind::Auth),
            (500, Sent::Nothing, crate::retry::FailureKind::Server),
            (404, Sent::Nothing, crate::retry::FailureKind::Rejected),
        ] {
            let error = status_error(status, sent);
            assert_eq!(HttpStatus::of(&error), Some(HttpStatus { status, sent }));
            assert_eq!(crate::retry::FailureKind::of_http_status(status), kind);
            // What libgit2 keeps of it (the fetch): the text, which the fetch boundary reads.
            let message = error.to_string();
            assert_eq!(crate::retry::http_status_in(&message), Some(status));
            assert_eq!(
                crate::retry::classify_git_error(
                    git2::ErrorCode::GenericError,
                    git2::ErrorClass::Net,
                    &message
                ),
                kind,
                "{message}"
            );
        }
        assert_eq!(HttpStatus::of(&io::Error::other("timed out")), None);
    }

    #[test]
    fn what_a_remote_sends_comes_from_its_url_and_the_token() {
        assert_eq!(Sent::for_remote("https://h/r.git", None), Sent::Nothing);
        assert_eq!(Sent::for_remote("https://h/r.git", Some("t")), Sent::Token);
        assert_eq!(
            Sent::for_remote("https://u:pw@h/r.git", None),
            Sent::UrlCredentials
        );
        assert_eq!(Sent::for_remote("/srv/r.git", Some("t")), Sent::Nothing);
    }

    #[test]
    fn a_channel_body_reads_every_chunk_then_ends_or_fails_when_abandoned() {
        let (tx, rx) = sync_channel(2);
        let writer = std::thread::spawn(move || {
            for chunk in [&b"0032"[..], b"", b"want", b" abc\n"] {
                tx.send(Some(chunk.to_vec())).unwrap();
            }
        });
        let mut body = Vec::new();
        ChannelReader::new(rx).read_to_end(&mut body).unwrap();
        writer.join().unwrap();
        assert_eq!(body, b"0032want abc\n");

        let (tx, rx) = sync_channel(2);
        tx.send(Some(b"PACK".to_vec())).unwrap();
        tx.send(None).unwrap();
        let mut body = Vec::new();
        let err = ChannelReader::new(rx).read_to_end(&mut body).unwrap_err();
        assert_eq!(body, b"PACK");
        assert!(err.to_string().contains("abandoned"), "{err}");
    }
}
