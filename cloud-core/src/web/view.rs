//! The workspace page's HTML (maud, compiled in): the page, its status fragment (also what the
//! server-sent events carry), the history fragment, a save's diff, and the one-message pages.
//! Every state is text plus a shape, so it reads without colour.

use std::time::SystemTime;

use maud::{DOCTYPE, Markup, PreEscaped, html};

use crate::orchestrate::history::Save;
use crate::patch::{Change, FileDiff, Line, LineKind, SaveDiff};
use crate::secrets::FormProblem;
use crate::status::{ProvisionStep, SandboxStatus};

/// How the project is reached from a laptop.
pub enum ProjectLink {
    /// GitLab's project page.
    GitLab { web_url: String },
    /// The embedded upstream: the clone URL and the user's project token (the git password).
    Embedded { clone_url: String, token: String },
}

/// Everything the page shows.
pub struct PageData<'a> {
    pub user: &'a str,
    pub csrf: &'a str,
    pub status: Option<&'a SandboxStatus>,
    pub sandboxes: bool,
    pub project: Option<ProjectLink>,
    pub history: Result<Vec<Save>, String>,
    pub notice: Option<&'a str>,
    pub problems: &'a [FormProblem],
}

fn layout(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) }
                link rel="stylesheet" href="/static/page.css";
            }
            body { (body) }
        }
    }
}

/// A page with one message (a refused link, a missing session, a forbidden project); with
/// `own`, the user a valid session signs in, a link to their own workspace.
pub fn message_page(title: &str, message: &str, own: Option<&str>) -> Markup {
    layout(
        title,
        html! {
            main {
                h1 { (title) }
                p #message { (message) }
                @if let Some(user) = own {
                    p { a #own-workspace href={"/u/" (user)} { "Go to your workspace" } }
                }
            }
        },
    )
}

/// What a sign-in link opens: who it signs in, and a button that does it (a `POST`). Opening
/// the link spends nothing, so a chat preview or a mail scanner that fetches it leaves it for
/// the user; the `POST` must come from this page's origin, so another site cannot sign a
/// browser in as someone else.
pub fn sign_in_page(user: &str, link: &str) -> Markup {
    layout(
        "Sign in",
        html! {
            main {
                h1 { "Sign in" }
                form #sign-in method="post" action="/login" {
                    input type="hidden" name="t" value=(link);
                    button type="submit" { "Sign in as " (user) }
                }
            }
        },
    )
}

/// The answer to a redeemed link: it goes on to the workspace by a refresh from this origin,
/// not by an HTTP redirect. A link opened from a mail or a chat is a cross-site navigation, and
/// a redirect inherits that: the browser would not send the `SameSite=Strict` cookie it just
/// set. The refresh is a navigation this page starts, so the cookie goes with it.
pub fn signed_in_page(user: &str) -> Markup {
    let target = format!("/u/{user}");
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta http-equiv="refresh" content={"0; url=" (target)};
                title { "Signed in" }
                link rel="stylesheet" href="/static/page.css";
            }
            body {
                main {
                    h1 { "Signed in" }
                    p #message { "Opening your workspace… " a href=(target) { "continue" } }
                }
            }
        }
    }
}

pub fn page(data: &PageData<'_>) -> Markup {
    layout(
        "Your workspace",
        html! {
            main #workspace data-user=(data.user) {
                h1 { "Workspace of " (data.user) }
                form #sign-out method="post" action={"/u/" (data.user) "/sign-out"} {
                    input type="hidden" name="csrf" value=(data.csrf);
                    button type="submit" { "Sign out" }
                }
                @if let Some(notice) = data.notice {
                    p #notice role="alert" { (notice) }
                }
                section #status aria-live="polite" {
                    (status_fragment(data.user, data.csrf, data.status, data.sandboxes, data.problems))
                }
                section #project { (project(data.project.as_ref())) }
                section #history {
                    (history_fragment(data.user, data.csrf, &data.history, can_restore(data.status, data.sandboxes)))
                }
            }
            script src="/static/page.js" {}
        },
    )
}

