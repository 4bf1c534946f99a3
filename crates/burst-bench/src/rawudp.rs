//! The path's ceiling: the same frames through the same port code (the
//! port BURST_PORT names, as burst's engine would open it: burst-io's
//! `UdpPort` with recvmmsg/sendmmsg bursts, GSO runs and GRO, or an AF_XDP
//! or DPDK port in raw mode, which skips the ICRC check), with no
//! transport, no ICRC and no placement. Every datagram starts with a BTH, so
//! whole-frame ports parse it as they parse burst's. A `size`-byte message is `ceil(size / mtu)`
//! datagrams of the sizes an RDMA WRITE has on the wire: the first carries
//! BTH + RETH + payload + ICRC, the others BTH + payload + ICRC (so GSO cuts
//! the same runs as for burst: the first packet alone, then the rest).
//!
//! The stream is paced by credits, so the ceiling does not measure its own
//! drops: the sink reports the bytes it has received (an 8-byte datagram
//! back to the sender, every [`CREDIT_EVERY`] bytes), and the sender keeps
//! at most [`WINDOW`] bytes unreported in flight, about what a receive
//! socket buffer absorbs while its reader is descheduled. burst's own
//! window does the same job for RDMA (a bounded number of packets in
//! flight per QP), so both sides of the ratio are flow-controlled.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use burst_verbs::ports::{PacketBuf, Port, RxBatch, MAX_GSO_SEGMENTS};
use burst_verbs::AnyPort;

use crate::report::{Bw, Lat, Samples};

/// RoCEv2 headers the first packet of a WRITE carries on top of its payload
/// (BTH 12 + RETH 16 + ICRC 4).
const OVERHEAD: usize = 32;
/// The RETH, which only the first packet carries.
const RETH: usize = 16;

/// Payload bytes the sender keeps in flight beyond the last credit.
const WINDOW: u64 = 4 << 20;
/// The sink reports what it has received at least this often (bytes).
const CREDIT_EVERY: u64 = 256 << 10;
/// With no credit for this long, the bytes in flight are taken as lost (a
/// datagram dropped anyway) and the window opens again.
const CREDIT_TIMEOUT: Duration = Duration::from_millis(50);
/// A credit datagram: a UD SEND ONLY (BTH, DETH) carrying the sink's
/// received payload bytes, little-endian, then the ICRC's room.
const CREDIT_LEN: usize = 12 + 8 + 8 + 4;
/// Where the count sits in a credit.
const CREDIT_AT: usize = 20;
const OP_WRITE_FIRST: u8 = 0x06;
const OP_WRITE_MIDDLE: u8 = 0x07;
const OP_SEND_ONLY: u8 = 0x04;
const OP_UD_SEND_ONLY: u8 = 0x64;

/// Writes a BTH with `opcode` to QP 0x11 at the start of `b`.
fn bth(b: &mut [u8], opcode: u8) {
    b[..12].copy_from_slice(&[opcode, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 0]);
}

/// Opens the port BURST_PORT names on `local`, in raw mode.
pub fn open(local: std::net::IpAddr) -> Result<(AnyPort, String), String> {
    let cfg = crate::rdma::device_config(local, burst_verbs::Mtu::Mtu4096)?;
    let mut port = burst_verbs::engine::open_port(&cfg).map_err(|e| e.to_string())?;
    port.set_raw(true);
    Ok((port, format!("raw-{}", cfg.port.name())))
}

fn datagrams(size: usize, mtu: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut left = size;
    loop {
        let n = left.min(mtu);
        v.push(
            n + if v.is_empty() {
                OVERHEAD
            } else {
                OVERHEAD - RETH
            },
        );
        left -= n;
        if left == 0 {
            break;
        }
    }
    v
}

/// What the receiver of a raw-UDP stream saw: payload bytes and the time
/// from its first datagram to its last (the rate is timed on the receiving
/// side, up to the last datagram that arrived: no sleep in the window).
#[derive(Debug, Default)]
pub struct SinkCount {
    /// Payload bytes received.
    pub bytes: AtomicU64,
    /// Nanoseconds from the first datagram to the last.
    pub span_ns: AtomicU64,
}

