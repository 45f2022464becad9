//! Which headers cross the proxy, in each direction. Allowlists: a header the git protocol does
//! not need never crosses, so neither credentials, cookies nor hop-by-hop headers can leak.

use http::HeaderMap;
use http::header::{self, HeaderName};

/// Client to upstream: what git's smart-HTTP needs to describe the body and the protocol.
/// `Accept-Encoding` stays behind so the push report arrives uncompressed for the parser.
const REQUEST_ALLOWED: [HeaderName; 5] = [
    header::CONTENT_TYPE,
    header::CONTENT_ENCODING,
    header::CONTENT_LENGTH,
    header::ACCEPT,
    header::USER_AGENT,
];

/// Upstream to client: the body's description and git's caching headers.
const RESPONSE_ALLOWED: [HeaderName; 5] = [
    header::CONTENT_TYPE,
    header::CONTENT_ENCODING,
    header::CACHE_CONTROL,
    header::EXPIRES,
    header::PRAGMA,
];

/// `Git-Protocol` (protocol v2 negotiation) is not in `http::header`.
pub const GIT_PROTOCOL: &str = "git-protocol";

/// The headers of `incoming` the upstream may see.
pub fn to_upstream(incoming: &HeaderMap) -> HeaderMap {
    let mut out = keep(incoming, &REQUEST_ALLOWED);
    for value in incoming.get_all(GIT_PROTOCOL) {
        out.append(HeaderName::from_static(GIT_PROTOCOL), value.clone());
    }
    out
}

/// The headers of an upstream response the client may see.
pub fn to_client(upstream: &HeaderMap) -> HeaderMap {
    keep(upstream, &RESPONSE_ALLOWED)
}

fn keep(from: &HeaderMap, allowed: &[HeaderName]) -> HeaderMap {
    let mut out = HeaderMap::new();
    for name in allowed {
        for value in from.get_all(name) {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(
                HeaderName::from_bytes(k.as_bytes()).expect("name"),
                v.parse().expect("value"),
            );
        }
        m
    }

    fn names(m: &HeaderMap) -> Vec<String> {
        let mut n: Vec<String> = m.keys().map(|k| k.as_str().to_owned()).collect();
        n.sort();
        n
    }

    #[test]
    fn request_keeps_git_headers_and_drops_credentials_and_hop_by_hop() {
        let incoming = map(&[
            ("authorization", "Basic dXNlcjpwYXNz"),
            ("proxy-authorization", "Basic eA=="),
            ("cookie", "session=1"),
            ("connection", "keep-alive, x-secret"),
            ("x-secret", "1"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("te", "trailers"),
            ("upgrade", "h2c"),
            ("host", "proxy.example"),
            ("x-forwarded-for", "10.0.0.1"),
            ("private-token", "glpat-xyz"),
            ("content-type", "application/x-git-receive-pack-request"),
            ("content-encoding", "gzip"),
            ("content-length", "12"),
            ("accept", "application/x-git-receive-pack-result"),
            ("accept-encoding", "gzip"),
            ("user-agent", "git/2.43.0"),
            ("git-protocol", "version=2"),
        ]);
        assert_eq!(
            names(&to_upstream(&incoming)),
            [
                "accept",
                "content-encoding",
                "content-length",
                "content-type",
                "git-protocol",
                "user-agent"
            ]
        );
    }

    #[test]
    fn response_drops_credentials_cookies_and_hop_by_hop() {
        let upstream = map(&[
            ("set-cookie", "_gitlab_session=abc"),
            ("www-authenticate", "Basic realm=\"GitLab\""),
            ("connection", "close"),
            ("transfer-encoding", "chunked"),
            ("content-length", "99"),
            ("x-gitlab-meta", "{}"),
            (
                "content-type",
                "application/x-git-upload-pack-advertisement",
            ),
            ("cache-control", "no-cache"),
            ("expires", "Fri, 01 Jan 1980 00:00:00 GMT"),
            ("pragma", "no-cache"),
            ("content-encoding", "gzip"),
        ]);
        assert_eq!(
            names(&to_client(&upstream)),
            [
                "cache-control",
                "content-encoding",
                "content-type",
                "expires",
                "pragma"
            ]
        );
    }
}
