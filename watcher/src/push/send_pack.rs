//! The watcher's receive-pack client, as git's `send-pack.c` speaks it: the advertisement (the
//! refs and capabilities), then one command (`old new ref`, capabilities after a NUL), a flush
//! and the pack, and the report-status read back (plain or inside side-band-64k: band 2 is
//! what the server said, band 3 a fatal error). The pack holds what [`super::objects`] finds
//! for the kind of pack asked for: the new commits and what they changed, or after a refusal
//! for missing objects a full pack.
//!
//! Two conversations carry it. [`Http`], as git's `remote-curl.c`: `GET
//! info/refs?service=git-receive-pack`, then `POST git-receive-pack`, both through
//! [`crate::smart_http`], so they carry the User-Agent with the watcher's tag, the operation's
//! credentials (sent once, never after a refusal) and the timeouts that fail a stalled attempt;
//! the pack streams to the server as it is written. A remote that is a path or a `file://` URL
//! is pushed in process instead ([`super::local`]).

use std::io::{self, Read, Write};

use git_wire::advertisement::Advertisement;
use git_wire::pkt_line::FLUSH;
use git_wire::report_status::{RefUpdate, ReportParser, ReportState};
use git2::Oid;
use git2::transport::{Service, SmartSubtransport, SmartSubtransportStream};

use super::objects::{self, Pack};
use crate::smart_http::SmartHttp;

/// The most advertisement bytes read: thousands of refs fit; more is not a server we push to.
const MAX_ADVERTISEMENT: u64 = 16 << 20;

const ZERO_OID: &str = "0000000000000000000000000000000000000000";

/// Why a push did not land. No variant holds a credential.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SendError {
    /// The connection or the HTTP exchange failed. An HTTP status is inside as a
    /// [`crate::smart_http::HttpStatus`] (see [`crate::smart_http::HttpStatus::of`]).
    #[error("{0}")]
    Transport(io::Error),
    /// The remote ref holds a commit the head does not contain: pushing would lose it.
    #[error(
        "the remote's {refname} has commits the local branch lacks (non-fast-forward); not forcing"
    )]
    NonFastForward { refname: String },
    /// The server refused the ref update (`ng <ref> <reason>`).
    #[error("the server rejected {refname}: {reason}{}", remote_said(said))]
    Refused {
        refname: String,
        reason: String,
        said: String,
    },
    /// The server could not store the pack.
    #[error("the server could not unpack the pack{}", remote_said(said))]
    Unpack { said: String },
    /// A remote on this machine would not hold every object the new tip reaches (the
    /// connectivity check): nothing was moved.
    #[error(
        "the push lacks {missing} object(s) the new tip reaches (first: {example}); the ref was not moved"
    )]
    Incomplete { missing: usize, example: String },
    /// The server ended the exchange with a fatal error on side-band 3.
    #[error("the server failed: {0}")]
    Fatal(String),
    /// The server's answer is not git's protocol.
    #[error("the server's answer is not a git receive-pack answer: {0}")]
    Protocol(String),
    /// Reading the local objects or building the pack failed.
    #[error("cannot build the pack: {}", .0.message())]
    Local(git2::Error),
    /// A remote on this machine could not take the objects or the ref update (disk full,
    /// permissions, a broken repository).
    #[error("cannot write into the repository at {}: {}", dir.display(), source.message())]
    Store {
        dir: std::path::PathBuf,
        source: git2::Error,
    },
}

fn remote_said(said: &str) -> String {
    let lines: Vec<&str> = said
        .lines()
        .flat_map(|l| l.split('\r'))
        .map(|l| l.trim().trim_start_matches("remote:").trim())
        .filter(|l| !l.is_empty())
        .collect();
    if lines.is_empty() {
        String::new()
    } else {
        format!(" (remote said: {})", lines.join("; "))
    }
}

/// What a push that landed did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sent {
    /// The remote ref already was `head`: nothing was sent.
    UpToDate,
    /// The server stored the pack and moved the ref; `objects` went in the pack.
    Updated { objects: usize },
}

