//! Issue 24's reproductions, each over a path remote (pushed in process) and over
//! `git http-backend`: histories whose saves repeat earlier content. The oracle is git on the
//! remote: `git fsck --full --strict` clean and a fresh clone (through upload-pack, never the
//! local shortcut) whose tree is the local `HEAD`'s.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use project_watcher::status::{FailureKind, State};
use testkit::git::{git, git_output, init_bare, init_repo};
use testkit::git_server::GitServer;

/// A project and the bare repository its `project` remote is (or will be).
struct Setup {
    tmp: tempfile::TempDir,
    work: PathBuf,
    bare: PathBuf,
    url: String,
    _server: Option<GitServer>,
}

#[derive(Debug, Clone, Copy)]
enum Transport {
    Path,
    Http,
}

impl Setup {
    fn new(transport: Transport) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let work = tmp.path().join("project");
        init_repo(&work);
        let (bare, url, server) = match transport {
            Transport::Path => {
                let bare = tmp.path().join("remote.git");
                init_bare(&bare);
                let url = bare.to_str().unwrap().to_owned();
                (bare, url, None)
            }
            Transport::Http => {
                let server = GitServer::start(&tmp.path().join("srv"));
                let bare = server.create_bare("user.git");
                (bare, server.url("user.git"), Some(server))
            }
        };
        Self {
            tmp,
            work,
            bare,
            url,
            _server: server,
        }
    }

    fn add_remote(&self) {
        git(&self.work, ["remote", "add", "project", &self.url]);
    }

    fn write(&self, rel: &str, body: &str) {
        let path = self.work.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, body).unwrap();
    }

    fn run(&self, args: &[&str]) -> Output {
        let home = self.tmp.path().join("home");
        std::fs::create_dir_all(&home).unwrap();
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_project-watcher"));
        for (k, v) in testkit::git::hermetic_env(&home) {
            cmd.env(k, v);
        }
        cmd.env_remove("PROJECT_DIR")
            .env_remove("PROJECT_TOKEN")
            .env_remove("PROJECT_REMOTE")
            .env_remove("PROJECT_BRANCH")
            .current_dir(&self.work)
            .args(args)
            .output()
            .unwrap()
    }

    /// `project-watcher once` (extra flags after it), which must succeed with its first pack:
    /// no refusal for missing objects on the way.
    fn once(&self, extra: &[&str]) {
        let out = self.run(&[&["once", "--log-format", "json"], extra].concat());
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "once {extra:?} failed: {said}");
        assert!(
            !said.contains("missing objects"),
            "once {extra:?} needed a larger pack: {said}"
        );
    }

    fn head(&self) -> String {
        git(&self.work, ["rev-parse", "HEAD"]).trim().to_owned()
    }

    /// The remote's `main` is the local `HEAD`, the remote passes `git fsck --full --strict`
    /// and a fresh clone of it (through upload-pack) checks out the local `HEAD`'s tree.
    fn assert_whole(&self) {
        assert_remote_whole(&self.bare, &self.work, "main");
        assert_eq!(
            git(&self.bare, ["rev-parse", "main"]).trim(),
            self.head(),
            "the remote's main"
        );
    }
}

/// `git fsck --full --strict` on `bare` is clean, and a fresh `file://` clone of `branch`
/// holds `work`'s `branch` tree.
fn assert_remote_whole(bare: &Path, work: &Path, branch: &str) {
    let fsck = git_output(bare, ["fsck", "--full", "--strict", "--no-progress"]);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&fsck.stdout),
        String::from_utf8_lossy(&fsck.stderr)
    );
    assert!(
        fsck.status.success() && !said.contains("missing") && !said.contains("broken"),
        "git fsck on the remote:\n{said}"
    );
    let clone_parent = tempfile::tempdir().unwrap();
    let clone = git_output(
        clone_parent.path(),
        [
            "clone",
            "-q",
            "--no-local",
            "-b",
            branch,
            &format!("file://{}", bare.display()),
            "c",
        ],
    );
    assert!(
        clone.status.success(),
        "a fresh clone of the remote: {}",
        String::from_utf8_lossy(&clone.stderr)
    );
    assert_eq!(
        git(&clone_parent.path().join("c"), ["rev-parse", "HEAD^{tree}"]),
        git(work, ["rev-parse", &format!("{branch}^{{tree}}")]),
        "the clone's tree"
    );
}

const BOTH: [Transport; 2] = [Transport::Path, Transport::Http];

/// No remote: a save, a change, the change undone (the third save's tree is the first's);
/// then a remote, and one push of the three.
#[test]
fn saves_that_return_to_the_first_tree_reach_a_new_remote_whole() {
    for transport in BOTH {
        let s = Setup::new(transport);
        s.write("f.txt", "a\n");
        s.write("src/deep/other.txt", "unchanged\n");
        s.once(&[]);
        s.write("f.txt", "b\n");
        s.once(&[]);
        s.write("f.txt", "a\n");
        s.once(&[]);
        s.add_remote();
        s.once(&[]);
        s.assert_whole();
    }
}

/// A save pushed (f = a, src/g = g1), then one the remote does not get (f = b, src/g = g2).
fn pushed_then_one_save(transport: Transport) -> Setup {
    let s = Setup::new(transport);
    s.add_remote();
    s.write("f.txt", "a\n");
    s.write("src/g.txt", "g1\n");
    s.once(&[]);
    s.assert_whole();
    s.write("f.txt", "b\n");
    s.write("src/g.txt", "g2\n");
    s.once(&["--no-push"]);
    s
}

