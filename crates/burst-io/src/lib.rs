#![doc = include_str!("../README.md")]

pub mod capture;
mod control;
#[cfg(feature = "dpdk")]
pub mod dpdk;
#[cfg(feature = "dpdk")]
pub mod dpdk_dma;
mod lossy;
mod neigh;
pub mod netdev;
pub mod raw;
mod sim;
mod sys;
#[cfg(feature = "af-xdp")]
pub mod xdp;
#[cfg(feature = "af-xdp")]
pub mod xsk;

pub use burst_wire::icrc::Check as IcrcCheck;
pub use lossy::LossyPort;
pub use sim::{SimFaults, SimNet, SimPort, SimStats};

use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};

use burst_wire::{icrc, BTH_LEN, ICRC_LEN, ROCEV2_PORT};

/// Largest datagram a port buffer holds (jumbo frames with a 4096-byte MTU).
pub const MAX_PACKET: usize = 9216;

/// Most packets (or, on receive, datagrams) one burst call moves.
pub const BURST: usize = 32;

/// Most segments of one GSO send (the kernel's `UDP_MAX_SEGMENTS` is 64 or
/// 128 depending on the version; 64 is accepted by all).
pub const MAX_GSO_SEGMENTS: usize = 64;

/// Most bytes of one GSO send: an IPv4 datagram's 65535 bytes less the
/// IPv4 and UDP headers.
pub const MAX_GSO_BYTES: usize = 65535 - 20 - 8;

/// Size of a receive buffer of an [`RxBatch`]: one coalesced (GRO) datagram.
pub const RX_BUF: usize = 65536;

/// Bytes a port's link needs before a lent frame's transport bytes for
/// its own headers (Ethernet, IPv6 and UDP: 62, rounded up).
pub const FRAME_HEADROOM: usize = 64;

/// A frame of a port's own (a DPDK mbuf) lent to a [`PacketBuf`] so that
/// the core builds its packet where the port sends it from
/// ([`Port::lend_frames`]); the port takes it back when it sends the packet
/// ([`Port::send_frames`]) or reclaims it ([`Port::reclaim_frames`]).
#[derive(Debug)]
pub struct LentFrame {
    ptr: std::ptr::NonNull<u8>,
    cap: usize,
    lender: u64,
    handle: usize,
}

// SAFETY: a lent frame is memory only its holder touches until the lender
// takes it back (the contract of `LentFrame::new`); moving it to another
// thread moves that exclusive right with it.
unsafe impl Send for LentFrame {}

impl LentFrame {
    /// A frame of `cap` bytes at `ptr`, with [`FRAME_HEADROOM`] bytes of
    /// the lender's before it, lent by port `lender` under its `handle`.
    ///
    /// # Safety
    /// `cap` must be at least [`MAX_PACKET`] (a buffer holding the frame
    /// is sliced up to that), and `ptr - FRAME_HEADROOM .. ptr + cap` valid
    /// for reads and writes, used by nobody but the holder of this value
    /// until the lender takes it back, and never freed while lent (a frame
    /// that is never taken back is leaked, not freed).
    pub unsafe fn new(ptr: std::ptr::NonNull<u8>, cap: usize, lender: u64, handle: usize) -> Self {
        LentFrame {
            ptr,
            cap,
            lender,
            handle,
        }
    }
    /// The port that lent it.
    pub fn lender(&self) -> u64 {
        self.lender
    }
    /// The lender's name for it.
    pub fn handle(&self) -> usize {
        self.handle
    }
    /// The headroom before the transport bytes, for the lender's headers.
    pub fn headroom(&mut self) -> &mut [u8; FRAME_HEADROOM] {
        // SAFETY: `new`'s contract: the headroom is ours while lent.
        unsafe {
            &mut *self
                .ptr
                .as_ptr()
                .sub(FRAME_HEADROOM)
                .cast::<[u8; FRAME_HEADROOM]>()
        }
    }
}

/// A packet buffer's storage: its own, or a frame a port lent it
/// ([`LentFrame`]); either way at least [`MAX_PACKET`] bytes, read and
/// written as a slice.
pub struct FrameData {
    own: Box<[u8; MAX_PACKET]>,
    lent: Option<LentFrame>,
}

impl FrameData {
    fn new() -> FrameData {
        FrameData {
            own: Box::new([0; MAX_PACKET]),
            lent: None,
        }
    }
    /// The frame a port lent, if any.
    pub fn lent(&self) -> Option<&LentFrame> {
        self.lent.as_ref()
    }
    /// Lends `frame` (at least [`MAX_PACKET`] bytes) to this buffer; the
    /// buffer reads and writes it from now on. Returns the frame it held.
    pub fn lend(&mut self, frame: LentFrame) -> Option<LentFrame> {
        debug_assert!(frame.cap >= MAX_PACKET);
        self.lent.replace(frame)
    }
    /// Gives the lent frame back (to its lender); the buffer's own
    /// storage serves again.
    pub fn take_lent(&mut self) -> Option<LentFrame> {
        self.lent.take()
    }
    /// The buffer's own storage (a port that queues buffers swaps it).
    pub(crate) fn own_mut(&mut self) -> &mut Box<[u8; MAX_PACKET]> {
        &mut self.own
    }
}

impl std::ops::Deref for FrameData {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.lent {
            // SAFETY: `LentFrame::new`'s contract: `cap` bytes ours.
            Some(l) => unsafe { std::slice::from_raw_parts(l.ptr.as_ptr(), l.cap) },
            None => &self.own[..],
        }
    }
}

impl std::ops::DerefMut for FrameData {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.lent {
            // SAFETY: as in `deref`, and `&mut self` makes it exclusive.
            Some(l) => unsafe { std::slice::from_raw_parts_mut(l.ptr.as_ptr(), l.cap) },
            None => &mut self.own[..],
        }
    }
}

impl std::fmt::Debug for FrameData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.lent {
            Some(l) => write!(f, "FrameData(lent by {} as {})", l.lender, l.handle),
            None => f.write_str("FrameData(own)"),
        }
    }
}

/// A packet buffer of a port's pool.
pub struct PacketBuf {
    /// Storage: the buffer's own, or a frame a port lent it.
    pub data: FrameData,
    /// Bytes used.
    pub len: usize,
    /// Peer address (source on receive, destination on send).
    pub peer: SocketAddr,
    /// On send, the local address the packet leaves from when it is not
    /// the port's own ([`Port::local_addr`]): another address the port
    /// serves ([`Port::add_address`]; a device's GID other than its first).
    pub src: Option<IpAddr>,
    /// The IPv4 identification the packet leaves with (set by
    /// [`Port::assign_ip_ids`]; the ICRC covers it).
    pub ip_id: u16,
    /// The payload's CRC-32, when the gather computed it while copying:
    /// [`seal`] then reads only the headers and the pad.
    pub payload_crc: Option<PayloadCrc>,
}

