//! The status book: what the status file says, kept in one place so every writer agrees.
//! A save's result, the watch stage's problems and the pusher's events come in; the state is
//! derived from typed values (never from message text), and the file is written from here.

use shmastra_contract::duration::short_duration;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use git2::{Oid, Repository};
use tokio::sync::watch;

use crate::commit::Committed;
use crate::layout;
use crate::push::{Head, PushEvent};
use crate::save::{SaveError, Saved, repository_gone};
use crate::status::{self, State, Status};

/// `HEAD`'s commit and branch, when `HEAD` is on a branch that has a commit.
pub(crate) fn head_of(repo: &Repository) -> Option<Head> {
    let head = repo.head().ok().filter(|h| h.is_branch())?;
    Some(Head {
        oid: head.target()?,
        branch: head.shorthand().ok()?.to_owned(),
    })
}

/// Commits on `HEAD` that its remote branch does not have (all of them when it has none).
fn count_unpushed(repo: &Repository, remote: &str, pushed: Option<Oid>) -> u64 {
    let Some(Head { oid: head, branch }) = head_of(repo) else {
        return 0;
    };
    let Ok(mut walk) = repo.revwalk() else {
        return 0;
    };
    if walk.push(head).is_err() {
        return 0;
    }
    let tracking = layout::tracking_ref(remote, &branch);
    if let Ok(oid) = repo.refname_to_id(&tracking) {
        let _ = walk.hide(oid);
    }
    if let Some(oid) = pushed {
        let _ = walk.hide(oid);
    }
    walk.count() as u64
}

/// What the status file says, kept in one place so every writer agrees.
pub(crate) struct StatusBook {
    git_dir: PathBuf,
    /// The remote whose tracking refs say what was pushed.
    remote: String,
    pub(crate) status: Status,
    /// A batch is waiting for the debounce.
    pub(crate) pending: bool,
    /// A save is running.
    pub(crate) committing: bool,
    /// The latest save's failure, until a save succeeds.
    save_error: Option<String>,
    /// The watch stage's latest problem (watch limit, unreadable rules).
    pub(crate) watch_problem: Option<String>,
    /// Why saving waits for the user's git, while it does.
    paused: Option<String>,
    /// What the pusher last said, while it matters (`None`: nothing to show).
    pub(crate) push_state: Option<State>,
    /// Pushes failed since the last one that succeeded (each logged as it failed).
    push_failures: u32,
}

/// What the daemon does after a save.
pub(crate) enum SaveOutcome {
    /// Saved; whether the index file is behind.
    Done { index_unwritten: bool },
    /// Nothing saved: the user's git is in the middle of something; tried again at the git
    /// directory's next change, or soon when `look_again` (a lock, a running command).
    Paused { look_again: bool },
    /// Failed; tried again.
    Failed(SaveError),
    /// The repository went away under the watcher: it stops.
    Gone { git_dir: PathBuf },
}

impl StatusBook {
    /// The book of a watcher starting on `reader`'s repository, pushing to `remote`.
    pub(crate) fn new(
        git_dir: &Path,
        reader: &Repository,
        remote: &str,
        watch_problem: Option<String>,
    ) -> Self {
        let mut book = Self {
            git_dir: git_dir.to_owned(),
            remote: remote.to_owned(),
            status: Status {
                unpushed_commits: count_unpushed(reader, remote, None),
                ..Status::default()
            },
            pending: false,
            committing: false,
            save_error: None,
            watch_problem,
            paused: None,
            push_state: None,
            push_failures: 0,
        };
        book.see_head(reader);
        book
    }

    /// `HEAD` as it is now: its commit and its branch.
    fn see_head(&mut self, reader: &Repository) {
        let head = reader.head().ok();
        self.status.head = head
            .as_ref()
            .and_then(|h| h.target())
            .map(|h| h.to_string());
        self.status.branch = head
            .filter(|h| h.is_branch())
            .and_then(|h| h.shorthand().ok().map(str::to_owned))
            .or_else(|| {
                // An unborn branch: `HEAD` names it, it has no commit yet.
                let head = reader.find_reference("HEAD").ok()?;
                let target = head.symbolic_target().ok().flatten()?;
                target.strip_prefix("refs/heads/").map(str::to_owned)
            });
    }

    /// A save starts: `committing`, unless the watcher is paused (a look whether the user's
    /// git is done leaves the status as it is).
    pub(crate) fn begin_save(&mut self) {
        if self.paused.is_none() {
            self.committing = true;
            self.write();
        }
    }

    /// Writes the status file as the book has it (never into a repository that is gone).
    pub(crate) fn write(&mut self) {
        if repository_gone(&self.git_dir) {
            return;
        }
        self.status.state = if self.committing {
            State::Committing
        } else if self.save_error.is_some() {
            State::Error
        } else if self.paused.is_some() {
            State::Paused
        } else if self.pending {
            State::Pending
        } else {
            self.push_state.unwrap_or(State::Idle)
        };
        self.status.last_error = self.save_error.clone().or(self.watch_problem.clone());
        self.status.paused_reason = self.paused.clone();
        let was_low = self.status.disk_warning.is_some();
        self.status.measure(&self.git_dir);
        match &self.status.disk_warning {
            Some(warning) if !was_low => tracing::warn!("{warning}"),
            None if was_low => tracing::info!("the project's file system has room again"),
            _ => {}
        }
        if let Err(e) = status::write(&self.git_dir, &self.status) {
            tracing::warn!("cannot write the status file: {e}");
        }
    }