/// (state name, shape, label) of a status.
fn badge(status: Option<&SandboxStatus>, sandboxes: bool) -> (&'static str, &'static str, String) {
    match status {
        None if sandboxes => ("starting", "◌", "Starting".into()),
        None => ("none", "○", "No sandbox on this server".into()),
        Some(SandboxStatus::Ready) => ("ready", "●", "Ready".into()),
        Some(SandboxStatus::Syncing { .. }) => ("syncing", "◐", "Syncing".into()),
        Some(SandboxStatus::Starting { .. }) => ("syncing", "◐", "Starting the dev server".into()),
        Some(SandboxStatus::Restoring { .. }) => {
            ("syncing", "◐", "Restoring an earlier version".into())
        }
        Some(SandboxStatus::Provisioning { step }) => (
            "syncing",
            "◐",
            match step {
                ProvisionStep::Creating => "Creating your sandbox",
                ProvisionStep::Restoring => "Restoring your project",
                ProvisionStep::Starting => "Starting your project",
            }
            .into(),
        ),
        Some(SandboxStatus::Broken { .. }) => ("broken", "✖", "Broken".into()),
        Some(SandboxStatus::NeedsSecrets { .. }) => ("secrets", "◆", "Needs your secrets".into()),
        Some(SandboxStatus::NeedsAttention { .. }) => ("attention", "▲", "Needs attention".into()),
    }
}

/// What a sync's step does, in the page's words.
fn sync_step_words(step: &str) -> &'static str {
    match step {
        "open" | "lock" => "opening the project",
        "fetch" => "fetching the pushed changes",
        "backup" => "keeping unsaved work",
        "stop" => "stopping the dev server",
        "restore" => "updating the files",
        "install" => "installing dependencies",
        "start" => "starting the dev server",
        _ => "working",
    }
}

/// The status block: dot, label, and what goes with the state (the failure, the restore form).
pub fn status_fragment(
    user: &str,
    csrf: &str,
    status: Option<&SandboxStatus>,
    sandboxes: bool,
    problems: &[FormProblem],
) -> Markup {
    let (state, shape, label) = badge(status, sandboxes);
    html! {
        p .status data-state=(state) {
            span .dot aria-hidden="true" { (shape) }
            " "
            strong #status-label { (label) }
            @if let Some(SandboxStatus::Syncing { step: Some(step), .. }) = status {
                " · "
                span #status-step data-step=(step) { (sync_step_words(step)) }
            }
            @if let Some(since) = status.and_then(SandboxStatus::since) {
                " · "
                time #status-elapsed datetime=(since) title={"since " (since)} {
                    (elapsed_since(since, SystemTime::now()))
                }
            }
        }
        @match status {
            Some(SandboxStatus::Broken { failure }) => {
                div #failure {
                    p { "Step: " strong #failure-step { (failure.step) } }
                    p #failure-message { (failure.message) }
                    @if !failure.first.is_empty() {
                        p { "First error lines:" }
                        pre #failure-first { (failure.first) }
                    }
                    @if !failure.tail.is_empty() {
                        p { "End of the output:" }
                        pre #failure-tail { (failure.tail) }
                    }
                    p #failure-next {
                        "To fix it, push a fix from your clone, or restore an earlier save "
                        "with its \"Restore this version\" button below."
                    }
                }
            }
            Some(SandboxStatus::NeedsSecrets { names }) => {
                (restore_form(user, csrf, names, problems))
            }
            Some(SandboxStatus::NeedsAttention { reason }) => { p #attention { (reason) } }
            Some(SandboxStatus::Starting { url }) => {
                p #starting { "Waiting for " code { (url) } " to answer." }
            }
            _ => {}
        }
    }
}

