//! A real PostgreSQL server for tests: `initdb` and `pg_ctl` from the system's binaries into a
//! temp dir, listening on a free loopback port, stopped (immediately) on drop.
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
    _dir: tempfile::TempDir,
}

impl Postgres {
    /// Creates and starts a cluster: user `postgres`, trust auth on loopback.
    pub fn start() -> Postgres {
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
        pg.start_server();
        pg
    }

    /// The URL of the cluster's `postgres` database.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres?connect_timeout=3",
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

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}
