//! The kit's own checks: what it writes, mcptap-core decodes back to the same segment.

use mcptap_core::decode::{TcpFlags, dlt};

use crate::mcp::{Answer, Conversation, FULL_CLIENT_CAPS};
use crate::segment::{Segment, payload_streams, to_fd00};
use crate::sim::{Impairments, Sim};
use crate::tcp::Endpoint;
use crate::wire::{Link, TcpFrame, fix_ipv4_tcp_checksums, tcp};

/// A FIN+ACK carrying "hello", built by the emitter and decoded by mcptap-core.
fn sample() -> Segment {
    let link = Link::default();
    let frame = TcpFrame {
        seq: 7,
        ack: 9,
        flags: tcp::ACK | tcp::FIN | tcp::PSH,
        ..TcpFrame::new(
            &link,
            "10.0.0.2:40000".parse().expect("addr"),
            "10.0.0.1:8080".parse().expect("addr"),
        )
    }
    .to_vec(b"hello");
    let seg = Segment::decode(1_700_000_000_123_456_789, dlt::EN10MB, &frame).expect("TCP");
    assert_eq!(
        (seg.seq, seg.ack, seg.payload.as_slice()),
        (7, 9, &b"hello"[..])
    );
    assert!(seg.flags.ack && seg.flags.fin && !seg.flags.syn && !seg.flags.rst);
    seg
}

#[test]
fn every_link_and_family_decodes_back() {
    let v4 = sample();
    let v6 = Segment {
        src: to_fd00(v4.src),
        dst: to_fd00(v4.dst),
        ..v4.clone()
    };
    let links = [
        Link::default(),
        Link::vlan(42),
        Link::qinq(100, 42),
        Link::LinuxSll,
        Link::LinuxSll2,
        Link::RawIp,
        Link::BsdLoopback,
    ];
    for seg in [&v4, &v6] {
        for link in &links {
            let frame = seg.frame(link);
            let back = Segment::decode(seg.ts_nanos, link.linktype(), &frame);
            assert_eq!(back.as_ref(), Some(seg), "{link:?} {}", seg.src);
        }
    }
}

#[test]
fn fixing_checksums_restores_the_emitted_frame() {
    let link = Link::default();
    let frame = TcpFrame {
        seq: 1,
        flags: tcp::ACK,
        ..TcpFrame::new(
            &link,
            "127.1.0.2:1".parse().expect("addr"),
            "127.1.0.1:2".parse().expect("addr"),
        )
    }
    .to_vec(b"odd");
    let mut broken = frame.clone();
    broken[24] ^= 0xff; // IPv4 checksum
    broken[50] ^= 0xff; // TCP checksum
    fix_ipv4_tcp_checksums(&mut broken);
    assert_eq!(broken, frame);
}

#[test]
fn split_keeps_syn_first_and_fin_last() {
    let seg = Segment {
        flags: TcpFlags {
            syn: true,
            ack: true,
            fin: true,
            rst: false,
        },
        ..sample()
    };
    let pieces = seg.split_at(&[1, 3]);
    let payloads: Vec<&[u8]> = pieces.iter().map(|p| p.payload.as_slice()).collect();
    assert_eq!(payloads, [&b"h"[..], b"el", b"lo"]);
    assert!(pieces[0].flags.syn && !pieces[2].flags.syn);
    assert!(pieces[2].flags.fin && !pieces[0].flags.fin);
    assert_eq!(pieces[1].seq, seg.data_seq() + 1);
}

fn session() -> Conversation {
    let mut talk = Conversation::new("s-1");
    talk.initialize(FULL_CLIENT_CAPS, r#"{"streaming":true}"#, Answer::Sse)
        .initialized()
        .tools_call("first", Answer::Sse)
        .tools_call("second", Answer::Json)
        .delete();
    talk
}

fn streams_of(sim: &Sim) -> Vec<crate::segment::PayloadStream> {
    let segments: Vec<Segment> = sim
        .frames()
        .iter()
        .map(|f| Segment::decode(f.ts_nanos, sim.linktype(), &f.data).expect("TCP frame"))
        .collect();
    payload_streams(&segments)
}

#[test]
fn simulated_conversation_carries_every_write_in_order() {
    let mut talk = session();
    let writes = talk.take_writes();
    let client_bytes: Vec<u8> = writes
        .iter()
        .filter(|w| w.from_client)
        .flat_map(|w| match &w.pieces[0] {
            crate::tcp::Piece::Bytes(b) => b.clone(),
            other => panic!("unexpected piece {other:?}"),
        })
        .collect();
    let mut sim = Sim::new(1)
        .with_link(Link::LinuxSll2)
        .with_segment_sizes(vec![3, 700]);
    let conn = sim.connect(
        Endpoint::new([10, 0, 0, 2], 40000),
        Endpoint::new([10, 0, 0, 1], 8080),
        writes,
    );
    sim.run(vec![conn]);
    assert_eq!(sim.linktype(), dlt::LINUX_SLL2);
    assert!(
        sim.frames()
            .windows(2)
            .all(|w| w[0].ts_nanos < w[1].ts_nanos)
    );
    let streams = streams_of(&sim);
    assert_eq!(streams.len(), 1);
    let sent: Vec<u8> = streams[0]
        .steps
        .iter()
        .filter(|s| s.half == 0)
        .flat_map(|s| s.bytes.clone())
        .collect();
    assert_eq!(sent, client_bytes);
    assert!(streams[0].steps.iter().any(|s| s.bytes.len() == 3));
}

#[test]
fn impairments_lose_duplicate_and_reorder_data_segments() {
    let mut sim = Sim::new(3)
        .with_segment_sizes(vec![40])
        .with_impairments(Impairments {
            loss: 0.05,
            duplication: 0.1,
            reordering: 0.1,
            drop_data_segments: vec![0],
        });
    let conn = sim.connect(
        Endpoint::new([10, 0, 0, 2], 40000),
        Endpoint::new([10, 0, 0, 1], 8080),
        session().take_writes(),
    );
    sim.run(vec![conn]);
    let stats = sim.stats();
    assert!(
        stats.lost >= 1 && stats.duplicated >= 1 && stats.reordered >= 1,
        "{stats:?}"
    );
    let captured_data = sim
        .frames()
        .iter()
        .filter(|f| {
            Segment::decode(f.ts_nanos, sim.linktype(), &f.data)
                .is_some_and(|s| !s.payload.is_empty())
        })
        .count();
    assert_eq!(
        captured_data,
        stats.data_segments - stats.lost + stats.duplicated
    );
    assert_eq!(stats.frames, sim.frames().len());
    assert!(
        sim.frames()
            .windows(2)
            .all(|w| w[0].ts_nanos <= w[1].ts_nanos)
    );
}

#[test]
fn proxy_leg_repeats_the_exchange_upstream() {
    let mut sim = Sim::new(5);
    sim.run_via_proxy(
        Endpoint::new([10, 0, 0, 2], 40000),
        Endpoint::new([10, 0, 0, 3], 8080),
        Endpoint::new([10, 0, 0, 1], 8080),
        session().take_writes(),
    );
    let streams = streams_of(&sim);
    assert_eq!(streams.len(), 2);
    let bytes = |i: usize| -> Vec<u8> {
        streams[i]
            .steps
            .iter()
            .flat_map(|s| s.bytes.clone())
            .collect()
    };
    assert_eq!(bytes(0), bytes(1));
}
