//! Whole-frame ports: burst builds and parses Ethernet, IP and UDP itself.
//!
//! Kernel-bypass links (AF_XDP, DPDK) move Ethernet frames, not UDP
//! payloads. [`RawPort`] turns any such [`FrameLink`] into a [`Port`]: on
//! send it writes the Ethernet header (the peer's MAC from its neighbour
//! table), the IP header with an IP ID sequence of its own (like a kernel
//! sender; the ICRC covers the ID, so [`Port::assign_ip_ids`] hands it out
//! before sealing), UDP from port 4791 and ECT(0); on receive it parses the
//! frame with burst-wire and hands on the ICRC's CRC over the headers as
//! they came ([`RxMeta::pseudo_crc`]: full strength, nothing solved for or
//! assumed), with which the data plane checks the ICRC in the pass that
//! places the payload. Frames it cannot use are counted in
//! [`PortCounters`] and dropped.
//!
//! **Neighbours.** A peer's MAC comes from one of two places
//! ([`Resolution`]): the kernel's neighbour table through netlink, with
//! resolution triggered when the entry is missing (AF_XDP, where the kernel
//! still owns the interface and answers ARP), or burst's own ARP and IPv6
//! neighbour discovery (DPDK, where burst owns the link: it answers ARP
//! requests and neighbour solicitations for its address and asks for its
//! peers'). Packets to a peer being resolved are held, as the
//! kernel's `unres_qlen` does, and sent once its MAC is known; after
//! [`RESOLVE_TIMEOUT`] without an answer they are dropped and counted (the
//! transport retransmits). A RoCE frame received from a peer also teaches
//! its MAC. Peers are taken to be on the link (no gateway lookup).
//!
//! ```
//! use burst_io::raw::{MemLink, RawPort, Resolution};
//! use burst_io::{PacketBuf, Port, RxBatch};
//! let (la, lb) = MemLink::pair([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
//! let mut a = RawPort::new(la, "198.18.0.1".parse().unwrap(), Resolution::Own);
//! let mut b = RawPort::new(lb, "198.18.0.2".parse().unwrap(), Resolution::Own);
//! let mut p = PacketBuf::new();
//! // A 12-byte BTH (SEND ONLY to QP 0x11) and the ICRC.
//! p.data[..12].copy_from_slice(&[4, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 1]);
//! p.len = 16;
//! p.peer = b.local_addr();
//! a.assign_ip_ids(std::slice::from_mut(&mut p));
//! burst_io::seal(a.local_addr(), p.peer, &mut p.data[..16], p.ip_id).unwrap();
//! assert_eq!(a.send_burst(std::slice::from_ref(&p)).unwrap(), 1); // held: ARP first
//! let mut rx = RxBatch::default();
//! b.recv_batch(&mut rx).unwrap(); // answers the ARP request
//! a.recv_batch(&mut rx).unwrap(); // learns the MAC, sends the held packet
//! assert_eq!(b.recv_batch(&mut rx).unwrap(), 1);
//! let (meta, bytes) = rx.frames().next().unwrap();
//! let mut check = burst_wire::icrc::Checker::new();
//! let at = bytes.len() - 4;
//! let pseudo = meta.pseudo_crc.unwrap();
//! assert_eq!(check.check_after(pseudo, bytes, at, |c| c), burst_wire::icrc::Check::Ok);
//! assert_eq!((meta.peer, bytes), (a.local_addr(), p.bytes()));
//! ```

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use burst_wire::frame::{ETH_LEN, UDP_LEN};
use burst_wire::{IpRepr, RoceFrame, UdpRepr, ROCEV2_PORT};

use crate::control::{self, Control, Neigh};
use crate::{LentFrame, PacketBuf, Port, PortCounters, Readiness, RxMeta, RxVisit, FRAME_HEADROOM};

