//! `shmastra.json`: the tracked list of the names of a project's secret variables (never their
//! values), written by the watcher and parsed strictly by the cloud so a restore form asks for
//! exactly the right fields. Both sides use this one definition.
//!
//! `env` lists the root `.env`'s names. The optional `env_files` maps each other root env
//! file the watcher never saves (`.env.local`, `.env.production`, ...; see
//! [`is_env_file_name`]) to its names; it is written only when there is such a file, so a
//! project without one keeps the exact text earlier versions wrote.

use std::collections::{BTreeMap, BTreeSet};
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

/// The parsed manifest: variable names, sorted and unique, per file.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Manifest {
    env: Vec<String>,
    env_files: BTreeMap<String, Vec<String>>,
}

/// Whether a file name is an env file the watcher never saves (so restore asks for its values):
/// `.env`, and `.env.<anything>` except the templates `.env.example`, `.env.sample` and
/// `.env.template`, which hold no secrets by convention and are saved.
pub fn is_env_file_name(name: &str) -> bool {
    name == ".env"
        || (name.starts_with(".env.")
            && name.len() > ".env.".len()
            && !name.contains('/')
            && ![".example", ".sample", ".template"]
                .iter()
                .any(|t| name.ends_with(t)))
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
    #[error("unknown field {0:?} (version 1 has only \"version\", \"env\" and \"env_files\")")]
    UnknownField(String),
    #[error("\"env_files\" must map env file names to lists of variable names")]
    EnvFilesNotAMap,
    #[error(
        "{0:?} is not an env file name (\".env.<suffix>\" at the project root, not a template)"
    )]
    InvalidEnvFile(String),
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

    /// The root `.env`'s variable names, sorted.
    pub fn env(&self) -> &[String] {
        &self.env
    }

    /// The other root env files and their names.
    pub fn env_files(&self) -> &BTreeMap<String, Vec<String>> {
        &self.env_files
    }

    /// Adds (or replaces) the names of the env file `file` (not `.env` itself).
    pub fn with_env_file<I, S>(mut self, file: &str, names: I) -> Result<Manifest, ManifestError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let at = |problem| ManifestError {
            path: None,
            problem,
        };
        if file == ".env" || !is_env_file_name(file) {
            return Err(at(ManifestProblem::InvalidEnvFile(file.to_owned())));
        }
        let names =
            Manifest::from_names(names.into_iter().map(Into::into).collect()).map_err(at)?;
        self.env_files.insert(file.to_owned(), names.env);
        let total = self.env.len() + self.env_files.values().map(Vec::len).sum::<usize>();
        if total > MAX_NAMES {
            return Err(at(ManifestProblem::TooManyNames(total)));
        }
        Ok(self)
    }

    /// What a restore form must hold: the `.env` names as they are, and each other file's
    /// names as `FILE:NAME` (`.env.local:API_KEY`).
    pub fn form_names(&self) -> Vec<String> {
        let mut names = self.env.clone();
        for (file, file_names) in &self.env_files {
            names.extend(file_names.iter().map(|n| format!("{file}:{n}")));
        }
        names
    }

    /// The canonical text: 2-space indented, names sorted, one trailing newline.
    pub fn to_json(&self) -> String {
        #[derive(serde::Serialize)]
        struct Canonical<'a> {
            version: u64,
            env: &'a [String],
            #[serde(skip_serializing_if = "BTreeMap::is_empty")]
            env_files: &'a BTreeMap<String, Vec<String>>,
        }
        let canonical = Canonical {
            version: MANIFEST_VERSION,
            env: &self.env,
            env_files: &self.env_files,
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
            .find(|k| !matches!(k.as_str(), "version" | "env" | "env_files"))
        {
            return Err(ManifestProblem::UnknownField(unknown.clone()));
        }
        let Some(env) = fields.get("env") else {
            return Err(ManifestProblem::MissingField("env"));
        };
        let mut manifest = Manifest::from_names(names_of(env)?)?;
        match fields.get("env_files") {
            None => {}
            Some(Value::Object(files)) => {
                let mut total = manifest.env.len();
                for (file, names) in files {
                    if file == ".env" || !is_env_file_name(file) {
                        return Err(ManifestProblem::InvalidEnvFile(
                            file.chars().take(80).collect(),
                        ));
                    }
                    let names = Manifest::from_names(names_of(names)?)?.env;
                    total += names.len();
                    if total > MAX_NAMES {
                        return Err(ManifestProblem::TooManyNames(total));
                    }
                    manifest.env_files.insert(file.clone(), names);
                }
            }
            Some(_) => return Err(ManifestProblem::EnvFilesNotAMap),
        }
        Ok(manifest)
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
            env_files: BTreeMap::new(),
        })
    }
}

/// The strings of a JSON list of names.
fn names_of(value: &Value) -> Result<Vec<String>, ManifestProblem> {
    let Value::Array(items) = value else {
        return Err(ManifestProblem::EnvNotAList);
    };
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            item.as_str()
                .map(str::to_owned)
                .ok_or(ManifestProblem::NameNotAString { index })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_files_are_optional_and_written_only_when_present() {
        let old = "{\n  \"version\": 1,\n  \"env\": [\n    \"A\"\n  ]\n}\n";
        let manifest = Manifest::parse(old).unwrap();
        assert!(manifest.env_files().is_empty());
        assert_eq!(manifest.to_json(), old);
        let text = r#"{"version": 1, "env": ["A"], "env_files": {".env.production.local": ["Z"], ".env.local": ["B", "A"]}}"#;
        let manifest = Manifest::parse(text).unwrap();
        assert_eq!(manifest.env_files()[".env.local"], ["A", "B"]);
        assert_eq!(
            manifest.form_names(),
            [
                "A",
                ".env.local:A",
                ".env.local:B",
                ".env.production.local:Z"
            ]
        );
        assert_eq!(Manifest::parse(&manifest.to_json()).unwrap(), manifest);
        for (bad, says) in [
            (r#"{"version": 1, "env": [], "env_files": []}"#, "must map"),
            (
                r#"{"version": 1, "env": [], "env_files": {".env": []}}"#,
                "not an env file",
            ),
            (
                r#"{"version": 1, "env": [], "env_files": {"a/.env.x": []}}"#,
                "not an env file",
            ),
            (
                r#"{"version": 1, "env": [], "env_files": {".env.example": []}}"#,
                "not an env file",
            ),
            (
                r#"{"version": 1, "env": [], "env_files": {".env.x": ["1A"]}}"#,
                "not a valid",
            ),
        ] {
            let err = problem(bad);
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn the_name_limit_counts_every_file() {
        let names = |prefix: &'static str, n: usize| (0..n).map(move |i| format!("{prefix}{i}"));
        let manifest = Manifest::new(names("A", 500)).unwrap();
        let full = manifest
            .clone()
            .with_env_file(".env.local", names("B", 500))
            .unwrap();
        assert_eq!(Manifest::parse(&full.to_json()).unwrap(), full);
        let err = manifest
            .with_env_file(".env.local", names("B", 501))
            .unwrap_err();
        assert!(err.to_string().contains("1001 variables"), "{err}");
    }

    #[test]
    fn env_file_names() {
        for (name, is) in [
            (".env", true),
            (".env.local", true),
            (".env.production", true),
            (".env.development.local", true),
            (".env.example", false),
            (".env.sample", false),
            (".env.template", false),
            (".env.", false),
            (".envrc", false),
            ("env.local", false),
        ] {
            assert_eq!(is_env_file_name(name), is, "{name}");
        }
    }

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
