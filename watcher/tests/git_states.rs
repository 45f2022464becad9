//! Repository states git supports, each checked against real git: the tree the watcher
//! commits equals `git add -A` run on a copy of the user's own index, taken before the
//! watcher touched it (so a watcher that drops what git keeps cannot agree with itself).

mod support;

use std::fs;
use std::path::Path;

use support::PATIENCE;
use support::in_process::{Daemon, Repo, check_state as check, commit_all};
use testkit::git::git;
use testkit::wait::until;

fn sub_repo(at: &Path) {
    testkit::git::init_repo(at);
    fs::write(at.join("s.txt"), "sub").unwrap();
    git(at, ["add", "-A"]);
    git(at, ["commit", "-qm", "sub"]);
}

#[test]
fn tracked_files_an_ignore_rule_matches_stay_tracked_and_updated() {
    let (repo, _d) = check("tracked ignored files", |repo| {
        repo.write("app.log", "v1");
        repo.write("build/keep.txt", "v1");
        repo.write("build/deep/also.txt", "v1");
        commit_all(repo, &[]);
        repo.write(".gitignore", "*.log\nbuild/\n");
        repo.write("app.log", "v2");
        repo.write("build/keep.txt", "v2");
        repo.write("build/untracked.txt", "never");
        repo.write("other.log", "never");
        fs::remove_file(repo.path("build/deep/also.txt")).unwrap();
    });
    assert_eq!(repo.git(&["show", "HEAD:app.log"]), "v2");
    assert_eq!(repo.git(&["show", "HEAD:build/keep.txt"]), "v2");
    let paths = repo.head_paths();
    assert!(
        !paths.contains(&"build/untracked.txt".to_owned()),
        "{paths:?}"
    );
    assert!(
        !paths.contains(&"build/deep/also.txt".to_owned()),
        "{paths:?}"
    );

    // Live: the edit under the ignored directory and the ignored name are saved at once.
    repo.write("build/keep.txt", "v3");
    repo.write("app.log", "v3");
    until(PATIENCE, "live edits of tracked ignored files", || {
        (repo.git(&["show", "HEAD:build/keep.txt"]) == "v3"
            && repo.git(&["show", "HEAD:app.log"]) == "v3")
            .then_some(())
    });
    fs::remove_file(repo.path("build/keep.txt")).unwrap();
    until(PATIENCE, "the removal of a tracked ignored file", || {
        (!repo.head_paths().contains(&"build/keep.txt".to_owned())).then_some(())
    });
    repo.wait_saved();
}

#[test]
fn skip_worktree_and_assume_unchanged_entries_are_kept_and_intent_to_add_is_added() {
    let (repo, _d) = check("index flags", |repo| {
        for f in ["sw.txt", "au.txt", "au-gone.txt"] {
            repo.write(f, "committed");
        }
        commit_all(repo, &[]);
        repo.git(&["update-index", "--skip-worktree", "sw.txt"]);
        repo.git(&[
            "update-index",
            "--assume-unchanged",
            "au.txt",
            "au-gone.txt",
        ]);
        repo.write("sw.txt", "local change git does not look at");
        repo.write("au.txt", "local change git does not look at");
        fs::remove_file(repo.path("au-gone.txt")).unwrap();
        repo.write("ita.txt", "intent to add");
        repo.git(&["add", "-N", "ita.txt"]);
    });
    for f in ["sw.txt", "au.txt", "au-gone.txt"] {
        assert_eq!(
            repo.git(&["show", &format!("HEAD:{f}")]),
            "committed",
            "{f}"
        );
    }
    assert_eq!(repo.git(&["show", "HEAD:ita.txt"]), "intent to add");
    // Live edits to frozen entries stay out too.
    repo.write("sw.txt", "again");
    repo.write("other.txt", "sentinel");
    until(PATIENCE, "the sentinel", || {
        repo.head_paths()
            .contains(&"other.txt".to_owned())
            .then_some(())
    });
    assert_eq!(repo.git(&["show", "HEAD:sw.txt"]), "committed");
}