/// What [`FrameLink::send_parts`] asks for each frame: its headers written
/// into the headroom given (their length returned; 0 skips the frame), and
/// the transport bytes that follow them.
pub type FrameParts<'a, 'f> = dyn FnMut(usize, &mut [u8; FRAME_HEADROOM]) -> (usize, &'a [u8]) + 'f;

/// A link that moves whole Ethernet frames (without FCS): an AF_XDP socket,
/// a DPDK port queue, or an in-memory pair ([`MemLink`]).
pub trait FrameLink: Send {
    /// The interface or device name (for messages).
    fn name(&self) -> &str;
    /// The link's MAC address.
    fn mac(&self) -> [u8; 6];
    /// Receives up to `max` frames without blocking, calling `f` on each
    /// (the bytes are valid only during the call); returns how many.
    fn recv(&mut self, max: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<usize>;
    /// Sends up to `n` frames: `fill(i, buf)` writes frame `i` into the
    /// link's buffer `buf` and returns its length (0: skip it). Returns how
    /// many of the `n` the link took (fewer when its queue is full).
    fn send(
        &mut self,
        n: usize,
        fill: &mut dyn FnMut(usize, &mut [u8]) -> usize,
    ) -> io::Result<usize>;
    /// [`FrameLink::send`] for frames given in two parts, copied straight
    /// into the link's buffers: `parts(i, head)` writes frame `i`'s headers
    /// into `head` and returns their length (0: skip the frame) and the
    /// transport bytes that follow them. A link whose frames span several
    /// buffers (AF_XDP multi-buffer) copies each part once, with no
    /// contiguous frame built first.
    fn send_parts<'a>(&mut self, n: usize, parts: &mut FrameParts<'a, '_>) -> io::Result<usize> {
        let mut head = [0u8; FRAME_HEADROOM];
        self.send(n, &mut |i, buf| {
            let (h, ib) = parts(i, &mut head);
            if h == 0 || buf.len() < h + ib.len() {
                return 0;
            }
            buf[..h].copy_from_slice(&head[..h]);
            buf[h..h + ib.len()].copy_from_slice(ib);
            h + ib.len()
        })
    }
    /// Lends up to `n` frames of the link's own for packets to be built in
    /// place, calling `lent(ptr, cap, handle)` for each: `cap` bytes at
    /// `ptr` (at least [`crate::MAX_PACKET`]) with [`FRAME_HEADROOM`]
    /// writable bytes before them for the headers. Returns how many; links
    /// that do not lend (the default) return 0.
    ///
    /// # Safety
    /// An implementation must lend memory valid as [`LentFrame::new`]
    /// requires; the caller must pass each handle back exactly once, to
    /// [`FrameLink::send_lent`] or [`FrameLink::reclaim`].
    unsafe fn lend(&mut self, n: usize, lent: &mut dyn FnMut(NonNull<u8>, usize, usize)) -> usize {
        let _ = (n, lent);
        0
    }
    /// Whether [`FrameLink::lend`] can lend at all (it may still lend
    /// fewer than asked, or none, while its pool is empty).
    fn lends(&self) -> bool {
        false
    }
    /// Sends lent frames, each `(handle, headers, len)`: its frame starts
    /// `headers` bytes before the lent pointer and is `len` bytes long.
    /// Returns how many it took (a prefix); the rest stay lent.
    ///
    /// # Safety
    /// Each handle must be one [`FrameLink::lend`] gave and not yet passed
    /// back, with `headers <= FRAME_HEADROOM` and `len - headers` at most
    /// the frame's `cap`.
    unsafe fn send_lent(&mut self, frames: &[(usize, usize, usize)]) -> io::Result<usize> {
        let _ = frames;
        Ok(0)
    }
    /// Takes back a lent frame unused.
    ///
    /// # Safety
    /// As for [`FrameLink::send_lent`].
    unsafe fn reclaim(&mut self, handle: usize) {
        let _ = handle;
    }
    /// QP `qpn` belongs to lane `lane` (links that steer in the kernel).
    fn steer_qp(&mut self, _qpn: u32, _lane: u32) {}
    /// QP `qpn` is gone.
    fn unsteer_qp(&mut self, _qpn: u32) {}
    /// Frames the link's kernel-side steering sent to the default lane for
    /// want of a lane owning their QPN.
    fn steered_unknown_qpn(&self) -> u64 {
        0
    }
    /// Frames the link dropped before they could be read (a full ring, no
    /// buffer to receive into), cumulative; reported by one lane of a
    /// shared device only, so that a device's sum over lanes is right.
    fn rx_dropped(&self) -> u64 {
        0
    }
    /// A handle that waits for received frames from another thread.
    fn readiness(&self) -> io::Result<Readiness> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this link has no readiness handle",
        ))
    }
    /// Pushes frames [`FrameLink::send`] queued that the link has not
    /// taken yet (AF_XDP in copy mode takes 32 per wake-up); returns
    /// whether some are still waiting.
    fn flush_tx(&mut self) -> bool {
        false
    }
}

/// Where a [`RawPort`] learns its peers' MAC addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// The kernel owns the interface (AF_XDP): read its neighbour table
    /// through netlink and ask it to resolve missing entries.
    Kernel {
        /// The interface index.
        ifindex: u32,
    },
    /// burst owns the link (DPDK): answer ARP for the local address and
    /// send ARP requests for peers.
    Own,
}

/// How long packets wait for a peer's MAC before they are dropped.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(3);
/// Packets held per peer while it is resolved (the kernel's default
/// `unres_qlen` is 101).
pub const HELD_PER_PEER: usize = 128;
/// Between two looks at the kernel's table (or two ARP requests) for a
/// peer being resolved.
const PROBE_EVERY: Duration = Duration::from_millis(1);
const ARP_EVERY: Duration = Duration::from_millis(200);
/// How often a known kernel neighbour is looked up again (its MAC may change).
const REFRESH_EVERY: Duration = Duration::from_secs(10);

const ETHERTYPE_ARP: u16 = 0x0806;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
/// IP protocol numbers of ICMP and ICMPv6.
const IP_PROTO_ICMP: u8 = 1;
const IP_PROTO_ICMPV6: u8 = 58;
/// Control frames queued for the link at most (answers to a flood of
/// requests beyond it are dropped).
const MAX_CONTROL: usize = 256;
/// ECT(0): RoCEv2 senders mark their packets ECN-capable (DCQCN).
const ECT0: u8 = 0b10;

struct Held {
    peer: SocketAddr,
    ip_id: u16,
    bytes: Vec<u8>,
}

struct Neighbour {
    mac: Option<[u8; 6]>,
    /// When resolution started (or the MAC was last confirmed).
    since: Instant,
    /// Last look at the kernel's table, or last ARP request.
    probed: Option<Instant>,
    held: VecDeque<Held>,
}

/// A [`Port`] over a [`FrameLink`]: see the module documentation.
pub struct RawPort<L> {
    link: L,
    local: SocketAddr,
    mac: [u8; 6],
    resolution: Resolution,
    netlink: Option<crate::neigh::Netlink>,
    neighbours: HashMap<IpAddr, Neighbour>,
    next_id: std::cell::Cell<u16>,
    counters: PortCounters,
    /// Frames to send besides transport packets (ARP replies, requests).
    control: Vec<Vec<u8>>,
    /// Scratch: the MAC of each packet of a send burst.
    macs: Vec<[u8; 6]>,
    /// Scratch: which packets of a send burst go out now.
    ready: Vec<usize>,
    /// Raw mode ([`Port::set_raw`]): no headers' CRC for the receiver.
    raw: bool,
    /// Scratch: senders seen in a receive burst.
    learned: Vec<(IpAddr, [u8; 6])>,
    /// This port as one lane of several sharing a link ([`Lanes`]).
    lanes: Option<Lanes>,
    /// This port's name on the frames it lends ([`LentFrame::lender`]).
    lender: u64,
    /// Scratch: the lent frames of a send burst, and which packet each is.
    lent_tx: Vec<(usize, usize, usize)>,
    lent_of: Vec<usize>,
    /// Packets to this port's own address (a QP of the same device): whole
    /// frames the next receive takes, as RXE and RNICs loop them back; the
    /// link would carry them to a peer that drops them.
    looped: VecDeque<Vec<u8>>,
    /// Loopback frames already taken, for the next ones.
    spare: Vec<Vec<u8>>,
}

