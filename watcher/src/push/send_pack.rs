//! The watcher's receive-pack client for `http(s)://` remotes, as git's `send-pack.c` and
//! `remote-curl.c` speak it: `GET info/refs?service=git-receive-pack` (the refs and
//! capabilities), then `POST git-receive-pack` with one command (`old new ref`, capabilities
//! after a NUL), a flush and the pack, and the report-status read back (plain or inside
//! side-band-64k: band 2 is what the server said, band 3 a fatal error).
//!
//! Both requests go through [`crate::smart_http`], so they carry the User-Agent with the
//! watcher's tag, the operation's credentials (sent once, never after a refusal) and the
//! timeouts that fail a stalled attempt; the pack streams to the server as it is written.
//! The pack holds only what [`super::objects`] finds: the new commits and what they changed.

use std::io::{self, Read, Write};

use git_wire::advertisement::Advertisement;
use git_wire::pkt_line::FLUSH;
use git_wire::report_status::{RefUpdate, ReportParser, ReportState};
use git2::Oid;
use git2::transport::{Service, SmartSubtransport};

use crate::smart_http::SmartHttp;

/// The most advertisement bytes read: thousands of refs fit; more is not a server we push to.
const MAX_ADVERTISEMENT: u64 = 16 << 20;

const ZERO_OID: &str = "0000000000000000000000000000000000000000";

/// Why a push did not land. No variant holds a credential.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SendError {
    /// The connection or the HTTP exchange failed; the text is worded as libgit2's transport
    /// words it (`unexpected http status code: 401`, `timed out`), for [`crate::retry`].
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
    /// The server ended the exchange with a fatal error on side-band 3.
    #[error("the server failed: {0}")]
    Fatal(String),
    /// The server's answer is not git's protocol.
    #[error("the server's answer is not a git receive-pack answer: {0}")]
    Protocol(String),
    /// Reading the local objects or building the pack failed.
    #[error("cannot build the pack: {}", .0.message())]
    Local(git2::Error),
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

/// Pushes `head` to `dst` (a full ref name) at `url`, never forcing.
pub(crate) fn send(
    repo: &git2::Repository,
    http: &SmartHttp,
    url: &str,
    head: Oid,
    dst: &str,
) -> Result<Sent, SendError> {
    let advertisement = advertisement(http, url)?;
    let old = advertisement.oid_of(dst).unwrap_or(ZERO_OID).to_owned();
    if old != ZERO_OID {
        let old_oid = Oid::from_str(&old).map_err(SendError::Local)?;
        if old_oid == head {
            return Ok(Sent::UpToDate);
        }
        let contained = repo.find_commit(old_oid).is_ok()
            && repo.graph_descendant_of(head, old_oid).unwrap_or(false);
        if !contained {
            return Err(SendError::NonFastForward {
                refname: dst.to_owned(),
            });
        }
    }
    let hidden: Vec<Oid> = advertisement
        .refs
        .iter()
        .filter_map(|(oid, _)| Oid::from_str(oid).ok())
        .collect();
    let objects = super::objects::new_objects(repo, head, hidden).map_err(SendError::Local)?;
    let mut pack = repo.packbuilder().map_err(SendError::Local)?;
    pack.set_threads(1);
    for oid in &objects {
        pack.insert_object(*oid, None).map_err(SendError::Local)?;
    }

    let capabilities = capabilities(&advertisement);
    let sideband = capabilities.contains("side-band-64k");
    let report_status = capabilities.contains("report-status");
    let command = RefUpdate {
        old_oid: old,
        new_oid: head.to_string(),
        refname: dst.to_owned(),
    };
    let mut stream = http
        .action(url, Service::ReceivePack)
        .map_err(|e| SendError::Transport(io::Error::other(e.message().to_owned())))?;
    stream
        .write_all(&[command.encode(Some(&capabilities)), FLUSH.to_vec()].concat())
        .map_err(SendError::Transport)?;
    let mut written: io::Result<()> = Ok(());
    let built = pack.foreach(|chunk| {
        written = stream.write_all(chunk);
        written.is_ok()
    });
    written.map_err(SendError::Transport)?;
    built.map_err(SendError::Local)?;

    let mut parser = ReportParser::new(sideband);
    let mut buf = vec![0u8; 16 << 10];
    loop {
        let read = stream.read(&mut buf).map_err(SendError::Transport)?;
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
            return Ok(Sent::Updated {
                objects: objects.len(),
            });
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
    Ok(Sent::Updated {
        objects: objects.len(),
    })
}

/// The refs and capabilities of the remote at `url`.
fn advertisement(http: &SmartHttp, url: &str) -> Result<Advertisement, SendError> {
    let mut stream = http
        .action(url, Service::ReceivePackLs)
        .map_err(|e| SendError::Transport(io::Error::other(e.message().to_owned())))?;
    let mut body = Vec::new();
    (&mut stream)
        .take(MAX_ADVERTISEMENT)
        .read_to_end(&mut body)
        .map_err(SendError::Transport)?;
    Advertisement::parse(&body).map_err(|e| SendError::Protocol(e.to_string()))
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
