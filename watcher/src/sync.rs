//! `project-watcher sync`: bring a running sandbox to the remote branch after someone pushed
//! from elsewhere (the native `sync.sh`).
//!
//! Steps, all under the repo lock: fetch; save anything the remote lacks under
//! `refs/project-watcher/backup/<UTC timestamp>`; stop the dev server; make the tree the
//! remote's; reinstall dependencies if a manifest or lock file changed; start the dev server.
//! A failed step leaves its name and output tail in the failure file for the cloud to show.

use std::fs;
use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::SystemTime;

use git2::{IndexAddOption, Oid, Repository, Signature};
use shmastra_contract::failure::{OutputLines, SyncFailure};

use crate::layout::{self, BACKUP_REF_PREFIX};
use crate::lock::RepoLock;
use crate::remote::RemoteSettings;
use crate::restore::{self, RestoreError, exclude_env_files};

/// How many backup refs are kept; older ones are deleted.
pub(crate) const BACKUPS_KEPT: usize = 20;

/// Files whose change means the installed dependencies may be stale, wherever they sit.
const DEPENDENCY_FILES: &[&str] = &[
    "package.json",
    "package-lock.json",
    "npm-shrinkwrap.json",
    "pnpm-lock.yaml",
    "pnpm-workspace.yaml",
    "yarn.lock",
    "bun.lock",
    "bun.lockb",
];

/// What `sync` syncs, and the commands it runs around the tree's change.
#[derive(Debug, Clone)]
pub struct SyncSettings {
    /// The project and the remote branch it syncs to.
    pub restore: RemoteSettings,
    /// Where a failed step leaves its name and output tail (removed on success).
    pub failure_file: PathBuf,
    /// Where the step under way is written while the sync runs (removed when it ends), for
    /// the cloud to show.
    pub step_file: Option<PathBuf>,
    /// Stops the dev server before the tree changes.
    pub stop_cmd: Option<String>,
    /// Overrides the lock file's own package manager.
    pub install_cmd: Option<String>,
    /// Starts the dev server at the end.
    pub start_cmd: Option<String>,
}

/// The steps of a sync, named as the failure file names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Opening the repository.
    Open,
    /// Taking `repo.lock`.
    Lock,
    /// Fetching the remote branch.
    Fetch,
    /// Saving what the remote lacks under a backup ref.
    Backup,
    /// The stop command.
    Stop,
    /// Making the tree the remote's.
    Restore,
    /// The install command.
    Install,
    /// The start command.
    Start,
}

impl Step {
    /// The step's name in the failure file.
    pub fn name(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Lock => "lock",
            Self::Fetch => "fetch",
            Self::Backup => "backup",
            Self::Stop => "stop",
            Self::Restore => "restore",
            Self::Install => "install",
            Self::Start => "start",
        }
    }
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A failed step: its name, what went wrong, and its output (the first error lines, the tail).
#[derive(Debug, thiserror::Error)]
#[error("sync failed at step `{step}`: {message}")]
pub struct SyncError {
    /// The step that failed.
    pub step: Step,
    /// What went wrong.
    pub message: String,
    /// The step's output, as the failure file keeps it.
    pub output: OutputLines,
    /// The command line or the repository setup is wrong: a retry will not help.
    pub configuration: bool,
}

impl SyncError {
    fn new(step: Step, message: impl Into<String>) -> Self {
        Self {
            step,
            message: message.into(),
            output: OutputLines::default(),
            configuration: false,
        }
    }

    fn from_restore(step: Step, err: RestoreError) -> Self {
        Self {
            configuration: err.is_configuration(),
            ..Self::new(step, err.to_string())
        }
    }

    /// What the failure file holds: the step, the message, the output's first error lines
    /// and its tail.
    pub fn failure(&self) -> SyncFailure {
        self.output.failure(self.step.name(), &self.message)
    }
}

/// What a successful sync did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncReport {
    /// The ref holding the work the remote did not have, if there was any.
    pub backup_ref: Option<String>,
    /// The remote branch (`refs/heads/recovery/<stamp>`) the backup was pushed to, so it
    /// outlives the sandbox; `None` when there was no backup or the push failed.
    pub backup_pushed: Option<String>,
    /// The commit the tree now holds; `None` when the remote has no such branch yet.
    pub commit: Option<Oid>,
    /// The install command that ran, if dependencies changed.
    pub installed_with: Option<String>,
}

