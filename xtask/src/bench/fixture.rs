//! Deterministic fixture projects: a tracked `src/` tree, a large ignored `node_modules/`,
//! build output, `.env`, and a local bare remote. Every path and byte is a pure function of an
//! index, so two runs measure the same project.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::git::Git;

/// Bump when the generated content changes, so an old fixture on disk is regenerated.
const GENERATOR_VERSION: u32 = 2;
/// Tracked files per leaf folder and folders per level of `src/`.
const FILES_PER_DIR: usize = 6;
const FAN_OUT: usize = 8;
const SRC_FILE_NAMES: [&str; FILES_PER_DIR] = [
    "index.ts",
    "types.ts",
    "schema.ts",
    "handler.ts",
    "utils.ts",
    "constants.ts",
];
const SRC_LEVEL_NAMES: [&str; 6] = ["area", "module", "feature", "part", "unit", "leaf"];
/// Sub-folders of a package, shallow to deep, as npm packages lay out their build output.
const PACKAGE_DIRS: [&str; 12] = [
    "dist",
    "dist/esm",
    "dist/cjs",
    "dist/types",
    "lib",
    "lib/internal",
    "src",
    "src/utils",
    "dist/esm/utils",
    "dist/cjs/utils",
    "lib/internal/helpers",
    "dist/types/internal",
];
const PACKAGE_FILES_PER_DIR: usize = 9;
/// Where a burst installs its packages, so cleaning up after it is one `remove_dir_all` each.
pub const BURST_PREFIX: &str = "added-";
const ENV_NAMES: [&str; 2] = ["DATABASE_URL", "OPENAI_API_KEY"];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spec {
    pub tracked_files: usize,
    pub node_modules_files: usize,
}

/// The folders of one fixture. The project and its remote live side by side; logs and the
/// hermetic `HOME` sit outside the project so writing them raises no event in it.
pub struct Fixture {
    pub spec: Spec,
    pub project: PathBuf,
    pub remote: PathBuf,
    pub home: PathBuf,
    pub logs: PathBuf,
    pub git: Git,
}

#[derive(Serialize, Deserialize, PartialEq)]
struct Marker {
    generator: u32,
    spec: Spec,
}

impl Fixture {
    pub fn at(root: &Path, spec: Spec) -> Self {
        let dir = root.join(format!(
            "tracked-{}-nm-{}",
            spec.tracked_files, spec.node_modules_files
        ));
        let home = dir.join("home");
        Self {
            spec,
            project: dir.join("project"),
            remote: dir.join("remote.git"),
            logs: dir.join("logs"),
            git: Git::new(&home),
            home,
        }
    }

    fn dir(&self) -> &Path {
        self.project.parent().expect("fixture project has a parent")
    }

    /// Makes the fixture ready: reuses one left by an earlier run when it is the same
    /// generation and clean (everything committed and on the remote), otherwise writes it anew.
    pub fn prepare(&self) -> Result<()> {
        if self.reusable()? {
            // Earlier runs' commits left loose objects in fan-out folders (each one more watch
            // for the baseline) and packs (libgit2 lists the pack folder again before every
            // object it writes: 42 packs in the 10k fixture after 25 runs made the watcher's
            // 1,000-edit burst pay for them): one pack on each side, as a fresh fixture has.
            for dir in [&self.project, &self.remote] {
                self.git.run(dir, ["repack", "-a", "-d", "-q"])?;
                self.git.run(dir, ["prune-packed", "-q"])?;
            }
            return self.point_at_remote("set-url");
        }
        let dir = self.dir();
        if dir.exists() {
            fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
        }
        fs::create_dir_all(&self.home)?;
        fs::create_dir_all(&self.logs)?;
        write_project(&self.project, self.spec)?;
        self.commit_and_push()?;
        let marker = Marker {
            generator: GENERATOR_VERSION,
            spec: self.spec,
        };
        fs::write(dir.join("fixture.json"), serde_json::to_vec(&marker)?)?;
        Ok(())
    }