#[test]
fn a_sparse_checkout_keeps_every_file_outside_the_cone() {
    let (repo, _d) = check("sparse checkout", |repo| {
        repo.write("app/a.txt", "a");
        repo.write("lib/l.txt", "l");
        repo.write("lib/x/y.txt", "y");
        commit_all(repo, &[]);
        repo.git(&["sparse-checkout", "set", "app"]);
        assert!(!repo.path("lib/l.txt").exists());
        repo.write("app/new.txt", "new");
        // Outside the sparse checkout git adds nothing new.
        repo.write("lib/outside.txt", "outside");
    });
    let paths = repo.head_paths();
    assert!(paths.contains(&"lib/x/y.txt".to_owned()), "{paths:?}");
    assert!(paths.contains(&"app/new.txt".to_owned()), "{paths:?}");
    assert!(!paths.contains(&"lib/outside.txt".to_owned()), "{paths:?}");
}

#[test]
fn a_sparse_index_is_expanded_and_saved() {
    let (repo, _d) = check("sparse index", |repo| {
        repo.write("app/a.txt", "a");
        repo.write("lib/l.txt", "l");
        commit_all(repo, &[]);
        repo.git(&["sparse-checkout", "set", "--sparse-index", "app"]);
        repo.write("app/new.txt", "new");
    });
    let paths = repo.head_paths();
    assert!(paths.contains(&"lib/l.txt".to_owned()), "{paths:?}");
    assert!(paths.contains(&"app/new.txt".to_owned()), "{paths:?}");
    // The user's git makes it sparse again; later saves still work.
    repo.git(&["sparse-checkout", "reapply"]);
    repo.write("app/later.txt", "later");
    until(
        PATIENCE,
        "a save after the index became sparse again",
        || {
            repo.head_paths()
                .contains(&"app/later.txt".to_owned())
                .then_some(())
        },
    );
    assert!(repo.head_paths().contains(&"lib/l.txt".to_owned()));
}

#[test]
fn a_submodule_that_is_not_checked_out_keeps_its_gitlink() {
    let (repo, _d) = check("submodule not checked out", |repo| {
        let upstream = repo.dir.parent().unwrap().join("upstream");
        sub_repo(&upstream);
        sub_repo(&repo.path("checked"));
        repo.git(&["add", "checked"]);
        repo.git(&[
            "-c",
            "protocol.file.allow=always",
            "submodule",
            "add",
            "-q",
            upstream.to_str().unwrap(),
            "sm",
        ]);
        repo.git(&["commit", "-qm", "submodules"]);
        // As after a clone without --recursive: an empty directory.
        fs::remove_dir_all(repo.path("sm")).unwrap();
        fs::create_dir(repo.path("sm")).unwrap();
        // A directory with files but no repository: still not checked out for git.
        fs::remove_dir_all(repo.path("checked/.git")).unwrap();
    });
    let sm = repo.head_entry("sm");
    assert!(sm.starts_with("160000 commit"), "{sm}");
    let checked = repo.head_entry("checked");
    assert!(checked.starts_with("160000 commit"), "{checked}");
    // Files written into the not-checked-out submodule never become loose files.
    repo.write("sm/loose.txt", "loose");
    repo.write("sentinel.txt", "s");
    until(PATIENCE, "the sentinel", || {
        repo.head_paths()
            .contains(&"sentinel.txt".to_owned())
            .then_some(())
    });
    assert!(repo.head_entry("sm").starts_with("160000 commit"));
    repo.wait_saved();
}

/// The soak's counterexample: a submodule's directory gone at start is a deletion the first
/// save commits, as `git add -A` then would; a plain directory made there later holds plain
/// files, as for git once the gitlink is out of its index.
#[test]
fn a_gitlink_whose_directory_is_gone_at_start_is_dropped_and_files_made_there_later_are_saved() {
    let user_index = tempfile::NamedTempFile::new().unwrap();
    let (repo, _d) = check("the gitlink's directory gone", |repo| {
        sub_repo(&repo.path("a/build"));
        repo.git(&["add", "a/build"]);
        repo.git(&["commit", "-qm", "a gitlink"]);
        fs::remove_dir_all(repo.path("a/build")).unwrap();
        testkit::git::copy_index(&repo.path(".git/index"), user_index.path());
    });
    assert_eq!(
        repo.head_entry("a/build"),
        "",
        "the first save drops the gitlink"
    );
    // git's answer, from the user's own index: a save at start, then one now.
    testkit::git::add_all_into(&repo.dir, user_index.path());
    repo.write("a/build/keep.log", "made later");
    let expected = testkit::git::tree_of_add_all_from(&repo.dir, Some(user_index.path()));
    until(PATIENCE, "the files made where the gitlink was", || {
        (repo.head_tree().as_deref() == Some(expected.as_str())).then_some(())
    });
    assert!(
        repo.head_entry("a/build/keep.log")
            .starts_with("100644 blob"),
        "{}",
        repo.head_entry("a/build/keep.log")
    );
}