/// Loopback frames a port holds for its next receive before it drops them
/// (a receive takes them all: only one round's sends wait here).
const MAX_LOOPED: usize = 1024;

/// Names of ports that lend frames: a frame goes back only to its lender.
static LENDERS: AtomicU64 = AtomicU64::new(1);

/// A frame one lane received for another.
struct Handed {
    frame: Vec<u8>,
    /// A neighbour message shared for learning: not to be answered again.
    learn_only: bool,
}

/// Frames a lane may hold for another before it drops them.
const INBOX: usize = 4096;

/// Emptied hand-off buffers kept for reuse: a lane that hands frames over
/// steadily allocates none once the lanes have passed this many around.
/// Bounds what they keep to this many of the largest frame (~9 MiB).
const SPARES: usize = 1024;

/// One lane of several whole-frame ports that share a link (a DPDK port's
/// queue pairs, an interface's AF_XDP sockets, one per receive queue):
/// the device spreads frames over queues without knowing QPNs, so a lane
/// hands a RoCE frame for another lane's QP (QPN `q` belongs to
/// lane `(q - first_qpn) % count`, the engine's numbering) to that lane
/// through a lock-free queue, and shares ARP and neighbour messages with
/// every lane (each resolves its own peers). The common case, a frame on
/// its owner's queue, takes no queue at all.
pub struct Lanes {
    index: usize,
    first_qpn: u32,
    inboxes: Arc<Vec<crossbeam_queue::ArrayQueue<Handed>>>,
    /// Buffers of handed frames once read, shared by the lanes.
    spares: Arc<crossbeam_queue::ArrayQueue<Vec<u8>>>,
}

impl Lanes {
    /// The `count` lanes of one link.
    pub fn group(count: usize, first_qpn: u32) -> Vec<Lanes> {
        let inboxes = Arc::new(
            (0..count.max(1))
                .map(|_| crossbeam_queue::ArrayQueue::new(INBOX))
                .collect::<Vec<_>>(),
        );
        let spares = Arc::new(crossbeam_queue::ArrayQueue::new(SPARES));
        (0..count.max(1))
            .map(|index| Lanes {
                index,
                first_qpn,
                inboxes: Arc::clone(&inboxes),
                spares: Arc::clone(&spares),
            })
            .collect()
    }

    /// A copy of `frame` in a spare buffer where one is left.
    fn copy(&self, frame: &[u8]) -> Vec<u8> {
        let mut v = self.spares.pop().unwrap_or_default();
        v.clear();
        v.extend_from_slice(frame);
        v
    }

    /// Gives the buffer of a handed frame back once it was read.
    fn recycle(&self, frame: Vec<u8>) {
        let _ = self.spares.push(frame);
    }

    fn inbox(&self) -> &crossbeam_queue::ArrayQueue<Handed> {
        &self.inboxes[self.index]
    }

    /// Hands `frame` to the lane owning `qpn` if that is not this one;
    /// returns whether it left (or was dropped for a full inbox).
    fn hand_off(&self, qpn: u32, frame: &[u8]) -> bool {
        let n = self.inboxes.len();
        let owner = qpn.wrapping_sub(self.first_qpn) as usize % n;
        if owner == self.index {
            return false;
        }
        if let Err(h) = self.inboxes[owner].push(Handed {
            frame: self.copy(frame),
            learn_only: false,
        }) {
            self.recycle(h.frame);
        }
        true
    }

    /// Gives every other lane a copy of a neighbour message to learn from.
    fn share(&self, frame: &[u8]) {
        for (i, q) in self.inboxes.iter().enumerate() {
            if i != self.index {
                if let Err(h) = q.push(Handed {
                    frame: self.copy(frame),
                    learn_only: true,
                }) {
                    self.recycle(h.frame);
                }
            }
        }
    }
}

impl<L: FrameLink> RawPort<L> {
    /// A port for `ip` (an address of the link; RoCEv2's UDP port 4791).
    pub fn new(link: L, ip: IpAddr, resolution: Resolution) -> RawPort<L> {
        let mac = link.mac();
        // Start the ID sequence somewhere arbitrary, as kernels do.
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        RawPort {
            link,
            local: SocketAddr::new(ip, ROCEV2_PORT),
            mac,
            netlink: None,
            resolution,
            neighbours: HashMap::new(),
            next_id: std::cell::Cell::new((seed ^ (seed >> 16)) as u16),
            counters: PortCounters::default(),
            control: Vec::new(),
            macs: Vec::new(),
            ready: Vec::new(),
            raw: false,
            learned: Vec::new(),
            lanes: None,
            lender: LENDERS.fetch_add(1, Ordering::Relaxed),
            lent_tx: Vec::new(),
            lent_of: Vec::new(),
            looped: VecDeque::new(),
            spare: Vec::new(),
        }
    }

    /// Makes this port one lane of several sharing its link ([`Lanes`]).
    pub fn set_lanes(&mut self, lanes: Lanes) {
        self.lanes = Some(lanes);
    }

    /// The link.
    pub fn link(&self) -> &L {
        &self.link
    }

    /// The link, mutably.
    pub fn link_mut(&mut self) -> &mut L {
        &mut self.link
    }

    /// Records `mac` as the MAC of `ip` (a static neighbour entry).
    pub fn set_neighbour(&mut self, ip: IpAddr, mac: [u8; 6]) {
        self.learn(ip, mac);
    }

    /// The MAC known for `ip`, if any.
    pub fn neighbour(&self, ip: IpAddr) -> Option<[u8; 6]> {
        self.neighbours.get(&ip).and_then(|n| n.mac)
    }

