//! The ref advertisement a smart-HTTP server answers `GET info/refs?service=git-<service>`
//! with: an optional `# service=` packet and its flush, then one packet per ref (`<oid> <ref>`,
//! the first carrying the capabilities after a NUL; an empty repository advertises
//! `<zero-oid> capabilities^{}`), then a flush. Read as git's `connect.c` reads protocol v0/v1.

use crate::pkt_line::{Malformed, Pkt, PktDecoder};

/// The refs and capabilities a server advertised.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Advertisement {
    /// `(oid, ref)` in the server's order; peeled tags (`^{}`) and the empty repository's
    /// placeholder are left out.
    pub refs: Vec<(String, String)>,
    pub capabilities: Vec<String>,
}

impl Advertisement {
    /// Parses a whole advertisement body.
    pub fn parse(body: &[u8]) -> Result<Self, Malformed> {
        let mut packets = Vec::new();
        let mut decoder = PktDecoder::default();
        decoder.feed(body, |pkt| {
            packets.push(pkt);
            true
        })?;
        let mut packets = packets.into_iter().peekable();
        if let Some(Pkt::Data(first)) = packets.peek()
            && first.starts_with(b"# service=")
        {
            packets.next();
            if packets.next() != Some(Pkt::Flush) {
                return Err(Malformed("no flush after the `# service=` line"));
            }
        }
        let mut advertisement = Self::default();
        let mut first = true;
        for pkt in packets {
            let line = match pkt {
                Pkt::Flush => return Ok(advertisement),
                Pkt::Data(line) => line,
                Pkt::Delim | Pkt::ResponseEnd => {
                    return Err(Malformed("protocol v2 packet in a v0 advertisement"));
                }
            };
            let line = line.strip_suffix(b"\n").unwrap_or(&line);
            let (reference, capabilities) = match line.iter().position(|&b| b == 0) {
                Some(nul) if first => (&line[..nul], Some(&line[nul + 1..])),
                Some(_) => return Err(Malformed("capabilities after the first ref")),
                None => (line, None),
            };
            first = false;
            if let Some(capabilities) = capabilities {
                advertisement.capabilities = String::from_utf8_lossy(capabilities)
                    .split(' ')
                    .filter(|c| !c.is_empty())
                    .map(str::to_owned)
                    .collect();
            }
            let reference =
                std::str::from_utf8(reference).map_err(|_| Malformed("ref line is not UTF-8"))?;
            let Some((oid, name)) = reference.split_once(' ') else {
                return Err(Malformed("ref line is not `<oid> <ref>`"));
            };
            let is_oid = matches!(oid.len(), 40 | 64) && oid.bytes().all(|b| b.is_ascii_hexdigit());
            if !is_oid || name.is_empty() {
                return Err(Malformed("ref line is not `<oid> <ref>`"));
            }
            if name == "capabilities^{}" || name.ends_with("^{}") {
                continue;
            }
            advertisement.refs.push((oid.to_owned(), name.to_owned()));
        }
        Err(Malformed("the advertisement ended before its flush"))
    }

    /// Whether the server offers `capability` (a bare name, or `name=` for one with a value).
    pub fn supports(&self, capability: &str) -> bool {
        self.capabilities
            .iter()
            .any(|c| c == capability || c.split_once('=').is_some_and(|(n, _)| n == capability))
    }

    /// The object id `refname` points at, if advertised.
    pub fn oid_of(&self, refname: &str) -> Option<&str> {
        self.refs
            .iter()
            .find(|(_, name)| name == refname)
            .map(|(oid, _)| oid.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pkt_line::encode;

    const A: &str = "1111111111111111111111111111111111111111";
    const B: &str = "2222222222222222222222222222222222222222";
    const ZERO: &str = "0000000000000000000000000000000000000000";

    fn body(service: bool, lines: &[String]) -> Vec<u8> {
        let mut out = Vec::new();
        if service {
            out.extend(encode(b"# service=git-receive-pack\n"));
            out.extend(b"0000");
        }
        for line in lines {
            out.extend(encode(line.as_bytes()));
        }
        out.extend(b"0000");
        out
    }

    #[test]
    fn reads_refs_and_capabilities() {
        let lines = [
            format!("{A} refs/heads/main\0report-status side-band-64k agent=git/2.43\n"),
            format!("{B} refs/tags/v1\n"),
            format!("{A} refs/tags/v1^{{}}\n"),
        ];
        for service in [true, false] {
            let ad = Advertisement::parse(&body(service, &lines)).unwrap();
            assert_eq!(
                ad.refs,
                [
                    (A.to_owned(), "refs/heads/main".to_owned()),
                    (B.to_owned(), "refs/tags/v1".to_owned())
                ]
            );
            assert!(ad.supports("report-status"));
            assert!(ad.supports("agent"));
            assert!(!ad.supports("side-band"));
            assert_eq!(ad.oid_of("refs/heads/main"), Some(A));
            assert_eq!(ad.oid_of("refs/heads/dev"), None);
        }
    }

    #[test]
    fn an_empty_repository_advertises_capabilities_only() {
        let line = format!("{ZERO} capabilities^{{}}\0report-status delete-refs\n");
        let ad = Advertisement::parse(&body(true, &[line])).unwrap();
        assert!(ad.refs.is_empty());
        assert!(ad.supports("delete-refs"));
    }

    #[test]
    fn malformed_advertisements_are_refused() {
        let check = |bytes: &[u8]| assert!(Advertisement::parse(bytes).is_err(), "{bytes:?}");
        check(b"");
        check(b"<html>");
        check(&body(true, &[format!("{A} refs/heads/main")])[..40]);
        check(&body(false, &["not a ref".to_owned()]));
        check(&body(
            false,
            &[
                format!("{A} refs/heads/a\0x"),
                format!("{B} refs/heads/b\0y"),
            ],
        ));
        check(&[encode(b"# service=git-receive-pack\n"), encode(b"x")].concat());
    }
}