/// Where a packet's payload sits in its transport bytes (BTH onwards) and
/// its CRC-32 ([`PacketBuf::payload_crc`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PayloadCrc {
    /// Offset of the payload from the BTH.
    pub at: usize,
    /// Payload bytes.
    pub len: usize,
    /// Their CRC-32 (crc32fast's, from an empty start).
    pub crc: u32,
}

impl PacketBuf {
    /// An empty buffer.
    pub fn new() -> PacketBuf {
        PacketBuf {
            data: FrameData::new(),
            len: 0,
            peer: SocketAddr::from(([0, 0, 0, 0], 0)),
            src: None,
            ip_id: 0,
            payload_crc: None,
        }
    }
    /// The bytes used.
    pub fn bytes(&self) -> &[u8] {
        &self.data[..self.len]
    }
}

impl Default for PacketBuf {
    fn default() -> Self {
        PacketBuf::new()
    }
}

impl std::fmt::Debug for PacketBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PacketBuf({} bytes, {})", self.len, self.peer)
    }
}

/// What [`Port::recv_frames`] lends each received packet to: what the
/// port knows of it, and its bytes (valid only during the call).
pub type RxVisit<'v> = dyn FnMut(RxMeta, &[u8]) + 'v;

/// What a port knows of a received packet besides its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxMeta {
    /// The sender's address (IP and UDP source port).
    pub peer: SocketAddr,
    /// The IPv4 identification, when the port sees IP headers (`None` for
    /// a UDP socket, which hides it).
    pub ip_id: Option<u16>,
    /// The IP ECN bits (0 where the port cannot see them); 3 is CE, the
    /// congestion mark DCQCN reacts to.
    pub ecn: u8,
    /// The port verified the packet's ICRC over its IP and UDP headers as
    /// received; the caller need not check it again.
    pub icrc_verified: bool,
    /// The ICRC's CRC over the IP and UDP headers as received
    /// ([`burst_wire::icrc::pseudo_header_crc`]), where the port sees them
    /// (whole-frame ports) and leaves the check to the caller, who can
    /// make it in the pass that places the payload
    /// ([`burst_wire::icrc::Checker::check_after`]).
    pub pseudo_crc: Option<u32>,
    /// The destination address when it is not the port's own: a multicast
    /// group the port joined ([`Port::join_multicast`]) or another address
    /// it serves ([`Port::add_address`]).
    pub dest: Option<IpAddr>,
}

burst_wire::counters! {
    /// What a port counted of the frames it moved (whole-frame ports; a UDP
    /// socket leaves these at 0, the kernel filtering for it, but for
    /// `rx_dropped`, the kernel's own count).
    #[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct PortCounters {
        /// Frames received from the link.
        pub rx_frames: u64,
        /// Frames that were not RoCEv2 (not IP, not UDP, not port 4791,
        /// fragments), dropped.
        pub rx_not_roce: u64,
        /// Frames for another MAC or IP address, dropped.
        pub rx_not_ours: u64,
        /// RoCEv2 frames that were truncated or malformed (bad lengths, IP
        /// checksum, BTH), dropped.
        pub rx_malformed: u64,
        /// Frames sent.
        pub tx_frames: u64,
        /// Packets that could not be framed (no room, mixed families), dropped.
        pub tx_errors: u64,
        /// Packets held while their peer's MAC was resolved.
        pub tx_held: u64,
        /// Packets dropped because their peer's MAC did not resolve in time
        /// (or too many waited).
        pub tx_unresolved: u64,
        /// Neighbour resolutions started.
        pub resolutions: u64,
        /// Neighbours resolved.
        pub resolved: u64,
        /// Resolutions that could not be asked for (netlink errors, IPv6
        /// without a kernel to ask).
        pub resolve_errors: u64,
        /// ARP packets and IPv6 neighbour solicitations/advertisements received
        /// (ports that own their link).
        pub arp_received: u64,
        /// ARP requests (IPv6: neighbour solicitations) sent.
        pub arp_requests: u64,
        /// ARP replies (IPv6: neighbour advertisements) sent.
        pub arp_replies: u64,
        /// ICMP echo replies sent (ports that own their link answer a
        /// peer's `ping`).
        pub echo_replies: u64,
        /// Control frames (ARP, NDP, echo replies) not queued: too many
        /// waited for the link.
        pub control_dropped: u64,
        /// Frames the kernel-side steering (AF_XDP's XDP program) handed to
        /// the default lane because no lane had claimed their QPN.
        pub steered_unknown_qpn: u64,
        /// RoCE frames a lane received for another lane's QP and handed over
        /// (links whose queues do not steer by QPN).
        pub rx_handed_off: u64,
        /// Packets to the port's own address (another QP of the same
        /// device) delivered to its own receive, never put on the link.
        pub looped_back: u64,
        /// Packets to the port's own address dropped: too many waited for
        /// the next receive.
        pub looped_dropped: u64,
        /// Frames dropped below burst before it could read them: a full
        /// socket receive buffer (the kernel's count for the port's
        /// sockets, `SO_MEMINFO`), a full device ring or no mbuf to receive
        /// into (DPDK's `imissed`, `ierrors`, `rx_nombuf`), a full AF_XDP
        /// receive ring or an empty fill ring (`XDP_STATISTICS`'
        /// `rx_ring_full` and `rx_dropped`, each lane's socket). Read from the
        /// kernel or device when counters are asked for; cumulative since
        /// the port opened.
        #[cfg_attr(feature = "serde", serde(default))]
        pub rx_dropped: u64,
    }
}