    fn learn(&mut self, ip: IpAddr, mac: [u8; 6]) {
        let now = Instant::now();
        let n = self.neighbours.entry(ip).or_insert_with(|| Neighbour {
            mac: None,
            since: now,
            probed: None,
            held: VecDeque::new(),
        });
        if n.mac.is_none() {
            self.counters.resolved += 1;
        }
        n.mac = Some(mac);
        n.since = now;
    }

    /// The MAC of `ip`, or `None` after starting (or continuing) its resolution.
    fn lookup(&mut self, ip: IpAddr, now: Instant) -> Option<[u8; 6]> {
        if let Some(n) = self.neighbours.get(&ip) {
            if n.mac.is_some() {
                return n.mac;
            }
        } else {
            self.neighbours.insert(
                ip,
                Neighbour {
                    mac: None,
                    since: now,
                    probed: None,
                    held: VecDeque::new(),
                },
            );
            self.counters.resolutions += 1;
            self.probe(ip, now);
        }
        self.neighbours.get(&ip).and_then(|n| n.mac)
    }

    /// Asks for `ip`'s MAC: the kernel's table (triggering its resolution),
    /// or an ARP request of our own.
    fn probe(&mut self, ip: IpAddr, now: Instant) {
        match self.resolution.clone() {
            Resolution::Kernel { ifindex } => {
                if self.netlink.is_none() {
                    match crate::neigh::Netlink::open() {
                        Ok(n) => self.netlink = Some(n),
                        Err(e) => {
                            self.counters.resolve_errors += 1;
                            tracing::warn!("burst-io: netlink: {e}");
                            return;
                        }
                    }
                }
                let nl = self.netlink.as_mut().expect("opened above");
                let first = self.neighbours.get(&ip).is_some_and(|n| n.probed.is_none());
                match nl.lookup(ifindex, ip) {
                    Ok(Some(mac)) => {
                        self.learn(ip, mac);
                        return;
                    }
                    Ok(None) if first => {
                        if nl.solicit(ifindex, ip).is_err() {
                            self.counters.resolve_errors += 1;
                        }
                    }
                    Ok(None) => {}
                    Err(_) => self.counters.resolve_errors += 1,
                }
                if let Some(n) = self.neighbours.get_mut(&ip) {
                    n.probed = Some(now);
                }
            }
            Resolution::Own => {
                let due = self
                    .neighbours
                    .get(&ip)
                    .is_none_or(|n| n.probed.is_none_or(|t| now - t >= ARP_EVERY));
                if !due {
                    return;
                }
                match (ip, self.local.ip()) {
                    (IpAddr::V4(target), IpAddr::V4(me)) => {
                        let f = control::arp(false, self.mac, me, [0xff; 6], [0; 6], target);
                        self.queue_control(f);
                        self.counters.arp_requests += 1;
                    }
                    (IpAddr::V6(target), IpAddr::V6(me)) => {
                        self.queue_control(control::ndp_solicit(self.mac, me, target));
                        self.counters.arp_requests += 1;
                    }
                    // A peer of the other family: nothing to ask.
                    _ => self.counters.resolve_errors += 1,
                }
                if let Some(n) = self.neighbours.get_mut(&ip) {
                    n.probed = Some(now);
                }
            }
        }
    }

    /// Moves along the peers being resolved: asks again, drops what waited
    /// too long, sends what can go; and refreshes old kernel entries.
    fn poll_neighbours(&mut self) -> io::Result<()> {
        if self
            .neighbours
            .values()
            .all(|n| n.mac.is_some() && n.held.is_empty())
            && !matches!(self.resolution, Resolution::Kernel { .. })
        {
            return self.flush_control();
        }
        let now = Instant::now();
        let pending: Vec<IpAddr> = self
            .neighbours
            .iter()
            .filter(|(_, n)| {
                n.mac.is_none() && n.probed.is_none_or(|t| now - t >= PROBE_EVERY)
                    || (n.mac.is_some()
                        && matches!(self.resolution, Resolution::Kernel { .. })
                        && now - n.since >= REFRESH_EVERY)
            })
            .map(|(ip, _)| *ip)
            .collect();
        for ip in pending {
            let known = self.neighbours.get(&ip).is_some_and(|n| n.mac.is_some());
            if known {
                // A refresh: forget and look again (packets meanwhile wait).
                if let Some(n) = self.neighbours.get_mut(&ip) {
                    n.mac = None;
                    n.since = now;
                    n.probed = None;
                }
                self.counters.resolutions += 1;
            }
            self.probe(ip, now);
        }
        let mut expired = 0;
        for n in self.neighbours.values_mut() {
            if n.mac.is_none() && now - n.since >= RESOLVE_TIMEOUT && !n.held.is_empty() {
                expired += n.held.len() as u64;
                n.held.clear();
            }
        }
        self.counters.tx_unresolved += expired;
        self.flush_control()?;
        self.flush_held()
    }

    /// Queues a control frame for the link; refuses it (counted) when
    /// [`MAX_CONTROL`] wait already.
    fn queue_control(&mut self, frame: Vec<u8>) -> bool {
        if self.control.len() >= MAX_CONTROL {
            self.counters.control_dropped += 1;
            return false;
        }
        self.control.push(frame);
        true
    }

    fn flush_control(&mut self) -> io::Result<()> {
        if self.control.is_empty() {
            return Ok(());
        }
        let frames = std::mem::take(&mut self.control);
        let took = self.link.send(frames.len(), &mut |i, buf| {
            let f = &frames[i];
            if buf.len() < f.len() {
                return 0;
            }
            buf[..f.len()].copy_from_slice(f);
            f.len()
        })?;
        // What the link could not take now goes next time.
        self.control.extend(frames.into_iter().skip(took));
        Ok(())
    }

