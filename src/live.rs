//! Live capture adapter: libpcap handles on dedicated threads, feeding batches of packets to
//! the same sans-IO pipeline that `replay` uses. It knows neither the config file nor the
//! sinks: the daemon hands it a [`CaptureSetup`] and a callback for pcap's drop counts.

use mcptap_core::decode::{self, Decoded};
use nix::poll::{PollFd, PollFlags, poll};
use std::hash::BuildHasher;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Packets handed from a capture thread to the pipeline in one message (amortises channel cost).
#[derive(Debug, Default)]
pub struct Batch {
    pub linktype: u32,
    pub data: Vec<u8>,
    /// (timestamp ns, offset into `data`, length)
    pub packets: Vec<(i64, usize, usize)>,
}

impl Batch {
    pub fn iter(&self) -> impl Iterator<Item = (i64, &[u8])> {
        self.packets
            .iter()
            .filter_map(|&(ts, off, len)| self.data.get(off..off + len).map(|d| (ts, d)))
    }
}

/// What to open: interfaces, filter and libpcap handle options.
#[derive(Debug, Clone, PartialEq)]
pub struct CaptureSetup {
    /// Interfaces to capture on; `any` captures all (Linux cooked SLL2).
    pub interfaces: Vec<String>,
    /// BPF filter.
    pub filter: String,
    pub snaplen: u32,
    pub promiscuous: bool,
    /// Kernel capture buffer per interface, bytes.
    pub buffer_bytes: u32,
    /// Read timeout in ms: packets are delivered in batches (TPACKET_V3 stays on).
    pub read_timeout_ms: u32,
}

pub struct OpenCapture {
    pub interface: String,
    pub linktype: u32,
    cap: pcap::Capture<pcap::Active>,
}

fn permission_hint(interface: &str, err: &str) -> String {
    format!(
        "cannot capture on {interface}: permission denied ({err}); mcptap needs CAP_NET_RAW and CAP_NET_ADMIN: run as root, use the systemd unit, or `setcap cap_net_raw,cap_net_admin=eip $(command -v mcptap)`"
    )
}

/// Opens every interface with the configured filter; errors are one clear line each.
pub fn open(cfg: &CaptureSetup) -> Result<Vec<OpenCapture>, String> {
    if cfg.interfaces.is_empty() {
        return Err("no interface to capture on: give --interface NAME (or `any`)".into());
    }
    let devices = pcap::Device::list().map_err(|e| format!("cannot list interfaces: {e}"))?;
    let mut opened = Vec::new();
    for name in &cfg.interfaces {
        let Some(device) = devices.iter().find(|d| &d.name == name).cloned() else {
            let known: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
            return Err(format!(
                "no such interface: {name} (available: {})",
                known.join(", ")
            ));
        };
        let inactive = pcap::Capture::from_device(device)
            .map_err(|e| format!("cannot capture on {name}: {e}"))?
            .snaplen(i32::try_from(cfg.snaplen).unwrap_or(i32::MAX))
            .promisc(cfg.promiscuous)
            .buffer_size(i32::try_from(cfg.buffer_bytes).unwrap_or(i32::MAX))
            // Non-immediate with a short timeout: the kernel hands over blocks (TPACKET_V3).
            .immediate_mode(false)
            .timeout(i32::try_from(cfg.read_timeout_ms).unwrap_or(100));
        let cap = inactive.open().map_err(|e| {
            let msg = e.to_string();
            let lower = msg.to_ascii_lowercase();
            if lower.contains("permission") || lower.contains("not permitted") {
                permission_hint(name, &msg)
            } else if lower.contains("no such device") {
                format!("no such interface: {name}")
            } else {
                format!("cannot capture on {name}: {msg}")
            }
        })?;
        let mut cap = cap
            .setnonblock()
            .map_err(|e| format!("cannot capture on {name}: {e}"))?;
        cap.filter(&cfg.filter, true)
            .map_err(|e| format!("bad capture filter {:?}: {e}", cfg.filter))?;
        let linktype = u32::try_from(cap.get_datalink().0).unwrap_or(u32::MAX);
        opened.push(OpenCapture {
            interface: name.clone(),
            linktype,
            cap,
        });
    }
    Ok(opened)
}

