//! `shmastra.json`: the names (never the values) of the variables in `.env`, so a restore
//! knows which secrets to ask for; and, under `env_files` (only when there is one), those of
//! the other root env files the watcher never saves (`.env.local`, `.env.production`, ...).

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::Path;

use shmastra_contract::manifest::{
    MANIFEST_FILE, Manifest, ManifestError, is_env_file_name, validate_name,
};

use crate::filter::ENV_FILE;

/// The names in a `.env` text, sorted and unique, read as `dotenvy` reads them, and how many
/// entries could not be parsed (skipped; their text is never reported since it may hold a
/// secret).
pub fn env_names(text: &[u8]) -> (Vec<String>, usize) {
    let text = text.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(text);
    let mut names = Vec::new();
    let mut malformed = 0;
    for item in dotenvy::from_read_iter(text) {
        match item {
            Ok((name, _value)) => names.push(name),
            Err(dotenvy::Error::LineParse(..)) => malformed += 1,
            Err(_) => {
                malformed += 1;
                break;
            }
        }
    }
    names.sort();
    names.dedup();
    (names, malformed)
}

/// The manifest for these names. A name the cloud could not ask for (longer than
/// [`MAX_NAME_LEN`](shmastra_contract::manifest::MAX_NAME_LEN); dotenvy reads no other
/// invalid name) is left out with a warning, so the manifest stays one the cloud accepts.
/// Fails only when the names are too many for any manifest.
pub(crate) fn manifest_for(
    names: &[String],
    env_files: &BTreeMap<String, Vec<String>>,
) -> Result<Manifest, ManifestError> {
    let valid = |file: &str, names: &[String]| -> Vec<String> {
        names
            .iter()
            .filter(|name| match validate_name(name) {
                Ok(()) => true,
                Err(reason) => {
                    tracing::warn!(file, name = %name, reason, "left out of {MANIFEST_FILE}: restore cannot ask for it");
                    false
                }
            })
            .cloned()
            .collect()
    };
    let mut manifest = Manifest::new(valid(ENV_FILE, names))?;
    for (file, names) in env_files {
        manifest = manifest.with_env_file(file, valid(file, names))?;
    }
    Ok(manifest)
}

/// Brings `workdir/shmastra.json` in line with `workdir/.env`, writing it (atomically) only
/// when its content would change. Returns whether it wrote.
pub fn sync(workdir: &Path) -> io::Result<bool> {
    let names_in = |file: &str| -> io::Result<Vec<String>> {
        let env = match fs::read(workdir.join(file)) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        let (names, malformed) = env_names(&env);
        if malformed > 0 {
            tracing::warn!(
                file,
                malformed,
                "skipped env file entries that could not be parsed (their text is not shown)"
            );
        }
        Ok(names)
    };
    let names = names_in(ENV_FILE)?;
    let mut env_files = BTreeMap::new();
    for entry in fs::read_dir(workdir)?.flatten() {
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        let is_file = fs::metadata(entry.path()).is_ok_and(|m| m.is_file());
        if name != ENV_FILE && is_file && is_env_file_name(&name) {
            env_files.insert(name.clone(), names_in(&name)?);
        }
    }
    let wanted = manifest_for(&names, &env_files)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?
        .to_json();
    let path = workdir.join(MANIFEST_FILE);
    if fs::read(&path).is_ok_and(|current| current == wanted.as_bytes()) {
        return Ok(false);
    }
    let tmp = workdir.join(format!(".{MANIFEST_FILE}.tmp.{}", std::process::id()));
    fs::write(&tmp, wanted)?;
    fs::rename(&tmp, &path)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_as_dotenvy_reads_them() {
        let check = |input: &str, names: &[&str], malformed: usize| {
            let (got, bad) = env_names(input.as_bytes());
            assert_eq!(got, names, "{input:?}");
            assert_eq!(bad, malformed, "{input:?}");
        };
        check("", &[], 0);
        check("B=1\nA=2\n", &["A", "B"], 0);
        check("# comment\n\nexport TOKEN=x\n", &["TOKEN"], 0);
        check(
            "MULTI=\"line one\nNOT_A_NAME=inside\"\nAFTER=1\n",
            &["AFTER", "MULTI"],
            0,
        );
        check("A=1\nA=2\n", &["A"], 0);
        check("\u{feff}BOM=1\n", &["BOM"], 0);
        check(
            "GOOD=1\nthis line is bad\nALSO_GOOD=2\n",
            &["ALSO_GOOD", "GOOD"],
            1,
        );
    }

    #[test]
    fn names_the_cloud_cannot_ask_for_are_left_out() {
        let long = "A".repeat(257);
        let manifest = manifest_for(&["B".into(), long.clone()], &BTreeMap::new()).unwrap();
        assert_eq!(manifest.env(), ["B"]);
        let too_many: Vec<String> = (0..1001).map(|i| format!("K{i}")).collect();
        let err = manifest_for(&too_many, &BTreeMap::new()).unwrap_err();
        assert!(err.to_string().contains("1001 variables"), "{err}");
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(".env"), format!("{long}=x\nOK=1\n")).unwrap();
        assert!(sync(dir.path()).unwrap());
        let written = Manifest::read(&dir.path().join(MANIFEST_FILE)).unwrap();
        assert_eq!(written.env(), ["OK"]);
    }

    #[test]
    fn sync_writes_only_on_change_and_never_a_value() {
        let dir = tempfile::tempdir().unwrap();
        assert!(sync(dir.path()).unwrap());
        assert!(!sync(dir.path()).unwrap());
        fs::write(dir.path().join(".env"), "API_KEY=s3cr3t-value\n").unwrap();
        assert!(sync(dir.path()).unwrap());
        let text = fs::read_to_string(dir.path().join(MANIFEST_FILE)).unwrap();
        assert!(
            text.contains("API_KEY") && !text.contains("s3cr3t"),
            "{text}"
        );
        fs::write(dir.path().join(".env"), "API_KEY=changed\n").unwrap();
        assert!(!sync(dir.path()).unwrap());
    }

    #[test]
    fn other_env_files_get_their_own_lists_and_templates_none() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(".env"), "A=1\n").unwrap();
        fs::write(dir.path().join(".env.local"), "LOCAL_KEY=secret-value\n").unwrap();
        fs::write(dir.path().join(".env.production"), "PROD=x\nB=y\n").unwrap();
        fs::write(dir.path().join(".env.example"), "EXAMPLE=\n").unwrap();
        assert!(sync(dir.path()).unwrap());
        let text = fs::read_to_string(dir.path().join(MANIFEST_FILE)).unwrap();
        assert_eq!(
            text,
            "{\n  \"version\": 1,\n  \"env\": [\n    \"A\"\n  ],\n  \"env_files\": {\n    \
             \".env.local\": [\n      \"LOCAL_KEY\"\n    ],\n    \".env.production\": [\n      \
             \"B\",\n      \"PROD\"\n    ]\n  }\n}\n"
        );
        assert!(!text.contains("secret-value"));
    }
}
