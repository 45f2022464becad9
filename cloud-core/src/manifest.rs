//! `shmastra.json`: the tracked list of the names of a project's secret variables (never their
//! values), parsed strictly so a restore form asks for exactly the right fields.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// The manifest's file name at the project root.
pub const MANIFEST_FILE: &str = "shmastra.json";
/// The one format version this build reads and writes.
pub const MANIFEST_VERSION: u64 = 1;
/// Longest accepted variable name, in bytes.
pub const MAX_NAME_LEN: usize = 256;
/// Most variables one manifest may list.
pub const MAX_NAMES: usize = 1000;

/// The parsed manifest: variable names, sorted and unique.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Manifest {
    env: Vec<String>,
}

/// What is wrong with a manifest, and in which file when it came from one.
#[derive(Debug, thiserror::Error)]
pub struct ManifestError {
    pub path: Option<PathBuf>,
    pub problem: ManifestProblem,
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(path) => write!(f, "{}: {}", path.display(), self.problem),
            None => write!(f, "{MANIFEST_FILE}: {}", self.problem),
        }
    }
}

/// One way a manifest can be wrong.
#[derive(Debug, thiserror::Error)]
pub enum ManifestProblem {
    #[error("cannot read it: {0}")]
    Read(std::io::Error),
    #[error("cannot write it: {0}")]
    Write(std::io::Error),
    #[error("not valid JSON: {0}")]
    Json(serde_json::Error),
    #[error("expected a JSON object like {{\"version\": 1, \"env\": []}}")]
    NotAnObject,
    #[error("the field {0:?} is missing")]
    MissingField(&'static str),
    #[error("unknown field {0:?} (version 1 has only \"version\" and \"env\")")]
    UnknownField(String),
    #[error("version {0} is not supported: this build reads version {MANIFEST_VERSION}")]
    UnsupportedVersion(String),
    #[error("\"env\" must be a list of variable names")]
    EnvNotAList,
    #[error("\"env\"[{index}] is not a string")]
    NameNotAString { index: usize },
    #[error("{name:?} is not a valid variable name: {reason}")]
    InvalidName { name: String, reason: &'static str },
    #[error("{0:?} is listed twice")]
    DuplicateName(String),
    #[error("it lists {0} variables; at most {MAX_NAMES} are allowed")]
    TooManyNames(usize),
}

/// Checks that `name` can be a `.env` key that `dotenvy` reads back: a letter or `_`, then
/// letters, digits, `_` or `.`.
pub fn validate_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("it is empty");
    }
    if name.len() > MAX_NAME_LEN {
        return Err("it is longer than 256 characters");
    }
    if !name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
        return Err("it must start with a letter or '_'");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
    {
        return Err("only letters, digits, '_' and '.' are allowed");
    }
    Ok(())
}