/// Burst receive and transmit of RoCEv2 transport packets (UDP payloads:
/// BTH through ICRC). Implemented by every packet port (UDP socket,
/// in-memory, AF_XDP, DPDK); the data-plane core is written against it.
///
/// ```
/// use burst_io::{PacketBuf, Port, RxBatch, SimFaults, SimNet};
/// let net = SimNet::new(1, SimFaults::default());
/// let mut a = net.port("198.18.0.1:4791".parse().unwrap());
/// let mut b = net.port("198.18.0.2:4791".parse().unwrap());
/// let mut buf = PacketBuf::new();
/// buf.data[..3].copy_from_slice(b"abc");
/// buf.len = 3;
/// buf.peer = b.local_addr();
/// assert_eq!(a.send_burst(std::slice::from_mut(&mut buf)).unwrap(), 1);
/// net.advance(1_000_000); // one millisecond of simulated time
/// let mut rx = RxBatch::default();
/// assert_eq!(b.recv_batch(&mut rx).unwrap(), 1);
/// let (meta, bytes) = rx.frames().next().unwrap();
/// assert_eq!((meta.peer, bytes), (a.local_addr(), &b"abc"[..]));
/// ```
pub trait Port {
    /// The local address packets are sent from and received on.
    fn local_addr(&self) -> SocketAddr;
    /// Receives a burst without blocking and lends each packet (BTH
    /// through ICRC) to `visit`, in arrival order, where the port holds it
    /// (a UDP socket's receive buffer, an AF_XDP UMEM chunk, an mbuf, a
    /// simulated frame): no copy out of the port. The bytes are valid only
    /// during the call that shows them. At most `max` frames (datagrams:
    /// a coalesced one lends all its packets) are taken from the link;
    /// returns the packets lent.
    fn recv_frames(&mut self, max: usize, visit: &mut RxVisit<'_>) -> io::Result<usize>;
    /// Receives a burst of datagrams into `rx` without blocking (replacing
    /// what it held); returns how many packets (segments) it now holds.
    /// Copies what [`Port::recv_frames`] lends where the port does not
    /// receive into `rx` itself (a UDP socket does).
    fn recv_batch(&mut self, rx: &mut RxBatch) -> io::Result<usize> {
        rx.msgs.clear();
        let max = rx.bufs.len();
        self.recv_frames(max, &mut |meta, bytes| {
            // Refused (too big for a buffer): the caller never sees it.
            let _ = rx.push(meta, bytes);
        })?;
        Ok(rx.count())
    }
    /// Sets [`PacketBuf::ip_id`] of each packet of `bufs` to the ID it will
    /// carry when sent by [`Port::send_burst`] exactly as it stands, so the
    /// caller can seal the ICRC over it.
    fn assign_ip_ids(&self, bufs: &mut [PacketBuf]);
    /// Sends `bufs` (each to its `peer`); returns how many were sent, always
    /// a whole number of GSO runs (see [`gso_run`]), so that a caller may
    /// retry from there.
    fn send_burst(&mut self, bufs: &[PacketBuf]) -> io::Result<usize>;
    /// [`Port::send_burst`] that may take the storage of the packets it
    /// sends and leave other storage in its place (a simulated network
    /// queues the buffer itself instead of copying it): the packets taken
    /// (the first `n`, `n` returned) hold unspecified bytes afterwards and
    /// the rest are unchanged. The data plane builds every packet anew in
    /// its buffer, so it sends this way; by default it is `send_burst`.
    fn send_frames(&mut self, bufs: &mut [PacketBuf]) -> io::Result<usize> {
        self.send_burst(bufs)
    }
    /// Lends frames of the port's own (mbufs) to the buffers of `bufs` that
    /// hold none, where the port can: the caller builds its packets there
    /// and [`Port::send_frames`] sends them with no copy. A buffer keeps
    /// its frame until it is sent (or reclaimed). Ports that do not lend
    /// ignore it.
    fn lend_frames(&mut self, bufs: &mut [PacketBuf]) {
        let _ = bufs;
    }
    /// Takes back the frames this port lent to `bufs` (their owner is
    /// going away): a frame never taken back is leaked from the port's pool.
    fn reclaim_frames(&mut self, bufs: &mut [PacketBuf]) {
        let _ = bufs;
    }
    /// A handle that waits for this port's traffic from another thread, for
    /// ports backed by a file descriptor.
    fn readiness(&self) -> io::Result<Readiness> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this port has no readiness handle",
        ))
    }
    /// What the port counted (zero for ports that count nothing).
    fn counters(&self) -> PortCounters {
        PortCounters::default()
    }
    /// Pushes packets [`Port::send_burst`] accepted that the link has not
    /// taken yet; returns whether some still wait. An engine keeps stepping
    /// while this holds instead of waiting for traffic: nothing would wake
    /// it for them (AF_XDP in copy mode sends 32 frames per wake-up).
    fn flush_tx(&mut self) -> bool {
        false
    }
    /// Raw mode, for measuring a port alone (burst-bench's ceilings): hand
    /// over every RoCEv2 packet for this address without verifying its
    /// ICRC. Ports that verify nothing ignore it.
    fn set_raw(&mut self, _raw: bool) {}
    /// QP `qpn` now belongs to engine thread (lane) `lane`: ports that steer
    /// in the kernel by QPN (AF_XDP's map) learn it; others ignore it.
    fn steer_qp(&mut self, _qpn: u32, _lane: u32) {}
    /// QP `qpn` is gone: its frames go to the default lane again.
    fn unsteer_qp(&mut self, _qpn: u32) {}
    /// Receives datagrams sent to multicast group `group` too (UD multicast,
    /// `ibv_attach_mcast`), handed out with [`RxMeta::dest`] set. Joining a
    /// group joined already is a no-op.
    fn join_multicast(&mut self, group: IpAddr) -> io::Result<()> {
        let _ = group;
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this port does not receive multicast",
        ))
    }
    /// Stops receiving `group`'s datagrams.
    fn leave_multicast(&mut self, group: IpAddr) -> io::Result<()> {
        let _ = group;
        Ok(())
    }
    /// Serves local address `addr` too (a device's GIDs are every address
    /// of its interface, as RXE's): receives what is sent to it, handed out
    /// with [`RxMeta::dest`] set, and sends the packets whose
    /// [`PacketBuf::src`] it is. A link-local IPv6 address carries its
    /// interface as scope. Adding an address served already is a no-op.
    fn add_address(&mut self, addr: SocketAddr) -> io::Result<()> {
        let _ = addr;
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this port serves its own address only",
        ))
    }
    /// Stops serving `ip` (added by [`Port::add_address`]).
    fn remove_address(&mut self, ip: IpAddr) {
        let _ = ip;
    }
}

/// The methods a port that wraps another passes on unchanged: all but
/// moving packets (`recv_frames`, `send_burst`, `assign_ip_ids`, and
/// `recv_batch` or `send_frames` where the inner port receives into a batch
/// or takes buffers itself), which the
/// wrapper writes itself. `forward_port_control!(self => self.inner)`
/// inside the wrapper's `impl Port`.
#[macro_export]
macro_rules! forward_port_control {
    ($s:ident => $inner:expr) => {
        fn local_addr(&$s) -> ::std::net::SocketAddr {
            $inner.local_addr()
        }
        fn readiness(&$s) -> ::std::io::Result<$crate::Readiness> {
            $inner.readiness()
        }
        fn counters(&$s) -> $crate::PortCounters {
            $inner.counters()
        }
        fn flush_tx(&mut $s) -> bool {
            $inner.flush_tx()
        }
        fn set_raw(&mut $s, raw: bool) {
            $inner.set_raw(raw)
        }
        fn steer_qp(&mut $s, qpn: u32, lane: u32) {
            $inner.steer_qp(qpn, lane)
        }
        fn unsteer_qp(&mut $s, qpn: u32) {
            $inner.unsteer_qp(qpn)
        }
        fn join_multicast(&mut $s, group: ::std::net::IpAddr) -> ::std::io::Result<()> {
            $inner.join_multicast(group)
        }
        fn leave_multicast(&mut $s, group: ::std::net::IpAddr) -> ::std::io::Result<()> {
            $inner.leave_multicast(group)
        }
        fn add_address(&mut $s, addr: ::std::net::SocketAddr) -> ::std::io::Result<()> {
            $inner.add_address(addr)
        }
        fn remove_address(&mut $s, ip: ::std::net::IpAddr) {
            $inner.remove_address(ip)
        }
    };
}

