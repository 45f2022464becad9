//! `REV` for `show` and `restore --at`: a commit id or unique prefix (or any revision git
//! resolves, such as a backup ref), an RFC 3339 time, or a duration ago (`10m`, `2h`). A time
//! means the newest save at or before that moment.

use std::collections::{BinaryHeap, HashSet};
use std::time::{Duration, SystemTime};

use git2::{Oid, Repository};

/// What the user asked for, before it meets a repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rev {
    /// An RFC 3339 time.
    Time(SystemTime),
    /// A duration before now.
    Ago(Duration),
    /// A commit id, a unique prefix, or any revision git resolves.
    Spec(String),
}

#[derive(Debug, thiserror::Error)]
pub enum RevError {
    #[error("`{0}` is not a save of this project (see `project-watcher history`)")]
    Unknown(String),
    #[error("`{0}` is ambiguous: several saves start with it; give more characters")]
    Ambiguous(String),
    #[error("`{text}` is not a valid time: {reason} (write it as 2026-11-30T13:05:00Z)")]
    BadTime { text: String, reason: String },
    #[error("the project has no saves yet")]
    NoSaves,
    #[error("there is no save at or before {asked}: the first save is from {first}")]
    BeforeFirst { asked: String, first: String },
    #[error("cannot read the project's history: {}", .0.message())]
    Git(#[from] git2::Error),
}

impl RevError {
    /// The user's input is wrong (exit 2), as opposed to the repository failing.
    pub fn is_usage(&self) -> bool {
        !matches!(self, Self::Git(_))
    }
}

/// Reads `text`: a time when it looks like a date, a duration when it has a unit, else a
/// revision. A duration wins over a short hex prefix (`1d` is a day, not a commit starting
/// `1d`; git refuses prefixes that short anyway), and a commit id as git abbreviates it (7 or
/// more hex digits) wins over a duration (`1255d13d`).
pub fn parse(text: &str) -> Result<Rev, RevError> {
    let text = text.trim();
    if looks_like_a_date(text) {
        return parse_time(text).map(Rev::Time);
    }
    if !is_abbreviated_id(text)
        && let Ok(ago) = humantime::parse_duration(text)
    {
        return Ok(Rev::Ago(ago));
    }
    Ok(Rev::Spec(text.to_owned()))
}

/// The shortest commit id git prints (`core.abbrev`'s default).
const SHORTEST_ABBREVIATION: usize = 7;

fn is_abbreviated_id(text: &str) -> bool {
    text.len() >= SHORTEST_ABBREVIATION && text.bytes().all(|b| b.is_ascii_hexdigit())
}

fn looks_like_a_date(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.len() >= 10
        && bytes[..4].iter().all(u8::is_ascii_digit)
        && bytes[4] == b'-'
        && bytes[7] == b'-'
}

/// RFC 3339 with `Z` or a numeric offset (`+02:00`), seconds and fractions optional.
pub fn parse_time(text: &str) -> Result<SystemTime, RevError> {
    let bad = |reason: &str| RevError::BadTime {
        text: text.to_owned(),
        reason: reason.to_owned(),
    };
    let upper = text.to_ascii_uppercase().replacen(' ', "T", 1);
    let (base, offset) = if let Some(base) = upper.strip_suffix('Z') {
        (base.to_owned(), 0i64)
    } else if upper.len() > 6 && matches!(&upper[upper.len() - 6..upper.len() - 5], "+" | "-") {
        let (base, tz) = upper.split_at(upper.len() - 6);
        let sign = if tz.starts_with('-') { -1 } else { 1 };
        let hours: i64 = tz[1..3].parse().map_err(|_| bad("bad offset"))?;
        let minutes: i64 = tz[4..6].parse().map_err(|_| bad("bad offset"))?;
        if &tz[3..4] != ":" || hours > 23 || minutes > 59 {
            return Err(bad("bad offset"));
        }
        (base.to_owned(), sign * (hours * 3600 + minutes * 60))
    } else {
        return Err(bad(
            "no time zone (end it with Z or an offset such as +02:00)",
        ));
    };
    // Seconds may be left out: `2026-11-30T13:05Z`.
    let base = if base.len() == 16 {
        format!("{base}:00")
    } else {
        base
    };
    let local = humantime::parse_rfc3339(&format!("{base}Z")).map_err(|e| bad(&e.to_string()))?;
    let shift = Duration::from_secs(offset.unsigned_abs());
    Ok(if offset >= 0 {
        local - shift
    } else {
        local + shift
    })
}

/// The commit `text` names in `repo`. Times and durations pick the newest save on `HEAD`'s
/// history at or before that moment (`now` anchors durations).
pub fn resolve(repo: &Repository, text: &str, now: SystemTime) -> Result<Oid, RevError> {
    match parse(text)? {
        Rev::Time(at) => at_or_before(repo, at),
        Rev::Ago(ago) => at_or_before(repo, now.checked_sub(ago).unwrap_or(SystemTime::UNIX_EPOCH)),
        Rev::Spec(spec) => {
            if spec.is_empty() {
                return Err(RevError::Unknown(spec));
            }
            let object = repo.revparse_single(&spec).map_err(|e| match e.code() {
                git2::ErrorCode::Ambiguous => RevError::Ambiguous(spec.clone()),
                _ => RevError::Unknown(spec.clone()),
            })?;
            let commit = object
                .peel_to_commit()
                .map_err(|_| RevError::Unknown(spec.clone()))?;
            Ok(commit.id())
        }
    }
}

/// The newest commit on `HEAD`'s history whose commit time is at or before `at`.
fn at_or_before(repo: &Repository, at: SystemTime) -> Result<Oid, RevError> {
    let asked = crate::status::timestamp(at);
    let at_secs = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let Ok(head) = repo.head().and_then(|h| h.peel_to_commit()) else {
        return Err(RevError::NoSaves);
    };
    let mut oldest = None;
    for commit in NewestFirst::new(repo, [head.id()])? {
        let commit = commit?;
        let (oid, time) = (commit.id(), commit.time().seconds());
        if time <= at_secs {
            return Ok(oid);
        }
        oldest = Some(time);
    }
    match oldest {
        None => Err(RevError::NoSaves),
        Some(first) => Err(RevError::BeforeFirst {
            asked,
            first: crate::status::timestamp(commit_time(first)),
        }),
    }
}

/// Commits reachable from the starting points, newest commit time first, read one at a time:
/// listing the last 20 saves of a long history reads about 20 commits. (libgit2's time-sorted
/// revwalk reads the whole history before it returns the first.)
pub struct NewestFirst<'r> {
    repo: &'r Repository,
    queue: BinaryHeap<(i64, Oid)>,
    seen: HashSet<Oid>,
}

