//! The contract's trailer parser against real git: for generated commit messages, the
//! trailers `shmastra_contract::trailers::parse` finds are those `git interpret-trailers
//! --parse` prints, in order. And what the watcher writes for any paths is read back whole.

use std::cell::Cell;
use std::io::Write;
use std::process::{Command, Stdio};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use shmastra_contract::save_message::{self, LISTED_PATHS, SaveKind};
use shmastra_contract::trailers;

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

/// `git interpret-trailers --parse` of `message`, outside any repository and with no
/// configuration but git's defaults.
fn git_trailers(message: &str, home: &std::path::Path) -> Vec<(String, String)> {
    let mut child = Command::new("git")
        .args(["interpret-trailers", "--parse"])
        .current_dir(home)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", home)
        .env("GIT_CEILING_DIRECTORIES", home)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("git runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(message.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "git interpret-trailers: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let (token, value) = line.split_once(": ").expect("git prints `token: value`");
            (token.to_owned(), value.to_owned())
        })
        .collect()
}

/// One line of a message, by kind: prose, trailers of every shape git reads or refuses,
/// continuations, comments, dividers, the scissors line, old `Conflicts:` blocks.
fn line() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => Just(String::new()),
        1 => Just("   ".to_owned()),
        3 => "[a-z]{1,6}( [a-z]{1,6}){0,3}",
        8 => trailer(),
        3 => "[ \t]{1,2}[a-z]{1,6}",
        2 => "#[ a-z]{0,6}",
        1 => prop::sample::select(vec!["---", "--- x", "---x", "----", "---\t"]).prop_map(str::to_owned),
        1 => Just("# ------------------------ >8 ------------------------".to_owned()),
        1 => Just("Conflicts:".to_owned()),
        1 => "\t[a-z]{1,4}",
        1 => "[A-Za-z]{1,3} [A-Za-z]{1,3}: [a-z]{1,3}",
        1 => " ?: ?[a-z]{0,3}",
        1 => "[a-z]{1,3}\r",
        1 => "[a-z]{1,3}\0[a-z]{1,3}",
    ]
}

/// A trailer line: the watcher's, git's own, or any token with white space around its `:`.
fn trailer() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => ("[A-Za-z][A-Za-z0-9-]{0,8}", "[ \t]{0,2}", "[ \t]{0,2}", "[a-z0-9/.:]{0,8}", "[ \t]{0,2}")
            .prop_map(|(t, a, b, v, c)| format!("{t}{a}:{b}{v}{c}")),
        2 => Just("Saved-by: project-watcher/0.1.0".to_owned()),
        2 => prop::sample::select(vec!["autosave", "restore", "backup", "nonsense"])
            .prop_map(|k| format!("Save-kind: {k}")),
        2 => "Signed-off-by: [a-z]{1,5}",
        1 => "\\(cherry picked from commit [0-9a-f]{4}\\)",
    ]
}

/// A message: a subject, then paragraphs of lines of any kind, the last one mostly trailers
/// (so that every rule of the block's start is reached), then perhaps more lines.
fn message() -> impl Strategy<Value = String> {
    let paragraph = prop::collection::vec(line(), 1..5);
    // Mostly trailers, or a few among prose: git's quarter rule is reached both ways.
    let last = prop_oneof![
        prop::collection::vec(prop_oneof![3 => trailer(), 1 => line()], 1..6),
        prop::collection::vec(
            prop_oneof![1 => trailer(), 2 => "[a-z]{1,6}( [a-z]{1,6})?"],
            2..7
        ),
        (1..3usize, 1..5usize, 0..2usize).prop_flat_map(|(signed, prose, other)| {
            let mut lines = vec!["Signed-off-by: x".to_owned(); signed];
            lines.extend(std::iter::repeat_n("some prose".to_owned(), prose));
            lines.extend(std::iter::repeat_n("Key: value".to_owned(), other));
            Just(lines).prop_shuffle()
        }),
    ];
    (
        "[a-z ]{0,10}",
        prop::collection::vec(paragraph, 0..3),
        prop::option::of(last),
        prop::collection::vec(line(), 0..3),
        any::<bool>(),
    )
        .prop_map(|(subject, paragraphs, last, tail, newline)| {
            let mut blocks: Vec<String> = vec![subject];
            blocks.extend(paragraphs.iter().map(|p| p.join("\n")));
            blocks.extend(last.map(|p| p.join("\n")));
            let mut text = blocks.join("\n\n");
            for line in tail {
                text.push('\n');
                text.push_str(&line);
            }
            if newline {
                text.push('\n');
            }
            text
        })
}