    /// Sends the packets held for peers now resolved.
    fn flush_held(&mut self) -> io::Result<()> {
        let ready: Vec<IpAddr> = self
            .neighbours
            .iter()
            .filter(|(_, n)| n.mac.is_some() && !n.held.is_empty())
            .map(|(ip, _)| *ip)
            .collect();
        for ip in ready {
            let n = self.neighbours.get_mut(&ip).expect("listed above");
            let mac = n.mac.expect("resolved");
            let held = std::mem::take(&mut n.held);
            let (src, smac) = (self.local, self.mac);
            let items: Vec<&Held> = held.iter().collect();
            let took = self.link.send_parts(items.len(), &mut |i, head| {
                let h = items[i];
                let n = write_headers(head, smac, mac, src, h.peer, h.ip_id, h.bytes.len());
                (n, &h.bytes[..])
            })?;
            self.counters.tx_frames += took as u64;
            let n = self.neighbours.get_mut(&ip).expect("listed above");
            n.held = held.into_iter().skip(took).collect();
        }
        Ok(())
    }
}

/// Writes the Ethernet, IP and UDP headers of a transport packet of
/// `ib_len` bytes from `src` to `dst` at the start of `buf`; returns their
/// length (where the transport bytes go), or 0 when `buf` is too small or
/// the families differ. burst-wire's own emitter, not etherparse's
/// builder: once per packet on the hot path, in place, UDP checksum 0.
fn write_headers(
    buf: &mut [u8],
    smac: [u8; 6],
    dmac: [u8; 6],
    src: SocketAddr,
    dst: SocketAddr,
    ip_id: u16,
    ib_len: usize,
) -> usize {
    let mut ip = match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => IpRepr::v4(s, d),
        (IpAddr::V6(s), IpAddr::V6(d)) => IpRepr::v6(s, d),
        _ => return 0,
    };
    match &mut ip {
        IpRepr::V4(v) => {
            v.ident = ip_id;
            v.ecn = ECT0;
        }
        IpRepr::V6(v) => v.traffic_class = ECT0,
    }
    let ethertype = match ip {
        IpRepr::V4(_) => ETHERTYPE_IPV4,
        IpRepr::V6(_) => ETHERTYPE_IPV6,
    };
    let udp = UdpRepr {
        src_port: src.port(),
        dst_port: dst.port(),
        checksum: 0,
    };
    let at = ETH_LEN + ip.header_len() + UDP_LEN;
    if buf.len() < at {
        return 0;
    }
    buf[0..6].copy_from_slice(&dmac);
    buf[6..12].copy_from_slice(&smac);
    buf[12..14].copy_from_slice(&ethertype.to_be_bytes());
    if burst_wire::emit_ip_udp(&ip, &udp, UDP_LEN + ib_len, &mut buf[ETH_LEN..at]).is_err() {
        return 0;
    }
    at
}

/// What a received frame is.
enum Rx {
    /// A RoCEv2 packet for us: meta, and where the transport packet lies.
    Roce(RxMeta, std::ops::Range<usize>, [u8; 6]),
    /// ARP or IPv6 neighbour discovery.
    Neigh(Neigh),
    /// An echo request to us: the reply.
    Echo(Vec<u8>),
    /// Dropped; the counter was bumped.
    Dropped,
}

/// What `frame` is to a port on `local` with `mac`; `own` when the port
/// owns its link (it answers ARP, ND and echo requests itself).
fn classify(
    frame: &[u8],
    local: SocketAddr,
    mac: [u8; 6],
    raw: bool,
    own: bool,
    c: &mut PortCounters,
) -> Rx {
    // Control frames (ARP, ICMP) are told apart by a byte or two before
    // anything is parsed: RoCE frames go straight on.
    let ethertype = frame.get(12..14).map(|t| u16::from_be_bytes([t[0], t[1]]));
    let control = match ethertype {
        Some(ETHERTYPE_ARP) => true,
        // Only a port that answers echo requests builds the reply.
        Some(ETHERTYPE_IPV4) => own && frame.get(ETH_LEN + 9) == Some(&IP_PROTO_ICMP),
        Some(ETHERTYPE_IPV6) => frame.get(ETH_LEN + 6) == Some(&IP_PROTO_ICMPV6),
        _ => false,
    };
    if control {
        match control::parse(frame, local.ip(), mac, own) {
            Some(Control::Neigh(n)) => return Rx::Neigh(n),
            Some(Control::Echo(reply)) => return Rx::Echo(reply),
            None => {}
        }
    }
    let dst_mac = frame.get(0..6).unwrap_or(&[]);
    if dst_mac.len() == 6 && dst_mac != mac && dst_mac[0] & 1 == 0 {
        c.rx_not_ours += 1;
        return Rx::Dropped;
    }
    let f = match RoceFrame::parse_ethernet(frame) {
        Ok(f) => f,
        Err(
            burst_wire::Error::NotIp(_)
            | burst_wire::Error::NotUdp(_)
            | burst_wire::Error::WrongUdpPort(_)
            | burst_wire::Error::IpFragment,
        ) => {
            c.rx_not_roce += 1;
            return Rx::Dropped;
        }
        Err(_) => {
            c.rx_malformed += 1;
            return Rx::Dropped;
        }
    };
    let (src, dst, ip_id, ecn) = match f.ip {
        IpRepr::V4(v) => (IpAddr::V4(v.src), IpAddr::V4(v.dst), Some(v.ident), v.ecn),
        IpRepr::V6(v) => (
            IpAddr::V6(v.src),
            IpAddr::V6(v.dst),
            None,
            v.traffic_class & 0b11,
        ),
    };
    if dst != local.ip() {
        c.rx_not_ours += 1;
        return Rx::Dropped;
    }
    let ib = f.ib.as_bytes();
    let start = ib.as_ptr() as usize - frame.as_ptr() as usize;
    // The ICRC is the receiver's to check, with the CRC of the headers as
    // they came (full strength: nothing solved for or assumed), in the
    // pass that places the payload; raw mode hands every frame on.
    let meta = RxMeta {
        peer: SocketAddr::new(src, f.udp.src_port),
        ip_id,
        ecn,
        icrc_verified: false,
        pseudo_crc: (!raw).then(|| f.pseudo_header_crc()),
        dest: None,
    };
    let smac = f.eth.map_or([0; 6], |e| e.src);
    Rx::Roce(meta, start..start + ib.len(), smac)
}