/// Counts received bytes of payload until `stop`, reporting them to the
/// sender as credits.
pub fn sink(mut port: AnyPort, stop: &AtomicBool, got: &SinkCount) {
    let mut rx = RxBatch::default();
    let mut first: Option<Instant> = None;
    let mut total = 0u64;
    let mut reported = 0u64;
    let mut credit = vec![PacketBuf::new()];
    while !stop.load(Ordering::Acquire) {
        if let Ok(n) = port.recv_batch(&mut rx) {
            if n > 0 {
                let now = Instant::now();
                let t0 = *first.get_or_insert(now);
                // Payload bytes (a message's first packet also counts its
                // 16 RETH bytes: 0.02% of a 64 KiB message).
                let bytes: usize = rx
                    .packets()
                    .filter(|(_, p)| p.first() != Some(&OP_UD_SEND_ONLY))
                    .map(|(_, p)| p.len().saturating_sub(OVERHEAD - RETH))
                    .sum();
                total += bytes as u64;
                got.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
                got.span_ns
                    .store((now - t0).as_nanos() as u64, Ordering::Relaxed);
                if total - reported >= CREDIT_EVERY {
                    if let Some((peer, _)) = rx.packets().last() {
                        bth(&mut credit[0].data[..], OP_UD_SEND_ONLY);
                        credit[0].data[CREDIT_AT..CREDIT_AT + 8]
                            .copy_from_slice(&total.to_le_bytes());
                        credit[0].len = CREDIT_LEN;
                        credit[0].peer = peer;
                        // A credit lost to a full buffer is made up by the
                        // next (they carry totals).
                        let _ = port.send_burst(&credit);
                        reported = total;
                    }
                }
            }
        }
    }
    report_counters("sink", &*port);
}

/// With BURST_BENCH_COUNTERS set, prints what `port` counted.
fn report_counters(who: &str, port: &dyn Port) {
    if std::env::var_os("BURST_BENCH_COUNTERS").is_some() {
        eprintln!("burst-bench: {who} port counters: {:?}", port.counters());
    }
}

/// The sender's view of the sink's credits.
struct Credits {
    rx: RxBatch,
    acked: u64,
    last: Instant,
}

impl Credits {
    /// Reads the credits that arrived (never blocks).
    fn poll(&mut self, port: &mut dyn Port) {
        while let Ok(n) = port.recv_batch(&mut self.rx) {
            if n == 0 {
                break;
            }
            for (_, p) in self.rx.packets() {
                if p.len() == CREDIT_LEN && p[0] == OP_UD_SEND_ONLY {
                    let b: [u8; 8] = p[CREDIT_AT..CREDIT_AT + 8].try_into().expect("8 bytes");
                    let v = u64::from_le_bytes(b);
                    if v > self.acked {
                        self.acked = v;
                        self.last = Instant::now();
                    }
                }
            }
        }
    }

    /// Waits until at most [`WINDOW`] bytes of `sent` are unreported; a
    /// silence of [`CREDIT_TIMEOUT`] writes the bytes in flight off.
    fn wait_for_room(&mut self, port: &mut dyn Port, sent: u64) {
        loop {
            self.poll(port);
            if sent.saturating_sub(self.acked) <= WINDOW {
                return;
            }
            if self.last.elapsed() > CREDIT_TIMEOUT {
                self.acked = sent.saturating_sub(WINDOW);
                self.last = Instant::now();
                return;
            }
            std::hint::spin_loop();
        }
    }
}

