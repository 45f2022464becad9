//! Which git smart-HTTP endpoint a request names, and which repository name (if any) its path
//! carries. Pure: everything the proxy accepts passes through [`classify`] first.

use http::Method;

use crate::user::UserId;

/// The two git services a smart-HTTP client talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// Fetches and clones.
    UploadPack,
    /// Pushes.
    ReceivePack,
}

impl Service {
    /// The service's name in URLs and content types (`git-upload-pack`).
    pub fn name(self) -> &'static str {
        match self {
            Service::UploadPack => "git-upload-pack",
            Service::ReceivePack => "git-receive-pack",
        }
    }

    fn from_name(name: &str) -> Option<Service> {
        match name {
            "git-upload-pack" => Some(Service::UploadPack),
            "git-receive-pack" => Some(Service::ReceivePack),
            _ => None,
        }
    }
}

/// One of the three endpoints the proxy forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `GET .../info/refs?service=<service>`: the ref advertisement.
    InfoRefs(Service),
    /// `POST .../<service>`: the exchange itself.
    Rpc(Service),
}

impl Endpoint {
    /// The service the endpoint belongs to.
    pub fn service(self) -> Service {
        match self {
            Endpoint::InfoRefs(s) | Endpoint::Rpc(s) => s,
        }
    }

    /// The path below a repository URL that reaches this endpoint.
    pub fn service_path(self) -> &'static str {
        match self {
            Endpoint::InfoRefs(_) => "info/refs",
            Endpoint::Rpc(s) => s.name(),
        }
    }

    /// [`Self::service_path`] with the query git sends.
    pub fn path_and_query(self) -> String {
        match self {
            Endpoint::InfoRefs(s) => format!("info/refs?service={}", s.name()),
            Endpoint::Rpc(s) => s.name().to_owned(),
        }
    }

    /// The HTTP method git uses for it.
    pub fn method(self) -> Method {
        match self {
            Endpoint::InfoRefs(_) => Method::GET,
            Endpoint::Rpc(_) => Method::POST,
        }
    }
}

/// A request the proxy accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitRoute {
    pub endpoint: Endpoint,
    /// The repository segment of the path (`alice` or `alice.git`), when there is one. It never
    /// chooses the repository; it only has to agree with the token.
    pub repo: Option<String>,
}

impl GitRoute {
    /// The path names no repository, or names `user`'s own.
    pub fn names_repo_of(&self, user: &UserId) -> bool {
        match &self.repo {
            None => true,
            Some(repo) => repo.strip_suffix(".git").unwrap_or(repo) == user.as_str(),
        }
    }
}

/// `path` is the request path below the proxy's mount point (`/alice.git/info/refs`), raw as it
/// arrived (still percent-encoded). `None` for anything that is not one of the three endpoints,
/// including every path with an encoded byte, an empty, `.` or `..` segment, or more than one
/// segment before the endpoint.
pub fn classify(method: &Method, path: &str, query: Option<&str>) -> Option<GitRoute> {
    let path = path.strip_prefix('/')?;
    let segments: Vec<&str> = path.split('/').collect();
    if !segments.iter().all(|s| is_plain_segment(s)) {
        return None;
    }
    let (endpoint, repo) = match segments.as_slice() {
        [repo @ .., "info", "refs"] if *method == Method::GET => {
            let service = query?.strip_prefix("service=")?;
            (Endpoint::InfoRefs(Service::from_name(service)?), repo)
        }
        [repo @ .., rpc] if *method == Method::POST && query.is_none() => {
            (Endpoint::Rpc(Service::from_name(rpc)?), repo)
        }
        _ => return None,
    };
    let repo = match repo {
        [] => None,
        [name] => Some((*name).to_owned()),
        _ => return None,
    };
    Some(GitRoute { endpoint, repo })
}

/// Letters, digits, `.`, `_`, `-`; not empty, not `.` or `..`, not starting with `.`.
fn is_plain_segment(segment: &str) -> bool {
    !segment.is_empty()
        && !segment.starts_with('.')
        && segment
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(method: Method, uri: &str, expected: Option<(Endpoint, Option<&str>)>) {
        let (path, query) = match uri.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (uri, None),
        };
        let got = classify(&method, path, query);
        let expected = expected.map(|(endpoint, repo)| GitRoute {
            endpoint,
            repo: repo.map(str::to_owned),
        });
        assert_eq!(got, expected, "{method} {uri}");
    }

    const UP: Service = Service::UploadPack;
    const RECV: Service = Service::ReceivePack;

    #[test]
    fn accepts_exactly_the_smart_http_endpoints() {
        use Endpoint::*;
        check(
            Method::GET,
            "/info/refs?service=git-upload-pack",
            Some((InfoRefs(UP), None)),
        );
        check(
            Method::GET,
            "/alice.git/info/refs?service=git-receive-pack",
            Some((InfoRefs(RECV), Some("alice.git"))),
        );
        check(
            Method::POST,
            "/alice/git-upload-pack",
            Some((Rpc(UP), Some("alice"))),
        );
        check(Method::POST, "/git-receive-pack", Some((Rpc(RECV), None)));
        check(Method::GET, "/info/refs", None);
        check(Method::GET, "/info/refs?service=git-upload-archive", None);
        check(Method::GET, "/info/refs?service=git-upload-pack&x=1", None);
        check(Method::POST, "/info/refs?service=git-upload-pack", None);
        check(Method::GET, "/alice/git-upload-pack", None);
        check(Method::POST, "/alice/git-upload-pack?x", None);
        check(Method::PUT, "/alice/git-receive-pack", None);
        check(Method::GET, "/alice/HEAD", None);
        check(Method::GET, "/alice/objects/info/packs", None);
        check(Method::GET, "/", None);
        check(Method::GET, "", None);
        check(Method::GET, "/healthz", None);
    }

    #[test]
    fn rejects_traversal_and_encoded_tricks() {
        for uri in [
            "/../bob/info/refs?service=git-upload-pack",
            "/alice/../bob/info/refs?service=git-upload-pack",
            "/./info/refs?service=git-upload-pack",
            "/%2e%2e/bob/git-receive-pack",
            "/alice%2fbob/git-receive-pack",
            "/..%2fbob/git-receive-pack",
            "/alice//git-receive-pack",
            "//git-receive-pack",
            "/alice/bob/git-receive-pack",
            "/alice\\..\\bob/git-receive-pack",
            "/.git/git-receive-pack",
            "/alice/git-receive-pack/",
        ] {
            check(Method::POST, uri, None);
            check(
                Method::GET,
                &format!("{uri}/info/refs?service=git-upload-pack"),
                None,
            );
        }
    }

    #[test]
    fn a_named_repository_must_be_the_token_owners() {
        let alice = UserId::parse("alice").expect("valid");
        let route = |repo: Option<&str>| GitRoute {
            endpoint: Endpoint::Rpc(RECV),
            repo: repo.map(str::to_owned),
        };
        assert!(route(None).names_repo_of(&alice));
        assert!(route(Some("alice")).names_repo_of(&alice));
        assert!(route(Some("alice.git")).names_repo_of(&alice));
        assert!(!route(Some("bob.git")).names_repo_of(&alice));
        assert!(!route(Some("alice.git.git")).names_repo_of(&alice));
        assert!(!route(Some("alicex")).names_repo_of(&alice));
    }
}
