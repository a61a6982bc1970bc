//! `mcptap endpoints`: the addresses a capture holds, and the check a capture must pass before
//! it is pushed onto an interface with tcpreplay: loopback addresses only, and no Ethernet
//! destination the kernel would take up its stack.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;

use crate::capture::{self, CaptureError};
use mcptap_core::decode::{self, FrameAddresses, dlt};

/// lo's own address: frames sent to it are PACKET_HOST and reach the IP stack.
pub const LO_MAC: [u8; 6] = [0; 6];

/// Distinct addresses of a capture with their frame counts, and what stands against replaying
/// it onto an interface.
#[derive(Debug, Default)]
pub struct Inventory {
    pub frames: u64,
    /// Frames per IP address (source and destination both counted).
    pub addresses: BTreeMap<IpAddr, u64>,
    /// Frames with an address outside 127.0.0.0/8 and ::1.
    pub non_loopback_frames: u64,
    /// Frames whose Ethernet destination the kernel would deliver up the stack.
    pub local_mac_frames: u64,
    /// Frames whose addresses cannot be checked (not Ethernet, not IP, cut short).
    pub unchecked_frames: u64,
    /// The first refusal, as a sentence: frame number and cause.
    pub first_problem: Option<String>,
}

impl Inventory {
    /// Whether the capture may be pushed onto an interface.
    pub fn loopback_only(&self) -> bool {
        self.non_loopback_frames == 0 && self.local_mac_frames == 0 && self.unchecked_frames == 0
    }

    /// One line: why the capture is refused (`None` when it passes).
    pub fn refusal(&self) -> Option<String> {
        let first = self.first_problem.as_ref()?;
        Some(format!(
            "refusing to push it onto an interface: {} frames with a non-loopback address, {} with a local destination MAC, {} uncheckable; first: {first}",
            self.non_loopback_frames, self.local_mac_frames, self.unchecked_frames
        ))
    }

    fn observe(&mut self, linktype: u32, frame: &[u8], local_macs: &[[u8; 6]]) {
        self.frames += 1;
        let n = self.frames;
        let FrameAddresses { dst_mac, ip } = decode::frame_addresses(linktype, frame);
        let mut non_loopback = None;
        if let Some((src, dst)) = ip {
            for a in [src, dst] {
                *self.addresses.entry(a).or_default() += 1;
            }
            non_loopback = [src, dst].into_iter().find(|a| !a.is_loopback());
        }
        // Broadcast and multicast (the group bit) go up the stack like the interface's own.
        let local_mac = dst_mac.filter(|m| m[0] & 1 == 1 || local_macs.contains(m));
        let problem = if let Some(bad) = non_loopback {
            self.non_loopback_frames += 1;
            format!("frame {n}: non-loopback address {bad}")
        } else if let Some(mac) = local_mac {
            self.local_mac_frames += 1;
            format!("frame {n}: local destination MAC {}", format_mac(&mac))
        } else if linktype != dlt::EN10MB {
            self.unchecked_frames += 1;
            format!(
                "frame {n}: link type {linktype} is not Ethernet (tcpreplay sends Ethernet frames)"
            )
        } else if ip.is_none() {
            self.unchecked_frames += 1;
            format!("frame {n}: no IPv4/IPv6 header to check")
        } else {
            return;
        };
        self.first_problem.get_or_insert(problem);
    }

    /// The listing: one line per address with its frame count, then the verdict's counts.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (addr, frames) in &self.addresses {
            let kind = if addr.is_loopback() {
                "loopback"
            } else {
                "NON-LOOPBACK"
            };
            let _ = writeln!(out, "{addr}\t{frames}\t{kind}");
        }
        let _ = writeln!(
            out,
            "# {} frames, {} addresses; non-loopback frames {}, local destination MAC {}, uncheckable {}",
            self.frames,
            self.addresses.len(),
            self.non_loopback_frames,
            self.local_mac_frames,
            self.unchecked_frames
        );
        out
    }
}

/// Reads every frame of `paths`; `local_macs` are the destinations the kernel of the target
/// interface would accept as its own (lo: [`LO_MAC`]).
pub fn inventory(paths: &[String], local_macs: &[[u8; 6]]) -> Result<Inventory, CaptureError> {
    let mut inv = Inventory::default();
    let read = capture::read_captures(paths, &mut |pkt| {
        inv.observe(pkt.linktype, pkt.data, local_macs)
    })?;
    if let Some(t) = read.truncations.first() {
        // A cut record is a frame nobody checked: refuse rather than guess.
        inv.unchecked_frames += 1;
        inv.first_problem
            .get_or_insert_with(|| format!("{} truncated at byte {}", t.path, t.offset));
    }
    if let Some(r) = read.resyncs.first() {
        // Skipped bytes are frames nobody checked.
        inv.unchecked_frames += 1;
        inv.first_problem.get_or_insert_with(|| r.describe());
    }
    Ok(inv)
}