    /// The one place a save's result is handled: the status, the log, the pusher's head
    /// (`heads`, when there is a pusher).
    pub(crate) fn record_save(
        &mut self,
        result: Result<Saved, SaveError>,
        reader: &Repository,
        heads: Option<&watch::Sender<Option<Head>>>,
    ) -> SaveOutcome {
        self.committing = false;
        self.pending = false;
        match result {
            Ok(saved) => {
                self.save_error = None;
                let paused = saved.paused.as_ref().map(ToString::to_string);
                match (&self.paused, &paused) {
                    (was, Some(now)) if was.as_ref() != Some(now) => {
                        tracing::warn!("paused: {now}");
                    }
                    (Some(_), None) => tracing::info!("resumed: saving again"),
                    _ => {}
                }
                self.paused = paused;
                self.status.skipped_files = saved.skipped;
                self.record_commit(reader, saved.committed, heads);
                if let Some(pause) = &saved.paused {
                    return SaveOutcome::Paused {
                        look_again: !pause.ends_with_git_event(),
                    };
                }
                SaveOutcome::Done {
                    index_unwritten: saved.index_unwritten,
                }
            }
            Err(SaveError::Gone { git_dir }) => SaveOutcome::Gone { git_dir },
            Err(e) => {
                self.save_error = Some(format!("saving failed: {e}"));
                SaveOutcome::Failed(e)
            }
        }
    }

    fn record_commit(
        &mut self,
        reader: &Repository,
        committed: Option<Committed>,
        heads: Option<&watch::Sender<Option<Head>>>,
    ) {
        self.see_head(reader);
        let Some(c) = committed else {
            // A `restore --at` (or the user's git) moved HEAD; it goes out like our own commit.
            let head = head_of(reader);
            if let Some(heads) = heads
                && head.is_some()
                && heads.send_if_modified(|h| std::mem::replace(h, head.clone()) != head)
            {
                self.status.unpushed_commits = count_unpushed(reader, &self.remote, None);
            }
            return;
        };
        log_commit(&c);
        self.status.head = Some(c.id.to_string());
        self.status.last_commit_at = Some(status::timestamp(SystemTime::now()));
        self.status.unpushed_commits = count_unpushed(reader, &self.remote, None);
        if let Some(heads) = heads
            && let Some(head) = head_of(reader)
        {
            heads.send_replace(Some(head));
        }
    }

    /// What the pusher said, into the status (and the log, for failures and divergence).
    pub(crate) fn push_event(&mut self, event: PushEvent, reader: &Repository) {
        // A push moves refs/remotes/<remote>/<branch>; a divergence fetches the remote tip.
        let pushed = match &event {
            PushEvent::Pushed { oid, .. } => Some(Some(*oid)),
            PushEvent::Diverged { .. } => Some(None),
            PushEvent::Started | PushEvent::Failed { .. } => None,
        };
        if let Some(pushed) = pushed {
            self.status.unpushed_commits = count_unpushed(reader, &self.remote, pushed);
        }
        match event {
            // Diverged stays shown while the commits follow to the recovery branch.
            PushEvent::Started if self.push_state == Some(State::Diverged) => {}
            PushEvent::Started => self.push_state = Some(State::Pushing),
            PushEvent::Pushed { at, .. } => {
                if self.push_failures > 0 {
                    let failures = self.push_failures;
                    let plural = if failures == 1 { "" } else { "s" };
                    tracing::info!(failures, "pushed again after {failures} failure{plural}");
                    self.push_failures = 0;
                }
                self.push_state = None;
                self.status.last_push_at = Some(status::timestamp(at));
                self.status.last_push_error = None;
                self.status.last_push_failure = None;
                self.status.recovery_ref = None;
            }
            PushEvent::Failed {
                error,
                kind,
                retry_in,
            } => {
                tracing::warn!(retry_in = %short_duration(retry_in), "push failed: {error}");
                self.push_failures += 1;
                self.push_state = Some(State::Backoff);
                self.status.last_push_error = Some(error);
                self.status.last_push_failure = Some(kind);
            }
            PushEvent::Diverged { recovery_ref } => {
                tracing::warn!(recovery_ref = %recovery_ref, "the remote branch moved on; local commits were pushed to a recovery branch, run `project-watcher sync`");
                self.push_state = Some(State::Diverged);
                self.status.recovery_ref = Some(recovery_ref);
            }
        }
    }
}

/// The log line of a save that made a commit.
pub(crate) fn log_commit(c: &Committed) {
    tracing::info!(commit = %c.id, files = c.files_changed, "saved");
}