/// Runs the sync. Failure writes the failure file; success removes it.
pub fn sync(settings: &SyncSettings) -> Result<SyncReport, SyncError> {
    let steps = StepFile(settings.step_file.as_deref());
    let result = run_steps(settings, &steps);
    steps.end();
    let recorded = match &result {
        Ok(_) => remove_file(&settings.failure_file),
        Err(err) => write_replacing(&settings.failure_file, &err.failure().render()),
    };
    if let Err(e) = recorded {
        tracing::warn!(path = %settings.failure_file.display(), error = %e, "cannot update the sync failure file");
    }
    result
}

/// The step file, when there is one: each step's name as it begins. A write that fails is
/// logged and the sync goes on (the step is only shown).
struct StepFile<'a>(Option<&'a Path>);

impl StepFile<'_> {
    fn enter(&self, step: Step) {
        if let Some(path) = self.0
            && let Err(e) = write_replacing(path, &format!("{step}\n"))
        {
            tracing::warn!(path = %path.display(), error = %e, "cannot write the sync step file");
        }
    }

    fn end(&self) {
        if let Some(path) = self.0
            && let Err(e) = remove_file(path)
        {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove the sync step file");
        }
    }
}

fn run_steps(settings: &SyncSettings, steps: &StepFile) -> Result<SyncReport, SyncError> {
    let restore_settings = &settings.restore;
    steps.enter(Step::Open);
    let repo = restore::open(&restore_settings.workdir)
        .map_err(|e| SyncError::from_restore(Step::Open, e))?;
    steps.enter(Step::Lock);
    let _lock = RepoLock::acquire_after_watcher_index(repo.path())
        .map_err(|e| SyncError::new(Step::Lock, e.to_string()))?;

    steps.enter(Step::Fetch);
    let remote_tip = restore::fetch_branch(&repo, restore_settings)
        .map_err(|e| SyncError::from_restore(Step::Fetch, e))?;
    steps.enter(Step::Backup);
    exclude_env_files(repo.path()).map_err(|e| SyncError::from_restore(Step::Backup, e))?;
    let snapshot = snapshot_worktree(&repo).map_err(|e| SyncError::new(Step::Backup, e))?;
    let backup_ref = back_up_unsaved_work(&repo, &snapshot, remote_tip, SystemTime::now())
        .map_err(|e| SyncError::new(Step::Backup, e))?;
    let mut backup_pushed = None;
    if let Some(name) = &backup_ref {
        tracing::info!(backup = %name, "saved work the remote does not have");
        backup_pushed = push_backup(&repo, restore_settings, name);
    }

    let workdir = &restore_settings.workdir;
    if let Some(cmd) = &settings.stop_cmd {
        steps.enter(Step::Stop);
        run_command(Step::Stop, cmd, workdir)?;
    }
    let mut installed_with = None;
    if let Some(tip) = remote_tip {
        steps.enter(Step::Restore);
        restore::reset_to(&repo, &restore_settings.branch, tip)
            .map_err(|e| SyncError::from_restore(Step::Restore, e))?;
        if let Err(e) = layout::record_synced(repo.path(), tip) {
            tracing::warn!("cannot record the synced commit for `history`: {e}");
        }
        let changed = dependencies_changed(&repo, snapshot.tree, tip)
            .map_err(|e| SyncError::new(Step::Install, e.message()))?;
        let install = settings.install_cmd.clone().or_else(|| {
            default_install_command(|name| workdir.join(name).exists()).map(Into::into)
        });
        match install {
            Some(cmd) if changed => {
                steps.enter(Step::Install);
                run_command(Step::Install, &cmd, workdir)?;
                installed_with = Some(cmd);
            }
            _ => tracing::info!(changed, "dependency install skipped"),
        }
    } else {
        tracing::warn!(
            remote = %restore_settings.remote,
            branch = %restore_settings.branch,
            "the remote has no such branch: nothing to pull"
        );
    }
    if let Some(cmd) = &settings.start_cmd {
        steps.enter(Step::Start);
        run_command(Step::Start, cmd, workdir)?;
    }
    Ok(SyncReport {
        backup_ref,
        backup_pushed,
        commit: remote_tip,
        installed_with,
    })
}

