//! `shmastra.json`: the names (never the values) of the variables in `.env`, so a restore
//! knows which secrets to ask for.

use std::fs;
use std::io;
use std::path::Path;

/// The manifest's file name, at the project root.
pub const MANIFEST_FILE: &str = "shmastra.json";

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

/// The manifest text for these names: 2-space indented JSON with one trailing newline.
pub fn render(names: &[String]) -> String {
    #[derive(serde::Serialize)]
    struct Manifest<'a> {
        version: u32,
        env: &'a [String],
    }
    let body = Manifest {
        version: 1,
        env: names,
    };
    let mut text = serde_json::to_string_pretty(&body).expect("names always serialise");
    text.push('\n');
    text
}

/// Brings `workdir/shmastra.json` in line with `workdir/.env`, writing it (atomically) only
/// when its content would change. Returns whether it wrote.
pub fn sync(workdir: &Path) -> io::Result<bool> {
    let env = match fs::read(workdir.join(crate::filter::ENV_FILE)) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e),
    };
    let (names, malformed) = env_names(&env);
    if malformed > 0 {
        tracing::warn!(
            malformed,
            "skipped .env entries that could not be parsed (their text is not shown)"
        );
    }
    let wanted = render(&names);
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
    fn render_is_stable() {
        assert_eq!(render(&[]), "{\n  \"version\": 1,\n  \"env\": []\n}\n");
        assert_eq!(
            render(&["A".into(), "B".into()]),
            "{\n  \"version\": 1,\n  \"env\": [\n    \"A\",\n    \"B\"\n  ]\n}\n"
        );
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
}
