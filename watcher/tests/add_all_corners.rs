//! The corners where the watcher once committed something else than `git add -A` (issue 25),
//! each against real git: the tree the watcher commits equals `git add -A` run on a copy of
//! the index as the user left it.

mod support;

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

use support::PATIENCE;
use support::in_process::{Daemon, Repo, check_state, commit_all};
use testkit::git::{git, tree_of_add_all_from};
use testkit::wait::{until, until_seen};

/// A file named by bytes (not UTF-8).
fn write_bytes(repo: &Repo, name: &[u8], body: &[u8]) {
    let path = repo.dir.join(OsStr::from_bytes(name));
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, body).unwrap();
}

/// Waits until HEAD holds `expected`, showing both trees when it does not.
fn wait_for_tree(repo: &Repo, what: &str, expected: &str) {
    until_seen(PATIENCE, what, || {
        let head = repo.head_tree();
        if head.as_deref() == Some(expected) {
            Ok(())
        } else {
            Err((
                head.map(|_| repo.git(&["ls-tree", "-r", "HEAD"])),
                repo.git(&["ls-tree", "-r", expected]),
            ))
        }
    });
}

#[test]
fn a_byte_that_is_not_utf8_in_info_exclude_does_not_stop_saving() {
    let (repo, _d) = check_state("info/exclude with a non-UTF-8 comment", |repo| {
        fs::write(repo.path(".git/info/exclude"), b"# caf\xe9\n*.tmp\n").unwrap();
        repo.write("a.tmp", "t");
        repo.write("a.txt", "a");
    });
    let paths = repo.head_paths();
    assert!(paths.contains(&"a.txt".to_owned()), "{paths:?}");
    assert!(!paths.contains(&"a.tmp".to_owned()), "{paths:?}");
}

#[test]
fn a_relative_excludes_file_is_read_from_the_top_of_the_working_tree() {
    let (repo, _d) = check_state("relative core.excludesFile", |repo| {
        repo.git(&["config", "core.excludesFile", "rules/ignore"]);
        repo.write("rules/ignore", "*.skip\n");
        repo.write("a.skip", "s");
        repo.write("a.txt", "a");
    });
    assert!(!repo.head_paths().contains(&"a.skip".to_owned()));
}

#[test]
fn an_excludes_file_created_just_before_stop_applies_to_the_last_save() {
    let repo = Repo::new();
    repo.write("base.txt", "base");
    let excludes = repo.dir.parent().unwrap().join("later/ignore");
    repo.git(&["config", "core.excludesFile", excludes.to_str().unwrap()]);
    let mut config = repo.config();
    // No batch before the stop: only the last pass may save the new files.
    config.debounce = Duration::from_secs(60);
    config.max_delay = Duration::from_secs(60);
    let daemon = Daemon::start(&repo, config);
    fs::create_dir_all(excludes.parent().unwrap()).unwrap();
    fs::write(&excludes, "*.swp\n").unwrap();
    repo.write("new.swp", "x");
    repo.write("new.txt", "x");
    let expected = repo.add_all_tree();
    daemon.stop().expect("clean stop");
    assert_eq!(repo.head_tree().as_deref(), Some(expected.as_str()));
    assert!(!repo.head_paths().contains(&"new.swp".to_owned()));
}

#[test]
fn stars_braces_and_bytes_in_gitignore_lines_are_read_as_git_reads_them() {
    let (repo, _d) = check_state("rule syntax", |repo| {
        fs::write(
            repo.path(".gitignore"),
            b"***/x\na/***/deep\nb**/c\nd{e\nf\xff*\n*.{js,map}\n",
        )
        .unwrap();
        for f in [
            "x",
            "q/x",
            "q/r/x",
            "a/deep",
            "a/b/c/deep",
            "b/c",
            "b/1/2/c",
            "d{e",
            "de",
            "a.js",
            "a.{js,map}",
            "kept.txt",
        ] {
            repo.write(f, f);
        }
        write_bytes(repo, b"f\xffx", b"bytes");
        write_bytes(repo, b"f\xfe", b"other bytes");
    });
    let paths = repo.head_paths();
    for ignored in ["q/r/x", "a/b/c/deep", "b/1/2/c", "d{e", "a.{js,map}"] {
        assert!(!paths.contains(&ignored.to_owned()), "{ignored}: {paths:?}");
    }
    for kept in ["de", "a.js", "kept.txt"] {
        assert!(paths.contains(&kept.to_owned()), "{kept}: {paths:?}");
    }
}