impl<P: Port + ?Sized> Port for Box<P> {
    fn recv_frames(&mut self, max: usize, visit: &mut RxVisit<'_>) -> io::Result<usize> {
        (**self).recv_frames(max, visit)
    }
    fn recv_batch(&mut self, rx: &mut RxBatch) -> io::Result<usize> {
        (**self).recv_batch(rx)
    }
    fn assign_ip_ids(&self, bufs: &mut [PacketBuf]) {
        (**self).assign_ip_ids(bufs)
    }
    fn send_burst(&mut self, bufs: &[PacketBuf]) -> io::Result<usize> {
        (**self).send_burst(bufs)
    }
    fn send_frames(&mut self, bufs: &mut [PacketBuf]) -> io::Result<usize> {
        (**self).send_frames(bufs)
    }
    fn lend_frames(&mut self, bufs: &mut [PacketBuf]) {
        (**self).lend_frames(bufs)
    }
    fn reclaim_frames(&mut self, bufs: &mut [PacketBuf]) {
        (**self).reclaim_frames(bufs)
    }
    forward_port_control!(self => (**self));
}

/// The IDs a UDP socket's packets get: each its index in its GSO run.
fn gso_ip_ids(bufs: &mut [PacketBuf], gso: bool) {
    let mut i = 0;
    while i < bufs.len() {
        let run = gso_run(&bufs[i..], gso);
        for (k, b) in bufs[i..i + run].iter_mut().enumerate() {
            b.ip_id = k as u16;
        }
        i += run;
    }
}

/// How many packets from the start of `bufs` go out as one GSO message:
/// the same peer and destination QP, the same length except for a shorter
/// last one, at most
/// [`MAX_GSO_SEGMENTS`] and [`MAX_GSO_BYTES`]. With `gso` off every packet
/// is its own message. Sealing and sending both cut runs with this one rule,
/// since a packet's IP ID, which its ICRC covers, is its index in its run.
pub fn gso_run(bufs: &[PacketBuf], gso: bool) -> usize {
    let Some(first) = bufs.first() else {
        return 0;
    };
    if !gso || first.len == 0 {
        return 1;
    }
    let seg = first.len;
    let max = MAX_GSO_SEGMENTS.min(MAX_GSO_BYTES / seg).max(1);
    // The receiver steers by destination QPN (burst's engine threads, an
    // RNIC's queues) before it splits a GSO message: one QP per message.
    let qp = |b: &PacketBuf| b.data.get(5..8).map(|q| [q[0], q[1], q[2]]);
    let mut n = 1;
    while n < bufs.len().min(max) {
        let b = &bufs[n];
        // A shorter packet closes a run (a message's last packet, or the
        // ACK sent after a reply: the peer takes the two in one datagram,
        // so its send completes before its receive, as an RNIC's ACK
        // makes it; see burst-verbs' `sends_first`).
        if b.peer != first.peer
            || b.src != first.src
            || qp(b) != qp(first)
            || b.len > seg
            || b.len == 0
        {
            break;
        }
        n += 1;
        if b.len < seg {
            break;
        }
    }
    n
}

/// One received datagram of an [`RxBatch`]: `len` bytes from `peer`, made of
/// `seg`-byte segments (the last may be shorter).
#[derive(Debug, Clone, Copy)]
struct RxMsg {
    len: usize,
    seg: usize,
    peer: SocketAddr,
    ip_id: Option<u16>,
    ecn: u8,
    icrc_verified: bool,
    pseudo_crc: Option<u32>,
    dest: Option<IpAddr>,
}

/// Receive buffers for [`Port::recv_batch`]: up to [`BURST`] datagrams of up
/// to [`RX_BUF`] bytes, each possibly several coalesced packets (GRO), handed
/// out packet by packet by [`RxBatch::packets`] without copying.
pub struct RxBatch {
    bufs: Vec<Box<[u8]>>,
    msgs: Vec<RxMsg>,
    hdrs: Box<sys::RxHeaders>,
    /// Datagrams to ask the next call for (see [`RxBatch::adapt`]).
    want: usize,
}

impl RxBatch {
    /// Buffers for `n` datagrams (at most [`BURST`] are used per call).
    pub fn new(n: usize) -> RxBatch {
        let mut bufs: Vec<Box<[u8]>> = (0..n.clamp(1, BURST))
            .map(|_| vec![0u8; RX_BUF].into_boxed_slice())
            .collect();
        let hdrs = sys::RxHeaders::new(&mut bufs);
        RxBatch {
            bufs,
            msgs: Vec::with_capacity(n),
            hdrs,
            want: 1,
        }
    }

    /// Sizes the next request from this one: the whole batch after a call
    /// that filled what it asked for (more is probably queued), else one
    /// datagram. Asking for many costs a failed attempt at the second when
    /// only one is queued, the common case of a request/response exchange
    /// (120 ns of a 0.9 us empty poll here); under load the batch grows at
    /// once, and GRO packs many packets into each datagram anyway.
    fn adapt(&mut self, asked: usize) {
        self.want = if self.msgs.len() >= asked {
            self.bufs.len().min(BURST)
        } else {
            1
        };
    }

