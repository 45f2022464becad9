//! An `npm install`-like burst into an ignored `node_modules` costs no commit and no watch:
//! the watcher holds exactly one inotify watch per kept directory (plus `.git/info`).
//!
//! Alone in its test binary, so the process's inotify watches are all the watcher's.

mod support;

use std::fs;

use support::PATIENCE;
use support::in_process::{Daemon, Repo, inotify_watches_of_this_process};
use testkit::wait::until;

#[test]
fn thousands_of_files_in_node_modules_make_no_commit_and_no_watch() {
    let repo = Repo::new();
    repo.write(".gitignore", "node_modules\n");
    repo.write("src/app/main.js", "main");
    repo.write("src/lib/util.js", "util");
    fs::create_dir_all(repo.path("node_modules/.bin")).unwrap();
    assert_eq!(inotify_watches_of_this_process(), 0);
    let _daemon = Daemon::start(&repo, repo.config());
    // root, src, src/app, src/lib; .git/info for the exclude file and .git itself for the
    // user's git (HEAD, the index, the operation markers).
    let kept_dirs = 4;
    let rule_watches = 2;
    assert_eq!(inotify_watches_of_this_process(), kept_dirs + rule_watches);
    let commits = repo.commit_count();

    for package in 0..150 {
        let dir = repo.path(&format!("node_modules/pkg{package}/lib/deep"));
        fs::create_dir_all(&dir).unwrap();
        for file in 0..20 {
            fs::write(dir.join(format!("f{file}.js")), "module.exports = 1;").unwrap();
        }
    }
    fs::remove_dir_all(repo.path("node_modules/pkg0")).unwrap();
    fs::rename(
        repo.path("node_modules/pkg1"),
        repo.path("node_modules/renamed"),
    )
    .unwrap();

    repo.write("src/after.js", "after the burst");
    until(PATIENCE, "the file written after the burst", || {
        repo.head_paths()
            .contains(&"src/after.js".to_owned())
            .then_some(())
    });
    repo.wait_saved();
    assert_eq!(repo.commit_count(), commits + 1, "the burst made commits");
    assert!(
        !repo
            .head_paths()
            .iter()
            .any(|p| p.starts_with("node_modules"))
    );
    assert_eq!(inotify_watches_of_this_process(), kept_dirs + rule_watches);

    // A removed directory loses its watch; one that becomes ignored keeps it while it holds
    // a tracked file (git keeps updating that file), and loses it once nothing there is.
    repo.write(".gitignore", "node_modules\nsrc/lib\n");
    fs::remove_dir_all(repo.path("src/app")).unwrap();
    repo.wait_saved();
    assert!(repo.head_paths().contains(&"src/lib/util.js".to_owned()));
    until(PATIENCE, "one fewer watch", || {
        (inotify_watches_of_this_process() == kept_dirs - 1 + rule_watches).then_some(())
    });
    fs::remove_file(repo.path("src/lib/util.js")).unwrap();
    repo.wait_saved();
    assert!(!repo.head_paths().iter().any(|p| p.starts_with("src/lib")));
    until(PATIENCE, "two fewer watches", || {
        (inotify_watches_of_this_process() == kept_dirs - 2 + rule_watches).then_some(())
    });
}
