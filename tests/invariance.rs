//! Invariance of the pipeline's events under capture-level transformations.
//!
//! Every `tests/fixtures/*.pcap` is read down to its TCP segments, which are then re-emitted
//! as a different but equivalent capture: re-cut into tiny segments, locally reordered,
//! retransmitted, written as pcapng, framed as Linux SLL2 or VLAN-tagged Ethernet, moved to
//! IPv6, or all of that at once. Replaying the transformed capture must produce the same
//! events as replaying the original fixture.
//!
//! What may legitimately change, and is therefore normalised away before comparing:
//! - reordering delays a segment to the timestamp of the one it was swapped with, so `ts` and
//!   `duration_ms` are dropped for reordering variants; only "no event moves earlier" is
//!   checked for `ts`. Event *order* is still compared exactly: a swap only ever crosses bare
//!   ACKs, never data of another direction or flow, so no multiset comparison is needed;
//! - the IPv6 variants map a.b.c.d to `fd00::a.b.c.d`, so their `client` / `server`
//!   addresses are mapped back before comparing.
//!
//! Everything else, including the order of events, must be identical.

mod common;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::{read_segments, read_segments_observing};
use mcptap::replay::replay_collect;
use mcptap_core::decode::{TcpFlags, dlt};
use mcptap_core::model::Output;
use mcptap_core::model::Timestamp;
use mcptap_core::pipeline::{Limits, Pipeline};
use mcptap_testkit::segment::{from_fd00, to_fd00};
use mcptap_testkit::{Frame, Link, Segment, SplitMix64, pcap_bytes, pcapng_bytes};
use serde_json::Value;

/// One original capture: its TCP segments and the (serialised) events of its replay.
struct Fixture {
    name: String,
    segments: Vec<Segment>,
    events: Vec<Value>,
}

fn fixture_paths() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "pcap"))
        .collect();
    paths.sort();
    paths
}

/// Replays a capture with default limits and returns its events as JSON values, checking
/// that all `frames` were read and decoded to TCP.
fn replay_events(path: &Path, frames: usize) -> Vec<Value> {
    let (outputs, report) = replay_collect(&[path.display().to_string()], Limits::default())
        .unwrap_or_else(|e| panic!("replaying {}: {e}", path.display()));
    assert_eq!(
        report.read.packets,
        frames as u64,
        "{}: frames read back",
        path.display()
    );
    let skipped: Vec<_> = report
        .stats
        .skipped()
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .collect();
    assert!(
        skipped.is_empty(),
        "{}: frames not decoded to TCP: {skipped:?}",
        path.display()
    );
    assert!(report.read.truncations.is_empty() && report.read.warnings.is_empty());
    events_of(outputs)
}

/// The events among pipeline outputs, serialised as they would be written out.
fn events_of(outputs: Vec<Output>) -> Vec<Value> {
    outputs
        .into_iter()
        .filter_map(|o| match o {
            Output::Event(e) => Some(serde_json::to_value(&e).expect("event serialises")),
            Output::Telemetry(_) | Output::Shared(_) => None,
        })
        .collect()
}

/// The fixtures, read once per test binary. The baseline events come from a [`Pipeline`] fed
/// in the same pass that extracts the segments, exactly as `replay` drives it (the
/// `identity_reencoding` test checks that a real replay of the re-encoded capture agrees).
fn fixtures() -> &'static [Fixture] {
    static FIXTURES: OnceLock<Vec<Fixture>> = OnceLock::new();
    FIXTURES.get_or_init(|| {
        let fixtures: Vec<Fixture> = fixture_paths()
            .into_iter()
            .map(|path| {
                let mut pipeline = Pipeline::new(Limits::default());
                let mut outputs = Vec::new();
                let (segments, stats) = read_segments_observing(&path, &mut |pkt| {
                    pipeline.handle_packet(
                        Timestamp(pkt.ts_nanos),
                        pkt.linktype,
                        pkt.data,
                        &mut outputs,
                    );
                });
                pipeline.finish(&mut outputs);
                assert_eq!(
                    stats.non_tcp,
                    0,
                    "{}: every fixture frame should be TCP",
                    path.display()
                );
                let name = path
                    .file_name()
                    .expect("file name")
                    .to_string_lossy()
                    .into_owned();
                Fixture {
                    name,
                    segments,
                    events: events_of(outputs),
                }
            })
            .collect();
        assert!(!fixtures.is_empty(), "no fixtures found");
        fixtures
    })
}