impl<L: FrameLink> RawPort<L> {
    /// Looks up the peers' MACs of a send burst: fills `ready` (packets
    /// that can go now, in order) and `macs`; holds the others for their
    /// peer's resolution (copied) and sends the control frames waiting.
    fn resolve_burst(&mut self, bufs: &[PacketBuf]) -> io::Result<()> {
        // The clock only matters when a peer must be resolved.
        let mut now: Option<Instant> = None;
        self.macs.clear();
        self.ready.clear();
        // A burst mostly goes to one peer: look its MAC up once.
        let mut last: Option<(IpAddr, [u8; 6])> = None;
        for (i, b) in bufs.iter().enumerate() {
            let ip = b.peer.ip();
            if ip == self.local.ip() {
                self.loop_back(b);
                continue;
            }
            let mac = match last {
                Some((l, m)) if l == ip => Some(m),
                _ => match self.neighbour(ip) {
                    Some(m) => Some(m),
                    None => self.lookup(ip, *now.get_or_insert_with(Instant::now)),
                },
            };
            if let Some(m) = mac {
                last = Some((ip, m));
            }
            match mac {
                Some(m) => {
                    self.ready.push(i);
                    self.macs.push(m);
                }
                None => {
                    let n = self
                        .neighbours
                        .get_mut(&b.peer.ip())
                        .expect("lookup made it");
                    if n.held.len() < HELD_PER_PEER {
                        n.held.push_back(Held {
                            peer: b.peer,
                            ip_id: b.ip_id,
                            bytes: b.bytes().to_vec(),
                        });
                        self.counters.tx_held += 1;
                    } else {
                        self.counters.tx_unresolved += 1;
                    }
                }
            }
        }
        self.flush_control()
    }

    /// Queues a packet to this port's own address as the frame the link
    /// would have carried (same headers, so the ICRC checks as any other),
    /// for the next [`Port::recv_frames`].
    fn loop_back(&mut self, b: &PacketBuf) {
        if self.looped.len() >= MAX_LOOPED {
            self.counters.looped_dropped += 1;
            return;
        }
        let mut f = self.spare.pop().unwrap_or_default();
        // Room for the longest headers (IPv6), cut to the ones written.
        f.clear();
        f.resize(ETH_LEN + 40 + UDP_LEN, 0);
        let (mac, local) = (self.mac, self.local);
        let at = write_headers(&mut f, mac, mac, local, b.peer, b.ip_id, b.len);
        if at == 0 {
            self.counters.tx_errors += 1;
            self.spare.push(f);
            return;
        }
        f.truncate(at);
        f.extend_from_slice(b.bytes());
        self.looped.push_back(f);
        self.counters.looped_back += 1;
    }

    /// Sends the `ready` packets of `bufs`, copying each into a frame of
    /// the link's; returns as [`Port::send_burst`] does.
    fn send_ready(&mut self, bufs: &[PacketBuf]) -> io::Result<usize> {
        let (src, smac) = (self.local, self.mac);
        let (ready, macs) = (&self.ready, &self.macs);
        let mut bad = 0;
        let took = if ready.is_empty() {
            0
        } else {
            self.link.send_parts(ready.len(), &mut |k, head| {
                let b = &bufs[ready[k]];
                let h = write_headers(head, smac, macs[k], src, b.peer, b.ip_id, b.len);
                if h == 0 {
                    bad += 1;
                }
                (h, b.bytes())
            })?
        };
        self.counters.tx_frames += (took - bad.min(took)) as u64;
        self.counters.tx_errors += bad as u64;
        if took < self.ready.len() {
            // The link is full: report the packets before the first one it
            // did not take, so the caller keeps the rest in order (held
            // packets after it are held again when retried: a duplicate the
            // transport discards).
            return Ok(self.ready[took]);
        }
        Ok(bufs.len())
    }
}

impl<L: FrameLink> Port for RawPort<L> {
    fn local_addr(&self) -> SocketAddr {
        self.local
    }

    fn flush_tx(&mut self) -> bool {
        self.link.flush_tx()
    }

