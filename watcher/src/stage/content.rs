//! A file's content as git stores it: libgit2 hashes it (its own filters: `text`, `eol`,
//! `ident`), except where libgit2 stores something else than git, for which `git hash-object`
//! stores what git would: a filter driver's command (git-lfs is one), `working-tree-encoding`,
//! `ident` (libgit2 collapses only the first `$Id$`; git's `ident_to_git` every one), automatic
//! end-of-line conversion of a file whose index blob holds a CR but no CRLF (git's
//! `has_crlf_in_index` asks for a CRLF in a text blob, libgit2's for any CR), and a path under
//! an in-tree `.gitattributes` that is a symbolic link (git 2.32+ does not follow it; libgit2
//! does).

use std::collections::HashMap;
use std::fs::{self, Metadata};
use std::path::{Path, PathBuf};

use git2::{AttrValue, Index, Oid, Repository};

/// The attribute lookups of one repository, and the filter drivers its configuration names.
pub(crate) struct Filters {
    workdir: PathBuf,
    /// For attribute lookups, opened again each batch (libgit2's attribute cache can miss an
    /// edit of the same size in the same second); `None` when it could not be opened.
    attrs: Option<Repository>,
    /// Filter drivers configured with a `clean` or `process` command, re-read each batch.
    drivers: Vec<String>,
    /// `core.autocrlf` is `true` or `input`: files without `text`/`eol` attributes are
    /// converted automatically.
    autocrlf: bool,
    /// `core.fileMode` and `core.symlinks` are true (or unset), so libgit2 gives a file's
    /// entry the mode its owner-execute bit says (see `Store::Raw`).
    plain_modes: bool,
    /// An attributes file outside the tree exists (see `outside_tree_attributes`), re-read
    /// each batch.
    outside_tree: bool,
    /// What each directory's `.gitattributes` is on disk, as looked up this batch.
    attributes_files: HashMap<PathBuf, OnDisk>,
}

/// How a regular file's content is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Store {
    /// No attribute, no `core.autocrlf`: no filter of libgit2's or git's changes a byte, and
    /// the entry's mode is the one its owner-execute bit says (`core.fileMode` and
    /// `core.symlinks` on), so the stage may write the bytes it reads and make the entry from
    /// the file's stat data itself, as `git_index_add_bypath` would.
    Raw,
    /// By `git_index_add_bypath`, with libgit2's filters.
    Filtered,
    /// By `git_index_add_bypath`, then hashed again by `git hash-object -w`.
    Git,
}

/// A directory's `.gitattributes` on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OnDisk {
    Absent,
    File,
    Link,
}

impl Filters {
    /// Lookups in the repository at `workdir`. Those that fall back to the index
    /// (`.gitattributes` not on disk) see `index`, the one being staged, as git's do, rather
    /// than the file as it was at their first use, which they would read a second time (10 MB
    /// at 100k files: a third of the first edit).
    pub(crate) fn new(workdir: &Path, index: &mut Index, repo: &Repository) -> Self {
        let mut filters = Self {
            workdir: workdir.to_owned(),
            attrs: None,
            drivers: Vec::new(),
            autocrlf: false,
            plain_modes: false,
            outside_tree: true,
            attributes_files: HashMap::new(),
        };
        filters.reload(index, repo);
        filters
    }

    /// Opens the lookups again and reads the configuration again (once per batch). The index
    /// belongs to the lookups' repository (adding a path needs an owner); the old one goes
    /// first, or dropping it afterwards would leave the index without one; when no new one
    /// opens, `repo` owns it again.
    pub(crate) fn reload(&mut self, index: &mut Index, repo: &Repository) {
        self.attrs = None;
        self.attrs = Repository::open(&self.workdir)
            .ok()
            .filter(|attrs| attrs.set_index(index).is_ok());
        if self.attrs.is_none() {
            let _ = repo.set_index(index);
        }
        self.drivers = self.filter_drivers();
        self.autocrlf = self
            .attrs
            .as_ref()
            .and_then(|r| r.config().ok())
            .and_then(|c| c.get_string("core.autocrlf").ok())
            .is_some_and(|v| {
                v.eq_ignore_ascii_case("input") || git2::Config::parse_bool(v).unwrap_or(false)
            });
        self.plain_modes = self.attrs.as_ref().is_some_and(|r| {
            r.config().is_ok_and(|c| {
                ["core.filemode", "core.symlinks"]
                    .iter()
                    .all(|key| match c.get_bool(key) {
                        Ok(on) => on,
                        Err(e) => e.code() == git2::ErrorCode::NotFound,
                    })
            })
        });
        self.outside_tree = self.attrs.as_ref().is_none_or(outside_tree_attributes);
        self.attributes_files.clear();
    }

