//! The index file and `HEAD`: a save that moves `HEAD` writes `.git/index` first, so the
//! file always holds what `HEAD` names (a save that changes only stat data leaves the file to
//! the quiet write). These tests hold that to real git: right after a save, `git diff --cached`
//! is empty, `git status` never shows a saved file deleted and untracked, and the user's own
//! `git add; git commit` keeps the save; once idle, `git status` is empty; a `kill -9` right
//! after a save loses nothing and the next save is right; and a `git` command the user runs
//! while the watcher works wins.

mod support;

use std::fs;
use std::time::Duration;

use support::in_process::{Daemon, Repo};
use support::{PATIENCE, Project};
use testkit::git::{command, git};
use testkit::wait::until;

/// `git` that never writes the index behind our back (`git status` refreshes it otherwise).
fn git_read_only(dir: &std::path::Path, args: &[&str]) -> String {
    let out = command(dir)
        .arg("--no-optional-locks")
        .args(args)
        .output()
        .expect("git runs");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Paths whose staged version differs from `HEAD`'s: the index file is behind the commits.
fn staged_against_head(dir: &std::path::Path) -> String {
    git_read_only(dir, &["diff", "--cached", "--name-only", "HEAD"])
}

fn head_of(dir: &std::path::Path) -> String {
    git(dir, ["rev-parse", "HEAD"]).trim().to_owned()
}

fn committed(project: &Project) {
    git(&project.work, ["add", "-A"]);
    git(&project.work, ["commit", "-qm", "start"]);
}

#[test]
fn once_idle_git_status_and_git_diff_cached_are_empty() {
    let tmp = tempfile::tempdir().unwrap();
    let project = Project::local(tmp.path());
    project.write(".gitignore", "*.log\n");
    project.write("README.md", "hello\n");
    project.write("src/a.ts", "a\n");
    project.write("src/old.ts", "old\n");
    committed(&project);
    let watcher = project.start(&["--no-push"], &[]);

    project.write("src/a.ts", "a, edited\n");
    project.write("src/new/b.ts", "b\n");
    project.write("debug.log", "ignored\n");
    fs::remove_file(project.path("src/old.ts")).unwrap();
    project.wait_committed(&[], PATIENCE);

    until(PATIENCE, "the index file to catch up with HEAD", || {
        let status = git_read_only(&project.work, &["status", "--porcelain"]);
        let cached = staged_against_head(&project.work);
        (status.is_empty() && cached.is_empty()).then_some(())
    });
    assert_eq!(
        git_read_only(&project.work, &["diff", "--name-only"]),
        "",
        "the index's stat data matches the files"
    );
    let (exit, logs) = watcher.stop();
    assert!(exit.success(), "{logs}");
    assert_eq!(git_read_only(&project.work, &["status", "--porcelain"]), "");
}

#[test]
fn right_after_a_save_the_index_file_holds_it_and_the_users_commit_keeps_it() {
    let repo = Repo::new();
    repo.write("a.txt", "a\n");
    repo.git(&["add", "-A"]);
    repo.git(&["commit", "-qm", "start"]);
    let mut config = repo.config();
    // No quiet write within the test: only the save itself may write the index file.
    config.index_quiet = Duration::from_secs(3600);
    config.max_delay = Duration::from_secs(3600);
    let daemon = Daemon::start(&repo, config);
    let before = head_of(&repo.dir);
    repo.write("a.txt", "a, autosaved\n");
    until(PATIENCE, "the save's commit", || {
        (head_of(&repo.dir) != before).then_some(())
    });
    assert_eq!(
        staged_against_head(&repo.dir),
        "",
        "the index file holds the save as soon as HEAD names it"
    );
    repo.write("new.txt", "new\n");
    repo.git(&["add", "new.txt"]);
    repo.git(&["commit", "-qm", "the user's commit"]);
    assert_eq!(repo.git(&["show", "HEAD:a.txt"]), "a, autosaved\n");
    assert_eq!(repo.git(&["show", "HEAD:new.txt"]), "new\n");
    daemon.stop().expect("clean shutdown");
}

/// Issue 30: right after a save of a new file, `git status` showed it as deleted and
/// untracked (`D` + `??`) until the index caught up. `HEAD` is read before each `git status`,
/// so every status checked is of a moment the save's commit was already on the branch.
#[test]
fn right_after_saves_git_status_never_shows_a_saved_file_deleted_and_untracked() {
    let repo = Repo::new();
    repo.write("a.txt", "a\n");
    repo.git(&["add", "-A"]);
    repo.git(&["commit", "-qm", "start"]);
    let mut config = repo.config();
    config.index_quiet = Duration::from_secs(3600);
    config.max_delay = Duration::from_secs(3600);
    let daemon = Daemon::start(&repo, config);
    let mut checked = 0;
    for i in 0..5 {
        let before = head_of(&repo.dir);
        let name = format!("new-{i}.txt");
        repo.write(&name, "new\n");
        let status = until(PATIENCE, "the save's commit", || {
            (head_of(&repo.dir) != before)
                .then(|| git_read_only(&repo.dir, &["status", "--porcelain"]))
        });
        checked += 1;
        for line in status.lines() {
            assert!(
                !(line.starts_with("D ") || line.starts_with("??")) || !line.ends_with(&name),
                "right after saving {name}, git status says {status:?}"
            );
        }
    }
    assert_eq!(checked, 5);
    daemon.stop().expect("clean shutdown");
}

#[test]
fn kill_9_right_after_a_save_loses_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let project = Project::local(tmp.path());
    project.write("src/a.ts", "a\n");
    project.write("src/gone.ts", "gone\n");
    project.write("src/kept.ts", "kept\n");
    committed(&project);
    let watcher = project.start(&["--no-push"], &[]);
    let before = head_of(&project.work);

    project.write("src/a.ts", "a, edited\n");
    fs::remove_file(project.path("src/gone.ts")).unwrap();
    until(PATIENCE, "the save's commit", || {
        (head_of(&project.work) != before).then_some(())
    });
    watcher.freeze();
    // The commit is in the object store and on the branch, and the index file holds it.
    assert_eq!(git(&project.work, ["show", "HEAD:src/a.ts"]), "a, edited\n");
    assert!(
        git(&project.work, ["ls-tree", "-r", "--name-only", "HEAD"])
            .lines()
            .all(|p| p != "src/gone.ts")
    );
    assert_eq!(staged_against_head(&project.work), "");
    watcher.kill9();
    let commits = git(&project.work, ["rev-list", "--count", "HEAD"]);

    project.write("src/c.ts", "c\n");
    let watcher = project.start(&["--no-push"], &[]);
    project.wait_committed(&[], PATIENCE);
    // One commit, holding only the new file: nothing reverted, nothing deleted came back.
    let after: u64 = git(&project.work, ["rev-list", "--count", "HEAD"])
        .trim()
        .parse()
        .unwrap();
    assert_eq!(after, commits.trim().parse::<u64>().unwrap() + 1);
    assert_eq!(
        git(&project.work, ["diff", "--name-only", "HEAD~", "HEAD"]),
        "src/c.ts\n"
    );
    assert_eq!(git(&project.work, ["show", "HEAD:src/a.ts"]), "a, edited\n");
    until(PATIENCE, "the index to be corrected", || {
        let status = git_read_only(&project.work, &["status", "--porcelain"]);
        (status.is_empty() && staged_against_head(&project.work).is_empty()).then_some(())
    });
    project.assert_fsck_clean();
    let (exit, logs) = watcher.stop();
    assert!(exit.success(), "{logs}");
}

