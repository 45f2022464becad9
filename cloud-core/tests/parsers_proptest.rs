//! Reliability: cloud-core's parsers of untrusted input (manifest, restore form and `.env`
//! render, project tokens, user ids) under proptest (the report-status parser's property is `wire/tests/report_proptest.rs`). Each property
//! builds valid input, mutates some of it, and compares the parser with an oracle written here
//! from the contract (never the crate's own checks). Each counts the cases that reach its
//! accept branch and fails when too few do, so a property cannot pass by never accepting.

use std::collections::BTreeSet;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use cloud_core::Manifest;
use cloud_core::TokenSigner;
use cloud_core::UserId;
use cloud_core::{RestoreForm, SecretValue, render_env};
use hmac::{Hmac, Mac};
use proptest::prelude::*;
use proptest::sample::Index;
use sha2::Sha256;
use testkit::proptest_check::check;

/// The contract's variable name: a letter or `_`, then letters, digits, `_` or `.`; 1..=256.
fn is_env_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    (1..=256).contains(&bytes.len())
        && (bytes[0].is_ascii_alphabetic() || bytes[0] == b'_')
        && bytes
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
}

/// The contract's manifest: a JSON object with exactly `version` (the integer 1) and `env`, a
/// list of at most 1000 unique valid names. The names, sorted, or `None` for a refusal.
fn manifest_oracle(text: &str) -> Option<Vec<String>> {
    let value: serde_json::Value = serde_json::from_str(text).ok()?;
    let object = value.as_object()?;
    if object.len() != 2 || object.get("version")?.as_u64() != Some(1) {
        return None;
    }
    let names = object
        .get("env")?
        .as_array()?
        .iter()
        .map(|n| n.as_str().map(str::to_owned))
        .collect::<Option<Vec<String>>>()?;
    let unique: BTreeSet<String> = names.iter().cloned().collect();
    (names.len() <= 1000 && unique.len() == names.len() && names.iter().all(|n| is_env_name(n)))
        .then(|| unique.into_iter().collect())
}

/// One edit of a text, at a character position.
#[derive(Debug, Clone)]
enum TextEdit {
    Keep,
    Replace(Index, char),
    Insert(Index, char),
    Delete(Index, usize),
    Whole(String),
}

fn text_edit() -> impl Strategy<Value = TextEdit> {
    let glyph = prop_oneof![
        prop::sample::select(vec![
            '"', ',', ':', '1', '2', 'A', '_', '-', '.', ' ', '\\', '}'
        ]),
        any::<char>(),
    ];
    prop_oneof![
        3 => Just(TextEdit::Keep),
        2 => (any::<Index>(), glyph.clone()).prop_map(|(i, c)| TextEdit::Replace(i, c)),
        2 => (any::<Index>(), glyph).prop_map(|(i, c)| TextEdit::Insert(i, c)),
        1 => (any::<Index>(), 1usize..4).prop_map(|(i, n)| TextEdit::Delete(i, n)),
        1 => any::<String>().prop_map(TextEdit::Whole),
    ]
}

fn apply(text: &str, edit: &TextEdit) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    match edit {
        TextEdit::Keep => {}
        TextEdit::Replace(at, c) if !chars.is_empty() => {
            let at = at.index(chars.len());
            chars[at] = *c;
        }
        TextEdit::Replace(..) => {}
        TextEdit::Insert(at, c) => chars.insert(at.index(chars.len() + 1), *c),
        TextEdit::Delete(at, n) if !chars.is_empty() => {
            let from = at.index(chars.len());
            chars.drain(from..(from + n).min(chars.len()));
        }
        TextEdit::Delete(..) => {}
        TextEdit::Whole(other) => return other.clone(),
    }
    chars.into_iter().collect()
}