    fn recv_frames(&mut self, max: usize, visit: &mut RxVisit<'_>) -> io::Result<usize> {
        let (local, mac, raw) = (self.local, self.mac, self.raw);
        let own = self.resolution == Resolution::Own;
        let mut lent = 0;
        // Senders to learn from (once per run of frames from one sender:
        // a burst is mostly one peer's) and neighbour messages to handle
        // (with whether they are only to learn from: copies from a lane).
        let mut learned = std::mem::take(&mut self.learned);
        let mut neighs: Vec<(Neigh, bool)> = Vec::new();
        let mut echoes: Vec<Vec<u8>> = Vec::new();
        let counters = &mut self.counters;
        let lanes = &self.lanes;
        let mut take = |frame: &[u8], handed: Option<bool>| {
            counters.rx_frames += u64::from(handed.is_none());
            match classify(frame, local, mac, raw, own, counters) {
                Rx::Roce(meta, range, smac) => {
                    if let (Some(l), None) = (lanes, handed) {
                        let qpn = frame
                            .get(range.start + 5..range.start + 8)
                            .map_or(0, |q| u32::from_be_bytes([0, q[0], q[1], q[2]]));
                        if l.hand_off(qpn, frame) {
                            counters.rx_handed_off += 1;
                            return;
                        }
                    }
                    visit(meta, &frame[range]);
                    lent += 1;
                    let who = (meta.peer.ip(), smac);
                    if learned.last() != Some(&who) {
                        learned.push(who);
                    }
                }
                Rx::Neigh(n) => {
                    if let (Some(l), None) = (lanes, handed) {
                        // Every lane resolves its own peers: all learn.
                        l.share(frame);
                    }
                    neighs.push((n, handed.unwrap_or(false)));
                }
                // Answered by the port that owns its link, below.
                Rx::Echo(reply) => echoes.push(reply),
                Rx::Dropped => {}
            }
        };
        // Frames this port sent itself first, then those other lanes
        // received for this one, then the link's.
        let mut left = max;
        let mut looped = std::mem::take(&mut self.looped);
        let mut spare = std::mem::take(&mut self.spare);
        while left > 0 {
            let Some(f) = looped.pop_front() else { break };
            take(&f, None);
            spare.push(f);
            left -= 1;
        }
        if let Some(l) = lanes {
            while left > 0 {
                let Some(h) = l.inbox().pop() else { break };
                take(&h.frame, Some(h.learn_only));
                l.recycle(h.frame);
                left -= 1;
            }
        }
        let r = self.link.recv(left, &mut |frame| take(frame, None));
        self.looped = looped;
        self.spare = spare;
        r?;
        for &(ip, smac) in &learned {
            // Our own address is never a neighbour: its packets loop back.
            if ip != self.local.ip() && self.neighbours.get(&ip).is_none_or(|n| n.mac.is_none()) {
                self.learn(ip, smac);
            }
        }
        learned.clear();
        self.learned = learned;
        // Only a port that owns its link classifies echo requests as such.
        for reply in echoes {
            if self.queue_control(reply) {
                self.counters.echo_replies += 1;
            }
        }
        for (n, learn_only) in neighs {
            self.counters.arp_received += 1;
            if self.resolution != Resolution::Own {
                continue;
            }
            let me = self.local.ip();
            // Learn who asks for us, or whom we know or look for (RFC 826,
            // RFC 4861 7.2.3 and 7.2.5).
            if n.asked == Some(me) || self.neighbours.contains_key(&n.who) {
                self.learn(n.who, n.mac);
            }
            if learn_only || n.asked != Some(me) {
                continue;
            }
            let reply = match (me, n.who) {
                (IpAddr::V4(me), IpAddr::V4(who)) => {
                    control::arp(true, self.mac, me, n.mac, n.mac, who)
                }
                (IpAddr::V6(me), IpAddr::V6(who)) => {
                    control::ndp(true, self.mac, me, n.mac, who, me)
                }
                _ => continue,
            };
            if self.queue_control(reply) {
                self.counters.arp_replies += 1;
            }
        }
        self.poll_neighbours()?;
        Ok(lent)
    }

    fn assign_ip_ids(&self, bufs: &mut [PacketBuf]) {
        let mut id = self.next_id.get();
        for b in bufs {
            b.ip_id = id;
            id = id.wrapping_add(1);
        }
        self.next_id.set(id);
    }

    fn send_burst(&mut self, bufs: &[PacketBuf]) -> io::Result<usize> {
        self.resolve_burst(bufs)?;
        self.send_ready(bufs)
    }

    fn send_frames(&mut self, bufs: &mut [PacketBuf]) -> io::Result<usize> {
        let mine = |b: &PacketBuf| b.data.lent().is_some_and(|l| l.lender() == self.lender);
        if !bufs.iter().all(mine) {
            return self.send_burst(bufs);
        }
        self.resolve_burst(bufs)?;
        let (src, smac) = (self.local, self.mac);
        self.lent_tx.clear();
        self.lent_of.clear();
        let mut bad = 0;
        for (k, &i) in self.ready.iter().enumerate() {
            let b = &mut bufs[i];
            let (peer, id, len) = (b.peer, b.ip_id, b.len);
            let l = b.data.lent.as_mut().expect("checked above");
            let head = l.headroom();
            let at = write_headers(head, smac, self.macs[k], src, peer, id, len);
            if at == 0 {
                bad += 1;
                continue;
            }
            // The headers end where the transport bytes start.
            head.copy_within(..at, FRAME_HEADROOM - at);
            self.lent_tx.push((l.handle(), at, at + len));
            self.lent_of.push(i);
        }
        // SAFETY: handles this link lent (checked by lender), each once,
        // with headers that fit the headroom.
        let took = unsafe { self.link.send_lent(&self.lent_tx)? };
        for &i in &self.lent_of[..took] {
            // The link owns the frame now.
            let _ = bufs[i].data.take_lent();
        }
        self.counters.tx_frames += took as u64;
        self.counters.tx_errors += bad as u64;
        if took < self.lent_of.len() {
            return Ok(self.lent_of[took]);
        }
        Ok(bufs.len())
    }

    fn lend_frames(&mut self, bufs: &mut [PacketBuf]) {
        if !self.link.lends() {
            return;
        }
        let want = bufs.iter().filter(|b| b.data.lent().is_none()).count();
        if want == 0 {
            return;
        }
        let lender = self.lender;
        let mut empty = bufs.iter_mut().filter(|b| b.data.lent().is_none());
        let mut refused = Vec::new();
        // SAFETY: the link's frames are valid as LentFrame::new requires
        // (FrameLink::lend's contract); each goes to one buffer, which
        // gives it back through send_frames or reclaim_frames.
        // A pool that is empty for now lends fewer: those buffers copy.
        unsafe {
            self.link
                .lend(want, &mut |ptr, cap, handle| match empty.next() {
                    Some(b) if cap >= crate::MAX_PACKET => {
                        b.data.lend(LentFrame::new(ptr, cap, lender, handle));
                    }
                    _ => refused.push(handle),
                })
        };
        for h in refused {
            // SAFETY: lent just now and given to nobody.
            unsafe { self.link.reclaim(h) };
        }
    }

    fn reclaim_frames(&mut self, bufs: &mut [PacketBuf]) {
        for b in bufs {
            if b.data.lent().is_some_and(|l| l.lender() == self.lender) {
                let l = b.data.take_lent().expect("checked");
                // SAFETY: lent by this port's link, given back once.
                unsafe { self.link.reclaim(l.handle()) };
            }
        }
    }

    fn readiness(&self) -> io::Result<Readiness> {
        self.link.readiness()
    }

    fn counters(&self) -> PortCounters {
        let mut c = self.counters;
        c.steered_unknown_qpn = self.link.steered_unknown_qpn();
        c.rx_dropped = self.link.rx_dropped();
        c
    }

