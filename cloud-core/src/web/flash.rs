//! What the next page load shows once (Post/Redirect/Get): a notice, and the restore form's
//! problems (names only, never a value).

use std::collections::HashMap;
use std::sync::Mutex;

use crate::secrets::FormProblem;
use crate::user::UserId;

/// One user's message for their next page load.
#[derive(Default)]
pub(super) struct Flash {
    pub notice: Option<String>,
    pub problems: Vec<FormProblem>,
}

impl Flash {
    /// A notice alone.
    pub fn notice(text: impl Into<String>) -> Flash {
        Flash {
            notice: Some(text.into()),
            problems: Vec::new(),
        }
    }
}

/// The flashes waiting for their user's next page load, in this process.
#[derive(Default)]
pub(super) struct Flashes(Mutex<HashMap<UserId, Flash>>);

impl Flashes {
    /// The user's flash, gone once taken; empty when there is none.
    pub fn take(&self, user: &UserId) -> Flash {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(user)
            .unwrap_or_default()
    }

    /// Takes the user's flash when it is a notice alone: its text.
    pub fn take_notice_alone(&self, user: &UserId) -> Option<String> {
        let mut flashes = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let text = flashes
            .get(user)
            .filter(|f| f.problems.is_empty())
            .and_then(|f| f.notice.clone())?;
        flashes.remove(user);
        Some(text)
    }

    /// Takes the user's flash when it is the notice `text` alone; whether it was.
    pub fn take_notice(&self, user: &UserId, text: &str) -> bool {
        let mut flashes = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let only_that = flashes
            .get(user)
            .is_some_and(|f| f.notice.as_deref() == Some(text) && f.problems.is_empty());
        if only_that {
            flashes.remove(user);
        }
        only_that
    }

    /// Replaces the user's flash.
    pub fn put(&self, user: &UserId, flash: Flash) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(user.clone(), flash);
    }
}