// ---------------------------------------------------------------------------
// Transformations of a segment list (kept in file order, timestamps non-decreasing)

/// What the transformations did, so a test can check they were not no-ops.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    pieces: usize,
    swaps: usize,
    duplicates: usize,
    overlaps: usize,
}

/// Re-cuts every payload-bearing segment into pieces of 1..=7 bytes with consecutive sequence
/// numbers. SYN stays on the first piece, FIN and RST move to the last one; all pieces keep
/// the original timestamp.
fn tiny_segments(segments: &[Segment], rng: &mut SplitMix64, counts: &mut Counts) -> Vec<Segment> {
    let mut out = Vec::with_capacity(segments.len() * 8);
    for s in segments {
        let n = s.payload.len();
        let mut cuts = Vec::new();
        let mut off = 0;
        while off < n {
            off += (rng.range(1, 7) as usize).min(n - off);
            cuts.push(off);
        }
        // The last "cut" is the end of the payload.
        cuts.pop();
        let pieces = s.split_at(&cuts);
        if n > 0 {
            counts.pieces += pieces.len();
        }
        out.extend(pieces);
    }
    out
}

/// A segment that carries stream bytes and may be swapped with its successor.
fn is_data(s: &Segment) -> bool {
    !s.payload.is_empty() && !s.flags.syn && !s.flags.rst
}

/// Within each direction of each connection, swaps every third data segment with the next
/// data segment of the same direction, when only bare ACKs (of any flow) lie between them.
/// The pair is emitted at the later segment's position, later segment first, both with the
/// later timestamp; so no data of another direction or flow ever crosses a swapped segment,
/// and timestamps stay non-decreasing.
fn reorder(segments: &[Segment], counts: &mut Counts) -> Vec<Segment> {
    let mut out = Vec::with_capacity(segments.len());
    let mut seen: HashMap<_, usize> = HashMap::new();
    let mut i = 0;
    while i < segments.len() {
        let s = &segments[i];
        if is_data(s) {
            let k = seen.entry(s.direction()).or_default();
            let nth = *k;
            *k += 1;
            if nth.is_multiple_of(3) {
                let mut j = i + 1;
                while j < segments.len() && segments[j].is_pure_ack() {
                    j += 1;
                }
                if let Some(next) = segments.get(j)
                    && is_data(next)
                    && next.direction() == s.direction()
                {
                    out.extend_from_slice(&segments[i + 1..j]);
                    out.push(next.clone());
                    out.push(Segment {
                        ts_nanos: next.ts_nanos,
                        ..s.clone()
                    });
                    *k += 1;
                    counts.swaps += 1;
                    i = j + 1;
                    continue;
                }
            }
        }
        out.push(s.clone());
        i += 1;
    }
    out
}

/// Emits every payload-bearing segment twice (a retransmission). In addition, every second
/// data segment that directly continues the previous one of its direction is preceded by an
/// overlapping re-send: the previous segment's last (up to 3) bytes plus the first half of
/// this segment's bytes, at this segment's timestamp.
fn duplicate(segments: &[Segment], counts: &mut Counts) -> Vec<Segment> {
    let mut out = Vec::with_capacity(segments.len() * 3);
    // Per direction: end sequence number and last bytes of the previous data segment.
    let mut previous: HashMap<_, (u32, Vec<u8>)> = HashMap::new();
    let mut contiguous = 0usize;
    for s in segments {
        if s.payload.is_empty() {
            out.push(s.clone());
            continue;
        }
        if let Some((end, tail)) = previous.get(&s.direction())
            && *end == s.data_seq()
            && !s.flags.syn
        {
            contiguous += 1;
            let head = s.payload.len().div_ceil(2);
            if contiguous.is_multiple_of(2) && !tail.is_empty() {
                let mut payload = tail.clone();
                payload.extend_from_slice(&s.payload[..head]);
                out.push(Segment {
                    seq: end.wrapping_sub(tail.len() as u32),
                    flags: TcpFlags {
                        syn: false,
                        ack: s.flags.ack,
                        fin: false,
                        rst: false,
                    },
                    payload,
                    ..s.clone()
                });
                counts.overlaps += 1;
            }
        }
        out.push(s.clone());
        out.push(s.clone());
        counts.duplicates += 1;
        let tail_len = s.payload.len().min(3);
        previous.insert(
            s.direction(),
            (
                s.data_end(),
                s.payload[s.payload.len() - tail_len..].to_vec(),
            ),
        );
    }
    out
}