#[test]
fn a_repository_made_inside_a_tracked_directory_keeps_its_files_loose() {
    let (repo, _d) = check("git init in a tracked directory", |repo| {
        repo.write("t/a.txt", "a");
        commit_all(repo, &[]);
        sub_repo(&repo.path("t"));
    });
    let paths = repo.head_paths();
    assert!(paths.contains(&"t/a.txt".to_owned()), "{paths:?}");
    assert!(paths.contains(&"t/s.txt".to_owned()), "{paths:?}");
}

#[test]
fn a_bogus_dot_git_is_walked_into() {
    let (repo, _d) = check("bogus .git", |repo| {
        repo.write("garbage/f.txt", "f");
        repo.write("garbage/.git", "not a repository");
        repo.write("empty/f.txt", "f");
        fs::create_dir_all(repo.path("empty/.git")).unwrap();
    });
    let paths = repo.head_paths();
    assert!(paths.contains(&"garbage/f.txt".to_owned()), "{paths:?}");
    assert!(paths.contains(&"empty/f.txt".to_owned()), "{paths:?}");
}

#[test]
fn rules_are_read_as_git_reads_them() {
    let (repo, _d) = check("rule syntax", |repo| {
        repo.write(".gitignore", "*.{js,map}\n[abc\nfoo[\n\\#hash\n");
        for f in ["a.js", "a.map", "a.{js,map}", "[abc", "abc", "foo", "#hash"] {
            repo.write(f, f);
        }
    });
    let paths = repo.head_paths();
    assert!(paths.contains(&"a.js".to_owned()), "{paths:?}");
    assert!(paths.contains(&"[abc".to_owned()), "{paths:?}");
    assert!(!paths.contains(&"a.{js,map}".to_owned()), "{paths:?}");
}

#[test]
fn core_ignore_case_applies_to_rules() {
    let (repo, _d) = check("core.ignoreCase", |repo| {
        repo.git(&["config", "core.ignoreCase", "true"]);
        repo.write(".gitignore", "SECRET.TXT\nBuild/\n");
        repo.write("secret.txt", "s");
        repo.write("build/out.txt", "o");
    });
    let paths = repo.head_paths();
    assert!(!paths.contains(&"secret.txt".to_owned()), "{paths:?}");
    assert!(!paths.contains(&"build/out.txt".to_owned()), "{paths:?}");
}

#[test]
fn a_directory_that_becomes_a_repository_while_watched_becomes_a_gitlink() {
    let repo = Repo::new();
    repo.write("base.txt", "base");
    let daemon = Daemon::start(&repo, repo.config());
    fs::create_dir_all(repo.path("lib")).unwrap();
    let scratch = repo.dir.parent().unwrap().join("made-elsewhere");
    sub_repo(&scratch);
    git(
        &repo.dir,
        ["clone", "-q", scratch.to_str().unwrap(), "lib/cloned"],
    );
    until(PATIENCE, "the clone as a gitlink", || {
        repo.head_entry("lib/cloned")
            .starts_with("160000 commit")
            .then_some(())
    });
    repo.wait_saved();
    // A commit inside it moves the gitlink, live.
    fs::write(repo.path("lib/cloned/s.txt"), "changed").unwrap();
    git(&repo.path("lib/cloned"), ["commit", "-qam", "inner"]);
    let inner = git(&repo.path("lib/cloned"), ["rev-parse", "HEAD"]);
    until(PATIENCE, "the gitlink at the new inner commit", || {
        repo.head_entry("lib/cloned")
            .contains(inner.trim())
            .then_some(())
    });
    // Its `.git` removed: git keeps the gitlink it tracks, and so does the watcher.
    fs::remove_dir_all(repo.path("lib/cloned/.git")).unwrap();
    repo.write("lib/cloned/more.txt", "more");
    repo.write("sentinel.txt", "s");
    until(PATIENCE, "the sentinel", || {
        repo.head_paths()
            .contains(&"sentinel.txt".to_owned())
            .then_some(())
    });
    assert!(repo.head_entry("lib/cloned").contains(inner.trim()));
    repo.wait_saved();
    // A new directory that gets `git init` + a commit before any save is a new gitlink.
    let made = repo.path("made");
    sub_repo(&made);
    until(
        PATIENCE,
        "the repository made in place as a gitlink",
        || {
            repo.head_entry("made")
                .starts_with("160000 commit")
                .then_some(())
        },
    );
    repo.wait_saved();
    daemon.stop().unwrap();
}

