//! Reliability: inotify's limits. With the watch limit reached, directories without a watch
//! are rescanned periodically and their changes still get committed; a kernel queue overflow
//! during a flood of events ends in a full rescan with every change committed.

mod support;

use std::fs;
use std::time::Duration;

use support::{Project, is_root, report, skip};

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
    let lost = project.unsaved_paths(&project.work, "HEAD", &[]);
    let dirs = project.directories();
    // Idle between rescans: the fallback is a timer, not a busy loop.
    let cpu = watcher.cpu_over(Duration::from_secs(5));
    assert!(cpu < 0.5, "{cpu} s of CPU in 5 s while idle past the limit");
    report(
        "inotify-watch-limit",
        &format!("cap=2 dirs={dirs} lost={lost} idle_cpu_5s={cpu:.2}"),
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
    /// `None` when the limit cannot be written (not root, or a container's read-only
    /// `/proc/sys`), after saying why.
    fn lower(to: u32, case: &str) -> Option<Self> {
        if !is_root() {
            skip(case, "needs root to lower fs.inotify.max_queued_events");
            return None;
        }
        let old = fs::read_to_string(QUEUE_LIMIT).unwrap();
        if let Err(e) = fs::write(QUEUE_LIMIT, to.to_string()) {
            skip(case, &format!("root, but cannot write {QUEUE_LIMIT}: {e}"));
            return None;
        }
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
    let case = "a_flood_that_overflows_the_kernel_queue_ends_with_everything_committed";
    let tmp = tempfile::tempdir().unwrap();
    let project = Project::local(tmp.path());
    project.write("seed.txt", "seed\n");
    // The kernel reads the limit when an inotify instance is created: lower it only while
    // the watcher starts, so other processes on the machine keep the normal queue. Without
    // the lowered queue a flood need not overflow, and this case would prove nothing.
    let Some(lowered) = QueueLimit::lower(16, case) else {
        return;
    };
    let watcher = project.start(&["--no-push"], &[]);
    drop(lowered);
    project.wait_committed(&[], testkit::wait::PATIENCE);

    // A reader that drained one flood in time (CI once saw it) proves nothing: flood again,
    // in new folders, until the watcher has said the kernel dropped events.
    let (mut files, mut deleted) = (0, 0);
    for round in 0..5 {
        if round > 0 && watcher.logs().contains("the kernel dropped file events") {
            break;
        }
        for i in 0..1500 {
            project.write(
                &format!("flood{round}/{}/f{i}.txt", i % 30),
                format!("flood {round} {i}\n"),
            );
        }
        for i in (0..1500).step_by(7) {
            fs::remove_file(project.path(&format!("flood{round}/{}/f{i}.txt", i % 30))).unwrap();
            deleted += 1;
        }
        files += 1500;
    }
    project.wait_committed(&[], Duration::from_secs(90));
    let lost = project.unsaved_paths(&project.work, "HEAD", &[]);
    let (exit, logs) = watcher.stop();
    assert_eq!(exit.code(), Some(0), "{logs}");
    let overflows = logs.matches("the kernel dropped file events").count();
    assert!(overflows > 0, "a 16-event queue did not overflow:\n{logs}");
    report(
        "inotify-queue-overflow",
        &format!("files={files} deleted={deleted} kernel_overflows={overflows} lost={lost}"),
    );
}
