//! The watcher under real PM2 (a pinned version from npm, its own `PM2_HOME`), run by
//! `pm2/ecosystem.config.js` exactly as the sandbox template runs it: an edit is pushed;
//! `pm2 stop` flushes a pending edit; `kill -9` is restarted and the edit made meanwhile is
//! saved; `pm2 delete` + `pm2 kill` leave no process behind.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use testkit::git::{git, git_output, hermetic_env, init_bare, init_repo};
use testkit::pm2::pm2_bin;
use testkit::wait::until;

/// Generous: npm, node and other helpers' builds share the machine.
const PATIENCE: Duration = Duration::from_secs(90);

/// A PM2 daemon of our own. Dropping it (also while a failed assert unwinds) runs `pm2 kill`.
struct Pm2 {
    bin: PathBuf,
    env: Vec<(String, String)>,
    home: PathBuf,
}

impl Pm2 {
    fn run(&self, args: &[&str], extra_env: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new(&self.bin);
        cmd.args(args).env_clear();
        for key in ["PATH", "LANG"] {
            if let Ok(v) = std::env::var(key) {
                cmd.env(key, v);
            }
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)))
            .envs(extra_env.iter().copied());
        cmd.output().expect("pm2 runs")
    }

    fn ok(&self, args: &[&str], extra_env: &[(&str, &str)]) -> String {
        let out = self.run(args, extra_env);
        assert!(
            out.status.success(),
            "pm2 {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The app's pid and restart count from `pm2 jlist`; pid 0 when it is not running.
    fn app(&self, name: &str) -> Option<(u32, u64, String)> {
        let list: serde_json::Value = serde_json::from_str(&self.ok(&["jlist"], &[])).ok()?;
        let app = list.as_array()?.iter().find(|a| a["name"] == name)?;
        Some((
            app["pid"].as_u64().unwrap_or(0) as u32,
            app["pm2_env"]["restart_time"].as_u64().unwrap_or(0),
            app["pm2_env"]["status"].as_str().unwrap_or("").to_owned(),
        ))
    }

    fn daemon_pid(&self) -> Option<u32> {
        fs::read_to_string(self.home.join("pm2.pid"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    }
}

impl Drop for Pm2 {
    fn drop(&mut self) {
        let _ = self.run(&["kill"], &[]);
    }
}

fn alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        // A zombie (state Z) has exited already.
        .is_ok_and(|stat| {
            stat.rsplit_once(") ")
                .is_some_and(|(_, rest)| !rest.starts_with('Z'))
        })
}

fn remote_has(remote: &Path, path: &str) -> bool {
    git_output(remote, ["cat-file", "-e", &format!("main:{path}")])
        .status
        .success()
}

/// The watcher wrote its status file with this pid: it scanned, saved, and is watching.
fn wait_ready(project: &Path, pid: u32) {
    until(PATIENCE, "the watcher to report ready", || {
        project_watcher::status::read(&project.join(".git"))
            .ok()
            .filter(|s| s.pid == pid)
            .map(|_| ())
    });
}

fn wait_online(pm2: &Pm2, min_restarts: u64, not_pid: u32) -> u32 {
    until(PATIENCE, "PM2 to run the watcher", || {
        pm2.app("project-watcher")
            .filter(|(pid, restarts, status)| {
                *pid != 0 && *pid != not_pid && *restarts >= min_restarts && status == "online"
            })
            .map(|(pid, ..)| pid)
    })
}

#[test]
fn pm2_runs_the_watcher_flushes_on_stop_and_restarts_it_after_kill_9() {
    let pm2_bin = pm2_bin();
    let watcher_bin = testkit::cargo_bin::project_watcher();
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let project = home.join("shmastra");
    let remote = tmp.path().join("remote.git");
    let pm2_home = tmp.path().join("pm2-home");
    init_bare(&remote);
    init_repo(&project);
    // The template project ignores its PM2 logs, as the original's does.
    fs::write(project.join(".gitignore"), "node_modules/\n.logs/\n").unwrap();
    fs::write(project.join("index.ts"), "start\n").unwrap();
    git(&project, ["add", "-A"]);
    git(&project, ["commit", "-qm", "template"]);
    git(
        &project,
        ["remote", "add", "project", remote.to_str().unwrap()],
    );
    git(&project, ["push", "-q", "project", "main"]);
    // What cloud-core's provision writes.
    fs::create_dir_all(home.join(".project-watcher")).unwrap();
    fs::write(
        home.join(".project-watcher/.env"),
        format!(
            "PROJECT_DIR={}\nPROJECT_REMOTE=project\nPROJECT_BRANCH=main\nPROJECT_TOKEN=v1.test-token\n",
            project.display()
        ),
    )
    .unwrap();
    let ecosystem = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../pm2/ecosystem.config.js")
        .canonicalize()
        .unwrap();
    let ecosystem = ecosystem.to_str().unwrap();

    let mut env: Vec<(String, String)> = hermetic_env(&home)
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.display().to_string()))
        .collect();
    env.extend([
        ("PM2_HOME".to_owned(), pm2_home.display().to_string()),
        (
            "PROJECT_WATCHER_BIN".to_owned(),
            watcher_bin.display().to_string(),
        ),
        ("SHMASTRA_CMD".to_owned(), "exec sleep 3600".to_owned()),
        ("HEALER_CMD".to_owned(), "exec sleep 3600".to_owned()),
        ("RUST_LOG".to_owned(), "info".to_owned()),
    ]);
    let pm2 = Pm2 {
        bin: pm2_bin,
        env,
        home: pm2_home.clone(),
    };
    let quick = [("WATCHER_DEBOUNCE", "300ms"), ("WATCHER_MAX_DELAY", "2s")];

    // 1. The ecosystem starts the template's three apps; an edit reaches the remote.
    pm2.ok(&["start", ecosystem], &quick);
    let pid = wait_online(&pm2, 0, 0);
    wait_ready(&project, pid);
    let [dev_pid, healer_pid] = ["shmastra", "healer"].map(|name| {
        until(PATIENCE, name, || {
            pm2.app(name).map(|(pid, ..)| pid).filter(|p| *p != 0)
        })
    });
    fs::write(project.join("first.ts"), "pushed by the watcher\n").unwrap();
    until(PATIENCE, "the first edit on the remote", || {
        remote_has(&remote, "first.ts").then_some(())
    });

    // 2. `pm2 stop` (SIGINT) with an edit still inside a long debounce: flushed on the way out.
    pm2.ok(&["delete", "project-watcher"], &[]);
    let slow = [("WATCHER_DEBOUNCE", "10m"), ("WATCHER_MAX_DELAY", "20m")];
    pm2.ok(&["start", ecosystem, "--only", "project-watcher"], &slow);
    let pid = wait_online(&pm2, 0, pid);
    wait_ready(&project, pid);
    fs::write(project.join("pending.ts"), "saved at shutdown\n").unwrap();
    // Seen and still pending: only the shutdown path can save and push it now.
    until(PATIENCE, "the edit to be pending", || {
        project_watcher::status::read(&project.join(".git"))
            .ok()
            .filter(|s| s.pid == pid && s.state == project_watcher::status::State::Pending)
    });
    assert!(!remote_has(&remote, "pending.ts"), "pushed before the stop");
    pm2.ok(&["stop", "project-watcher"], &[]);
    assert!(
        !alive(pid),
        "pm2 stop returned while the watcher still runs"
    );
    assert!(
        remote_has(&remote, "pending.ts"),
        "the pending edit was not pushed before the watcher exited"
    );

    // 3. kill -9: PM2 restarts the watcher, which saves the edit made while it was down.
    pm2.ok(&["delete", "project-watcher"], &[]);
    pm2.ok(&["start", ecosystem, "--only", "project-watcher"], &quick);
    let pid = wait_online(&pm2, 0, pid);
    wait_ready(&project, pid);
    let killed = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    fs::write(
        project.join("while-down.ts"),
        "made while the watcher was dead\n",
    )
    .unwrap();
    let restarted = wait_online(&pm2, 1, pid);
    wait_ready(&project, restarted);
    until(PATIENCE, "the edit made while down on the remote", || {
        remote_has(&remote, "while-down.ts").then_some(())
    });

    // Every app logs into the project's `.logs/`, as the original template's did (the
    // watcher's JSON lines on stderr); the watcher never saves them.
    let log =
        fs::read_to_string(project.join(".logs/project-watcher-error.log")).unwrap_or_default();
    assert!(log.contains("\"ready\""), "watcher log:\n{log}");
    assert!(project.join(".logs/shmastra-out.log").exists());
    assert!(project.join(".logs/healer-out.log").exists());
    let tracked = git_output(&remote, ["ls-tree", "-r", "--name-only", "main"]);
    let tracked = String::from_utf8_lossy(&tracked.stdout).into_owned();
    assert!(!tracked.contains(".logs"), "{tracked}");

    // 4. Cleanup leaves nothing running.
    let daemon = pm2.daemon_pid().expect("the PM2 daemon's pid file");
    pm2.ok(&["delete", "all"], &[]);
    pm2.ok(&["kill"], &[]);
    until(PATIENCE, "every process to be gone", || {
        (!alive(restarted) && !alive(dev_pid) && !alive(healer_pid) && !alive(daemon)).then_some(())
    });
}