#[test]
fn the_manifest_is_repaired_live_and_a_symlinked_env_is_followed() {
    let repo = Repo::new();
    let outside = repo.dir.parent().unwrap().join("secrets.env");
    fs::write(&outside, "FIRST=1\n").unwrap();
    std::os::unix::fs::symlink(&outside, repo.path(".env")).unwrap();
    let _daemon = Daemon::start(&repo, repo.config());
    let manifest = || fs::read_to_string(repo.path("shmastra.json")).unwrap_or_default();
    assert!(manifest().contains("FIRST"), "{}", manifest());
    fs::write(&outside, "FIRST=1\nSECOND=2\n").unwrap();
    until(
        PATIENCE,
        "the manifest after the symlink target changed",
        || {
            repo.git(&["show", "HEAD:shmastra.json"])
                .contains("SECOND")
                .then_some(())
        },
    );
    fs::remove_file(repo.path("shmastra.json")).unwrap();
    until(PATIENCE, "the manifest written again", || {
        manifest().contains("SECOND").then_some(())
    });
    fs::write(repo.path("shmastra.json"), "{\"hand\": \"edited\"}\n").unwrap();
    until(PATIENCE, "the manifest repaired", || {
        manifest().contains("SECOND").then_some(())
    });
    repo.wait_saved();
}

#[test]
fn an_excludes_file_created_after_start_applies() {
    let repo = Repo::new();
    repo.write("base.txt", "base");
    let excludes = repo.dir.parent().unwrap().join("xdg/git/ignore");
    repo.git(&["config", "core.excludesFile", excludes.to_str().unwrap()]);
    let _daemon = Daemon::start(&repo, repo.config());
    fs::create_dir_all(excludes.parent().unwrap()).unwrap();
    fs::write(&excludes, "*.swp\n").unwrap();
    // Pairs of probes until one `.txt` is saved without its `.swp`: the rule applies. (A
    // `.swp` saved before that stays tracked, as git keeps it.)
    let mut n = 0;
    until(PATIENCE, "the rule applied", || {
        n += 1;
        repo.write(&format!("probe{n}.swp"), "x");
        repo.write(&format!("probe{n}.txt"), "x");
        let saved = |name: &str| {
            until(PATIENCE, "a save", || {
                (repo.head_paths().contains(&format!("probe{n}.txt"))).then_some(())
            });
            repo.head_paths().contains(&name.to_owned())
        };
        (!saved(&format!("probe{n}.swp"))).then_some(())
    });
}

/// After an overflow the watches are reconciled by inode as well as by name: a renamed
/// directory (whose inode inotify already watches under the old name) and two swapped ones
/// keep live watches under their new names.
#[test]
fn directories_renamed_during_an_overflow_stay_watched() {
    let repo = Repo::new();
    repo.write("one/a.txt", "a");
    repo.write("two/b.txt", "b");
    repo.write("three/c.txt", "c");
    let mut config = repo.config();
    // One buffered event: every read of more than one event overflows and rescans, and a
    // rename alone makes three (moved from, moved to, the directory's own move).
    config.event_buffer = 1;
    let daemon = Daemon::start(&repo, config);
    let before = daemon.overflow_rescans();
    fs::rename(repo.path("one"), repo.path("renamed")).unwrap();
    fs::rename(repo.path("two"), repo.path("swap")).unwrap();
    fs::rename(repo.path("three"), repo.path("two")).unwrap();
    fs::rename(repo.path("swap"), repo.path("three")).unwrap();
    for i in 0..30 {
        repo.write(&format!("noise/{i}"), "overflow");
    }
    repo.wait_saved();
    assert!(
        daemon.overflow_rescans() > before,
        "the renames were never handled by an overflow rescan:\n{}",
        daemon.logs()
    );
    // Edits inside the moved directories must be seen live, not at the next full pass.
    repo.write("renamed/new.txt", "new");
    repo.write("two/new.txt", "new");
    repo.write("three/new.txt", "new");
    until(PATIENCE, "edits in renamed directories", || {
        let paths = repo.head_paths();
        ["renamed/new.txt", "two/new.txt", "three/new.txt"]
            .iter()
            .all(|p| paths.contains(&(*p).to_owned()))
            .then_some(())
    });
    repo.wait_saved();
}

