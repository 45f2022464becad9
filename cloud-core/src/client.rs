//! Who sent a request: the TCP peer serve's accept loop records in every request, for the log
//! lines of refusals (the proxy's, the webhook's).

/// The TCP peer of a request, put in its extensions by the server that accepted it; logged on
/// every refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr(pub std::net::SocketAddr);

impl std::fmt::Display for ClientAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// The client address of `request` for log lines, `-` when the server did not record it.
pub(crate) fn client_of<B>(request: &http::Request<B>) -> String {
    request
        .extensions()
        .get::<ClientAddr>()
        .map_or_else(|| "-".to_owned(), ToString::to_string)
}
