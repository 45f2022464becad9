//! A real PostgreSQL server for tests: `initdb` and `pg_ctl` from the system's binaries into a
//! temp dir, listening on a free loopback port, stopped (immediately) on drop. With
//! [`Postgres::start_tls`] it speaks TLS only, with a certificate for `localhost` signed by a CA
//! made for the test (rcgen).
//!
//! The binaries are found on `PATH`, else in `pg_config --bindir`, else in
//! `/usr/lib/postgresql/*/bin`. PostgreSQL refuses to run as root: as root, the server runs as
//! the `postgres` user (which the distribution's package creates). No binaries is a panic
//! naming the fix: tests that need a database fail rather than skip.

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A running PostgreSQL cluster in a temp dir.
pub struct Postgres {
    bin: PathBuf,
    data: PathBuf,
    port: u16,
    owner: Option<(u32, u32)>,
    /// The CA that signed the server's certificate, when it speaks TLS.
    tls: Option<PathBuf>,
    _dir: tempfile::TempDir,
}

impl Postgres {
    /// Creates and starts a cluster: user `postgres`, trust auth on loopback.
    pub fn start() -> Postgres {
        let pg = Postgres::create(false);
        pg.start_server();
        pg
    }

    /// [`Postgres::start`], speaking TLS only (`hostssl`; a plaintext connection is rejected),
    /// with a certificate for the name `localhost` (not for `127.0.0.1`) signed by a fresh CA,
    /// whose PEM file is [`Postgres::ca_file`].
    pub fn start_tls() -> Postgres {
        let pg = Postgres::create(true);
        pg.start_server();
        pg
    }

    /// The CA certificate (PEM) that signed the server's, for [`Postgres::start_tls`].
    pub fn ca_file(&self) -> &Path {
        self.tls
            .as_deref()
            .expect("a server started with start_tls")
    }

    /// A fresh CA of its own (PEM file in `dir`), which signed nothing this server holds.
    pub fn foreign_ca(dir: &Path) -> PathBuf {
        let (ca, _) = make_ca();
        let path = dir.join("foreign-ca.pem");
        std::fs::write(&path, ca.pem()).expect("write the CA");
        path
    }