/// The working tree as `git add -A` sees it, committed on top of HEAD when it differs.
struct Snapshot {
    tree: Oid,
    /// `None` only for an unborn HEAD with an empty tree: there is nothing at all to save.
    commit: Option<Oid>,
}

fn snapshot_worktree(repo: &Repository) -> Result<Snapshot, String> {
    let git_err = |e: git2::Error| format!("cannot snapshot the working tree: {}", e.message());
    let head = repo.head().ok().and_then(|h| h.peel_to_commit().ok());
    let mut index = repo.index().map_err(git_err)?;
    index
        .add_all(["*"], IndexAddOption::DEFAULT, None)
        .map_err(git_err)?;
    index.update_all(["*"], None).map_err(git_err)?;
    let tree = index.write_tree().map_err(git_err);
    // The staging above was only to compute a tree: the index on disk stays as it was.
    index.read(true).map_err(git_err)?;
    let tree = tree?;
    let commit = match &head {
        Some(head) if head.tree_id() == tree => Some(head.id()),
        None if tree == empty_tree(repo).map_err(git_err)? => None,
        _ => {
            let signature = repo
                .signature()
                .or_else(|_| Signature::now("project-watcher", "project-watcher@localhost"))
                .map_err(git_err)?;
            let parents: Vec<_> = head.iter().collect();
            let tree_obj = repo.find_tree(tree).map_err(git_err)?;
            let paths = changed_paths(repo, head.as_ref(), tree).map_err(git_err)?;
            let message = crate::commit::message_with(
                &format!(
                    "backup: unsaved work before sync ({})",
                    crate::commit::describe_paths(&paths)
                ),
                shmastra_contract::SaveKind::Backup,
                &paths,
                &[],
            );
            Some(
                repo.commit(None, &signature, &signature, &message, &tree_obj, &parents)
                    .map_err(git_err)?,
            )
        }
    };
    Ok(Snapshot { tree, commit })
}

/// The paths `tree` changes against `head` (all of them without a head).
fn changed_paths(
    repo: &Repository,
    head: Option<&git2::Commit<'_>>,
    tree: Oid,
) -> Result<Vec<String>, git2::Error> {
    let old = head.map(|h| h.tree()).transpose()?;
    let new = repo.find_tree(tree)?;
    Ok(crate::commit::diff_paths(&repo.diff_tree_to_tree(
        old.as_ref(),
        Some(&new),
        None,
    )?))
}

fn empty_tree(repo: &Repository) -> Result<Oid, git2::Error> {
    repo.treebuilder(None)?.write()
}

/// Points a new backup ref at the snapshot unless the remote already has it, then keeps
/// only the newest [`BACKUPS_KEPT`]. Returns the new ref's name.
fn back_up_unsaved_work(
    repo: &Repository,
    snapshot: &Snapshot,
    remote_tip: Option<Oid>,
    now: SystemTime,
) -> Result<Option<String>, String> {
    let git_err = |e: git2::Error| format!("cannot write the backup ref: {}", e.message());
    let Some(commit) = snapshot.commit else {
        return Ok(None);
    };
    if let Some(tip) = remote_tip {
        let remote_tree = repo.find_commit(tip).map_err(git_err)?.tree_id();
        let on_remote = commit == tip
            || remote_tree == snapshot.tree
            || repo.graph_descendant_of(tip, commit).map_err(git_err)?;
        if on_remote {
            return Ok(None);
        }
    }
    let stamp = layout::stamp(now);
    let mut name = format!("{BACKUP_REF_PREFIX}{stamp}");
    let mut n = 1;
    while repo.find_reference(&name).is_ok() {
        name = format!("{BACKUP_REF_PREFIX}{stamp}-{n}");
        n += 1;
    }
    repo.reference(&name, commit, false, "project-watcher: backup before sync")
        .map_err(git_err)?;
    prune_backups(repo, BACKUPS_KEPT).map_err(git_err)?;
    Ok(Some(name))
}