    /// The packets received by the last call, in arrival order, each with
    /// the address it came from.
    pub fn packets(&self) -> impl Iterator<Item = (SocketAddr, &[u8])> + '_ {
        self.msgs
            .iter()
            .zip(&self.bufs)
            .flat_map(|(m, b)| segments(&b[..m.len], m.seg).map(move |p| (m.peer, p)))
    }

    /// The packets received by the last call with what the port knows of
    /// each ([`RxMeta`]).
    pub fn frames(&self) -> impl Iterator<Item = (RxMeta, &[u8])> + '_ {
        self.msgs.iter().zip(&self.bufs).flat_map(|(m, b)| {
            let meta = RxMeta {
                peer: m.peer,
                ip_id: m.ip_id,
                ecn: m.ecn,
                icrc_verified: m.icrc_verified,
                pseudo_crc: m.pseudo_crc,
                dest: m.dest,
            };
            segments(&b[..m.len], m.seg).map(move |p| (meta, p))
        })
    }

    /// The batch's buffers (address, length): what received packets are
    /// read from, untouched until the next receive into the batch.
    pub fn buffers(&self) -> impl Iterator<Item = (*const u8, usize)> + '_ {
        self.bufs.iter().map(|b| (b.as_ptr(), b.len()))
    }

    /// Appends a copy of one packet (ports that do not receive into the
    /// batch's buffers); false when the batch is full or the packet too big.
    pub(crate) fn push(&mut self, meta: RxMeta, bytes: &[u8]) -> bool {
        let i = self.msgs.len();
        let Some(buf) = self.bufs.get_mut(i) else {
            return false;
        };
        let Some(dst) = buf.get_mut(..bytes.len()) else {
            return false;
        };
        dst.copy_from_slice(bytes);
        self.msgs.push(RxMsg {
            len: bytes.len(),
            seg: bytes.len(),
            peer: meta.peer,
            ip_id: meta.ip_id,
            ecn: meta.ecn,
            icrc_verified: meta.icrc_verified,
            pseudo_crc: meta.pseudo_crc,
            dest: meta.dest,
        });
        true
    }

    /// Datagrams (system-level messages) the last call received.
    pub fn datagrams(&self) -> usize {
        self.msgs.len()
    }

    fn count(&self) -> usize {
        self.msgs
            .iter()
            .map(|m| m.len.div_ceil(m.seg.max(1)).max(1))
            .sum()
    }
}

/// The packets of one received datagram: `seg`-byte segments, the last
/// possibly shorter; an empty datagram is one empty packet (counted and
/// refused by the caller, not lost).
fn segments(d: &[u8], seg: usize) -> impl Iterator<Item = &[u8]> {
    let empty = d.is_empty().then_some(d);
    d.chunks(seg.max(1)).chain(empty)
}

impl Default for RxBatch {
    fn default() -> Self {
        RxBatch::new(BURST)
    }
}

impl std::fmt::Debug for RxBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RxBatch({} datagrams)", self.msgs.len())
    }
}

/// Waits for a port's traffic without receiving it (see
/// [`Port::readiness`]): lets an engine thread sleep until traffic comes.
#[derive(Debug)]
pub struct Readiness(Option<std::os::fd::OwnedFd>);

/// How long [`Readiness::wait`] of a poll-mode port sleeps at most.
const POLL_MODE_NAP: std::time::Duration = std::time::Duration::from_micros(50);

impl Readiness {
    /// A handle over a file descriptor that polls readable when the port
    /// has traffic (a socket, an AF_XDP socket, an eventfd).
    pub fn from_fd(fd: std::os::fd::OwnedFd) -> Readiness {
        Readiness(Some(fd))
    }

    /// For poll-mode ports (DPDK), which nothing can wait on: a wait is a
    /// short nap, so an idle engine checks the port every 50 us or so.
    pub fn poll_mode() -> Readiness {
        Readiness(None)
    }

    /// Blocks until a datagram is waiting or `timeout` passes; returns
    /// whether one is (a poll-mode port: naps and says no).
    pub fn wait(&self, timeout: std::time::Duration) -> io::Result<bool> {
        use std::os::fd::AsRawFd;
        match &self.0 {
            Some(fd) => sys::wait_readable(fd.as_raw_fd(), timeout),
            None => {
                std::thread::sleep(timeout.min(POLL_MODE_NAP));
                Ok(false)
            }
        }
    }
}

