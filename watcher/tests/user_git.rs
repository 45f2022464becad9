//! The user's own git while `watch` runs (issue 25): merges, rebases, cherry-picks, reverts,
//! `am`, bisect and stashes stopped and continued or aborted, commits whose editor waits,
//! branch switches, a detached `HEAD`, index edits, all interleaved with file edits.
//!
//! The oracle is a twin: a copy of the project that no watcher watches, where the same user
//! commands run, plus the watcher's saves. After each step both settle and must agree on
//! what git knows: the operation under way (git's markers), `HEAD`, the branches, the stash,
//! and the index entry by entry. While git is in the middle of something (the twin has a
//! marker, unmerged paths or a detached `HEAD`) the watcher is `paused` and has written
//! nothing. Otherwise the watcher's new saves are checked against the twin's `git add -A`
//! (run on the twin's index, which is the user's as git left it), and the twin takes them
//! over (`git update-ref HEAD`), so that both go on from the same state; the checked-out
//! branch's remote branch then holds the save.
//!
//! `USER_GIT_CASES` cases (default 3) of `USER_GIT_STEPS` steps (default 14), seeded from
//! `RELIABILITY_SEED`. Each case goes through the operation kinds in its own order, so that
//! every kind is reached; the counts of the cases reaching each kind, and stopping in one
//! half way, are printed and asserted.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use project_watcher::status::{State, Status};
use support::{PATIENCE, Project, Rng, knob, report};
use testkit::git::{hermetic_env, tree_of_add_all_from};
use testkit::wait::{until, until_seen};

/// git's markers of an operation stopped half way.
const MARKERS: &[&str] = &[
    "MERGE_HEAD",
    "CHERRY_PICK_HEAD",
    "REVERT_HEAD",
    "BISECT_LOG",
    "rebase-merge",
    "rebase-apply",
    "sequencer",
];

/// The commands that write a commit with an editor the tests keep open.
const EDITOR_COMMITS: &[&[&str]] = &[
    &["commit"],
    &["commit", "-a"],
    &["commit", "--amend"],
    &["merge", "-e", "--no-ff", "side"],
];

/// The kinds of git operation a case goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Merge,
    Rebase,
    RebaseEdit,
    RebaseExec,
    CherryPick,
    Revert,
    Am,
    Bisect,
    Stash,
    CommitEditor,
    Branch,
    Detach,
    IndexEdit,
    Commit,
    ForcePush,
    Worktree,
}

const KINDS: &[Kind] = &[
    Kind::Merge,
    Kind::Rebase,
    Kind::RebaseEdit,
    Kind::RebaseExec,
    Kind::CherryPick,
    Kind::Revert,
    Kind::Am,
    Kind::Bisect,
    Kind::Stash,
    Kind::CommitEditor,
    Kind::Branch,
    Kind::Detach,
    Kind::IndexEdit,
    Kind::Commit,
    Kind::ForcePush,
    Kind::Worktree,
];

/// The watched project, its twin, and what both run with.
struct Twin {
    project: Project,
    plain: PathBuf,
    patch: PathBuf,
    editor: PathBuf,
    home: PathBuf,
    watcher: Option<support::Watcher>,
    /// Names given to new branches and files.
    serial: u32,
}

/// The state git keeps, as the two repositories are compared.
#[derive(Debug, PartialEq, Eq)]
struct GitState {
    head: String,
    commit: String,
    refs: String,
    index: String,
    markers: Vec<&'static str>,
}

impl Twin {
    fn new(root: &Path) -> Self {
        let project = Project::local(root);
        let w = project.work.clone();
        let twin = Self {
            plain: root.join("plain"),
            patch: root.join("other.patch"),
            editor: root.join("editor.sh"),
            home: project.home.clone(),
            project,
            watcher: None,
            serial: 0,
        };
        fs::write(
            &twin.editor,
            "#!/bin/sh\n# The message, then wait for the test to let the commit go on.\n\
             printf 'edited message\\n' > \"$1\"\n: > \"$EDITOR_STARTED\"\n\
             while [ ! -e \"$EDITOR_RELEASE\" ]; do sleep 0.05; done\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&twin.editor, fs::Permissions::from_mode(0o755)).unwrap();
        // A history with branches that conflict (other: a.txt) and that do not (side: b.txt).
        let write = |rel: &str, body: &str| {
            let path = w.join(rel);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, body).unwrap();
        };
        write("a.txt", "base\n");
        write("b.txt", "b\n");
        write("dir/c.txt", "c\n");
        for args in [
            &["add", "-A"][..],
            &["commit", "-qm", "base"],
            &["checkout", "-qb", "other"],
        ] {
            twin.ok(&w, args);
        }
        write("a.txt", "other\n");
        write("o.txt", "o\n");
        for args in [
            &["add", "-A"][..],
            &["commit", "-qm", "other"],
            &["checkout", "-q", "main"],
        ] {
            twin.ok(&w, args);
        }
        write("a.txt", "main\n");
        for args in [
            &["commit", "-qam", "main"][..],
            &["checkout", "-qb", "side"],
        ] {
            twin.ok(&w, args);
        }
        write("b.txt", "side\n");
        for args in [&["commit", "-qam", "side"][..], &["checkout", "-q", "main"]] {
            twin.ok(&w, args);
        }
        let patch = twin.ok(&w, &["format-patch", "-1", "other", "--stdout"]);
        fs::write(&twin.patch, patch.stdout).unwrap();
        twin
    }