impl Manifest {
    /// A manifest listing `names`, which must be valid and unique; they are kept sorted.
    pub fn new<I, S>(names: I) -> Result<Manifest, ManifestError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Manifest::from_names(names.into_iter().map(Into::into).collect()).map_err(|problem| {
            ManifestError {
                path: None,
                problem,
            }
        })
    }

    /// Parses the text of a manifest strictly: exactly `version` (1) and `env`.
    pub fn parse(text: &str) -> Result<Manifest, ManifestError> {
        Manifest::parse_value(text).map_err(|problem| ManifestError {
            path: None,
            problem,
        })
    }

    /// Reads and parses the manifest at `path`.
    pub fn read(path: &Path) -> Result<Manifest, ManifestError> {
        let at = |problem| ManifestError {
            path: Some(path.to_owned()),
            problem,
        };
        let text = std::fs::read_to_string(path).map_err(|e| at(ManifestProblem::Read(e)))?;
        Manifest::parse_value(&text).map_err(at)
    }

    /// The variable names, sorted.
    pub fn env(&self) -> &[String] {
        &self.env
    }

    /// The canonical text: 2-space indented, names sorted, one trailing newline.
    pub fn to_json(&self) -> String {
        #[derive(serde::Serialize)]
        struct Canonical<'a> {
            version: u64,
            env: &'a [String],
        }
        let canonical = Canonical {
            version: MANIFEST_VERSION,
            env: &self.env,
        };
        let mut text = serde_json::to_string_pretty(&canonical).expect("a manifest serializes");
        text.push('\n');
        text
    }

    /// Writes the canonical text to `path` through a temporary file and a rename, and only when
    /// the content differs. Returns whether it wrote.
    pub fn write(&self, path: &Path) -> Result<bool, ManifestError> {
        let at = |e| ManifestError {
            path: Some(path.to_owned()),
            problem: ManifestProblem::Write(e),
        };
        let text = self.to_json();
        if std::fs::read(path).is_ok_and(|old| old == text.as_bytes()) {
            return Ok(false);
        }
        let mut temp = path.as_os_str().to_owned();
        temp.push(".tmp");
        let temp = PathBuf::from(temp);
        std::fs::write(&temp, &text).map_err(at)?;
        std::fs::rename(&temp, path).map_err(|e| {
            let _ = std::fs::remove_file(&temp);
            at(e)
        })?;
        Ok(true)
    }

    fn parse_value(text: &str) -> Result<Manifest, ManifestProblem> {
        let value: Value = serde_json::from_str(text).map_err(ManifestProblem::Json)?;
        let Value::Object(fields) = value else {
            return Err(ManifestProblem::NotAnObject);
        };
        // The version decides how to read everything else, so it is checked first.
        match fields.get("version") {
            None => return Err(ManifestProblem::MissingField("version")),
            Some(v) if v.as_u64() == Some(MANIFEST_VERSION) => {}
            Some(v) => return Err(ManifestProblem::UnsupportedVersion(v.to_string())),
        }
        if let Some(unknown) = fields
            .keys()
            .find(|k| !matches!(k.as_str(), "version" | "env"))
        {
            return Err(ManifestProblem::UnknownField(unknown.clone()));
        }
        let Some(env) = fields.get("env") else {
            return Err(ManifestProblem::MissingField("env"));
        };
        let Value::Array(items) = env else {
            return Err(ManifestProblem::EnvNotAList);
        };
        let names = items
            .iter()
            .enumerate()
            .map(|(index, item)| {
                item.as_str()
                    .map(str::to_owned)
                    .ok_or(ManifestProblem::NameNotAString { index })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Manifest::from_names(names)
    }

    fn from_names(names: Vec<String>) -> Result<Manifest, ManifestProblem> {
        if names.len() > MAX_NAMES {
            return Err(ManifestProblem::TooManyNames(names.len()));
        }
        let mut seen = BTreeSet::new();
        for name in names {
            if let Err(reason) = validate_name(&name) {
                return Err(ManifestProblem::InvalidName {
                    name: name.chars().take(80).collect(),
                    reason,
                });
            }
            if seen.contains(&name) {
                return Err(ManifestProblem::DuplicateName(name));
            }
            seen.insert(name);
        }
        Ok(Manifest {
            env: seen.into_iter().collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(text: &str) -> String {
        Manifest::parse(text).unwrap_err().to_string()
    }

    #[test]
    fn parses_and_sorts() {
        let manifest =
            Manifest::parse(r#"{"version": 1, "env": ["OPENAI_API_KEY", "A_1", "_x", "a.b"]}"#)
                .unwrap();
        assert_eq!(manifest.env(), ["A_1", "OPENAI_API_KEY", "_x", "a.b"]);
        assert!(
            Manifest::parse(r#"{"env": [], "version": 1}"#)
                .unwrap()
                .env()
                .is_empty()
        );
    }

    #[test]
    fn canonical_text() {
        let manifest = Manifest::new(["B", "A"]).unwrap();
        assert_eq!(
            manifest.to_json(),
            "{\n  \"version\": 1,\n  \"env\": [\n    \"A\",\n    \"B\"\n  ]\n}\n"
        );
        assert_eq!(
            Manifest::default().to_json(),
            "{\n  \"version\": 1,\n  \"env\": []\n}\n"
        );
        assert_eq!(Manifest::parse(&manifest.to_json()).unwrap(), manifest);
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let cases = [
            ("", "not valid JSON"),
            ("{\"version\": 1, \"env\": [}", "not valid JSON"),
            ("[]", "expected a JSON object"),
            ("{\"env\": []}", "\"version\" is missing"),
            (
                "{\"version\": 2, \"env\": []}",
                "version 2 is not supported",
            ),
            (
                "{\"version\": \"1\", \"env\": []}",
                "version \"1\" is not supported",
            ),
            (
                "{\"version\": 1.5, \"env\": []}",
                "version 1.5 is not supported",
            ),
            ("{\"version\": 1}", "\"env\" is missing"),
            (
                "{\"version\": 1, \"env\": [], \"values\": {}}",
                "unknown field \"values\"",
            ),
            ("{\"version\": 1, \"env\": \"A\"}", "must be a list"),
            (
                "{\"version\": 1, \"env\": [\"A\", 3]}",
                "\"env\"[1] is not a string",
            ),
            (
                "{\"version\": 1, \"env\": [\"1A\"]}",
                "\"1A\" is not a valid variable name",
            ),
            ("{\"version\": 1, \"env\": [\"A-B\"]}", "only letters"),
            ("{\"version\": 1, \"env\": [\"\"]}", "it is empty"),
            (
                "{\"version\": 1, \"env\": [\"A\", \"A\"]}",
                "\"A\" is listed twice",
            ),
        ];
        for (text, expected) in cases {
            let message = problem(text);
            assert!(message.starts_with("shmastra.json: "), "{message}");
            assert!(message.contains(expected), "{text:?}: {message}");
        }
    }

    #[test]
    fn write_is_atomic_and_skips_unchanged_content() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(MANIFEST_FILE);
        let manifest = Manifest::new(["KEY"]).unwrap();
        assert!(manifest.write(&path).unwrap());
        assert!(!manifest.write(&path).unwrap());
        assert_eq!(Manifest::read(&path).unwrap(), manifest);
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "a temp file was left behind"
        );

        std::fs::write(&path, "{\"version\": 9, \"env\": []}").unwrap();
        let err = Manifest::read(&path).unwrap_err().to_string();
        assert!(
            err.starts_with(&path.display().to_string()) && err.contains("version 9"),
            "{err}"
        );
    }
}