/// State shared between capture threads and the health endpoint.
#[derive(Debug, Default)]
pub struct CaptureHealth {
    /// Capture threads currently running.
    pub running: AtomicUsize,
    /// A capture thread failed (the daemon is not ready).
    pub failed: AtomicBool,
}

impl CaptureHealth {
    /// Ready when all `opened` capture threads run and none failed; else why not, in one line.
    pub fn readiness(&self, opened: usize) -> Result<(), String> {
        let running = self.running.load(Ordering::SeqCst);
        if self.failed.load(Ordering::SeqCst) || running < opened {
            Err(format!("{running}/{opened} captures running"))
        } else {
            Ok(())
        }
    }
}

/// New drops reported by pcap_stats since the previous report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drops {
    /// Dropped by the kernel (buffer full).
    pub kernel: u64,
    /// Dropped by the interface or its driver.
    pub interface: u64,
}

/// pcap's counters (received, dropped) are u32 and wrap; this widens them into running u64
/// deltas and a u64 total.
#[derive(Debug, Default, Clone, Copy)]
pub struct DropCounter {
    last: Option<u32>,
    total: u64,
}

impl DropCounter {
    /// New counts since the previous reading.
    pub fn delta(&mut self, now: u32) -> u64 {
        let d = match self.last {
            Some(prev) => u64::from(now.wrapping_sub(prev)),
            None => u64::from(now),
        };
        self.last = Some(now);
        self.total += d;
        d
    }

    /// Everything counted so far.
    pub fn total(&self) -> u64 {
        self.total
    }
}

const BATCH_PACKETS: usize = 512;
const POLL_TIMEOUT_MS: u16 = 100;

/// Hands a full or pending batch to the pipeline; false when the pipeline is gone.
fn send(tx: &SyncSender<Batch>, batch: &mut Batch, linktype: u32) -> bool {
    let out = std::mem::replace(
        batch,
        Batch {
            linktype,
            ..Batch::default()
        },
    );
    match tx.try_send(out) {
        Ok(()) => true,
        // The pipeline is behind: block rather than drop; the kernel buffer absorbs the
        // burst and pcap_stats counts what it cannot.
        Err(TrySendError::Full(b)) => tx.send(b).is_ok(),
        Err(TrySendError::Disconnected(_)) => false,
    }
}
const BATCH_BYTES: usize = 4 * 1024 * 1024;

/// Which pipeline worker a frame belongs to. All flows to one server endpoint meet in the
/// same worker (so its sessions, which span connections, stay whole), and both directions of a
/// flow do too. The server side is taken to be the endpoint with the lower port: clients use
/// ephemeral ports.
pub fn shard_of(linktype: u32, frame: &[u8], workers: usize) -> usize {
    if workers <= 1 {
        return 0;
    }
    let Decoded::Tcp(seg) = decode::decode(linktype, frame) else {
        return 0;
    };
    let server = match seg.src.port().cmp(&seg.dst.port()) {
        std::cmp::Ordering::Less => seg.src,
        std::cmp::Ordering::Greater => seg.dst,
        std::cmp::Ordering::Equal => seg.src.min(seg.dst),
    };
    let h = foldhash::fast::FixedState::with_seed(0x6d63_7074_6170).hash_one(server);
    (h % workers as u64) as usize
}