    fn reusable(&self) -> Result<bool> {
        let Ok(raw) = fs::read(self.dir().join("fixture.json")) else {
            return Ok(false);
        };
        let expected = Marker {
            generator: GENERATOR_VERSION,
            spec: self.spec,
        };
        if serde_json::from_slice::<Marker>(&raw).ok() != Some(expected) {
            return Ok(false);
        }
        remove_bursts(&self.project)?;
        let clean = self
            .git
            .run(&self.project, ["status", "--porcelain"])?
            .is_empty();
        let local = self.git.run(&self.project, ["rev-parse", "HEAD"])?;
        Ok(clean && self.remote_head()?.as_deref() == Some(local.trim()))
    }

    fn commit_and_push(&self) -> Result<()> {
        let p = &self.project;
        self.git.run(p, ["init", "-q", "-b", "main"])?;
        self.git.run(p, ["config", "user.name", "Bench Author"])?;
        self.git
            .run(p, ["config", "user.email", "bench@example.test"])?;
        self.git.run(p, ["add", "-A"])?;
        // No background auto-gc racing the explicit one below.
        self.git.run(
            p,
            [
                "-c",
                "gc.auto=0",
                "commit",
                "-q",
                "-m",
                "fixture: generated project",
            ],
        )?;
        // A project restored into a sandbox arrives packed, as a clone does.
        self.git.run(p, ["gc", "-q"])?;
        fs::create_dir_all(&self.remote)?;
        self.git
            .run(&self.remote, ["init", "-q", "--bare", "-b", "main"])?;
        self.point_at_remote("add")?;
        self.git.run(p, ["push", "-q", "project", "main"])?;
        Ok(())
    }

    /// `git remote add|set-url project <the bare remote's path>`.
    fn point_at_remote(&self, verb: &str) -> Result<()> {
        let url = self.remote.to_str().context("remote path is not UTF-8")?;
        self.git
            .run(&self.project, ["remote", verb, "project", url])
            .map(drop)
    }

    /// The remote's `main`, read from the ref files without starting a process, so that
    /// polling it every few milliseconds costs nothing measurable.
    pub fn remote_head(&self) -> Result<Option<String>> {
        let loose = self.remote.join("refs/heads/main");
        match fs::read_to_string(&loose) {
            Ok(s) if s.trim().len() == 40 => return Ok(Some(s.trim().to_owned())),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("reading {}", loose.display())),
        }
        let packed = fs::read_to_string(self.remote.join("packed-refs")).unwrap_or_default();
        Ok(packed.lines().find_map(|line| {
            let (oid, name) = line.split_once(' ')?;
            (name == "refs/heads/main").then(|| oid.to_owned())
        }))
    }

    /// Directories a watcher that skips ignored ones must watch: the root and every folder
    /// holding tracked files (the fixture has no empty kept folder).
    pub fn kept_dirs(&self) -> Result<u64> {
        let dirs = self.git.run(
            &self.project,
            ["ls-tree", "-r", "-d", "--name-only", "HEAD"],
        )?;
        Ok(1 + dirs.lines().count() as u64)
    }
}

/// Tracked path `i` of a project with `total` tracked files in `src/`.
pub fn src_path(i: usize, total: usize) -> String {
    let leaf_dirs = total.div_ceil(FILES_PER_DIR).max(1);
    let mut levels = 1;
    while FAN_OUT.pow(levels) < leaf_dirs {
        levels += 1;
    }
    let mut dir = i / FILES_PER_DIR;
    let mut parts = Vec::with_capacity(levels as usize);
    for level in (0..levels as usize).rev() {
        parts.push(format!("{}{}", SRC_LEVEL_NAMES[level], dir % FAN_OUT));
        dir /= FAN_OUT;
    }
    parts.reverse();
    format!(
        "src/{}/{}",
        parts.join("/"),
        SRC_FILE_NAMES[i % FILES_PER_DIR]
    )
}