/// Blocks until one of `fds` (at most 64) is readable or `timeout` passes
/// ([`std::time::Duration::MAX`]: no limit); bit `i` of the result:
/// `fds[i]` is readable. A signal ends the wait with
/// [`io::ErrorKind::Interrupted`].
pub fn wait_fds(
    fds: &[std::os::fd::BorrowedFd<'_>],
    timeout: std::time::Duration,
) -> io::Result<u64> {
    let mut raw = [-1; 64];
    let n = raw_fds(fds, &mut raw);
    sys::wait_which(&raw[..n], timeout)
}

/// The descriptors of `fds` into `raw` (on the stack: an engine waits once
/// per idle step); how many fit.
fn raw_fds(fds: &[std::os::fd::BorrowedFd<'_>], raw: &mut [std::os::fd::RawFd]) -> usize {
    use std::os::fd::AsRawFd;
    let n = fds.len().min(raw.len());
    for (r, f) in raw.iter_mut().zip(&fds[..n]) {
        *r = f.as_raw_fd();
    }
    n
}

/// What woke a [`Readiness::wait_with`]: the port, and which of the other
/// descriptors (bit `i` for `also[i]`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Woken {
    /// The port has traffic.
    pub port: bool,
    /// Bit `i`: `also[i]` is readable.
    pub also: u64,
}

impl Readiness {
    /// Whether the port can be waited on (not a poll-mode port).
    pub fn waitable(&self) -> bool {
        self.0.is_some()
    }

    /// A [`PortWatch`] over this port (`None` for a poll-mode port, which
    /// nothing can wait on).
    pub fn watch(&self) -> io::Result<Option<PortWatch>> {
        let Some(fd) = &self.0 else {
            return Ok(None);
        };
        let w = PortWatch {
            ep: sys::epoll()?,
            port: fd.try_clone()?,
        };
        // In the set from the start, reporting nothing: turning the watch
        // on or off is then an `EPOLL_CTL_MOD`, not an add of one epoll
        // instance to another (which runs the kernel's loop check under a
        // global lock) and a delete, twice per event-driven round trip.
        sys::epoll_add_events(&w.ep, &w.port, 0)?;
        Ok(Some(w))
    }

    /// Blocks until the port (when `port` is true and it can be waited on)
    /// or one of `also` (at most 63) is readable, or `timeout` passes
    /// ([`std::time::Duration::MAX`]: no limit); says which woke. A signal
    /// ends the wait with [`io::ErrorKind::Interrupted`], so that a caller
    /// blocked for an application (`ibv_get_cq_event`) can report EINTR. A
    /// poll-mode port asked for naps 50 us at most and says
    /// `port: true` (the caller looks at it).
    pub fn wait_with(
        &self,
        port: bool,
        also: &[std::os::fd::BorrowedFd<'_>],
        timeout: std::time::Duration,
    ) -> io::Result<Woken> {
        use std::os::fd::AsRawFd;
        // The last slot is the port's.
        let mut fds = [-1; 64];
        let n = raw_fds(also, &mut fds[..63]);
        let (timeout, nap, len) = match (&self.0, port) {
            (Some(fd), true) => {
                fds[n] = fd.as_raw_fd();
                (timeout, false, n + 1)
            }
            (None, true) => (timeout.min(POLL_MODE_NAP), true, n),
            _ => (timeout, false, n),
        };
        let ready = sys::wait_which(&fds[..len], timeout)?;
        Ok(Woken {
            port: nap || (len > n && ready & (1 << n) != 0),
            also: ready & ((1u64 << n) - 1),
        })
    }
}

/// A descriptor that polls readable when a port has traffic *while it is
/// watched* ([`PortWatch::set`]): an epoll instance that holds the port's
/// readiness descriptor or not. A thread that waits on it learns of the
/// port's traffic only while another thread wants it to, and that thread
/// turns the watch on or off without waking the waiter (unless traffic
/// already waits).
///
/// ```
/// use burst_io::Port;
/// use std::os::fd::AsFd;
/// let port = burst_io::UdpPort::bind("127.0.150.1".parse().unwrap()).unwrap();
/// let watch = port.readiness().unwrap().watch().unwrap().unwrap();
/// let peer = std::net::UdpSocket::bind("127.0.150.2:0").unwrap();
/// peer.send_to(b"x", port.local_addr()).unwrap();
/// let wait = || burst_io::wait_fds(&[watch.as_fd()], std::time::Duration::from_millis(200)).unwrap();
/// assert_eq!(wait(), 0, "not watched");
/// watch.set(true).unwrap();
/// assert_eq!(wait(), 1, "watched, traffic waits");
/// watch.set(false).unwrap();
/// assert_eq!(wait(), 0);
/// ```
#[derive(Debug)]
pub struct PortWatch {
    ep: std::os::fd::OwnedFd,
    port: std::os::fd::OwnedFd,
}

impl PortWatch {
    /// Watches the port (`true`) or stops (`false`); either twice is the
    /// same as once.
    pub fn set(&self, on: bool) -> io::Result<()> {
        let events = if on { libc::EPOLLIN as u32 } else { 0 };
        sys::epoll_mod(&self.ep, &self.port, events)
    }
}

impl std::os::fd::AsFd for PortWatch {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.ep.as_fd()
    }
}

/// Socket buffer size asked for (see `sys::set_buffers`): a sender's whole
/// window toward one peer must fit in the receiver's queue, and burst's
/// largest (`burst_cc::LossWindowConfig::default().max`, 8,192 packets of
/// up to 4 KiB) is ~34 MB of payload, more in the kernel's accounting.
/// At 16 MiB a receiver that fell behind dropped whole GRO runs (170-240 a
/// run at 64 and 10,240 QPs over veth), each a window cut, and tails lost
/// past the probes waited out ACK timers; at 64 MiB none (docs/performance.md).
/// Memory is taken only while datagrams wait.
pub const SOCKET_BUFFER: usize = 64 << 20;

/// A UDP socket port bound to `addr:4791`, and to the multicast groups it
/// joined (a socket each).
#[derive(Debug)]
pub struct UdpPort {
    sock: UdpSocket,
    local: SocketAddr,
    /// Send runs of packets as one GSO message (`UDP_SEGMENT`).
    gso: bool,
    /// The joined groups' sockets.
    groups: Vec<(IpAddr, UdpSocket)>,
    /// Sockets of the other addresses the port serves ([`Port::add_address`]).
    addresses: Vec<(IpAddr, UdpSocket)>,
    /// Readable when any of the port's sockets is: what [`Port::readiness`]
    /// hands out, so a sleeping engine wakes for a group joined later too.
    epoll: std::os::fd::OwnedFd,
    /// What [`Port::recv_frames`] receives into and lends from.
    rx: Option<RxBatch>,
    /// Receives since the other sockets were last asked about.
    since_others: u32,
}

/// A port with other sockets asks epoll about them at least every this
/// many receives, and after half as many when its own socket is empty.
const OTHERS_EVERY: u32 = 16;

impl UdpPort {
    /// Binds UDP port 4791 on `ip` (which must be an address of this host),
    /// non-blocking, with DF set so that Linux sends IP ID 0.
    pub fn bind(ip: IpAddr) -> io::Result<UdpPort> {
        UdpPort::bind_port(ip, ROCEV2_PORT)
    }

    /// `lanes` sockets on `ip:4791`, one per engine thread, in one
    /// `SO_REUSEPORT` group whose classic BPF program gives socket `k` the
    /// packets whose destination QPN `q` has `(q - first_qpn) % lanes == k`
    /// (the engine numbers each thread's QPs so). One lane is [`UdpPort::bind`].
    pub fn bind_lanes(ip: IpAddr, lanes: usize, first_qpn: u32) -> io::Result<Vec<UdpPort>> {
        UdpPort::bind_lanes_on(ip, ROCEV2_PORT, lanes, first_qpn)
    }

    /// [`UdpPort::bind_lanes`] on another UDP port (tests).
    pub fn bind_lanes_on(
        ip: IpAddr,
        port: u16,
        lanes: usize,
        first_qpn: u32,
    ) -> io::Result<Vec<UdpPort>> {
        if lanes <= 1 {
            return Ok(vec![UdpPort::bind_port(ip, port)?]);
        }
        // GRO would merge consecutive datagrams of one flow (4791 to 4791:
        // every QP between two hosts) before steering: lanes receive each
        // datagram on its own (senders cut GSO runs per QP, see gso_run).
        let at = SocketAddr::new(ip, port);
        let socks = (0..lanes)
            .map(|_| sys::bind_reuseport(at).map_err(|e| bind_error(e, ip, port)))
            .collect::<io::Result<Vec<_>>>()?;
        sys::attach_qpn_steering(&socks[0], lanes as u32, first_qpn).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("burst-io: steering {lanes} sockets by QPN on {at}: {e}"),
            )
        })?;
        socks
            .into_iter()
            .map(|s| {
                let p = UdpPort::from_socket(s)?;
                sys::set_udp_opt(&p.sock, libc::UDP_GRO, 0);
                Ok(p)
            })
            .collect()
    }

    /// As [`UdpPort::bind`] on another UDP port (tests that cannot own 4791).
    pub fn bind_port(ip: IpAddr, port: u16) -> io::Result<UdpPort> {
        let sock =
            UdpSocket::bind(SocketAddr::new(ip, port)).map_err(|e| bind_error(e, ip, port))?;
        UdpPort::from_socket(sock)
    }

    /// A port over a bound socket (see [`prepare`]).
    fn from_socket(sock: UdpSocket) -> io::Result<UdpPort> {
        let gso = prepare(&sock)? && std::env::var_os("BURST_NO_GSO").is_none();
        let local = sock.local_addr()?;
        let epoll = sys::epoll()?;
        sys::epoll_add(&epoll, &sock)?;
        Ok(UdpPort {
            sock,
            local,
            gso,
            groups: Vec::new(),
            addresses: Vec::new(),
            epoll,
            rx: None,
            since_others: 0,
        })
    }

    /// Appends what the group sockets hold to `rx` (a copy each: multicast
    /// is rare next to the unicast batch).
    fn recv_groups(&mut self, rx: &mut RxBatch) {
        let mut buf = [0u8; MAX_PACKET];
        for (dest, sock) in &self.groups {
            while let Ok((n, peer)) = sock.recv_from(&mut buf) {
                let meta = RxMeta {
                    peer,
                    ip_id: None,
                    ecn: 0,
                    icrc_verified: false,
                    pseudo_crc: None,
                    dest: Some(*dest),
                };
                if !rx.push(meta, &buf[..n]) {
                    return;
                }
            }
        }
    }

    /// The socket packets from `src` leave through.
    fn socket_for(&self, src: Option<IpAddr>) -> Option<&UdpSocket> {
        match src {
            None => Some(&self.sock),
            Some(ip) if ip == self.local.ip() => Some(&self.sock),
            Some(ip) => self
                .addresses
                .iter()
                .find(|(a, _)| *a == ip)
                .map(|(_, s)| s),
        }
    }
}