impl<'r> NewestFirst<'r> {
    pub fn new(
        repo: &'r Repository,
        starts: impl IntoIterator<Item = Oid>,
    ) -> Result<Self, git2::Error> {
        let mut walk = Self {
            repo,
            queue: BinaryHeap::new(),
            seen: HashSet::new(),
        };
        for oid in starts {
            walk.enqueue(oid)?;
        }
        Ok(walk)
    }

    fn enqueue(&mut self, oid: Oid) -> Result<(), git2::Error> {
        if self.seen.insert(oid) {
            let time = self.repo.find_commit(oid)?.time().seconds();
            self.queue.push((time, oid));
        }
        Ok(())
    }
}

impl<'r> Iterator for NewestFirst<'r> {
    type Item = Result<git2::Commit<'r>, git2::Error>;

    fn next(&mut self) -> Option<Self::Item> {
        let (_, oid) = self.queue.pop()?;
        let mut step = || {
            let commit = self.repo.find_commit(oid)?;
            for parent in commit.parent_ids() {
                self.enqueue(parent)?;
            }
            Ok(commit)
        };
        Some(step())
    }
}

/// A commit's time (seconds since the epoch) as a `SystemTime`.
pub fn commit_time(seconds: i64) -> SystemTime {
    if seconds >= 0 {
        SystemTime::UNIX_EPOCH + Duration::from_secs(seconds as u64)
    } else {
        SystemTime::UNIX_EPOCH - Duration::from_secs(seconds.unsigned_abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> SystemTime {
        humantime::parse_rfc3339(text).unwrap()
    }

    #[test]
    fn parse_tells_times_durations_and_revisions_apart() {
        let check =
            |input: &str, expected: Rev| assert_eq!(parse(input).unwrap(), expected, "{input}");
        check(
            "2026-11-30T13:05:00Z",
            Rev::Time(at("2026-11-30T13:05:00Z")),
        );
        check(
            "2026-11-30t13:05:00z",
            Rev::Time(at("2026-11-30T13:05:00Z")),
        );
        check(
            "2026-11-30 13:05:00Z",
            Rev::Time(at("2026-11-30T13:05:00Z")),
        );
        check("2026-11-30T13:05Z", Rev::Time(at("2026-11-30T13:05:00Z")));
        check(
            "2026-11-30T15:05:00+02:00",
            Rev::Time(at("2026-11-30T13:05:00Z")),
        );
        check(
            "2026-11-30T08:35:00-04:30",
            Rev::Time(at("2026-11-30T13:05:00Z")),
        );
        check(
            "2026-11-30T13:05:00.25Z",
            Rev::Time(at("2026-11-30T13:05:00.25Z")),
        );
        check("10m", Rev::Ago(Duration::from_secs(600)));
        check("2h", Rev::Ago(Duration::from_secs(7200)));
        check("1h 30m", Rev::Ago(Duration::from_secs(5400)));
        check("1d", Rev::Ago(Duration::from_secs(86400)));
        check("12d", Rev::Ago(Duration::from_secs(12 * 86400)));
        // A commit id that also reads as a duration (1255 days and 13 days) is the commit.
        check("1255d13d", Rev::Spec("1255d13d".into()));
        check("a1b2c3d", Rev::Spec("a1b2c3d".into()));
        check(" HEAD~2 ", Rev::Spec("HEAD~2".into()));
        check(
            "refs/project-watcher/backup/20261130T130500Z",
            Rev::Spec("refs/project-watcher/backup/20261130T130500Z".into()),
        );
    }

    #[test]
    fn bad_times_are_usage_errors() {
        for input in [
            "2026-11-30T13:05:00",
            "2026-13-30T13:05:00Z",
            "2026-11-30T25:05:00Z",
            "2026-11-30T13:05:00+2:00",
            "2026-11-30T13:05:00+25:00",
        ] {
            let err = parse(input).unwrap_err();
            assert!(matches!(err, RevError::BadTime { .. }), "{input}: {err}");
            assert!(err.is_usage());
        }
    }
}