/// Runs one capture handle on its own thread until `stop` is set. The thread only reads and
/// dispatches to the workers; all parsing happens there. `on_drops` hears pcap's drop counts
/// about once a second and at the end.
pub fn spawn(
    mut oc: OpenCapture,
    workers: Vec<SyncSender<Batch>>,
    stop: Arc<AtomicBool>,
    health: Arc<CaptureHealth>,
    mut on_drops: impl FnMut(Drops) + Send + 'static,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("capture-{}", oc.interface))
        .spawn(move || {
            health.running.fetch_add(1, Ordering::SeqCst);
            let linktype = oc.linktype;
            let mut batches: Vec<Batch> = workers
                .iter()
                .map(|_| Batch {
                    linktype,
                    ..Batch::default()
                })
                .collect();
            let (mut kernel, mut iface) = (DropCounter::default(), DropCounter::default());
            // pcap's received counter wraps too; only logged when the capture stops.
            let mut received = DropCounter::default();
            let mut last_stats = Instant::now();
            'capture: while !stop.load(Ordering::Relaxed) {
                // Drain what the kernel has, then flush: nothing waits for the next packet.
                loop {
                    match oc.cap.next_packet() {
                        Ok(p) => {
                            let ts = p.header.ts.tv_sec.saturating_mul(1_000_000_000)
                                + p.header.ts.tv_usec.saturating_mul(1000);
                            let w = shard_of(linktype, p.data, workers.len());
                            let (Some(batch), Some(tx)) = (batches.get_mut(w), workers.get(w))
                            else {
                                continue;
                            };
                            let off = batch.data.len();
                            batch.data.extend_from_slice(p.data);
                            batch.packets.push((ts, off, p.data.len()));
                            let full = batch.packets.len() >= BATCH_PACKETS
                                || batch.data.len() >= BATCH_BYTES;
                            if full && !send(tx, batch, linktype) {
                                break 'capture;
                            }
                        }
                        Err(pcap::Error::TimeoutExpired) => break,
                        Err(e) => {
                            tracing::error!(interface = %oc.interface, "capture failed: {e}");
                            health.failed.store(true, Ordering::SeqCst);
                            break 'capture;
                        }
                    }
                }
                for (batch, tx) in batches.iter_mut().zip(&workers) {
                    if !batch.packets.is_empty() && !send(tx, batch, linktype) {
                        break 'capture;
                    }
                }
                if last_stats.elapsed() >= Duration::from_secs(1) {
                    last_stats = Instant::now();
                    if let Ok(s) = oc.cap.stats() {
                        received.delta(s.received);
                        on_drops(Drops {
                            kernel: kernel.delta(s.dropped),
                            interface: iface.delta(s.if_dropped),
                        });
                    }
                }
                // libpcap's own timeout never fires on an idle TPACKET_V3 socket, so wait here.
                let mut fds = [PollFd::new(oc.cap.as_fd(), PollFlags::POLLIN)];
                let _ = poll(&mut fds, POLL_TIMEOUT_MS);
            }
            for (batch, tx) in batches.into_iter().zip(&workers) {
                if !batch.packets.is_empty() {
                    let _ = tx.send(batch);
                }
            }
            if let Ok(s) = oc.cap.stats() {
                received.delta(s.received);
                on_drops(Drops {
                    kernel: kernel.delta(s.dropped),
                    interface: iface.delta(s.if_dropped),
                });
            }
            tracing::info!(
                interface = %oc.interface,
                received = received.total(),
                dropped = kernel.total(),
                if_dropped = iface.total(),
                "capture stopped (pcap_stats)"
            );
            health.running.fetch_sub(1, Ordering::SeqCst);
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drop_counter_survives_wraparound() {
        let mut c = DropCounter::default();
        assert_eq!(c.delta(10), 10);
        assert_eq!(c.delta(15), 5);
        assert_eq!(c.delta(u32::MAX - 1), u64::from(u32::MAX - 16));
        assert_eq!(c.delta(3), 5);
        assert_eq!(c.total(), 10 + 5 + u64::from(u32::MAX - 16) + 5);
    }

    #[test]
    fn both_directions_and_all_clients_of_a_server_share_a_worker() {
        let frame = |src: ([u8; 4], u16), dst: ([u8; 4], u16)| {
            let mut v = Vec::new();
            etherparse::PacketBuilder::ethernet2([1; 6], [2; 6])
                .ipv4(src.0, dst.0, 64)
                .tcp(src.1, dst.1, 1, 100)
                .write(&mut v, b"x")
                .expect("frame");
            v
        };
        let server = ([10, 0, 0, 1], 8080);
        let w = shard_of(1, &frame(([10, 0, 0, 2], 40000), server), 8);
        assert_eq!(shard_of(1, &frame(server, ([10, 0, 0, 2], 40000)), 8), w);
        assert_eq!(shard_of(1, &frame(([10, 9, 9, 9], 51234), server), 8), w);
        assert_eq!(shard_of(1, &frame(([10, 0, 0, 2], 40000), server), 1), 0);
        assert_eq!(shard_of(1, b"junk", 8), 0);
    }

    #[test]
    fn batch_iterates_its_packets() {
        let b = Batch {
            linktype: 1,
            data: b"abcdef".to_vec(),
            packets: vec![(1, 0, 2), (2, 2, 4), (3, 5, 9)],
        };
        let v: Vec<(i64, &[u8])> = b.iter().collect();
        assert_eq!(v, vec![(1, &b"ab"[..]), (2, &b"cdef"[..])]);
    }
}
