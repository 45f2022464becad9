//! `project-watcher restore`: make the working tree exactly the remote branch's tree.
//!
//! A fresh sandbox starts from the template; restoring puts the user's saved project over it.
//! Template files the user had deleted must not come back, so untracked files that are not
//! ignored are removed; ignored files (`node_modules`, `.env`) stay where they are.

use std::ffi::OsStr;
use std::fs;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use git2::build::CheckoutBuilder;
use git2::{AutotagOption, FetchOptions, Oid, Repository, Status, StatusOptions};

use crate::lock::{LockError, RepoLock};
use crate::remote::RemoteSettings;

/// What a restore did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restored {
    /// The remote has no such branch yet (a new user): nothing was changed.
    NothingSaved,
    /// The working tree, the index and the branch now hold this commit.
    Commit(Oid),
}

/// Why a restore (or the fetch `sync` and the pusher share with it) failed.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// `--dir` is not the top of a working tree (exit 2).
    #[error(transparent)]
    NotARepository(#[from] crate::project_dir::OpenError),
    /// The repository has no such remote.
    #[error("{path} has no remote named `{remote}` to restore from")]
    NoSuchRemote {
        /// The project.
        path: PathBuf,
        /// The remote's name.
        remote: String,
    },
    /// `repo.lock` could not be taken.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The fetch failed.
    #[error("cannot fetch branch `{branch}` from remote `{remote}`: {}", .source.message())]
    Fetch {
        /// The remote's name.
        remote: String,
        /// The branch.
        branch: String,
        /// What libgit2 said (credentials scrubbed).
        source: git2::Error,
    },
    /// The tree could not be checked out.
    #[error("cannot check out {commit} into {}: {}", .path.display(), .source.message())]
    Checkout {
        /// The project.
        path: PathBuf,
        /// The commit.
        commit: Oid,
        /// What libgit2 said.
        source: git2::Error,
    },
    /// Untracked files could not be removed.
    #[error("cannot remove untracked files from {}: {}", .path.display(), .source.message())]
    Clean {
        /// The project.
        path: PathBuf,
        /// What libgit2 said.
        source: git2::Error,
    },
    /// `.git/info/exclude` could not be written.
    #[error("cannot add `.env` to {path}: {source}")]
    Exclude {
        /// The exclude file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
}

impl RestoreError {
    /// Errors a retry cannot fix: the command line or the repository setup is wrong.
    pub fn is_configuration(&self) -> bool {
        matches!(self, Self::NotARepository(_) | Self::NoSuchRemote { .. })
    }
}

/// Fetches the branch and, if the remote has it, makes the working tree exactly its tree.
/// Holds the repo lock throughout, so a running watcher waits and sees only the result.
pub fn restore(settings: &RemoteSettings) -> Result<Restored, RestoreError> {
    let repo = open(&settings.workdir)?;
    let _lock = RepoLock::acquire_after_watcher_index(repo.path())?;
    match fetch_branch(&repo, settings)? {
        None => Ok(Restored::NothingSaved),
        Some(commit) => {
            reset_to(&repo, &settings.branch, commit)?;
            Ok(Restored::Commit(commit))
        }
    }
}

pub(crate) fn open(workdir: &Path) -> Result<Repository, RestoreError> {
    crate::project_dir::open(workdir).map_err(RestoreError::from)
}

/// Fetches `branch` into `refs/remotes/<remote>/<branch>` and returns the remote's tip, or
/// `None` when the remote has no such branch.
pub(crate) fn fetch_branch(
    repo: &Repository,
    settings: &RemoteSettings,
) -> Result<Option<Oid>, RestoreError> {
    let fetch_err = |source| RestoreError::Fetch {
        remote: settings.remote.clone(),
        branch: settings.branch.clone(),
        source,
    };
    let mut remote = repo.find_remote(&settings.remote).map_err(|e| {
        if e.code() == git2::ErrorCode::NotFound {
            RestoreError::NoSuchRemote {
                path: settings.workdir.clone(),
                remote: settings.remote.clone(),
            }
        } else {
            fetch_err(e)
        }
    })?;
    let remote_ref = format!("refs/heads/{}", settings.branch);
    let tracking_ref = crate::layout::tracking_ref(&settings.remote, &settings.branch);
    let mut options = FetchOptions::new();
    options.download_tags(AutotagOption::None);
    crate::transport::init(crate::transport::DEFAULT_NETWORK_TIMEOUT);
    crate::transport::with_token(settings.token.as_deref(), || {
        remote.fetch(
            &[format!("+{remote_ref}:{tracking_ref}")],
            Some(&mut options),
            None,
        )
    })
    .map_err(fetch_err)?;
    // The advertisement, not the tracking ref, says whether the branch exists now: a tracking
    // ref left from an earlier fetch may point at a branch that is gone.
    let advertised = remote
        .list()
        .map_err(fetch_err)?
        .iter()
        .find(|head| head.name() == remote_ref)
        .map(|head| head.oid());
    Ok(advertised)
}

/// Makes the working tree, the index and `branch` exactly `commit`, with HEAD on `branch`.
/// Untracked files that are not ignored are removed; ignored files are left alone.
pub(crate) fn reset_to(repo: &Repository, branch: &str, commit: Oid) -> Result<(), RestoreError> {
    let workdir = repo.workdir().unwrap_or(repo.path()).to_owned();
    let checkout_err = |source| RestoreError::Checkout {
        path: workdir.clone(),
        commit,
        source,
    };
    // `.env` must count as ignored before the checkout, or it would be removed as untracked.
    exclude_env_files(repo.path())?;
    let target = repo.find_commit(commit).map_err(checkout_err)?;
    repo.checkout_tree(target.as_object(), Some(CheckoutBuilder::new().force()))
        .map_err(checkout_err)?;
    let branch_ref = format!("refs/heads/{branch}");
    repo.reference(&branch_ref, commit, true, "project-watcher: restore")
        .map_err(checkout_err)?;
    repo.set_head(&branch_ref).map_err(checkout_err)?;
    let mut index = repo.index().map_err(checkout_err)?;
    index
        .read_tree(&target.tree().map_err(checkout_err)?)
        .map_err(checkout_err)?;
    index.write().map_err(checkout_err)?;
    repo.cleanup_state().map_err(checkout_err)?;
    remove_untracked_files(repo, &workdir).map_err(|source| RestoreError::Clean {
        path: workdir.clone(),
        source,
    })
}

/// `git clean -d` without `-x`: removes untracked files that are not ignored, then the folders
/// that this left empty. libgit2's own `remove_untracked` is not used because it deletes a
/// wholly untracked folder together with the ignored files inside it (`pkg/node_modules`).
fn remove_untracked_files(repo: &Repository, workdir: &Path) -> Result<(), git2::Error> {
    let mut options = StatusOptions::new();
    options
        .include_untracked(true)
        .recurse_untracked_dirs(true)
        .include_ignored(false)
        .exclude_submodules(true);
    let statuses = repo.statuses(Some(&mut options))?;
    let untracked = statuses
        .iter()
        .filter(|entry| entry.status().contains(Status::WT_NEW))
        // A path ending in `/` is a nested repository: not ours to delete.
        .filter(|entry| !entry.path_bytes().ends_with(b"/"))
        .map(|entry| PathBuf::from(OsStr::from_bytes(entry.path_bytes())))
        .collect::<Vec<_>>();
    for path in untracked {
        let full = workdir.join(&path);
        match fs::remove_file(&full) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => {
                return Err(git2::Error::from_str(&format!(
                    "cannot remove {}: {e}",
                    full.display()
                )));
            }
        }
        let mut dir = full.parent();
        while let Some(d) = dir.filter(|d| *d != workdir) {
            if fs::remove_dir(d).is_err() {
                break;
            }
            dir = d.parent();
        }
    }
    Ok(())
}