/// A well-formed manifest, spelled as people and tools write it (any key order, compact or
/// indented, names unsorted).
fn manifest_text() -> impl Strategy<Value = String> {
    (
        prop::collection::vec("[A-Za-z_][A-Za-z0-9_.]{0,10}", 0..5),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(names, env_first, pretty)| {
            let unique: Vec<String> = names
                .iter()
                .filter(|n| names.iter().filter(|m| m == n).count() == 1)
                .cloned()
                .collect();
            let env = serde_json::to_string(&unique).unwrap();
            let text = if env_first {
                format!("{{\"env\": {env}, \"version\": 1}}")
            } else {
                format!("{{\"version\":1,\"env\":{env}}}")
            };
            if pretty {
                let value: serde_json::Value = serde_json::from_str(&text).unwrap();
                serde_json::to_string_pretty(&value).unwrap()
            } else {
                text
            }
        })
}

#[test]
fn manifest_text_is_accepted_exactly_when_well_formed_and_rewritten_canonically() {
    check(
        "manifest-text",
        (manifest_text(), text_edit()),
        0.3,
        |(text, edit)| {
            let text = apply(&text, &edit);
            let expected = manifest_oracle(&text);
            match Manifest::parse(&text) {
                Ok(manifest) => {
                    prop_assert_eq!(Some(manifest.env().to_vec()), expected, "{:?}", text);
                    let canonical = manifest.to_json();
                    prop_assert_eq!(Manifest::parse(&canonical).unwrap(), manifest);
                    let head = "{\n  \"version\": 1,\n  \"env\": [";
                    prop_assert!(canonical.starts_with(head), "{}", canonical);
                    let tail = canonical.ends_with("}\n") && !canonical.ends_with("\n\n");
                    prop_assert!(tail, "{}", canonical);
                    Ok(true)
                }
                Err(_) => {
                    prop_assert_eq!(expected, None, "{:?} refused", text);
                    Ok(false)
                }
            }
        },
    );
}

fn json_version() -> impl Strategy<Value = serde_json::Value> {
    prop_oneof![
        4 => Just(serde_json::json!(1)),
        1 => Just(serde_json::json!(1.0)),
        1 => Just(serde_json::json!("1")),
        1 => any::<i64>().prop_map(|n| serde_json::json!(n)),
        1 => Just(serde_json::Value::Null),
    ]
}

/// Names as people type them into `.env`: mostly valid, often not.
fn name_value() -> impl Strategy<Value = serde_json::Value> {
    prop_oneof![
        6 => "[A-Za-z_][A-Za-z0-9_.]{0,12}".prop_map(serde_json::Value::from),
        1 => "[0-9 =#'\"$.-][A-Za-z0-9_]{0,6}".prop_map(serde_json::Value::from),
        1 => any::<String>().prop_map(serde_json::Value::from),
        1 => Just(serde_json::json!(7)),
    ]
}

#[test]
fn manifest_objects_are_accepted_exactly_when_well_formed() {
    check(
        "manifest-object",
        (
            json_version(),
            prop::collection::vec(name_value(), 0..4),
            prop::bool::weighted(0.2),
            any::<bool>(),
        ),
        0.1,
        |(version, names, extra, with_env)| {
            let mut object = serde_json::json!({ "version": version });
            if with_env || names.is_empty() {
                object["env"] = serde_json::Value::from(names);
            }
            if extra {
                object["values"] = serde_json::json!({"A": "leak"});
            }
            let text = object.to_string();
            let expected = manifest_oracle(&text);
            let parsed = Manifest::parse(&text).ok().map(|m| m.env().to_vec());
            prop_assert_eq!(&parsed, &expected, "{}", text);
            Ok(parsed.is_some())
        },
    );
}

/// A secret's value: anything, with the characters `.env` quoting finds hard made common.
fn secret_value() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "['\\\\\"#$ =\n\ta-z\u{e9}\u{1f600}]{0,16}",
        1 => any::<String>(),
    ]
}

/// What is done to a valid form before it is submitted.
#[derive(Debug, Clone)]
enum FormEdit {
    Keep,
    Shuffle(Vec<Index>),
    Drop(Index),
    Unexpected(String),
    Duplicate(Index),
    Nul(Index),
    Oversize(Index),
}