/// A remote that is up to date, then three saves it does not get (b, c, b: the third's tree
/// is the first's), then one push of the three.
#[test]
fn three_unpushed_saves_b_c_b_reach_an_up_to_date_remote_whole() {
    for transport in BOTH {
        let s = pushed_then_one_save(transport);
        s.write("f.txt", "c\n");
        s.once(&["--no-push"]);
        s.write("f.txt", "b\n");
        s.once(&["--no-push"]);
        s.once(&[]);
        s.assert_whole();
    }
}

/// `restore --at` an earlier unpushed save: its commit's tree is that save's.
#[test]
fn a_restore_at_an_earlier_save_reaches_the_remote_whole() {
    for transport in BOTH {
        let s = pushed_then_one_save(transport);
        let b = s.head();
        s.write("f.txt", "c\n");
        s.once(&["--no-push"]);
        let out = s.run(&["restore", "--at", &b]);
        assert!(
            out.status.success(),
            "restore --at: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        s.once(&[]);
        s.assert_whole();
    }
}

/// Deletes the loose object `id` from the bare repository `bare`.
fn delete_object(bare: &Path, id: &str) {
    let id = id.trim();
    std::fs::remove_file(bare.join("objects").join(&id[..2]).join(&id[2..])).unwrap();
}

/// A remote over `git http-backend` that genuinely lacks objects its `main` reaches (a
/// folder's tree and a file in it, as the old push left them out). The watcher's next push
/// needs them: receive-pack refuses it (`missing necessary objects`), the status says so in
/// words, and the next attempts send larger packs until the remote is whole. Neither its
/// changes nor the full pack `git push` sends can do it (both take the remote's tip as
/// complete); every object of the branch does.
#[test]
fn an_http_remote_missing_objects_refuses_the_push_the_status_says_why_and_the_watcher_heals_it() {
    let s = Setup::new(Transport::Http);
    s.add_remote();
    git(&s.bare, ["config", "receive.unpackLimit", "100000"]);
    s.write("f.txt", "f\n");
    s.write("d/x.txt", "x1\n");
    s.write("d/y.txt", "y\n");
    s.once(&[]);
    s.assert_whole();
    delete_object(&s.bare, &git(&s.work, ["rev-parse", "HEAD:d"]));
    delete_object(&s.bare, &git(&s.work, ["rev-parse", "HEAD:d/y.txt"]));
    assert!(
        !git_output(&s.bare, ["fsck", "--full"]).status.success(),
        "the remote is incomplete"
    );

    s.write("d/x.txt", "x2\n");
    let home = s.tmp.path().join("home");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_project-watcher"));
    for (k, v) in testkit::git::hermetic_env(&home) {
        cmd.env(k, v);
    }
    let watcher = cmd
        .env_remove("PROJECT_TOKEN")
        .current_dir(&s.work)
        .args([
            "watch",
            "--debounce",
            "50ms",
            "--max-delay",
            "1s",
            "--log-format",
            "json",
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let git_dir = s.work.join(".git");
    let mut said = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(status) = project_watcher::status::read(&git_dir) {
            if let Some(error) = &status.last_push_error
                && !said.contains(error)
            {
                assert_eq!(
                    status.last_push_failure,
                    Some(FailureKind::MissingObjects),
                    "{error}"
                );
                assert_eq!(status.state, State::Backoff);
                said.push(error.clone());
            }
            if status.state == State::Idle
                && status.unpushed_commits == 0
                && git(&s.bare, ["rev-parse", "main"]).trim() == s.head()
            {
                break;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the watcher did not heal the remote; statuses said {said:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = std::process::Command::new("kill")
        .args(["-INT", &watcher.id().to_string()])
        .status();
    let out = watcher.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(said.len(), 2, "{said:?}\n{log}");
    assert!(
        said[0].starts_with("the remote refused the push: missing objects; sending a full pack ("),
        "{}",
        said[0]
    );
    assert!(said[0].contains("missing necessary objects"), "{}", said[0]);
    assert!(
        said[1].starts_with(
            "the remote refused the push: missing objects; sending every object of the branch ("
        ),
        "{}",
        said[1]
    );
    assert!(
        log.matches("the remote refused the push: missing objects")
            .count()
            >= 2,
        "a warning names the cause each time: {log}"
    );
    s.assert_whole();
}

/// A path remote an earlier version left incomplete (a blob its `main` reaches is gone) is
/// made whole when a watcher starts, with nothing to push and history untouched; the tips it
/// verified are recorded, so the next start walks nothing.
#[test]
fn a_path_remote_left_incomplete_is_repaired_when_the_watcher_starts() {
    let s = Setup::new(Transport::Path);
    s.add_remote();
    git(&s.bare, ["config", "receive.unpackLimit", "100000"]);
    s.write("f.txt", "f\n");
    s.write("d/y.txt", "y\n");
    s.once(&["--no-push"]);
    // Pushed by git (no record of a verified tip, as from an earlier version), then a blob
    // lost.
    git(&s.work, ["push", "-q", "project", "main"]);
    let before = git(&s.bare, ["rev-parse", "main"]);
    delete_object(&s.bare, &git(&s.work, ["rev-parse", "HEAD:d/y.txt"]));
    assert!(!git_output(&s.bare, ["fsck", "--full"]).status.success());

    let out = s.run(&["once", "--log-format", "json"]);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(
        log.contains("the remote lacked objects its refs reach"),
        "the repair is named: {log}"
    );
    s.assert_whole();
    assert_eq!(
        git(&s.bare, ["rev-parse", "main"]),
        before,
        "history untouched"
    );
    let record = std::fs::read_to_string(s.work.join(".git/project-watcher/remote-verified"))
        .expect("the verified tips are recorded");
    assert!(record.contains(before.trim()), "{record}");

    s.once(&[]);
    s.assert_whole();
}