/// Sets a bound socket up as a port's: non-blocking, DF, large buffers,
/// GRO, ECN, multicast out of its address's interface, IPv6 zero UDP
/// checksums accepted; returns whether the kernel has GSO for it.
fn prepare(sock: &UdpSocket) -> io::Result<bool> {
    let ip = sock.local_addr()?.ip();
    sock.set_nonblocking(true)?;
    sys::set_df(sock, ip.is_ipv4())?;
    sys::set_buffers(sock, SOCKET_BUFFER);
    // Coalesced receive is optional: without it each packet is its own
    // datagram, which RxBatch handles the same way.
    sys::set_udp_opt(sock, libc::UDP_GRO, 1);
    // Best effort: without it packets leave Not-ECT and CE goes unseen.
    let _ = sys::set_ecn(sock, ip.is_ipv4());
    match ip {
        IpAddr::V4(v4) => sys::set_multicast_if(sock, v4),
        // RoCE v2 senders (RXE, RNICs) leave the UDP checksum 0 over
        // IPv6 too (the ICRC covers the packet); Linux drops such
        // datagrams unless the socket accepts them.
        IpAddr::V6(_) => {
            sys::set_udp_opt(sock, sys::UDP_NO_CHECK6_RX, 1);
        }
    }
    Ok(sys::gso_supported(sock))
}

impl UdpPort {
    /// Blocks until a datagram is waiting or `timeout` passes; returns
    /// whether one is (for event-driven receivers; the port itself never
    /// blocks).
    pub fn wait_readable(&self, timeout: std::time::Duration) -> io::Result<bool> {
        use std::os::fd::AsRawFd;
        sys::wait_readable(self.sock.as_raw_fd(), timeout)
    }

    /// Whether sends use GSO (off where the kernel lacks `UDP_SEGMENT`, or
    /// with `BURST_NO_GSO` set in the environment).
    pub fn gso(&self) -> bool {
        self.gso
    }

    /// Turns GSO off or back on (if the kernel supports it).
    pub fn set_gso(&mut self, on: bool) {
        self.gso = on && sys::gso_supported(&self.sock);
    }

    /// Computes and stores the ICRC of a transport packet about to be sent
    /// alone to `dst` from this port (IP ID 0, as the kernel will send it).
    /// For bursts, use [`UdpPort::seal_burst`].
    pub fn seal(&self, dst: SocketAddr, ib: &mut [u8]) -> io::Result<()> {
        seal(self.local, dst, ib, 0)
    }

    /// Seals every packet of a burst about to go to [`Port::send_burst`]
    /// unchanged ([`Port::assign_ip_ids`], then [`seal`] each). Stops at the
    /// first packet that cannot be sealed (shorter than BTH + ICRC, or of
    /// the other address family) and returns how many are sealed.
    pub fn seal_burst(&self, bufs: &mut [PacketBuf]) -> usize {
        self.assign_ip_ids(bufs);
        seal_all(self.local, bufs)
    }
}

/// A bind failure with what it usually means.
fn bind_error(e: io::Error, ip: IpAddr, port: u16) -> io::Error {
    let hint = match e.kind() {
        io::ErrorKind::AddrInUse => {
            "UDP port in use (another RoCEv2 stack, kernel RXE, or another burst device on \
             this interface: each serves all of its interface's addresses as GIDs; share \
             one device through burstd)"
        }
        io::ErrorKind::AddrNotAvailable => "address is not on this host",
        io::ErrorKind::PermissionDenied => "permission denied",
        _ => "bind failed",
    };
    io::Error::new(
        e.kind(),
        format!("burst-io: cannot bind {ip}:{port}: {hint}: {e}"),
    )
}

/// Computes and stores the ICRC of transport packet `ib` (BTH through
/// ICRC) sent from `src` to `dst` with IPv4 identification `ip_id`.
pub fn seal(src: SocketAddr, dst: SocketAddr, ib: &mut [u8], ip_id: u16) -> io::Result<()> {
    seal_with(src, dst, ib, ip_id, None)
}