fn form_edit() -> impl Strategy<Value = FormEdit> {
    prop_oneof![
        3 => Just(FormEdit::Keep),
        2 => prop::collection::vec(any::<Index>(), 0..6).prop_map(FormEdit::Shuffle),
        1 => any::<Index>().prop_map(FormEdit::Drop),
        1 => "[A-Z_][A-Z0-9_]{0,6}".prop_map(FormEdit::Unexpected),
        1 => any::<Index>().prop_map(FormEdit::Duplicate),
        1 => any::<Index>().prop_map(FormEdit::Nul),
        1 => any::<Index>().prop_map(FormEdit::Oversize),
    ]
}

/// Whether dotenvy and Node's dotenv can both read `value` back exactly from one `.env` line:
/// no carriage return, and either no `'` and no `\` at its end (single quotes), or none of
/// `"`, `\`, `$` and a line break (double quotes).
fn has_exact_form(value: &str) -> bool {
    !value.contains('\r')
        && ((!value.contains('\'') && !value.ends_with('\\'))
            || !value.contains(['"', '\\', '$', '\n']))
}

/// The contract's form: exactly the listed names, once each, no NUL, every value with an
/// exact `.env` form, at most 64 KiB a value and 1 MiB in all.
fn form_is_valid(listed: &BTreeSet<String>, submitted: &[(String, String)]) -> bool {
    let names: Vec<&String> = submitted.iter().map(|(n, _)| n).collect();
    let unique: BTreeSet<&String> = names.iter().copied().collect();
    unique.len() == names.len()
        && unique.into_iter().eq(listed.iter())
        && submitted
            .iter()
            .all(|(_, v)| !v.contains('\0') && has_exact_form(v) && v.len() <= 64 * 1024)
        && submitted.iter().map(|(_, v)| v.len()).sum::<usize>() <= 1024 * 1024
}

#[test]
fn a_restore_form_is_accepted_exactly_when_it_matches_and_renders_losslessly() {
    let form = prop::collection::btree_map("[A-Z_][A-Z0-9_]{0,6}", secret_value(), 0..5);
    check(
        "restore-form",
        (form, form_edit()),
        0.25,
        |(values, edit)| {
            let listed: BTreeSet<String> = values.keys().cloned().collect();
            let mut submitted: Vec<(String, String)> = values.into_iter().collect();
            let n = submitted.len();
            match edit {
                FormEdit::Keep => {}
                FormEdit::Shuffle(swaps) if n > 1 => {
                    for (i, swap) in swaps.iter().enumerate() {
                        submitted.swap(i % n, swap.index(n));
                    }
                }
                FormEdit::Unexpected(name) => submitted.push((name, "x".to_owned())),
                FormEdit::Drop(i) if n > 0 => {
                    submitted.remove(i.index(n));
                }
                FormEdit::Duplicate(i) if n > 0 => {
                    let again = submitted[i.index(n)].clone();
                    submitted.push(again);
                }
                FormEdit::Nul(i) if n > 0 => submitted[i.index(n)].1.insert(0, '\0'),
                FormEdit::Oversize(i) if n > 0 => {
                    submitted[i.index(n)].1 = "v".repeat(64 * 1024 + 1);
                }
                _ => {}
            }
            let manifest = Manifest::new(listed.iter().cloned()).unwrap();
            let valid = form_is_valid(&listed, &submitted);
            let form = submitted
                .iter()
                .map(|(n, v)| (n.clone(), SecretValue::from(v.as_str())));
            match RestoreForm::validate(&manifest, form) {
                Ok(form) => {
                    prop_assert!(valid, "accepted {:?}", submitted);
                    let env = render_env(&form);
                    let read: Vec<(String, String)> =
                        dotenvy::from_read_iter(env.expose().as_bytes())
                            .collect::<Result<_, _>>()
                            .unwrap();
                    submitted.sort();
                    prop_assert_eq!(read, submitted);
                    Ok(true)
                }
                Err(_) => {
                    prop_assert!(!valid, "refused {:?}", submitted);
                    Ok(false)
                }
            }
        },
    );
}

const TOKEN_SECRET: &[u8] = b"a secret of at least thirty-two bytes!!";

