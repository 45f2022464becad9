//! `project-watcher status`: finds the status file under `.git/`, prints it for people and as
//! JSON, and says clearly when there is none.

use std::process::Command;

use testkit::git::{hermetic_env, init_repo};

const BIN: &str = env!("CARGO_BIN_EXE_project-watcher");

fn status(dir: &std::path::Path, home: &std::path::Path, json: bool) -> std::process::Output {
    status_with(dir, home, json, &[])
}

fn status_with(
    dir: &std::path::Path,
    home: &std::path::Path,
    json: bool,
    envs: &[(&str, &str)],
) -> std::process::Output {
    let mut cmd = Command::new(BIN);
    cmd.arg("status").arg("--dir").arg(dir);
    if json {
        cmd.arg("--json");
    }
    for (k, v) in hermetic_env(home) {
        cmd.env(k, v);
    }
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// Holds the instance lock as a running watcher does.
fn pretend_running(repo: &std::path::Path) -> project_watcher::lock::InstanceLock {
    project_watcher::lock::InstanceLock::try_acquire(&repo.join(".git")).unwrap()
}

#[test]
fn status_reads_the_file_under_dot_git_and_prints_both_forms() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("p");
    init_repo(&repo);
    let _running = pretend_running(&repo);
    let written = project_watcher::status::Status {
        state: project_watcher::status::State::Backoff,
        unpushed_commits: 4,
        last_push_error: Some("server answered 500".into()),
        ..Default::default()
    };
    project_watcher::status::write(&repo.join(".git"), &written).unwrap();

    let out = status(&repo, tmp.path(), true);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let read: project_watcher::status::Status = serde_json::from_slice(&out.stdout).unwrap();
    // The running watcher's figures are read when asked (here the pid is this test's).
    assert!(read.rss_bytes.is_some_and(|b| b > 0), "{read:?}");
    assert!(
        read.cpu_ms.is_some() && read.disk_free_bytes.is_some(),
        "{read:?}"
    );
    let live = project_watcher::status::Status {
        rss_bytes: None,
        cpu_ms: None,
        disk_free_bytes: None,
        disk_total_bytes: None,
        disk_warning: None,
        ..read
    };
    assert_eq!(live, written);

    let out = status(&repo, tmp.path(), false);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("state:            backoff"), "{text}");
    assert!(text.contains("unpushed commits: 4"), "{text}");
}

#[test]
fn status_without_a_watcher_or_a_file_says_so_and_exits_3() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("p");
    init_repo(&repo);
    let out = status(&repo, tmp.path(), false);
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no watcher is running"), "{err}");
    assert!(err.contains("none has run on it"), "{err}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("state:            stopped (no watcher has run on this project)\n"),
        "{text}"
    );
    assert!(text.contains("branch:           main"), "{text}");

    // Machines get the same answer as JSON on stdout, with the repository's head.
    let out = status(&repo, tmp.path(), true);
    assert_eq!(out.status.code(), Some(3));
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["head"], serde_json::Value::Null, "{shown}");
    std::fs::write(repo.join("a.txt"), "a\n").unwrap();
    testkit::git::git(&repo, ["add", "-A"]);
    testkit::git::git(&repo, ["commit", "-q", "-m", "first"]);
    let head = testkit::git::git(&repo, ["rev-parse", "HEAD"]);
    let out = status(&repo, tmp.path(), true);
    assert_eq!(out.status.code(), Some(3));
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["running"], false, "{shown}");
    assert_eq!(shown["state"], "stopped", "{shown}");
    assert_eq!(shown["head"], head.trim(), "{shown}");
    assert_eq!(shown["branch"], "main", "{shown}");
    assert_eq!(shown["pid"], 0, "{shown}");
    // Asking did not make the watcher's state folder.
    assert!(!repo.join(".git/project-watcher/status.json").exists());
}

#[test]
fn a_running_watcher_without_a_file_yet_is_a_runtime_error() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("p");
    init_repo(&repo);
    let _running = pretend_running(&repo);
    let out = status(&repo, tmp.path(), false);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(".git/project-watcher/status.json"), "{err}");
}

#[test]
fn a_stopped_watcher_s_last_status_is_shown_as_stopped_with_exit_3() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("p");
    init_repo(&repo);
    let left = project_watcher::status::Status {
        state: project_watcher::status::State::Idle,
        pid: 4_000_000,
        ..Default::default()
    };
    project_watcher::status::write(&repo.join(".git"), &left).unwrap();
    // A watcher that ran and stopped leaves its lock file behind, unlocked.
    drop(pretend_running(&repo));

    let out = status(&repo, tmp.path(), false);
    assert_eq!(out.status.code(), Some(3));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("state:            stopped"), "{text}");
    assert!(!text.contains("state:            idle"), "{text}");
    assert!(text.contains("not running (was pid 4000000"), "{text}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no watcher is running"), "{err}");

    let out = status(&repo, tmp.path(), true);
    assert_eq!(out.status.code(), Some(3));
    let read: project_watcher::status::Status = serde_json::from_slice(&out.stdout).unwrap();
    let stopped = project_watcher::status::Status {
        running: false,
        state: project_watcher::status::State::Stopped,
        // No commit yet: `HEAD` names the unborn `main`, as `git status` says.
        branch: Some("main".into()),
        ..left
    };
    assert_eq!(read, stopped);
}