    /// Starts the watcher, waits for its first save and push, then makes the twin.
    fn start(&mut self) {
        self.watcher = Some(self.project.start(&[], &[]));
        self.settle_saved();
        let out = Command::new("cp")
            .arg("-a")
            .arg(&self.project.work)
            .arg(&self.plain)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        // The watcher's objects, whatever it writes later, are the twin's too.
        fs::write(
            self.plain.join(".git/objects/info/alternates"),
            format!("{}\n", self.project.work.join(".git/objects").display()),
        )
        .unwrap();
        assert_eq!(self.state(&self.plain), self.state(&self.project.work));
    }

    fn command(&self, dir: &Path) -> Command {
        let mut cmd = Command::new("git");
        cmd.current_dir(dir);
        for (k, v) in hermetic_env(&self.home) {
            cmd.env(k, v);
        }
        cmd.env_remove("GIT_DIR")
            .env_remove("GIT_WORK_TREE")
            .env("GIT_AUTHOR_DATE", "@1767225600 +0000")
            .env("GIT_COMMITTER_DATE", "@1767225600 +0000")
            .env("GIT_EDITOR", "true")
            .env("GIT_SEQUENCE_EDITOR", "true")
            .env("GIT_MERGE_AUTOEDIT", "no")
            .stdin(Stdio::null());
        cmd
    }

    fn run(&self, dir: &Path, args: &[&str]) -> Output {
        self.command(dir).args(args).output().expect("git runs")
    }

    fn ok(&self, dir: &Path, args: &[&str]) -> Output {
        let out = self.run(dir, args);
        assert!(
            out.status.success(),
            "git {args:?} in {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    fn text(&self, dir: &Path, args: &[&str]) -> String {
        String::from_utf8_lossy(&self.run(dir, args).stdout).into_owned()
    }

    /// The same user command in both; both must end alike (git decides the same way).
    fn both(&self, args: &[&str]) {
        let w = self.run(&self.project.work, args);
        let p = self.run(&self.plain, args);
        assert_eq!(
            w.status.code(),
            p.status.code(),
            "git {args:?} ended otherwise with a watcher:\nwatched: {}\nplain: {}",
            String::from_utf8_lossy(&w.stderr),
            String::from_utf8_lossy(&p.stderr)
        );
    }

    /// The same file written in both.
    fn write_both(&self, rel: &str, body: &str) {
        for dir in [&self.project.work, &self.plain] {
            fs::write(dir.join(rel), body).unwrap();
        }
    }

    /// The same file edit in both: a file changed, made or deleted.
    fn edit(&mut self, rng: &mut Rng) {
        self.serial += 1;
        let files = ["a.txt", "b.txt", "dir/c.txt", "o.txt"];
        let file = files[rng.below(files.len() as u64) as usize];
        let action = rng.below(4);
        // A removal of a file that is not there would be no edit at all.
        let remove = action == 0 && self.project.work.join(file).exists();
        for dir in [self.project.work.clone(), self.plain.clone()] {
            match action {
                0 if remove => {
                    let _ = fs::remove_file(dir.join(file));
                }
                1 => fs::write(dir.join(format!("new{}.txt", self.serial)), "new\n").unwrap(),
                _ => {
                    let path = dir.join(file);
                    fs::create_dir_all(path.parent().unwrap()).unwrap();
                    fs::write(path, format!("edit {}\n", self.serial)).unwrap();
                }
            }
        }
    }

    fn markers(dir: &Path) -> Vec<&'static str> {
        MARKERS
            .iter()
            .copied()
            .filter(|m| dir.join(".git").join(m).exists())
            .collect()
    }

    fn state(&self, dir: &Path) -> GitState {
        GitState {
            head: self.text(dir, &["symbolic-ref", "-q", "HEAD"]),
            commit: self.text(dir, &["rev-parse", "-q", "--verify", "HEAD"]),
            refs: self.text(
                dir,
                &[
                    "for-each-ref",
                    "--format=%(refname) %(objectname)",
                    "refs/heads",
                    "refs/tags",
                    "refs/stash",
                ],
            ),
            index: self.text(dir, &["ls-files", "-s"]),
            markers: Self::markers(dir),
        }
    }

    /// Both sides' history and status, for a failure's message.
    fn describe(&self) -> String {
        let mut out = String::new();
        for (name, dir) in [("watched", &self.project.work), ("plain", &self.plain)] {
            if !dir.exists() {
                continue;
            }
            out += &format!(
                "--- {name}\n{}{}",
                self.text(dir, &["log", "--oneline", "--graph", "-6", "--all"]),
                self.text(dir, &["status", "--porcelain", "--branch"])
            );
        }
        out
    }

    /// Why the twin says the watcher must be paused, if it must.
    fn expected_pause(&self) -> Option<String> {
        let markers = Self::markers(&self.plain);
        if !markers.is_empty() {
            return Some(format!("{markers:?}"));
        }
        if !self.text(&self.plain, &["ls-files", "-u"]).is_empty() {
            return Some("unmerged paths".into());
        }
        if !self
            .run(&self.plain, &["symbolic-ref", "-q", "HEAD"])
            .status
            .success()
        {
            return Some("detached".into());
        }
        None
    }

    fn status(&self) -> Option<Status> {
        self.project.status()
    }

