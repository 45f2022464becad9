//! The page's `POST` handlers, each answering with a redirect back to the page
//! (Post/Redirect/Get): restore an earlier version, restore the project with its secrets.

use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use http::{HeaderValue, StatusCode, header};
use tokio::sync::broadcast::error::RecvError;

use super::Web;
use super::flash::Flash;
use super::pages::is_commit_id;
use super::respond::{busy_reading_saves, message, see_other};
use super::session::{CsrfForm, Posted};
use super::view;
use crate::host::{Diff, ProjectPages};
use crate::orchestrate::OrchestrateError;
use crate::orchestrate::history::SaveHistory;
use crate::patch::Change;
use crate::provider::SandboxProvider;
use crate::secrets::SecretValue;
use crate::status::SandboxStatus;
use crate::user::UserId;

/// The form's secret fields are named `env.<NAME>`; an empty field counts as not given.
const SECRET_FIELD: &str = "env.";

#[derive(serde::Deserialize)]
pub(super) struct RestoreVersionForm {
    csrf: Option<String>,
    commit: String,
}

impl CsrfForm for RestoreVersionForm {
    fn csrf(&self) -> Option<&str> {
        self.csrf.as_deref()
    }
}

pub(super) async fn restore_version<H: ProjectPages + SaveHistory, P: SandboxProvider + 'static>(
    State(web): State<Arc<Web<H, P>>>,
    Posted { session, form }: Posted<RestoreVersionForm>,
) -> Response {
    let page = format!("/u/{}", session.user);
    if !is_commit_id(&form.commit) {
        return message(
            StatusCode::BAD_REQUEST,
            "Not a save",
            "That is not a save id.",
        );
    }
    let status = web.statuses.status(session.user.as_str()).await;
    if !view::can_restore(status.as_ref(), web.backend.lifecycle().is_some()) {
        return message(
            StatusCode::CONFLICT,
            "Not now",
            "Your sandbox is not up on this server: an earlier version can be restored once it is.",
        );
    }
    web.restore_in_background(session.user, form.commit, Vec::new());
    see_other(&page)
}

#[derive(serde::Deserialize)]
pub(super) struct RestoreFileForm {
    csrf: Option<String>,
    commit: String,
    path: String,
}

impl CsrfForm for RestoreFileForm {
    fn csrf(&self) -> Option<&str> {
        self.csrf.as_deref()
    }
}

/// The longest path "Restore only this file" sends.
const MAX_RESTORED_PATH: usize = 4096;

/// Whether `path` can name a file of a save as git spells it: relative, no empty, `.` or `..`
/// segment (git's own `verify_path` refuses them), no NUL, not over [`MAX_RESTORED_PATH`].
fn is_file_path(path: &str) -> bool {
    !path.is_empty()
        && path.len() <= MAX_RESTORED_PATH
        && !path.contains('\0')
        && path
            .split('/')
            .all(|segment| !matches!(segment, "" | "." | ".."))
}

/// Why `path` of `commit` is not a file the save's page offers to restore, where this server
/// shows the save: a save the project does not have (404), a file the save did not change or
/// deleted (400). `None` when it is one, or when the host shows the save (GitLab) or its file
/// list was cut: then the watcher's `restore --at` decides.
async fn not_a_file_of_the_save<H: ProjectPages + SaveHistory, P: SandboxProvider + 'static>(
    web: &Web<H, P>,
    user: &UserId,
    commit: &str,
    path: &str,
) -> Option<Response> {
    match web.backend.orchestrator().host()?.diff(user, commit).await {
        Diff::Save(diff) => (!diff.cut
            && !diff
                .files
                .iter()
                .any(|file| file.path == path && file.change != Change::Deleted))
        .then(|| {
            message(
                StatusCode::BAD_REQUEST,
                "Not a file of this save",
                "That save did not make that file: its page offers only the files it changed.",
            )
        }),
        Diff::Missing(why) => Some(message(StatusCode::NOT_FOUND, "No such save", &why)),
        Diff::Busy => Some(busy_reading_saves()),
        Diff::Elsewhere(_) => None,
    }
}

