//! A proptest runner that counts the cases reaching a property's accept branch, so a property
//! cannot pass by never accepting (the parser proptests of cloud-core and git-wire use it), and
//! the share assertion the watcher's properties make about their own branches.

use std::cell::Cell;
use std::fmt::Debug;

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// Runs `property` on `PROPTEST_CASES` inputs (512 by default) from `strategy`; `property`
/// returns whether the input reached the parser's accept branch. Prints
/// `RELIABILITY parser-<name>: cases=N accepted=M` and fails when fewer than `min_accepted`
/// (a fraction) of the cases did.
pub fn check<S>(
    name: &str,
    strategy: S,
    min_accepted: f64,
    property: impl Fn(S::Value) -> Result<bool, TestCaseError>,
) where
    S: Strategy,
    S::Value: Debug,
{
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let (total, accepted) = (Cell::new(0u64), Cell::new(0u64));
    let outcome = runner.run(&strategy, |input| {
        let reached = property(input)?;
        total.set(total.get() + 1);
        accepted.set(accepted.get() + u64::from(reached));
        Ok(())
    });
    if let Err(e) = outcome {
        panic!("{name}: {e}");
    }
    let (total, accepted) = (total.get(), accepted.get());
    println!("RELIABILITY parser-{name}: cases={total} accepted={accepted}");
    assert_share(name, "the accept branch", accepted, total, min_accepted);
}

/// Fails unless `reached` is at least `min` (a fraction) of `of`, and `of` is not zero: a
/// property that seldom reaches its interesting branch proves little however often it passes.
pub fn assert_share(name: &str, branch: &str, reached: u64, of: u64, min: f64) {
    assert!(
        of > 0 && reached as f64 >= min * of as f64,
        "{name}: only {reached} of {of} cases reached {branch} (want {min})"
    );
}