/// Sends `iters` messages of `size` bytes (or for `duration`) to `to` in
/// bursts. The figures are the receiver's ([`SinkCount`]): the caller sets
/// them from its count; `sent_bytes` here is what left, so the loss shows.
pub fn stream(
    port: &mut dyn Port,
    name: &str,
    to: SocketAddr,
    size: usize,
    mtu: usize,
    iters: u64,
    duration: Option<Duration>,
) -> Result<(Bw, u64), String> {
    // As many packets per call as burst's engine sends per round.
    const TX: usize = 4 * MAX_GSO_SEGMENTS;
    let mut bufs: Vec<PacketBuf> = (0..TX).map(|_| PacketBuf::new()).collect();
    // Real bytes: untouched zeroed allocations map the kernel's shared zero
    // page, which the kernel copies from cache and which would inflate the
    // ceiling (measured: twice the per-byte copy speed of written memory).
    for (i, b) in bufs.iter_mut().enumerate() {
        b.data.fill(i as u8 | 1);
    }
    let plan = datagrams(size, mtu);
    let start = Instant::now();
    let mut credits = Credits {
        rx: RxBatch::default(),
        acked: 0,
        last: start,
    };
    let mut sent_payload = 0u64;
    let mut sent_msgs = 0u64;
    let mut k = 0;
    while crate::report::more(start, duration, sent_msgs, iters) {
        credits.wait_for_room(port, sent_payload);
        let mut n = 0;
        while n < TX {
            bufs[n].len = plan[k];
            bufs[n].peer = to;
            let op = if k == 0 {
                OP_WRITE_FIRST
            } else {
                OP_WRITE_MIDDLE
            };
            bth(&mut bufs[n].data[..], op);
            n += 1;
            k += 1;
            if k == plan.len() {
                k = 0;
                sent_msgs += 1;
                if duration.is_none() && sent_msgs >= iters {
                    break;
                }
            }
        }
        sent_payload += bufs[..n]
            .iter()
            .map(|b| (b.len - (OVERHEAD - RETH)) as u64)
            .sum::<u64>();
        let mut off = 0;
        while off < n {
            match port.send_burst(&bufs[off..n]) {
                Ok(m) => off += m,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(format!("raw-udp send: {e}")),
            }
        }
    }
    report_counters("stream", port);
    let secs = start.elapsed().as_secs_f64();
    let sent_bytes = sent_msgs * size as u64;
    Ok((
        Bw {
            test: "write_bw".into(),
            transport: name.into(),
            bytes: size,
            iters: sent_msgs,
            gbps: sent_bytes as f64 * 8.0 / secs / 1e9,
            mpps: sent_msgs as f64 / secs / 1e6,
            secs,
            retransmitted_pkts: 0,
            retransmits_started: 0,
            ack_timeouts: 0,
            sr_probes: 0,
            sr_go_backs: 0,
            window_cuts: 0,
            rx_dropped: [0; 2],
            cpu_secs: 0.0,
            client_cpu_secs: 0.0,
            ns_per_pkt: [0.0; 2],
            cores_at_400g: [0.0; 2],
        },
        sent_bytes,
    ))
}

fn recv_one(
    port: &mut dyn Port,
    ready: Option<&burst_verbs::ports::Readiness>,
    rx: &mut RxBatch,
    deadline: Instant,
) -> Result<usize, String> {
    loop {
        if let Some(r) = ready {
            r.wait(Duration::from_millis(100))
                .map_err(|e| format!("raw-udp poll: {e}"))?;
        }
        match port.recv_batch(rx) {
            Ok(0) => {}
            Ok(_) => return Ok(rx.packets().next().map_or(0, |(_, p)| p.len())),
            Err(e) => return Err(format!("raw-udp recv: {e}")),
        }
        if Instant::now() > deadline {
            return Err("raw-udp: timed out".into());
        }
    }
}

/// Echoes single datagrams until `stop`, busy-polling or (`events`)
/// blocking in poll(2).
pub fn echo(mut port: AnyPort, stop: &AtomicBool, events: bool) -> Result<(), String> {
    let mut rx = RxBatch::new(1);
    let mut out: Vec<PacketBuf> = (0..1).map(|_| PacketBuf::new()).collect();
    let ready = if events { port.readiness().ok() } else { None };
    while !stop.load(Ordering::Acquire) {
        if let Some(r) = &ready {
            if !r.wait(Duration::from_millis(100)).unwrap_or(false) {
                continue;
            }
        }
        if let Ok(1) = port.recv_batch(&mut rx) {
            if let Some((peer, p)) = rx.packets().next() {
                out[0].data[..p.len()].copy_from_slice(p);
                out[0].len = p.len();
                out[0].peer = peer;
                let _ = port.send_burst(&out);
            }
        }
    }
    Ok(())
}

/// Ping-pong of one datagram of `size` + headers, busy-polled or
/// (`events`) blocking in poll(2): half round trips.
pub fn pingpong(
    port: &mut dyn Port,
    name: &str,
    to: SocketAddr,
    size: usize,
    iters: u64,
    duration: Option<Duration>,
    events: bool,
) -> Result<Lat, String> {
    let mut bufs: Vec<PacketBuf> = (0..1).map(|_| PacketBuf::new()).collect();
    let mut rx = RxBatch::new(1);
    let mut h = Samples::new();
    let start = Instant::now();
    let deadline = start + Duration::from_secs(120) + duration.unwrap_or_default();
    let ready = if events { port.readiness().ok() } else { None };
    bth(&mut bufs[0].data[..], OP_SEND_ONLY);
    let mut i = 0;
    while crate::report::more(start, duration, i, iters) {
        bufs[0].len = size + OVERHEAD - RETH; // a SEND: no RETH
        bufs[0].peer = to;
        let t = Instant::now();
        port.send_burst(&bufs)
            .map_err(|e| format!("raw-udp send: {e}"))?;
        recv_one(port, ready.as_ref(), &mut rx, deadline)?;
        h.record(t.elapsed().as_nanos() as u64 / 2);
        i += 1;
    }
    Ok(h.lat("send_lat", name, size, true, events))
}
