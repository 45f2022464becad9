//! Connect-RPC's JSON server streaming as envd speaks it, and envd's `process.Process` messages.
//!
//! Pure: framing in, events out, no IO. The wire format, from connect-go's
//! `protocol_connect.go` and `envelope.go` (the library envd serves with): the request is
//! `POST /<package>.<Service>/<Method>` with `Content-Type: application/connect+json`,
//! `Connect-Protocol-Version: 1` and one enveloped message; the answer is a sequence of
//! envelopes, each a flags byte (`0b01` compressed, `0b10` end of stream), a 4-byte big-endian
//! length and that many bytes of JSON. The last envelope carries the end of the stream:
//! `{"error": {"code": "...", "message": "..."}, "metadata": {...}}`, the error absent on
//! success. The messages are E2B's `spec/envd/process/process.proto` in proto3's JSON mapping:
//! field names in lowerCamelCase, `bytes` as standard base64, default values (an exit code of
//! 0, `exited: false`) left out.

use std::collections::BTreeMap;

use base64::Engine;
use serde::{Deserialize, Serialize};

/// The request's content type for a JSON server stream.
pub(crate) const STREAM_CONTENT_TYPE: &str = "application/connect+json";
/// An envelope whose payload is compressed (never asked for, so never accepted).
const FLAG_COMPRESSED: u8 = 0b01;
/// The envelope that ends the stream.
const FLAG_END_STREAM: u8 = 0b10;
/// The largest envelope accepted: envd sends output in chunks of a few KiB.
pub(crate) const MAX_ENVELOPE: usize = 16 << 20;

/// One message framed for the request body.
pub(crate) fn envelope(json: &[u8]) -> Vec<u8> {
    let mut framed = Vec::with_capacity(5 + json.len());
    framed.push(0);
    framed.extend_from_slice(&u32::try_from(json.len()).unwrap_or(u32::MAX).to_be_bytes());
    framed.extend_from_slice(json);
    framed
}

/// What the stream's bytes did not make sense as.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FrameError {
    #[error("an envelope of {0} bytes is over the {MAX_ENVELOPE}-byte limit")]
    TooLarge(usize),
    #[error("a compressed envelope, which was not asked for")]
    Compressed,
    #[error("a message that is not the expected JSON: {0}")]
    Json(String),
}

/// One decoded envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Frame {
    Message(Vec<u8>),
    End(EndStream),
}

/// Splits a byte stream into envelopes, whatever the chunking: at most one partial envelope is
/// buffered.
#[derive(Debug, Default)]
pub(crate) struct Decoder {
    buffer: Vec<u8>,
}

impl Decoder {
    pub(crate) fn push(&mut self, chunk: &[u8]) {
        self.buffer.extend_from_slice(chunk);
    }

    /// The next whole envelope, `None` until one is buffered.
    pub(crate) fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        let Some(header) = self.buffer.get(..5) else {
            return Ok(None);
        };
        let flags = header[0];
        let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        if len > MAX_ENVELOPE {
            return Err(FrameError::TooLarge(len));
        }
        if flags & FLAG_COMPRESSED != 0 {
            return Err(FrameError::Compressed);
        }
        if self.buffer.len() < 5 + len {
            return Ok(None);
        }
        let data: Vec<u8> = self.buffer.drain(..5 + len).skip(5).collect();
        if flags & FLAG_END_STREAM != 0 {
            let end = serde_json::from_slice(&data).map_err(|e| FrameError::Json(e.to_string()))?;
            return Ok(Some(Frame::End(end)));
        }
        Ok(Some(Frame::Message(data)))
    }

    /// Bytes of an envelope that has not arrived whole.
    pub(crate) fn pending(&self) -> usize {
        self.buffer.len()
    }
}

/// The stream's last envelope.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub(crate) struct EndStream {
    #[serde(default)]
    pub(crate) error: Option<WireError>,
}

/// A Connect error: `code` is one of connect-go's names (`unavailable`, `deadline_exceeded`,
/// `not_found`, ...).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub(crate) struct WireError {
    #[serde(default)]
    pub(crate) code: String,
    #[serde(default)]
    pub(crate) message: String,
}

/// `process.StartRequest`: the SDK's `commands.run` sends `/bin/bash -l -c CMD` with the
/// command's `envs` and `cwd`, and `stdin: false` (`packages/js-sdk/src/sandbox/commands/index.ts`).
#[derive(Debug, Serialize)]
pub(crate) struct StartRequest<'a> {
    pub(crate) process: ProcessConfig<'a>,
    pub(crate) stdin: bool,
}