    /// Filter drivers with a `clean` or `process` command in the repository's configuration.
    fn filter_drivers(&self) -> Vec<String> {
        let Some(mut config) = self.attrs.as_ref().and_then(|r| r.config().ok()) else {
            return Vec::new();
        };
        let Ok(config) = config.snapshot() else {
            return Vec::new();
        };
        let Ok(entries) = config.entries(Some(r"^filter\..*\.(clean|process)$")) else {
            return Vec::new();
        };
        let mut drivers = Vec::new();
        let _ = entries.for_each(|entry| {
            if let Some((driver, _)) = entry
                .name()
                .ok()
                .and_then(|n| n.strip_prefix("filter."))
                .and_then(|n| n.rsplit_once('.'))
            {
                drivers.push(driver.to_owned());
            }
        });
        drivers
    }

    /// How the regular file `rel` is to be stored (see `Store`); `indexed` is the blob the
    /// index held for it before this change, `index` the one being staged. Where no
    /// attributes file can apply (none outside the tree, no `.gitattributes` on the way to
    /// `rel` on disk or in `index`), every attribute is unspecified and libgit2 is not asked:
    /// its lookups stat each of them again for each attribute of each path, a fifth of a
    /// 1,000-file save's CPU.
    pub(crate) fn store(&mut self, rel: &Path, indexed: Option<Oid>, index: &Index) -> Store {
        let mut in_tree = false;
        for dir in rel.ancestors().skip(1) {
            match self.attributes_file(dir) {
                OnDisk::Link => return Store::Git,
                OnDisk::File => in_tree = true,
                OnDisk::Absent => {
                    in_tree = in_tree || index.get_path(&dir.join(".gitattributes"), 0).is_some();
                }
            }
        }
        let Some(repo) = &self.attrs else {
            return Store::Filtered;
        };
        if !in_tree && !self.outside_tree {
            return match (self.autocrlf, self.plain_modes) {
                (false, true) => Store::Raw,
                (false, false) => Store::Filtered,
                (true, _) if indexed_cr_without_git_s_crlf(repo, indexed) => Store::Git,
                (true, _) => Store::Filtered,
            };
        }
        if self.needs_git(repo, rel, indexed) {
            Store::Git
        } else {
            Store::Filtered
        }
    }

    /// Whether git stores `rel`'s content otherwise than libgit2 (see the module's list), by
    /// its attributes.
    fn needs_git(&self, repo: &Repository, rel: &Path, indexed: Option<Oid>) -> bool {
        let flags = git2::AttrCheckFlags::FILE_THEN_INDEX;
        let attr = |name: &str| {
            let value = repo.get_attr_bytes(rel, name, flags).ok().flatten();
            match AttrValue::from_bytes(value) {
                AttrValue::String(v) => Attr::Value(v.to_owned()),
                AttrValue::Bytes(v) => Attr::Value(String::from_utf8_lossy(v).into_owned()),
                AttrValue::True => Attr::Set,
                AttrValue::False => Attr::Unset,
                AttrValue::Unspecified => Attr::Unspecified,
            }
        };
        let value = |a: Attr| match a {
            Attr::Value(v) => Some(v),
            _ => None,
        };
        // With no driver configured, no `filter` attribute can name one: one lookup, not two.
        if value(attr("working-tree-encoding")).is_some()
            || (!self.drivers.is_empty()
                && value(attr("filter")).is_some_and(|driver| self.drivers.contains(&driver)))
            || attr("ident") == Attr::Set
        {
            return true;
        }
        let automatic = match attr("text") {
            Attr::Value(v) => v == "auto",
            Attr::Unspecified => self.autocrlf && attr("eol") == Attr::Unspecified,
            Attr::Set | Attr::Unset => false,
        };
        automatic && indexed_cr_without_git_s_crlf(repo, indexed)
    }

    /// What the `.gitattributes` of `dir` (relative to the work tree) is on disk.
    fn attributes_file(&mut self, dir: &Path) -> OnDisk {
        let workdir = &self.workdir;
        *self
            .attributes_files
            .entry(dir.to_owned())
            .or_insert_with(|| {
                match fs::symlink_metadata(workdir.join(dir).join(".gitattributes")) {
                    Ok(m) if m.file_type().is_symlink() => OnDisk::Link,
                    Ok(_) => OnDisk::File,
                    Err(_) => OnDisk::Absent,
                }
            })
    }
}