#[test]
fn trailers_are_those_git_interpret_trailers_parses() {
    let home = tempfile::tempdir().unwrap();
    let (with_trailers, checked) = (Cell::new(0u32), Cell::new(0u32));
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&message(), |message| {
            let expected = git_trailers(&message, home.path());
            let got: Vec<(String, String)> = trailers::parse(&message)
                .into_iter()
                .map(|t| (t.token, t.value))
                .collect();
            prop_assert_eq!(&got, &expected, "{:?}", message);
            checked.set(checked.get() + 1);
            with_trailers.set(with_trailers.get() + u32::from(!expected.is_empty()));
            Ok(())
        })
        .unwrap();
    let (checked, with_trailers) = (checked.get(), with_trailers.get());
    println!("RELIABILITY parser-trailers: cases={checked} with_trailers={with_trailers}");
    assert_eq!(checked, cases());
    // About 39 % have trailers (100 ± 8 of 256 over twelve runs): a fifth is far below chance.
    assert!(
        with_trailers * 5 >= checked,
        "too few generated messages have trailers: {with_trailers} of {checked}"
    );
}

/// A path name made to collide with the message's syntax: dividers, comments, the scissors
/// line, trailers, control characters, blank-looking names.
fn path() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => "[a-z]{1,4}(/[a-z.]{1,4}){0,2}".prop_map(String::into_bytes),
        1 => prop::sample::select(vec![
            "--- notes.md", "---", "---\tx", "# x", "#", "Saved-by: project-watcher/1",
            "Save-kind: restore", "  indented", " ", "a\nb", "\n", "a\r", "tab\tname",
            "# ------------------------ >8 ------------------------", "Conflicts:",
            "... and 3 more",
        ])
        .prop_map(|p| p.as_bytes().to_vec()),
        1 => prop::collection::vec(any::<u8>(), 1..6),
    ]
}

#[test]
fn what_the_watcher_writes_for_any_paths_reads_back() {
    let home = tempfile::tempdir().unwrap();
    let kinds = prop::sample::select(vec![
        SaveKind::Autosave,
        SaveKind::Restore,
        SaveKind::Backup,
    ]);
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    });
    let (checked, long_lists) = (Cell::new(0u32), Cell::new(0u32));
    runner
        .run(
            &(kinds, prop::collection::vec(path(), 0..24)),
            |(kind, paths)| {
                let lines: Vec<String> = paths
                    .iter()
                    .map(|p| save_message::one_line_path(p))
                    .collect();
                let extra = [(save_message::RESTORED_FROM, "1a2b".to_owned())];
                let message = save_message::render("autosave: x", kind, "0.1.0", &lines, &extra);
                prop_assert_eq!(
                    save_message::classify(&message),
                    Some(kind),
                    "{:?}",
                    message
                );
                let mut expected: Vec<String> = lines.iter().take(LISTED_PATHS).cloned().collect();
                if lines.len() > LISTED_PATHS {
                    expected.push(format!("... and {} more", lines.len() - LISTED_PATHS));
                }
                prop_assert_eq!(
                    save_message::listed_files(&message),
                    expected,
                    "{:?}",
                    message
                );
                let git = git_trailers(&message, home.path());
                prop_assert_eq!(
                    git.iter().map(|(t, _)| t.as_str()).collect::<Vec<_>>(),
                    ["Saved-by", "Save-kind", "Restored-from"],
                    "{:?}",
                    message
                );
                checked.set(checked.get() + 1);
                long_lists.set(long_lists.get() + u32::from(lines.len() > LISTED_PATHS));
                Ok(())
            },
        )
        .unwrap();
    let (checked, long_lists) = (checked.get(), long_lists.get());
    println!("RELIABILITY parser-save-message: cases={checked} over_the_list_limit={long_lists}");
    assert!(
        long_lists * 20 >= checked,
        "{long_lists} of {checked} lists were cut"
    );
}
