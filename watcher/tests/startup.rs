//! Start-up is one walk for the watches and the first save, and `ready` means both are done.
//! Alone in its test binary, so the process's inotify watches are all the watcher's.

mod support;

use std::fs;
use std::os::unix::fs::symlink;
use std::time::Duration;

use support::in_process::{Daemon, Repo, inotify_watches_of_this_process};
use testkit::git::git;
use testkit::wait::until;

/// Less than the 10 s rescan of unwatched directories: a save within it came from a watch.
const PROMPTLY: Duration = Duration::from_secs(8);

#[test]
fn ready_means_every_kept_directory_is_watched_and_the_first_save_is_on_disk() {
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("target.txt"), "outside").unwrap();
    let repo = Repo::new();
    repo.write("src/a/b/one.ts", "one");
    repo.git(&["add", "-A"]);
    repo.git(&["commit", "-qm", "first"]);
    repo.write(".gitignore", "node_modules\n");
    for package in 0..30 {
        repo.write(&format!("node_modules/p{package}/lib/index.js"), "x");
    }
    // A nested repository with a commit: a gitlink, whose `.git` is watched for its commits.
    let nested = repo.path("vendor/lib");
    fs::create_dir_all(&nested).unwrap();
    git(&nested, ["init", "-q"]);
    fs::write(nested.join("lib.rs"), "lib").unwrap();
    git(&nested, ["add", "-A"]);
    git(&nested, ["commit", "-qm", "nested"]);
    // Symlinks are saved as links and never followed, to a directory inside or outside.
    symlink("src/a", repo.path("inner-link")).unwrap();
    symlink(outside.path(), repo.path("outer-link")).unwrap();
    repo.write("src/a/b/one.ts", "edited before start");
    repo.write("src/new.ts", "new before start");
    assert_eq!(inotify_watches_of_this_process(), 0);

    let _daemon = Daemon::start(&repo, repo.config());
    // The status file is written once the first save is done: HEAD holds the work at once.
    assert_eq!(repo.head_tree().unwrap(), repo.add_all_tree());
    assert_eq!(repo.commit_count(), 2, "the first save is one commit");
    let paths = repo.head_paths();
    for path in ["inner-link", "outer-link", "vendor/lib", "src/new.ts"] {
        assert!(paths.contains(&path.to_owned()), "{path}: {paths:?}");
    }
    assert!(
        !paths.iter().any(|p| p.starts_with("node_modules")),
        "{paths:?}"
    );
    assert_eq!(
        repo.head_entry("outer-link").split(' ').next(),
        Some("120000")
    );

    // Every watch is set by then: "", src, src/a, src/a/b, vendor, vendor/lib,
    // vendor/lib/.git, .git/info and .git itself (the user's git); none in node_modules,
    // none through a symlink.
    assert_eq!(inotify_watches_of_this_process(), 9);
    repo.write("src/a/b/after.ts", "after ready");
    git(
        &nested,
        ["commit", "-q", "--allow-empty", "-m", "nested, after ready"],
    );
    let nested_head = git(&nested, ["rev-parse", "HEAD"]);
    until(PROMPTLY, "the edits made after ready", || {
        let paths = repo.head_paths();
        (paths.contains(&"src/a/b/after.ts".to_owned())
            && repo.head_entry("vendor/lib").contains(nested_head.trim()))
        .then_some(())
    });
    let commits = repo.commit_count();
    fs::write(outside.path().join("target.txt"), "edited outside").unwrap();
    fs::write(outside.path().join("more.txt"), "more").unwrap();
    repo.write("src/last.ts", "last");
    repo.wait_saved();
    assert_eq!(
        repo.commit_count(),
        commits + 1,
        "only src/last.ts was saved"
    );
    assert_eq!(inotify_watches_of_this_process(), 9);
}
