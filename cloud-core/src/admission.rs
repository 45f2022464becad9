//! Admission by count: at most so many of something in progress per user and in total (git
//! requests in the proxy, event streams on the page), each slot held until it is dropped.

use std::sync::Arc;

use crate::user::UserId;

/// Why something was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Busy {
    /// The user has their most in progress.
    User,
    /// Everyone together has the most in progress.
    Total,
}

/// Things in progress (requests, event streams), per user and in total. An [`Admitted`] counts
/// until it is dropped, which for a request is when its response body has been read to its
/// end or abandoned.
pub(crate) struct Admission {
    max_total: usize,
    max_per_user: usize,
    counts: std::sync::Mutex<(usize, std::collections::HashMap<UserId, usize>)>,
}

impl Admission {
    pub(crate) fn new(max_total: usize, max_per_user: usize) -> Admission {
        Admission {
            max_total,
            max_per_user,
            counts: std::sync::Mutex::default(),
        }
    }

    pub(crate) fn admit(self: &Arc<Self>, user: &UserId) -> Result<Admitted, Busy> {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let (total, per_user) = &mut *counts;
        let mine = per_user.get(user).copied().unwrap_or(0);
        if mine >= self.max_per_user {
            return Err(Busy::User);
        }
        if *total >= self.max_total {
            return Err(Busy::Total);
        }
        *total += 1;
        per_user.insert(user.clone(), mine + 1);
        Ok(Admitted {
            admission: self.clone(),
            user: user.clone(),
        })
    }
}

/// One admitted request; leaves the counts when dropped.
pub(crate) struct Admitted {
    admission: Arc<Admission>,
    user: UserId,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut counts = self
            .admission
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let (total, per_user) = &mut *counts;
        *total = total.saturating_sub(1);
        if let Some(mine) = per_user.get_mut(&self.user) {
            *mine -= 1;
            if *mine == 0 {
                per_user.remove(&self.user);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str) -> UserId {
        UserId::parse(name).expect("user id")
    }

    #[test]
    fn requests_admission_are_capped_per_user_and_in_total_and_freed_on_drop() {
        let admission = Arc::new(Admission::new(3, 2));
        let a1 = admission.admit(&user("alice")).expect("first");
        let a2 = admission.admit(&user("alice")).expect("second");
        assert_eq!(admission.admit(&user("alice")).err(), Some(Busy::User));
        let b1 = admission.admit(&user("bob")).expect("bob");
        assert_eq!(admission.admit(&user("carol")).err(), Some(Busy::Total));
        drop(a1);
        let c1 = admission.admit(&user("carol")).expect("a slot came back");
        drop((a2, b1, c1));
        let counts = admission.counts.lock().expect("counts");
        assert_eq!(counts.0, 0);
        assert!(counts.1.is_empty(), "idle users leave no entry");
    }
}
