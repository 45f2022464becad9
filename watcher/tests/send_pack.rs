//! The watcher's push against real git: its receive-pack client with `git http-backend` behind
//! testkit's server, and the in-process push to a path remote. After every push the bare
//! remote must pass `git fsck --full` and hold the local tree; the pack of a one-file save at a deep path must hold exactly the commit, the trees on
//! the path and the blob (read back from the pack the remote kept, with `git show-index`).

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use git2::Oid;
use project_watcher::push::push_once;
use project_watcher::remote::RemoteSettings;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use testkit::git::{command, git, git_output, init_repo};
use testkit::git_server::GitServer;

const MAIN: &str = "refs/heads/main";

/// A work repository whose `project` remote is a bare repository behind `git http-backend`.
struct World {
    _tmp: tempfile::TempDir,
    _server: Option<GitServer>,
    bare: PathBuf,
    work: PathBuf,
    settings: RemoteSettings,
}

impl World {
    fn new() -> Self {
        project_watcher::transport::init(Duration::from_secs(5));
        let tmp = tempfile::tempdir().unwrap();
        let server = GitServer::start(&tmp.path().join("srv"));
        let bare = server.create_bare("r.git");
        let url = server.url("r.git");
        Self::with_url(tmp, Some(server), bare, &url)
    }

    /// The same, with the bare repository's path as the remote (pushed in process).
    fn path() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let bare = tmp.path().join("plain.git");
        testkit::git::init_bare(&bare);
        let url = bare.to_str().unwrap().to_owned();
        Self::with_url(tmp, None, bare, &url)
    }

    /// Both kinds of remote: over `git http-backend`, and a path.
    fn each() -> [Self; 2] {
        [Self::new(), Self::path()]
    }

    fn with_url(
        tmp: tempfile::TempDir,
        server: Option<GitServer>,
        bare: PathBuf,
        url: &str,
    ) -> Self {
        let work = tmp.path().join("work");
        init_repo(&work);
        git(&work, ["remote", "add", "project", url]);
        let settings = RemoteSettings {
            workdir: work.clone(),
            remote: "project".into(),
            branch: "main".into(),
            token: None,
        };
        Self {
            _tmp: tmp,
            _server: server,
            bare,
            work,
            settings,
        }
    }

    fn write(&self, path: &str, contents: &str) {
        let path = self.work.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, contents).unwrap();
    }

    fn commit(&self, message: &str) -> Oid {
        git(&self.work, ["add", "-A"]);
        git(&self.work, ["commit", "-q", "--allow-empty", "-m", message]);
        self.head()
    }

    fn head(&self) -> Oid {
        Oid::from_str(git(&self.work, ["rev-parse", "HEAD"]).trim()).unwrap()
    }

    fn push_to(&self, dst: &str) -> Result<(), String> {
        push_once(&self.settings, self.head(), dst)
    }

    fn push(&self) {
        self.push_to(MAIN).expect("the push lands");
        self.assert_remote_holds(MAIN);
    }

    /// The remote passes `git fsck --full`, `dst` is the local head, and its tree is the
    /// local one.
    fn assert_remote_holds(&self, dst: &str) {
        let fsck = git_output(&self.bare, ["fsck", "--full", "--no-dangling"]);
        assert!(
            fsck.status.success(),
            "git fsck in the remote: {}{}",
            String::from_utf8_lossy(&fsck.stdout),
            String::from_utf8_lossy(&fsck.stderr)
        );
        let remote = git(&self.bare, ["rev-parse", dst]);
        assert_eq!(
            remote.trim(),
            self.head().to_string(),
            "{dst} on the remote"
        );
        assert_eq!(
            git(&self.bare, ["rev-parse", &format!("{dst}^{{tree}}")]),
            git(&self.work, ["rev-parse", "HEAD^{tree}"]),
            "the remote's tree"
        );
    }

    /// From now on the remote keeps every pack it receives as it came (no unpacking into
    /// loose objects), so a push's objects can be read back.
    fn keep_packs(&self) {
        git(&self.bare, ["config", "receive.unpackLimit", "1"]);
        git(&self.bare, ["config", "transfer.unpackLimit", "1"]);
    }

    fn pack_indexes(&self) -> BTreeSet<PathBuf> {
        std::fs::read_dir(self.bare.join("objects/pack"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "idx"))
            .collect()
    }

    /// Pushes and returns the ids of the objects the push left on the remote: those of the one
    /// pack it added (read with `git show-index`), or of the loose objects it added.
    fn push_and_read_sent(&self) -> BTreeSet<String> {
        let (packs, loose) = (self.pack_indexes(), self.loose_objects());
        self.push();
        let new: Vec<_> = self.pack_indexes().difference(&packs).cloned().collect();
        let new_loose: BTreeSet<String> =
            self.loose_objects().difference(&loose).cloned().collect();
        if new.is_empty() {
            return new_loose;
        }
        assert_eq!(new.len(), 1, "one pack per push: {new:?}");
        assert!(new_loose.is_empty(), "a pack or loose objects, not both");
        let out = command(&self.bare)
            .arg("show-index")
            .stdin(std::fs::File::open(&new[0]).unwrap())
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| l.split(' ').nth(1).expect("offset oid crc").to_owned())
            .collect()
    }

    /// The ids of the remote's loose objects.
    fn loose_objects(&self) -> BTreeSet<String> {
        let mut ids = BTreeSet::new();
        for dir in std::fs::read_dir(self.bare.join("objects")).unwrap() {
            let dir = dir.unwrap();
            let name = dir.file_name().to_string_lossy().into_owned();
            if name.len() != 2 {
                continue;
            }
            for file in std::fs::read_dir(dir.path()).unwrap() {
                ids.insert(format!(
                    "{name}{}",
                    file.unwrap().file_name().to_string_lossy()
                ));
            }
        }
        ids
    }

    fn rev(&self, rev: &str) -> String {
        git(&self.work, ["rev-parse", rev]).trim().to_owned()
    }
}

