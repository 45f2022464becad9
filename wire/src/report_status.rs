//! What a push did, read from the bytes the proxy streams through: the ref-update commands at
//! the head of a `git-receive-pack` request, and the report-status (plain or inside side-band)
//! in its response. Both parsers are incremental, bounded and never panic on garbage.

use crate::pkt_line::{Pkt, PktDecoder, encode};

/// One ref update a client asked for: `<old-oid> <new-oid> <ref>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefUpdate {
    pub old_oid: String,
    pub new_oid: String,
    pub refname: String,
}

impl RefUpdate {
    /// A branch update that leaves the branch in place (not a deletion).
    pub fn updates_branch(&self) -> bool {
        self.refname.starts_with("refs/heads/") && self.new_oid.bytes().any(|b| b != b'0')
    }

    /// The command as a client sends it: one pkt-line, the first of a request carrying the
    /// capabilities after a NUL (as git's `send-pack.c` writes them).
    pub fn encode(&self, capabilities: Option<&str>) -> Vec<u8> {
        let mut line = format!("{} {} {}", self.old_oid, self.new_oid, self.refname).into_bytes();
        if let Some(capabilities) = capabilities {
            line.push(0);
            line.extend_from_slice(capabilities.as_bytes());
        }
        encode(&line)
    }
}

/// The command section of a receive-pack request, once its flush has been read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PushCommands {
    pub updates: Vec<RefUpdate>,
    pub capabilities: Vec<String>,
}

impl PushCommands {
    /// The client asked for side-band, so the report-status arrives inside band 1.
    pub fn uses_sideband(&self) -> bool {
        self.capabilities
            .iter()
            .any(|c| c == "side-band-64k" || c == "side-band")
    }
}

/// Where the command parser is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandsState {
    Reading,
    Done(PushCommands),
    /// Not something this parser understands (garbage, a push certificate, too long): the bytes
    /// still stream through, the push just cannot be attributed.
    Unreadable(&'static str),
}

/// The command section is a few refs; more than this is not a push we attribute.
const MAX_COMMAND_BYTES: usize = 1 << 20;

/// Reads the command list at the head of a receive-pack request, ignoring the pack after it.
#[derive(Debug)]
pub struct CommandsParser {
    decoder: PktDecoder,
    commands: PushCommands,
    seen_bytes: usize,
    state: CommandsState,
}

impl Default for CommandsParser {
    fn default() -> Self {
        Self {
            decoder: PktDecoder::default(),
            commands: PushCommands::default(),
            seen_bytes: 0,
            state: CommandsState::Reading,
        }
    }
}

impl CommandsParser {
    /// Feeds the next request chunk; cheap once the commands are read.
    pub fn feed(&mut self, chunk: &[u8]) {
        if self.state != CommandsState::Reading {
            return;
        }
        self.seen_bytes += chunk.len();
        let mut failure = None;
        let commands = &mut self.commands;
        let mut done = false;
        let fed = self.decoder.feed(chunk, |pkt| match pkt {
            Pkt::Flush => {
                done = true;
                false
            }
            Pkt::Data(line) => match parse_command(&line, commands.updates.is_empty()) {
                Ok(Some((update, caps))) => {
                    commands.updates.push(update);
                    if let Some(caps) = caps {
                        commands.capabilities = caps;
                    }
                    true
                }
                Ok(None) => true,
                Err(why) => {
                    failure = Some(why);
                    false
                }
            },
            Pkt::Delim | Pkt::ResponseEnd => {
                failure = Some("protocol v2 packet in a push");
                false
            }
        });
        self.state = match (fed, failure, done) {
            (Err(e), _, _) => CommandsState::Unreadable(e.0),
            (_, Some(why), _) => CommandsState::Unreadable(why),
            (_, None, true) => CommandsState::Done(std::mem::take(&mut self.commands)),
            _ if self.seen_bytes > MAX_COMMAND_BYTES => {
                CommandsState::Unreadable("command section too long")
            }
            _ => CommandsState::Reading,
        };
    }