    /// Waits until the watcher is idle with HEAD holding the twin's `git add -A` and the index
    /// being that `git add -A`'s (the watcher is a `git add -A; git commit` run at each change
    /// of the files or of the user's index), pushed to the remote branch of the checked-out
    /// branch; then the twin takes the saves over.
    fn settle_saved(&self) {
        let w = &self.project.work;
        let plain = self.plain.exists().then(|| self.plain.clone());
        if let Some(p) = &plain {
            if !p.join("shmastra.json").exists() {
                // The watcher keeps its manifest: one the user's git removed is written again.
                fs::write(
                    p.join("shmastra.json"),
                    shmastra_contract::Manifest::default().to_json(),
                )
                .unwrap();
            }
            self.ok(p, &["add", "-A"]);
        }
        until_seen(PATIENCE, "the watcher idle, saved and pushed", || {
            let (expected, index) = match &plain {
                Some(p) => (
                    self.text(p, &["write-tree"]),
                    Some(self.text(p, &["ls-files", "-s"])),
                ),
                None => (tree_of_add_all_from(w, Some(&w.join(".git/index"))), None),
            };
            let head_tree = testkit::git::tree_of(w, "HEAD");
            let watched_index = self.text(w, &["ls-files", "-s"]);
            let branch = self.text(w, &["symbolic-ref", "-q", "--short", "HEAD"]);
            let local = self.text(w, &["rev-parse", "-q", "--verify", "HEAD"]);
            let remote = self.text(
                &self.project.bare,
                &[
                    "rev-parse",
                    "-q",
                    "--verify",
                    &format!("refs/heads/{}", branch.trim()),
                ],
            );
            // A branch the user rewrote (rebase, amend, reset) cannot be pushed without force:
            // its saves are on the recovery branch the status names instead.
            let recovery = |s: &Status| {
                s.recovery_ref
                    .as_deref()
                    .map(|r| self.text(&self.project.bare, &["rev-parse", "-q", "--verify", r]))
            };
            match self.status() {
                Some(s)
                    if head_tree.as_deref() == Some(expected.trim())
                        && index.as_ref().is_none_or(|i| *i == watched_index)
                        && ((s.state == State::Idle && remote == local)
                            || (s.state == State::Diverged
                                && recovery(&s).as_deref() == Some(local.as_str()))) =>
                {
                    Ok(())
                }
                s => Err(format!(
                    "status {:?}\nHEAD's tree {head_tree:?}, git add -A {expected}\nremote {remote}local {local}index {}\n{}",
                    s.map(|s| (s.state, s.paused_reason)),
                    if index.as_ref().is_none_or(|i| *i == watched_index) {
                        "as git add -A's"
                    } else {
                        "unlike git add -A's"
                    },
                    self.describe()
                )),
            }
        });
        if let Some(p) = &plain {
            let head = self.text(w, &["rev-parse", "HEAD"]);
            let before = self.text(p, &["rev-parse", "HEAD"]);
            if head != before {
                // Every commit the watcher added is an autosave, on top of the twin's HEAD.
                let added = self.text(
                    w,
                    &[
                        "rev-list",
                        "--first-parent",
                        &format!("{}..HEAD", before.trim()),
                    ],
                );
                for commit in added.lines() {
                    let message = self.text(w, &["log", "-1", "--format=%B", commit]);
                    assert!(
                        message.contains("Save-kind: autosave"),
                        "a commit that is no autosave appeared: {message}"
                    );
                }
                self.ok(p, &["update-ref", "HEAD", head.trim()]);
            }
            assert_eq!(self.state(w), self.state(p), "after the watcher's saves");
        }
    }

    /// Waits until the watcher says it is paused, and checks it wrote nothing.
    fn settle_paused(&self, why: &str) {
        let status = until_seen(PATIENCE, "the watcher paused", || match self.status() {
            Some(s) if s.state == State::Paused && s.paused_reason.is_some() => Ok(s),
            s => Err(s.map(|s| (s.state, s.last_error))),
        });
        // Stays paused (no save slips in a moment later).
        std::thread::sleep(Duration::from_millis(300));
        let again = self.status().expect("a status");
        assert_eq!(again.state, State::Paused, "{why}: {again:?}");
        assert_eq!(
            self.state(&self.project.work),
            self.state(&self.plain),
            "{why}: paused ({:?}), the watcher wrote nothing",
            status.paused_reason
        );
    }

    fn settle(&self) {
        match self.expected_pause() {
            Some(why) => self.settle_paused(&why),
            None => self.settle_saved(),
        }
    }