/// One receive-pack conversation: the advertisement, then one request (commands, flush,
/// pack) and its response.
pub(crate) trait Conversation {
    fn advertisement(&mut self) -> Result<Advertisement, SendError>;
    /// Writes the next piece of the request.
    fn write(&mut self, bytes: &[u8]) -> io::Result<()>;
    /// Reads the response; the first call ends the request.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize>;
}

/// Pushes `head` to `dst` (a full ref name) over `conversation`, never forcing, with a pack
/// of `pack`'s kind.
pub(crate) fn send(
    repo: &git2::Repository,
    conversation: &mut dyn Conversation,
    head: Oid,
    dst: &str,
    pack: Pack,
) -> Result<Sent, SendError> {
    let advertisement = conversation.advertisement()?;
    let old = advertisement.oid_of(dst).unwrap_or(ZERO_OID).to_owned();
    let old_oid = match old.as_str() {
        ZERO_OID => None,
        hex => Some(Oid::from_str(hex).map_err(SendError::Local)?),
    };
    if fast_forward(repo, old_oid, head, dst)? == Sent::UpToDate {
        return Ok(Sent::UpToDate);
    }
    let hidden: Vec<Oid> = advertisement
        .refs
        .iter()
        .filter_map(|(oid, _)| Oid::from_str(oid).ok())
        .collect();
    let mut pack = objects::build(repo, head, &hidden, pack).map_err(SendError::Local)?;
    let objects = pack.object_count();

    let capabilities = capabilities(&advertisement);
    let sideband = capabilities.contains("side-band-64k");
    let report_status = capabilities.contains("report-status");
    let command = RefUpdate {
        old_oid: old,
        new_oid: head.to_string(),
        refname: dst.to_owned(),
    };
    conversation
        .write(&[command.encode(Some(&capabilities)), FLUSH.to_vec()].concat())
        .map_err(SendError::Transport)?;
    let mut written: io::Result<()> = Ok(());
    let built = pack.foreach(|chunk| {
        written = conversation.write(chunk);
        written.is_ok()
    });
    written.map_err(SendError::Transport)?;
    built.map_err(SendError::Local)?;

    let mut parser = ReportParser::new(sideband);
    let mut buf = vec![0u8; 16 << 10];
    loop {
        let read = conversation.read(&mut buf).map_err(SendError::Transport)?;
        if read == 0 {
            break;
        }
        parser.feed(&buf[..read]);
        if *parser.state() != ReportState::Reading {
            break;
        }
    }
    let report = match parser.state() {
        ReportState::Done(report) => report,
        ReportState::Reading if !report_status => {
            return Ok(Sent::Updated { objects });
        }
        ReportState::Reading => {
            return Err(SendError::Transport(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the server closed the connection before its report",
            )));
        }
        ReportState::Unreadable(why) => {
            return Err(match parser.fatal() {
                Some(message) => SendError::Fatal(message.to_owned()),
                None => SendError::Protocol((*why).to_owned()),
            });
        }
    };
    if !report.unpack_ok {
        return Err(SendError::Unpack {
            said: parser.said(),
        });
    }
    if let Some((refname, reason)) = parser.refusals().iter().find(|(r, _)| r == dst) {
        return Err(SendError::Refused {
            refname: refname.clone(),
            reason: reason.clone(),
            said: parser.said(),
        });
    }
    if !report.ok_refs.iter().any(|r| r == dst) {
        return Err(SendError::Protocol(format!(
            "the report does not mention {dst}"
        )));
    }
    Ok(Sent::Updated { objects })
}

