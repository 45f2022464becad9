//! The baseline is held to the behaviour issue 31 describes, on a small real repository with
//! a short settle: it saves and pushes, sets no watch in an ignored folder, writes the manifest
//! the watcher writes, skips a save during a merge or with unmerged paths, exits on a
//! `.gitignore` change and is restarted with the new exclusions, and saves on SIGTERM.

use std::fs;
use std::path::Path;
use std::time::Duration;

use testkit::wait::{PATIENCE, until, until_seen};

use super::fixture::{Fixture, Spec};
use super::git::Git;
use super::side::{Programs, Running, Side};

const SETTLE: Duration = Duration::from_millis(300);

fn fixture(root: &Path) -> Fixture {
    let home = root.join("home");
    let fx = Fixture {
        spec: Spec {
            tracked_files: 1,
            node_modules_files: 1,
        },
        project: root.join("project"),
        remote: root.join("remote.git"),
        logs: root.join("logs"),
        git: Git::new(&home),
        home,
    };
    let p = &fx.project;
    for (path, text) in [
        (".gitignore", "node_modules/\n.env\n*.log\n"),
        (".env", "OPENAI_API_KEY=sk-x\nDATABASE_URL=postgres://x\n"),
        ("src/a.ts", "v0\n"),
        ("node_modules/pkg/index.js", "module.exports = 1;\n"),
        ("node_modules/pkg/lib/deep.js", "module.exports = 2;\n"),
    ] {
        let path = p.join(path);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }
    // The baseline compares `.gitignore`'s mtime in whole seconds: make the change below one
    // whatever the test's speed.
    fs::File::options()
        .write(true)
        .open(p.join(".gitignore"))
        .unwrap()
        .set_modified(std::time::UNIX_EPOCH + Duration::from_secs(1_000_000_000))
        .unwrap();
    fs::create_dir_all(&fx.logs).unwrap();
    fs::create_dir_all(&fx.remote).unwrap();
    let git = |dir: &Path, args: &[&str]| fx.git.run(dir, args).unwrap();
    git(p, &["init", "-q", "-b", "main"]);
    git(p, &["config", "user.name", "Bench Author"]);
    git(p, &["config", "user.email", "bench@example.test"]);
    git(p, &["add", "-A"]);
    git(p, &["commit", "-q", "-m", "start"]);
    git(&fx.remote, &["init", "-q", "--bare", "-b", "main"]);
    git(
        p,
        &["remote", "add", "project", fx.remote.to_str().unwrap()],
    );
    git(p, &["push", "-q", "project", "main"]);
    fx
}

/// The remote's `main:path`, or `None` when the remote has no such file.
fn remote_file(fx: &Fixture, path: &str) -> Option<String> {
    fx.git
        .run(&fx.remote, ["show", &format!("main:{path}")])
        .ok()
}

fn wait_for_remote(fx: &Fixture, path: &str, text: &str) {
    until_seen(
        PATIENCE,
        &format!("{path} = {text:?} on the remote"),
        || match remote_file(fx, path) {
            Some(t) if t == text => Ok(()),
            other => Err(other),
        },
    );
}

fn log_count(fx: &Fixture, needle: &str) -> usize {
    fs::read_to_string(fx.logs.join("baseline-check.log"))
        .unwrap_or_default()
        .matches(needle)
        .count()
}

fn wait_for_log(fx: &Fixture, needle: &str, count: usize) {
    until(
        PATIENCE,
        &format!("{count} x {needle:?} in the log"),
        || (log_count(fx, needle) >= count).then_some(()),
    );
}

#[test]
fn the_baseline_behaves_as_the_original_watcher() {
    let root = tempfile::tempdir().unwrap();
    let fx = fixture(root.path());
    let bench = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench");
    let programs = Programs {
        baseline_script: bench.join("baseline.sh"),
        autorestart_script: bench.join("autorestart.sh"),
        watcher_binary: Default::default(),
    };
    let running = Running::start(Side::Baseline, &programs, &fx, SETTLE, "check").unwrap();
    let p = &fx.project;
    // The root and `src/`: nothing under `node_modules/` or `.git/`.
    assert_eq!(running.sample().unwrap().watches, 2);

    fs::write(p.join("src/a.ts"), "v1\n").unwrap();
    wait_for_remote(&fx, "src/a.ts", "v1\n");
    let manifest = shmastra_contract::Manifest::new(["DATABASE_URL", "OPENAI_API_KEY"]).unwrap();
    assert_eq!(
        remote_file(&fx, "shmastra.json").as_deref(),
        Some(manifest.to_json().as_str()),
        "the manifest in the watcher's canonical form"
    );

    // A merge in progress, then an unmerged path: no save until they are gone.
    let head = fx.git.run(p, ["rev-parse", "HEAD"]).unwrap();
    fs::write(p.join(".git/MERGE_HEAD"), &head).unwrap();
    fs::write(p.join("src/a.ts"), "v2\n").unwrap();
    wait_for_log(&fx, "skipping the save", 1);
    fs::remove_file(p.join(".git/MERGE_HEAD")).unwrap();
    let blob = fx
        .git
        .run_with(
            fx.git.command(p).args(["hash-object", "-w", "--stdin"]),
            Some(b"side\n"),
        )
        .unwrap();
    let entries = format!(
        "100644 {0} 2\tsrc/c.ts\n100644 {0} 3\tsrc/c.ts\n",
        blob.trim()
    );
    fx.git
        .run_with(
            fx.git.command(p).args(["update-index", "--index-info"]),
            Some(entries.as_bytes()),
        )
        .unwrap();
    fs::write(p.join("src/a.ts"), "v3\n").unwrap();
    wait_for_log(&fx, "skipping the save", 2);
    assert_eq!(remote_file(&fx, "src/a.ts").as_deref(), Some("v1\n"));
    fx.git
        .run(p, ["update-index", "--force-remove", "src/c.ts"])
        .unwrap();
    fs::write(p.join("src/a.ts"), "v4\n").unwrap();
    wait_for_remote(&fx, "src/a.ts", "v4\n");

    // A new ignored folder: the baseline exits after its next save (this one, or the one of
    // v4 if it had not yet looked at `.gitignore`'s mtime), and its restart does not watch the
    // folder (the old run's inotifywait would have added a watch for it). An edit made while
    // it restarts would wake nothing, so the next one waits for its watches.
    fs::create_dir_all(p.join("build/out")).unwrap();
    fs::write(p.join(".gitignore"), "node_modules/\n.env\n*.log\nbuild/\n").unwrap();
    wait_for_log(&fx, "starting it again", 1);
    wait_for_log(&fx, "Watches established.", 2);
    fs::write(p.join("src/a.ts"), "v5\n").unwrap();
    wait_for_remote(&fx, "src/a.ts", "v5\n");
    assert_eq!(
        remote_file(&fx, ".gitignore").as_deref(),
        Some("node_modules/\n.env\n*.log\nbuild/\n")
    );
    until_seen(
        PATIENCE,
        "the root and src/ watched, once",
        || match running.sample().unwrap().watches {
            2 => Ok(()),
            n => Err(n),
        },
    );

    // SIGTERM: the last edit is saved before it exits.
    fs::write(p.join("src/a.ts"), "v6\n").unwrap();
    running.stop().unwrap();
    assert_eq!(remote_file(&fx, "src/a.ts").as_deref(), Some("v6\n"));
    assert_eq!(log_count(&fx, "starting it again"), 1);
}
