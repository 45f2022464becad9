//! Reliability: faults the watcher must ride out. The remote refusing connections, answering
//! 500, stalling mid-pack; the disk full (a small tmpfs) then freed; `.git` read-only then
//! writable. Each is reported in the status and the log, costs no busy loop, and once it goes
//! every edit reaches the remote.
//!
//! `RELIABILITY_OUTAGE_SECS` (default 3) sets how long each network fault lasts; a stalled
//! push holds its fault at least until the watcher's network timeout (10 s here) reports it.

mod support;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use project_watcher::status::State;
use support::{PATIENCE, Project, Rng, Tmpfs, can_mount, knob, report};
use testkit::git::git;
use testkit::git_server::Fault;
use testkit::wait::until;

/// CPU the watcher may use in [`CPU_WINDOW`] while a fault lasts (a busy loop uses all 5 s).
const CPU_BUDGET: f64 = 0.2;
/// The same while pushes fail: each retry builds a pack of the unpushed megabytes again.
const CPU_BUDGET_RETRYING_PUSHES: f64 = 0.5;
const CPU_WINDOW: Duration = Duration::from_secs(5);
/// The watcher's network timeout in the network test (`PROJECT_WATCHER_NETWORK_TIMEOUT`): short
/// enough that a stalled push is reported within a short outage, long enough that no push on
/// a loaded machine waits on loopback this long for one read or write.
const NETWORK_TIMEOUT: &str = "10s";

fn noise(rng: &mut Rng, len: usize) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(len + 8);
    while bytes.len() < len {
        bytes.extend_from_slice(&rng.next().to_le_bytes());
    }
    bytes.truncate(len);
    bytes
}

#[test]
fn network_faults_are_reported_cost_no_cpu_and_lose_nothing() {
    let outage = Duration::from_secs(knob("RELIABILITY_OUTAGE_SECS", 3));
    let mut rng = Rng::from_env("network_faults");
    let tmp = tempfile::tempdir().unwrap();
    let project = Project::served(tmp.path());
    let server = project.server.as_ref().unwrap();
    let watcher = project.start(&[], &[("PROJECT_WATCHER_NETWORK_TIMEOUT", NETWORK_TIMEOUT)]);
    project.write("a.txt", "before any fault\n");
    project.wait_pushed(PATIENCE);

    let mut faults_survived = 0;
    let mut max_cpu: f64 = 0.0;
    for (round, fault) in [
        Fault::RefuseConnections,
        Fault::Status500,
        Fault::StallMidPack,
    ]
    .into_iter()
    .enumerate()
    {
        let started = Instant::now();
        server.set_fault(fault);
        project.write(&format!("during-{round}.txt"), format!("{fault:?}\n"));
        // Big enough that a stalled server stops reading in the middle of the pack.
        project.write(&format!("pack-{round}.bin"), noise(&mut rng, 4 << 20));
        project.write("a.txt", format!("changed during {fault:?}\n"));
        let status = match fault {
            Fault::RefuseConnections => {
                project.wait_status("the outage in the status", PATIENCE, |s| {
                    s.last_push_error
                        .as_deref()
                        .is_some_and(|e| e.contains("cannot reach remote `project`"))
                })
            }
            Fault::Status500 => project.wait_status("the 500 in the status", PATIENCE, |s| {
                s.last_push_error
                    .as_deref()
                    .is_some_and(|e| e.contains("500"))
            }),
            _ => project.wait_status("a push in flight", PATIENCE, |s| {
                s.state == State::Pushing && s.unpushed_commits > 0
            }),
        };
        assert!(status.unpushed_commits > 0, "{status:#?}");
        let cpu = watcher.cpu_over(CPU_WINDOW);
        max_cpu = max_cpu.max(cpu);
        assert!(
            cpu < CPU_BUDGET_RETRYING_PUSHES,
            "{cpu} s of CPU in {CPU_WINDOW:?} during {fault:?}"
        );
        if fault == Fault::StallMidPack {
            // The network timeout turns the stall into a reported, retried failure, while the
            // server still stalls.
            let status = project.wait_status("the stall reported", PATIENCE, |s| {
                s.last_push_error.is_some()
            });
            let error = status.last_push_error.unwrap_or_default();
            assert!(
                error.contains(&format!(
                    "timed out: the server did not answer within {NETWORK_TIMEOUT}"
                )),
                "{error}"
            );
        }
        if let Some(rest) = outage.checked_sub(started.elapsed()) {
            std::thread::sleep(rest);
        }
        server.set_fault(Fault::None);
        // A stalled attempt ends at the network timeout before the next one starts.
        project.wait_pushed(Duration::from_secs(120));
        faults_survived += 1;
    }
    assert_eq!(
        git(&project.bare, ["rev-list", "main"]),
        git(&project.work, ["rev-list", "HEAD"]),
        "the remote history is exactly the local one"
    );
    for round in 0..3 {
        assert!(project.remote_file(&format!("pack-{round}.bin")).is_some());
    }
    let lost = project.unsaved_paths(&project.bare, "main", &[]);
    report(
        "network-faults",
        &format!(
            "faults={faults_survived} outage_secs={} max_cpu_5s={max_cpu:.2} lost={lost}",
            outage.as_secs()
        ),
    );
    let (exit, logs) = watcher.stop();
    assert_eq!(exit.code(), Some(0), "{logs}");
}

