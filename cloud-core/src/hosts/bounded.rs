//! Reading what git prints for the page without holding all of it: a diff up to a cap (git is
//! stopped there), and the history's records with each message kept to its head and its tail
//! (where the subject and the trailers are), the whole read stopped past a cap.

use std::process::Stdio;

use tokio::io::AsyncReadExt as _;
use tokio::process::Command;

use crate::orchestrate::history::LoggedCommit;

/// The most of a diff the page shows.
pub(super) const MAX_DIFF_BYTES: usize = 1 << 20;
/// Of each message in the history: its first and its last this many bytes.
pub(super) const MESSAGE_HEAD: usize = 16 << 10;
pub(super) const MESSAGE_TAIL: usize = 16 << 10;
/// The most of `git log`'s output read for one history (past it, the records read so far).
pub(super) const MAX_HISTORY_BYTES: usize = 64 << 20;
/// The most of an author's name kept.
const MAX_AUTHOR: usize = 256;

/// What a capped run printed.
pub(super) struct Capped {
    pub bytes: Vec<u8>,
    /// The output went on past the cap; git was stopped.
    pub cut: bool,
    /// git exited 0 (unknown, and `false`, when it was stopped).
    pub success: bool,
}

/// Runs `command`, reading at most `limit` bytes of its stdout; past that it is killed.
pub(super) async fn output_capped(mut command: Command, limit: usize) -> std::io::Result<Capped> {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let mut child = command.spawn()?;
    let mut stdout = child.stdout.take().expect("stdout is piped");
    let mut bytes = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let cut = loop {
        let n = stdout.read(&mut buf).await?;
        if n == 0 {
            break false;
        }
        let room = limit - bytes.len();
        if n > room {
            bytes.extend_from_slice(&buf[..room]);
            break true;
        }
        bytes.extend_from_slice(&buf[..n]);
    };
    if cut {
        let _ = child.kill().await;
        return Ok(Capped {
            bytes,
            cut,
            success: false,
        });
    }
    let status = child.wait().await?;
    Ok(Capped {
        bytes,
        cut,
        success: status.success(),
    })
}

/// `git log --format=%H%x00%cI%x00%B%x1e` read as it comes: `(id, time, message)` records,
/// each message its first [`MESSAGE_HEAD`] and last [`MESSAGE_TAIL`] bytes (joined by a line
/// `…` when something was left out), at most [`MAX_HISTORY_BYTES`] read in all (a last record
/// without its separator is left out); and whether git failed or was stopped.
pub(super) async fn log_records(
    mut command: Command,
) -> std::io::Result<(Vec<LoggedCommit>, bool)> {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let mut child = command.spawn()?;
    let mut stdout = child.stdout.take().expect("stdout is piped");
    let mut records = Records::default();
    let mut buf = vec![0u8; 64 << 10];
    let mut read = 0usize;
    loop {
        let n = stdout.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        read += n;
        records.feed(&buf[..n]);
        if read > MAX_HISTORY_BYTES {
            let _ = child.kill().await;
            return Ok((records.done, true));
        }
    }
    let success = child.wait().await?.success();
    Ok((records.done, !success))
}

/// The record being read, bounded.
#[derive(Default)]
struct Records {
    done: Vec<LoggedCommit>,
    /// Which field of the record: 0 id, 1 time, 2 author, 3 message.
    field: usize,
    id: Vec<u8>,
    time: Vec<u8>,
    author: Vec<u8>,
    head: Vec<u8>,
    /// The last bytes of the message past its head, as a ring.
    tail: std::collections::VecDeque<u8>,
    dropped: bool,
}

impl Records {
    fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            match (self.field, b) {
                (_, 0x1e) => self.end_record(),
                (0..=2, 0) => self.field += 1,
                (0, b) if self.id.len() < 64 => self.id.push(b),
                (1, b) if self.time.len() < 64 => self.time.push(b),
                (2, b) if self.author.len() < MAX_AUTHOR => self.author.push(b),
                (0..=2, _) => {}
                (_, b) if self.head.len() < MESSAGE_HEAD => self.head.push(b),
                (_, b) => {
                    if self.tail.len() == MESSAGE_TAIL {
                        self.tail.pop_front();
                        self.dropped = true;
                    }
                    self.tail.push_back(b);
                }
            }
        }
    }

    fn end_record(&mut self) {
        let id = String::from_utf8_lossy(&self.id)
            .trim_start_matches('\n')
            .to_owned();
        if self.field == 3 && !id.is_empty() {
            let mut message = std::mem::take(&mut self.head);
            if self.dropped {
                message.extend_from_slice("\n…\n".as_bytes());
            }
            message.extend(self.tail.drain(..));
            self.done.push(LoggedCommit {
                id,
                time: String::from_utf8_lossy(&self.time).into_owned(),
                author: String::from_utf8_lossy(&self.author).into_owned(),
                message: String::from_utf8_lossy(&message).into_owned(),
            });
        }
        *self = Records {
            done: std::mem::take(&mut self.done),
            ..Records::default()
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_keep_each_messages_head_and_tail() {
        let mut records = Records::default();
        let long = "s".repeat(MESSAGE_HEAD + 10)
            + &"t".repeat(MESSAGE_TAIL + 10)
            + "\n\nSave-kind: autosave";
        let text = format!(
            "a1\x002024-01-01T00:00:00Z\x00Ann\x00short\n\x1e\nb2\x002024-01-02T00:00:00Z\x00Bo\x00{long}\x1e"
        );
        // Fed in pieces that split fields and records.
        for piece in text.as_bytes().chunks(7) {
            records.feed(piece);
        }
        assert_eq!(records.done.len(), 2);
        assert_eq!(
            records.done[0],
            LoggedCommit {
                id: "a1".into(),
                time: "2024-01-01T00:00:00Z".into(),
                author: "Ann".into(),
                message: "short\n".into()
            }
        );
        let LoggedCommit {
            id,
            author,
            message,
            ..
        } = &records.done[1];
        assert_eq!((id.as_str(), author.as_str()), ("b2", "Bo"));
        assert!(
            message.len() <= MESSAGE_HEAD + MESSAGE_TAIL + 8,
            "{}",
            message.len()
        );
        assert!(message.starts_with("sss") && message.ends_with("Save-kind: autosave"));
        assert!(message.contains("\n…\n"));
    }
}