#[test]
fn a_first_push_to_an_empty_remote_sends_the_whole_tree() {
    for w in World::each() {
        w.write("README.md", "hello\n");
        w.write("src/app/main.ts", "console.log(1)\n");
        w.write("src/app/util/deep/x.ts", "export {}\n");
        w.write("empty-ish/.gitkeep", "");
        w.commit("first");
        w.push();
    }
}

#[test]
fn a_one_file_save_at_a_deep_path_sends_the_commit_the_trees_on_the_path_and_one_blob() {
    one_deep_edit_sends_exactly_the_path(&World::new());
}

/// A path remote is pushed in process: the same objects are written into it, and its hooks
/// do not run (a pre-receive hook that refuses everything is not consulted), as with libgit2's
/// local transport. Objects loose here are linked; objects packed here go loose below the
/// remote's unpack limit and as one pack above it.
#[test]
fn a_path_remote_gets_the_same_minimal_objects_in_process_and_runs_no_hook() {
    let w = World::path();
    let hook = w.bare.join("hooks/pre-receive");
    std::fs::write(&hook, "#!/bin/sh\ntouch hook-ran\nexit 1\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    one_deep_edit_sends_exactly_the_path(&w);
    assert!(!w.bare.join("hook-ran").exists(), "no hook ran");

    let pack_here = || {
        git(&w.work, ["repack", "-adq"]);
        git(&w.work, ["prune-packed", "-q"]);
    };
    // Packed here, fewer than the remote's unpack limit (git's default, 100): loose there.
    git(&w.bare, ["config", "--unset", "receive.unpackLimit"]);
    git(&w.bare, ["config", "--unset", "transfer.unpackLimit"]);
    w.write("a/b/c/d/f8.txt", "edited too\n");
    w.commit("edit again");
    pack_here();
    let packs = w.pack_indexes();
    let sent = w.push_and_read_sent();
    assert_eq!(w.pack_indexes(), packs, "no new pack");
    let expected: BTreeSet<String> = [
        "HEAD",
        "HEAD^{tree}",
        "HEAD:a",
        "HEAD:a/b",
        "HEAD:a/b/c",
        "HEAD:a/b/c/d",
        "HEAD:a/b/c/d/f8.txt",
    ]
    .iter()
    .map(|r| w.rev(r))
    .collect();
    assert_eq!(
        sent, expected,
        "exactly the commit, 5 trees and 1 blob, loose"
    );

    // Packed here, more than the limit: one pack there, holding them all.
    for i in 0..120 {
        w.write(&format!("many/m{i}.txt"), &format!("many {i}\n"));
    }
    w.commit("many");
    pack_here();
    let sent = w.push_and_read_sent();
    assert_eq!(w.pack_indexes().len(), packs.len() + 1, "one new pack");
    assert_eq!(sent.len(), 123, "the commit, 2 trees and 120 blobs");
    assert!(sent.contains(&w.rev("HEAD:many/m119.txt")));
}

/// As `git receive-pack` (`receive.denyCurrentBranch`), the branch a non-bare remote has
/// checked out is not moved under its working tree; another branch is.
#[test]
fn a_non_bare_path_remote_keeps_its_checked_out_branch() {
    let tmp = tempfile::tempdir().unwrap();
    let other = tmp.path().join("other");
    init_repo(&other);
    std::fs::write(other.join("x.txt"), "theirs\n").unwrap();
    git(&other, ["add", "-A"]);
    git(&other, ["commit", "-q", "-m", "theirs"]);
    let theirs = git(&other, ["rev-parse", "main"]);
    let url = other.to_str().unwrap().to_owned();
    let w = World::with_url(tmp, None, other.clone(), &url);
    w.write("a.txt", "a\n");
    w.commit("ours");
    let error = w.push_to("refs/heads/main").unwrap_err();
    assert!(error.contains("branch is currently checked out"), "{error}");
    assert_eq!(git(&other, ["rev-parse", "main"]), theirs, "main untouched");
    w.push_to("refs/heads/side")
        .expect("another branch may move");
    assert_eq!(
        git(&other, ["rev-parse", "side"]).trim(),
        w.head().to_string()
    );
    let fsck = git_output(&other, ["fsck", "--full", "--no-dangling"]);
    assert!(
        fsck.status.success(),
        "{}",
        String::from_utf8_lossy(&fsck.stderr)
    );
}

#[test]
fn a_path_that_is_not_a_repository_is_a_clear_failure() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("nowhere.git");
    let url = missing.to_str().unwrap().to_owned();
    let w = World::with_url(tmp, None, missing.clone(), &url);
    w.write("a.txt", "a\n");
    w.commit("first");
    let error = w.push_to(MAIN).unwrap_err();
    assert!(
        error.contains("does not appear to be a git repository"),
        "{error}"
    );
    assert!(!missing.exists(), "nothing was created there");
}