/// Whether moving `dst` from `old` (none: it does not exist) to `head` is a fast-forward, as
/// git's client checks before sending anything: `UpToDate` when it already holds `head`,
/// `Updated` (with nothing sent yet) when it may move, `NonFastForward` when `old` is not in
/// `head`'s history (or unknown here), since pushing would lose it.
pub(crate) fn fast_forward(
    repo: &git2::Repository,
    old: Option<Oid>,
    head: Oid,
    dst: &str,
) -> Result<Sent, SendError> {
    let Some(old) = old else {
        return Ok(Sent::Updated { objects: 0 });
    };
    if old == head {
        return Ok(Sent::UpToDate);
    }
    let contained =
        repo.find_commit(old).is_ok() && repo.graph_descendant_of(head, old).unwrap_or(false);
    if contained {
        Ok(Sent::Updated { objects: 0 })
    } else {
        Err(SendError::NonFastForward {
            refname: dst.to_owned(),
        })
    }
}

/// The conversation with a smart-HTTP server: `GET info/refs`, then one `POST`, both made
/// by [`SmartHttp`] (User-Agent, credentials, timeouts, redirects within the origin).
pub(crate) struct Http<'a> {
    http: &'a SmartHttp,
    url: &'a str,
    post: Option<Box<dyn SmartSubtransportStream>>,
}

impl<'a> Http<'a> {
    pub(crate) fn new(http: &'a SmartHttp, url: &'a str) -> Self {
        Self {
            http,
            url,
            post: None,
        }
    }

    fn post(&mut self) -> io::Result<&mut Box<dyn SmartSubtransportStream>> {
        if self.post.is_none() {
            let stream = self
                .http
                .action(self.url, Service::ReceivePack)
                .map_err(|e| io::Error::other(e.message().to_owned()))?;
            self.post = Some(stream);
        }
        Ok(self.post.as_mut().expect("just set"))
    }
}

impl Conversation for Http<'_> {
    fn advertisement(&mut self) -> Result<Advertisement, SendError> {
        let mut stream = self
            .http
            .action(self.url, Service::ReceivePackLs)
            .map_err(|e| SendError::Transport(io::Error::other(e.message().to_owned())))?;
        let mut body = Vec::new();
        (&mut stream)
            .take(MAX_ADVERTISEMENT)
            .read_to_end(&mut body)
            .map_err(SendError::Transport)?;
        Advertisement::parse(&body).map_err(|e| SendError::Protocol(e.to_string()))
    }

    fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.post()?.write_all(bytes)
    }

    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.post()?.read(buf)
    }
}

/// The capabilities the push asks for, of those the server offers, as `send-pack.c` picks
/// them: report-status, side-band-64k, quiet (no progress wanted), the object format, agent.
fn capabilities(advertisement: &Advertisement) -> String {
    let mut wanted = Vec::new();
    for capability in ["report-status", "side-band-64k", "quiet"] {
        if advertisement.supports(capability) {
            wanted.push(capability.to_owned());
        }
    }
    if advertisement.supports("object-format") {
        wanted.push("object-format=sha1".to_owned());
    }
    if advertisement.supports("agent") {
        let agent: String = crate::transport::user_agent()
            .chars()
            .map(|c| if c.is_ascii_graphic() { c } else { '.' })
            .collect();
        wanted.push(format!("agent={agent}"));
    }
    wanted.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_are_those_asked_for_and_offered() {
        let offered = |caps: &[&str]| Advertisement {
            refs: Vec::new(),
            capabilities: caps.iter().map(|c| c.to_string()).collect(),
        };
        let all = capabilities(&offered(&[
            "report-status",
            "report-status-v2",
            "delete-refs",
            "side-band-64k",
            "quiet",
            "atomic",
            "ofs-delta",
            "object-format=sha1",
            "agent=git/2.43.0",
        ]));
        assert!(
            all.starts_with("report-status side-band-64k quiet object-format=sha1 agent=git/2.0.(project-watcher/"),
            "{all}"
        );
        assert!(!all.contains(' ') || all.split(' ').all(|c| !c.is_empty()));
        assert_eq!(capabilities(&offered(&["delete-refs"])), "");
    }

    #[test]
    fn what_the_server_said_is_one_line_without_prefixes() {
        assert_eq!(remote_said(""), "");
        assert_eq!(
            remote_said("remote: no pushes today\nremote: \r\nResolving deltas\r"),
            " (remote said: no pushes today; Resolving deltas)"
        );
    }
}