/// How long ago `since` (RFC 3339) was, as the page's script also counts it: `12 s`,
/// `3 min 4 s`, `2 h 5 min`; `0 s` for a time ahead of `now` or unreadable.
fn elapsed_since(since: &str, now: SystemTime) -> String {
    let seconds = humantime::parse_rfc3339(since)
        .ok()
        .and_then(|began| now.duration_since(began).ok())
        .map_or(0, |d| d.as_secs());
    match seconds {
        0..60 => format!("{seconds} s"),
        60..3600 => format!("{} min {} s", seconds / 60, seconds % 60),
        _ => format!("{} h {} min", seconds / 3600, seconds / 60 % 60),
    }
}

fn problem_for<'a>(problems: &'a [FormProblem], field: &str) -> Option<&'a FormProblem> {
    problems.iter().find(|p| match p {
        FormProblem::Missing { name }
        | FormProblem::Duplicate { name }
        | FormProblem::ContainsNul { name }
        | FormProblem::TooLarge { name, .. }
        | FormProblem::NoExactForm { name } => name == field,
        FormProblem::Unexpected { .. } | FormProblem::TotalTooLarge { .. } => false,
    })
}

/// The restore project form: one password field per secret the saved `shmastra.json` names.
/// Values are never put back into it.
fn restore_form(user: &str, csrf: &str, names: &[String], problems: &[FormProblem]) -> Markup {
    html! {
        form #restore-project method="post" action={"/u/" (user) "/restore-project"} autocomplete="off" {
            h2 { "Restore project" }
            p { "Your project is back. Its secrets were never saved: enter them to start it." }
            input type="hidden" name="csrf" value=(csrf);
            @for name in names {
                @let problem = problem_for(problems, name);
                div .field {
                    label for={"env-" (name)} { (name) }
                    input type="password" id={"env-" (name)} name={"env." (name)} autocomplete="off"
                        aria-invalid=[problem.map(|_| "true")];
                    @if let Some(problem) = problem {
                        span .error role="alert" data-field=(name) { "✖ " (problem) }
                    }
                }
            }
            @for problem in problems.iter().filter(|p| matches!(p, FormProblem::Unexpected { .. } | FormProblem::TotalTooLarge { .. })) {
                p .error role="alert" { "✖ " (problem) }
            }
            button type="submit" { "Restore project" }
        }
    }
}

fn project(link: Option<&ProjectLink>) -> Markup {
    html! {
        h2 { "Project" }
        @match link {
            Some(ProjectLink::GitLab { web_url }) => {
                a #project-button .button href=(web_url) target="_blank" rel="noopener noreferrer" { "Open the project on GitLab" }
            }
            Some(ProjectLink::Embedded { clone_url, token }) => {
                p { "Clone it on your laptop, edit, and push: your sandbox follows." }
                (copy_button("clone-commands"))
                pre #clone-commands {
                    "git clone " (clone_url) " shmastra\n"
                    "cd shmastra && git add -A && git commit -m 'my change' && git push"
                }
                details {
                    summary { "Git asks for a password: your project token" }
                    (copy_button("project-token"))
                    code #project-token { (token) }
                }
            }
            None => { p { "Project persistence is off on this server." } }
        }
    }
}

/// A button the page's script makes copy the text of the element `target` (or select it, where
/// the clipboard is refused).
fn copy_button(target: &str) -> Markup {
    html! {
        button .copy type="button" data-copy=(target) { "Copy" }
    }
}

/// Whether "Restore this version" is offered: this server runs the user's sandbox, and it is
/// up (not being made, nor waiting for its secrets).
pub fn can_restore(status: Option<&SandboxStatus>, sandboxes: bool) -> bool {
    sandboxes
        && matches!(
            status,
            Some(SandboxStatus::Ready | SandboxStatus::Broken { .. })
        )
}