/// Pushes a backup to `refs/heads/recovery/<stamp>` on the remote (a wiped sandbox takes its
/// own refs with it) and records it as `refs/remotes/<remote>/recovery/<stamp>`. A failed
/// push is a warning: the backup stays in this repository, and the sync goes on.
fn push_backup(repo: &Repository, settings: &RemoteSettings, backup_ref: &str) -> Option<String> {
    let stamp = backup_ref.trim_start_matches(BACKUP_REF_PREFIX);
    let branch = layout::recovery_branch(stamp);
    let commit = repo.refname_to_id(backup_ref).ok()?;
    match crate::push::push_once(settings, commit, &branch) {
        Ok(()) => {
            let tracking = layout::recovery_tracking_ref(&settings.remote, stamp);
            if let Err(e) =
                repo.reference(&tracking, commit, true, "project-watcher: backup pushed")
            {
                tracing::warn!("cannot record the pushed backup locally: {}", e.message());
            }
            tracing::info!(branch = %branch, "pushed the backup to the remote");
            Some(branch)
        }
        Err(e) => {
            tracing::warn!(backup = %backup_ref, "cannot push the backup; it stays in this repository only: {e}");
            None
        }
    }
}

/// Deletes all but the `keep` newest backup refs (names sort by time).
fn prune_backups(repo: &Repository, keep: usize) -> Result<(), git2::Error> {
    let mut names: Vec<String> = repo
        .references_glob(&format!("{BACKUP_REF_PREFIX}*"))?
        .filter_map(|r| r.ok().and_then(|r| r.name().ok().map(str::to_owned)))
        .collect();
    names.sort_by_key(|name| backup_order(name));
    let excess = names.len().saturating_sub(keep);
    for name in &names[..excess] {
        repo.find_reference(name)?.delete()?;
    }
    Ok(())
}

/// Sort key: the timestamp, then the collision counter as a number (`-10` after `-9`).
fn backup_order(name: &str) -> (String, u64) {
    let stamp = name.trim_start_matches(BACKUP_REF_PREFIX);
    match stamp.split_once('-') {
        Some((time, n)) => (time.to_owned(), n.parse().unwrap_or(0)),
        None => (stamp.to_owned(), 0),
    }
}

/// Whether a dependency manifest or lock file differs between the tree before the sync and
/// the commit after it.
fn dependencies_changed(repo: &Repository, before: Oid, after: Oid) -> Result<bool, git2::Error> {
    let before = repo.find_tree(before)?;
    let after = repo.find_commit(after)?.tree()?;
    let diff = repo.diff_tree_to_tree(Some(&before), Some(&after), None)?;
    let is_dependency_file = |path: Option<&Path>| {
        path.and_then(Path::file_name)
            .and_then(|n| n.to_str())
            .is_some_and(|n| DEPENDENCY_FILES.contains(&n))
    };
    Ok(diff.deltas().any(|d| {
        is_dependency_file(d.old_file().path()) || is_dependency_file(d.new_file().path())
    }))
}

/// The lock file's own package manager, `npm install` for a bare `package.json`, or nothing
/// for a project without one. `exists` answers for a file name at the project root.
pub(crate) fn default_install_command(exists: impl Fn(&str) -> bool) -> Option<&'static str> {
    const BY_LOCK_FILE: &[(&str, &str)] = &[
        ("pnpm-lock.yaml", "pnpm install --frozen-lockfile"),
        ("yarn.lock", "yarn install --frozen-lockfile"),
        ("bun.lock", "bun install"),
        ("bun.lockb", "bun install"),
        ("package-lock.json", "npm ci"),
        ("npm-shrinkwrap.json", "npm ci"),
    ];
    BY_LOCK_FILE
        .iter()
        .find(|(lock, _)| exists(lock))
        .map(|(_, cmd)| *cmd)
        .or_else(|| exists("package.json").then_some("npm install"))
}