/// A repository with `b.txt` (tracked) and `c.log` (tracked although `*.log` is ignored), a
/// watcher whose index file waits `quiet` after a save that leaves `HEAD` where it is, and the
/// user's git commands, each writing the index file, run after the watcher's first save.
fn user_repo(quiet: Duration) -> (Repo, Daemon) {
    let repo = Repo::new();
    repo.write(".gitignore", "*.log\n");
    repo.write("a.txt", "a\n");
    repo.write("b.txt", "b\n");
    repo.write("c.log", "c\n");
    repo.git(&["add", "-A"]);
    repo.git(&["add", "-f", "c.log"]);
    repo.git(&["commit", "-qm", "start"]);
    let mut config = repo.config();
    config.index_quiet = quiet;
    let daemon = Daemon::start(&repo, config);
    repo.write("a.txt", "a, edited\n");
    repo.wait_saved();
    // The user's git commands, each writing the index file.
    repo.git(&["update-index", "--skip-worktree", "b.txt"]);
    repo.write("forced.log", "forced\n");
    repo.git(&["add", "-f", "forced.log"]);
    repo.git(&["rm", "--cached", "-q", "c.log"]);
    (repo, daemon)
}

/// What the user's commands leave, whoever writes the index next.
fn assert_the_user_won(repo: &Repo) {
    let flags = repo.git(&["ls-files", "-v", "b.txt"]);
    assert!(flags.starts_with("S "), "skip-worktree kept: {flags:?}");
    let tracked = repo.git(&["ls-files"]);
    assert!(tracked.lines().any(|p| p == "forced.log"), "{tracked}");
    assert!(!tracked.lines().any(|p| p == "c.log"), "{tracked}");
    assert_eq!(repo.git(&["show", ":a.txt"]), "a, edited\n");
}

