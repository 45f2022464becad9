//! Ending a child's whole process group: CGI children and sandbox commands run in groups of
//! their own, so a request or command that ends early leaves nothing behind.

use std::process::Stdio;

/// SIGKILLs every process in the group (`kill -KILL -- -PGID`): the library forbids `unsafe`,
/// and this runs only when a request ends early, a command timed out or the server stops, so
/// one extra process is cheap.
pub(crate) fn kill(group: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{group}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}