/// Runs `sh -c cmd` in `workdir` with stdout and stderr merged, passes the output through to
/// our stderr, and keeps its tail for the failure file. `PROJECT_TOKEN` is not passed on:
/// install scripts have no business with it.
fn run_command(step: Step, cmd: &str, workdir: &Path) -> Result<(), SyncError> {
    tracing::info!(step = %step, command = %cmd, "running");
    let spawn_err = |e: io::Error| SyncError::new(step, format!("cannot run `{cmd}`: {e}"));
    let (reader, writer) = io::pipe().map_err(spawn_err)?;
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .current_dir(workdir)
        .env_remove(shmastra_contract::env::PROJECT_TOKEN)
        .stdin(Stdio::null())
        .stdout(writer.try_clone().map_err(spawn_err)?)
        .stderr(writer)
        .spawn()
        .map_err(spawn_err)?;
    let mut output = OutputLines::default();
    let mut stderr = io::stderr().lock();
    for line in BufReader::new(reader).split(b'\n') {
        let Ok(line) = line else { break };
        let _ = stderr.write_all(&line);
        let _ = stderr.write_all(b"\n");
        output.push(&String::from_utf8_lossy(&line));
    }
    drop(stderr);
    let status = child.wait().map_err(spawn_err)?;
    if status.success() {
        return Ok(());
    }
    Err(SyncError {
        output,
        ..SyncError::new(step, format!("`{cmd}` failed ({status})"))
    })
}

/// Writes `text` to `path` whole: a reader sees the old file or the new one.
fn write_replacing(path: &Path, text: &str) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp.{}", std::process::id()));
    fs::write(&tmp, text)?;
    fs::rename(&tmp, path)
}

