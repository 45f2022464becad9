//! Follows one `git-receive-pack` exchange as it streams through: reads the ref updates from
//! the request, the report-status from the response, and reports the branches it moved.

use std::sync::{Arc, Mutex};

use super::events::RecentPushes;
use crate::event::{ExternalPush, OnExternalPush};
use crate::user::UserId;
use git_wire::report_status::{
    CommandsParser, CommandsState, ReportParser, ReportState, applied_updates,
};

/// The tag the watcher puts in its User-Agent; pushes carrying it are the sandbox's own.
pub const WATCHER_AGENT_TAG: &str = "project-watcher/";

pub struct PushWatch {
    user: UserId,
    from_watcher: bool,
    commands: Mutex<CommandsParser>,
    recent: Arc<RecentPushes>,
    on_external_push: OnExternalPush,
}

impl PushWatch {
    pub fn new(
        user: UserId,
        user_agent: &str,
        recent: Arc<RecentPushes>,
        on_external_push: OnExternalPush,
    ) -> Arc<PushWatch> {
        Arc::new(PushWatch {
            user,
            from_watcher: user_agent.contains(WATCHER_AGENT_TAG),
            commands: Mutex::new(CommandsParser::default()),
            recent,
            on_external_push,
        })
    }

    /// Feeds a request chunk to the command parser. Nothing is remembered yet: only what the
    /// server reports stored counts as seen.
    pub fn request_chunk(&self, chunk: &[u8]) {
        let mut commands = self.commands.lock().unwrap_or_else(|p| p.into_inner());
        if *commands.state() != CommandsState::Reading {
            return;
        }
        commands.feed(chunk);
        match commands.state() {
            CommandsState::Done(_) => {}
            CommandsState::Unreadable(why) => {
                tracing::warn!(user = %self.user, reason = why, "push commands not readable; this push fires no event");
            }
            CommandsState::Reading => {}
        }
    }

    /// A response inspector: feeds the report parser and reports the branches once the
    /// report is complete.
    pub fn response_inspector(self: Arc<Self>) -> impl FnMut(&[u8]) + Send + 'static {
        let mut report: Option<ReportParser> = None;
        move |chunk| {
            let parser = report.get_or_insert_with(|| ReportParser::new(self.uses_sideband()));
            if *parser.state() != ReportState::Reading {
                return;
            }
            parser.feed(chunk);
            match parser.state() {
                ReportState::Done(done) => self.finished(done),
                ReportState::Unreadable(why) => {
                    tracing::warn!(user = %self.user, reason = why, "push report not readable; this push fires no event");
                }
                ReportState::Reading => {}
            }
        }
    }

    fn uses_sideband(&self) -> bool {
        let commands = self.commands.lock().unwrap_or_else(|p| p.into_inner());
        match commands.state() {
            CommandsState::Done(parsed) => parsed.uses_sideband(),
            _ => false,
        }
    }

    fn finished(&self, report: &git_wire::report_status::Report) {
        let commands = self.commands.lock().unwrap_or_else(|p| p.into_inner());
        let CommandsState::Done(parsed) = commands.state() else {
            return;
        };
        for update in applied_updates(parsed, report) {
            let event = self.event(&update.refname, &update.new_oid);
            // Remembered before GitLab can echo it: receive-pack sends its report before it runs
            // the post-receive hook that triggers GitLab's webhook.
            self.recent.record(event.clone());
            if self.from_watcher {
                tracing::debug!(user = %event.user, git_ref = %event.refname, new_oid = %event.new_oid, "watcher push");
            } else {
                tracing::info!(user = %event.user, git_ref = %event.refname, new_oid = %event.new_oid, source = "proxy", "external push");
                (self.on_external_push)(event);
            }
        }
    }

    fn event(&self, refname: &str, new_oid: &str) -> ExternalPush {
        ExternalPush {
            user: self.user.clone(),
            refname: refname.to_owned(),
            new_oid: new_oid.to_owned(),
        }
    }
}