/// [`seal`] for a packet whose payload's CRC-32 is known (`payload`): the
/// headers' CRC is joined to it ([`burst_dsa::crc::combine`]) and continued
/// over the pad, so the payload is not read again.
pub fn seal_with(
    src: SocketAddr,
    dst: SocketAddr,
    ib: &mut [u8],
    ip_id: u16,
    payload: Option<PayloadCrc>,
) -> io::Result<()> {
    let invalid = |e: String| io::Error::new(io::ErrorKind::InvalidInput, e);
    if ib.len() < BTH_LEN + ICRC_LEN {
        return Err(invalid("packet shorter than BTH + ICRC".into()));
    }
    let n = ib.len();
    let crc = match payload {
        Some(p) if p.at + p.len <= n - ICRC_LEN => {
            let head = icrc::for_udp_payload_head(src, dst, ib, ip_id, p.at)
                .map_err(|e| invalid(e.to_string()))?;
            let crc = burst_dsa::crc::combine(head, p.crc, p.len as u64);
            burst_dsa::crc::continued(crc, &ib[p.at + p.len..n - ICRC_LEN])
        }
        Some(_) => return Err(invalid("payload CRC range leaves the packet".into())),
        None => icrc::for_udp_payload(src, dst, ib, ip_id).map_err(|e| invalid(e.to_string()))?,
    };
    ib[n - ICRC_LEN..].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// [`seal`] for each packet of `bufs` (with its [`PacketBuf::ip_id`] and
/// [`PacketBuf::payload_crc`]), sent from `src` (or its
/// [`PacketBuf::src`]); returns how many were sealed before the first
/// failure.
pub fn seal_all(src: SocketAddr, bufs: &mut [PacketBuf]) -> usize {
    for (i, b) in bufs.iter_mut().enumerate() {
        let (peer, len, id) = (b.peer, b.len, b.ip_id);
        let from = b.src.map_or(src, |ip| SocketAddr::new(ip, src.port()));
        if seal_with(from, peer, &mut b.data[..len], id, b.payload_crc).is_err() {
            return i;
        }
    }
    bufs.len()
}

impl Port for UdpPort {
    fn local_addr(&self) -> SocketAddr {
        self.local
    }

    fn counters(&self) -> PortCounters {
        // The kernel filters for a socket: what it counts is what it
        // dropped (a full receive buffer), one system call per socket, only
        // when asked.
        let sockets = std::iter::once(&self.sock)
            .chain(self.groups.iter().map(|(_, s)| s))
            .chain(self.addresses.iter().map(|(_, s)| s));
        PortCounters {
            rx_dropped: sockets.map(sys::socket_drops).sum(),
            ..PortCounters::default()
        }
    }

    fn recv_frames(&mut self, max: usize, visit: &mut RxVisit<'_>) -> io::Result<usize> {
        // The socket's datagrams land in the port's own batch and are lent
        // from there (allocated at the first call: 2 MiB).
        let mut rx = self.rx.take().unwrap_or_else(|| RxBatch::new(max));
        let got = self.recv_batch(&mut rx);
        if got.is_ok() {
            for (meta, bytes) in rx.frames() {
                visit(meta, bytes);
            }
        }
        self.rx = Some(rx);
        got
    }

    fn recv_batch(&mut self, rx: &mut RxBatch) -> io::Result<usize> {
        use std::os::fd::AsRawFd;
        let asked = rx.want;
        rx.msgs.clear();
        if self.addresses.is_empty() && self.groups.is_empty() {
            sys::recv_batch(&self.sock, rx, asked, None)?;
            rx.adapt(asked);
            return Ok(rx.count());
        }
        // Several sockets (an interface's IPv6 link-local address beside
        // its IPv4 one, groups). The port's own carries the traffic: it is
        // read first with no question asked, so a polled step that finds
        // its datagram there costs one system call, as a one-socket port
        // (an epoll_wait before each recvmmsg put a system call on every
        // ping-pong's path). The others, rare, are asked about with one
        // call (not one per socket) when the own socket was empty for a
        // while or, under load, every OTHERS_EVERY receives.
        sys::recv_batch(&self.sock, rx, asked, None)?;
        rx.adapt(asked);
        self.since_others += 1;
        let due = if rx.msgs.is_empty() {
            self.since_others >= OTHERS_EVERY / 2
        } else {
            self.since_others >= OTHERS_EVERY
        };
        if !due {
            return Ok(rx.count());
        }
        self.since_others = 0;
        let mut ready = [0; 16];
        let n = sys::epoll_ready(&self.epoll, &mut ready)?;
        let all = n == ready.len();
        let has = |fd: std::os::fd::RawFd| all || ready[..n].contains(&fd);
        // The other addresses' datagrams after the port's own, batched and
        // coalesced the same way.
        for (ip, sock) in &self.addresses {
            if has(sock.as_raw_fd()) {
                sys::recv_batch(sock, rx, BURST, Some(*ip))?;
            }
        }
        if self.groups.iter().any(|(_, g)| has(g.as_raw_fd())) {
            self.recv_groups(rx);
        }
        Ok(rx.count())
    }

    fn assign_ip_ids(&self, bufs: &mut [PacketBuf]) {
        gso_ip_ids(bufs, self.gso);
    }

    fn send_burst(&mut self, bufs: &[PacketBuf]) -> io::Result<usize> {
        if self.addresses.is_empty() {
            return sys::send_burst(&self.sock, bufs, self.gso);
        }
        // Each run of packets from one source through that address's socket.
        let mut sent = 0;
        while sent < bufs.len() {
            let src = bufs[sent].src;
            let run = bufs[sent..].iter().take_while(|b| b.src == src).count();
            let Some(sock) = self.socket_for(src) else {
                // An address no longer served: dropped, as by a full link.
                tracing::debug!("send from {src:?}: the port does not serve it");
                sent += run;
                continue;
            };
            let k = sys::send_burst(sock, &bufs[sent..sent + run], self.gso)?;
            sent += k;
            if k < run {
                break;
            }
        }
        Ok(sent)
    }

    fn readiness(&self) -> io::Result<Readiness> {
        Ok(Readiness::from_fd(self.epoll.try_clone()?))
    }

    fn add_address(&mut self, addr: SocketAddr) -> io::Result<()> {
        let ip = addr.ip();
        if ip == self.local.ip() || self.addresses.iter().any(|(a, _)| *a == ip) {
            return Ok(());
        }
        let at = SocketAddr::new(ip, self.local.port());
        let at = match (at, addr) {
            (SocketAddr::V6(mut v), SocketAddr::V6(s)) => {
                v.set_scope_id(s.scope_id());
                SocketAddr::V6(v)
            }
            (a, _) => a,
        };
        let sock = sys::bind_freebind(at).map_err(|e| bind_error(e, ip, at.port()))?;
        prepare(&sock)?;
        sys::epoll_add(&self.epoll, &sock)?;
        self.addresses.push((ip, sock));
        Ok(())
    }

    fn remove_address(&mut self, ip: IpAddr) {
        // Closing the socket takes it out of the epoll set.
        self.addresses.retain(|(a, _)| *a != ip);
    }

    fn join_multicast(&mut self, group: IpAddr) -> io::Result<()> {
        if !group.is_multicast() || group.is_ipv4() != self.local.is_ipv4() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("burst-io: {group} is not a multicast group of the port's family"),
            ));
        }
        if self.groups.iter().any(|(g, _)| *g == group) {
            return Ok(());
        }
        let sock = sys::bind_group(SocketAddr::new(group, self.local.port()))?;
        match (group, self.local.ip()) {
            (IpAddr::V4(g), IpAddr::V4(me)) => sock.join_multicast_v4(&g, &me)?,
            // Interface 0: the kernel picks it by route.
            (IpAddr::V6(g), _) => {
                sock.join_multicast_v6(&g, 0)?;
                sys::set_udp_opt(&sock, sys::UDP_NO_CHECK6_RX, 1);
            }
            _ => {}
        }
        sock.set_nonblocking(true)?;
        sys::set_buffers(&sock, SOCKET_BUFFER);
        sys::epoll_add(&self.epoll, &sock)?;
        self.groups.push((group, sock));
        Ok(())
    }

    fn leave_multicast(&mut self, group: IpAddr) -> io::Result<()> {
        // Closing the socket leaves the group and takes it out of the epoll set.
        self.groups.retain(|(g, _)| *g != group);
        Ok(())
    }
}
