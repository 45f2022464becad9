//! The watcher's environment: variable names, the remote and branch defaults, and the
//! environment file provisioning writes for PM2 (`~/.project-watcher/.env`).

use std::path::Path;

/// The project token, the basic-auth password of every git request. Only ever an
/// environment variable: flags show up in `ps`.
pub const PROJECT_TOKEN: &str = "PROJECT_TOKEN";
/// The project directory (`--dir`).
pub const PROJECT_DIR: &str = "PROJECT_DIR";
/// The remote the project is saved to (`--remote`).
pub const PROJECT_REMOTE: &str = "PROJECT_REMOTE";
/// The branch on that remote (`--branch`).
pub const PROJECT_BRANCH: &str = "PROJECT_BRANCH";

/// `watch --debounce`. Every variable is `PROJECT_*`: the project's own (above, what the
/// environment file holds), and the watcher's settings, `PROJECT_WATCHER_*`.
pub const WATCHER_DEBOUNCE: &str = "PROJECT_WATCHER_DEBOUNCE";
/// `watch --max-delay`.
pub const WATCHER_MAX_DELAY: &str = "PROJECT_WATCHER_MAX_DELAY";
/// `sync --step-file`: an environment variable too, so that the cloud can ask for it of any
/// watcher (one that predates it ignores it).
pub const WATCHER_SYNC_STEP_FILE: &str = "PROJECT_WATCHER_SYNC_STEP_FILE";
/// The names earlier versions read, each with the one that replaced it; both still work (the
/// new one wins).
pub const OLD_NAMES: [(&str, &str); 2] = [
    ("WATCHER_DEBOUNCE", WATCHER_DEBOUNCE),
    ("WATCHER_MAX_DELAY", WATCHER_MAX_DELAY),
];

/// The name of the git remote the watcher pushes to.
pub const DEFAULT_REMOTE: &str = "project";
/// The branch that holds the user's project.
pub const DEFAULT_BRANCH: &str = "main";

/// The watcher's environment file: what PM2 passes to `project-watcher watch`. It holds the
/// token, so it is a `.env` file and is written with care by the caller.
pub fn watcher_env_file(project_dir: &Path, remote: &str, branch: &str, token: &str) -> String {
    format!(
        "{PROJECT_DIR}={}\n{PROJECT_REMOTE}={remote}\n{PROJECT_BRANCH}={branch}\n{PROJECT_TOKEN}={token}\n",
        project_dir.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_env_file_names_every_variable_once() {
        assert_eq!(
            watcher_env_file(
                Path::new("/home/user/shmastra"),
                "project",
                "main",
                "v1.a.b"
            ),
            "PROJECT_DIR=/home/user/shmastra\nPROJECT_REMOTE=project\nPROJECT_BRANCH=main\nPROJECT_TOKEN=v1.a.b\n"
        );
    }
}