#[derive(Debug, Serialize)]
pub(crate) struct ProcessConfig<'a> {
    pub(crate) cmd: &'a str,
    pub(crate) args: Vec<&'a str>,
    pub(crate) envs: BTreeMap<&'a str, &'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cwd: Option<&'a str>,
}

/// `process.ConnectRequest` for a process by pid.
#[derive(Debug, Serialize)]
pub(crate) struct ConnectRequest {
    pub(crate) process: PidSelector,
}

#[derive(Debug, Serialize)]
pub(crate) struct PidSelector {
    pub(crate) pid: u32,
}

/// One `process.ProcessEvent`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event {
    Start {
        pid: u32,
    },
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    End(End),
    Keepalive,
    /// A member of the `oneof` this client does not know (a newer envd), or pty output.
    Other,
}

/// `ProcessEvent.EndEvent`. envd fills it from Go's `ProcessState`
/// (`packages/envd/internal/services/process/handler/handler.go` in e2b-dev/infra): `exit_code`
/// is `-1` and `exited` false when a signal ended the process, `status` is Go's text for it
/// (`exit status 1`, `signal: killed`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct End {
    /// The exit code; `-1` for a signal.
    #[serde(default)]
    pub exit_code: i32,
    /// Whether the process exited (rather than being ended by a signal).
    #[serde(default)]
    pub exited: bool,
    /// Go's text for how it ended.
    #[serde(default)]
    pub status: String,
    /// The same text when it failed.
    #[serde(default)]
    pub error: Option<String>,
}

impl End {
    /// The exit code, `None` when a signal ended the process.
    pub fn code(&self) -> Option<i32> {
        self.exited.then_some(self.exit_code)
    }
}

#[derive(Deserialize)]
struct EventMessage {
    #[serde(default)]
    event: Option<WireEvent>,
}