/// The usual homes of secrets besides `.env` are never saved, even when tracked; the manifest
/// lists their names so a restore asks for them; templates are saved.
#[test]
fn env_local_and_production_files_stay_out_and_their_names_are_listed() {
    let repo = Repo::new();
    repo.write(".env.production", "TRACKED_BEFORE=1\n");
    repo.git(&["add", "-f", ".env.production"]);
    repo.git(&["commit", "-qm", "a secret committed by hand"]);
    repo.write(".env.local", "LOCAL_KEY=local-secret-value\n");
    repo.write("app/.env.development.local", "NESTED=nested-secret\n");
    repo.write(".env.example", "LOCAL_KEY=\n");
    let _daemon = Daemon::start(&repo, repo.config());
    until(PATIENCE, "the template saved", || {
        repo.head_paths()
            .contains(&".env.example".to_owned())
            .then_some(())
    });
    let paths = repo.head_paths();
    for secret in [
        ".env.local",
        ".env.production",
        "app/.env.development.local",
    ] {
        assert!(!paths.contains(&secret.to_owned()), "{secret}: {paths:?}");
    }
    let manifest = repo.git(&["show", "HEAD:shmastra.json"]);
    assert!(manifest.contains("\"env_files\""), "{manifest}");
    assert!(
        manifest.contains("\".env.local\": [\n      \"LOCAL_KEY\""),
        "{manifest}"
    );
    assert!(manifest.contains("TRACKED_BEFORE"), "{manifest}");
    assert!(!manifest.contains("secret-value"), "{manifest}");
    // A new name in one of them reaches the manifest live.
    repo.write(".env.local", "LOCAL_KEY=x\nADDED_LATER=y\n");
    until(PATIENCE, "the new name in the manifest", || {
        repo.git(&["show", "HEAD:shmastra.json"])
            .contains("ADDED_LATER")
            .then_some(())
    });
    let exclude = fs::read_to_string(repo.path(".git/info/exclude")).unwrap();
    assert!(exclude.lines().any(|l| l == ".env.*"), "{exclude}");
}

/// Content git converts with what libgit2 does not run: a clean filter driver (how git-lfs
/// works) and `working-tree-encoding`. The watcher has git hash those paths.
#[test]
fn clean_filters_and_working_tree_encoding_are_applied_as_git_applies_them() {
    let (repo, _d) = check("filters", |repo| {
        repo.git(&["config", "filter.upper.clean", "tr a-z A-Z"]);
        repo.git(&["config", "filter.upper.smudge", "cat"]);
        repo.git(&["config", "filter.upper.required", "true"]);
        repo.write(
            ".gitattributes",
            "*.up filter=upper\n*.u16 text working-tree-encoding=UTF-16LE\n",
        );
        repo.write("shout.up", "quiet words\n");
        let utf16: Vec<u8> = "héllo\n"
            .encode_utf16()
            .flat_map(u16::to_le_bytes)
            .collect();
        fs::write(repo.path("wide.u16"), utf16).unwrap();
    });
    assert_eq!(repo.git(&["show", "HEAD:shout.up"]), "QUIET WORDS\n");
    assert_eq!(repo.git(&["show", "HEAD:wide.u16"]), "héllo\n");
    repo.write("shout.up", "live edit\n");
    until(PATIENCE, "the live edit, filtered", || {
        (repo.git(&["show", "HEAD:shout.up"]) == "LIVE EDIT\n").then_some(())
    });
}