fn one_deep_edit_sends_exactly_the_path(w: &World) {
    for i in 0..20 {
        w.write(&format!("a/b/c/d/f{i}.txt"), &format!("{i}\n"));
        w.write(&format!("a/side{i}/g.txt"), &format!("{i}\n"));
        w.write(&format!("top{i}.txt"), &format!("{i}\n"));
    }
    w.commit("first");
    w.push();
    w.keep_packs();

    w.write("a/b/c/d/f7.txt", "edited\n");
    w.commit("edit");
    let sent = w.push_and_read_sent();
    let expected: BTreeSet<String> = [
        "HEAD",
        "HEAD^{tree}",
        "HEAD:a",
        "HEAD:a/b",
        "HEAD:a/b/c",
        "HEAD:a/b/c/d",
        "HEAD:a/b/c/d/f7.txt",
    ]
    .iter()
    .map(|r| w.rev(r))
    .collect();
    assert_eq!(sent, expected, "exactly the commit, 5 trees and 1 blob");
}

#[test]
fn adds_deletes_renames_and_a_mode_change_arrive_intact() {
    for w in World::each() {
        w.write("keep/one.txt", "1\n");
        w.write("keep/two.txt", "2\n");
        w.write("gone/three.txt", "3\n");
        w.write("run.sh", "#!/bin/sh\n");
        w.commit("first");
        w.push();

        w.write("keep/new/four.txt", "4\n");
        std::fs::remove_dir_all(w.work.join("gone")).unwrap();
        std::fs::rename(w.work.join("keep/two.txt"), w.work.join("moved-two.txt")).unwrap();
        w.commit("add, delete, rename");
        w.push();

        use std::os::unix::fs::PermissionsExt as _;
        let script = w.work.join("run.sh");
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        w.commit("mode");
        w.push();
        assert!(
            git(&w.bare, ["ls-tree", "main", "run.sh"]).starts_with("100755 blob"),
            "the mode reached the remote"
        );
    }
}

#[test]
fn a_new_submodule_gitlink_is_pushed_without_its_commit() {
    for w in World::each() {
        w.write("a.txt", "a\n");
        w.commit("first");
        w.push();
        // A gitlink names a commit of another repository, which this one does not have.
        let foreign = "1234567890abcdef1234567890abcdef12345678";
        git(
            &w.work,
            [
                "update-index",
                "--add",
                "--cacheinfo",
                &format!("160000,{foreign},vendor/lib"),
            ],
        );
        git(&w.work, ["commit", "-q", "-m", "submodule"]);
        w.push();
        assert!(
            git(&w.bare, ["ls-tree", "main", "vendor/lib"])
                .starts_with(&format!("160000 commit {foreign}")),
        );
    }
}