/// The saves, newest first, each opening its diff, with "Restore this version" when
/// `can_restore`.
pub fn history_fragment(
    user: &str,
    csrf: &str,
    history: &Result<Vec<Save>, String>,
    can_restore: bool,
) -> Markup {
    html! {
        h2 { "History" }
        @match history {
            Err(why) => p .error { (why) },
            Ok(saves) if saves.is_empty() => p { "No saves yet." },
            Ok(saves) => {
                ol #saves {
                    @for save in saves {
                        (save_row(user, csrf, save, can_restore))
                    }
                }
            }
        }
    }
}

/// The first characters of a commit id, as git's short ids.
fn short_id(commit: &str) -> &str {
    commit.get(..7).unwrap_or(commit)
}

/// One line per save: kind, subject (opening the diff), short id, author, time (the page's
/// script makes it relative, with the local time on hover), the files when the subject does
/// not already name them, and "Restore this version".
fn save_row(user: &str, csrf: &str, save: &Save, can_restore: bool) -> Markup {
    let files = save.files.join(", ");
    html! {
        li .save data-commit=(save.commit) data-kind=(save.kind.as_str()) {
            span .kind { (save.kind.as_str()) }
            " "
            a .diff href={"/u/" (user) "/saves/" (save.commit)} { (save.subject) }
            " "
            code .short-id { (short_id(&save.commit)) }
            @if !save.author.is_empty() {
                " by "
                span .author { (save.author) }
            }
            " "
            time datetime=(save.time) title=(save.time) { (save.time) }
            @if !files.is_empty() && files != save.subject {
                " "
                span .files { (files) }
            }
            @if can_restore {
                " "
                (restore_version_form(user, csrf, &save.commit))
            }
        }
    }
}

fn restore_version_form(user: &str, csrf: &str, commit: &str) -> Markup {
    html! {
        form .restore-version method="post" action={"/u/" (user) "/restore-version"} {
            input type="hidden" name="csrf" value=(csrf);
            input type="hidden" name="commit" value=(commit);
            button type="submit" { "Restore this version" }
        }
    }
}

/// A save's page: who made it and when, then each file it changed: what happened to it, its
/// added and removed lines (a sign and a colour each), a binary's size, a large file folded;
/// "Restore this version", and "Restore only this file" for each file the save has, when
/// `can_restore`.
pub fn diff_page(user: &str, csrf: &str, can_restore: bool, diff: &SaveDiff) -> Markup {
    layout(
        "A save",
        html! {
            main #save data-commit=(diff.commit) {
                p { a href={"/u/" (user)} { "← back to the workspace" } }
                h1 { (diff.subject) }
                p .save-meta {
                    code .short-id { (short_id(&diff.commit)) }
                    @if !diff.author.is_empty() { " by " span .author { (diff.author) } }
                    " "
                    time datetime=(diff.time) title=(diff.time) { (diff.time) }
                }
                @if can_restore {
                    (restore_version_form(user, csrf, &diff.commit))
                }
                @if diff.files.is_empty() {
                    p { "This save changed no file." }
                }
                @for (index, file) in diff.files.iter().enumerate() {
                    (file_diff(user, csrf, can_restore, &diff.commit, index, file))
                }
                @if diff.cut {
                    p .cut { "… the diff goes on: the page shows its first 1 MiB." }
                }
            }
            script src="/static/page.js" {}
        },
    )
}