/// Fills the file system holding `path` with it until a write fails with ENOSPC.
fn fill(path: &Path) -> u64 {
    let mut file = fs::File::create(path).unwrap();
    let mut written = 0;
    for chunk in [1 << 20, 4096, 1] {
        let block = vec![0xA5u8; chunk];
        loop {
            match file.write(&block) {
                Ok(n) if n > 0 => written += n as u64,
                Ok(_) => break,
                Err(e) => {
                    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
                    break;
                }
            }
        }
    }
    written
}

#[test]
fn a_full_disk_is_reported_without_a_busy_loop_and_caught_up_when_freed() {
    let case = "a_full_disk_is_reported_without_a_busy_loop_and_caught_up_when_freed";
    let tmp = tempfile::tempdir().unwrap();
    // The project (and its .git) lives on a 24 MiB tmpfs; the remote does not.
    let Some(_disk) = Tmpfs::mount(&tmp.path().join("project"), "24m", case) else {
        return;
    };
    let project = Project::local(tmp.path());
    let mut rng = Rng::from_env(case);
    project.write(".gitignore", "node_modules/\n");
    project.write("a.txt", "before\n");
    let watcher = project.start(&["--debounce", "1s", "--max-delay", "5s"], &[]);
    project.wait_pushed(PATIENCE);
    let head = git(&project.work, ["rev-parse", "HEAD"]);
    let remote_main = git(&project.bare, ["rev-parse", "main"]);

    // An edit, then `npm install` fills the disk before the debounce ends.
    let edit = noise(&mut rng, 512 << 10);
    project.write("edit.bin", &edit);
    project.write("notes.txt", "written just before the disk filled\n");
    fs::create_dir_all(project.path("node_modules")).unwrap();
    let filler = project.path("node_modules/huge.bin");
    fill(&filler);

    let status = project.wait_status("disk full in the status", PATIENCE, |s| {
        s.state == State::Error
            && s.last_error
                .as_deref()
                .is_some_and(|e| e.contains("No space left on device"))
    });
    let cpu = watcher.cpu_over(CPU_WINDOW);
    assert!(
        cpu < CPU_BUDGET,
        "{cpu} s of CPU in {CPU_WINDOW:?} with the disk full"
    );
    assert!(project.remote_file("edit.bin").is_none(), "{status:#?}");
    // Nothing is committed (or pushed) without the file that did not fit, not even the small
    // edit beside it, however many retries ran meanwhile.
    assert_eq!(
        git(&project.work, ["rev-parse", "HEAD"]),
        head,
        "{status:#?}"
    );
    assert_eq!(git(&project.bare, ["rev-parse", "main"]), remote_main);

    fs::remove_file(&filler).unwrap();
    // Save retries back off up to 60 s.
    let status = project.wait_pushed(Duration::from_secs(120));
    assert_eq!(status.last_error, None, "{status:#?}");
    assert_eq!(project.remote_file("edit.bin"), Some(edit));
    let (exit, logs) = watcher.stop();
    assert_eq!(exit.code(), Some(0), "{logs}");
    assert!(logs.contains("No space left on device"), "{logs}");
    project.assert_fsck_clean();
    let lost = project.unsaved_paths(&project.bare, "main", &[]);
    report(
        "disk-full",
        &format!("faults=1 cpu_5s={cpu:.2} lost={lost}"),
    );
}