/// Whether an attributes file outside the tree may apply: libgit2's `attr_setup` reads the
/// system one (`/etc/gitattributes`), `core.attributesFile` (by default `git/attributes` in
/// the XDG configuration folder) and `info/attributes` in the common git folder (a linked
/// worktree's is its main repository's). Any doubt (no home to look in) counts as one.
fn outside_tree_attributes(repo: &Repository) -> bool {
    let exists = |p: &Path| fs::symlink_metadata(p).is_ok();
    let configured = repo
        .config()
        .is_ok_and(|c| c.get_entry("core.attributesfile").is_ok());
    let xdg = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|d| !d.is_empty())
        .is_some_and(|d| exists(&Path::new(&d).join("git/attributes")));
    let home = std::env::var_os("HOME")
        .filter(|d| !d.is_empty())
        .is_none_or(|d| exists(&Path::new(&d).join(".config/git/attributes")));
    configured
        || xdg
        || home
        || exists(Path::new("/etc/gitattributes"))
        || exists(&repo.commondir().join("info/attributes"))
}

/// Whether the blob `indexed` is one libgit2 and git read apart (`cr_without_git_s_crlf`).
fn indexed_cr_without_git_s_crlf(repo: &Repository, indexed: Option<Oid>) -> bool {
    indexed
        .and_then(|id| repo.find_blob(id).ok())
        .is_some_and(|blob| cr_without_git_s_crlf(blob.content()))
}

/// One attribute of a path, as far as the checks above care.
#[derive(Debug, PartialEq, Eq)]
enum Attr {
    Set,
    Unset,
    Value(String),
    Unspecified,
}

/// A blob libgit2 reads as "has a CR in the index" (it then leaves CRLFs alone) where git's
/// `has_crlf_in_index` does not (git converts): a CR, but not a text blob with a CRLF, by
/// git's `gather_convert_stats`.
fn cr_without_git_s_crlf(blob: &[u8]) -> bool {
    if !blob.contains(&b'\r') {
        return false;
    }
    let (mut crlf, mut lonecr, mut nul, mut printable, mut nonprintable) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut i = 0;
    while i < blob.len() {
        let c = blob[i];
        if c == b'\r' {
            if blob.get(i + 1) == Some(&b'\n') {
                crlf += 1;
                i += 1;
            } else {
                lonecr += 1;
            }
        } else if c == 127 {
            nonprintable += 1;
        } else if c < 32 {
            match c {
                b'\n' | 8 | b'\t' | 27 | 12 => printable += 1,
                0 => {
                    nul += 1;
                    nonprintable += 1;
                }
                _ => nonprintable += 1,
            }
        } else {
            printable += 1;
        }
        i += 1;
    }
    // A file ending in ^Z (DOS's end of file) does not count it.
    if blob.last() == Some(&26) {
        nonprintable = nonprintable.saturating_sub(1);
    }
    let binary = lonecr > 0 || nul > 0 || (printable >> 7) < nonprintable;
    binary || crlf == 0
}

/// What `git hash-object -w` stores for this path (it runs the filters git would). `None`,
/// with a warning naming the path, when git cannot.
pub(crate) fn hash_with_git(workdir: &Path, rel: &Path) -> Option<Oid> {
    let output = std::process::Command::new("git")
        .arg("-C")
        .arg(workdir)
        .args(["hash-object", "-w", "--"])
        .arg(rel)
        .output();
    match output {
        Ok(out) if out.status.success() => {
            Oid::from_str(String::from_utf8_lossy(&out.stdout).trim()).ok()
        }
        Ok(out) => {
            tracing::warn!(
                path = %rel.display(),
                "git could not run the content filter for this file, its raw bytes are saved: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            None
        }
        Err(e) => {
            tracing::warn!(
                path = %rel.display(),
                "this file needs git's content filters and git could not run, its raw bytes are saved: {e}"
            );
            None
        }
    }
}

/// Disk full, read-only `.git`, ...: not the file's fault (it is readable), and not a path
/// git refuses (those are left out with a warning, or they would block every later save).
pub(crate) fn is_store_failure(e: &git2::Error, abs: &Path, meta: &Metadata) -> bool {
    matches!(
        e.class(),
        git2::ErrorClass::Os | git2::ErrorClass::Odb | git2::ErrorClass::Filesystem
    ) && (!meta.is_file() || fs::File::open(abs).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blob_git_and_libgit2_read_apart_is_one_with_a_cr_but_no_text_crlf() {
        let check = |blob: &[u8], apart: bool| {
            assert_eq!(
                cr_without_git_s_crlf(blob),
                apart,
                "{:?}",
                String::from_utf8_lossy(blob)
            );
        };
        check(b"no cr\n", false);
        check(b"crlf\r\nline\r\n", false);
        check(b"mixed\r\nends\n", false);
        check(b"lone\rcr\n", true);
        check(b"lone\rand crlf\r\n", true);
        check(b"\0binary\r\n", true);
    }
}