#[test]
fn a_git_command_run_while_the_watcher_works_wins_over_the_quiet_write() {
    let (repo, daemon) = user_repo(Duration::from_millis(200));
    std::thread::sleep(Duration::from_millis(600));
    assert_the_user_won(&repo);
    repo.write("b.txt", "b, behind skip-worktree\n");
    repo.write("d.txt", "d\n");
    until(PATIENCE, "the next save", || {
        repo.head_paths()
            .contains(&"d.txt".to_owned())
            .then_some(())
    });
    assert_eq!(repo.git(&["show", "HEAD:a.txt"]), "a, edited\n");
    daemon.stop().expect("clean shutdown");
    // No save ever took a.txt back to the index file's stale version.
    assert_eq!(
        repo.git(&["log", "--format=%h", "--", "a.txt"])
            .lines()
            .count(),
        2
    );
    assert_the_user_won(&repo);
    assert_eq!(repo.git(&["show", "HEAD:b.txt"]), "b\n");
    assert_eq!(repo.git(&["show", "HEAD:a.txt"]), "a, edited\n");
    let paths = repo.head_paths();
    assert!(paths.contains(&"forced.log".to_owned()), "{paths:?}");
    assert!(!paths.contains(&"c.log".to_owned()), "{paths:?}");
    assert_eq!(staged_against_head(&repo.dir), "");
}

#[test]
fn a_git_command_run_while_the_watcher_works_wins_over_the_next_save() {
    let (repo, daemon) = user_repo(Duration::from_secs(3600));
    repo.write("b.txt", "b, behind skip-worktree\n");
    repo.write("d.txt", "d\n");
    until(PATIENCE, "the next save", || {
        repo.head_paths()
            .contains(&"d.txt".to_owned())
            .then_some(())
    });
    assert_eq!(repo.git(&["show", "HEAD:a.txt"]), "a, edited\n");
    daemon.stop().expect("clean shutdown");
    // No save ever took a.txt back to the index file's stale version.
    assert_eq!(
        repo.git(&["log", "--format=%h", "--", "a.txt"])
            .lines()
            .count(),
        2
    );
    assert_the_user_won(&repo);
    assert_eq!(repo.git(&["show", "HEAD:b.txt"]), "b\n");
    assert_eq!(repo.git(&["show", "HEAD:a.txt"]), "a, edited\n");
    let paths = repo.head_paths();
    assert!(paths.contains(&"forced.log".to_owned()), "{paths:?}");
    assert!(!paths.contains(&"c.log".to_owned()), "{paths:?}");
    assert_eq!(staged_against_head(&repo.dir), "");
}

#[test]
fn restore_at_run_right_after_a_save_reads_the_index_that_save_committed_from() {
    let repo = Repo::new();
    repo.write("a.txt", "a\n");
    repo.write("big.bin", "small\n");
    repo.git(&["add", "-A"]);
    repo.git(&["commit", "-qm", "start"]);
    let start = head_of(&repo.dir);
    let mut config = repo.config();
    config.max_file_size = 1024;
    config.index_quiet = Duration::from_secs(2);
    let daemon = Daemon::start(&repo, config);
    repo.write("a.txt", "a, edited\n");
    repo.wait_saved();
    let before = head_of(&repo.dir);

    // big.bin grows over --max-file-size: the watcher's next commit drops it, and the index
    // file with it.
    repo.write("big.bin", &"x".repeat(4096));
    until(PATIENCE, "the commit that drops big.bin", || {
        (head_of(&repo.dir) != before).then_some(())
    });
    let saved = head_of(&repo.dir);
    assert_eq!(staged_against_head(&repo.dir), "");
    assert!(!git_read_only(&repo.dir, &["ls-files"]).contains("big.bin"));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_project-watcher"))
        .args(["restore", "--at", &start, "--path", "a.txt"])
        .args(["--max-file-size", "1024", "--dir"])
        .arg(&repo.dir)
        .envs(testkit::git::hermetic_env(&repo.dir.join("../home")))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    daemon.stop().expect("clean shutdown");

    // Read from the index the watcher committed from, `restore --at` had nothing unsaved to
    // commit first: its commit follows the watcher's, and the over-size file stays out.
    assert_eq!(repo.git(&["rev-parse", "HEAD~"]).trim(), saved);
    assert_eq!(repo.git(&["show", "HEAD:a.txt"]), "a\n");
    assert!(!repo.head_paths().contains(&"big.bin".to_owned()));
}