/// Adds the env file rules ([`ENV_EXCLUDES`]) to `.git/info/exclude` unless they are there:
/// those files hold secrets and are never committed, whatever `.gitignore` says.
/// The file is git's, in any bytes (a line that is not UTF-8 is not an env rule, and stays).
pub(crate) fn exclude_env_files(git_dir: &Path) -> Result<(), RestoreError> {
    let path = crate::layout::info_exclude(git_dir);
    let exclude_err = |source| RestoreError::Exclude {
        path: path.clone(),
        source,
    };
    let current = match fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(exclude_err(e)),
    };
    let missing: Vec<&str> = ENV_EXCLUDES
        .iter()
        .copied()
        .filter(|line| {
            !current
                .split(|&b| b == b'\n')
                .any(|l| l.trim_ascii() == line.as_bytes())
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if let Some(info) = path.parent() {
        fs::create_dir_all(info).map_err(exclude_err)?;
    }
    let mut file = fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(&path)
        .map_err(exclude_err)?;
    let separator = if current.is_empty() || current.ends_with(b"\n") {
        ""
    } else {
        "\n"
    };
    writeln!(file, "{separator}{}", missing.join("\n")).map_err(exclude_err)
}

/// The env files the watcher never saves (`shmastra_contract::manifest::is_env_file_name`),
/// as ignore rules, so a restore's clean keeps them too.
const ENV_EXCLUDES: &[&str] = &[
    ".env",
    ".env.*",
    "!.env.example",
    "!.env.sample",
    "!.env.template",
];

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{PermissionsExt, symlink};
    use testkit::git::{git, init_bare, init_repo, tree_of, tree_of_add_all};

    struct Setup {
        _tmp: tempfile::TempDir,
        remote: PathBuf,
        template: PathBuf,
    }

    /// A bare remote, a user clone that saved a project into it, and a template copy
    /// (a repository with the `project` remote, as provisioning leaves it) that still holds
    /// the template's files plus ignored `node_modules` and `.env`.
    fn setup() -> Setup {
        let tmp = tempfile::tempdir().unwrap();
        let remote = tmp.path().join("remote.git");
        let user = tmp.path().join("user");
        let template = tmp.path().join("template");
        init_bare(&remote);

        write_template(&user);
        init_repo(&user);
        git(&user, ["add", "-A"]);
        git(&user, ["commit", "-qm", "template"]);
        // The user's work: an edit, a deletion, a rename, a new symlink, an executable bit.
        fs::write(user.join("src/index.ts"), "console.log('mine');\n").unwrap();
        fs::remove_file(user.join("deleted.txt")).unwrap();
        fs::rename(user.join("old-name.md"), user.join("new-name.md")).unwrap();
        symlink("src/index.ts", user.join("entry")).unwrap();
        fs::set_permissions(user.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(
            user.join("shmastra.json"),
            "{\"version\": 1, \"env\": []}\n",
        )
        .unwrap();
        git(&user, ["add", "-A"]);
        git(&user, ["commit", "-qm", "work"]);
        git(
            &user,
            ["remote", "add", "project", remote.to_str().unwrap()],
        );
        git(&user, ["push", "-q", "project", "main"]);

        write_template(&template);
        fs::create_dir_all(template.join("node_modules/left-pad")).unwrap();
        fs::write(template.join("node_modules/left-pad/index.js"), "pad\n").unwrap();
        fs::write(template.join(".env"), "OPENAI_API_KEY=sk-test\n").unwrap();
        // A template-only folder: its tracked-looking file goes, its ignored part stays.
        fs::create_dir_all(template.join("extra/node_modules")).unwrap();
        fs::write(template.join("extra/leftover.ts"), "old\n").unwrap();
        fs::write(template.join("extra/node_modules/dep.js"), "dep\n").unwrap();
        init_repo(&template);
        git(
            &template,
            ["remote", "add", "project", remote.to_str().unwrap()],
        );
        Setup {
            _tmp: tmp,
            remote,
            template,
        }
    }

    fn write_template(dir: &Path) {
        fs::create_dir_all(dir.join("src")).unwrap();
        fs::write(dir.join(".gitignore"), "node_modules/\n").unwrap();
        fs::write(dir.join("src/index.ts"), "console.log('template');\n").unwrap();
        fs::write(dir.join("deleted.txt"), "the user deletes this\n").unwrap();
        fs::write(dir.join("old-name.md"), "# renamed by the user\n").unwrap();
        fs::write(dir.join("run.sh"), "#!/bin/sh\necho run\n").unwrap();
    }

    fn settings(workdir: &Path) -> RemoteSettings {
        RemoteSettings {
            workdir: workdir.to_owned(),
            remote: "project".into(),
            branch: "main".into(),
            token: None,
        }
    }

    #[test]
    fn restore_reproduces_the_saved_tree_and_keeps_ignored_files() {
        let s = setup();
        let saved = git(&s.remote, ["rev-parse", "main"]).trim().to_owned();

        let restored = restore(&settings(&s.template)).unwrap();

        assert_eq!(restored, Restored::Commit(Oid::from_str(&saved).unwrap()));
        // Same tree id: same paths, bytes, modes and symlink targets, nothing extra.
        assert_eq!(
            tree_of_add_all(&s.template),
            tree_of(&s.remote, "main").unwrap()
        );
        assert_eq!(git(&s.template, ["rev-parse", "HEAD"]).trim(), saved);
        assert_eq!(git(&s.template, ["status", "--porcelain"]), "");
        assert!(!s.template.join("deleted.txt").exists());
        assert!(!s.template.join("old-name.md").exists());
        assert!(!s.template.join("extra/leftover.ts").exists());
        assert!(s.template.join("extra/node_modules/dep.js").exists());
        assert_eq!(
            fs::read_to_string(s.template.join("src/index.ts")).unwrap(),
            "console.log('mine');\n"
        );
        assert_eq!(
            fs::read_link(s.template.join("entry")).unwrap(),
            Path::new("src/index.ts")
        );
        let mode = fs::metadata(s.template.join("run.sh"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o111, 0o111, "run.sh lost its executable bit");
        assert_eq!(
            fs::read_to_string(s.template.join("node_modules/left-pad/index.js")).unwrap(),
            "pad\n"
        );
        assert_eq!(
            fs::read_to_string(s.template.join(".env")).unwrap(),
            "OPENAI_API_KEY=sk-test\n"
        );
    }

    #[test]
    fn restore_twice_changes_nothing_the_second_time() {
        let s = setup();
        restore(&settings(&s.template)).unwrap();
        let tree = tree_of_add_all(&s.template);
        restore(&settings(&s.template)).unwrap();
        assert_eq!(tree_of_add_all(&s.template), tree);
        assert_eq!(git(&s.template, ["status", "--porcelain"]), "");
    }

    #[test]
    fn new_user_without_a_remote_branch_changes_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let remote = tmp.path().join("remote.git");
        let template = tmp.path().join("template");
        init_bare(&remote);
        write_template(&template);
        init_repo(&template);
        git(
            &template,
            ["remote", "add", "project", remote.to_str().unwrap()],
        );
        let before = tree_of_add_all(&template);

        assert_eq!(
            restore(&settings(&template)).unwrap(),
            Restored::NothingSaved
        );

        assert_eq!(tree_of_add_all(&template), before);
        assert!(
            tree_of(&template, "HEAD").is_none(),
            "HEAD must stay unborn"
        );
        assert!(template.join("deleted.txt").exists());
    }

    #[test]
    fn missing_remote_and_missing_repository_are_configuration_errors() {
        let tmp = tempfile::tempdir().unwrap();
        let err = restore(&settings(tmp.path())).unwrap_err();
        assert!(matches!(err, RestoreError::NotARepository(_)), "{err}");
        assert!(err.is_configuration());

        init_repo(tmp.path());
        let err = restore(&settings(tmp.path())).unwrap_err();
        assert!(matches!(err, RestoreError::NoSuchRemote { .. }), "{err}");
        assert!(err.to_string().contains("`project`"), "{err}");
        assert!(err.is_configuration());
    }

    #[test]
    fn unreachable_remote_is_a_runtime_error_naming_the_remote() {
        let tmp = tempfile::tempdir().unwrap();
        init_repo(tmp.path());
        let gone = tmp.path().join("gone.git");
        git(
            tmp.path(),
            ["remote", "add", "project", gone.to_str().unwrap()],
        );
        let err = restore(&settings(tmp.path())).unwrap_err();
        assert!(matches!(err, RestoreError::Fetch { .. }), "{err}");
        assert!(!err.is_configuration());
    }

    #[test]
    fn env_exclusion_is_added_once_and_keeps_existing_lines() {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir_all(tmp.path().join("info")).unwrap();
        fs::write(tmp.path().join("info/exclude"), "*.log").unwrap();
        exclude_env_files(tmp.path()).unwrap();
        exclude_env_files(tmp.path()).unwrap();
        assert_eq!(
            fs::read_to_string(tmp.path().join("info/exclude")).unwrap(),
            "*.log\n.env\n.env.*\n!.env.example\n!.env.sample\n!.env.template\n"
        );
    }
}