/// The generated content of tracked file `i`, followed by `edit` when a case changed it.
pub fn src_content(i: usize, edit: Option<&str>) -> Vec<u8> {
    let size = 300 + (mix(i as u64) % 2700) as usize;
    let mut s = format!("// generated source file {i}\nimport {{ z }} from \"zod\";\n\n");
    let mut k = 0u64;
    while s.len() < size {
        s.push_str(&format!(
            "export const value{i}_{k} = z.number().max({});\n",
            mix((i as u64) << 20 | k) % 100_000
        ));
        k += 1;
    }
    if let Some(edit) = edit {
        s.push_str(&format!("// edit {edit}\n"));
    }
    s.into_bytes()
}

/// splitmix64: a well-mixed pure function of the index, for sizes and names.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Writes files, creating each folder once.
pub struct TreeWriter {
    root: PathBuf,
    made: HashSet<PathBuf>,
    pub files: usize,
}

impl TreeWriter {
    pub fn new(root: &Path) -> Self {
        Self {
            root: root.to_owned(),
            made: HashSet::new(),
            files: 0,
        }
    }

    pub fn write(&mut self, rel: &str, bytes: &[u8]) -> Result<()> {
        let path = self.root.join(rel);
        if let Some(parent) = path.parent()
            && !self.made.contains(parent)
        {
            fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
            self.made.insert(parent.to_owned());
        }
        fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
        self.files += 1;
        Ok(())
    }
}

fn write_project(project: &Path, spec: Spec) -> Result<()> {
    let mut w = TreeWriter::new(project);
    w.write(
        ".gitignore",
        b"node_modules/\n.mastra/\ndist/\n.env\n*.log\n",
    )?;
    w.write(
        ".env",
        b"OPENAI_API_KEY=sk-bench-not-a-secret\nDATABASE_URL=postgres://bench@localhost/bench\n",
    )?;
    // Exactly what the watcher writes for this `.env`, so its first save has nothing to do.
    w.write(
        "shmastra.json",
        shmastra_contract::Manifest::new(ENV_NAMES.iter().copied())
            .expect("fixture names are valid")
            .to_json()
            .as_bytes(),
    )?;
    w.write(
        "package.json",
        b"{\n  \"name\": \"bench-project\",\n  \"private\": true,\n  \"dependencies\": {\n    \"@mastra/core\": \"*\",\n    \"zod\": \"*\"\n  }\n}\n",
    )?;
    w.write(
        "README.md",
        b"# bench project\n\nGenerated by `cargo xtask bench`.\n",
    )?;
    for i in 0..spec.tracked_files {
        w.write(&src_path(i, spec.tracked_files), &src_content(i, None))?;
    }
    for i in 0..200 {
        w.write(
            &format!(".mastra/output/chunk{}/part{i}.mjs", i % 10),
            &package_file(i as u64, 1),
        )?;
    }
    for i in 0..100 {
        w.write(
            &format!("dist/assets/{}/bundle{i}.js", i % 5),
            &package_file(i as u64, 2),
        )?;
    }
    write_packages(&mut w, "pkg-", spec.node_modules_files)?;
    Ok(())
}