#[test]
fn status_shows_the_watchers_memory_cpu_and_free_disk_and_warns_before_it_is_full() {
    use project_watcher::resources::MIN_FREE_DISK_ENV;
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("p");
    init_repo(&repo);
    let log = tmp.path().join("watcher.log");
    let mut cmd = Command::new(BIN);
    cmd.args(["watch", "--no-push", "--log-format", "json", "--dir"])
        .arg(&repo)
        .env(MIN_FREE_DISK_ENV, "1048576GiB")
        .stderr(std::fs::File::create(&log).unwrap());
    for (k, v) in hermetic_env(tmp.path()) {
        cmd.env(k, v);
    }
    let mut watcher = cmd.spawn().unwrap();
    let pid = watcher.id();
    let written = testkit::wait::until(testkit::wait::PATIENCE, "the watcher's status", || {
        project_watcher::status::read(&repo.join(".git"))
            .ok()
            .filter(|s| s.pid == pid)
    });
    // The status file the watcher wrote: its own figures, and the warning (1 PiB is more than
    // any disk here has free).
    assert!(
        written.rss_bytes.is_some_and(|b| b > 1024 * 1024),
        "{written:?}"
    );
    assert!(written.cpu_ms.is_some(), "{written:?}");
    let (free, total) = (
        written.disk_free_bytes.unwrap(),
        written.disk_total_bytes.unwrap(),
    );
    assert!(free > 0 && free <= total, "{written:?}");
    let warning = written.disk_warning.clone().unwrap();
    assert!(
        warning.contains("nearly full") && warning.contains("warning below 1.0 PiB"),
        "{warning}"
    );
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged
            .lines()
            .any(|l| l.contains("\"WARN\"") && l.contains("nearly full")),
        "{logged}"
    );

    // `status` reads the figures of now, with the same threshold.
    let out = status_with(
        &repo,
        tmp.path(),
        true,
        &[(MIN_FREE_DISK_ENV, "1048576GiB")],
    );
    assert!(out.status.success());
    let read: project_watcher::status::Status = serde_json::from_slice(&out.stdout).unwrap();
    assert!(read.disk_warning.is_some(), "{read:?}");
    assert!(read.rss_bytes.is_some_and(|b| b > 1024 * 1024), "{read:?}");
    let out = status_with(
        &repo,
        tmp.path(),
        false,
        &[(MIN_FREE_DISK_ENV, "1048576GiB")],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("memory, CPU:      "), "{text}");
    assert!(text.contains(" resident, "), "{text}");
    assert!(text.contains("disk:             "), "{text}");
    assert!(
        text.contains("disk warning:     the project's file system is nearly full"),
        "{text}"
    );
    // Below a 1-byte threshold nothing is low.
    let out = status_with(&repo, tmp.path(), true, &[(MIN_FREE_DISK_ENV, "1")]);
    let read: project_watcher::status::Status = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(read.disk_warning, None, "{read:?}");
    assert!(read.disk_free_bytes.is_some_and(|f| f > 0), "{read:?}");

    Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(watcher.wait().unwrap().success());
}

/// Resident and total KiB of a process's mappings of its own executable's code (`r-xp`).
fn executable_code_kib(pid: u32) -> (u64, u64) {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    let exe = exe.to_string_lossy().into_owned();
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let (mut ours, mut resident, mut size) = (false, 0, 0);
    for line in smaps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            [range, perms, _, _, _, path, ..] if range.contains('-') => {
                ours = *path == exe && *perms == "r-xp";
            }
            ["Rss:", kib, ..] if ours => resident += kib.parse::<u64>().unwrap(),
            ["Size:", kib, ..] if ours => size += kib.parse::<u64>().unwrap(),
            _ => {}
        }
    }
    (resident, size)
}