    pub fn state(&self) -> &CommandsState {
        &self.state
    }
}

type ParsedCommand = (RefUpdate, Option<Vec<String>>);

/// One command line; `shallow` lines before the commands carry no update.
fn parse_command(line: &[u8], first: bool) -> Result<Option<ParsedCommand>, &'static str> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    if line.starts_with(b"shallow ") {
        return Ok(None);
    }
    if line.starts_with(b"push-cert") {
        return Err("signed push");
    }
    let (command, caps) = match line.iter().position(|&b| b == 0) {
        Some(nul) if first => (&line[..nul], Some(&line[nul + 1..])),
        Some(_) => return Err("capabilities after the first command"),
        None => (line, None),
    };
    let command = std::str::from_utf8(command).map_err(|_| "command is not UTF-8")?;
    let mut parts = command.splitn(3, ' ');
    let (Some(old), Some(new), Some(refname)) = (parts.next(), parts.next(), parts.next()) else {
        return Err("command is not `old new ref`");
    };
    if !is_oid(old) || !is_oid(new) || refname.is_empty() {
        return Err("command is not `old new ref`");
    }
    let caps = caps.map(|c| {
        String::from_utf8_lossy(c)
            .split(' ')
            .filter(|c| !c.is_empty())
            .map(str::to_owned)
            .collect()
    });
    let update = RefUpdate {
        old_oid: old.to_owned(),
        new_oid: new.to_owned(),
        refname: refname.to_owned(),
    };
    Ok(Some((update, caps)))
}

fn is_oid(s: &str) -> bool {
    (s.len() == 40 || s.len() == 64) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A complete report-status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// `unpack ok`: the pack was received intact.
    pub unpack_ok: bool,
    /// Refs the server reported `ok`, in order.
    pub ok_refs: Vec<String>,
    /// Refs the server reported `ng` (refused), in order.
    pub ng_refs: Vec<String>,
}

/// Where the report parser is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReportState {
    Reading,
    Done(Report),
    /// The server said something that is not a report (or sent a fatal band-3 message).
    Unreadable(&'static str),
}

/// Reads the report-status of a receive-pack response, fed chunk by chunk.
#[derive(Debug)]
pub struct ReportParser {
    sideband: bool,
    outer: PktDecoder,
    inner: PktDecoder,
    lines: ReportLines,
    state: ReportState,
    /// What the server said on band 2 (hook output, progress), at most [`MAX_SAID`] bytes.
    said: Vec<u8>,
    /// The message of a band-3 packet, which ends the exchange.
    fatal: Option<String>,
}

/// How much of the server's band-2 and band-3 text is kept for messages to people.
pub const MAX_SAID: usize = 2048;

/// The report's own lines, whether they came plain or inside band 1.
#[derive(Debug, Default)]
struct ReportLines {
    unpack_ok: Option<bool>,
    ok_refs: Vec<String>,
    ng_refs: Vec<String>,
    /// Each `ng` line's ref and reason, in order.
    refusals: Vec<(String, String)>,
}

impl ReportLines {
    /// Takes one report packet; `Ok(Some(report))` once the report's flush arrives.
    fn take(&mut self, pkt: Pkt) -> Result<Option<Report>, &'static str> {
        let line = match pkt {
            Pkt::Flush => {
                let unpack_ok = self.unpack_ok.ok_or("empty report")?;
                let ok_refs = std::mem::take(&mut self.ok_refs);
                let ng_refs = std::mem::take(&mut self.ng_refs);
                return Ok(Some(Report {
                    unpack_ok,
                    ok_refs,
                    ng_refs,
                }));
            }
            Pkt::Data(line) => line,
            Pkt::Delim | Pkt::ResponseEnd => return Err("protocol v2 packet in a report"),
        };
        let line = line.strip_suffix(b"\n").unwrap_or(&line);
        let line = std::str::from_utf8(line).map_err(|_| "report line is not UTF-8")?;
        match self.unpack_ok {
            None => {
                let status = line
                    .strip_prefix("unpack ")
                    .ok_or("report without `unpack`")?;
                self.unpack_ok = Some(status == "ok");
            }
            Some(_) => {
                if let Some(refname) = line.strip_prefix("ok ") {
                    self.ok_refs.push(refname.to_owned());
                } else if let Some(refused) = line.strip_prefix("ng ") {
                    let (refname, reason) = refused.split_once(' ').unwrap_or((refused, ""));
                    self.ng_refs.push(refname.to_owned());
                    let reason: String = reason.chars().take(MAX_SAID).collect();
                    self.refusals.push((refname.to_owned(), reason));
                } else if !line.starts_with("option ") {
                    return Err("unknown report line");
                }
            }
        }
        Ok(None)
    }
}