/// A read-only bind mount of `dir` onto itself, undone on drop.
struct ReadOnly {
    dir: PathBuf,
}

impl ReadOnly {
    fn mount(dir: &Path) -> Self {
        let run = |args: &[&str]| {
            let ok = Command::new("mount").args(args).arg(dir).status().unwrap();
            assert!(ok.success(), "mount {args:?} {}", dir.display());
        };
        run(&["--bind", &dir.to_string_lossy()]);
        let this = Self {
            dir: dir.to_owned(),
        };
        run(&["-o", "remount,bind,ro"]);
        this
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
    }
}

#[test]
fn a_read_only_git_dir_is_reported_and_caught_up_when_writable_again() {
    let case = "a_read_only_git_dir_is_reported_and_caught_up_when_writable_again";
    // Read-only bind mounts, because root ignores file modes.
    if !can_mount(case) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let project = Project::local(tmp.path());
    project.write("a.txt", "before\n");
    let watcher = project.start(&[], &[]);
    project.wait_pushed(PATIENCE);

    // The object store read-only: the status file can still say why nothing is saved.
    let objects = ReadOnly::mount(&project.git_dir().join("objects"));
    project.write("one.txt", "written while objects were read-only\n");
    project.wait_status("read-only in the status", PATIENCE, |s| {
        s.state == State::Error
            && s.last_error
                .as_deref()
                .is_some_and(|e| e.contains("Read-only file system"))
    });
    let cpu_objects = watcher.cpu_over(CPU_WINDOW);
    assert!(
        cpu_objects < CPU_BUDGET,
        "{cpu_objects} s of CPU in {CPU_WINDOW:?}"
    );
    drop(objects);
    project.wait_pushed(Duration::from_secs(120));

    // All of `.git` read-only: the status file cannot change either, the log says why.
    // The log already says it from the object store's phase: count the lines of this one.
    let before = watcher.logs().matches("Read-only file system").count();
    let git_dir = ReadOnly::mount(&project.git_dir());
    project.write("two.txt", "written while .git was read-only\n");
    until(PATIENCE, "read-only in the log, twice more", || {
        watcher
            .logs()
            .matches("Read-only file system")
            .count()
            .ge(&(before + 2))
            .then_some(())
    });
    let cpu_git = watcher.cpu_over(CPU_WINDOW);
    assert!(cpu_git < CPU_BUDGET, "{cpu_git} s of CPU in {CPU_WINDOW:?}");
    drop(git_dir);
    project.wait_pushed(Duration::from_secs(120));
    assert!(project.remote_file("one.txt").is_some());
    assert!(project.remote_file("two.txt").is_some());
    let (exit, logs) = watcher.stop();
    assert_eq!(exit.code(), Some(0), "{logs}");
    project.assert_fsck_clean();
    let lost = project.unsaved_paths(&project.bare, "main", &[]);
    report(
        "read-only-git",
        &format!(
            "faults=2 cpu_5s={:.2} lost={lost}",
            cpu_objects.max(cpu_git)
        ),
    );
}