#[test]
fn a_symlinked_gitignore_and_gitattributes_in_the_tree_are_not_followed() {
    let (repo, _d) = check_state("symlinked rules files", |repo| {
        let outside = repo.dir.parent().unwrap();
        fs::write(outside.join("rules"), "*.log\n").unwrap();
        fs::write(outside.join("attributes"), "*.txt text eol=lf\n").unwrap();
        repo.write("x/a.log", "log");
        std::os::unix::fs::symlink(outside.join("rules"), repo.path("x/.gitignore")).unwrap();
        std::os::unix::fs::symlink(outside.join("attributes"), repo.path(".gitattributes"))
            .unwrap();
        repo.write("crlf.txt", "one\r\ntwo\r\n");
    });
    assert!(repo.head_paths().contains(&"x/a.log".to_owned()));
    assert_eq!(repo.git(&["show", "HEAD:crlf.txt"]), "one\r\ntwo\r\n");
}

#[test]
fn autocrlf_converts_a_file_whose_index_blob_holds_a_lone_cr() {
    let (repo, _d) = check_state("core.autocrlf with a lone CR in the index", |repo| {
        repo.write("a.txt", "lone\rcr\n");
        repo.write("b.txt", "crlf\r\nin the index\r\n");
        commit_all(repo, &[]);
        repo.git(&["config", "core.autocrlf", "true"]);
        repo.write("a.txt", "now\r\ncrlf\r\n");
        repo.write("b.txt", "still\r\ncrlf\r\n");
    });
    assert_eq!(repo.git(&["show", "HEAD:a.txt"]), "now\ncrlf\n");
    assert_eq!(repo.git(&["show", "HEAD:b.txt"]), "still\r\ncrlf\r\n");
}

#[test]
fn a_gitattributes_deleted_from_the_tree_no_longer_applies() {
    let (repo, _d) = check_state("a deleted .gitattributes still in the index", |repo| {
        repo.write(".gitattributes", "*.txt text eol=lf\n");
        commit_all(repo, &[]);
        fs::remove_file(repo.path(".gitattributes")).unwrap();
        repo.write("new.txt", "crlf\r\nkept\r\n");
    });
    assert_eq!(repo.git(&["show", "HEAD:new.txt"]), "crlf\r\nkept\r\n");
}

/// Only the new file is compared: the files saved before are racily clean for git when they
/// were written in the second of the index file, and `git add -A` hashes those again under
/// the new rules, as it would have at any time in that second.
#[test]
fn a_gitattributes_edit_and_a_new_directory_in_one_batch_use_the_new_rules() {
    let repo = Repo::new();
    repo.write(".gitattributes", "*.txt eol=lf\n");
    repo.write("old.txt", "old\r\n");
    commit_all(&repo, &[]);
    let daemon = Daemon::start(&repo, repo.config());
    repo.write("seen.txt", "read the rules\r\n");
    repo.wait_saved();
    // Same size, same second: a stamp of size and seconds cannot tell the two apart.
    repo.write(".gitattributes", "*.txt binary\n");
    repo.write("new/dir/f.txt", "crlf\r\nstays\r\n");
    let expected = repo
        .git(&["hash-object", "--path=new/dir/f.txt", "new/dir/f.txt"])
        .trim()
        .to_owned();
    until_seen(PATIENCE, "new/dir/f.txt saved by the new rules", || {
        let saved = git_output_of(&repo, &["rev-parse", "HEAD:new/dir/f.txt"]);
        if saved.as_deref() == Some(expected.as_str()) {
            Ok(())
        } else {
            Err(saved)
        }
    });
    assert_eq!(
        repo.git(&["show", "HEAD:new/dir/f.txt"]),
        "crlf\r\nstays\r\n"
    );
    daemon.stop().expect("clean stop");
}