fn file_diff(
    user: &str,
    csrf: &str,
    can_restore: bool,
    commit: &str,
    index: usize,
    file: &FileDiff,
) -> Markup {
    let (added, removed) = file.counts();
    let id = format!("diff-{index}");
    html! {
        section .file data-path=(file.path) data-change=(file.change.as_str()) {
            h2 {
                code .path { (file.path) }
                " "
                span .change { (file.change.as_str()) }
                @if let Some(old) = &file.old_path { " from " code { (old) } }
                @if file.binary.is_none() && (added, removed) != (0, 0) {
                    " "
                    span .counts { "+" (added) " −" (removed) }
                }
            }
            @if can_restore && file.change != Change::Deleted {
                form .restore-file method="post" action={"/u/" (user) "/restore-file"} {
                    input type="hidden" name="csrf" value=(csrf);
                    input type="hidden" name="commit" value=(commit);
                    input type="hidden" name="path" value=(file.path);
                    button type="submit" { "Restore only this file" }
                }
            }
            @match file.binary {
                Some(Some(size)) => p .binary { "binary file, " (size) " bytes" },
                Some(None) => p .binary { "binary file" },
                None if file.lines.is_empty() => {},
                None if file.is_large() => details .lines {
                    summary { (file.lines.len()) " lines: show them" }
                    (copy_button(&id))
                    (lines(&id, &file.lines))
                },
                None => {
                    (copy_button(&id))
                    (lines(&id, &file.lines))
                },
            }
        }
    }
}

fn lines(id: &str, lines: &[Line]) -> Markup {
    html! {
        pre .diff id=(id) {
            @for line in lines {
                @match line.kind {
                    LineKind::Added => { span .add { "+ " (line.text) } "\n" }
                    LineKind::Removed => { span .del { "− " (line.text) } "\n" }
                    LineKind::Context => { span .ctx { "  " (line.text) } "\n" }
                    LineKind::Hunk => { span .hunk { (line.text) } "\n" }
                    LineKind::NoNewline => { span .nonl { (line.text) } "\n" }
                }
            }
        }
    }
}

/// The page's script: live status, history and restore notices over server-sent events,
/// relative times, a confirmation before restoring. Served as a file so the CSP needs no
/// inline script.
pub const PAGE_JS: &str = include_str!("page.js");
pub const PAGE_CSS: &str = include_str!("page.css");

/// Markup as the string a server-sent event carries.
pub fn to_event_data(markup: Markup) -> String {
    let PreEscaped(text) = markup;
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sync_shows_how_long_it_has_run() {
        let began = humantime::parse_rfc3339("2026-12-02T14:00:00Z").unwrap();
        let check = |seconds: u64, expected: &str| {
            let now = began + std::time::Duration::from_secs(seconds);
            assert_eq!(elapsed_since("2026-12-02T14:00:00Z", now), expected);
        };
        check(12, "12 s");
        check(184, "3 min 4 s");
        check(7500, "2 h 5 min");
        assert_eq!(
            elapsed_since(
                "2026-12-02T14:00:00Z",
                began - std::time::Duration::from_secs(5)
            ),
            "0 s"
        );
        assert_eq!(elapsed_since("not a time", began), "0 s");
        let html = to_event_data(status_fragment(
            "alice",
            "t",
            Some(&SandboxStatus::Syncing {
                since: Some("2026-12-02T14:00:00Z".into()),
                step: Some("install".into()),
            }),
            true,
            &[],
        ));
        assert!(
            html.contains(r#"<time id="status-elapsed" datetime="2026-12-02T14:00:00Z""#),
            "{html}"
        );
        assert!(
            html.contains(
                r#"<span id="status-step" data-step="install">installing dependencies</span>"#
            ),
            "{html}"
        );
        let old = to_event_data(status_fragment(
            "alice",
            "t",
            Some(&SandboxStatus::Syncing {
                since: None,
                step: None,
            }),
            true,
            &[],
        ));
        assert!(
            old.contains("Syncing")
                && !old.contains("status-elapsed")
                && !old.contains("status-step"),
            "{old}"
        );
    }

    #[test]
    fn markup_is_escaped() {
        let html = to_event_data(status_fragment(
            "alice",
            "t",
            Some(&SandboxStatus::Broken {
                failure: shmastra_contract::SyncFailure::parse(b"step: <b>\nerror: x\n<script>"),
            }),
            true,
            &[],
        ));
        assert!(
            !html.contains("<script>") && html.contains("&lt;script&gt;"),
            "{html}"
        );
        assert!(
            html.contains("&lt;b&gt;"),
            "the step is escaped too: {html}"
        );
    }
}
