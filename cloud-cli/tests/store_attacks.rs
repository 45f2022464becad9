//! `shmastra-cloud serve`'s state store attacked (issue 27): the wire to PostgreSQL, and a
//! replica cut off from it. The real binary, a real PostgreSQL started by the test (TLS with a
//! certificate the test makes), and the real `token` command.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use testkit::postgres::Postgres;
use testkit::wait;

use common::{PATIENCE, Serve};

const SECRET: &str = "store-attack-secret-0123456789abcdef";

/// serve on an embedded upstream in a temp dir (kept until the test process ends) and
/// `database_url`, with no sync command; `extra` are more flags.
fn serve_on(database_url: &str, extra: &[&str]) -> Result<Serve, String> {
    let up = tempfile::tempdir().expect("tempdir").keep();
    let dir = up.to_str().expect("utf-8").to_owned();
    let mut args = vec!["--upstream-dir", &dir, "--database-url", database_url];
    args.extend_from_slice(extra);
    Serve::try_start(SECRET, &args, &[], None)
}

/// The store connected with `NoTls`: a server that speaks only TLS (every managed PostgreSQL:
/// Supabase, RDS, Cloud SQL, Neon) made serve fail to start with `sslmode=require`, and the
/// default was plaintext. TLS now goes through rustls: `require` (and the loopback default,
/// `prefer`) encrypt; `verify-full` checks the chain against `sslrootcert` and the host name;
/// `verify-ca` the chain only; a certificate for another name or from another CA is refused at
/// start, saying so.
#[test]
fn serve_speaks_tls_to_postgresql_and_checks_the_certificate_when_asked() {
    let pg = Postgres::start_tls();
    let ca = pg.ca_file().display().to_string();
    let foreign = Postgres::foreign_ca(pg.ca_file().parent().expect("the CA's dir"));
    let at = |host: &str, query: &str| format!("{}&{query}", pg.url_at(host));

    for url in [
        at("127.0.0.1", "sslmode=require"),
        pg.url(),
        at(
            "localhost",
            &format!("sslmode=verify-full&sslrootcert={ca}"),
        ),
        at("127.0.0.1", &format!("sslmode=verify-ca&sslrootcert={ca}")),
        at("127.0.0.1", &format!("sslmode=require&sslrootcert={ca}")),
    ] {
        let mut serve = serve_on(&url, &[]).unwrap_or_else(|why| panic!("{url}: {why}"));
        let (status, body) = serve.get("/healthz");
        assert_eq!((status, body.as_str()), (200, "ok\n"), "{url}");
        serve.stop();
    }

    for (url, says) in [
        (
            at(
                "127.0.0.1",
                &format!("sslmode=verify-full&sslrootcert={ca}"),
            ),
            "certificate",
        ),
        (
            at(
                "localhost",
                &format!("sslmode=verify-full&sslrootcert={}", foreign.display()),
            ),
            "certificate",
        ),
        (at("127.0.0.1", "sslmode=disable"), "no encryption"),
    ] {
        let refused = serve_on(&url, &[])
            .err()
            .unwrap_or_else(|| panic!("{url} started"));
        assert!(refused.contains(says), "{url}: {refused}");
    }
}

/// A TCP forwarder in front of PostgreSQL that can cut one replica off while the database
/// stays up for everyone else: open connections are shut, new ones closed at once.
struct Link {
    addr: std::net::SocketAddr,
    cut: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Link {
    fn to(target: std::net::SocketAddr) -> Link {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the link");
        let addr = listener.local_addr().expect("its address");
        let cut = Arc::new(AtomicBool::new(false));
        let open = Arc::new(Mutex::new(Vec::new()));
        let (cut2, open2) = (cut.clone(), open.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if cut2.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(target) else {
                    continue;
                };
                let mut open = open2.lock().unwrap();
                open.push(client.try_clone().unwrap());
                open.push(server.try_clone().unwrap());
                for (mut from, mut to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(Shutdown::Both);
                    });
                }
            }
        });
        Link { addr, cut, open }
    }

    fn set_cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::SeqCst);
        if cut {
            for stream in self.open.lock().unwrap().drain(..) {
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
    }
}