#[test]
fn commits_made_while_the_remote_was_unreachable_go_in_one_push() {
    for w in World::each() {
        w.write("a.txt", "a\n");
        w.commit("first");
        w.push();
        w.keep_packs();
        let mut expected_commits = BTreeSet::new();
        for i in 0..4 {
            w.write(&format!("dir{i}/f.txt"), &format!("{i}\n"));
            w.commit(&format!("offline {i}"));
            expected_commits.insert(w.rev("HEAD"));
        }
        let sent = w.push_and_read_sent();
        assert!(
            expected_commits.is_subset(&sent),
            "every commit in one pack"
        );
        assert_eq!(
            git(&w.bare, ["rev-list", "--count", "main"]).trim(),
            "5",
            "the whole history is on the remote"
        );
    }
}

#[test]
fn a_remote_that_moved_on_is_not_overwritten_and_the_recovery_branch_is_complete() {
    for w in World::each() {
        w.write("a.txt", "a\n");
        w.commit("first");
        w.push();
        // Someone else pushes to main.
        let other = w.work.parent().unwrap().join("other");
        git(
            w.work.parent().unwrap(),
            ["clone", "-q", w.bare.to_str().unwrap(), "other"],
        );
        std::fs::write(other.join("b.txt"), "theirs\n").unwrap();
        git(&other, ["add", "-A"]);
        git(
            &other,
            [
                "-c",
                "user.name=o",
                "-c",
                "user.email=o@o",
                "commit",
                "-q",
                "-m",
                "theirs",
            ],
        );
        git(&other, ["push", "-q", "origin", "main"]);
        let theirs = git(&w.bare, ["rev-parse", "main"]);

        w.write("c/d.txt", "ours\n");
        w.commit("ours");
        let error = w.push_to(MAIN).unwrap_err();
        assert!(error.contains("non-fast-forward"), "{error}");
        assert_eq!(
            git(&w.bare, ["rev-parse", "main"]),
            theirs,
            "main untouched"
        );

        let recovery = "refs/heads/recovery/20261130T120000Z";
        w.push_to(recovery).expect("the recovery push lands");
        w.assert_remote_holds(recovery);
        assert_eq!(
            w.rev("refs/remotes/project/recovery/20261130T120000Z"),
            w.head().to_string(),
            "recorded through the remote's fetch refspec, as git push does"
        );
    }
}

#[test]
fn a_pre_receive_rejection_is_an_error_with_the_hooks_words_and_nothing_lands() {
    let w = World::new();
    w._server
        .as_ref()
        .unwrap()
        .install_pre_receive_reject("r.git", "over quota");
    w.write("a.txt", "a\n");
    w.commit("first");
    let error = w.push_to(MAIN).unwrap_err();
    assert!(error.contains("pre-receive hook declined"), "{error}");
    assert!(error.contains("over quota"), "{error}");
    assert!(
        !git_output(&w.bare, ["rev-parse", "--verify", "-q", "main"])
            .status
            .success()
    );
}

/// A one-shot HTTP server: answers the advertisement with a real-looking ref list and the
/// push with `response` (pkt-lines), after reading the whole chunked request body.
fn scripted_receive_pack(response: Vec<u8>) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/r.git", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming().take(2) {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut head = String::new();
            while reader.read_line(&mut head).is_ok_and(|n| n > 2) {}
            let (kind, body) = if head.starts_with("GET") {
                let mut body = pkt(b"# service=git-receive-pack\n");
                body.extend(b"0000");
                body.extend(pkt(
                    b"0000000000000000000000000000000000000000 capabilities^{}\0report-status side-band-64k quiet agent=git/2\n",
                ));
                body.extend(b"0000");
                ("advertisement", body)
            } else {
                let mut seen = Vec::new();
                let mut byte = [0u8; 1];
                while !seen.ends_with(b"0\r\n\r\n") && reader.read(&mut byte).is_ok_and(|n| n == 1)
                {
                    seen.push(byte[0]);
                }
                ("result", response.clone())
            };
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: application/x-git-receive-pack-{kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(&body);
        }
    });
    url
}

fn pkt(payload: &[u8]) -> Vec<u8> {
    git_wire::pkt_line::encode(payload)
}

fn band(n: u8, payload: &[u8]) -> Vec<u8> {
    pkt(&[&[n][..], payload].concat())
}