/// `SandboxLayout::shmastra()`'s own PM2 commands, pointed at this checkout's ecosystem file.
fn shmastra_layout(ecosystem: &str, watcher: &Path) -> cloud_core::SandboxLayout {
    let mut layout = cloud_core::SandboxLayout::shmastra();
    let here = |cmd: &str| cmd.replace("\"$HOME/ecosystem.config.js\"", ecosystem);
    layout.start_watcher = here(&layout.start_watcher);
    layout.start_dev_server = here(&layout.start_dev_server);
    layout.watcher_bin = watcher.display().to_string();
    layout
}

#[tokio::test]
async fn provision_drives_pm2_once_and_restarts_the_watcher_with_a_new_token() {
    use cloud_core::EmbeddedUpstream;
    use cloud_core::LocalSandbox;
    use cloud_core::Sandbox;
    use cloud_core::TokenSigner;
    use cloud_core::UserId;
    use cloud_core::{Orchestrator, Persistence};

    let pm2_bin = pm2_bin();
    let watcher_bin = testkit::cargo_bin::project_watcher();
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let repos = tmp.path().join("repos");
    let pm2_home = tmp.path().join("pm2-home");
    init_bare(&repos.join("alice.git"));
    fs::create_dir_all(home.join("shmastra")).unwrap();
    fs::write(home.join("shmastra/index.ts"), "work\n").unwrap();
    let ecosystem = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../pm2/ecosystem.config.js")
        .canonicalize()
        .unwrap();
    // Both installed on PATH, as in the sandbox template.
    let path = format!(
        "{}:{}:{}",
        pm2_bin.parent().unwrap().display(),
        watcher_bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut sandbox = LocalSandbox::new("sbx", &home)
        .with_env("PATH", path)
        .with_env("PM2_HOME", pm2_home.display().to_string())
        .with_env("SHMASTRA_CMD", "exec sleep 3600")
        .with_env("HEALER_CMD", "exec sleep 3600");
    let mut env: Vec<(String, String)> = Vec::new();
    for (name, value) in hermetic_env(&home) {
        env.push((name.to_owned(), value.display().to_string()));
        if name != "HOME" {
            sandbox = sandbox.with_env(name, value.display().to_string());
        }
    }
    env.push(("PM2_HOME".to_owned(), pm2_home.display().to_string()));
    let pm2 = Pm2 {
        bin: pm2_bin,
        env,
        home: pm2_home.clone(),
    };
    let orchestrator = |secret: u8| {
        Orchestrator::new(
            Some(Persistence {
                host: EmbeddedUpstream::new(&repos).unwrap(),
                signer: TokenSigner::new(&[secret; 32]).unwrap(),
                git_url: repos.display().to_string(),
            }),
            shmastra_layout(ecosystem.to_str().unwrap(), &watcher_bin),
        )
    };
    let alice = UserId::parse("alice").unwrap();
    let token_in_pm2 = || {
        let list: serde_json::Value = serde_json::from_str(&pm2.ok(&["jlist"], &[])).unwrap();
        list.as_array()?
            .iter()
            .find(|a| a["name"] == "project-watcher")?["pm2_env"]["PROJECT_TOKEN"]
            .as_str()
            .map(str::to_owned)
    };

    let first = orchestrator(1).provision(&sandbox, &alice).await.unwrap();
    assert!(first.watcher_started);
    let pid = wait_online(&pm2, 0, 0);
    wait_ready(&home.join("shmastra"), pid);
    let token_a = TokenSigner::new(&[1; 32]).unwrap().mint(&alice);
    assert_eq!(token_in_pm2().as_deref(), Some(token_a.as_str()));
    until(PATIENCE, "the existing work on the remote", || {
        remote_has(&repos.join("alice.git"), "index.ts").then_some(())
    });

    // The layout's dev-server commands drive the template's two apps, and leave the watcher.
    let layout = shmastra_layout(ecosystem.to_str().unwrap(), &watcher_bin);
    for (command, wanted) in [
        (&layout.start_dev_server, "online"),
        (&layout.stop_dev_server, "stopped"),
        (&layout.start_dev_server, "online"),
    ] {
        let exec = cloud_core::Exec::new(command.clone(), PATIENCE).cwd(home.join("shmastra"));
        let out = sandbox.exec(&exec).await.unwrap();
        assert!(out.success(), "{command}: {out:?}");
        for app in ["shmastra", "healer"] {
            until(PATIENCE, &format!("{app} to be {wanted}"), || {
                pm2.app(app).filter(|(_, _, status)| status == wanted)
            });
        }
    }
    assert_eq!(pm2.app("project-watcher").map(|a| a.0), Some(pid));

    let again = orchestrator(1).provision(&sandbox, &alice).await.unwrap();
    assert!(!again.changed_anything(), "{again:?}");
    assert_eq!(pm2.app("project-watcher").map(|a| a.0), Some(pid));

    // A new signing secret: the env file changes and PM2 restarts the watcher with it.
    let rotated = orchestrator(2).provision(&sandbox, &alice).await.unwrap();
    assert!(rotated.env_written && rotated.watcher_started);
    let new_pid = wait_online(&pm2, 0, pid);
    wait_ready(&home.join("shmastra"), new_pid);
    let token_b = TokenSigner::new(&[2; 32]).unwrap().mint(&alice);
    assert_eq!(token_in_pm2().as_deref(), Some(token_b.as_str()));

    let daemon = pm2.daemon_pid().expect("the PM2 daemon's pid file");
    pm2.ok(&["kill"], &[]);
    until(PATIENCE, "PM2 and the watcher to be gone", || {
        (!alive(new_pid) && !alive(daemon)).then_some(())
    });
}
