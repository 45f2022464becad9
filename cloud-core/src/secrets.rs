//! Secret values and the restore form: validate what a user submits against the manifest
//! (reporting every problem at once) and render the `.env` file that both `dotenvy` and Node's
//! `dotenv` (what Next.js, Vite and Mastra read `.env` with) read back exactly. Values are
//! redacted in `Debug`/`Display` and zeroed when dropped.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use zeroize::Zeroizing;

use shmastra_contract::Manifest;

/// Largest accepted value, in bytes.
pub const MAX_VALUE_BYTES: usize = 64 * 1024;
/// Largest accepted form, all values together, in bytes.
pub const MAX_TOTAL_BYTES: usize = 1024 * 1024;

/// A secret value. `Debug` and `Display` print `[redacted]`; the memory is zeroed on drop.
///
/// `Zeroizing<String>` rather than `secrecy::SecretString`: it keeps the `String`'s own buffer
/// (no shrinking copy left behind unzeroed) and zeroes its whole capacity.
#[derive(Clone)]
pub struct SecretValue(Zeroizing<String>);

impl SecretValue {
    /// Holds `value` (zeroed when dropped).
    pub fn new(value: impl Into<String>) -> SecretValue {
        SecretValue(Zeroizing::new(value.into()))
    }

    /// The value itself, for the code that writes `.env` or hands it to a sandbox.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.expose().len()
    }

    /// Whether the value is the empty string.
    pub fn is_empty(&self) -> bool {
        self.expose().is_empty()
    }
}

impl From<String> for SecretValue {
    fn from(value: String) -> Self {
        SecretValue::new(value)
    }
}

impl From<&str> for SecretValue {
    fn from(value: &str) -> Self {
        SecretValue::new(value)
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl fmt::Display for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// One thing wrong with a submitted form. Names only: a value never appears here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FormProblem {
    /// A name the project needs was not given.
    Missing {
        /// The name.
        name: String,
    },
    /// A name the project does not use.
    Unexpected {
        /// The name.
        name: String,
    },
    /// A name given more than once.
    Duplicate {
        /// The name.
        name: String,
    },
    /// A value with a NUL byte (no `.env` reader carries one).
    ContainsNul {
        /// The name.
        name: String,
    },
    /// A value over the per-value limit.
    TooLarge {
        /// The name.
        name: String,
        /// The value's length.
        bytes: usize,
    },
    /// A value no `.env` quoting carries exactly to every reader (see [`render_env`]).
    NoExactForm {
        /// The name.
        name: String,
    },
    /// All values together over the form's limit.
    TotalTooLarge {
        /// Their length together.
        bytes: usize,
    },
}

impl fmt::Display for FormProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FormProblem::Missing { name } => write!(f, "{name}: missing (the project needs it)"),
            FormProblem::Unexpected { name } => {
                write!(f, "{name:?}: not a variable this project uses")
            }
            FormProblem::Duplicate { name } => write!(f, "{name}: submitted more than once"),
            FormProblem::ContainsNul { name } => write!(f, "{name}: contains a NUL byte"),
            FormProblem::NoExactForm { name } => write!(
                f,
                "{name}: cannot be written to .env so that every tool reads it the same (a value with a ' cannot also hold \", \\, $ or a line break; no value may hold a carriage return or end with \\)"
            ),
            FormProblem::TooLarge { name, bytes } => {
                write!(
                    f,
                    "{name}: {bytes} bytes, more than the {MAX_VALUE_BYTES} allowed"
                )
            }
            FormProblem::TotalTooLarge { bytes } => {
                write!(
                    f,
                    "all values together are {bytes} bytes, more than the {MAX_TOTAL_BYTES} allowed"
                )
            }
        }
    }
}

/// A rejected form, with every problem found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct RestoreFormError {
    /// Every problem, in the order found.
    pub problems: Vec<FormProblem>,
}

impl fmt::Display for RestoreFormError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the secrets form has {} problem(s): ",
            self.problems.len()
        )?;
        for (i, problem) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}

/// A validated form: exactly the manifest's names, each with an acceptable value.
#[derive(Debug, Clone)]
pub struct RestoreForm {
    values: BTreeMap<String, SecretValue>,
}

