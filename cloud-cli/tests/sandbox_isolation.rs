//! Sandboxes on one machine (`serve --sandboxes-dir`) attacked by the code they run (issue 27):
//! the real binary as root, the real watcher in each sandbox, a laptop push whose
//! `package.json` has a `preinstall` step that the sync's real `npm install` runs; and serve not
//! as root, where one sandboxes directory serves one user.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use testkit::git::git;
use testkit::wait::until;

use common::PATIENCE;
use common::page::{get, sign_in};
use common::workspace::{SECRET, Workspace};

/// What the preinstall step tries, as the user the sandbox runs as: the server's environment
/// (the signing secret) from `/proc`, another user's sandbox (their `PROJECT_TOKEN`), and the
/// upstream's repositories on the disk (`UPSTREAM`: serve's command line, which anyone may
/// read, names it).
const STEAL: &str = r#"out="$HOME/stolen"
{
  echo "uid $(id -u)"
  for f in /proc/[0-9]*/environ; do tr '\0' '\n' < "$f" 2>/dev/null; done | grep -a SHMASTRA_TOKEN_SECRET
  cat "$HOME/../bob/.project-watcher/.env" 2>&1
  ls -a "$HOME/../bob" 2>&1
  cat "UPSTREAM/bob.git/HEAD" 2>&1
  ls "UPSTREAM" 2>&1
  echo done
} > "$out" 2>&1
"#;

/// The uid the process in `pid_file` runs as.
fn uid_of(pid_file: &Path) -> u32 {
    let pid = std::fs::read_to_string(pid_file).expect("a pid file");
    let status = std::fs::read_to_string(format!("/proc/{}/status", pid.trim())).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("a Uid line")
}

/// A laptop push's `npm install` (its `preinstall`) ran as serve's own uid: it read
/// `SHMASTRA_TOKEN_SECRET` from `/proc/<serve>/environ` (and could mint any user's token), and
/// other users' `PROJECT_TOKEN`s from their sandboxes. As root, serve now runs each sandbox as a
/// uid of its own (its directory 0700 and owned by it), keeps its environment out of the
/// sandbox's commands, is not dumpable, and keeps the upstream's repositories 0700.
#[test]
fn sandbox_code_reads_neither_the_servers_secret_nor_another_users_sandbox() {
    let mut ws = Workspace::start(
        &[
            "--install-cmd",
            "npm install --offline --no-audit --no-fund",
        ],
        |_| {},
    );
    let mut cookies = Vec::new();
    for user in ["bob", "alice"] {
        let (cookie, _) = sign_in(&ws.link(user, "15m"));
        let home = ws.sandboxes.join(user);
        until(PATIENCE, &format!("{user}'s watcher"), || {
            let (_, _, page) = get(&ws.serve.url(&format!("/u/{user}")), Some(&cookie));
            (page.contains("data-state=\"ready\"") && home.join("watcher.pid").exists())
                .then_some(())
        });
        cookies.push(cookie);
    }
    let (alice, bob) = (ws.sandboxes.join("alice"), ws.sandboxes.join("bob"));
    let (alice_uid, bob_uid) = (
        uid_of(&alice.join("watcher.pid")),
        uid_of(&bob.join("watcher.pid")),
    );
    assert!(
        alice_uid != 0 && bob_uid != 0 && alice_uid != bob_uid,
        "{alice_uid} {bob_uid}"
    );
    for (home, uid) in [(&alice, alice_uid), (&bob, bob_uid)] {
        let meta = std::fs::metadata(home).expect("the home");
        assert_eq!(
            (meta.uid(), meta.mode() & 0o777),
            (uid, 0o700),
            "{}",
            home.display()
        );
    }
    let bob_env = std::fs::read_to_string(bob.join(".project-watcher/.env")).expect("bob's env");
    let bob_token = bob_env
        .lines()
        .find_map(|l| l.strip_prefix("PROJECT_TOKEN="))
        .expect("bob's token")
        .trim_matches(['\'', '"'])
        .to_owned();

    // The new sandbox's watcher saves `shmastra.json` first; the laptop clones after that.
    until(PATIENCE, "alice's first save", || {
        testkit::git::tree_of(&ws.upstream_repo("alice"), "main")
    });
    let laptop = tempfile::tempdir().expect("tempdir");
    ws.laptop("alice", laptop.path());
    let upstream = ws.upstream.display().to_string();
    std::fs::write(
        laptop.path().join("steal.sh"),
        STEAL.replace("UPSTREAM", &upstream),
    )
    .expect("steal.sh");
    std::fs::write(
        laptop.path().join("package.json"),
        r#"{"name": "app", "version": "1.0.0", "scripts": {"preinstall": "sh ./steal.sh"}}"#,
    )
    .expect("package.json");
    git(laptop.path(), ["add", "-A"]);
    git(laptop.path(), ["commit", "-qm", "a dependency"]);
    git(laptop.path(), ["push", "-q", "origin", "HEAD:main"]);

    let stolen = until(PATIENCE, "the preinstall step to run", || {
        std::fs::read_to_string(alice.join("stolen"))
            .ok()
            .filter(|s| s.contains("done"))
    });
    assert!(
        stolen.starts_with(&format!("uid {alice_uid}\n")),
        "{stolen}"
    );
    assert!(
        !stolen.contains(SECRET),
        "the signing secret leaked:\n{stolen}"
    );
    assert!(!stolen.contains("SHMASTRA_TOKEN_SECRET="), "{stolen}");
    assert!(
        !stolen.contains(&bob_token),
        "bob's token leaked:\n{stolen}"
    );
    assert!(
        !stolen.contains("ref: refs/heads"),
        "bob's repository was read:\n{stolen}"
    );
    assert!(
        !stolen.contains("alice.git"),
        "the upstream was listed:\n{stolen}"
    );
    for (home, uid) in [(&alice, alice_uid), (&bob, bob_uid)] {
        assert_eq!(
            not_owned_by(home, uid),
            Vec::<String>::new(),
            "{}",
            home.display()
        );
        let env = std::fs::metadata(home.join(".project-watcher/.env")).expect("the watcher's env");
        assert_eq!((env.uid(), env.mode() & 0o777), (uid, 0o600));
    }
    ws.stop();
}

