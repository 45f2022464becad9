//! The workspace page in a real headless browser: Debian's `chromium` driven through
//! `chromedriver` (started here on a free port) with fantoccini, against the real `serve`
//! with sandboxes on this machine and the real watcher in them. A missing chromium fails.
//!
//! Screenshots of each state, 1280 and 390 px wide, go to `$SCREENSHOTS_DIR` when it is set (the
//! docs' come from `SCREENSHOTS_DIR=$PWD/docs cargo test -p shmastra-cloud --test browser`),
//! else to a temp dir.

mod common;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};
use testkit::git::{git, tree_of, tree_of_add_all};
use testkit::wait::PATIENCE;

use common::page::saved_project_with_secrets;
use common::workspace::Workspace;

/// `chromedriver` on a free port in its own process group, which its chromium joins: the
/// whole group is ended on drop, so no browser outlives the test.
struct Driver {
    child: Child,
    url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A browser session in headless chromium.
async fn browser() -> (Driver, Client) {
    for needed in ["/usr/bin/chromium", "/usr/bin/chromedriver"] {
        assert!(
            Path::new(needed).exists(),
            "{needed} is missing: install Debian's chromium and chromium-driver (.ci/run does)"
        );
    }
    let port = free_port();
    let child = Command::new("/usr/bin/chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("start chromedriver");
    let driver = Driver {
        child,
        url: format!("http://127.0.0.1:{port}"),
    };
    let deadline = Instant::now() + PATIENCE;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "chromedriver did not listen");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": "/usr/bin/chromium",
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,900", "--no-first-run"],
        }),
    );
    let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&driver.url)
        .await
        .expect("a chromium session");
    (driver, client)
}