/// "Restore only this file" on a save's page: that file as it was in the save, as a new save,
/// in the background (`restore --at <commit> --path <path>`). A save or a file the page would
/// not offer is refused first. Back to the workspace page, which says how it went.
pub(super) async fn restore_file<H: ProjectPages + SaveHistory, P: SandboxProvider + 'static>(
    State(web): State<Arc<Web<H, P>>>,
    Posted { session, form }: Posted<RestoreFileForm>,
) -> Response {
    if !is_commit_id(&form.commit) {
        return message(
            StatusCode::BAD_REQUEST,
            "Not a save",
            "That is not a save id.",
        );
    }
    if !is_file_path(&form.path) {
        return message(
            StatusCode::BAD_REQUEST,
            "Not a file",
            "That is not a file of the save.",
        );
    }
    if let Some(refusal) =
        not_a_file_of_the_save(&web, &session.user, &form.commit, &form.path).await
    {
        return refusal;
    }
    let status = web.statuses.status(session.user.as_str()).await;
    if !view::can_restore(status.as_ref(), web.backend.lifecycle().is_some()) {
        return message(
            StatusCode::CONFLICT,
            "Not now",
            "Your sandbox is not up on this server: a file can be restored once it is.",
        );
    }
    let page = format!("/u/{}", session.user);
    web.restore_in_background(session.user, form.commit, vec![form.path]);
    see_other(&page)
}

/// `POST /u/<user>/sign-out`: the session ends on every replica (its cookie no longer signs
/// in, even if someone kept a copy) and the browser forgets it.
pub(super) async fn sign_out<H: ProjectPages + SaveHistory, P: SandboxProvider + 'static>(
    State(web): State<Arc<Web<H, P>>>,
    Posted { session, .. }: Posted<Vec<(String, String)>>,
) -> Response {
    let ended = match &web.nonces {
        Some(nonces) => web.sign_in.end(&session, &**nonces).await,
        None => Err(()),
    };
    if ended.is_err() {
        return message(
            StatusCode::SERVICE_UNAVAILABLE,
            "Not signed out",
            "Your session cannot be ended right now: try again in a minute.",
        );
    }
    tracing::info!(user = %session.user, "signed out");
    let mut response = message(StatusCode::OK, "Signed out", "You are signed out.");
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("shmastra_session=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"),
    );
    response
}

pub(super) async fn restore_project<H: ProjectPages + SaveHistory, P: SandboxProvider + 'static>(
    State(web): State<Arc<Web<H, P>>>,
    Posted {
        session,
        form: fields,
    }: Posted<Vec<(String, String)>>,
) -> Response {
    let user = session.user;
    let page = format!("/u/{user}");
    if web.backend.lifecycle().is_none() {
        return see_other(&page);
    }
    if !matches!(
        web.statuses.status(user.as_str()).await,
        Some(SandboxStatus::NeedsSecrets { .. })
    ) {
        web.flashes.put(
            &user,
            Flash::notice("Your project does not wait for secrets."),
        );
        return see_other(&page);
    }
    let submitted: Vec<(String, SecretValue)> = fields
        .into_iter()
        .filter_map(|(name, value)| {
            let name = name.strip_prefix(SECRET_FIELD)?.to_owned();
            (!value.is_empty()).then(|| (name, SecretValue::new(value)))
        })
        .collect();
    // The form is judged before anything starts. Once the dev server is starting, the answer
    // does not wait for its health check (up to minutes): the status shows the rest.
    let mut changes = web.statuses.subscribe();
    let mut run = tokio::spawn({
        let (web, user) = (web.clone(), user.clone());
        async move {
            match web.backend.lifecycle() {
                Some(lifecycle) => lifecycle.reprovision(&user, submitted).await.map(|_| ()),
                None => Ok(()),
            }
        }
    });
    let starting = async {
        loop {
            match changes.recv().await {
                Ok(change)
                    if change.sandbox == user.as_str()
                        && matches!(change.status, SandboxStatus::Starting { .. }) =>
                {
                    return;
                }
                // Changes were missed: the latest status says whether it got there.
                Err(RecvError::Lagged(_))
                    if matches!(
                        web.statuses.status(user.as_str()).await,
                        Some(SandboxStatus::Starting { .. })
                    ) =>
                {
                    return;
                }
                Err(RecvError::Closed) => std::future::pending::<()>().await,
                _ => {}
            }
        }
    };
    let finished = tokio::select! {
        joined = &mut run => Some(joined),
        () = starting => None,
    };
    match finished {
        None | Some(Ok(Ok(()))) => {}
        Some(Ok(Err(OrchestrateError::Form(e)))) => web.flashes.put(
            &user,
            Flash {
                notice: None,
                problems: e.problems,
            },
        ),
        Some(Ok(Err(e))) => web.flashes.put(&user, Flash::notice(e.to_string())),
        Some(Err(panicked)) => {
            tracing::error!(user = %user, error = %panicked, "restoring the project panicked");
        }
    }
    see_other(&page)
}
