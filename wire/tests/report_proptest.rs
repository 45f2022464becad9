//! Reliability: the report-status parser under proptest. Reports built from pkt-lines as git
//! sends them (plain, or split into side-band band-1 packets with band-2 progress between)
//! must be read exactly whole and in any chunking; a prefix is `Reading` until the report's
//! last packet; a byte changed after the report changes nothing; a byte changed inside it
//! never yields an `ok` ref the demultiplexed stream does not report. The property counts the
//! cases that reach a finished report and fails when too few do.

use git_wire::pkt_line::encode;
use git_wire::report_status::{ReportParser, ReportState};
use proptest::prelude::*;
use proptest::sample::Index;
use testkit::proptest_check::check;

/// A report-status git could send: `unpack`, then one `ok`/`ng` line per ref, then a flush;
/// in side-band, that stream split into band-1 packets with band-2 progress between them.
#[derive(Debug, Clone)]
struct ReportSpec {
    unpack_ok: bool,
    refs: Vec<(String, bool)>,
    sideband: bool,
    splits: Vec<Index>,
    progress: bool,
}

impl ReportSpec {
    /// The bytes, and the length after which the report is complete.
    fn bytes(&self) -> (Vec<u8>, usize) {
        let mut inner = Vec::new();
        let unpack = if self.unpack_ok {
            "unpack ok\n"
        } else {
            "unpack index-pack abnormal exit\n"
        };
        inner.extend(encode(unpack.as_bytes()));
        for (name, ok) in &self.refs {
            let line = if *ok {
                format!("ok {name}\n")
            } else {
                format!("ng {name} pre-receive hook declined\n")
            };
            inner.extend(encode(line.as_bytes()));
        }
        inner.extend(b"0000");
        if !self.sideband {
            let done = inner.len();
            return (inner, done);
        }
        let mut cuts: Vec<usize> = self.splits.iter().map(|i| i.index(inner.len())).collect();
        cuts.push(inner.len());
        cuts.sort_unstable();
        cuts.dedup();
        let mut out = Vec::new();
        let mut from = 0;
        for cut in cuts.into_iter().filter(|&c| c > 0) {
            if self.progress {
                out.extend(encode(b"\x02Resolving deltas: 100% (1/1)\r"));
            }
            let mut packet = vec![1u8];
            packet.extend_from_slice(&inner[from..cut]);
            out.extend(encode(&packet));
            from = cut;
        }
        let done = out.len();
        out.extend(b"0000");
        (out, done)
    }

    /// The refs reported `ok` (`true`) or `ng` (`false`), in order.
    fn refs_reported(&self, ok: bool) -> Vec<String> {
        self.refs
            .iter()
            .filter(|(_, reported_ok)| *reported_ok == ok)
            .map(|(name, _)| name.clone())
            .collect()
    }
}

fn report_spec() -> impl Strategy<Value = ReportSpec> {
    (
        prop::bool::weighted(0.8),
        prop::collection::vec(("refs/(heads|tags)/[a-z0-9/_-]{1,12}", any::<bool>()), 0..4),
        any::<bool>(),
        prop::collection::vec(any::<Index>(), 0..4),
        any::<bool>(),
    )
        .prop_map(|(unpack_ok, refs, sideband, splits, progress)| ReportSpec {
            unpack_ok,
            refs,
            sideband,
            splits,
            progress,
        })
}

/// The bytes of side-band channel 1, read here from git's framing (four hex digits of length,
/// then the payload; `0000`-`0002` carry none), up to the first malformed header.
fn band_one(mut bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(len) = bytes
        .get(..4)
        .and_then(|h| std::str::from_utf8(h).ok())
        .and_then(|h| usize::from_str_radix(h, 16).ok())
    {
        let len = if len <= 2 { 4 } else { len };
        let Some(packet) = bytes.get(4..len) else {
            break;
        };
        if let Some((1, data)) = packet.split_first() {
            out.extend_from_slice(data);
        }
        bytes = &bytes[len..];
    }
    out
}

/// How the response reaches the parser.
#[derive(Debug, Clone)]
enum Delivery {
    Whole,
    Chunked(Vec<Index>),
    Truncated(Index),
    Flipped(Index, u8),
}

fn feed(sideband: bool, chunks: &[&[u8]]) -> ReportState {
    let mut parser = ReportParser::new(sideband);
    for chunk in chunks {
        parser.feed(chunk);
    }
    parser.state().clone()
}

#[test]
fn a_report_built_from_pkt_lines_is_read_exactly_however_it_arrives() {
    let delivery = prop_oneof![
        2 => Just(Delivery::Whole),
        2 => prop::collection::vec(any::<Index>(), 1..6).prop_map(Delivery::Chunked),
        2 => any::<Index>().prop_map(Delivery::Truncated),
        2 => (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Delivery::Flipped(i, b)),
    ];
    check(
        "report-status",
        (report_spec(), delivery),
        0.4,
        |(spec, delivery)| {
            let (bytes, done) = spec.bytes();
            let expected = ReportState::Done(git_wire::report_status::Report {
                unpack_ok: spec.unpack_ok,
                ok_refs: spec.refs_reported(true),
                ng_refs: spec.refs_reported(false),
            });
            let state = match delivery {
                Delivery::Whole => {
                    let state = feed(spec.sideband, &[&bytes]);
                    prop_assert_eq!(&state, &expected);
                    state
                }
                Delivery::Chunked(cuts) => {
                    let mut cuts: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len())).collect();
                    cuts.push(0);
                    cuts.push(bytes.len());
                    cuts.sort_unstable();
                    let chunks: Vec<&[u8]> = cuts.windows(2).map(|w| &bytes[w[0]..w[1]]).collect();
                    let state = feed(spec.sideband, &chunks);
                    prop_assert_eq!(&state, &expected);
                    state
                }
                Delivery::Truncated(at) => {
                    let at = at.index(bytes.len() + 1);
                    let state = feed(spec.sideband, &[&bytes[..at]]);
                    if at >= done {
                        prop_assert_eq!(&state, &expected);
                    } else {
                        prop_assert_eq!(&state, &ReportState::Reading, "cut at {} of {}", at, done);
                    }
                    state
                }
                Delivery::Flipped(at, byte) => {
                    let at = at.index(bytes.len());
                    let mut mutated = bytes.clone();
                    mutated[at] ^= byte.max(1);
                    let state = feed(spec.sideband, &[&mutated]);
                    if at >= done {
                        prop_assert_eq!(&state, &expected, "a byte after the report changed it");
                    } else if let ReportState::Done(report) = &state {
                        let inner = if spec.sideband {
                            band_one(&mutated)
                        } else {
                            mutated
                        };
                        let text = String::from_utf8_lossy(&inner);
                        for r in &report.ok_refs {
                            prop_assert!(
                                text.contains(&format!("ok {r}")),
                                "{:?} from {:?}",
                                r,
                                text
                            );
                        }
                    }
                    state
                }
            };
            Ok(matches!(state, ReportState::Done(_)))
        },
    );
}