impl ReportParser {
    /// `sideband`: the request asked for side-band (see [`PushCommands::uses_sideband`]).
    pub fn new(sideband: bool) -> Self {
        Self {
            sideband,
            outer: PktDecoder::default(),
            inner: PktDecoder::default(),
            lines: ReportLines::default(),
            state: ReportState::Reading,
            said: Vec::new(),
            fatal: None,
        }
    }

    /// Each `ng` line's ref and the reason the server gave (`non-fast-forward`,
    /// `pre-receive hook declined`), in order.
    pub fn refusals(&self) -> &[(String, String)] {
        &self.lines.refusals
    }

    /// What the server said on side-band 2 so far (hook output, progress), lossily decoded.
    pub fn said(&self) -> String {
        String::from_utf8_lossy(&self.said).into_owned()
    }

    /// The message of the band-3 packet that ended the exchange, if one did.
    pub fn fatal(&self) -> Option<&str> {
        self.fatal.as_deref()
    }

    pub fn feed(&mut self, chunk: &[u8]) {
        if self.state != ReportState::Reading {
            return;
        }
        let sideband = self.sideband;
        let (inner, lines) = (&mut self.inner, &mut self.lines);
        let (said, fatal) = (&mut self.said, &mut self.fatal);
        let mut outcome: Option<ReportState> = None;
        let mut settle = |result: Result<Option<Report>, &'static str>| match result {
            Ok(None) => true,
            Ok(Some(report)) => {
                outcome = Some(ReportState::Done(report));
                false
            }
            Err(why) => {
                outcome = Some(ReportState::Unreadable(why));
                false
            }
        };
        let fed = self.outer.feed(chunk, |pkt| {
            if !sideband {
                return settle(lines.take(pkt));
            }
            match pkt {
                Pkt::Data(payload) => match payload.split_first() {
                    Some((1, data)) => {
                        let mut keep_going = true;
                        let inner_fed = inner.feed(data, |p| {
                            keep_going = settle(lines.take(p));
                            keep_going
                        });
                        match inner_fed {
                            Ok(()) => keep_going,
                            Err(e) => settle(Err(e.0)),
                        }
                    }
                    Some((2, text)) => {
                        let room = MAX_SAID.saturating_sub(said.len());
                        said.extend_from_slice(&text[..room.min(text.len())]);
                        true
                    }
                    Some((3, text)) => {
                        let text = &text[..MAX_SAID.min(text.len())];
                        *fatal = Some(String::from_utf8_lossy(text).trim_end().to_owned());
                        settle(Err("server sent a fatal error on band 3"))
                    }
                    _ => settle(Err("unknown side-band channel")),
                },
                Pkt::Flush => settle(Err("side-band ended before the report did")),
                Pkt::Delim | Pkt::ResponseEnd => {
                    settle(Err("protocol v2 packet in a push response"))
                }
            }
        });
        if let Some(state) = outcome {
            self.state = state;
        } else if let Err(e) = fed {
            self.state = ReportState::Unreadable(e.0);
        }
    }

    pub fn state(&self) -> &ReportState {
        &self.state
    }
}

