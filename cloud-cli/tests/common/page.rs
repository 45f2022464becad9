//! The workspace page over plain HTTP: a client that never follows redirects, GET and POST
//! with the session cookie, sign-in through a link, and a saved project that needs secrets.

use std::path::Path;

use reqwest::StatusCode;
use reqwest::header::{HeaderMap, SET_COOKIE};
use testkit::git::{git, init_repo};

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
}

pub fn block<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

/// GET with an optional cookie: status, headers, body.
pub fn get(url: &str, cookie: Option<&str>) -> (StatusCode, HeaderMap, String) {
    block(async {
        let mut request = client().get(url);
        if let Some(cookie) = cookie {
            request = request.header("cookie", format!("shmastra_session={cookie}"));
        }
        let response = request.send().await.expect("GET");
        let status = response.status();
        let headers = response.headers().clone();
        (status, headers, response.text().await.expect("body"))
    })
}

pub fn post(
    url: &str,
    cookie: &str,
    origin: Option<&str>,
    form: &[(&str, &str)],
) -> (StatusCode, String) {
    block(async {
        let mut request = client()
            .post(url)
            .header("cookie", format!("shmastra_session={cookie}"))
            .form(form);
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        let response = request.send().await.expect("POST");
        (response.status(), response.text().await.expect("body"))
    })
}

/// What the sign-in page's button sends: `POST /login` with the link, from `origin`.
pub fn redeem(link: &str, origin: Option<&str>) -> (StatusCode, HeaderMap, String) {
    // The link's value is base64url and dots: nothing in it is percent-encoded.
    let (base, value) = link.split_once("/login?t=").expect("a sign-in link");
    block(async {
        let mut request = client().post(format!("{base}/login")).form(&[("t", value)]);
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        let response = request.send().await.expect("POST /login");
        let status = response.status();
        let headers = response.headers().clone();
        (status, headers, response.text().await.expect("body"))
    })
}

/// Opens `link` and presses its button, as a browser on the link's own origin does; the
/// session cookie's value and the whole `Set-Cookie` line.
pub fn sign_in(link: &str) -> (String, String) {
    let origin = &link[..link.find("/login?").expect("a sign-in link")];
    sign_in_from(link, origin)
}

/// [`sign_in`], the browser sending `origin` (the public URL's, behind a proxy).
pub fn sign_in_from(link: &str, origin: &str) -> (String, String) {
    let (status, headers, body) = get(link, None);
    assert_eq!(
        status,
        StatusCode::OK,
        "the sign-in page answered {status}: {body}"
    );
    assert!(
        headers.get(SET_COOKIE).is_none(),
        "opening the link set a cookie"
    );
    let (status, headers, body) = redeem(link, Some(origin));
    assert_eq!(status, StatusCode::OK, "sign-in answered {status}: {body}");
    let line = headers
        .get(SET_COOKIE)
        .expect("a session cookie")
        .to_str()
        .expect("ascii")
        .to_owned();
    let value = line
        .strip_prefix("shmastra_session=")
        .and_then(|rest| rest.split(';').next())
        .expect("the session cookie")
        .to_owned();
    (value, line)
}

/// alice's saved project names two secrets; she has no sandbox yet.
pub fn saved_project_with_secrets(upstream: &Path) {
    let work = upstream.parent().unwrap().join("seed");
    init_repo(&work);
    std::fs::write(
        work.join("shmastra.json"),
        "{\n  \"version\": 1,\n  \"env\": [\n    \"API_KEY\",\n    \"DATABASE_URL\"\n  ]\n}\n",
    )
    .unwrap();
    std::fs::write(work.join("app.js"), "console.log('hi');\n").unwrap();
    git(&work, ["add", "-A"]);
    git(&work, ["commit", "-qm", "saved project"]);
    let bare = upstream.join("alice.git");
    git(
        upstream,
        ["init", "-q", "--bare", "-b", "main", bare.to_str().unwrap()],
    );
    git(&work, ["push", "-q", bare.to_str().unwrap(), "HEAD:main"]);
}