// ---------------------------------------------------------------------------
// Variants

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LinkVariant {
    Ethernet,
    /// One 802.1Q tag.
    Vlan,
    /// 802.1ad outer tag, 802.1Q inner tag.
    QinQ,
    Sll2,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Pcap,
    Pcapng,
}

#[derive(Debug, Clone, Copy)]
struct Variant {
    name: &'static str,
    tiny: bool,
    reorder: bool,
    duplicate: bool,
    ipv6: bool,
    link: LinkVariant,
    format: Format,
}

const PLAIN: Variant = Variant {
    name: "identity",
    tiny: false,
    reorder: false,
    duplicate: false,
    ipv6: false,
    link: LinkVariant::Ethernet,
    format: Format::Pcap,
};

const SEED: u64 = 0x6d63_7074_6170_0001;

/// Applies the variant's transformations to one fixture and returns the frames to write.
fn transform(v: &Variant, fixture: &Fixture, counts: &mut Counts) -> Vec<Frame> {
    let mut segments = fixture.segments.clone();
    if v.tiny {
        // Seeded per fixture, so results do not depend on which fixtures exist.
        let mut h = SEED;
        for b in fixture.name.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        segments = tiny_segments(&segments, &mut SplitMix64(h), counts);
    }
    if v.reorder {
        segments = reorder(&segments, counts);
    }
    if v.duplicate {
        segments = duplicate(&segments, counts);
    }
    if v.ipv6 {
        for s in &mut segments {
            s.src = to_fd00(s.src);
            s.dst = to_fd00(s.dst);
        }
    }
    assert!(
        segments.windows(2).all(|w| w[0].ts_nanos <= w[1].ts_nanos),
        "{}: timestamps must stay non-decreasing",
        fixture.name
    );
    let link = match v.link {
        LinkVariant::Ethernet => Link::default(),
        LinkVariant::Vlan => Link::vlan(42),
        LinkVariant::QinQ => Link::qinq(100, 42),
        LinkVariant::Sll2 => Link::LinuxSll2,
    };
    segments
        .iter()
        .map(|s| Frame {
            ts_nanos: s.ts_nanos,
            data: s.frame(&link),
        })
        .collect()
}

/// Removes what the variant may legitimately change (see the module docs).
fn normalise(v: &Variant, events: &[Value], map_back: bool) -> Vec<Value> {
    events
        .iter()
        .map(|e| {
            let mut e = e.clone();
            let obj = e.as_object_mut().expect("event is an object");
            if v.reorder {
                obj.remove("ts");
                obj.remove("duration_ms");
            }
            if map_back {
                for key in ["client", "server"] {
                    if let Some(Value::String(s)) = obj.get_mut(key) {
                        let addr = s
                            .parse()
                            .unwrap_or_else(|_| panic!("{key} is not an address: {s}"));
                        *s = from_fd00(addr).to_string();
                    }
                }
            }
            // A lineage id hashes the client's address: another address, another id.
            if v.ipv6
                && let Some(l) = obj.get_mut("lineage_id")
                && !l.is_null()
            {
                *l = Value::from("mapped");
            }
            e
        })
        .collect()
}

/// One line per event: its type and the fields that tell events apart at a glance.
fn brief(e: &Value) -> String {
    [
        "event",
        "kind",
        "method",
        "request_id",
        "session_id",
        "client",
    ]
    .iter()
    .filter_map(|k| e.get(*k).filter(|v| !v.is_null()))
    .map(Value::to_string)
    .collect::<Vec<_>>()
    .join(" ")
}