#[test]
fn a_project_that_is_never_quiet_still_gets_its_index_written() {
    let repo = Repo::new();
    repo.write("a.txt", "a\n");
    repo.git(&["add", "-A"]);
    repo.git(&["commit", "-qm", "start"]);
    let mut config = repo.config();
    config.max_delay = Duration::from_secs(2);
    config.index_quiet = Duration::from_secs(1);
    let daemon = Daemon::start(&repo, config);
    repo.write("early.txt", "early\n");
    let busy = repo.path("busy.txt");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let stop = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                n += 1;
                fs::write(&busy, format!("{n}\n")).unwrap();
                // Longer than the debounce, shorter than the quiet: each write is a batch.
                std::thread::sleep(Duration::from_millis(300));
            }
        })
    };
    // A save every 300 ms, never 1 s of quiet; the index file still follows within
    // --max-delay of the first save it lacks.
    testkit::wait::until(
        Duration::from_secs(20),
        "early.txt in the index file",
        || {
            git_read_only(&repo.dir, &["ls-files", "early.txt"])
                .contains("early.txt")
                .then_some(())
        },
    );
    let still_busy = !writer.is_finished();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    daemon.stop().expect("clean shutdown");
    assert!(still_busy, "the project was busy all along");
}

/// Sets the modification time of every tracked file to `ago` in the past (content unchanged).
fn age_tracked_files(repo: &Repo, ago: Duration) {
    let when = std::time::SystemTime::now() - ago;
    for rel in git_read_only(&repo.dir, &["ls-files"]).lines() {
        fs::File::options()
            .write(true)
            .open(repo.path(rel))
            .and_then(|file| file.set_modified(when))
            .unwrap();
    }
}

/// The index file as bytes and inode: a rewrite (libgit2 writes `index.lock`, then renames)
/// changes the inode even when the bytes come out equal.
fn index_file(repo: &Repo) -> (u64, Vec<u8>) {
    use std::os::unix::fs::MetadataExt;
    let path = repo.path(".git/index");
    (fs::metadata(&path).unwrap().ino(), fs::read(&path).unwrap())
}

#[test]
fn stat_data_alone_gets_the_index_file_written_only_when_that_costs_less_than_hashing_again() {
    let repo = Repo::new();
    for n in 0..300 {
        repo.write(&format!("src/file{n}.ts"), &format!("{n}\n"));
    }
    let daemon = Daemon::start(&repo, repo.config());
    repo.wait_saved();
    daemon.stop().expect("clean shutdown");
    age_tracked_files(&repo, Duration::from_secs(3600));
    // git refreshes the stat data: every file is older than the index file, none racy.
    repo.git(&["add", "-A"]);
    // One file committed in the index file's own second: git's racy-clean rule hashes it again
    // at the next start, and finds the same content.
    let racy = repo.path("racy.txt");
    let mut attempts = 0;
    loop {
        attempts += 1;
        repo.write("racy.txt", &format!("racy {attempts}\n"));
        repo.git(&["add", "racy.txt"]);
        repo.git(&["commit", "-qm", "racy"]);
        let second = |p: &std::path::Path| {
            use std::os::unix::fs::MetadataExt;
            fs::metadata(p).unwrap().mtime()
        };
        if second(&racy) == second(&repo.path(".git/index")) {
            break;
        }
        assert!(
            attempts < 10,
            "never wrote racy.txt and the index in one second"
        );
    }
    let before = index_file(&repo);
    let commits = repo.commit_count();
    let mut config = repo.config();
    config.index_quiet = Duration::from_millis(50);
    // Its stop writes the index file if the watcher has anything for it.
    Daemon::start(&repo, config.clone())
        .stop()
        .expect("clean shutdown");
    assert!(
        index_file(&repo) == before,
        "the index file was written again for one file's stat data"
    );
    assert_eq!(repo.commit_count(), commits);
    assert_eq!(git_read_only(&repo.dir, &["status", "--porcelain"]), "");

    // Every file's stat data moved (a copy of the project): hashing them all again at the
    // next start costs more than writing the file, so it is written, with their stat data.
    age_tracked_files(&repo, Duration::from_secs(7200));
    let stale = git_read_only(&repo.dir, &["diff-files", "--name-only"]);
    assert_eq!(stale.lines().count(), 302, "{stale}");
    Daemon::start(&repo, config).stop().expect("clean shutdown");
    let stale = git_read_only(&repo.dir, &["diff-files", "--name-only"]);
    assert!(
        stale.is_empty(),
        "{} files' stat data never reached the index file",
        stale.lines().count()
    );
    assert_eq!(repo.commit_count(), commits);
}