impl RestoreForm {
    /// Checks `submitted` against `manifest`: every listed name present, no other name, no
    /// duplicate, no NUL byte, each value and the whole within the size limits, each value one
    /// that a `.env` quoting carries exactly.
    pub fn validate(
        manifest: &Manifest,
        submitted: impl IntoIterator<Item = (String, SecretValue)>,
    ) -> Result<RestoreForm, RestoreFormError> {
        let form_names = manifest.form_names();
        let expected: BTreeSet<&str> = form_names.iter().map(String::as_str).collect();
        let mut problems = Vec::new();
        let mut values = BTreeMap::new();
        let mut total = 0usize;
        for (name, value) in submitted {
            total = total.saturating_add(value.len());
            if !expected.contains(name.as_str()) {
                problems.push(FormProblem::Unexpected {
                    name: name.chars().take(80).collect(),
                });
                continue;
            }
            if values.contains_key(&name) {
                if !problems
                    .iter()
                    .any(|p| matches!(p, FormProblem::Duplicate { name: n } if *n == name))
                {
                    problems.push(FormProblem::Duplicate { name });
                }
                continue;
            }
            if value.expose().contains('\0') {
                problems.push(FormProblem::ContainsNul { name: name.clone() });
            } else if value.len() > MAX_VALUE_BYTES {
                problems.push(FormProblem::TooLarge {
                    name: name.clone(),
                    bytes: value.len(),
                });
            } else if quoting(value.expose()).is_none() {
                problems.push(FormProblem::NoExactForm { name: name.clone() });
            }
            values.insert(name, value);
        }
        for name in &expected {
            if !values.contains_key(*name) {
                problems.push(FormProblem::Missing {
                    name: (*name).to_owned(),
                });
            }
        }
        if total > MAX_TOTAL_BYTES {
            problems.push(FormProblem::TotalTooLarge { bytes: total });
        }
        if problems.is_empty() {
            tracing::debug!(variables = values.len(), "secrets form accepted");
            Ok(RestoreForm { values })
        } else {
            tracing::info!(problems = problems.len(), "secrets form rejected");
            Err(RestoreFormError { problems })
        }
    }

    /// The value submitted for `name`.
    pub fn get(&self, name: &str) -> Option<&SecretValue> {
        self.values.get(name)
    }

    /// Names and values, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &SecretValue)> {
        self.values.iter().map(|(k, v)| (k.as_str(), v))
    }
}

/// The `.env` text for `form`, one `NAME=value` line per variable, sorted by name.
///
/// Each value is written in the one form that `dotenvy` and Node's `dotenv` both read exactly
/// (checked against both): in single quotes, which both read literally (`#`, `$`, `"`, `\`,
/// line breaks, unicode), when the value has no `'` and does not end with `\` (both readers take
/// `\'` for an escaped quote and run on); else in double quotes, when it has no `"`, `\`, `$`
/// or line break (dotenvy unescapes and substitutes inside them, dotenv only turns `\n` into a
/// line break). [`RestoreForm::validate`] refuses every other value (and any with a carriage
/// return, which dotenv turns into a line break): no quoting carries it to both.
pub fn render_env(form: &RestoreForm) -> SecretValue {
    render(form, None)
}

/// The text of the env file `file` (`.env.local`, ...) from the form's `FILE:NAME` values,
/// quoted as [`render_env`] quotes them.
pub fn render_env_file(form: &RestoreForm, file: &str) -> SecretValue {
    render(form, Some(file))
}

fn render(form: &RestoreForm, file: Option<&str>) -> SecretValue {
    let of_file = |name: &str| -> Option<usize> {
        match (file, name.split_once(':')) {
            (None, None) => Some(0),
            (Some(file), Some((f, _))) if f == file => Some(file.len() + 1),
            _ => None,
        }
    };
    // Sized exactly so the buffer never grows: a reallocation would leave an unzeroed copy of
    // the secrets behind.
    let capacity = form
        .iter()
        .filter_map(|(name, value)| Some(name.len() - of_file(name)? + value.len() + 4))
        .sum();
    let mut out = String::with_capacity(capacity);
    for (name, value) in form.iter() {
        let Some(skip) = of_file(name) else { continue };
        out.push_str(&name[skip..]);
        out.push('=');
        let quote = match quoting(value.expose()) {
            Some(Quoting::Single) => '\'',
            Some(Quoting::Double) => '"',
            None => unreachable!("RestoreForm::validate refuses a value with no exact form"),
        };
        out.push(quote);
        out.push_str(value.expose());
        out.push(quote);
        out.push('\n');
    }
    debug_assert_eq!(out.len(), capacity);
    SecretValue::new(out)
}

/// The quotes a `.env` value is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Quoting {
    Single,
    Double,
}