    fn set_raw(&mut self, raw: bool) {
        self.raw = raw;
    }

    fn steer_qp(&mut self, qpn: u32, lane: u32) {
        self.link.steer_qp(qpn, lane);
    }

    fn unsteer_qp(&mut self, qpn: u32) {
        self.link.unsteer_qp(qpn);
    }
}

/// An in-memory pair of [`FrameLink`]s joined back to back (tests, examples):
/// what one sends, the other receives, in order.
pub struct MemLink {
    name: String,
    mac: [u8; 6],
    tx: Arc<Mutex<VecDeque<Vec<u8>>>>,
    rx: Arc<Mutex<VecDeque<Vec<u8>>>>,
    /// Frames the link takes per send call (a full ring takes fewer).
    pub room: usize,
    /// Lends frames to build packets in ([`FrameLink::lend`]), as a DPDK
    /// link does; off by default.
    pub lends: bool,
    /// Frames lent and not yet given back.
    pub lent: usize,
}

/// A frame a [`MemLink`] lends: headroom, then room for a packet.
type MemFrame = [u8; FRAME_HEADROOM + crate::MAX_PACKET];

impl MemLink {
    /// Two links joined to each other, with these MACs.
    pub fn pair(a: [u8; 6], b: [u8; 6]) -> (MemLink, MemLink) {
        let (x, y) = (Arc::default(), Arc::default());
        let la = MemLink {
            name: "mem0".into(),
            mac: a,
            tx: Arc::clone(&x),
            rx: Arc::clone(&y),
            room: usize::MAX,
            lends: false,
            lent: 0,
        };
        let lb = MemLink {
            name: "mem1".into(),
            mac: b,
            tx: y,
            rx: x,
            room: usize::MAX,
            lends: false,
            lent: 0,
        };
        (la, lb)
    }

    /// Sends a raw frame from this end (a test playing the peer).
    pub fn inject(&self, frame: &[u8]) {
        self.tx
            .lock()
            .expect("not poisoned")
            .push_back(frame.to_vec());
    }

    /// Takes the frames waiting to be received at this end (a test playing
    /// the peer reads what the other end sent).
    pub fn take_received(&self) -> Vec<Vec<u8>> {
        self.rx.lock().expect("not poisoned").drain(..).collect()
    }
}

impl FrameLink for MemLink {
    fn name(&self) -> &str {
        &self.name
    }
    fn mac(&self) -> [u8; 6] {
        self.mac
    }
    fn recv(&mut self, max: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<usize> {
        let mut n = 0;
        while n < max {
            let Some(frame) = self.rx.lock().expect("not poisoned").pop_front() else {
                break;
            };
            f(&frame);
            n += 1;
        }
        Ok(n)
    }
    fn send(
        &mut self,
        n: usize,
        fill: &mut dyn FnMut(usize, &mut [u8]) -> usize,
    ) -> io::Result<usize> {
        let n = n.min(self.room);
        let mut buf = vec![0u8; crate::MAX_PACKET];
        let mut q = self.tx.lock().expect("not poisoned");
        for i in 0..n {
            let len = fill(i, &mut buf);
            if len > 0 {
                q.push_back(buf[..len].to_vec());
            }
        }
        Ok(n)
    }
    unsafe fn lend(&mut self, n: usize, lent: &mut dyn FnMut(NonNull<u8>, usize, usize)) -> usize {
        if !self.lends {
            return 0;
        }
        for _ in 0..n {
            // The handle is the frame's own address (a leaked box until it
            // comes back).
            let frame = Box::into_raw(Box::new([0u8; FRAME_HEADROOM + crate::MAX_PACKET]));
            // SAFETY: a live allocation of headroom + MAX_PACKET bytes.
            let ptr = unsafe { NonNull::new_unchecked(frame.cast::<u8>().add(FRAME_HEADROOM)) };
            self.lent += 1;
            lent(ptr, crate::MAX_PACKET, frame.expose_provenance());
        }
        n
    }
    fn lends(&self) -> bool {
        self.lends
    }
    unsafe fn send_lent(&mut self, frames: &[(usize, usize, usize)]) -> io::Result<usize> {
        let n = frames.len().min(self.room);
        let mut q = self.tx.lock().expect("not poisoned");
        for &(handle, headers, len) in &frames[..n] {
            // SAFETY: the caller's contract: a frame `lend` leaked, given
            // back once; its headers start `headers` before the packet.
            let frame =
                unsafe { Box::from_raw(std::ptr::with_exposed_provenance_mut::<MemFrame>(handle)) };
            let start = FRAME_HEADROOM - headers;
            q.push_back(frame[start..start + len].to_vec());
            self.lent -= 1;
        }
        Ok(n)
    }
    unsafe fn reclaim(&mut self, handle: usize) {
        // SAFETY: as in `send_lent`.
        drop(unsafe { Box::from_raw(std::ptr::with_exposed_provenance_mut::<MemFrame>(handle)) });
        self.lent -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::Lanes;

    #[test]
    fn handed_frames_reuse_their_buffers() {
        let group = Lanes::group(2, 0x11);
        let (l0, l1) = (&group[0], &group[1]);
        // QPN 0x12 is lane 1's: lane 0 hands it over (a new buffer).
        assert!(l0.hand_off(0x12, &[1; 100]));
        let h = l1.inbox().pop().expect("handed");
        assert_eq!(h.frame, [1; 100]);
        let at = h.frame.as_ptr();
        l1.recycle(h.frame);
        assert_eq!(l0.spares.len(), 1, "the read buffer is kept");
        // The next hand-off, from either lane, takes it again.
        assert!(l1.hand_off(0x11, &[2; 60]));
        let h = l0.inbox().pop().expect("handed");
        assert_eq!((h.frame.as_slice(), h.frame.as_ptr()), (&[2u8; 60][..], at));
        assert_eq!(l0.spares.len(), 0);
        // A lane's own QPN stays with it.
        assert!(!l0.hand_off(0x13, &[3; 10]));
    }
}