/// The branch updates a finished push applied: requested, reported `ok`, and not deletions.
///
/// A ref the request names more than once is never applied here: which of its commands the
/// server stored cannot be told from the report, and an event must not carry an object id that
/// was not stored. Nor is a ref the report also calls `ng`.
pub fn applied_updates(commands: &PushCommands, report: &Report) -> Vec<RefUpdate> {
    if !report.unpack_ok {
        return Vec::new();
    }
    let once = |refname: &str| {
        commands
            .updates
            .iter()
            .filter(|u| u.refname == refname)
            .count()
            == 1
    };
    commands
        .updates
        .iter()
        .filter(|u| {
            u.updates_branch()
                && once(&u.refname)
                && report.ok_refs.contains(&u.refname)
                && !report.ng_refs.contains(&u.refname)
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pkt_line::FLUSH;
    use proptest::prelude::*;

    const OLD: &str = "0000000000000000000000000000000000000000";
    const NEW: &str = "1111111111111111111111111111111111111111";
    const NEW2: &str = "2222222222222222222222222222222222222222";

    fn request(lines: &[&str], pack: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for line in lines {
            out.extend(encode(line.as_bytes()));
        }
        out.extend(b"0000");
        out.extend(pack);
        out
    }

    fn commands_of(input: &[u8]) -> CommandsState {
        let mut parser = CommandsParser::default();
        parser.feed(input);
        parser.state().clone()
    }

    fn update(new: &str, refname: &str) -> RefUpdate {
        RefUpdate {
            old_oid: OLD.into(),
            new_oid: new.into(),
            refname: refname.into(),
        }
    }

    #[test]
    fn reads_the_command_section_and_ignores_the_pack() {
        let first = format!("{OLD} {NEW} refs/heads/main\0report-status side-band-64k agent=git/2");
        let second = format!("{OLD} {NEW2} refs/heads/dev\n");
        let input = request(&[&first, &second], b"PACK\x00\x00garbage");
        let CommandsState::Done(commands) = commands_of(&input) else {
            panic!("commands not read");
        };
        assert_eq!(
            commands.updates,
            vec![
                update(NEW, "refs/heads/main"),
                update(NEW2, "refs/heads/dev")
            ]
        );
        assert!(commands.uses_sideband());
    }

    #[test]
    fn encoded_commands_read_back() {
        let first = update(NEW, "refs/heads/main");
        let second = update(NEW2, "refs/heads/recovery/20261130T120000Z");
        let input = [
            first.encode(Some("report-status side-band-64k agent=git/2.0")),
            second.encode(None),
            FLUSH.to_vec(),
        ]
        .concat();
        let CommandsState::Done(commands) = commands_of(&input) else {
            panic!("commands not read");
        };
        assert_eq!(commands.updates, vec![first, second]);
        assert_eq!(
            commands.capabilities,
            ["report-status", "side-band-64k", "agent=git/2.0"]
        );
    }

    #[test]
    fn command_table() {
        let ok =
            |lines: &[&str]| matches!(commands_of(&request(lines, b"")), CommandsState::Done(_));
        let main = format!("{OLD} {NEW} refs/heads/main\0report-status");
        assert!(ok(&[&main]));
        assert!(ok(&[&format!("shallow {NEW}"), &main]));
        assert!(ok(&[]));
        assert!(!ok(&["push-cert\0report-status"]));
        assert!(!ok(&["not a command"]));
        assert!(!ok(&[&format!("{OLD} xyz refs/heads/main")]));
        assert!(!ok(&[&format!("{OLD} {NEW} ")]));
        assert!(!ok(&[&main, &main]), "a second NUL is not git's format");
        assert_eq!(
            commands_of(b"0009hel"),
            CommandsState::Reading,
            "a partial packet waits for more"
        );
        assert!(matches!(
            commands_of(b"PACK...."),
            CommandsState::Unreadable(_)
        ));
    }

    fn report_of(sideband: bool, input: &[u8]) -> ReportState {
        let mut parser = ReportParser::new(sideband);
        parser.feed(input);
        parser.state().clone()
    }

    fn plain(lines: &[&str]) -> Vec<u8> {
        let mut out = Vec::new();
        for line in lines {
            out.extend(encode(line.as_bytes()));
        }
        out.extend(b"0000");
        out
    }

    fn sideband(inner: &[u8], progress: &[&str]) -> Vec<u8> {
        let mut out = Vec::new();
        for p in progress {
            out.extend(encode(&[&[2u8][..], p.as_bytes()].concat()));
        }
        for piece in inner.chunks(7) {
            out.extend(encode(&[&[1u8][..], piece].concat()));
        }
        out.extend(b"0000");
        out
    }

    fn done(unpack_ok: bool, refs: &[&str]) -> ReportState {
        done_with_ng(unpack_ok, refs, &[])
    }

    fn done_with_ng(unpack_ok: bool, refs: &[&str], ng: &[&str]) -> ReportState {
        ReportState::Done(Report {
            unpack_ok,
            ok_refs: refs.iter().map(|r| r.to_string()).collect(),
            ng_refs: ng.iter().map(|r| r.to_string()).collect(),
        })
    }

    #[test]
    fn report_table() {
        let ok_main = plain(&["unpack ok\n", "ok refs/heads/main\n"]);
        assert_eq!(report_of(false, &ok_main), done(true, &["refs/heads/main"]));
        assert_eq!(
            report_of(true, &sideband(&ok_main, &["Resolving deltas\r"])),
            done(true, &["refs/heads/main"])
        );
        assert_eq!(
            report_of(
                false,
                &plain(&["unpack ok\n", "ng refs/heads/main non-fast-forward\n"])
            ),
            done_with_ng(true, &[], &["refs/heads/main"])
        );
        assert_eq!(
            report_of(
                false,
                &plain(&[
                    "unpack ok\n",
                    "ok refs/heads/main\n",
                    "option forced-update\n"
                ])
            ),
            done(true, &["refs/heads/main"])
        );
        assert_eq!(
            report_of(
                false,
                &plain(&[
                    "unpack index-pack abnormal exit\n",
                    "ng refs/heads/main unpacker error\n"
                ])
            ),
            done_with_ng(false, &[], &["refs/heads/main"])
        );
        assert_eq!(
            report_of(false, b"0000"),
            ReportState::Unreadable("empty report")
        );
        assert_eq!(report_of(false, &ok_main[..10]), ReportState::Reading);
        let fatal = [encode(b"\x03fatal: nope"), b"0000".to_vec()].concat();
        assert!(matches!(
            report_of(true, &fatal),
            ReportState::Unreadable(_)
        ));
        assert!(matches!(
            report_of(true, b"0000"),
            ReportState::Unreadable(_)
        ));
        assert!(matches!(
            report_of(false, b"HTTP/1.1 500"),
            ReportState::Unreadable(_)
        ));
    }

    #[test]
    fn refusal_reasons_progress_and_fatal_messages_are_kept() {
        let report = plain(&[
            "unpack ok\n",
            "ng refs/heads/main pre-receive hook declined\n",
            "ng refs/heads/dev\n",
        ]);
        let mut parser = ReportParser::new(true);
        parser.feed(&sideband(&report, &["remote: no pushes today\n"]));
        assert_eq!(
            parser.state(),
            &done_with_ng(true, &[], &["refs/heads/main", "refs/heads/dev"])
        );
        assert_eq!(
            parser.refusals(),
            [
                (
                    "refs/heads/main".to_owned(),
                    "pre-receive hook declined".to_owned()
                ),
                ("refs/heads/dev".to_owned(), String::new())
            ]
        );
        assert_eq!(parser.said(), "remote: no pushes today\n");
        assert_eq!(parser.fatal(), None);

        let mut parser = ReportParser::new(true);
        parser.feed(&encode(&[b"\x02".repeat(MAX_SAID * 2)].concat()));
        parser.feed(&encode(b"\x03fatal: disk full\n"));
        assert!(matches!(parser.state(), ReportState::Unreadable(_)));
        assert_eq!(parser.said().len(), MAX_SAID, "band 2 is bounded");
        assert_eq!(parser.fatal(), Some("fatal: disk full"));
    }

    #[test]
    fn applied_updates_need_unpack_ok_and_a_reported_branch() {
        let commands = PushCommands {
            updates: vec![
                update(NEW, "refs/heads/main"),
                update(OLD, "refs/heads/gone"),
                update(NEW, "refs/tags/v1"),
                update(NEW2, "refs/heads/rejected"),
            ],
            capabilities: vec![],
        };
        let report = Report {
            unpack_ok: true,
            ok_refs: vec![
                "refs/heads/main".into(),
                "refs/heads/gone".into(),
                "refs/tags/v1".into(),
            ],
            ng_refs: vec!["refs/heads/rejected".into()],
        };
        assert_eq!(
            applied_updates(&commands, &report),
            vec![update(NEW, "refs/heads/main")]
        );
        // The same ref twice: whichever the server stored, no event may name the other.
        let twice = PushCommands {
            updates: vec![
                update(NEW, "refs/heads/main"),
                update(NEW2, "refs/heads/main"),
            ],
            capabilities: vec![],
        };
        let one_ok_one_ng = Report {
            unpack_ok: true,
            ok_refs: vec!["refs/heads/main".into()],
            ng_refs: vec!["refs/heads/main".into()],
        };
        assert!(applied_updates(&twice, &one_ok_one_ng).is_empty());
        let both_ok = Report {
            ng_refs: vec![],
            ..one_ok_one_ng
        };
        assert!(applied_updates(&twice, &both_ok).is_empty());
        let failed = Report {
            unpack_ok: false,
            ..report
        };
        assert!(applied_updates(&commands, &failed).is_empty());
    }

    fn split_feed_report(sideband: bool, input: &[u8], cuts: &[usize]) -> ReportState {
        let mut parser = ReportParser::new(sideband);
        let mut start = 0;
        for &cut in cuts {
            let cut = cut.clamp(start, input.len());
            parser.feed(&input[start..cut]);
            start = cut;
        }
        parser.feed(&input[start..]);
        parser.state().clone()
    }

    fn split_feed_commands(input: &[u8], cuts: &[usize]) -> CommandsState {
        let mut parser = CommandsParser::default();
        let mut start = 0;
        for &cut in cuts {
            let cut = cut.clamp(start, input.len());
            parser.feed(&input[start..cut]);
            start = cut;
        }
        parser.feed(&input[start..]);
        parser.state().clone()
    }

    proptest! {
        #[test]
        fn splitting_a_report_anywhere_changes_nothing(
            mut cuts in proptest::collection::vec(0usize..200, 0..8),
            ng in any::<bool>(),
        ) {
            cuts.sort_unstable();
            let status = if ng { "ng refs/heads/main fetch first\n" } else { "ok refs/heads/main\n" };
            let report = plain(&["unpack ok\n", status]);
            let input = sideband(&report, &["remote: hello\n"]);
            prop_assert_eq!(split_feed_report(true, &input, &cuts), report_of(true, &input));
            prop_assert_eq!(split_feed_report(false, &report, &cuts), report_of(false, &report));
        }

        #[test]
        fn splitting_a_request_anywhere_changes_nothing(
            mut cuts in proptest::collection::vec(0usize..300, 0..8),
        ) {
            cuts.sort_unstable();
            let first = format!("{OLD} {NEW} refs/heads/main\0report-status side-band-64k");
            let input = request(&[&first], b"PACK\x00\x00\x00\x02");
            prop_assert_eq!(split_feed_commands(&input, &cuts), commands_of(&input));
        }

        #[test]
        fn garbage_never_panics(
            bytes in proptest::collection::vec(any::<u8>(), 0..512),
            cut in 0usize..512,
            sideband in any::<bool>(),
        ) {
            let cut = cut.min(bytes.len());
            let whole = report_of(sideband, &bytes);
            prop_assert_eq!(split_feed_report(sideband, &bytes, &[cut]), whole);
            let whole = commands_of(&bytes);
            prop_assert_eq!(split_feed_commands(&bytes, &[cut]), whole);
        }
    }
}