pub fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(text: &str) -> Result<[u8; 6], String> {
    let mut mac = [0u8; 6];
    let parts: Vec<&str> = text.trim().split(':').collect();
    if parts.len() != 6 {
        return Err(format!("{text:?} is not a MAC address (aa:bb:cc:dd:ee:ff)"));
    }
    for (byte, part) in mac.iter_mut().zip(parts) {
        *byte = u8::from_str_radix(part, 16)
            .map_err(|_| format!("{text:?} is not a MAC address (aa:bb:cc:dd:ee:ff)"))?;
    }
    Ok(mac)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eth_ipv4(dst_mac: [u8; 6], src: [u8; 4], dst: [u8; 4]) -> Vec<u8> {
        let mut f = dst_mac.to_vec();
        f.extend_from_slice(&[0x02, 0, 0, 0, 0, 1, 0x08, 0x00]);
        let mut ip = vec![0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, 6, 0, 0];
        ip.extend_from_slice(&src);
        ip.extend_from_slice(&dst);
        ip.extend_from_slice(&[0; 20]);
        f.extend_from_slice(&ip);
        f
    }

    const OTHER: [u8; 6] = [0x02, 0, 0x7f, 0x0a, 0, 0x0a];

    #[test]
    fn loopback_frames_to_a_foreign_mac_pass() {
        let mut inv = Inventory::default();
        inv.observe(
            dlt::EN10MB,
            &eth_ipv4(OTHER, [127, 1, 0, 9], [127, 10, 0, 10]),
            &[LO_MAC],
        );
        assert!(inv.loopback_only(), "{inv:?}");
        assert_eq!(inv.refusal(), None);
        assert_eq!(inv.addresses.len(), 2);
    }

    #[test]
    fn private_range_address_is_refused() {
        let mut inv = Inventory::default();
        inv.observe(
            dlt::EN10MB,
            &eth_ipv4(OTHER, [127, 1, 0, 9], [127, 10, 0, 10]),
            &[LO_MAC],
        );
        inv.observe(
            dlt::EN10MB,
            &eth_ipv4(OTHER, [127, 1, 0, 9], [10, 0, 0, 10]),
            &[LO_MAC],
        );
        assert!(!inv.loopback_only());
        let why = inv.refusal().unwrap_or_default();
        assert!(
            why.contains("frame 2: non-loopback address 10.0.0.10"),
            "{why}"
        );
        assert_eq!(inv.non_loopback_frames, 1);
    }

    #[test]
    fn local_broadcast_and_multicast_macs_are_refused() {
        for mac in [LO_MAC, [0xff; 6], [0x01, 0x00, 0x5e, 0, 0, 1]] {
            let mut inv = Inventory::default();
            inv.observe(
                dlt::EN10MB,
                &eth_ipv4(mac, [127, 1, 0, 9], [127, 10, 0, 10]),
                &[LO_MAC],
            );
            assert_eq!(inv.local_mac_frames, 1, "{mac:?}");
            assert!(
                inv.refusal()
                    .unwrap_or_default()
                    .contains("local destination MAC")
            );
        }
    }

    #[test]
    fn non_ethernet_and_non_ip_frames_cannot_be_checked() {
        let mut inv = Inventory::default();
        inv.observe(
            dlt::RAW,
            &eth_ipv4(OTHER, [127, 1, 0, 9], [127, 10, 0, 10])[14..],
            &[],
        );
        assert_eq!(inv.unchecked_frames, 1);
        let mut arp = OTHER.to_vec();
        arp.extend_from_slice(&[0x02, 0, 0, 0, 0, 1, 0x08, 0x06, 0, 1]);
        inv.observe(dlt::EN10MB, &arp, &[]);
        assert_eq!(inv.unchecked_frames, 2);
        assert!(!inv.loopback_only());
    }

    #[test]
    fn ipv6_loopback_is_only_colon_colon_one() {
        assert!(IpAddr::from([0u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]).is_loopback());
        assert!(!"fd00::1".parse::<IpAddr>().is_ok_and(|a| a.is_loopback()));
    }

    #[test]
    fn macs_parse_and_print() {
        assert_eq!(parse_mac("02:00:7f:0A:00:0a"), Ok(OTHER));
        assert_eq!(format_mac(&OTHER), "02:00:7f:0a:00:0a");
        assert!(parse_mac("02:00:7f").is_err());
        assert!(parse_mac("zz:00:00:00:00:00").is_err());
    }
}