/// The contract's user id: 1..=64 of `[a-z0-9._-]` (upper case refused: GitLab paths ignore
/// case), not starting with `.` or `-`, no `..`, not ending in `.git` or `.atom`.
fn is_user_id(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
        })
        && !s.starts_with(['.', '-'])
        && !s.contains("..")
        && !s.ends_with(".git")
        && !s.ends_with(".atom")
}

/// The contract's token, computed here: `v1.<b64url user>.<b64url HMAC-SHA256(secret,
/// "shmastra-project-token-v1\0" || user)>`.
fn token_of(secret: &[u8], user: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).unwrap();
    mac.update(b"shmastra-project-token-v1\0");
    mac.update(user.as_bytes());
    let tag = mac.finalize().into_bytes();
    format!(
        "v1.{}.{}",
        URL_SAFE_NO_PAD.encode(user),
        URL_SAFE_NO_PAD.encode(tag)
    )
}

/// What is done to a minted token before it is presented.
#[derive(Debug, Clone)]
enum TokenEdit {
    Keep,
    Text(TextEdit),
    Truncate(usize),
    Extend(String),
    OtherUser(String),
    OtherSecret,
    Padded,
}

fn user_id() -> impl Strategy<Value = String> {
    "[a-z0-9_][a-z0-9._-]{0,40}".prop_filter("a user id", |s| is_user_id(s))
}

#[test]
fn a_token_is_accepted_exactly_when_it_is_the_one_minted_for_its_user() {
    let signer = TokenSigner::new(TOKEN_SECRET).unwrap();
    let edit = prop_oneof![
        3 => Just(TokenEdit::Keep),
        3 => text_edit().prop_map(TokenEdit::Text),
        1 => (1usize..20).prop_map(TokenEdit::Truncate),
        1 => "[A-Za-z0-9_.=-]{1,4}".prop_map(TokenEdit::Extend),
        1 => user_id().prop_map(TokenEdit::OtherUser),
        1 => Just(TokenEdit::OtherSecret),
        1 => Just(TokenEdit::Padded),
    ];
    check("token", (user_id(), edit), 0.25, |(user, edit)| {
        let minted = signer.mint(&UserId::parse(&user).unwrap());
        let token = token_of(TOKEN_SECRET, &user);
        prop_assert_eq!(&minted, &token, "mint differs from the contract");
        let presented = match edit {
            TokenEdit::Keep => token.clone(),
            TokenEdit::Text(edit) => apply(&token, &edit),
            TokenEdit::Truncate(n) => token[..token.len() - n.min(token.len())].to_owned(),
            TokenEdit::Extend(tail) => format!("{token}{tail}"),
            TokenEdit::OtherUser(other) => {
                let mac = token.rsplit('.').next().unwrap();
                format!("v1.{}.{mac}", URL_SAFE_NO_PAD.encode(&other))
            }
            TokenEdit::OtherSecret => token_of(b"another secret that is long enough!!", &user),
            TokenEdit::Padded => {
                let mut parts: Vec<String> = token.split('.').map(str::to_owned).collect();
                parts[1].push('=');
                parts.join(".")
            }
        };
        let verified = signer.verify(&presented).map(|u| u.as_str().to_owned());
        let expected = (presented == token).then(|| user.clone());
        prop_assert_eq!(&verified, &expected, "{:?}", presented);
        Ok(verified.is_some())
    });
}

#[test]
fn user_ids_are_accepted_exactly_when_they_are_safe_path_components() {
    let text = prop_oneof![
        4 => "[a-z0-9][a-z0-9._-]{0,63}",
        1 => "[A-Za-z0-9._-]{0,70}",
        1 => "[a-z]{1,8}(\\.git|\\.atom|\\.\\.|/|%2e|\\.)[a-z]{0,3}",
        1 => any::<String>(),
    ];
    check("user-id", (text, text_edit()), 0.2, |(text, edit)| {
        let text = apply(&text, &edit);
        let parsed = UserId::parse(&text);
        prop_assert_eq!(parsed.is_ok(), is_user_id(&text), "{:?}", text);
        if let Ok(user) = &parsed {
            prop_assert_eq!(user.as_str(), text.as_str());
        }
        Ok(parsed.is_ok())
    });
}
