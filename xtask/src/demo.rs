//! `cargo xtask demo`: the whole system on one machine, in one command. It starts
//! `shmastra-cloud serve` on the embedded upstream, a watcher on a copy of
//! `fixtures/demo-project`, makes an edit and shows it arrive upstream, then pushes from a
//! second clone and shows the sync event the proxy fires.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

const USER: &str = "demo";
const DEADLINE: Duration = Duration::from_secs(60);

pub fn run() -> Result<()> {
    let root = workspace_root()?;
    step("building shmastra-cloud and project-watcher");
    super::cargo(&[
        "build",
        "-q",
        "-p",
        "shmastra-cloud",
        "-p",
        "project-watcher",
        "--bins",
    ])?;
    let bin = |name: &str| root.join("target/debug").join(name);
    let scratch = tempfile::tempdir().context("creating a scratch directory")?;
    let dir = scratch.path();
    let secret = random_hex(32)?;

    step("starting `shmastra-cloud serve` on the embedded upstream");
    let upstream = dir.join("upstream");
    let events = dir.join("sync-events.log");
    let on_push = format!(
        "echo \"sync: user=$SHMASTRA_USER ref=$SHMASTRA_REF commit=$SHMASTRA_NEW_OID\" | tee -a '{}'",
        events.display()
    );
    let mut serve = Command::new(bin("shmastra-cloud"));
    serve
        .args(["serve", "--listen", "127.0.0.1:0", "--upstream-dir"])
        .arg(&upstream)
        .args(["--on-external-push", &on_push])
        .env("SHMASTRA_TOKEN_SECRET", &secret)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped());
    let mut serve = Guard::spawn(serve, "shmastra-cloud serve")?;
    let addr = serve.read_listening_line()?;
    say(&format!("proxy listening on http://{addr}/api/git"));

    let token = output(
        Command::new(bin("shmastra-cloud"))
            .args(["token", "mint", "--user", USER])
            .env("SHMASTRA_TOKEN_SECRET", &secret),
    )?;
    say(&format!("minted a PROJECT_TOKEN for user {USER:?}"));

    step("starting `project-watcher watch` on a copy of fixtures/demo-project");
    let sandbox = dir.join("sandbox");
    copy_dir(&root.join("fixtures/demo-project"), &sandbox)?;
    let remote = format!("http://{addr}/api/git/{USER}.git");
    git(&sandbox, &["init", "-q", "-b", "main"])?;
    git(&sandbox, &["remote", "add", "project", &remote])?;
    let mut watch = Command::new(bin("project-watcher"));
    watch
        .args(["watch", "--dir"])
        .arg(&sandbox)
        .args(["--debounce", "300ms", "--max-delay", "2s"])
        .env("PROJECT_TOKEN", &token)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null());
    let mut watcher = Guard::spawn(watch, "project-watcher watch")?;
    let bare = upstream.join(format!("{USER}.git"));
    let first = wait_for("the watcher's first save upstream", || {
        upstream_subject(&bare)
    })?;
    say(&format!("upstream main: {first}"));

    step("editing src/index.js in the sandbox");
    std::fs::write(
        sandbox.join("src/index.js"),
        "console.log(\"edited in the sandbox\");\n",
    )?;
    wait_for("the edit to reach the upstream", || {
        let shown = git_out(&bare, &["show", "main:src/index.js"]).ok()?;
        shown.contains("edited in the sandbox").then_some(())
    })?;
    if events.exists() {
        bail!("the watcher's own push fired a sync event");
    }
    say(&format!(
        "upstream main: {} (the watcher's pushes fire no sync event)",
        upstream_subject(&bare).unwrap_or_default()
    ));
    watcher.stop()?;

    step("pushing from a second clone, as a developer would from a laptop");
    let laptop = dir.join("laptop");
    let with_token = remote.replacen("http://", &format!("http://{USER}:{token}@"), 1);
    git(
        dir,
        &[
            "clone",
            "-q",
            &with_token,
            laptop.to_str().context("utf-8 path")?,
        ],
    )?;
    std::fs::write(laptop.join("NOTES.md"), "Pushed from a laptop.\n")?;
    git(&laptop, &["add", "NOTES.md"])?;
    git(&laptop, &["commit", "-qm", "notes from a laptop"])?;
    git(&laptop, &["push", "-q", "origin", "main"])?;
    let pushed = git_out(&laptop, &["rev-parse", "HEAD"])?;
    let event = wait_for("the external-push event", || {
        std::fs::read_to_string(&events)
            .ok()
            .filter(|e| !e.is_empty())
    })?;
    if !event.contains(&pushed) {
        bail!("the sync event names another commit than {pushed}: {event}");
    }
    say("the proxy saw an external push and ran the sync command (output above)");
    serve.stop()?;
    step("done: edit saved upstream by the watcher, external push turned into one sync event");
    Ok(())
}

/// A child process that is stopped (SIGTERM, then SIGKILL) however the demo ends.
struct Guard {
    child: Child,
    name: &'static str,
}

impl Guard {
    fn spawn(mut command: Command, name: &'static str) -> Result<Guard> {
        let child = command
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        Ok(Guard { child, name })
    }

    fn read_listening_line(&mut self) -> Result<String> {
        let stdout = self.child.stdout.take().context("serve's stdout")?;
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .with_context(|| format!("serve did not start (said {line:?})"))?
            .to_owned();
        // The sync command's output arrives on serve's stdout.
        std::thread::spawn(move || {
            for line in reader.lines().map_while(Result::ok) {
                println!("    [serve] {line}");
            }
        });
        Ok(addr)
    }

    fn stop(&mut self) -> Result<()> {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                if !status.success() {
                    bail!("{} exited with {status}", self.name);
                }
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("{} did not stop within 15 s of SIGTERM", self.name)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn step(text: &str) {
    println!("\n==> {text}");
}

fn say(text: &str) {
    println!("    {text}");
}

fn wait_for<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> Result<T> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(v) = check() {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("timed out after {DEADLINE:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn upstream_subject(bare: &Path) -> Option<String> {
    if !bare.join("HEAD").exists() {
        return None;
    }
    git_out(bare, &["log", "-1", "--format=%h %s", "main"]).ok()
}

/// git with the user's own config cut off and a fixed identity, so the demo runs the same on
/// every machine.
fn git_command(dir: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new("git");
    cmd.current_dir(dir)
        .args(args)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "Demo Developer")
        .env("GIT_AUTHOR_EMAIL", "demo@localhost")
        .env("GIT_COMMITTER_NAME", "Demo Developer")
        .env("GIT_COMMITTER_EMAIL", "demo@localhost")
        .env("GIT_TERMINAL_PROMPT", "0");
    cmd
}

fn git(dir: &Path, args: &[&str]) -> Result<()> {
    output(&mut git_command(dir, args)).map(drop)
}

fn git_out(dir: &Path, args: &[&str]) -> Result<String> {
    output(&mut git_command(dir, args))
}

fn output(command: &mut Command) -> Result<String> {
    let out = command
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("running {command:?}"))?;
    if !out.status.success() {
        bail!(
            "{:?} failed: {}",
            command.get_program(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

fn random_hex(bytes: usize) -> Result<String> {
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

fn workspace_root() -> Result<PathBuf> {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    Ok(manifest
        .parent()
        .context("xtask lives inside the workspace")?
        .to_owned())
}
