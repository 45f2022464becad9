//! Incremental pkt-line decoding (git's framing: four hex digits of length, then the payload),
//! fed chunk by chunk as bytes stream through the proxy.

/// One decoded pkt-line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pkt {
    /// `0000`: end of a section.
    Flush,
    /// `0001`: protocol v2 section delimiter.
    Delim,
    /// `0002`: protocol v2 end of a stateless response.
    ResponseEnd,
    /// Any other packet's payload (possibly empty).
    Data(Vec<u8>),
}

/// The stream is not pkt-lines: the bytes cannot be git's framing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed pkt-line stream: {0}")]
pub struct Malformed(pub &'static str);

/// The largest packet git allows (`LARGE_PACKET_MAX`), header included.
pub const MAX_PKT_LEN: usize = 65520;

/// Buffers at most one partial packet; never grows beyond [`MAX_PKT_LEN`].
#[derive(Debug, Default)]
pub struct PktDecoder {
    pending: Vec<u8>,
}

impl PktDecoder {
    /// Feeds `chunk` and hands each complete packet to `on_pkt`. Stops at the first malformed
    /// header or when `on_pkt` returns `false` (the caller needs no more); the rest of the chunk
    /// is then left unread.
    pub fn feed(
        &mut self,
        mut chunk: &[u8],
        mut on_pkt: impl FnMut(Pkt) -> bool,
    ) -> Result<(), Malformed> {
        while !chunk.is_empty() {
            let want = match self.declared_len() {
                None => 4,
                Some(len) => len?,
            };
            let take = (want - self.pending.len()).min(chunk.len());
            self.pending.extend_from_slice(&chunk[..take]);
            chunk = &chunk[take..];
            if self.pending.len() < want {
                continue;
            }
            if want == 4 {
                match self.declared_len() {
                    Some(Ok(4)) | None => {}
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => return Err(e),
                }
            }
            let pkt = self.take_pkt();
            if !on_pkt(pkt) {
                return Ok(());
            }
        }
        Ok(())
    }

    /// The total length the pending header declares, once four bytes are buffered.
    fn declared_len(&self) -> Option<Result<usize, Malformed>> {
        let header = self.pending.get(..4)?;
        let text = std::str::from_utf8(header).map_err(|_| Malformed("non-hex length"));
        let len = text
            .and_then(|t| usize::from_str_radix(t, 16).map_err(|_| Malformed("non-hex length")));
        Some(match len {
            Ok(0..=2) => Ok(4),
            Ok(3) => Err(Malformed("reserved length 0003")),
            Ok(len) if len > MAX_PKT_LEN => Err(Malformed("packet longer than 65520")),
            other => other,
        })
    }

    fn take_pkt(&mut self) -> Pkt {
        let pkt = match &self.pending[..4] {
            b"0000" => Pkt::Flush,
            b"0001" => Pkt::Delim,
            b"0002" => Pkt::ResponseEnd,
            _ => Pkt::Data(self.pending[4..].to_vec()),
        };
        self.pending.clear();
        pkt
    }
}

/// The flush packet that ends a section.
pub const FLUSH: &[u8; 4] = b"0000";

/// Encodes one data packet.
pub fn encode(payload: &[u8]) -> Vec<u8> {
    let mut out = format!("{:04x}", payload.len() + 4).into_bytes();
    out.extend_from_slice(payload);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(input: &[u8]) -> (Vec<Pkt>, Result<(), Malformed>) {
        let mut pkts = Vec::new();
        let result = PktDecoder::default().feed(input, |p| {
            pkts.push(p);
            true
        });
        (pkts, result)
    }

    fn check(input: &[u8], expected: &[Pkt], ok: bool) {
        let (pkts, result) = decode(input);
        assert_eq!(pkts, expected, "input {:?}", String::from_utf8_lossy(input));
        assert_eq!(result.is_ok(), ok, "input {input:?}: {result:?}");
    }

    fn data(s: &str) -> Pkt {
        Pkt::Data(s.as_bytes().to_vec())
    }

    #[test]
    fn decodes_a_table_of_streams() {
        check(b"", &[], true);
        check(b"0000", &[Pkt::Flush], true);
        check(
            b"000100020004",
            &[Pkt::Delim, Pkt::ResponseEnd, data("")],
            true,
        );
        check(b"0009hello0000", &[data("hello"), Pkt::Flush], true);
        check(b"0009hel", &[], true);
        check(b"0003", &[], false);
        check(b"zzzz", &[], false);
        check(b"0006hi0x00", &[data("hi")], false);
        check(b"fff1", &[], false);
    }

    #[test]
    fn stops_when_the_caller_has_enough() {
        let mut seen = 0;
        PktDecoder::default()
            .feed(b"0005a0005b0005c", |_| {
                seen += 1;
                seen < 2
            })
            .expect("well-formed");
        assert_eq!(seen, 2);
    }

    #[test]
    fn encode_round_trips() {
        let (pkts, result) = decode(&encode(b"unpack ok\n"));
        assert!(result.is_ok());
        assert_eq!(pkts, vec![data("unpack ok\n")]);
    }
}