    /// A command that writes a commit (`commit`, `commit -a`, `commit --amend`, `merge -e`)
    /// whose editor waits while files change: the watcher must not commit underneath, nor
    /// remove git's `index.lock` though it is old. With `measure`, the watcher's CPU time
    /// while it waits for the editor is reported (it looks at `/proc` once a second then: a
    /// process ending shows in no file event).
    fn commit_with_waiting_editor(&mut self, rng: &mut Rng, args: &[&str], measure: bool) {
        let w = self.project.work.clone();
        let started = self.project.root.join(format!("started{}", self.serial));
        let release = self.project.root.join(format!("release{}", self.serial));
        let all = args.contains(&"-a");
        let head_before = self.text(&w, &["rev-parse", "HEAD"]);
        let mut child: Child = self
            .command(&w)
            .args(args)
            .env("GIT_EDITOR", &self.editor)
            .env("EDITOR_STARTED", &started)
            .env("EDITOR_RELEASE", &release)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let editing = until(PATIENCE, "the editor to open (or git to refuse)", || {
            if started.exists() {
                return Some(true);
            }
            child.try_wait().unwrap().map(|_| false)
        });
        // The twin's commit is the same: made now, before the edits below.
        let mut plain_args = args.to_vec();
        plain_args.extend(["-m", "edited message"]);
        let plain = self.run(&self.plain, &plain_args);
        if !editing {
            let out = child.wait_with_output().unwrap();
            assert_eq!(
                out.status.code(),
                plain.status.code(),
                "{:?}",
                String::from_utf8_lossy(&out.stderr)
            );
            return;
        }
        self.edit(rng);
        let lock = w.join(".git/index.lock");
        if lock.exists() {
            // Older than the watcher's 60 s for a lock left behind by a dead process.
            let aged = Command::new("touch")
                .args(["-d", "2 minutes ago"])
                .arg(&lock)
                .status()
                .unwrap();
            assert!(aged.success());
        }
        let status = until_seen(
            PATIENCE,
            "the watcher paused by the commit",
            || match self.status() {
                Some(s) if s.state == State::Paused => Ok(s),
                s => Err(s.map(|s| s.state)),
            },
        );
        if measure {
            let cpu = self
                .watcher
                .as_ref()
                .unwrap()
                .cpu_over(Duration::from_secs(10));
            report(
                "user-git",
                &format!("cpu_10s_while_git_waits_for_its_editor={cpu:.2}s (git {args:?})"),
            );
            assert!(
                cpu < 0.5,
                "{cpu} s of CPU in 10 s while paused on a git command"
            );
        } else {
            std::thread::sleep(Duration::from_millis(1500));
        }
        assert_eq!(
            self.text(&w, &["rev-parse", "HEAD"]),
            head_before,
            "no save under the open editor ({:?})",
            status.paused_reason
        );
        if args[0] == "commit" {
            assert_eq!(
                lock.exists(),
                all,
                "git's index.lock is kept while git runs"
            );
        }
        fs::write(&release, "").unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success() && plain.status.success(),
            "the user's commit went through: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Resolves every conflict as the twin's `git add -A` would, then continues.
    fn go_on(&self) {
        let markers = Self::markers(&self.plain);
        self.both(&["add", "-A"]);
        let args: &[&str] = match markers.first().copied() {
            Some("MERGE_HEAD") => &["commit", "-q", "--no-edit"],
            Some("rebase-merge") => &["rebase", "--continue"],
            Some("rebase-apply") if self.plain.join(".git/rebase-apply/applying").exists() => {
                &["am", "--continue"]
            }
            Some("rebase-apply") => &["rebase", "--continue"],
            Some("CHERRY_PICK_HEAD") | Some("sequencer") => &["cherry-pick", "--continue"],
            Some("REVERT_HEAD") => &["revert", "--continue"],
            Some("BISECT_LOG") => &["bisect", "good"],
            // Back on the branch, the edits made on the detached HEAD carried along (git
            // refuses when they would be overwritten).
            _ if self.expected_pause().as_deref() == Some("detached") => {
                &["checkout", "-q", "main"]
            }
            _ => &["reset", "-q"],
        };
        self.both(args);
    }

    /// Stopped in a rebase with nothing to resolve (an `edit` stop): the user amends the
    /// commit there, as `rebase -i` + `edit` is for; otherwise [`Self::go_on`].
    fn amend_or_go_on(&self) {
        let rebasing = Self::markers(&self.plain).first() == Some(&"rebase-merge");
        if rebasing && self.text(&self.plain, &["ls-files", "-u"]).is_empty() {
            self.both(&["commit", "-q", "-a", "--amend", "--no-edit"]);
        } else {
            self.go_on();
        }
    }

    fn abort(&self) {
        let markers = Self::markers(&self.plain);
        let args: &[&str] = match markers.first().copied() {
            Some("MERGE_HEAD") => &["merge", "--abort"],
            Some("rebase-merge") => &["rebase", "--abort"],
            Some("rebase-apply") if self.plain.join(".git/rebase-apply/applying").exists() => {
                &["am", "--abort"]
            }
            Some("rebase-apply") => &["rebase", "--abort"],
            Some("CHERRY_PICK_HEAD") | Some("sequencer") => &["cherry-pick", "--abort"],
            Some("REVERT_HEAD") => &["revert", "--abort"],
            Some("BISECT_LOG") => &["bisect", "reset"],
            _ if self.expected_pause().as_deref() == Some("detached") => {
                &["checkout", "-q", "-f", "main"]
            }
            _ => &["reset", "-q", "--hard"],
        };
        self.both(args);
    }

    /// What a user does when the abort itself is refused (`merge --abort` with a file edited
    /// since: "Entry 'o.txt' not uptodate. Cannot merge"): forgets the operation and drops the
    /// edits.
    fn quit(&self) {
        let markers = Self::markers(&self.plain);
        let args: &[&str] = match markers.first().copied() {
            Some("rebase-apply") if self.plain.join(".git/rebase-apply/applying").exists() => {
                &["am", "--quit"]
            }
            Some("rebase-merge") | Some("rebase-apply") => &["rebase", "--quit"],
            Some("CHERRY_PICK_HEAD") | Some("REVERT_HEAD") | Some("sequencer") => {
                &["cherry-pick", "--quit"]
            }
            Some("BISECT_LOG") => &["bisect", "reset"],
            _ if self.expected_pause().as_deref() == Some("detached") => {
                &["checkout", "-q", "-f", "main"]
            }
            _ => &[],
        };
        if !args.is_empty() {
            self.both(args);
        }
        self.both(&["reset", "-q", "--hard"]);
    }

    /// Starts one operation of `kind` in both.
    fn operate(&mut self, kind: Kind, rng: &mut Rng) {
        self.serial += 1;
        let branch = format!("feature{}", self.serial);
        let patch = self.patch.display().to_string();
        match kind {
            Kind::Merge => self.both(&["merge", "-q", ["other", "side"][rng.below(2) as usize]]),
            Kind::Rebase => self.both(&["rebase", "-q", ["other", "side"][rng.below(2) as usize]]),
            Kind::RebaseEdit => {
                let w = self.project.work.clone();
                for dir in [w, self.plain.clone()] {
                    let _ = self
                        .command(&dir)
                        .args(["rebase", "-q", "-i", "HEAD~2"])
                        .env("GIT_SEQUENCE_EDITOR", "sed -i 1s/^pick/edit/")
                        .output()
                        .unwrap();
                }
            }
            // Its test writes a report into the working tree and takes a while: nothing of it is
            // saved while the rebase runs (the report would be committed on the detached HEAD
            // under the rebase, which then stops on an index it did not make).
            Kind::RebaseExec => self.both(&[
                "rebase",
                "-q",
                "--exec",
                "echo run >> report.txt; sleep 0.3",
                "HEAD~2",
            ]),
            Kind::CherryPick => {
                self.both(&["cherry-pick", ["other", "side"][rng.below(2) as usize]])
            }
            Kind::Revert => self.both(&[
                "revert",
                "--no-edit",
                ["HEAD", "HEAD~1"][rng.below(2) as usize],
            ]),
            Kind::Am => self.both(&["am", "-q", "-3", &patch]),
            Kind::Bisect => {
                self.both(&["bisect", "start", "HEAD", "HEAD~2"]);
                for dir in [self.project.work.clone(), self.plain.clone()] {
                    fs::write(dir.join("bisect-notes.txt"), "scratch\n").unwrap();
                }
            }
            Kind::Stash => {
                if self.text(&self.plain, &["stash", "list"]).is_empty() {
                    self.edit(rng);
                    self.both(&["stash", "-q"]);
                    self.edit(rng);
                } else {
                    self.both(&["stash", "pop", "-q"]);
                }
            }
            Kind::CommitEditor => {
                let args = EDITOR_COMMITS[rng.below(EDITOR_COMMITS.len() as u64) as usize];
                self.commit_with_waiting_editor(rng, args, false);
            }
            Kind::Branch => match rng.below(3) {
                0 => self.both(&["checkout", "-q", "-b", &branch]),
                1 => self.both(&["checkout", "-q", "main"]),
                _ => self.both(&["checkout", "-q", "side"]),
            },
            Kind::Detach => self.both(&[
                "checkout",
                "-q",
                "--detach",
                ["HEAD", "HEAD~1"][rng.below(2) as usize],
            ]),
            Kind::IndexEdit => match rng.below(4) {
                0 => self.both(&["reset", "-q", "HEAD~1"]),
                1 => self.both(&["rm", "-q", "--cached", "b.txt"]),
                2 => self.both(&["add", "a.txt"]),
                _ => self.both(&["reset", "-q"]),
            },
            Kind::Commit => self.both(&["commit", "-qam", "a user commit"]),
            // The user rewrites the branch and makes the remote what they have: the watcher's
            // divergence (its push of the rewritten branch is no fast-forward) ends by itself.
            Kind::ForcePush => {
                self.both(&["reset", "-q", "--hard", "HEAD~1"]);
                let branch = self.text(
                    &self.project.work,
                    &["symbolic-ref", "-q", "--short", "HEAD"],
                );
                if !branch.trim().is_empty() {
                    let refspec = format!("HEAD:refs/heads/{}", branch.trim());
                    self.ok(
                        &self.project.work,
                        &["push", "-q", "-f", "project", &refspec],
                    );
                }
            }
            // A linked worktree of the repository, its own branch committed to there: none of
            // it is the watched worktree's to save, and the watcher goes on.
            Kind::Worktree => {
                for (dir, side) in [(self.project.work.clone(), "w"), (self.plain.clone(), "p")] {
                    let linked = self
                        .project
                        .root
                        .join(format!("linked-{side}-{}", self.serial));
                    let linked = linked.to_str().unwrap();
                    self.ok(&dir, &["worktree", "add", "-q", "-b", &branch, linked]);
                    fs::write(Path::new(linked).join("a.txt"), "in the linked worktree\n").unwrap();
                    // a.txt may be untracked (the watcher saved its deletion) or ignored there.
                    self.ok(Path::new(linked), &["add", "-A"]);
                    self.ok(
                        Path::new(linked),
                        &["commit", "-q", "--allow-empty", "-m", "linked"],
                    );
                    self.ok(&dir, &["worktree", "remove", "--force", linked]);
                }
            }
        }
    }
}

#[test]
fn the_users_git_is_never_saved_into_and_what_it_leaves_is_saved_as_git_add_all() {
    let cases = knob("USER_GIT_CASES", 3);
    let steps = knob("USER_GIT_STEPS", 14);
    let mut rng = Rng::from_env("user-git");
    let mut reached: BTreeMap<Kind, u64> = BTreeMap::new();
    let mut stopped: BTreeMap<Kind, u64> = BTreeMap::new();
    let mut paused_steps = 0u64;
    // Every kind in a shuffled order, going on from case to case: every kind is reached once
    // the cases have made as many operations.
    let mut order: Vec<Kind> = KINDS.to_vec();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut next = order.into_iter().cycle();
    let mut operations = 0u64;
    for case in 0..cases {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_owned();
        if std::env::var_os("USER_GIT_KEEP").is_some() {
            eprintln!("user-git case {case} in {}", root.display());
            let _ = tmp.keep();
        }
        let mut twin = Twin::new(&root);
        twin.start();
        let (mut seen, mut halted) = (BTreeSet::new(), BTreeSet::new());
        let mut last = Kind::Commit;
        for step in 0..steps {
            if twin.expected_pause().is_some() {
                match rng.below(4) {
                    0 => twin.edit(&mut rng),
                    1 => twin.go_on(),
                    2 => twin.amend_or_go_on(),
                    _ => twin.abort(),
                }
            } else if rng.below(3) == 0 {
                twin.edit(&mut rng);
            } else {
                last = next.next().unwrap();
                operations += 1;
                seen.insert(last);
                eprintln!("user-git case {case}: {last:?} (step {step})");
                twin.operate(last, &mut rng);
                if twin.expected_pause().is_some() {
                    halted.insert(last);
                }
            }
            if twin.expected_pause().is_some() {
                paused_steps += 1;
            }
            twin.settle();
        }
        // The case ends with git done: the watcher saves what it left.
        for attempt in 0..6 {
            if twin.expected_pause().is_none() {
                break;
            }
            if attempt < 3 {
                twin.abort();
            } else {
                twin.quit();
            }
            twin.settle();
        }
        assert!(twin.expected_pause().is_none(), "{last:?} never ended");
        twin.project.assert_fsck_clean();
        let (exit, logs) = twin.watcher.take().unwrap().stop();
        assert!(exit.success(), "{logs}");
        for kind in seen {
            *reached.entry(kind).or_default() += 1;
        }
        for kind in halted {
            *stopped.entry(kind).or_default() += 1;
        }
    }
    let describe = |counts: &BTreeMap<Kind, u64>| {
        counts
            .iter()
            .map(|(k, n)| format!("{k:?}={n}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    report(
        "user-git",
        &format!(
            "cases={cases} steps={steps} paused_steps={paused_steps} reached: {} stopped: {}",
            describe(&reached),
            describe(&stopped)
        ),
    );
    // Measured: 7 to 21 of 42 steps in 31 runs, 4 of them below one in five (the pauses are
    // the operations that stop and the steps a user takes before going on); one in ten is
    // below every run seen.
    let total_steps = cases * steps;
    assert!(
        paused_steps * 10 >= total_steps,
        "too few steps with git in the middle of something: {paused_steps} of {total_steps}"
    );
    if operations >= KINDS.len() as u64 {
        for kind in KINDS {
            assert!(
                reached.contains_key(kind),
                "no case reached {kind:?}: {reached:?}"
            );
        }
    }
    let stops: u64 = stopped.values().sum();
    assert!(
        stops * 3 >= cases,
        "too few operations stopped half way: {}",
        describe(&stopped)
    );
}

/// The twin of a fresh project, started.
fn started(root: &Path) -> Twin {
    let mut twin = Twin::new(root);
    twin.start();
    twin
}

#[test]
fn a_commit_whose_editor_waits_is_neither_broken_nor_robbed_of_its_lock() {
    let tmp = tempfile::tempdir().unwrap();
    let mut twin = started(tmp.path());
    let mut rng = Rng::from_env("user-git-editor");
    for (n, args) in EDITOR_COMMITS.iter().enumerate() {
        if args[0] == "commit" && args.len() == 1 {
            // Something staged for the plain commit (and a change it leaves out).
            twin.write_both(&format!("staged{n}.txt"), "staged\n");
            twin.both(&["add", "-A"]);
        }
        twin.write_both("a.txt", &format!("edit {n}\n"));
        twin.commit_with_waiting_editor(&mut rng, args, *args == ["commit", "-a"]);
        twin.settle();
    }
    let (exit, logs) = twin.watcher.take().unwrap().stop();
    assert!(exit.success(), "{logs}");
    assert!(!logs.contains("removed a stale git lock file"), "{logs}");
}

#[test]
fn a_stopped_merge_is_paused_once_and_saved_after_its_abort_and_its_commit() {
    let tmp = tempfile::tempdir().unwrap();
    let mut twin = started(tmp.path());
    for end in ["--abort", "commit"] {
        twin.both(&["merge", "-q", "other"]);
        assert_eq!(
            Twin::markers(&twin.plain),
            ["MERGE_HEAD"],
            "the merge stopped"
        );
        twin.settle();
        let status = twin.status().unwrap();
        assert_eq!(status.paused_reason.as_deref(), Some("merge in progress"));
        // A file the merge does not touch (an edit of one it does makes `--abort` refuse).
        twin.write_both(&format!("during-{end}.txt"), "written during the merge\n");
        twin.settle();
        if end == "--abort" {
            // Paused, the watcher waits for git's markers to change, on no timer.
            assert_never_woken(&twin, "a stopped merge");
        }
        match end {
            "--abort" => twin.both(&["merge", "--abort"]),
            _ => {
                twin.both(&["add", "-A"]);
                twin.both(&["commit", "-q", "--no-edit"]);
            }
        }
        assert_eq!(twin.expected_pause(), None, "the merge ended ({end})");
        twin.settle();
    }
    let (exit, logs) = twin.watcher.take().unwrap().stop();
    assert!(exit.success(), "{logs}");
    assert_eq!(
        logs.matches("paused: merge in progress").count(),
        2,
        "{logs}"
    );
}

#[test]
fn on_a_detached_head_nothing_is_saved_and_the_status_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let mut twin = started(tmp.path());
    let mut rng = Rng::from_env("user-git-detached");
    twin.both(&["checkout", "-q", "--detach", "HEAD~1"]);
    twin.edit(&mut rng);
    twin.settle();
    let status = twin.status().unwrap();
    assert_eq!(status.branch, None);
    assert!(
        status
            .paused_reason
            .as_deref()
            .is_some_and(|r| r.contains("detached")),
        "{status:?}"
    );
    let shown = Command::new(env!("CARGO_BIN_EXE_project-watcher"))
        .args(["status", "--dir"])
        .arg(&twin.project.work)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(
        text.contains("state:            paused: HEAD is detached"),
        "{text}"
    );
    twin.both(&["checkout", "-q", "-f", "main"]);
    twin.settle();
    let (exit, logs) = twin.watcher.take().unwrap().stop();
    assert!(exit.success(), "{logs}");
}

#[test]
fn a_branch_s_saves_go_to_its_own_remote_branch_and_history_names_it() {
    let tmp = tempfile::tempdir().unwrap();
    let mut twin = started(tmp.path());
    let mut rng = Rng::from_env("user-git-branches");
    let main_before = twin.text(&twin.project.bare, &["rev-parse", "refs/heads/main"]);
    twin.both(&["checkout", "-q", "-b", "feature"]);
    twin.edit(&mut rng);
    twin.settle();
    assert_eq!(
        twin.text(&twin.project.bare, &["rev-parse", "refs/heads/main"]),
        main_before,
        "feature's saves never reach the remote main"
    );
    assert_eq!(twin.status().unwrap().branch.as_deref(), Some("feature"));
    let history = Command::new(env!("CARGO_BIN_EXE_project-watcher"))
        .args(["history", "--dir"])
        .arg(&twin.project.work)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&history.stdout);
    assert!(text.starts_with("branch feature\n"), "{text}");
    // Back on main: its own tip, already on the remote; no divergence, no recovery branch.
    twin.both(&["checkout", "-q", "main"]);
    twin.edit(&mut rng);
    twin.settle();
    let status = twin.status().unwrap();
    assert_eq!((status.state, status.recovery_ref), (State::Idle, None));
    let branches = twin.text(&twin.project.bare, &["for-each-ref", "--format=%(refname)"]);
    assert!(!branches.contains("recovery"), "{branches}");
    let (exit, logs) = twin.watcher.take().unwrap().stop();
    assert!(exit.success(), "{logs}");
}

#[test]
fn a_force_push_back_to_the_local_branch_ends_the_divergence_by_itself() {
    let tmp = tempfile::tempdir().unwrap();
    let project = Project::local(tmp.path());
    project.write("a.txt", "a\n");
    let watcher = project.start(&[], &[]);
    project.wait_pushed(PATIENCE);
    // Someone else pushes to main: the watcher's next save diverges.
    let laptop = tmp.path().join("laptop");
    let bare = project.bare.to_string_lossy().into_owned();
    let g = |dir: &Path, args: &[&str]| testkit::git::git(dir, args);
    g(tmp.path(), &["clone", "-q", &bare, "laptop"]);
    fs::write(laptop.join("theirs.txt"), "theirs\n").unwrap();
    g(&laptop, &["add", "-A"]);
    g(&laptop, &["commit", "-qm", "theirs"]);
    g(&laptop, &["push", "-q", "origin", "HEAD:main"]);
    project.write("b.txt", "b\n");
    project.wait_status("diverged", PATIENCE, |s| s.state == State::Diverged);
    // The user makes the remote what they have, as the issue does it.
    g(&project.work, &["push", "-q", "-f", "project", "main"]);
    let status = project.wait_status(
        "the divergence to end without a restart or a save",
        Duration::from_secs(60),
        |s| s.state == State::Idle && s.recovery_ref.is_none(),
    );
    assert_eq!(status.unpushed_commits, 0);
    project.write("c.txt", "c\n");
    project.wait_pushed(PATIENCE);
    let (exit, logs) = watcher.stop();
    assert!(exit.success(), "{logs}");
    project.assert_fsck_clean();
}

#[test]
fn a_linked_worktree_is_watched_and_saved_to_its_own_branch() {
    let tmp = tempfile::tempdir().unwrap();
    let project = Project::local(tmp.path());
    project.write("a.txt", "a\n");
    testkit::git::git(&project.work, ["add", "-A"]);
    testkit::git::git(&project.work, ["commit", "-qm", "start"]);
    let linked = tmp.path().join("linked");
    testkit::git::git(
        &project.work,
        [
            "worktree",
            "add",
            "-q",
            "-b",
            "wt",
            linked.to_str().unwrap(),
        ],
    );
    let linked_project = Project {
        root: tmp.path().join("linked-root"),
        work: linked.clone(),
        bare: project.bare.clone(),
        home: project.home.clone(),
        server: None,
    };
    fs::create_dir_all(&linked_project.root).unwrap();
    let watcher = linked_project.start(&[], &[]);
    fs::write(linked.join("b.txt"), "b\n").unwrap();
    // The first save at start may be done before `b.txt` is written: wait for the remote's.
    let on_remote = || {
        testkit::git::git_output(&project.bare, ["cat-file", "-e", "wt:b.txt"])
            .status
            .success()
    };
    let status = linked_project.wait_status("the linked worktree's save, pushed", PATIENCE, |s| {
        s.state == State::Idle && s.unpushed_commits == 0 && on_remote()
    });
    assert_eq!(status.branch.as_deref(), Some("wt"));
    let remote = testkit::git::git(&project.bare, ["show", "wt:b.txt"]);
    assert_eq!(remote, "b\n");
    assert!(
        !testkit::git::git_output(&project.bare, ["rev-parse", "--verify", "-q", "main"])
            .status
            .success(),
        "the main worktree's branch was not pushed by the linked one's watcher"
    );
    let (exit, logs) = watcher.stop();
    assert!(exit.success(), "{logs}");
}

/// An idle watcher: once what it did has settled (the blocking pool's threads end 10 s after
/// their last job), no timer wakes it for 10 s.
fn assert_never_woken(twin: &Twin, after: &str) {
    let watcher = twin.watcher.as_ref().unwrap();
    std::thread::sleep(Duration::from_secs(12));
    let wakeups = watcher.wakeups_over(Duration::from_secs(10));
    report(
        "user-git",
        &format!("idle_wakeups_10s={wakeups} after {after}"),
    );
    assert_eq!(wakeups, 0, "the idle watcher was woken {after}");
}

#[test]
fn an_index_edit_alone_is_saved_and_nothing_wakes_an_idle_watcher() {
    let tmp = tempfile::tempdir().unwrap();
    let mut twin = started(tmp.path());
    assert_never_woken(&twin, "its start");
    // The user's `git rm --cached` writes only the index: `git add -A` puts the file back,
    // and the watcher's index says so, with no file edited.
    twin.both(&["rm", "-q", "--cached", "b.txt"]);
    twin.settle();
    assert_never_woken(&twin, "an index edit and the index write it led to");
    let (exit, logs) = twin.watcher.take().unwrap().stop();
    assert!(exit.success(), "{logs}");
}

#[test]
fn the_watchers_own_index_write_is_no_change_to_save_again() {
    let tmp = tempfile::tempdir().unwrap();
    let project = Project::local(tmp.path());
    project.write("a.txt", "a\n");
    let watcher = project.start(&["--no-push"], &[]);
    project.wait_committed(&[], PATIENCE);
    for round in 0..6 {
        let before = project.status().and_then(|s| s.head);
        project.write(&format!("f{round}.txt"), "x\n");
        // The save writes the index before it moves HEAD; the event of that write is the
        // watcher's own, so no batch, no second save, no `pending` after it.
        let saved = project.wait_status("the save", PATIENCE, |s| {
            s.state == State::Idle && s.head.is_some() && s.head != before
        });
        let quiet = std::time::Instant::now() + Duration::from_millis(1500);
        while std::time::Instant::now() < quiet {
            let now = project.status().expect("a status");
            assert_eq!(
                (now.state, &now.head),
                (State::Idle, &saved.head),
                "round {round}: the watcher went on after its save"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let (exit, logs) = watcher.stop();
    assert!(exit.success(), "{logs}");
}

/// A git command holding `index.lock` when the watcher's deferred index write comes (a
/// `git status` refreshing the index, which an editor runs all the time) and ending without
/// writing it: the write is tried again, so the index ends as `git add -A`'s, not with the
/// file deleted and untracked. Each round, a `git rm --cached` that `git add -A` undoes
/// leaves the watcher's index unwritten (its marker says so) for the 2 s of quiet it waits;
/// the lock is made by hand then. Rounds whose write came first are counted and do not
/// reach the case.
#[test]
fn an_index_write_that_meets_a_git_lock_is_tried_again() {
    let tmp = tempfile::tempdir().unwrap();
    let project = Project::local(tmp.path());
    project.write("a.txt", "a\n");
    let watcher = project.start(&["--no-push"], &[]);
    project.wait_committed(&[], PATIENCE);
    let w = &project.work;
    let lock = w.join(".git/index.lock");
    let unwritten = w.join(".git/project-watcher/index-unwritten");
    let in_index = |name: &str| {
        let out = testkit::git::git_output(w, ["ls-files", "--", name]);
        !String::from_utf8_lossy(&out.stdout).trim().is_empty()
    };
    let (mut reached, rounds) = (0, 5);
    for round in 0..rounds {
        let before = project.status().and_then(|s| s.head);
        let name = format!("f{round}.txt");
        project.write(&name, "x\n");
        project.wait_status("the save", PATIENCE, |s| {
            s.state == State::Idle && s.head.is_some() && s.head != before
        });
        assert!(in_index(&name), "a save that moves HEAD writes the index");
        testkit::git::git(w, ["rm", "-q", "--cached", &name]);
        until(PATIENCE, "the save of the index edit", || {
            unwritten.exists().then_some(())
        });
        fs::write(&lock, "").unwrap();
        if in_index(&name) {
            // The write came before the lock.
            fs::remove_file(&lock).unwrap();
            continue;
        }
        reached += 1;
        // Past the watcher's quiet time: its write meets the lock.
        std::thread::sleep(Duration::from_secs(3));
        assert!(
            !in_index(&name),
            "round {round}: written through git's lock"
        );
        fs::remove_file(&lock).unwrap();
        until(PATIENCE, "the index written once the lock is gone", || {
            in_index(&name).then_some(())
        });
        let porcelain = testkit::git::git_output(w, ["status", "--porcelain"]);
        assert_eq!(
            String::from_utf8_lossy(&porcelain.stdout),
            "",
            "round {round}: git status after the save"
        );
    }
    report("user-git", &format!("index_lock_rounds={reached}/{rounds}"));
    assert!(
        reached * 2 >= rounds,
        "only {reached} of {rounds} rounds locked the index before the watcher's write"
    );
    let (exit, logs) = watcher.stop();
    assert!(exit.success(), "{logs}");
}
