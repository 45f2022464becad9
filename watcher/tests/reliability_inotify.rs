//! Reliability: inotify's limits. With the watch limit reached, directories without a watch
//! are rescanned periodically and their changes still get committed; a kernel queue overflow
//! during a flood of events ends in a full rescan with every change committed.

mod support;

use std::fs;
use std::time::Duration;

use support::{Project, is_root, report};

/// The periodic rescan runs every 10 s; allow two of them plus slack for a busy machine.
const RESCAN_PATIENCE: Duration = Duration::from_secs(45);

#[test]
fn past_the_watch_limit_unwatched_directories_are_rescanned_and_saved() {
    let tmp = tempfile::tempdir().unwrap();
    let project = Project::local(tmp.path());
    for dir in ["a", "b", "c", "d/e"] {
        project.write(&format!("{dir}/start.txt"), "start\n");
    }
    // The root and one more directory get a watch; the other four do not.
    let watcher = project.start(&["--no-push"], &[("PROJECT_WATCHER_MAX_WATCHES", "2")]);
    let status = project.wait_status("the limit in the status", RESCAN_PATIENCE, |s| {
        s.last_error
            .as_deref()
            .is_some_and(|e| e.contains("inotify watch limit"))
    });
    let problem = status.last_error.unwrap();
    assert!(
        problem.contains("PROJECT_WATCHER_MAX_WATCHES = 2"),
        "{problem}"
    );
    project.wait_committed(&[], RESCAN_PATIENCE);

    for dir in ["a", "b", "c", "d/e"] {
        project.write(&format!("{dir}/start.txt"), format!("edited in {dir}\n"));
        project.write(&format!("{dir}/new/deeper.txt"), "a new directory\n");
    }
    project.write("root.txt", "the root is watched\n");
    project.wait_committed(&[], RESCAN_PATIENCE);
    // Idle between rescans: the fallback is a timer, not a busy loop.
    let cpu = watcher.cpu_over(Duration::from_secs(5));
    assert!(cpu < 0.5, "{cpu} s of CPU in 5 s while idle past the limit");
    report(
        "inotify-watch-limit",
        &format!("cap=2 dirs=9 lost=0 idle_cpu_5s={cpu:.2}"),
    );
    let (exit, logs) = watcher.stop();
    assert_eq!(exit.code(), Some(0), "{logs}");
    assert!(logs.contains("inotify watch limit"), "{logs}");
}

/// Restores `fs.inotify.max_queued_events` when dropped, also when the test fails.
struct QueueLimit {
    old: String,
}

const QUEUE_LIMIT: &str = "/proc/sys/fs/inotify/max_queued_events";

impl QueueLimit {
    fn lower(to: u32) -> Option<Self> {
        let old = fs::read_to_string(QUEUE_LIMIT).ok()?;
        fs::write(QUEUE_LIMIT, to.to_string()).ok()?;
        Some(Self { old })
    }
}

impl Drop for QueueLimit {
    fn drop(&mut self) {
        fs::write(QUEUE_LIMIT, self.old.trim()).expect("restore fs.inotify.max_queued_events");
    }
}

#[test]
fn a_flood_that_overflows_the_kernel_queue_ends_with_everything_committed() {
    let tmp = tempfile::tempdir().unwrap();
    let project = Project::local(tmp.path());
    project.write("seed.txt", "seed\n");
    // The kernel reads the limit when an inotify instance is created: lower it only while
    // the watcher starts, so other processes on the machine keep the normal queue.
    let lowered = if is_root() {
        QueueLimit::lower(16)
    } else {
        None
    };
    let watcher = project.start(&["--no-push"], &[]);
    let overflow_forced = lowered.is_some();
    drop(lowered);
    if !overflow_forced {
        println!(
            "SKIPPED the kernel-queue part: needs root to lower fs.inotify.max_queued_events; \
             flooding with the normal queue only"
        );
    }
    project.wait_committed(&[], Duration::from_secs(60));

    let files = 1500;
    for i in 0..files {
        project.write(
            &format!("flood/{}/f{i}.txt", i % 30),
            format!("flood {i}\n"),
        );
    }
    for i in (0..files).step_by(7) {
        fs::remove_file(project.path(&format!("flood/{}/f{i}.txt", i % 30))).unwrap();
    }
    project.wait_committed(&[], Duration::from_secs(90));
    let (exit, logs) = watcher.stop();
    assert_eq!(exit.code(), Some(0), "{logs}");
    if overflow_forced {
        assert!(
            logs.contains("the kernel dropped file events"),
            "a 16-event queue did not overflow:\n{logs}"
        );
    }
    report(
        "inotify-queue-overflow",
        &format!("files={files} kernel_overflow={overflow_forced} lost=0"),
    );
}