/// Polls `check` until it returns `Some`, or panics after [`PATIENCE`] with the last page text.
async fn eventually<T, F, Fut>(client: &Client, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if Instant::now() >= deadline {
            let text = text_of(client, "body").await.unwrap_or_default();
            panic!("timed out waiting for {what}; the page says:\n{text}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn text_of(client: &Client, css: &str) -> Option<String> {
    client.find(Locator::Css(css)).await.ok()?.text().await.ok()
}

async fn wait_label(client: &Client, label: &str) {
    eventually(client, &format!("status {label:?}"), || async {
        (text_of(client, "#status-label").await.as_deref() == Some(label)).then_some(())
    })
    .await
}

/// Opens a sign-in link and presses its button, as a user does.
async fn open_link(client: &Client, link: &str) {
    client.goto(link).await.unwrap();
    press_sign_in(client).await;
}

async fn press_sign_in(client: &Client) {
    let button = eventually(client, "the sign-in button", || async {
        client.find(Locator::Css("#sign-in button")).await.ok()
    })
    .await;
    button.click().await.unwrap();
}

fn shots_dir(ws: &Workspace) -> PathBuf {
    let dir = std::env::var_os("SCREENSHOTS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| ws.sandboxes.parent().unwrap().join("screenshots"));
    std::fs::create_dir_all(&dir).expect("screenshot dir");
    dir
}

/// `workspace-<name>.png` 1280 px wide and `workspace-<name>-390.png` as a phone shows it; the
/// window is 1280 px wide again after.
async fn screenshot(client: &Client, ws: &Workspace, name: &str) {
    for (width, suffix) in [(NARROW, "-390"), (WIDE, "")] {
        client.set_window_size(width, 900).await.expect("resize");
        let png = client.screenshot().await.expect("screenshot");
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        std::fs::write(
            shots_dir(ws).join(format!("workspace-{name}{suffix}.png")),
            png,
        )
        .expect("write PNG");
    }
}

const WIDE: u32 = 1280;
/// A phone's width.
const NARROW: u32 = 390;

/// At a phone's width, the box `css` is within the page's width and its text is not cut: it
/// wraps, or the box scrolls; the page itself does not scroll sideways. Then its copy button
/// copies its text: "Copied" once the clipboard took it.
async fn fits_narrow_and_copies(client: &Client, css: &str) {
    client.set_window_size(NARROW, 900).await.expect("resize");
    let v = client
        .execute(
            "var e = document.querySelector(arguments[0]); var r = e.getBoundingClientRect(); \
             var page = document.documentElement; var x = getComputedStyle(e).overflowX; \
             return [r.width > 0 && r.left >= 0 && r.right <= page.clientWidth + 0.5, \
                     e.scrollWidth <= e.clientWidth || x === 'auto' || x === 'scroll', \
                     page.scrollWidth <= page.clientWidth, e.scrollWidth, e.clientWidth];",
            vec![json!(css)],
        )
        .await
        .expect("measure the box");
    assert_eq!(
        (&v[0], &v[1], &v[2]),
        (&json!(true), &json!(true), &json!(true)),
        "{css} at {NARROW} px: within the page, not cut, no sideways page: {v}"
    );
    let id = client
        .execute(
            "return document.querySelector(arguments[0]).id;",
            vec![json!(css)],
        )
        .await
        .unwrap();
    let id = id.as_str().expect("the box has an id");
    let button = client
        .find(Locator::Css(&format!("button.copy[data-copy='{id}']")))
        .await
        .expect("a copy button for the box");
    // The clipboard is not readable here: what the page writes to it is noted on the way.
    client
        .execute(
            "var write = navigator.clipboard.writeText.bind(navigator.clipboard); \
             navigator.clipboard.writeText = function (t) { window.__copied = t; return write(t); };",
            vec![],
        )
        .await
        .unwrap();
    button.click().await.unwrap();
    let label = eventually(client, "the copy button's answer", || async {
        let label = button.text().await.ok()?;
        (label != "Copy").then_some(label)
    })
    .await;
    assert_eq!(label, "Copied", "{css}");
    let copied = client
        .execute("return window.__copied;", vec![])
        .await
        .unwrap();
    let text = text_of(client, css).await.unwrap();
    assert_eq!(copied.as_str().map(str::trim), Some(text.trim()), "{css}");
    client.set_window_size(WIDE, 900).await.expect("resize");
}

/// Records every status state the page shows from now on, and a marker a reload would erase.
async fn record_states(client: &Client) {
    client
        .execute(
            "window.__noReload = true; window.__states = []; \
             var s = document.getElementById('status'); \
             new MutationObserver(function () { var b = s.querySelector('.status'); \
               if (b) { window.__states.push(b.dataset.state); } }) \
               .observe(s, { childList: true, subtree: true });",
            vec![],
        )
        .await
        .expect("install the recorder");
}

async fn recorded(client: &Client) -> (bool, Vec<String>) {
    let v = client
        .execute(
            "return [window.__noReload === true, window.__states || []];",
            vec![],
        )
        .await
        .expect("read the recorder");
    let no_reload = v[0].as_bool().unwrap_or(false);
    let states = match &v[1] {
        Value::Array(items) => items
            .iter()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    };
    (no_reload, states)
}

fn commit_push(laptop: &Path, files: &[(&str, Option<&str>)], message: &str) -> String {
    for (path, content) in files {
        match content {
            Some(content) => std::fs::write(laptop.join(path), content).unwrap(),
            None => std::fs::remove_file(laptop.join(path)).unwrap(),
        }
    }
    git(laptop, ["add", "-A"]);
    git(laptop, ["commit", "-qm", message]);
    git(laptop, ["push", "-q", "origin", "HEAD:main"]);
    git(laptop, ["rev-parse", "HEAD"]).trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sign_in_expired_and_reused_links_and_another_users_page() {
    let mut ws = Workspace::start(&[], |_| {});
    let (_driver, client) = browser().await;

    client.goto(&ws.expired_link("alice")).await.unwrap();
    let message = text_of(&client, "#message").await.unwrap();
    assert!(message.contains("expired"), "{message}");
    screenshot(&client, &ws, "link-expired").await;

    let link = ws.link("alice", "15m");
    open_link(&client, &link).await;
    wait_label(&client, "Ready").await;
    let url = client.current_url().await.unwrap();
    assert_eq!(url.path(), "/u/alice");
    let h1 = text_of(&client, "h1").await.unwrap();
    assert_eq!(h1, "Workspace of alice");
    // The cookie is HttpOnly: the page's scripts cannot read it.
    let cookies = client
        .execute("return document.cookie;", vec![])
        .await
        .unwrap();
    assert_eq!(cookies, json!(""));

    client.goto(&link).await.unwrap();
    let message = text_of(&client, "#message").await.unwrap();
    assert!(message.contains("already used"), "{message}");

    // A link opened from another site (a mail, a chat): the session cookie is SameSite=Strict,
    // and still the page opens signed in.
    let from_elsewhere = ws.link("alice", "15m");
    client
        .goto(&format!(
            "data:text/html,<a id=go href='{from_elsewhere}'>sign in</a>"
        ))
        .await
        .unwrap();
    client
        .find(Locator::Id("go"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    press_sign_in(&client).await;
    wait_label(&client, "Ready").await;

    // bob signs in in the same browser and tries alice's page.
    open_link(&client, &ws.link("bob", "15m")).await;
    wait_label(&client, "Ready").await;
    client.goto(&ws.serve.url("/u/alice")).await.unwrap();
    assert_eq!(text_of(&client, "h1").await.unwrap(), "Not your project");
    screenshot(&client, &ws, "other-user-refused").await;
    // The refusal leads bob to his own workspace.
    client
        .find(Locator::Id("own-workspace"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert_eq!(text_of(&client, "h1").await.unwrap(), "Workspace of bob");
    client.close().await.unwrap();
    ws.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dot_follows_a_laptop_push_live_breaks_with_the_cause_and_tail_and_a_save_restores() {
    let mut ws = Workspace::start(&[], |_| {});
    let (_driver, client) = browser().await;
    open_link(&client, &ws.link("alice", "15m")).await;
    wait_label(&client, "Ready").await;
    screenshot(&client, &ws, "ready").await;

    let tmp = tempfile::tempdir().unwrap();
    let laptop = tmp.path().join("laptop");
    // The new sandbox's watcher saves `shmastra.json` first; the laptop clones after that.
    let upstream = ws.upstream_repo("alice");
    eventually(&client, "the sandbox's first save pushed", || async {
        tree_of(&upstream, "main")
    })
    .await;
    ws.laptop("alice", &laptop);
    record_states(&client).await;
    // The sync waits in its install step: the page says since when, and the time ticks.
    let hold = ws.sandboxes.join("alice/hold-install");
    let long_line = format!("{}\n", "a-long-line ".repeat(40));
    std::fs::write(&hold, "").unwrap();
    let first = commit_push(
        &laptop,
        &[
            ("a.txt", Some("one\n")),
            ("package.json", Some("{}\n")),
            ("long.txt", Some(long_line.as_str())),
        ],
        "laptop: first",
    );
    wait_label(&client, "Syncing").await;
    // The step under way, live: the install (package.json is new).
    eventually(&client, "the install step shown", || async {
        (text_of(&client, "#status-step").await? == "installing dependencies").then_some(())
    })
    .await;
    let started = text_of(&client, "#status-elapsed").await.unwrap();
    let later = eventually(&client, "the sync's time ticking", || async {
        let now = text_of(&client, "#status-elapsed").await?;
        (now != started).then_some(now)
    })
    .await;
    for shown in [&started, &later] {
        let seconds = shown.strip_suffix(" s").and_then(|n| n.parse::<u64>().ok());
        assert!(seconds.is_some_and(|n| n < 60), "{shown:?}");
    }
    let badge = text_of(&client, "#status .status").await.unwrap();
    assert!(
        badge.starts_with("◐ Syncing · installing dependencies · ") && badge.ends_with(" s"),
        "{badge}"
    );
    screenshot(&client, &ws, "syncing").await;
    std::fs::remove_file(&hold).unwrap();
    let (no_reload, states) = eventually(&client, "syncing, then ready", || async {
        let (no_reload, states) = recorded(&client).await;
        (states.iter().any(|s| s == "syncing")
            && states.last().map(String::as_str) == Some("ready"))
        .then_some((no_reload, states))
    })
    .await;
    assert!(no_reload, "the page reloaded: {states:?}");
    assert_eq!(
        std::fs::read_to_string(ws.project("alice").join("a.txt")).unwrap(),
        "one\n"
    );

    // A push whose install fails: Broken, with the step and the output tail, live.
    record_states(&client).await;
    commit_push(
        &laptop,
        &[
            (
                "package.json",
                Some("{\"dependencies\": {\"left-pad\": \"9.9.9\"}}\n"),
            ),
            ("break-install", Some("\n")),
            ("a.txt", Some("two\n")),
        ],
        "laptop: a dependency that does not exist",
    );
    wait_label(&client, "Broken").await;
    let step = text_of(&client, "#failure-step").await.unwrap();
    assert!(step.contains("install"), "{step}");
    // npm's cause comes first, then more usage text than the tail keeps: both are shown.
    let cause = text_of(&client, "#failure-first").await.unwrap();
    assert!(
        cause.contains("No matching version found for left-pad@9.9.9"),
        "{cause}"
    );
    let tail = text_of(&client, "#failure-tail").await.unwrap();
    assert!(
        tail.ends_with("npm usage: --omit <dep type> (60)") && !tail.contains("left-pad"),
        "{tail}"
    );
    let next = text_of(&client, "#failure-next").await.unwrap();
    assert!(next.contains("restore an earlier save"), "{next}");
    let (no_reload, states) = recorded(&client).await;
    assert!(
        no_reload && states.contains(&"broken".to_owned()),
        "{states:?}"
    );
    screenshot(&client, &ws, "broken").await;

    // The fix: Ready again.
    commit_push(
        &laptop,
        &[("package.json", Some("{}\n")), ("break-install", None)],
        "laptop: back to no dependencies",
    );
    wait_label(&client, "Ready").await;

    // The history lists the first save; its diff opens; restoring it makes the tree as it was.
    let save = format!("//li[@data-commit='{first}']");
    eventually(&client, "the first save in the history", || async {
        client.find(Locator::XPath(&save)).await.ok()
    })
    .await;
    // The watcher's first save names its file once, in its subject (its kind is beside it).
    let oldest = text_of(&client, "#saves li:last-child").await.unwrap();
    assert_eq!(
        text_of(&client, "#saves li:last-child .diff")
            .await
            .as_deref(),
        Some("shmastra.json"),
        "{oldest}"
    );
    assert_eq!(oldest.matches("shmastra.json").count(), 1, "{oldest}");
    assert_eq!(oldest.matches("autosave").count(), 1, "{oldest}");
    screenshot(&client, &ws, "history").await;
    // The clone command and the token, on a phone (after the screenshots: the token stays out of
    // them): whole, and copied by their buttons.
    fits_narrow_and_copies(&client, "#clone-commands").await;
    client
        .find(Locator::Css("#project details summary"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    fits_narrow_and_copies(&client, "#project-token").await;
    client
        .find(Locator::XPath(&format!(
            "{save}//a[contains(@class,'diff')]"
        )))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let diff = text_of(&client, ".file[data-path='a.txt']").await.unwrap();
    assert!(diff.contains("+ one"), "{diff}");
    screenshot(&client, &ws, "save").await;
    fits_narrow_and_copies(&client, ".file[data-path='long.txt'] pre.diff").await;
    client.back().await.unwrap();
    wait_label(&client, "Ready").await;
    client
        .find(Locator::XPath(&format!("{save}//button")))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    client
        .accept_alert()
        .await
        .expect("a confirmation before restoring");
    let saved_tree = tree_of(&ws.upstream_repo("alice"), &first).unwrap();
    let project = ws.project("alice");
    // Polled on HEAD: `git add -A` on files the restore is writing fails ("short read").
    eventually(
        &client,
        "the sandbox's HEAD as at the first save",
        || async { (tree_of(&project, "HEAD").as_deref() == Some(&*saved_tree)).then_some(()) },
    )
    .await;
    wait_label(&client, "Ready").await;
    assert_eq!(tree_of_add_all(&project), saved_tree);
    // The running watcher pushes the restore.
    eventually(&client, "the restore pushed", || async {
        (tree_of(&upstream, "main").as_deref() == Some(saved_tree.as_str())).then_some(())
    })
    .await;
    client.close().await.unwrap();
    ws.stop();
}

/// The ids of the saves the page lists, newest first.
async fn listed_saves(client: &Client) -> Vec<String> {
    let v = client
        .execute(
            "return Array.from(document.querySelectorAll('#saves li.save')).map(function (li) { return li.dataset.commit; });",
            vec![],
        )
        .await
        .expect("read the history");
    match v {
        Value::Array(items) => items
            .iter()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    }
}

/// Presses "Restore this version" on the save `commit` once it is offered, and accepts the
/// confirmation.
async fn restore_version(client: &Client, commit: &str) {
    let button =
        format!("//li[@data-commit='{commit}']//form[contains(@class,'restore-version')]//button");
    eventually(client, "Restore this version offered", || async {
        client
            .find(Locator::XPath(&button))
            .await
            .ok()?
            .click()
            .await
            .ok()
    })
    .await;
    client
        .accept_alert()
        .await
        .expect("a confirmation before restoring");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_history_is_live_one_line_per_save_and_every_restore_is_confirmed() {
    let mut ws = Workspace::start(&[], |_| {});
    let (_driver, client) = browser().await;
    open_link(&client, &ws.link("alice", "15m")).await;
    wait_label(&client, "Ready").await;
    let upstream = ws.upstream_repo("alice");
    eventually(&client, "the sandbox's first save pushed", || async {
        tree_of(&upstream, "main")
    })
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let laptop = tmp.path().join("laptop");
    ws.laptop("alice", &laptop);
    let first = git(&laptop, ["rev-parse", "HEAD"]).trim().to_owned();
    // The first save appears without a reload (the page may have loaded before it was pushed).
    record_states(&client).await;
    eventually(&client, "the first save listed", || async {
        listed_saves(&client).await.contains(&first).then_some(())
    })
    .await;

    let pushed = commit_push(
        &laptop,
        &[(
            "b.txt",
            Some(
                "bee
",
            ),
        )],
        "laptop: add b",
    );
    let row = format!("li[data-commit='{pushed}']");
    eventually(&client, "the laptop's push listed", || async {
        (listed_saves(&client).await.first() == Some(&pushed)).then_some(())
    })
    .await;
    let (no_reload, _) = recorded(&client).await;
    assert!(no_reload, "the page reloaded to show the push");
    // Read at once: the list may be replaced between two reads.
    let v = client
        .execute(
            "var li = document.querySelector(arguments[0]); var t = li.querySelector('time'); \
             return [li.textContent, li.querySelector('.kind').textContent, t.textContent, \
                     t.getAttribute('datetime'), t.title];",
            vec![json!(format!("#saves {row}"))],
        )
        .await
        .expect("read the row");
    let field = |i: usize| v[i].as_str().unwrap_or_default().to_owned();
    let (line, kind, shown, iso, hover) = (field(0), field(1), field(2), field(3), field(4));
    assert_eq!(kind, "other", "{line}");
    assert!(line.contains("laptop: add b"), "{line}");
    assert!(line.contains(&pushed[..7]), "the short id: {line}");
    assert!(line.contains("Test Author"), "the author: {line}");
    assert!(shown.ends_with("ago") || shown == "just now", "{shown}");
    assert!(
        iso.ends_with('Z') && !hover.is_empty() && hover != iso,
        "{iso} / {hover}"
    );

    // Each restore says it is done, and its save appears in the list, live.
    for (round, to) in [&first, &pushed].into_iter().enumerate() {
        restore_version(&client, to).await;
        let notice = eventually(&client, "the restore's confirmation", || async {
            text_of(&client, "#notice")
                .await
                .filter(|n| n.contains("Restored") && n.contains(&to[..12]))
        })
        .await;
        assert!(notice.contains(&to[..12]), "{notice}");
        eventually(&client, "the restore's save listed", || async {
            let restores = client
                .find_all(Locator::Css("#saves li[data-kind='restore']"))
                .await
                .ok()?;
            (restores.len() == round + 1).then_some(())
        })
        .await;
        wait_label(&client, "Ready").await;
    }
    assert_eq!(
        std::fs::read_to_string(ws.project("alice").join("b.txt")).unwrap(),
        "bee\n"
    );
    client.close().await.unwrap();
    ws.stop();
}

/// The texts of the elements `css` finds, read at once.
async fn texts_of(client: &Client, css: &str) -> Vec<String> {
    let v = client
        .execute(
            "return Array.from(document.querySelectorAll(arguments[0])).map(function (e) { return e.textContent; });",
            vec![json!(css)],
        )
        .await
        .expect("read the page");
    match v {
        Value::Array(items) => items
            .iter()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saves_page_signs_its_lines_sums_up_a_binary_and_restores_only_one_file() {
    let mut ws = Workspace::start(&[], |_| {});
    let (_driver, client) = browser().await;
    open_link(&client, &ws.link("alice", "15m")).await;
    wait_label(&client, "Ready").await;
    let upstream = ws.upstream_repo("alice");
    eventually(&client, "the sandbox's first save pushed", || async {
        tree_of(&upstream, "main")
    })
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let laptop = tmp.path().join("laptop");
    ws.laptop("alice", &laptop);
    let image = "PNG\u{0}\u{1}\u{2}\u{0}binary";
    let older = commit_push(
        &laptop,
        &[
            ("a.txt", Some("one\ntwo\n")),
            ("b.txt", Some("bee\n")),
            ("img.bin", Some(image)),
        ],
        "laptop: three files",
    );
    let newer = commit_push(
        &laptop,
        &[
            ("a.txt", Some("one\nthree\n")),
            ("b.txt", Some("bee two\n")),
        ],
        "laptop: change two",
    );
    let project = ws.project("alice");
    eventually(&client, "the sandbox synced", || async {
        (std::fs::read_to_string(project.join("b.txt")).ok()? == "bee two\n").then_some(())
    })
    .await;
    wait_label(&client, "Ready").await;

    // The newer save: per file, its removed and added lines, each with its sign.
    client
        .goto(&ws.serve.url(&format!("/u/alice/saves/{newer}")))
        .await
        .unwrap();
    let a = ".file[data-path='a.txt']";
    assert_eq!(
        texts_of(&client, &format!("{a} .del")).await,
        vec!["− two".to_owned()]
    );
    assert_eq!(
        texts_of(&client, &format!("{a} .add")).await,
        vec!["+ three".to_owned()]
    );
    let page = text_of(&client, "main").await.unwrap();
    assert!(
        page.contains("laptop: change two") && !page.contains("Author:"),
        "no raw header: {page}"
    );

    // The older one: the binary summed up, not dumped; then only a.txt goes back to it.
    client
        .goto(&ws.serve.url(&format!("/u/alice/saves/{older}")))
        .await
        .unwrap();
    assert_eq!(
        text_of(&client, ".file[data-path='img.bin'] .binary")
            .await
            .as_deref(),
        Some(format!("binary file, {} bytes", image.len()).as_str())
    );
    client
        .find(Locator::Css(&format!("{a} .restore-file button")))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    client
        .accept_alert()
        .await
        .expect("a confirmation before restoring a file");
    let notice = eventually(&client, "the file's restore confirmed", || async {
        text_of(&client, "#notice")
            .await
            .filter(|n| n.contains("Restored a.txt"))
    })
    .await;
    assert!(notice.contains(&older[..12]), "{notice}");
    assert_eq!(
        std::fs::read_to_string(project.join("a.txt")).unwrap(),
        "one\ntwo\n"
    );
    assert_eq!(
        std::fs::read_to_string(project.join("b.txt")).unwrap(),
        "bee two\n",
        "only the one file went back"
    );
    client.close().await.unwrap();
    ws.stop();
}

/// Every file under `dir` whose bytes contain `needle`, except `skip`.
fn files_containing(dir: &Path, needle: &str, skip: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                stack.push(path);
            } else if kind.is_file() && path != skip {
                let bytes = std::fs::read(&path).unwrap_or_default();
                if bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                    found.push(path);
                }
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_restore_form_checks_the_secrets_and_writes_them_only_to_env() {
    const API_KEY: &str = "sk-live a#b \"quoted\" $HOME";
    const DATABASE_URL: &str = "postgres://u:p@db/x?ssl=true";
    let mut ws = Workspace::start(&[], saved_project_with_secrets);
    let (_driver, client) = browser().await;
    open_link(&client, &ws.link("alice", "15m")).await;
    wait_label(&client, "Needs your secrets").await;
    screenshot(&client, &ws, "restore-form").await;

    // Only one of the two: the other gets an error next to its field, nothing is echoed.
    client
        .find(Locator::Id("env-API_KEY"))
        .await
        .unwrap()
        .send_keys(API_KEY)
        .await
        .unwrap();
    client
        .find(Locator::Css("#restore-project button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let error = eventually(&client, "the error next to DATABASE_URL", || async {
        text_of(&client, ".error[data-field='DATABASE_URL']").await
    })
    .await;
    assert!(error.contains("missing"), "{error}");
    let value = client
        .find(Locator::Id("env-API_KEY"))
        .await
        .unwrap()
        .prop("value")
        .await
        .unwrap();
    assert_eq!(value.as_deref(), Some(""), "a submitted value came back");
    assert!(!client.source().await.unwrap().contains("sk-live"));
    assert!(!ws.project("alice").join(".env").exists());
    screenshot(&client, &ws, "restore-form-errors").await;

    for (field, value) in [("env-API_KEY", API_KEY), ("env-DATABASE_URL", DATABASE_URL)] {
        client
            .find(Locator::Id(field))
            .await
            .unwrap()
            .send_keys(value)
            .await
            .unwrap();
    }
    client
        .find(Locator::Css("#restore-project button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_label(&client, "Ready").await;
    let env_file = ws.project("alice").join(".env");
    let read: Vec<(String, String)> = dotenvy::from_path_iter(&env_file)
        .unwrap()
        .map(|item| item.unwrap())
        .collect();
    assert_eq!(
        read,
        vec![
            ("API_KEY".to_owned(), API_KEY.to_owned()),
            ("DATABASE_URL".to_owned(), DATABASE_URL.to_owned())
        ]
    );
    assert_eq!(
        std::fs::read_to_string(ws.project("alice").join("app.js")).unwrap(),
        "console.log('hi');\n"
    );

    // Refresh and back re-submit nothing: the page is a GET after a redirect.
    client.refresh().await.unwrap();
    wait_label(&client, "Ready").await;
    client.back().await.unwrap();
    wait_label(&client, "Ready").await;
    assert_eq!(client.current_url().await.unwrap().path(), "/u/alice");
    assert!(
        text_of(&client, "#notice").await.is_none(),
        "a form was re-submitted"
    );
    client.close().await.unwrap();
    ws.stop();

    // Nowhere but `.env`: not in serve's log, the sandboxes' other files, or the upstream.
    for value in [API_KEY, DATABASE_URL] {
        assert!(!ws.serve.logs().contains(value), "serve logged a secret");
        assert_eq!(
            files_containing(&ws.sandboxes, value, &env_file),
            Vec::<PathBuf>::new()
        );
        assert_eq!(
            files_containing(&ws.upstream, value, Path::new("")),
            Vec::<PathBuf>::new()
        );
        let history = git(&ws.upstream_repo("alice"), ["log", "--all", "-p"]);
        assert!(
            !history.contains(value),
            "a secret reached the saved history"
        );
    }
}

/// Pages of another origin (a port of its own on 127.0.0.1): `GET /<name>` answers `pages`'s
/// HTML of that name. Served from a thread until the test process ends.
fn attacker_site(pages: Vec<(&'static str, String)>) -> String {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request = String::new();
            let _ = reader.read_line(&mut request);
            let path = request
                .split(' ')
                .nth(1)
                .unwrap_or("/")
                .trim_start_matches('/')
                .to_owned();
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let body = pages
                .iter()
                .find(|(name, _)| *name == path)
                .map(|(_, html)| html.clone())
                .unwrap_or_default();
            let _ = (&stream).write_all(
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            );
        }
    });
    base
}

/// Login CSRF: a page on another site signed the browser in as someone else without a click
/// (a navigation to mallory's link set mallory's session), so alice would work, and save, in
/// mallory's workspace. Now a navigation only shows "Sign in as mallory", and a form the other
/// site submits to `/login` is refused by its `Origin`; both of mallory's links stay unspent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_site_cannot_sign_the_browser_in_as_someone_else() {
    let mut ws = Workspace::start(&[], |_| {});
    let (_driver, client) = browser().await;
    let posted = ws.link("mallory", "15m");
    let navigated = ws.link("mallory", "15m");
    let posted_value = posted.split_once("?t=").unwrap().1.to_owned();
    let site = attacker_site(vec![
        (
            "post",
            format!(
                "<form id=f method=post action='{}'><input name=t value='{posted_value}'></form><script>document.getElementById('f').submit()</script>",
                ws.serve.url("/login")
            ),
        ),
        ("go", format!("<script>location = '{navigated}'</script>")),
    ]);

    client.goto(&format!("{site}/post")).await.unwrap();
    eventually(&client, "the refused sign-in", || async {
        text_of(&client, "#message")
            .await
            .filter(|m| m.contains("did not come from this server"))
    })
    .await;
    client.goto(&format!("{site}/go")).await.unwrap();
    eventually(&client, "the sign-in page", || async {
        text_of(&client, "#sign-in button")
            .await
            .filter(|t| t == "Sign in as mallory")
    })
    .await;

    client.goto(&ws.serve.url("/u/mallory")).await.unwrap();
    assert_eq!(
        text_of(&client, "h1").await.unwrap(),
        "Sign in",
        "the browser was signed in as mallory"
    );
    for link in [&posted, &navigated] {
        client.goto(link).await.unwrap();
        assert_eq!(
            text_of(&client, "#sign-in button").await.as_deref(),
            Some("Sign in as mallory"),
            "a link the other site used was spent"
        );
    }
    client.close().await.unwrap();
    ws.stop();
}