    fn create(tls: bool) -> Postgres {
        let bin = bindir();
        let dir = tempfile::Builder::new()
            .prefix("testkit-pg")
            .tempdir()
            .expect("a temp dir");
        let owner = server_user();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod the temp dir");
        let data = dir.path().join("data");
        std::fs::create_dir(&data).expect("create the data dir");
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(&data, Some(uid), Some(gid)).expect("chown the data dir");
        }
        let pg = Postgres {
            bin,
            data,
            port: free_port(),
            owner,
            tls: None,
            _dir: dir,
        };
        pg.run(
            "initdb",
            &[
                "-D",
                &pg.data.display().to_string(),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
            ],
        );
        let mut pg = pg;
        if tls {
            pg.tls = Some(pg.install_certificate());
        }
        pg
    }

    /// The server's key and certificate in the data dir, TLS on, plaintext refused; the CA's
    /// PEM file beside the data dir.
    fn install_certificate(&self) -> PathBuf {
        let (ca, ca_key) = make_ca();
        let key = rcgen::KeyPair::generate().expect("a server key");
        let params =
            rcgen::CertificateParams::new(vec!["localhost".to_owned()]).expect("cert params");
        let cert = params
            .signed_by(&key, &ca, &ca_key)
            .expect("sign the server cert");
        let cert_file = self.data.join("server.crt");
        let key_file = self.data.join("server.key");
        std::fs::write(&cert_file, cert.pem()).expect("write server.crt");
        std::fs::write(&key_file, key.serialize_pem()).expect("write server.key");
        std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600))
            .expect("chmod server.key");
        if let Some((uid, gid)) = self.owner {
            for file in [&cert_file, &key_file] {
                std::os::unix::fs::chown(file, Some(uid), Some(gid)).expect("chown");
            }
        }
        std::fs::write(
            self.data.join("pg_hba.conf"),
            "hostnossl all all 0.0.0.0/0 reject\nhostnossl all all ::/0 reject\nhostssl all all 127.0.0.1/32 trust\nhostssl all all ::1/128 trust\n",
        )
        .expect("write pg_hba.conf");
        let mut conf = std::fs::OpenOptions::new()
            .append(true)
            .open(self.data.join("postgresql.conf"))
            .expect("open postgresql.conf");
        std::io::Write::write_all(&mut conf, b"ssl = on\n").expect("ssl = on");
        let ca_file = self.data.parent().expect("the temp dir").join("ca.pem");
        std::fs::write(&ca_file, ca.pem()).expect("write ca.pem");
        ca_file
    }

    /// The URL of the cluster's `postgres` database.
    pub fn url(&self) -> String {
        self.url_at("127.0.0.1")
    }

    /// [`Postgres::url`] with `host` (`localhost`, `127.0.0.1`) as the host name.
    pub fn url_at(&self, host: &str) -> String {
        format!(
            "postgres://postgres@{host}:{}/postgres?connect_timeout=3",
            self.port
        )
    }

    /// Stops the server at once (as a crash would), keeping its data.
    pub fn stop(&self) {
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data.display().to_string(),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
        );
    }

    /// Starts the stopped server again on the same port with the same data.
    pub fn start_server(&self) {
        let options = format!(
            "-c listen_addresses=127.0.0.1 -c port={} -c unix_socket_directories='' -c fsync=off -c max_connections=200",
            self.port
        );
        let log = self.data.join("server.log").display().to_string();
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data.display().to_string(),
                "-o",
                &options,
                "-l",
                &log,
                "-w",
                "start",
            ],
        );
    }

    fn run(&self, tool: &str, args: &[&str]) -> Output {
        let mut cmd = Command::new(self.bin.join(tool));
        cmd.args(args).current_dir("/");
        if let Some((uid, gid)) = self.owner {
            cmd.uid(uid).gid(gid);
        }
        let out = cmd
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.bin.join(tool).display()));
        assert!(
            out.status.success(),
            "{tool} {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let mut cmd = Command::new(self.bin.join("pg_ctl"));
        cmd.args([
            "-D",
            &self.data.display().to_string(),
            "-m",
            "immediate",
            "stop",
        ])
        .current_dir("/")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
        if let Some((uid, gid)) = self.owner {
            cmd.uid(uid).gid(gid);
        }
        let _ = cmd.status();
    }
}

/// The directory holding `initdb` and `pg_ctl`.
fn bindir() -> PathBuf {
    let has_tools = |dir: &Path| ["initdb", "pg_ctl"].iter().all(|t| dir.join(t).is_file());
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>());
    let from_pg_config = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let mut installed: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .collect();
    installed.sort();
    installed.reverse();
    on_path
        .chain(from_pg_config)
        .chain(installed)
        .find(|dir| has_tools(dir))
        .unwrap_or_else(|| {
            panic!(
                "PostgreSQL's initdb and pg_ctl were not found (PATH, pg_config --bindir, /usr/lib/postgresql/*/bin): install the `postgresql` package (.ci/run does)"
            )
        })
}

/// As root, the uid and gid of the `postgres` user the server runs as.
fn server_user() -> Option<(u32, u32)> {
    let me = Command::new("id").arg("-u").output().expect("id -u runs");
    if String::from_utf8_lossy(&me.stdout).trim() != "0" {
        return None;
    }
    let entry = Command::new("getent")
        .args(["passwd", "postgres"])
        .output()
        .expect("getent runs");
    let line = String::from_utf8_lossy(&entry.stdout).into_owned();
    let fields: Vec<&str> = line.trim().split(':').collect();
    match fields.as_slice() {
        [_, _, uid, gid, ..] => Some((
            uid.parse().expect("a numeric uid"),
            gid.parse().expect("a numeric gid"),
        )),
        _ => panic!(
            "running as root, and there is no `postgres` user to run PostgreSQL as: install the `postgresql` package (.ci/run does)"
        ),
    }
}

/// A self-signed CA: its certificate and key.
fn make_ca() -> (rcgen::Certificate, rcgen::KeyPair) {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "testkit PostgreSQL CA");
    let key = rcgen::KeyPair::generate().expect("a CA key");
    let cert = params.self_signed(&key).expect("self-sign the CA");
    (cert, key)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}
