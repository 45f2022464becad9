//! Reliability: hostile working trees and state files. Each case builds something awkward
//! in a fresh project, runs the real watcher, and checks that `HEAD` holds exactly what
//! `git add -A` would commit (minus the documented leave-outs) and that the watcher still
//! stops cleanly.

mod support;

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use project_watcher::status::State;
use support::{PATIENCE, Project, is_root, report, skip};
use testkit::git::{git, init_repo};

fn write_bytes_name(project: &Project, name: &[u8], body: &str) {
    fs::write(project.work.join(OsStr::from_bytes(name)), body).unwrap();
}

fn mkfifo(path: &Path) {
    assert!(Command::new("mkfifo").arg(path).status().unwrap().success());
}

/// Sets a file's modification time `secs` seconds into the past.
fn age(path: &Path, secs: u64) {
    let ok = Command::new("touch")
        .arg("-d")
        .arg(format!("{secs} seconds ago"))
        .arg(path)
        .status()
        .unwrap();
    assert!(ok.success());
}

type Setup = fn(&Project);

/// One case: build the tree, run the watcher, `HEAD` must equal `git add -A` minus `except`.
fn check(name: &str, setup: Setup, except: &[&str]) -> Result<(), String> {
    let run = || {
        let tmp = tempfile::tempdir().unwrap();
        let project = Project::local(tmp.path());
        project.write("plain.txt", "an ordinary file beside the hostile ones\n");
        setup(&project);
        let watcher = project.start(&["--no-push"], &[]);
        project.wait_committed(except, PATIENCE);
        let (exit, logs) = watcher.stop();
        assert_eq!(exit.code(), Some(0), "{logs}");
        let head = git(&project.work, ["ls-tree", "-r", "--name-only", "HEAD"]);
        assert!(head.contains("plain.txt"), "{head}");
    };
    std::panic::catch_unwind(run).map_err(|e| {
        let message = e
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        format!("{name}: {message}")
    })
}