/// What under `dir` (itself included) is not owned by `uid`: the template's copy and every
/// file serve wrote there (the watcher's `.env`, the restore marker) are the sandbox's own.
fn not_owned_by(dir: &Path, uid: u32) -> Vec<String> {
    let out = std::process::Command::new("find")
        .arg(dir)
        .args([
            "(",
            "!",
            "-uid",
            &uid.to_string(),
            "-o",
            "!",
            "-gid",
            &uid.to_string(),
            ")",
            "-print",
        ])
        .output()
        .expect("find");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The uid serve runs as in [`a_server_that_cannot_switch_uids_serves_one_user_and_says_why`].
const NOBODY: u32 = 65534;

/// What the one user's install step tries: the environment serve's commands hand it, and the
/// signing secret from `/proc` (serve runs as the same uid here).
const PEEK: &str = r#"{ echo "uid $(id -u)"; env; for f in /proc/[0-9]*/environ; do tr '\0' '\n' < "$f" 2>/dev/null; done | grep -a SHMASTRA_TOKEN_SECRET; echo done; } > "$HOME/peeked" 2>&1"#;

/// Not as root, serve cannot give a sandbox a uid of its own: the sandbox's code runs as serve's
/// user, so it inherited serve's environment (the token state's place, a `DATABASE_URL`) and,
/// were serve dumpable, could read the signing secret from `/proc/<serve>/environ`; and a second
/// user's sandbox would have run as the first's. Now its commands get a cleared environment,
/// serve is not dumpable, and a second user's sandbox is refused, saying why on their page.
#[test]
fn a_server_that_cannot_switch_uids_serves_one_user_and_says_why() {
    let mut ws = Workspace::start_as(Some(NOBODY), &["--install-cmd", PEEK], &[], |_| {});
    until(PATIENCE, "serve's warning that it is not root", || {
        ws.serve.logs().contains("serve is not root").then_some(())
    });
    let (alice, _) = sign_in(&ws.link("alice", "15m"));
    let home = ws.sandboxes.join("alice");
    until(PATIENCE, "alice's watcher", || {
        let (_, _, page) = get(&ws.serve.url("/u/alice"), Some(&alice));
        (page.contains("data-state=\"ready\"") && home.join("watcher.pid").exists()).then_some(())
    });
    assert_eq!(uid_of(&home.join("watcher.pid")), NOBODY);

    // The new sandbox's watcher saves `shmastra.json` first; the laptop clones after that.
    until(PATIENCE, "alice's first save", || {
        testkit::git::tree_of(&ws.upstream_repo("alice"), "main")
    });
    let laptop = tempfile::tempdir().expect("tempdir");
    ws.laptop("alice", laptop.path());
    std::fs::write(
        laptop.path().join("package.json"),
        r#"{"name": "app", "version": "1.0.0"}"#,
    )
    .expect("package.json");
    git(laptop.path(), ["add", "-A"]);
    git(laptop.path(), ["commit", "-qm", "a dependency"]);
    git(laptop.path(), ["push", "-q", "origin", "HEAD:main"]);
    let peeked = until(PATIENCE, "the install step to run", || {
        std::fs::read_to_string(home.join("peeked"))
            .ok()
            .filter(|s| s.contains("done"))
    });
    assert!(peeked.starts_with(&format!("uid {NOBODY}\n")), "{peeked}");
    assert!(
        !peeked.contains(SECRET),
        "the signing secret leaked:\n{peeked}"
    );
    assert!(
        !peeked.contains("SHMASTRA_TOKEN_STATE="),
        "serve's environment reached the sandbox:\n{peeked}"
    );

    let (bob, _) = sign_in(&ws.link("bob", "15m"));
    let page = until(PATIENCE, "bob's refusal", || {
        let (_, _, page) = get(&ws.serve.url("/u/bob"), Some(&bob));
        page.contains("data-state=\"broken\"").then_some(page)
    });
    assert!(
        page.contains("not root") && page.contains("one sandboxes directory serves one user"),
        "{page}"
    );
    assert!(!ws.sandboxes.join("bob").exists());
    ws.stop();
}

/// A database password on serve's command line is readable by every process on the machine
/// (`/proc/<pid>/cmdline`), a sandbox's code included: with `--sandboxes-dir` it is refused.
#[test]
fn a_database_password_on_the_command_line_is_refused_with_sandboxes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sandboxes = dir.path().join("sandboxes").display().to_string();
    let upstream = dir.path().join("upstream").display().to_string();
    let watcher = testkit::cargo_bin::project_watcher().display().to_string();
    let refused = common::Serve::try_start(
        SECRET,
        &[
            "--upstream-dir",
            &upstream,
            "--sandboxes-dir",
            &sandboxes,
            "--watcher-bin",
            &watcher,
            "--database-url",
            "postgres://shmastra:hunter2@127.0.0.1:9/shmastra",
        ],
        &[],
        None,
    )
    .err()
    .expect("serve refused to start");
    assert!(
        refused.contains("pass it in DATABASE_URL instead"),
        "{refused}"
    );
}