fn scripted_world(response: Vec<u8>) -> World {
    project_watcher::transport::init(Duration::from_secs(5));
    let tmp = tempfile::tempdir().unwrap();
    let url = scripted_receive_pack(response);
    let bare = tmp.path().join("unused");
    let w = World::with_url(tmp, None, bare, &url);
    w.write("a.txt", "a\n");
    w.commit("first");
    w
}

#[test]
fn side_band_progress_is_skipped_and_the_report_inside_band_one_is_read() {
    let report = [
        pkt(b"unpack ok\n"),
        pkt(b"ok refs/heads/main\n"),
        b"0000".to_vec(),
    ]
    .concat();
    let mut response = band(2, b"Resolving deltas: 100% (3/3)\r");
    for piece in report.chunks(5) {
        response.extend(band(1, piece));
    }
    response.extend(b"0000");
    let w = scripted_world(response);
    w.push_to(MAIN).expect("the report says ok");
    assert_eq!(w.rev("refs/remotes/project/main"), w.head().to_string());
}

#[test]
fn a_fatal_error_on_band_three_fails_the_push_with_the_servers_words() {
    let response = [
        band(2, b"remote: checking\n"),
        band(3, b"fatal: the disk is full\n"),
    ]
    .concat();
    let w = scripted_world(response);
    let error = w.push_to(MAIN).unwrap_err();
    assert!(error.contains("the disk is full"), "{error}");
    assert!(
        !git_output(
            &w.work,
            ["rev-parse", "--verify", "-q", "refs/remotes/project/main"]
        )
        .status
        .success(),
        "a failed push is not recorded"
    );
}

#[test]
fn a_report_that_ends_early_is_a_network_failure_not_a_success() {
    let w = scripted_world(band(1, &pkt(b"unpack ok\n")));
    let error = w.push_to(MAIN).unwrap_err();
    assert!(error.contains("before its report"), "{error}");
}

/// One step of a generated session.
#[derive(Debug, Clone)]
enum Step {
    Write(usize, u8),
    Delete(usize),
    Chmod(usize),
    Commit,
    Push,
}

/// Paths at several depths; none is a prefix directory of another's file.
const PATHS: [&str; 8] = [
    "a.txt",
    "src/main.ts",
    "src/lib/util.ts",
    "src/lib/deep/er/x.ts",
    "src/lib/deep/er/y.ts",
    "docs/guide/intro.md",
    "docs/guide/more.md",
    "z/z/z/z/z.txt",
];

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0..PATHS.len(), any::<u8>()).prop_map(|(p, c)| Step::Write(p, c)),
        1 => (0..PATHS.len()).prop_map(Step::Delete),
        1 => (0..PATHS.len()).prop_map(Step::Chmod),
        2 => Just(Step::Commit),
        2 => Just(Step::Push),
    ]
}

#[test]
fn generated_edit_commit_push_sessions_leave_a_complete_remote_with_the_local_tree() {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let checked = std::cell::Cell::new(0u32);
    let started = std::cell::Cell::new(0u32);
    runner
        .run(&prop::collection::vec(step(), 1..14), |steps| {
            // Cases alternate between a remote over HTTP and a path remote.
            let w = if started.replace(started.get() + 1).is_multiple_of(2) {
                World::new()
            } else {
                World::path()
            };
            let mut pushes = 0;
            for step in steps.iter().chain([Step::Commit, Step::Push].iter()) {
                match step {
                    Step::Write(p, c) => w.write(PATHS[*p], &format!("{c}\n")),
                    Step::Delete(p) => {
                        let _ = std::fs::remove_file(w.work.join(PATHS[*p]));
                    }
                    Step::Chmod(p) => {
                        use std::os::unix::fs::PermissionsExt as _;
                        let path = w.work.join(PATHS[*p]);
                        if let Ok(meta) = std::fs::metadata(&path) {
                            let mode = meta.permissions().mode() ^ 0o111;
                            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                                .unwrap();
                        }
                    }
                    Step::Commit => {
                        w.commit("step");
                    }
                    Step::Push => {
                        if git_output(&w.work, ["rev-parse", "--verify", "-q", "HEAD"])
                            .status
                            .success()
                        {
                            w.push_to(MAIN).map_err(TestCaseError::fail)?;
                            w.assert_remote_holds(MAIN);
                            pushes += 1;
                        }
                    }
                }
            }
            prop_assert!(pushes >= 1);
            checked.set(checked.get() + 1);
            Ok(())
        })
        .unwrap();
    assert_eq!(checked.get(), cases, "every case reached its checks");
}
