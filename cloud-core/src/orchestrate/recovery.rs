//! The recovery policy (how long to wait before re-provisioning a lost sandbox, how many
//! recoveries a user gets within a window) and the per-user budget that enforces it. Pure:
//! the caller passes the time in.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::user::UserId;

/// How recovery behaves when an operation finds its sandbox gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryPolicy {
    /// The pause before re-provisioning: a provider's "not found" is sometimes momentary, and
    /// re-provisioning starts by looking again.
    pub wait: Duration,
    /// Recoveries allowed per user within `window`; the next loss is a hard error.
    pub max_recoveries: u32,
    /// The sliding window recoveries are counted in.
    pub window: Duration,
}

impl Default for RecoveryPolicy {
    /// Wait 1.5 s; at most 3 recoveries per user within 15 minutes.
    fn default() -> Self {
        Self {
            wait: Duration::from_millis(1500),
            max_recoveries: 3,
            window: Duration::from_secs(15 * 60),
        }
    }
}

/// When each user's recent recoveries happened. Share one instance across all operations.
#[derive(Debug, Default)]
pub struct RecoveryBudget {
    used: Mutex<HashMap<UserId, VecDeque<Instant>>>,
}

impl RecoveryBudget {
    /// Spends one recovery for `user` at `now` and returns how many the window now holds, or,
    /// when the window already holds `policy.max_recoveries`, spends nothing and returns that
    /// count as the error.
    pub fn take(&self, user: &UserId, now: Instant, policy: &RecoveryPolicy) -> Result<u32, u32> {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        let recent = used.entry(user.clone()).or_default();
        while recent
            .front()
            .is_some_and(|&at| now.saturating_duration_since(at) >= policy.window)
        {
            recent.pop_front();
        }
        let count = u32::try_from(recent.len()).unwrap_or(u32::MAX);
        if count >= policy.max_recoveries {
            return Err(count);
        }
        recent.push_back(now);
        Ok(count + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str) -> UserId {
        UserId::parse(name).unwrap()
    }

    /// `take` at each offset (seconds) from a common start, with a 3-per-60 s policy.
    fn check(offsets: &[u64], expected: &[Result<u32, u32>]) {
        let policy = RecoveryPolicy {
            wait: Duration::ZERO,
            max_recoveries: 3,
            window: Duration::from_secs(60),
        };
        let budget = RecoveryBudget::default();
        let start = Instant::now();
        let got: Vec<_> = offsets
            .iter()
            .map(|&s| budget.take(&user("alice"), start + Duration::from_secs(s), &policy))
            .collect();
        assert_eq!(got, expected, "offsets {offsets:?}");
    }

    #[test]
    fn three_recoveries_fit_in_the_window_and_the_fourth_is_refused() {
        check(&[0, 1, 2, 3, 4], &[Ok(1), Ok(2), Ok(3), Err(3), Err(3)]);
    }

    #[test]
    fn a_recovery_leaves_the_window_after_it() {
        check(
            &[0, 10, 20, 59, 60, 61],
            &[Ok(1), Ok(2), Ok(3), Err(3), Ok(3), Err(3)],
        );
        check(&[0, 100, 200, 300], &[Ok(1), Ok(1), Ok(1), Ok(1)]);
    }

    #[test]
    fn refusals_spend_nothing() {
        check(
            &[0, 0, 0, 30, 30, 60],
            &[Ok(1), Ok(2), Ok(3), Err(3), Err(3), Ok(1)],
        );
    }

    #[test]
    fn users_have_their_own_budgets() {
        let policy = RecoveryPolicy::default();
        let budget = RecoveryBudget::default();
        let now = Instant::now();
        for _ in 0..3 {
            budget.take(&user("alice"), now, &policy).unwrap();
        }
        assert_eq!(budget.take(&user("alice"), now, &policy), Err(3));
        assert_eq!(budget.take(&user("bob"), now, &policy), Ok(1));
    }

    #[test]
    fn the_default_policy_is_the_documented_one() {
        let policy = RecoveryPolicy::default();
        assert_eq!(policy.wait, Duration::from_millis(1500));
        assert_eq!(policy.max_recoveries, 3);
        assert_eq!(policy.window, Duration::from_secs(900));
    }
}