/// `git` output, `None` when it fails.
fn git_output_of(repo: &Repo, args: &[&str]) -> Option<String> {
    let out = testkit::git::git_output(&repo.dir, args);
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

#[test]
fn ident_collapses_every_id_as_git_does() {
    let (repo, _d) = check_state("several $Id$", |repo| {
        repo.write(".gitattributes", "*.id ident\n");
        repo.write("a.id", "$Id$\n$Id: 1234 $\nmiddle\n$Id$\n");
    });
    assert_eq!(
        repo.git(&["show", "HEAD:a.id"]),
        "$Id$\n$Id$\nmiddle\n$Id$\n"
    );
}

/// No `.gitattributes` in the tree: the watcher's shortcut past attribute lookups must still
/// see the files outside it, here `ident`, which libgit2 applies to the first `$Id$` only.
#[test]
fn attributes_files_outside_the_tree_apply_as_git_s_do() {
    let body = "$Id$\n$Id: 1234 $\n";
    let (repo, _d) = check_state("ident in info/attributes", |repo| {
        fs::write(repo.path(".git/info/attributes"), "*.id ident\n").unwrap();
        repo.write("a.id", body);
    });
    assert_eq!(repo.git(&["show", "HEAD:a.id"]), "$Id$\n$Id$\n");
    let (repo, _d) = check_state("ident in core.attributesFile", |repo| {
        let file = repo.dir.parent().unwrap().join("attributes");
        fs::write(&file, "*.id ident\n").unwrap();
        repo.git(&["config", "core.attributesFile", file.to_str().unwrap()]);
        repo.write("a.id", body);
    });
    assert_eq!(repo.git(&["show", "HEAD:a.id"]), "$Id$\n$Id$\n");
}

#[test]
fn index_edits_the_user_makes_while_the_watcher_runs_hold_at_the_next_save() {
    let repo = Repo::new();
    repo.write("a.txt", "one\n");
    repo.write("b.txt", "b\n");
    commit_all(&repo, &[]);
    repo.write("a.txt", "two\n");
    commit_all(&repo, &[]);
    let mut config = repo.config();
    config.index_quiet = Duration::from_millis(100);
    let daemon = Daemon::start(&repo, config);
    repo.wait_saved();
    // Nothing of the watcher's own is left unwritten: what follows is the user's alone.
    until(PATIENCE, "the index file to hold HEAD", || {
        repo.git(&["diff", "--cached", "--name-only"])
            .is_empty()
            .then_some(())
    });
    let check = |what: &str, user: &[&[&str]]| {
        for args in user {
            repo.git(args);
        }
        // The index as the user left it, before the watcher's next save writes its own.
        let copy = repo.dir.parent().unwrap().join("user-index");
        testkit::git::copy_index(&repo.dir.join(".git/index"), &copy);
        repo.write(&format!("trigger-{}.txt", what.len()), what);
        let expected = tree_of_add_all_from(&repo.dir, Some(&copy));
        wait_for_tree(&repo, what, &expected);
    };
    // HEAD~2 is the user's first commit (then theirs, then the watcher's first save).
    check("git reset HEAD~2", &[&["reset", "-q", "HEAD~2"]]);
    assert_eq!(repo.git(&["show", "HEAD:a.txt"]), "two\n");
    check(
        "git rm --cached b.txt",
        &[&["rm", "-q", "--cached", "b.txt"]],
    );
    assert_eq!(repo.git(&["show", "HEAD:b.txt"]), "b\n");
    daemon.stop().expect("clean stop");
}

#[test]
fn a_nested_repository_with_a_newline_in_its_path_is_recorded_as_a_gitlink() {
    let (repo, _d) = check_state("a nested repository named with a newline", |repo| {
        let nested = repo.dir.join("nested\nrepo");
        testkit::git::init_repo(&nested);
        fs::write(nested.join("s.txt"), "s").unwrap();
        git(&nested, ["add", "-A"]);
        git(&nested, ["commit", "-qm", "nested"]);
    });
    let entry = repo.git(&["ls-tree", "-z", "HEAD", "--", "nested\nrepo"]);
    assert!(entry.starts_with("160000 commit "), "{entry:?}");
    until(PATIENCE, "nothing more to save", || {
        (repo.head_tree().as_deref() == Some(repo.add_all_tree().as_str())).then_some(())
    });
}
