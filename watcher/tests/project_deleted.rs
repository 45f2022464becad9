//! A project directory deleted while `watch` runs: the watcher notices its repository is gone,
//! says so once, and exits without writing anything into the disappearing tree, so `rm -rf`
//! succeeds and nothing comes back.

mod support;

use std::process::Command;

use support::{PATIENCE, Project};
use testkit::wait::until;

#[test]
fn rm_rf_of_a_watched_project_succeeds_and_the_watcher_stops_once() {
    let tmp = tempfile::tempdir().unwrap();
    let p = Project::local(tmp.path());
    for i in 0..1500 {
        p.write(&format!("src/m{}/f{i}.ts", i % 15), format!("{i}\n"));
    }
    // A debounce longer than the `rm` takes: the first save comes after it, as with the 3 s
    // default on a real project.
    let mut watcher = p.start(&["--debounce", "2s", "--max-delay", "10s"], &[]);
    p.wait_pushed(PATIENCE);

    let rm = Command::new("rm").arg("-rf").arg(&p.work).output().unwrap();
    assert!(
        rm.status.success(),
        "rm -rf failed: {}",
        String::from_utf8_lossy(&rm.stderr)
    );

    let exit = until(PATIENCE, "the watcher to stop", || {
        watcher.child.try_wait().unwrap()
    });
    let logs = watcher.logs();
    assert_eq!(exit.code(), Some(2), "{logs}");
    assert_eq!(logs.matches("is gone").count(), 1, "{logs}");
    // The watcher has exited: whatever it wrote is on disk now.
    assert!(
        !p.work.exists(),
        "the watcher recreated {}: {:?}",
        p.work.display(),
        walk(&p.work)
    );
}

fn walk(dir: &std::path::Path) -> Vec<String> {
    let mut found = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            found.push(entry.path().display().to_string());
            found.extend(walk(&entry.path()));
        }
    }
    found
}
