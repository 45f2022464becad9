//! What a watcher's process tree costs, read from `/proc`: CPU time, resident memory and
//! inotify watches, summed over every process in its process group.
//!
//! CPU counts each live process's own time plus the time of the children it has reaped
//! (`cutime`/`cstime`), so the many short `git` processes the baseline forks are counted once
//! each, whether they are still running or long gone.

use std::fs;

use anyhow::{Context, Result};

/// `/proc/<pid>/stat` counts in USER_HZ, which Linux fixes at 100 for user space.
const TICKS_PER_SECOND: f64 = 100.0;

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sample {
    /// CPU seconds (user + system) of the group and its reaped children.
    pub cpu_s: f64,
    pub rss_kib: u64,
    /// The part of RSS that is the processes' own memory, not mapped files (binaries,
    /// shared libraries, git pack files).
    pub rss_anon_kib: u64,
    pub watches: u64,
    pub processes: usize,
}

/// One line of `/proc/<pid>/stat`, the fields the bench needs.
#[derive(Debug, PartialEq)]
struct Stat {
    pgrp: u32,
    cpu_ticks: u64,
}

fn parse_stat(line: &str) -> Option<Stat> {
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = &line[line.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `fields[0]` is field 3 (state) of proc(5).
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(Stat {
        pgrp: u32::try_from(field(5)?).ok()?,
        cpu_ticks: field(14)? + field(15)? + field(16)? + field(17)?,
    })
}

/// A `kB` field of `/proc/<pid>/status`, 0 when absent (a zombie has no memory).
fn status_kib(status: &str, field: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn count_inotify_watches(fdinfo: &str) -> u64 {
    fdinfo
        .lines()
        .filter(|l| l.starts_with("inotify wd:"))
        .count() as u64
}

/// Samples every process whose process group is `pgid`. Processes that exit while being read
/// are skipped: their time is already in their parent's `cutime`, or about to be. With
/// `cpu_only_leader`, the group leader (pid `pgid`) adds its CPU time but not its memory,
/// watches or process count: it is a supervisor, not part of what is measured.
pub fn sample_group(pgid: u32, cpu_only_leader: bool) -> Result<Sample> {
    let mut sample = Sample::default();
    for entry in fs::read_dir("/proc").context("reading /proc")? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(line) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(stat) = parse_stat(&line) else {
            continue;
        };
        if stat.pgrp != pgid {
            continue;
        }
        sample.cpu_s += stat.cpu_ticks as f64 / TICKS_PER_SECOND;
        if cpu_only_leader && pid == pgid {
            continue;
        }
        sample.processes += 1;
        let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        sample.rss_kib += status_kib(&status, "VmRSS");
        sample.rss_anon_kib += status_kib(&status, "RssAnon");
        if let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fdinfo")) {
            for fd in fds.flatten() {
                if let Ok(info) = fs::read_to_string(fd.path()) {
                    sample.watches += count_inotify_watches(&info);
                }
            }
        }
    }
    Ok(sample)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_read_after_the_command_name() {
        let line = "4242 (git (add) x) S 4000 4001 4001 0 -1 4194304 120 0 0 0 7 3 20 5 20 0 1 0 99 1000 50 18446744073709551615";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                pgrp: 4001,
                cpu_ticks: 7 + 3 + 20 + 5
            })
        );
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn rss_and_watches_are_read_from_their_lines() {
        let status = "Name:\tx\nVmRSS:\t   5120 kB\nRssAnon:\t    1024 kB\n";
        assert_eq!(status_kib(status, "VmRSS"), 5120);
        assert_eq!(status_kib(status, "RssAnon"), 1024);
        assert_eq!(status_kib("Name:\tzombie\n", "VmRSS"), 0);
        let fdinfo = "pos:\t0\nflags:\t00\ninotify wd:1 ino:2 sdev:3 mask:4 ignored_mask:0\ninotify wd:2 ino:5 sdev:3 mask:4 ignored_mask:0\n";
        assert_eq!(count_inotify_watches(fdinfo), 2);
    }

    #[test]
    fn sampling_a_live_group_sees_its_processes_and_reaped_children_cpu() {
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new("sh")
            .args([
                "-c",
                "(i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done); exec sleep 30",
            ])
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = child.id();
        let sample = testkit::wait::until(
            std::time::Duration::from_secs(60),
            "the shell to reap its busy subshell",
            || {
                let s = sample_group(pgid, false).unwrap();
                // One process left means the busy subshell was reaped and the shell became
                // `sleep`: all the CPU seen then is the reaped child's.
                (s.processes == 1 && s.cpu_s >= 0.1).then_some(s)
            },
        );
        let leader_cpu_only = sample_group(pgid, true).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(sample.rss_kib > sample.rss_anon_kib, "{sample:?}");
        assert!(sample.rss_anon_kib > 0, "{sample:?}");
        assert_eq!(sample.watches, 0, "{sample:?}");
        assert_eq!(
            (
                leader_cpu_only.processes,
                leader_cpu_only.rss_kib,
                leader_cpu_only.cpu_s >= sample.cpu_s
            ),
            (0, 0, true),
            "the leader's CPU counts, its memory does not: {leader_cpu_only:?}"
        );
    }
}
