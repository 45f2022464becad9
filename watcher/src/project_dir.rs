//! Opening `--dir` as a project (the top of a git working tree), or an error whose hint fits
//! why it is not one: missing, not a directory, a folder inside a working tree, a bare
//! repository, one owned by another user, or no repository at all.

use std::io;
use std::path::{Path, PathBuf};

use git2::{ErrorCode, Repository};

/// Why `--dir` is not a project; every message says what to do about it (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Nothing is at that path.
    #[error("{} does not exist: pass --dir with the project's top directory", dir.display())]
    Missing {
        /// The directory given.
        dir: PathBuf,
    },
    /// A file, not a folder.
    #[error("{} is not a directory: pass --dir with the project's top directory", dir.display())]
    NotADirectory {
        /// The path given.
        dir: PathBuf,
    },
    /// The folder cannot be read by this user.
    #[error(
        "cannot read {}: permission denied (it belongs to another user?); run as the user who owns it", dir.display()
    )]
    Unreadable {
        /// The directory given.
        dir: PathBuf,
    },
    /// A folder inside a working tree, not its top.
    #[error(
        "{} is inside the git working tree {}: pass --dir {} (the top of the working tree)",
        dir.display(), top.display(), top.display()
    )]
    Inside {
        /// The directory given.
        dir: PathBuf,
        /// The top of the working tree it is in.
        top: PathBuf,
    },
    /// A repository without a working tree.
    #[error(
        "{} is a bare repository, with no working tree to save: pass --dir with a clone's top directory", dir.display()
    )]
    Bare {
        /// The directory given.
        dir: PathBuf,
    },
    /// git refuses a repository another user owns (`safe.directory`).
    #[error(
        "{} belongs to another user, and git refuses a repository it does not own: run as its owner, or trust it with `git config --global --add safe.directory {}`",
        dir.display(), dir.display()
    )]
    NotOwned {
        /// The directory given.
        dir: PathBuf,
    },
    /// No repository here or above.
    #[error(
        "{} is not in a git repository: run `git init` there to start one, or pass --dir with the project's top directory", dir.display()
    )]
    NotARepo {
        /// The directory given.
        dir: PathBuf,
    },
    /// A repository git could not read.
    #[error("cannot open the git repository at {}: {message}", dir.display())]
    Unopenable {
        /// The directory given.
        dir: PathBuf,
        /// What git said (its message only).
        message: String,
    },
}

/// The repository whose working tree's top is `dir`.
pub fn open(dir: &Path) -> Result<Repository, OpenError> {
    let owned = || dir.to_owned();
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(OpenError::Missing { dir: owned() });
        }
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            return Err(OpenError::Unreadable { dir: owned() });
        }
        Ok(meta) if !meta.is_dir() => return Err(OpenError::NotADirectory { dir: owned() }),
        _ => {}
    }
    if let Err(e) = std::fs::read_dir(dir)
        && e.kind() == io::ErrorKind::PermissionDenied
    {
        return Err(OpenError::Unreadable { dir: owned() });
    }
    let error = match Repository::open(dir) {
        Ok(repo) if repo.is_bare() => return Err(OpenError::Bare { dir: owned() }),
        Ok(repo) => return Ok(repo),
        Err(e) => e,
    };
    if error.code() == ErrorCode::Owner {
        return Err(OpenError::NotOwned { dir: owned() });
    }
    if error.code() != ErrorCode::NotFound {
        return Err(OpenError::Unopenable {
            dir: owned(),
            message: error.message().to_owned(),
        });
    }
    match Repository::discover(dir) {
        Ok(outer) => match outer.workdir() {
            Some(top) => Err(OpenError::Inside {
                dir: owned(),
                top: top.canonicalize().unwrap_or_else(|_| top.to_owned()),
            }),
            None => Err(OpenError::NotARepo { dir: owned() }),
        },
        Err(e) if e.code() == ErrorCode::Owner => Err(OpenError::NotOwned { dir: owned() }),
        Err(_) => Err(OpenError::NotARepo { dir: owned() }),
    }
}