#[derive(Deserialize)]
struct WireEvent {
    #[serde(default)]
    start: Option<WireStart>,
    #[serde(default)]
    data: Option<WireData>,
    #[serde(default)]
    end: Option<End>,
    #[serde(default)]
    keepalive: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct WireStart {
    #[serde(default)]
    pid: u32,
}

#[derive(Deserialize)]
struct WireData {
    #[serde(default)]
    stdout: Option<String>,
    #[serde(default)]
    stderr: Option<String>,
}

/// A `StartResponse` / `ConnectResponse` message (`{"event": {...}}`) as an [`Event`].
pub(crate) fn parse_event(json: &[u8]) -> Result<Event, FrameError> {
    let bad = |e: &dyn std::fmt::Display| FrameError::Json(e.to_string());
    let message: EventMessage = serde_json::from_slice(json).map_err(|e| bad(&e))?;
    let Some(event) = message.event else {
        return Ok(Event::Other);
    };
    let decode = |text: &str| {
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|e| bad(&e))
    };
    Ok(if let Some(start) = event.start {
        Event::Start { pid: start.pid }
    } else if let Some(data) = event.data {
        match (data.stdout, data.stderr) {
            (Some(out), _) => Event::Stdout(decode(&out)?),
            (None, Some(err)) => Event::Stderr(decode(&err)?),
            (None, None) => Event::Other,
        }
    } else if let Some(end) = event.end {
        Event::End(end)
    } else if event.keepalive.is_some() {
        Event::Keepalive
    } else {
        Event::Other
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An envelope built by hand, byte by byte, as connect-go writes one.
    fn raw(flags: u8, json: &str) -> Vec<u8> {
        let mut out = vec![flags];
        out.extend_from_slice(&(json.len() as u32).to_be_bytes());
        out.extend_from_slice(json.as_bytes());
        out
    }

    fn decode_all(bytes: &[u8], chunk: usize) -> Vec<Frame> {
        let mut decoder = Decoder::default();
        let mut frames = Vec::new();
        for piece in bytes.chunks(chunk.max(1)) {
            decoder.push(piece);
            while let Some(frame) = decoder.next_frame().unwrap() {
                frames.push(frame);
            }
        }
        assert_eq!(decoder.pending(), 0);
        frames
    }

    #[test]
    fn a_stream_decodes_the_same_at_every_chunk_size() {
        let mut stream = raw(0, r#"{"event":{"start":{"pid":42}}}"#);
        stream.extend(raw(0, r#"{"event":{"data":{"stdout":"aGk="}}}"#));
        stream.extend(raw(0, r#"{"event":{"keepalive":{}}}"#));
        stream.extend(raw(
            0,
            r#"{"event":{"end":{"exited":true,"status":"exit status 0"}}}"#,
        ));
        stream.extend(raw(2, "{}"));
        let whole = decode_all(&stream, stream.len());
        assert_eq!(whole.len(), 5);
        assert_eq!(whole[4], Frame::End(EndStream::default()));
        for chunk in 1..stream.len() {
            assert_eq!(decode_all(&stream, chunk), whole, "chunk size {chunk}");
        }
    }

    #[test]
    fn events_in_proto3_json() {
        let check = |json: &str, expected: Event| {
            assert_eq!(parse_event(json.as_bytes()).unwrap(), expected, "{json}")
        };
        check(r#"{"event":{"start":{"pid":7}}}"#, Event::Start { pid: 7 });
        check(
            r#"{"event":{"data":{"stdout":"aGVsbG8K"}}}"#,
            Event::Stdout(b"hello\n".to_vec()),
        );
        check(
            r#"{"event":{"data":{"stderr":"/w=="}}}"#,
            Event::Stderr(vec![0xff]),
        );
        check(r#"{"event":{"data":{"pty":"eA=="}}}"#, Event::Other);
        check(r#"{"event":{"keepalive":{}}}"#, Event::Keepalive);
        check(r#"{"event":{}}"#, Event::Other);
        check(r#"{}"#, Event::Other);
        // Success leaves the exit code out (proto3's default).
        let ok = End {
            exited: true,
            status: "exit status 0".into(),
            ..End::default()
        };
        check(
            r#"{"event":{"end":{"exited":true,"status":"exit status 0"}}}"#,
            Event::End(ok.clone()),
        );
        assert_eq!(ok.code(), Some(0));
        let killed = r#"{"event":{"end":{"exitCode":-1,"status":"signal: killed","error":"signal: killed"}}}"#;
        let Event::End(end) = parse_event(killed.as_bytes()).unwrap() else {
            panic!()
        };
        assert_eq!(end.code(), None);
        assert_eq!(end.error.as_deref(), Some("signal: killed"));
        let failed = r#"{"event":{"end":{"exitCode":3,"exited":true,"status":"exit status 3","error":"exit status 3"}}}"#;
        let Event::End(end) = parse_event(failed.as_bytes()).unwrap() else {
            panic!()
        };
        assert_eq!(end.code(), Some(3));
    }

    #[test]
    fn the_end_of_stream_carries_connect_errors() {
        let frames = decode_all(
            &raw(
                2,
                r#"{"error":{"code":"deadline_exceeded","message":"context deadline exceeded"},"metadata":{"x":["1"]}}"#,
            ),
            3,
        );
        let [Frame::End(end)] = frames.as_slice() else {
            panic!("{frames:?}")
        };
        let error = end.error.clone().unwrap();
        assert_eq!(error.code, "deadline_exceeded");
        assert_eq!(error.message, "context deadline exceeded");
    }

    #[test]
    fn bad_frames_are_errors_not_panics() {
        let mut decoder = Decoder::default();
        decoder.push(&[0, 0xff, 0xff, 0xff, 0xff]);
        assert!(matches!(decoder.next_frame(), Err(FrameError::TooLarge(_))));
        let mut decoder = Decoder::default();
        decoder.push(&raw(1, "{}"));
        assert_eq!(decoder.next_frame(), Err(FrameError::Compressed));
        let mut decoder = Decoder::default();
        decoder.push(&raw(2, "not json"));
        assert!(matches!(decoder.next_frame(), Err(FrameError::Json(_))));
        assert!(matches!(
            parse_event(br#"{"event":{"data":{"stdout":"***"}}}"#),
            Err(FrameError::Json(_))
        ));
    }

    #[test]
    fn the_request_is_one_plain_envelope() {
        let body = envelope(br#"{"process":{"cmd":"/bin/bash"}}"#);
        assert_eq!(body[0], 0);
        assert_eq!(&body[1..5], &31u32.to_be_bytes());
        let mut decoder = Decoder::default();
        decoder.push(&body);
        assert_eq!(
            decoder.next_frame().unwrap(),
            Some(Frame::Message(
                br#"{"process":{"cmd":"/bin/bash"}}"#.to_vec()
            ))
        );
    }
}