/// The status of a ref advertisement for alice's repository with `token`.
fn git_status(serve: &Serve, token: &str) -> u16 {
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("x:{token}"));
    let mut stream = serve.connect();
    stream
        .write_all(
            format!(
                "GET /api/git/alice.git/info/refs?service=git-upload-pack HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {auth}\r\nConnection: close\r\n\r\n"
            )
            .as_bytes(),
        )
        .expect("send");
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    String::from_utf8_lossy(&response)
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("an HTTP status")
}

fn token(action: &str, database_url: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_shmastra-cloud"))
        .args(["token", action, "--user", "alice"])
        .env_clear()
        .env("SHMASTRA_TOKEN_SECRET", SECRET)
        .env("DATABASE_URL", database_url)
        .output()
        .expect("shmastra-cloud token");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// `/healthz`, polled until `ready` says it is what the test waits for.
fn health_until(
    serve: &Serve,
    what: &str,
    ready: impl Fn(&(u16, String)) -> bool,
) -> (u16, String) {
    wait::until_seen(PATIENCE, what, || {
        let health = serve.get("/healthz");
        if ready(&health) {
            Ok(health)
        } else {
            Err(health)
        }
    })
}

/// A replica cut off from PostgreSQL kept its last copy of the revocations for ever: a token
/// revoked meanwhile still opened git, the new one was refused, and `/healthz` said `ok` (also
/// with no `--on-external-push`, where the README promised `degraded`). Now the replica is
/// `degraded` while its copy is young, and past `--token-state-max-age` it answers every token
/// with 503 + Retry-After and `/healthz` 503, so a balancer drains it; once the database
/// answers again the revocation holds and the new token works.
#[test]
fn a_replica_cut_off_from_the_database_stops_trusting_its_revocations() {
    let pg = Postgres::start();
    let target = pg
        .url()
        .trim_start_matches("postgres://postgres@")
        .split('/')
        .next()
        .expect("host:port")
        .parse()
        .expect("a socket address");
    let link = Link::to(target);
    let via_link = format!(
        "postgres://postgres@{}/postgres?connect_timeout=2",
        link.addr
    );
    let serve = serve_on(&via_link, &["--token-state-max-age", "3s"]).expect("serve starts");
    let old = token("mint", &pg.url());
    assert_eq!(git_status(&serve, &old), 200);
    assert_eq!(serve.get("/healthz"), (200, "ok\n".to_owned()));

    link.set_cut(true);
    let cut_at = Instant::now();
    let new = token("rotate", &pg.url());
    let degraded = health_until(&serve, "/healthz to say degraded", |(status, body)| {
        *status == 200 && body.starts_with("degraded: database")
    });
    assert!(
        cut_at.elapsed() < Duration::from_secs(3),
        "degraded only after {:?}: {degraded:?}",
        cut_at.elapsed()
    );
    let unhealthy = health_until(&serve, "/healthz to say unhealthy", |(status, _)| {
        *status == 503
    });
    assert!(unhealthy.1.contains("tokens are refused"), "{unhealthy:?}");
    // The copy was last read at most one poll (1 s) before the cut.
    assert!(
        cut_at.elapsed() >= Duration::from_secs(2),
        "{:?}",
        cut_at.elapsed()
    );
    assert_eq!(
        git_status(&serve, &old),
        503,
        "the revoked token past the limit"
    );
    assert_eq!(
        git_status(&serve, &new),
        503,
        "the new token past the limit: not judged"
    );

    link.set_cut(false);
    health_until(&serve, "/healthz to say ok again", |(status, body)| {
        *status == 200 && body == "ok\n"
    });
    assert_eq!(git_status(&serve, &old), 401, "the revocation holds");
    assert_eq!(git_status(&serve, &new), 200);
}