fn remove_file(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shmastra_contract::failure::TAIL_LINES;
    use std::time::Duration;
    use testkit::git::{SavedProject, git, tree_of, tree_of_add_all};

    /// A saved project with a lock file, so installs can be asked for; helpers below.
    struct Setup(SavedProject);

    impl std::ops::Deref for Setup {
        type Target = SavedProject;
        fn deref(&self) -> &SavedProject {
            &self.0
        }
    }

    fn setup() -> Setup {
        Setup(SavedProject::new(&[
            ("package.json", "{\"name\": \"app\"}\n"),
            ("package-lock.json", "{}\n"),
            ("app.ts", "v1\n"),
        ]))
    }

    impl Setup {
        fn push_from_laptop(&self, path: &str, content: &str) {
            fs::write(self.laptop.join(path), content).unwrap();
            git(&self.laptop, ["add", "-A"]);
            git(&self.laptop, ["commit", "-qm", "from the laptop"]);
            git(&self.laptop, ["push", "-q", "origin", "main"]);
        }

        fn log(&self) -> PathBuf {
            self.tmp.path().join("steps.log")
        }

        fn settings(&self, install_cmd: &str) -> SyncSettings {
            let log = self.log();
            let log = log.display();
            SyncSettings {
                restore: RemoteSettings {
                    workdir: self.sandbox.clone(),
                    remote: "project".into(),
                    branch: "main".into(),
                    token: None,
                },
                failure_file: self.tmp.path().join("sync-failure"),
                step_file: Some(self.tmp.path().join("sync-step")),
                stop_cmd: Some(format!("echo stop >> {log}")),
                install_cmd: Some(format!("echo install >> {log}; {install_cmd}")),
                start_cmd: Some(format!("echo start >> {log}")),
            }
        }

        fn steps(&self) -> String {
            fs::read_to_string(self.log()).unwrap_or_default()
        }
    }

    #[test]
    fn unsaved_edits_go_to_a_backup_ref_and_the_tree_becomes_the_remotes() {
        let s = setup();
        s.push_from_laptop("app.ts", "v2 from the laptop\n");
        // An unpushed commit and a dirty file, and ignored files that must survive.
        fs::write(s.sandbox.join("notes.md"), "committed, not pushed\n").unwrap();
        git(&s.sandbox, ["add", "-A"]);
        git(&s.sandbox, ["commit", "-qm", "local"]);
        fs::write(s.sandbox.join("app.ts"), "unsaved edit\n").unwrap();
        fs::create_dir_all(s.sandbox.join("node_modules/dep")).unwrap();
        fs::write(s.sandbox.join("node_modules/dep/index.js"), "dep\n").unwrap();
        fs::write(s.sandbox.join(".env"), "KEY=value\n").unwrap();
        let settings = s.settings("true");
        fs::write(&settings.failure_file, "step: install\nold failure\n").unwrap();

        let report = sync(&settings).unwrap();

        let backup = report.backup_ref.expect("a backup ref");
        assert!(backup.starts_with(BACKUP_REF_PREFIX), "{backup}");
        assert_eq!(
            git(&s.sandbox, ["show", &format!("{backup}:app.ts")]),
            "unsaved edit\n"
        );
        assert_eq!(
            git(&s.sandbox, ["show", &format!("{backup}:notes.md")]),
            "committed, not pushed\n"
        );
        assert_eq!(
            git(&s.sandbox, ["show", &format!("{backup}~1:notes.md")]),
            "committed, not pushed\n",
            "the backup sits on top of the unpushed commit"
        );
        assert_eq!(
            git(&s.sandbox, ["ls-tree", "--name-only", &backup])
                .lines()
                .collect::<Vec<_>>(),
            [
                ".gitignore",
                "app.ts",
                "notes.md",
                "package-lock.json",
                "package.json"
            ],
            "ignored files and .env stay out of the backup"
        );
        assert_eq!(
            tree_of_add_all(&s.sandbox),
            tree_of(&s.remote, "main").unwrap()
        );
        assert_eq!(
            git(&s.sandbox, ["rev-parse", "HEAD"]),
            git(&s.remote, ["rev-parse", "main"])
        );
        assert!(!s.sandbox.join("notes.md").exists());
        assert_eq!(
            fs::read_to_string(s.sandbox.join("node_modules/dep/index.js")).unwrap(),
            "dep\n"
        );
        assert_eq!(
            fs::read_to_string(s.sandbox.join(".env")).unwrap(),
            "KEY=value\n"
        );
        assert!(!settings.failure_file.exists());
        assert_eq!(s.steps(), "stop\nstart\n", "no dependency file changed");
        assert_eq!(report.installed_with, None);
    }

    #[test]
    fn a_changed_lock_file_triggers_the_install_between_stop_and_start() {
        let s = setup();
        s.push_from_laptop("package-lock.json", "{\"lockfileVersion\": 3}\n");

        let report = sync(&s.settings("true")).unwrap();

        assert_eq!(s.steps(), "stop\ninstall\nstart\n");
        assert!(report.installed_with.is_some());
        assert_eq!(report.backup_ref, None, "nothing was unsaved");
    }

    #[test]
    fn the_steps_are_named_as_the_contract_names_them() {
        let steps = [
            Step::Open,
            Step::Lock,
            Step::Fetch,
            Step::Backup,
            Step::Stop,
            Step::Restore,
            Step::Install,
            Step::Start,
        ];
        assert_eq!(
            steps.map(Step::name),
            shmastra_contract::failure::SYNC_STEPS
        );
    }

    #[test]
    fn the_step_file_names_each_step_while_it_runs_and_is_gone_after() {
        let s = setup();
        let step_file = s.tmp.path().join("sync-step");
        let seen = s.tmp.path().join("seen");
        let record = format!("cat '{}' >> '{}'", step_file.display(), seen.display());
        for (version, install) in [(2, "true"), (3, "false")] {
            // A changed lock file: the install runs.
            s.push_from_laptop(
                "package-lock.json",
                &format!("{{\"lockfileVersion\": {version}}}\n"),
            );
            let settings = SyncSettings {
                stop_cmd: Some(record.clone()),
                install_cmd: Some(format!("{record}; {install}")),
                start_cmd: Some(record.clone()),
                ..s.settings(install)
            };
            let result = sync(&settings);
            assert!(!step_file.exists(), "the step file outlived the sync");
            let seen = fs::read_to_string(&seen).unwrap();
            match result {
                Ok(_) => assert_eq!(seen, "stop\ninstall\nstart\n"),
                Err(e) => {
                    assert_eq!(e.step, Step::Install);
                    assert_eq!(seen, "stop\ninstall\nstart\nstop\ninstall\n");
                }
            }
        }
    }

    #[test]
    fn a_failing_install_writes_its_first_error_lines_and_output_tail_to_the_failure_file() {
        let s = setup();
        s.push_from_laptop("package.json", "{\"name\": \"app\", \"version\": \"2\"}\n");
        let settings = s.settings(
            "echo 'npm ERR! Missing: left-pad@1.3.0 from lock file' >&2; \
             for i in $(seq 1 80); do echo line $i; done; echo 'npm ERR! boom' >&2; exit 3",
        );

        let err = sync(&settings).unwrap_err();

        assert_eq!(err.step, Step::Install);
        assert!(!err.configuration);
        let report = fs::read_to_string(&settings.failure_file).unwrap();
        let lines: Vec<&str> = report.lines().collect();
        assert_eq!(lines[0], "step: install");
        assert!(lines[1].starts_with("error: `echo install"), "{}", lines[1]);
        assert!(lines[1].contains("exit status: 3"), "{}", lines[1]);
        assert_eq!(
            lines[2..5],
            [
                "first: 2",
                "npm ERR! Missing: left-pad@1.3.0 from lock file",
                "npm ERR! boom"
            ],
            "{report}"
        );
        assert_eq!(lines.len(), 5 + TAIL_LINES, "{report}");
        assert_eq!(SyncFailure::parse(report.as_bytes()), err.failure());
        assert_eq!(lines[5], "line 32");
        assert_eq!(lines.last(), Some(&"npm ERR! boom"));
        assert_eq!(
            s.steps(),
            "stop\ninstall\n",
            "start does not run after a failure"
        );
    }

    #[test]
    fn a_failing_stop_leaves_the_tree_untouched() {
        let s = setup();
        s.push_from_laptop("app.ts", "v2\n");
        let mut settings = s.settings("true");
        settings.stop_cmd = Some("echo cannot stop; exit 1".into());

        let err = sync(&settings).unwrap_err();

        assert_eq!(err.step, Step::Stop);
        assert_eq!(
            fs::read_to_string(s.sandbox.join("app.ts")).unwrap(),
            "v1\n"
        );
        assert!(
            fs::read_to_string(&settings.failure_file)
                .unwrap()
                .contains("cannot stop")
        );
    }

    #[test]
    fn a_missing_repository_is_a_configuration_failure_in_the_failure_file() {
        let s = setup();
        let mut settings = s.settings("true");
        settings.restore.workdir = s.tmp.path().join("nowhere");

        let err = sync(&settings).unwrap_err();

        assert_eq!(err.step, Step::Open);
        assert!(err.configuration);
        assert!(
            fs::read_to_string(&settings.failure_file)
                .unwrap()
                .starts_with("step: open\n")
        );
    }

    #[test]
    fn only_the_newest_backups_are_kept() {
        let s = setup();
        let repo = Repository::open(&s.sandbox).unwrap();
        let head = repo.head().unwrap().target().unwrap();
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let mut names = Vec::new();
        for i in 0..(BACKUPS_KEPT as u64 + 5) {
            fs::write(s.sandbox.join("app.ts"), format!("edit {i}\n")).unwrap();
            let snapshot = snapshot_worktree(&repo).unwrap();
            // Two backups per second, to exercise the collision suffix.
            let now = start + Duration::from_secs(i / 2);
            names.push(
                back_up_unsaved_work(&repo, &snapshot, Some(head), now)
                    .unwrap()
                    .unwrap(),
            );
        }
        let mut kept: Vec<String> = repo
            .references_glob(&format!("{BACKUP_REF_PREFIX}*"))
            .unwrap()
            .map(|r| r.unwrap().name().unwrap().to_owned())
            .collect();
        kept.sort_by_key(|name| backup_order(name));
        assert_eq!(kept, names[5..]);
        assert_eq!(names[0], format!("{BACKUP_REF_PREFIX}20270115T080000Z"));
        assert_eq!(names[1], format!("{BACKUP_REF_PREFIX}20270115T080000Z-1"));
        assert_eq!(git(&s.sandbox, ["status", "--porcelain"]), " M app.ts\n");
    }

    #[test]
    fn install_command_follows_the_lock_file() {
        let check = |files: &[&str], expected: Option<&str>| {
            assert_eq!(
                default_install_command(|name| files.contains(&name)),
                expected,
                "{files:?}"
            );
        };
        check(
            &["package.json", "pnpm-lock.yaml"],
            Some("pnpm install --frozen-lockfile"),
        );
        check(
            &["package.json", "yarn.lock"],
            Some("yarn install --frozen-lockfile"),
        );
        check(&["package.json", "bun.lockb"], Some("bun install"));
        check(&["package.json", "bun.lock"], Some("bun install"));
        check(&["package.json", "package-lock.json"], Some("npm ci"));
        check(&["package.json"], Some("npm install"));
        check(&["README.md"], None);
    }
}