#[test]
fn a_quiet_watcher_hands_back_the_code_it_ran_at_start() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("p");
    init_repo(&repo);
    for i in 0..50 {
        std::fs::create_dir_all(repo.join(format!("src/d{i}"))).unwrap();
        std::fs::write(repo.join(format!("src/d{i}/f.ts")), format!("{i}\n")).unwrap();
    }
    let mut cmd = Command::new(BIN);
    cmd.args(["watch", "--no-push", "--log-format", "json", "--dir"])
        .arg(&repo)
        .stderr(std::process::Stdio::null());
    for (k, v) in hermetic_env(tmp.path()) {
        cmd.env(k, v);
    }
    let mut watcher = cmd.spawn().unwrap();
    let pid = watcher.id();
    testkit::wait::until(testkit::wait::PATIENCE, "the watcher's status", || {
        project_watcher::status::read(&repo.join(".git"))
            .ok()
            .filter(|s| s.pid == pid)
    });
    // Start-up ran much of the binary (the command line, the logger, the walk, the first
    // save): most of its code pages (five in six, here). Once quiet, less than half of them
    // stay mapped.
    let quiet = testkit::wait::until_seen(
        testkit::wait::PATIENCE,
        "the start-up's code pages handed back",
        || {
            let (resident, size) = executable_code_kib(pid);
            if resident * 2 < size {
                Ok((resident, size))
            } else {
                Err((resident, size))
            }
        },
    );
    // And it still works: an edit is saved (the code it needs comes back as it runs).
    std::fs::write(repo.join("src/d0/f.ts"), "edited\n").unwrap();
    testkit::wait::until(testkit::wait::PATIENCE, "the edit saved", || {
        testkit::git::git_output(&repo, ["show", "HEAD:src/d0/f.ts"])
            .stdout
            .starts_with(b"edited")
            .then_some(())
    });
    watcher.kill().unwrap();
    watcher.wait().unwrap();
    eprintln!("resident code when quiet: {quiet:?} KiB");
}

/// Resident and total KiB of a process's mappings of pack files (`.pack`, `.idx`).
fn pack_kib(pid: u32) -> (u64, u64) {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let (mut ours, mut resident, mut size) = (false, 0, 0);
    for line in smaps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            [range, _, _, _, _, path, ..] if range.contains('-') => {
                ours = path.contains("/objects/pack/pack-");
            }
            [range, ..] if range.contains('-') => ours = false,
            ["Rss:", kib, ..] if ours => resident += kib.parse::<u64>().unwrap(),
            ["Size:", kib, ..] if ours => size += kib.parse::<u64>().unwrap(),
            _ => {}
        }
    }
    (resident, size)
}

#[test]
fn a_quiet_watcher_hands_back_the_pack_pages_its_save_read() {
    // On the build's disk, not in a temporary file system: pages of a file in memory (tmpfs)
    // cannot be paged out without swap.
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let repo = tmp.path().join("p");
    init_repo(&repo);
    for i in 0..200 {
        std::fs::create_dir_all(repo.join(format!("src/d{}/e{i}", i % 20))).unwrap();
        std::fs::write(
            repo.join(format!("src/d{}/e{i}/f.ts", i % 20)),
            format!("export const n = {i};\n").repeat(40),
        )
        .unwrap();
    }
    testkit::git::git(&repo, ["add", "-A"]);
    testkit::git::git(&repo, ["commit", "-q", "-m", "init"]);
    // As a restored project arrives: every object in one pack.
    testkit::git::git(&repo, ["gc", "-q"]);
    let mut cmd = Command::new(BIN);
    cmd.args(["watch", "--no-push", "--log-format", "json", "--dir"])
        .arg(&repo)
        .args(["--debounce", "100ms"])
        .stderr(std::process::Stdio::null());
    for (k, v) in hermetic_env(tmp.path()) {
        cmd.env(k, v);
    }
    let mut watcher = cmd.spawn().unwrap();
    let pid = watcher.id();
    testkit::wait::until(testkit::wait::PATIENCE, "the watcher's status", || {
        project_watcher::status::read(&repo.join(".git"))
            .ok()
            .filter(|s| s.pid == pid)
    });
    // The save reads the trees on the edited path, and the pack index, from the pack.
    std::fs::write(repo.join("src/d3/e3/f.ts"), "edited\n").unwrap();
    testkit::wait::until(testkit::wait::PATIENCE, "the edit saved", || {
        testkit::git::git_output(&repo, ["show", "HEAD:src/d3/e3/f.ts"])
            .stdout
            .starts_with(b"edited")
            .then_some(())
    });
    let quiet = testkit::wait::until_seen(
        testkit::wait::PATIENCE,
        "the pack pages handed back",
        || {
            let (resident, size) = pack_kib(pid);
            if size > 0 && resident == 0 {
                Ok((resident, size))
            } else {
                Err((resident, size))
            }
        },
    );
    // And the next save reads them again.
    std::fs::write(repo.join("src/d7/e7/f.ts"), "edited again\n").unwrap();
    testkit::wait::until(testkit::wait::PATIENCE, "the second edit saved", || {
        testkit::git::git_output(&repo, ["show", "HEAD:src/d7/e7/f.ts"])
            .stdout
            .starts_with(b"edited again")
            .then_some(())
    });
    watcher.kill().unwrap();
    watcher.wait().unwrap();
    eprintln!("pack pages when quiet: {quiet:?} KiB");
}