#[test]
fn hostile_trees_are_saved_exactly_as_git_add_all_would() {
    let cases: &[(&str, Setup, &[&str])] = &[
        (
            "newline in a name",
            |p| p.write("line\nbreak.txt", "x\n"),
            &[],
        ),
        (
            "control characters",
            |p| p.write("\x01\x1b[31mred\x7f\t.txt", "x\n"),
            &[],
        ),
        (
            "invalid UTF-8",
            |p| write_bytes_name(p, b"bad-\xff\xfe.txt", "x\n"),
            &[],
        ),
        (
            "255-byte name",
            |p| p.write(&format!("{}.txt", "n".repeat(251)), "x\n"),
            &[],
        ),
        (
            "200 levels deep",
            |p| p.write(&format!("{}leaf.txt", "d/".repeat(200)), "deep\n"),
            &[],
        ),
        (
            "symlink to itself",
            |p| symlink("loop", p.path("loop")).unwrap(),
            &[],
        ),
        (
            "symlink cycle",
            |p| {
                symlink("b", p.path("a")).unwrap();
                symlink("a", p.path("b")).unwrap();
            },
            &[],
        ),
        (
            "links out of the project",
            |p| {
                symlink("/etc", p.path("etc")).unwrap();
                symlink("/etc/hostname", p.path("hostname")).unwrap();
                symlink("../../..", p.path("up")).unwrap();
            },
            &[],
        ),
        ("fifo", |p| mkfifo(&p.path("pipe")), &[]),
        (
            "socket",
            |p| {
                std::mem::forget(std::os::unix::net::UnixListener::bind(p.path("sock")).unwrap());
            },
            &[],
        ),
        (
            "nested repository with a commit",
            |p| {
                let nested = p.path("vendor/lib");
                init_repo(&nested);
                fs::write(nested.join("lib.rs"), "pub fn f() {}\n").unwrap();
                git(&nested, ["add", "-A"]);
                git(&nested, ["commit", "-q", "-m", "nested"]);
            },
            &[],
        ),
        // `git add -A` refuses the whole add here; the watcher leaves only it out.
        (
            "nested repository without a commit",
            |p| {
                init_repo(&p.path("scratch"));
                p.write("scratch/file.txt", "x\n");
            },
            &["scratch"],
        ),
        (
            "100k-line .gitignore",
            |p| {
                let mut rules = String::new();
                for i in 0..100_000 {
                    rules.push_str(&format!("ignored-{i}.txt\nbuild-{i}/\n!keep-{i}.log\n"));
                }
                p.write(".gitignore", rules);
                p.write("ignored-77.txt", "ignored\n");
                p.write("build-5/out.o", "ignored\n");
                p.write("kept.txt", "kept\n");
            },
            &[],
        ),
        (
            "malformed .env",
            |p| {
                p.write(".env", "GOOD=1\nthis line is bad\n=novalue\nBAD KEY=2\nQUOTE='unclosed\nALSO_GOOD=\"x\"\n");
            },
            &[],
        ),
        (
            "corrupt shmastra.json",
            |p| p.write("shmastra.json", "{\"version\": 9, \x00garbage"),
            &[],
        ),
        (
            "corrupt status and lock files",
            |p| {
                let state = p.git_dir().join("project-watcher");
                fs::create_dir_all(&state).unwrap();
                for file in ["status.json", "instance.lock", "repo.lock", "saving"] {
                    fs::write(state.join(file), b"\xff\x00{garbage").unwrap();
                }
            },
            &[],
        ),
        (
            "stale index.lock",
            |p| {
                let lock = p.git_dir().join("index.lock");
                fs::write(&lock, b"half an index").unwrap();
                age(&lock, 120);
            },
            &[],
        ),
        (
            "stale branch lock",
            |p| {
                let lock = p.git_dir().join("refs/heads/main.lock");
                fs::write(&lock, b"0000\n").unwrap();
                age(&lock, 120);
            },
            &[],
        ),
    ];
    let started = Instant::now();
    let failures: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = cases
            .chunks(5)
            .map(|chunk| {
                scope.spawn(move || {
                    chunk
                        .iter()
                        .filter_map(|(name, setup, except)| check(name, *setup, except).err())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    report(
        "hostile-trees",
        &format!(
            "cases={} failed={} seconds={}",
            cases.len(),
            failures.len(),
            started.elapsed().as_secs()
        ),
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn the_manifest_lists_only_well_formed_env_names_and_never_a_value() {
    let tmp = tempfile::tempdir().unwrap();
    let project = Project::local(tmp.path());
    project.write(
        ".env",
        "GOOD=s3cret-one\nthis line is bad\nBAD KEY=2\nALSO_GOOD=\"s3cret-two\"\n",
    );
    project.write("shmastra.json", "{ corrupt");
    let watcher = project.start(&["--no-push"], &[]);
    project.wait_committed(&[], PATIENCE);
    let manifest = git(&project.work, ["show", "HEAD:shmastra.json"]);
    assert_eq!(
        manifest,
        "{\n  \"version\": 1,\n  \"env\": [\n    \"ALSO_GOOD\",\n    \"GOOD\"\n  ]\n}\n"
    );
    let (exit, logs) = watcher.stop();
    assert_eq!(exit.code(), Some(0), "{logs}");
    assert!(!logs.contains("s3cret"), "a value reached the log");
    let files = git(&project.work, ["ls-tree", "-r", "--name-only", "HEAD"]);
    assert!(!files.contains(".env"), "{files}");
}

#[test]
fn a_one_gigabyte_file_is_left_out_and_listed_in_the_status() {
    let tmp = tempfile::tempdir().unwrap();
    let project = Project::local(tmp.path());
    project.write("small.txt", "small\n");
    // Sparse: a gigabyte of size, no disk.
    fs::File::create(project.path("huge.bin"))
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    let watcher = project.start(&["--no-push"], &[]);
    project.wait_committed(&["huge.bin"], PATIENCE);
    let status = project.wait_status("the skipped file in the status", PATIENCE, |s| {
        !s.skipped_files.is_empty()
    });
    assert_eq!(status.skipped_files.len(), 1, "{status:#?}");
    assert_eq!(status.skipped_files[0].path, "huge.bin");
    assert_eq!(status.skipped_files[0].size, 1 << 30);
    let (exit, logs) = watcher.stop();
    assert_eq!(exit.code(), Some(0), "{logs}");
    assert!(logs.contains("larger than --max-file-size"), "{logs}");
}

#[test]
fn a_watcher_killed_mid_save_leaves_no_lock_that_blocks_the_next_one() {
    let tmp = tempfile::tempdir().unwrap();
    let project = Project::local(tmp.path());
    project.write("a.txt", "a\n");
    // What a SIGKILL inside a save leaves: a young index.lock and the save marker.
    let state = project.git_dir().join("project-watcher");
    fs::create_dir_all(&state).unwrap();
    fs::write(state.join("saving"), b"").unwrap();
    fs::write(project.git_dir().join("index.lock"), b"half an index").unwrap();
    let started = Instant::now();
    let watcher = project.start(&["--no-push"], &[]);
    // Far less than the 60 s a lock of unknown origin must age.
    project.wait_committed(&[], Duration::from_secs(30));
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(!project.git_dir().join("index.lock").exists());
    let (exit, logs) = watcher.stop();
    assert_eq!(exit.code(), Some(0), "{logs}");
    assert!(logs.contains("removed a stale git lock file"), "{logs}");
}

#[test]
fn a_young_index_lock_of_unknown_origin_is_reported_and_waited_out() {
    let tmp = tempfile::tempdir().unwrap();
    let project = Project::local(tmp.path());
    project.write("a.txt", "a\n");
    // A user's `git commit` with its editor open holds index.lock, closed, for minutes.
    let lock = project.git_dir().join("index.lock");
    fs::write(&lock, b"").unwrap();
    let watcher = project.start(&["--no-push"], &[]);
    let status = project.wait_status("the lock in the status", PATIENCE, |s| {
        s.state == State::Paused
            && s.paused_reason
                .as_deref()
                .is_some_and(|r| r.contains("index.lock"))
    });
    assert!(status.head.is_none(), "{status:#?}");
    assert!(
        lock.exists(),
        "a young lock of unknown origin is left alone"
    );
    fs::remove_file(&lock).unwrap();
    project.wait_committed(&[], Duration::from_secs(90));
    let (exit, logs) = watcher.stop();
    assert_eq!(exit.code(), Some(0), "{logs}");
}

#[test]
fn a_stale_lock_goes_while_git_commands_that_only_read_run_in_the_repository() {
    let tmp = tempfile::tempdir().unwrap();
    let project = Project::local(tmp.path());
    project.write("a.txt", "a\n");
    // Left by a git killed minutes ago: nobody has it open.
    let lock = project.git_dir().join("index.lock");
    fs::write(&lock, b"").unwrap();
    age(&lock, 120);
    // What an editor's git integration keeps running: a reader waiting on its stdin, and a
    // command on an index of its own. Neither can hold the repository's locks.
    let scratch_index = tmp.path().join("scratch-index");
    let mut readers = [
        testkit::git::command(&project.work)
            .args(["cat-file", "--batch"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
        testkit::git::command(&project.work)
            .args(["add", "--interactive"])
            .env("GIT_INDEX_FILE", &scratch_index)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    ];
    let watcher = project.start(&["--no-push"], &[]);
    project.wait_committed(&[], PATIENCE);
    assert!(!lock.exists());
    for reader in &mut readers {
        assert!(
            reader.try_wait().unwrap().is_none(),
            "the reader still runs"
        );
        let _ = reader.kill();
        let _ = reader.wait();
    }
    let (exit, logs) = watcher.stop();
    assert_eq!(exit.code(), Some(0), "{logs}");
    assert!(logs.contains("removed a stale git lock file"), "{logs}");
}

/// The type of `rel` in `HEAD` (`blob`, `tree`), `None` when absent.
fn head_type(project: &Project, rel: &str) -> Option<String> {
    let out = testkit::git::git_output(&project.work, ["cat-file", "-t", &format!("HEAD:{rel}")]);
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

#[test]
fn files_replaced_by_directories_and_back_while_watched_are_saved_each_time() {
    let tmp = tempfile::tempdir().unwrap();
    let project = Project::local(tmp.path());
    project.write("flip", "a file first\n");
    project.write("flop/inside.txt", "a directory first\n");
    let watcher = project.start(&["--no-push"], &[]);
    project.wait_committed(&[], PATIENCE);
    let mut replaced = 0;
    for round in 0..3 {
        // `flip` becomes a directory and `flop` a file, then the other way round.
        let (to_dir, to_file) = if round % 2 == 0 {
            ("flip", "flop")
        } else {
            ("flop", "flip")
        };
        fs::remove_file(project.path(to_dir)).unwrap();
        project.write(&format!("{to_dir}/inside.txt"), format!("round {round}\n"));
        fs::remove_dir_all(project.path(to_file)).unwrap();
        project.write(to_file, format!("round {round}\n"));
        replaced += 2;
        project.wait_committed(&[], PATIENCE);
        assert_eq!(head_type(&project, to_dir).as_deref(), Some("tree"));
        assert_eq!(head_type(&project, to_file).as_deref(), Some("blob"));
        assert_eq!(
            git(
                &project.work,
                ["show", &format!("HEAD:{to_dir}/inside.txt")]
            ),
            format!("round {round}\n")
        );
    }
    let (exit, logs) = watcher.stop();
    assert_eq!(exit.code(), Some(0), "{logs}");
    report("hostile-replaced", &format!("replacements={replaced}"));
}

#[test]
fn files_churning_during_the_scan_end_up_exactly_as_left() {
    let tmp = tempfile::tempdir().unwrap();
    let project = Project::local(tmp.path());
    for i in 0..200 {
        project.write(&format!("tree/{}/f{i}.txt", i % 10), "start\n");
    }
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let i = n % 200;
                let path = project.path(&format!("tree/{}/f{i}.txt", i % 10));
                match n % 4 {
                    0 => {
                        let _ = fs::remove_file(&path);
                    }
                    1 => {
                        let _ = fs::write(&path, format!("churn {n}\n"));
                    }
                    2 => {
                        // A file becomes a directory, and the directory a file again.
                        let _ = fs::remove_file(&path);
                        let _ = fs::create_dir_all(path.join("inside"));
                        let _ = fs::write(path.join("inside/x"), "x\n");
                    }
                    _ => {
                        let _ = fs::remove_dir_all(&path);
                        let _ = fs::write(&path, format!("back {n}\n"));
                    }
                }
            }
        });
        // Start during the churn: the first full pass races it.
        let watcher = project.start(&["--no-push"], &[]);
        std::thread::sleep(Duration::from_secs(3));
        stop.store(true, Ordering::Relaxed);
        project.wait_committed(&[], PATIENCE);
        let (exit, logs) = watcher.stop();
        assert_eq!(exit.code(), Some(0), "{logs}");
    });
}

#[test]
fn unreadable_files_and_directories_keep_their_last_saved_version() {
    let case = "unreadable_files_and_directories_keep_their_last_saved_version";
    if !is_root() {
        skip(case, "needs root to run the watcher as another user");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let project = Project::local(tmp.path());
    project.write("open.txt", "readable\n");
    project.write("secret.txt", "saved while readable\n");
    project.write("private/inside.txt", "saved while readable\n");
    let chown = Command::new("chown")
        .args(["-R", "65534:65534"])
        .arg(tmp.path())
        .status()
        .unwrap();
    assert!(chown.success());
    // Root reads everything; as `nobody` the modes below apply.
    let as_nobody = ["--reuid=65534", "--regid=65534", "--clear-groups"];
    let watcher = project.start_as(&as_nobody, &["--no-push"]);
    // The repository is nobody's now: git run as root needs to be told it is safe.
    let show = |rev: &str| {
        let out = testkit::git::git_output(&project.work, ["-c", "safe.directory=*", "show", rev]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    testkit::wait::until(PATIENCE, "the first save", || {
        (show("HEAD:private/inside.txt") == "saved while readable\n").then_some(())
    });

    project.write("secret.txt", "changed after it became unreadable\n");
    fs::set_permissions(
        project.path("secret.txt"),
        fs::Permissions::from_mode(0o000),
    )
    .unwrap();
    fs::set_permissions(project.path("private"), fs::Permissions::from_mode(0o000)).unwrap();
    project.write("open.txt", "still saved\n");
    testkit::wait::until(PATIENCE, "open.txt to be saved", || {
        (show("HEAD:open.txt") == "still saved\n").then_some(())
    });
    assert_eq!(show("HEAD:secret.txt"), "saved while readable\n");
    assert_eq!(show("HEAD:private/inside.txt"), "saved while readable\n");
    let (exit, logs) = watcher.stop();
    assert_eq!(exit.code(), Some(0), "{logs}");
    assert!(logs.contains("Permission denied"), "{logs}");

    // A restart's full pass cannot read them either, and must not take them for deleted.
    let watcher = project.start_as(&as_nobody, &["--no-push"]);
    project.write("open.txt", "saved after the restart\n");
    testkit::wait::until(PATIENCE, "open.txt to be saved again", || {
        (show("HEAD:open.txt") == "saved after the restart\n").then_some(())
    });
    assert_eq!(show("HEAD:secret.txt"), "saved while readable\n");
    assert_eq!(show("HEAD:private/inside.txt"), "saved while readable\n");
    let (exit, logs) = watcher.stop();
    assert_eq!(exit.code(), Some(0), "{logs}");
}

#[test]
fn a_stale_lock_on_the_remote_tracking_ref_does_not_fail_every_push() {
    let tmp = tempfile::tempdir().unwrap();
    let project = Project::local(tmp.path());
    project.write("a.txt", "a\n");
    // What a SIGKILL while recording a confirmed push leaves behind.
    let lock = project.git_dir().join("refs/remotes/project/main.lock");
    fs::create_dir_all(lock.parent().unwrap()).unwrap();
    fs::write(&lock, b"0000\n").unwrap();
    age(&lock, 120);
    let watcher = project.start(&[], &[]);
    project.wait_pushed(PATIENCE);
    project.write("b.txt", "b\n");
    project.wait_pushed(PATIENCE);
    let (exit, logs) = watcher.stop();
    assert_eq!(exit.code(), Some(0), "{logs}");
}

#[test]
fn a_watcher_killed_mid_push_leaves_no_lock_that_fails_the_next_push() {
    let tmp = tempfile::tempdir().unwrap();
    let project = Project::local(tmp.path());
    project.write("a.txt", "a\n");
    // What a SIGKILL while libgit2 updates the tracking ref leaves: a young lock, the marker.
    let lock = project.git_dir().join("refs/remotes/project/main.lock");
    fs::create_dir_all(lock.parent().unwrap()).unwrap();
    fs::write(&lock, b"0000\n").unwrap();
    let state = project.git_dir().join("project-watcher");
    fs::create_dir_all(&state).unwrap();
    fs::write(state.join("pushing"), b"").unwrap();
    let watcher = project.start(&[], &[]);
    // Far less than the 60 s a lock of unknown origin must age.
    project.wait_pushed(Duration::from_secs(30));
    let (exit, logs) = watcher.stop();
    assert_eq!(exit.code(), Some(0), "{logs}");
    assert!(logs.contains("removed a stale git lock file"), "{logs}");
}