/// A readable account of the first difference between two event lists, or `None`.
fn describe_difference(expected: &[Value], got: &[Value]) -> Option<String> {
    if expected == got {
        return None;
    }
    let i = expected
        .iter()
        .zip(got)
        .position(|(a, b)| a != b)
        .unwrap_or(expected.len().min(got.len()));
    let mut msg = format!(
        "{} events expected, {} produced; first difference at event #{i}\n",
        expected.len(),
        got.len()
    );
    let pretty = |e: Option<&Value>| match e {
        Some(e) => serde_json::to_string_pretty(e).expect("json"),
        None => "<none>".to_string(),
    };
    if let (Some(Value::Object(a)), Some(Value::Object(b))) = (expected.get(i), got.get(i)) {
        let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
        keys.sort();
        keys.dedup();
        for k in keys {
            if a.get(k) != b.get(k) {
                let show = |v: Option<&Value>| v.map_or("<absent>".to_string(), Value::to_string);
                let _ = writeln!(
                    msg,
                    "  field {k:?}: expected {} got {}",
                    show(a.get(k)),
                    show(b.get(k))
                );
            }
        }
    }
    let _ = writeln!(msg, "expected #{i}: {}", pretty(expected.get(i)));
    let _ = writeln!(msg, "produced #{i}: {}", pretty(got.get(i)));
    let _ = writeln!(msg, "expected sequence:");
    for (n, e) in expected.iter().enumerate() {
        let _ = writeln!(msg, "  {n:3} {}", brief(e));
    }
    let _ = writeln!(msg, "produced sequence:");
    for (n, e) in got.iter().enumerate() {
        let _ = writeln!(msg, "  {n:3} {}", brief(e));
    }
    Some(msg)
}

/// Runs one variant over every fixture; panics with a description of every fixture whose
/// events differ from the original's. Returns what the transformations did, summed.
fn check_variant(v: &Variant) -> Counts {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut total = Counts::default();
    let mut failures = Vec::new();
    for fixture in fixtures() {
        assert!(
            !fixture.events.is_empty(),
            "{}: the original replay produced no events",
            fixture.name
        );
        let mut counts = Counts::default();
        let frames = transform(v, fixture, &mut counts);
        let (bytes, ext) = match (v.format, v.link) {
            (Format::Pcap, LinkVariant::Sll2) => (pcap_bytes(dlt::LINUX_SLL2, &frames), "pcap"),
            (Format::Pcap, _) => (pcap_bytes(dlt::EN10MB, &frames), "pcap"),
            (Format::Pcapng, LinkVariant::Sll2) => {
                (pcapng_bytes(dlt::LINUX_SLL2, &frames), "pcapng")
            }
            (Format::Pcapng, _) => (pcapng_bytes(dlt::EN10MB, &frames), "pcapng"),
        };
        let path = dir
            .path()
            .join(format!("{}.{}.{ext}", fixture.name, v.name));
        std::fs::write(&path, bytes).expect("writing the transformed capture");
        let raw = replay_events(&path, frames.len());
        let expected = normalise(v, &fixture.events, false);
        let got = normalise(v, &raw, v.ipv6);
        let context = format!(
            "variant {} / fixture {} ({} frames, {counts:?})",
            v.name,
            fixture.name,
            frames.len()
        );
        if let Some(diff) = describe_difference(&expected, &got) {
            failures.push(format!("{context}:\n{diff}"));
        } else if v.reorder {
            // Reordering only ever delays data, so no event may move earlier.
            for (n, (a, b)) in fixture.events.iter().zip(&raw).enumerate() {
                // RFC 3339 with fixed-width fields: string order is time order.
                if b["ts"].as_str() < a["ts"].as_str() {
                    failures.push(format!(
                        "{context}: event #{n} moved earlier: {} -> {}",
                        a["ts"], b["ts"]
                    ));
                }
            }
        }
        total.pieces += counts.pieces;
        total.swaps += counts.swaps;
        total.duplicates += counts.duplicates;
        total.overlaps += counts.overlaps;
    }
    eprintln!(
        "variant {}: {} fixtures, {total:?}",
        v.name,
        fixtures().len()
    );
    assert!(
        failures.is_empty(),
        "{} of {} fixtures produced different events:\n\n{}",
        failures.len(),
        fixtures().len(),
        failures.join("\n")
    );
    total
}