/// Installs packages under `node_modules/` until `files` files are written: scoped and plain
/// names, build folders three deep, and every ninth package nested in another's
/// `node_modules/`, as npm leaves them.
pub fn write_packages(w: &mut TreeWriter, prefix: &str, files: usize) -> Result<usize> {
    let start = w.files;
    let mut p = 0usize;
    let mut previous = String::new();
    while w.files - start < files {
        let name = if p.is_multiple_of(7) {
            format!("@{prefix}scope{}/{prefix}{p}", p % 13)
        } else {
            format!("{prefix}{p}")
        };
        let base = if p % 9 == 4 && !previous.is_empty() {
            format!("{previous}/node_modules/{name}")
        } else {
            format!("node_modules/{name}")
        };
        let count = 30 + (mix(p as u64 ^ 0xfeed) % 120) as usize;
        w.write(
            &format!("{base}/package.json"),
            format!("{{\n  \"name\": \"{name}\",\n  \"version\": \"1.{p}.0\",\n  \"main\": \"dist/cjs/index.js\"\n}}\n")
                .as_bytes(),
        )?;
        w.write(&format!("{base}/README.md"), &package_file(p as u64, 3))?;
        w.write(&format!("{base}/LICENSE"), b"MIT License\n")?;
        for j in 0..count.saturating_sub(3) {
            let slot = j / PACKAGE_FILES_PER_DIR;
            let dir = PACKAGE_DIRS[slot % PACKAGE_DIRS.len()];
            let deeper = slot / PACKAGE_DIRS.len();
            let dir = if deeper > 0 {
                format!("{dir}/chunk{deeper}")
            } else {
                dir.to_owned()
            };
            let ext = ["js", "d.ts", "js.map", "mjs", "cjs"][j % 5];
            w.write(
                &format!("{base}/{dir}/file{j}.{ext}"),
                &package_file((p as u64) << 16 | j as u64, 4),
            )?;
        }
        previous = base;
        p += 1;
    }
    Ok(w.files - start)
}

fn package_file(seed: u64, salt: u64) -> Vec<u8> {
    let size = 200 + (mix(seed ^ salt << 56) % 3000) as usize;
    let mut s = String::with_capacity(size + 64);
    let mut k = 0u64;
    while s.len() < size {
        s.push_str(&format!(
            "exports.f{k} = function () {{ return {}; }};\n",
            mix(seed.wrapping_mul(31) ^ k)
        ));
        k += 1;
    }
    s.into_bytes()
}

/// Removes the packages a `node_modules` burst installed.
pub fn remove_bursts(project: &Path) -> Result<()> {
    let nm = project.join("node_modules");
    let Ok(entries) = fs::read_dir(&nm) else {
        return Ok(());
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.trim_start_matches('@').starts_with(BURST_PREFIX) {
            fs::remove_dir_all(entry.path())
                .with_context(|| format!("removing {}", entry.path().display()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn src_paths_are_unique_nested_and_stable() {
        for total in [1, 7, 1_000, 10_000] {
            let paths: HashSet<_> = (0..total).map(|i| src_path(i, total)).collect();
            assert_eq!(paths.len(), total);
        }
        assert_eq!(src_path(0, 1_000), "src/area0/module0/feature0/index.ts");
        assert_eq!(src_path(13, 1_000), "src/area0/module0/feature2/types.ts");
        assert_eq!(
            src_path(99_999, 100_000),
            "src/area4/module0/feature4/part3/unit2/handler.ts"
        );
    }

    #[test]
    fn content_is_a_pure_function_and_an_edit_changes_it() {
        assert_eq!(src_content(42, None), src_content(42, None));
        assert_ne!(src_content(42, None), src_content(43, None));
        assert_ne!(src_content(42, None), src_content(42, Some("a")));
        assert_ne!(src_content(42, Some("a")), src_content(42, Some("b")));
    }

    #[test]
    fn packages_reach_the_file_count_in_nested_folders() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = TreeWriter::new(dir.path());
        let written = write_packages(&mut w, BURST_PREFIX, 500).unwrap();
        assert!((500..650).contains(&written), "{written}");
        let mut deepest = 0;
        let mut stack = vec![(dir.path().to_owned(), 0)];
        while let Some((d, depth)) = stack.pop() {
            deepest = deepest.max(depth);
            for e in fs::read_dir(d).unwrap() {
                let e = e.unwrap();
                if e.file_type().unwrap().is_dir() {
                    stack.push((e.path(), depth + 1));
                }
            }
        }
        assert!(deepest >= 5, "deepest folder is {deepest} levels down");
        remove_bursts(dir.path()).unwrap();
        let left: Vec<_> = fs::read_dir(dir.path().join("node_modules"))
            .unwrap()
            .collect();
        assert!(left.is_empty(), "burst packages left behind: {left:?}");
    }
}