/// How `value` is written so that dotenvy and Node's dotenv both read exactly it; `None` when
/// no quoting does.
fn quoting(value: &str) -> Option<Quoting> {
    if value.contains(['\r', '\0']) {
        None
    } else if !value.contains('\'') && !value.ends_with('\\') {
        Some(Quoting::Single)
    } else if !value.contains(['"', '\\', '$', '\n']) {
        Some(Quoting::Double)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_env_files_are_asked_for_as_file_colon_name_and_rendered_apart() {
        let manifest = Manifest::new(["A"])
            .unwrap()
            .with_env_file(".env.local", ["B"])
            .unwrap();
        let form = RestoreForm::validate(
            &manifest,
            [
                ("A".to_owned(), SecretValue::new("root".to_owned())),
                (
                    ".env.local:B".to_owned(),
                    SecretValue::new("local".to_owned()),
                ),
            ],
        )
        .unwrap();
        assert_eq!(render_env(&form).expose(), "A='root'\n");
        assert_eq!(render_env_file(&form, ".env.local").expose(), "B='local'\n");
        let missing = RestoreForm::validate(
            &manifest,
            [("A".to_owned(), SecretValue::new("root".to_owned()))],
        )
        .unwrap_err();
        assert!(missing.to_string().contains(".env.local:B"), "{missing}");
        let unqualified = RestoreForm::validate(
            &manifest,
            [
                ("A".to_owned(), SecretValue::new("root".to_owned())),
                ("B".to_owned(), SecretValue::new("local".to_owned())),
            ],
        )
        .unwrap_err();
        assert!(unqualified.to_string().contains("B"), "{unqualified}");
    }
    use proptest::prelude::*;

    fn manifest(names: &[&str]) -> Manifest {
        Manifest::new(names.iter().copied()).unwrap()
    }

    fn form(pairs: &[(&str, &str)]) -> Vec<(String, SecretValue)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), SecretValue::from(*v)))
            .collect()
    }

    fn parse_env(text: &str) -> Vec<(String, String)> {
        dotenvy::from_read_iter(text.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap_or_else(|e| panic!("dotenvy cannot read {text:?}: {e}"))
    }

    fn round_trip(values: &[(&str, &str)]) {
        let names: Vec<&str> = values.iter().map(|(k, _)| *k).collect();
        let validated = RestoreForm::validate(&manifest(&names), form(values)).unwrap();
        let env = render_env(&validated);
        let mut expected: Vec<(String, String)> = values
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        expected.sort();
        assert_eq!(
            parse_env(env.expose()),
            expected,
            "rendered as {:?}",
            env.expose()
        );
    }

    #[test]
    fn render_round_trips_awkward_values() {
        for value in [
            "",
            "plain",
            "with space",
            " leading and trailing ",
            "it's",
            "'",
            "''",
            "a \\ inside",
            "\"double\" quotes",
            "it's #1 and {braces} = fine",
            "# not a comment",
            "a #hash",
            "$HOME and ${HOME} and $",
            "line 1\nline 2\n",
            "\n",
            "tab\there",
            "unicode: ключ 🔑 \u{2028} \u{85}",
            "=equals=",
            "export X=1",
        ] {
            round_trip(&[("KEY", value)]);
        }
        round_trip(&[
            ("A", "one\nA=two"),
            ("B", "\"\n#"),
            ("C.d", "x"),
            ("export", "y"),
        ]);
    }

    #[test]
    fn values_no_quoting_carries_to_both_readers_are_refused() {
        for value in [
            "x'\nNODE_OPTIONS=--require /tmp/evil.js #",
            "it's \"quoted\"",
            "it's $HOME",
            "it's a \\",
            "ends with backslash\\",
            "\\",
            "crlf\r\nend",
            "\r",
        ] {
            let refused =
                RestoreForm::validate(&manifest(&["K"]), form(&[("K", value)])).unwrap_err();
            assert_eq!(
                refused.problems,
                [FormProblem::NoExactForm { name: "K".into() }],
                "{value:?}"
            );
        }
    }

    #[test]
    fn render_fills_its_buffer_exactly() {
        for value in ["a'a'a'a", "''''", r"\\\\a", r"a\a", "", "ключ'"] {
            let validated =
                RestoreForm::validate(&manifest(&["K"]), form(&[("K", value)])).unwrap();
            let env = render_env(&validated);
            assert_eq!(env.expose().len(), 1 + value.len() + 4, "{value:?}");
            round_trip(&[("K", value)]);
        }
    }

    #[test]
    fn render_shape() {
        let validated =
            RestoreForm::validate(&manifest(&["B", "A"]), form(&[("A", "x'y"), ("B", "")]))
                .unwrap();
        assert_eq!(render_env(&validated).expose(), "A=\"x'y\"\nB=''\n");
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let mut submitted = form(&[
            ("A", "ok"),
            ("A", "again"),
            ("C", "nul\0byte"),
            ("EXTRA", "x"),
        ]);
        submitted.push((
            "D".into(),
            SecretValue::new("x".repeat(MAX_VALUE_BYTES + 1)),
        ));
        let err = RestoreForm::validate(&manifest(&["A", "B", "C", "D"]), submitted).unwrap_err();
        assert_eq!(
            err.problems,
            vec![
                FormProblem::Duplicate { name: "A".into() },
                FormProblem::ContainsNul { name: "C".into() },
                FormProblem::Unexpected {
                    name: "EXTRA".into()
                },
                FormProblem::TooLarge {
                    name: "D".into(),
                    bytes: MAX_VALUE_BYTES + 1
                },
                FormProblem::Missing { name: "B".into() },
            ]
        );
        let text = err.to_string();
        assert!(
            text.starts_with("the secrets form has 5 problem(s): "),
            "{text}"
        );
        assert!(
            !text.contains("nul") && !text.contains("again"),
            "a value leaked: {text}"
        );
    }

    #[test]
    fn total_size_is_limited() {
        let names: Vec<String> = (0..20).map(|i| format!("K{i}")).collect();
        let m = Manifest::new(names.clone()).unwrap();
        let submitted = names
            .into_iter()
            .map(|n| (n, SecretValue::new("x".repeat(MAX_VALUE_BYTES))));
        let err = RestoreForm::validate(&m, submitted).unwrap_err();
        assert_eq!(
            err.problems,
            vec![FormProblem::TotalTooLarge {
                bytes: 20 * MAX_VALUE_BYTES
            }]
        );
    }

    #[test]
    fn an_empty_manifest_takes_an_empty_form() {
        let validated = RestoreForm::validate(&Manifest::default(), Vec::new()).unwrap();
        assert_eq!(render_env(&validated).expose(), "");
    }

    #[test]
    fn values_never_show() {
        let value = SecretValue::from("hunter2-very-secret");
        assert_eq!(format!("{value:?} {value}"), "[redacted] [redacted]");
        let validated =
            RestoreForm::validate(&manifest(&["PASSWORD"]), vec![("PASSWORD".into(), value)])
                .unwrap();
        let shown = format!("{validated:?} {:?}", render_env(&validated));
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("PASSWORD"), "{shown}");
    }

    fn name_strategy() -> impl Strategy<Value = String> {
        "[A-Za-z_][A-Za-z0-9_.]{0,12}"
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn render_then_dotenvy_round_trips(
            vars in prop::collection::btree_map(name_strategy(), "[^\u{0}\r']{0,40}", 1..6),
        ) {
            let submitted: Vec<(String, SecretValue)> = vars.iter().map(|(k, v)| (k.clone(), SecretValue::from(v.as_str()))).collect();
            match RestoreForm::validate(&Manifest::new(vars.keys().cloned()).unwrap(), submitted) {
                Ok(validated) => {
                    let env = render_env(&validated);
                    let parsed: Vec<(String, String)> = dotenvy::from_read_iter(env.expose().as_bytes()).collect::<Result<_, _>>().unwrap();
                    let expected: Vec<(String, String)> = vars.into_iter().collect();
                    prop_assert_eq!(parsed, expected);
                }
                Err(refused) => {
                    // Only a value ending with a backslash has no form here.
                    prop_assert!(vars.values().any(|v| v.ends_with('\\')), "{:?}", refused.problems);
                }
            }
        }

        #[test]
        fn special_characters_round_trip_or_are_refused_for_having_no_form(value in "['\\\\\"#$ \n\r\t=a{}]{0,30}") {
            match RestoreForm::validate(&manifest(&["K"]), vec![("K".into(), SecretValue::from(value.as_str()))]) {
                Ok(validated) => {
                    let env = render_env(&validated);
                    let parsed: Vec<(String, String)> = dotenvy::from_read_iter(env.expose().as_bytes()).collect::<Result<_, _>>().unwrap();
                    prop_assert_eq!(parsed, vec![("K".to_owned(), value)]);
                }
                Err(refused) => prop_assert_eq!(refused.problems, vec![FormProblem::NoExactForm { name: "K".into() }]),
            }
        }
    }
}