/// Sanity check of the harness itself: a real replay of each original fixture gives the
/// baseline events, and re-encoding the extracted segments unchanged (Ethernet, IPv4,
/// classic pcap) reproduces them, timestamps included.
#[test]
fn identity_reencoding() {
    for fixture in fixtures() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(&fixture.name);
        let replayed = replay_events(&path, fixture.segments.len());
        if let Some(diff) = describe_difference(&fixture.events, &replayed) {
            panic!(
                "{}: replay differs from the baseline:\n{diff}",
                fixture.name
            );
        }
    }
    check_variant(&PLAIN);
}

#[test]
fn tiny_segments_1_to_7_bytes() {
    let counts = check_variant(&Variant {
        name: "tiny",
        tiny: true,
        ..PLAIN
    });
    assert!(counts.pieces > 10_000, "{counts:?}");
}

#[test]
fn reordered_neighbour_segments() {
    let counts = check_variant(&Variant {
        name: "reordered",
        reorder: true,
        ..PLAIN
    });
    assert!(counts.swaps > 0, "{counts:?}");
}

#[test]
fn duplicated_and_overlapping_segments() {
    let counts = check_variant(&Variant {
        name: "duplicated",
        duplicate: true,
        ..PLAIN
    });
    assert!(counts.duplicates > 0 && counts.overlaps > 0, "{counts:?}");
}

#[test]
fn pcapng_nanosecond_output() {
    check_variant(&Variant {
        name: "pcapng",
        format: Format::Pcapng,
        ..PLAIN
    });
}

#[test]
fn linux_sll2_link_type() {
    check_variant(&Variant {
        name: "sll2",
        link: LinkVariant::Sll2,
        ..PLAIN
    });
}

#[test]
fn vlan_8021q() {
    check_variant(&Variant {
        name: "vlan",
        link: LinkVariant::Vlan,
        ..PLAIN
    });
}

#[test]
fn vlan_8021ad_qinq() {
    check_variant(&Variant {
        name: "qinq",
        link: LinkVariant::QinQ,
        ..PLAIN
    });
}

#[test]
fn ipv6_fd00_mapped() {
    check_variant(&Variant {
        name: "ipv6",
        ipv6: true,
        ..PLAIN
    });
}

/// Everything at once, applied in this order: tiny pieces, then reordering of those pieces,
/// then duplication; IPv6 addresses; SLL2 frames; pcapng file.
#[test]
fn combined_tiny_reordered_duplicated_pcapng_sll2_ipv6() {
    let counts = check_variant(&Variant {
        name: "combined",
        tiny: true,
        reorder: true,
        duplicate: true,
        ipv6: true,
        link: LinkVariant::Sll2,
        format: Format::Pcapng,
    });
    assert!(
        counts.pieces > 0 && counts.swaps > 0 && counts.duplicates > 0 && counts.overlaps > 0,
        "{counts:?}"
    );
}

/// The helpers themselves: the address mapping round-trips and the writers' output reads
/// back as the same frames.
#[test]
fn helpers_round_trip() {
    let v4: std::net::SocketAddr = "127.0.0.1:8080".parse().unwrap();
    assert_eq!(to_fd00(v4).to_string(), "[fd00::7f00:1]:8080");
    assert_eq!(from_fd00(to_fd00(v4)), v4);
    let seg = Segment {
        ts_nanos: 1_700_000_000_123_456_789,
        src: v4,
        dst: "10.1.2.3:443".parse().unwrap(),
        seq: 7,
        ack: 9,
        flags: TcpFlags {
            ack: true,
            fin: true,
            ..TcpFlags::default()
        },
        payload: b"hello".to_vec(),
    };
    let dir = tempfile::tempdir().unwrap();
    for (name, linktype, frame) in [
        ("eth", dlt::EN10MB, seg.frame(&Link::default())),
        ("sll2", dlt::LINUX_SLL2, seg.frame(&Link::LinuxSll2)),
    ] {
        let frames = [Frame {
            ts_nanos: seg.ts_nanos,
            data: frame,
        }];
        for (ext, bytes) in [
            ("pcap", pcap_bytes(linktype, &frames)),
            ("pcapng", pcapng_bytes(linktype, &frames)),
        ] {
            let path = dir.path().join(format!("{name}.{ext}"));
            std::fs::write(&path, bytes).unwrap();
            let (segs, stats) = read_segments(&path);
            assert_eq!(stats.non_tcp, 0, "{name}.{ext}");
            assert_eq!(segs, vec![seg.clone()], "{name}.{ext}");
        }
    }
}
