//! # burst-io: packet ports
//!
//! A [`Port`] moves RoCEv2 transport packets (UDP payloads: BTH through ICRC)
//! in bursts, with the addresses the ICRC needs. [`UdpPort`] is the portable
//! default: a UDP socket bound to port 4791, batched with `recvmmsg` and
//! `sendmmsg`, needing no privilege beyond the bind.
//!
//! **Segmentation offload.** Per-datagram system calls cap a UDP socket at
//! about 0.7 M packets/s here, while the kernel moves 5 M segments/s when it
//! segments and coalesces itself (`../shared/design/dataplane-notes.md`). So
//! [`UdpPort`] sends each run of consecutive equal-length packets to one peer
//! as one `UDP_SEGMENT` (GSO) message, and asks for `UDP_GRO` on receive:
//! [`RxBatch`] hands out the coalesced datagrams segment by segment.
//!
//! **The IP ID.** The ICRC covers the IPv4 identification field, which a UDP
//! socket lets the kernel choose. Linux sends ID 0 for a DF-marked datagram
//! of an unconnected socket, and the segments of one GSO message get IDs
//! 0, 1, 2, … (checked with a capture, docs/performance.md). So [`UdpPort`]
//! sets `IP_PMTUDISC_DO` and [`UdpPort::seal_burst`] computes each packet's
//! ICRC with its index in its GSO run as the ID; the runs are cut by one
//! rule ([`gso_run`]) that sealing and sending share. On receive the ID is
//! not visible through the socket: [`UdpPort::check_icrc`] verifies packets
//! sent with ID 0 at full strength; for others it solves for the ID: the CRC
//! is affine in the 16 ID bits, so the stored ICRC is consistent with *some*
//! ID exactly when `stored ^ icrc(ID=0)` lies in the span of the 16 bit-flip
//! syndromes (precomputed once per packet length). That keeps 16 of the
//! ICRC's 32 bits of protection for peers like RXE whose IP IDs count.

mod sys;

use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};

use burst_wire::{emit_ip_udp, icrc, IpRepr, UdpRepr, BTH_LEN, ICRC_LEN, ROCEV2_PORT};

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

/// A packet buffer of a port's pool.
pub struct PacketBuf {
    /// Storage.
    pub data: Box<[u8; MAX_PACKET]>,
    /// Bytes used.
    pub len: usize,
    /// Peer address (source on receive, destination on send).
    pub peer: SocketAddr,
}

impl PacketBuf {
    /// An empty buffer.
    pub fn new() -> PacketBuf {
        PacketBuf {
            data: Box::new([0; MAX_PACKET]),
            len: 0,
            peer: SocketAddr::from(([0, 0, 0, 0], 0)),
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

/// Burst receive and transmit of RoCEv2 transport packets.
pub trait Port {
    /// The local address packets are sent from and received on.
    fn local_addr(&self) -> SocketAddr;
    /// Receives a burst of datagrams into `rx` without blocking (replacing
    /// what it held); returns how many packets (segments) it now holds.
    fn recv_batch(&mut self, rx: &mut RxBatch) -> io::Result<usize>;
    /// Sends `bufs` (each to its `peer`); returns how many were sent, always
    /// a whole number of GSO runs (see [`gso_run`]), so that a caller may
    /// retry from there.
    fn send_burst(&mut self, bufs: &[PacketBuf]) -> io::Result<usize>;
}

/// How many packets from the start of `bufs` go out as one GSO message:
/// the same peer, the same length except for a shorter last one after at
/// least two, at most
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
    let mut n = 1;
    while n < bufs.len().min(max) {
        let b = &bufs[n];
        // A shorter packet closes a run of two or more (a message's last
        // packet), but does not join a lone packet: that pairs a reply with
        // the ACK sent after it, and the peer would get the reply only
        // together with the ACK (measured: ping-pong p50 +0.3 us on veth).
        if b.peer != first.peer || b.len > seg || b.len == 0 || (b.len < seg && n < 2) {
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
            .flat_map(|(m, b)| b[..m.len].chunks(m.seg.max(1)).map(move |p| (m.peer, p)))
    }

    /// Datagrams (system-level messages) the last call received.
    pub fn datagrams(&self) -> usize {
        self.msgs.len()
    }

    fn count(&self) -> usize {
        self.msgs.iter().map(|m| m.len.div_ceil(m.seg.max(1))).sum()
    }
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

/// Waits for a [`UdpPort`]'s datagrams without receiving them (see
/// [`UdpPort::readiness`]): lets an engine thread sleep until traffic comes.
#[derive(Debug)]
pub struct Readiness(UdpSocket);

impl Readiness {
    /// Blocks until a datagram is waiting or `timeout` passes; returns
    /// whether one is.
    pub fn wait(&self, timeout: std::time::Duration) -> io::Result<bool> {
        sys::wait_readable(&self.0, timeout)
    }
}

/// Outcome of an ICRC check on a port that cannot see the IP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IcrcCheck {
    /// Verified with IP ID 0 (full 32-bit check).
    Ok,
    /// Consistent with the given IPv4 ID (16-bit strength: the ID is solved
    /// for, not known).
    OkWithId(u16),
    /// Wrong for every possible IP ID: drop the packet.
    Bad,
    /// Cannot be checked (IPv6 peer with a non-matching flow label, or a
    /// packet too short to hold an ICRC).
    Unverifiable,
}

/// The 16 ICRC syndromes of flipping each IPv4 ID bit, for one ICRC input
/// length, reduced to a basis for solving.
#[derive(Debug, Clone, Default)]
struct IdBasis {
    /// (vector, combination of ID bits producing it), distinct pivots.
    rows: Vec<(u32, u16)>,
}

impl IdBasis {
    /// `n`: bytes the ICRC covers; the IPv4 ID sits at bytes 12..14 of that
    /// input (after the 8 bytes standing for the LRH).
    fn new(n: usize) -> IdBasis {
        let zero = vec![0u8; n];
        let z = crc32fast::hash(&zero);
        let mut e = zero;
        let mut b = IdBasis::default();
        for bit in 0..16u16 {
            let (byte, mask) = (12 + usize::from(1 - bit / 8), 1u8 << (bit % 8));
            e[byte] ^= mask;
            let v = crc32fast::hash(&e) ^ z;
            e[byte] ^= mask;
            b.insert(v, 1 << bit);
        }
        b
    }

    fn insert(&mut self, mut v: u32, mut m: u16) {
        for &(r, rm) in &self.rows {
            if v & (1 << (31 - r.leading_zeros())) != 0 {
                v ^= r;
                m ^= rm;
            }
        }
        if v != 0 {
            self.rows.push((v, m));
            // Highest pivot first, so each reduction step only touches lower bits.
            self.rows.sort_by_key(|r| r.0.leading_zeros());
        }
    }

    /// The ID whose syndrome is `d`, if any.
    fn solve(&self, mut d: u32) -> Option<u16> {
        let mut m = 0u16;
        for &(r, rm) in &self.rows {
            if d & (1 << (31 - r.leading_zeros())) != 0 {
                d ^= r;
                m ^= rm;
            }
        }
        (d == 0).then_some(m)
    }
}

/// Socket buffer size asked for (see `sys::set_buffers`).
pub const SOCKET_BUFFER: usize = 16 << 20;

/// A UDP socket port bound to `addr:4791`.
#[derive(Debug)]
pub struct UdpPort {
    sock: UdpSocket,
    local: SocketAddr,
    /// Syndrome bases by ICRC input length (see [`UdpPort::check_icrc`]).
    id_bases: std::collections::HashMap<usize, IdBasis>,
    /// Send runs of packets as one GSO message (`UDP_SEGMENT`).
    gso: bool,
}

impl UdpPort {
    /// Binds UDP port 4791 on `ip` (which must be an address of this host),
    /// non-blocking, with DF set so that Linux sends IP ID 0.
    pub fn bind(ip: IpAddr) -> io::Result<UdpPort> {
        UdpPort::bind_port(ip, ROCEV2_PORT)
    }

    /// As [`UdpPort::bind`] on another UDP port (tests that cannot own 4791).
    pub fn bind_port(ip: IpAddr, port: u16) -> io::Result<UdpPort> {
        let sock = UdpSocket::bind(SocketAddr::new(ip, port)).map_err(|e| {
            let hint = match e.kind() {
                io::ErrorKind::AddrInUse => {
                    "UDP port in use (another RoCEv2 stack, or kernel RXE on this address?)"
                }
                io::ErrorKind::AddrNotAvailable => "address is not on this host",
                io::ErrorKind::PermissionDenied => "permission denied",
                _ => "bind failed",
            };
            io::Error::new(
                e.kind(),
                format!("burst-io: cannot bind {ip}:{port}: {hint}: {e}"),
            )
        })?;
        sock.set_nonblocking(true)?;
        sys::set_df(&sock, ip.is_ipv4())?;
        sys::set_buffers(&sock, SOCKET_BUFFER);
        // Coalesced receive is optional: without it each packet is its own
        // datagram, which RxBatch handles the same way.
        sys::set_udp_opt(&sock, libc::UDP_GRO, 1);
        let gso = sys::gso_supported(&sock) && std::env::var_os("BURST_NO_GSO").is_none();
        let local = sock.local_addr()?;
        Ok(UdpPort {
            sock,
            local,
            id_bases: std::collections::HashMap::new(),
            gso,
        })
    }

    /// Blocks until a datagram is waiting or `timeout` passes; returns
    /// whether one is (for event-driven receivers; the port itself never
    /// blocks).
    pub fn wait_readable(&self, timeout: std::time::Duration) -> io::Result<bool> {
        sys::wait_readable(&self.sock, timeout)
    }

    /// A handle that waits for this port's datagrams from another thread
    /// (a duplicate of the socket), while the port itself is in use.
    pub fn readiness(&self) -> io::Result<Readiness> {
        Ok(Readiness(self.sock.try_clone()?))
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

    /// The ICRC `ib` has when sent from `src` to `dst` as the kernel builds
    /// the headers (IP ID `ip_id`, DF; the UDP checksum is masked anyway).
    fn pseudo(&self, src: SocketAddr, dst: SocketAddr, ib: &[u8], ip_id: u16) -> Option<u32> {
        let ip = match (src.ip(), dst.ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let mut ip = IpRepr::v4(s, d);
                if let IpRepr::V4(v) = &mut ip {
                    v.ident = ip_id;
                }
                ip
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => IpRepr::v6(s, d),
            _ => return None,
        };
        let udp = UdpRepr {
            src_port: src.port(),
            dst_port: dst.port(),
            checksum: 0,
        };
        let mut hdr = [0u8; 48];
        let n = emit_ip_udp(&ip, &udp, 8 + ib.len(), &mut hdr).ok()?;
        let ip_len = ip.header_len();
        icrc::compute(&hdr[..ip_len], &hdr[ip_len..n], &ib[..ib.len() - ICRC_LEN]).ok()
    }

    /// Computes and stores the ICRC of a transport packet about to be sent
    /// alone to `dst` from this port (IP ID 0, as the kernel will send it).
    /// For bursts, use [`UdpPort::seal_burst`].
    pub fn seal(&self, dst: SocketAddr, ib: &mut [u8]) -> io::Result<()> {
        self.seal_with_id(dst, ib, 0)
    }

    /// Seals every packet of a burst about to go to [`Port::send_burst`]
    /// unchanged: the ID of each is its index in its GSO run. Stops at the
    /// first packet that cannot be sealed (shorter than BTH + ICRC, or of
    /// the other address family) and returns how many are sealed.
    pub fn seal_burst(&self, bufs: &mut [PacketBuf]) -> usize {
        let mut i = 0;
        while i < bufs.len() {
            let run = gso_run(&bufs[i..], self.gso);
            for (k, b) in bufs[i..i + run].iter_mut().enumerate() {
                let (peer, len) = (b.peer, b.len);
                if self
                    .seal_with_id(peer, &mut b.data[..len], k as u16)
                    .is_err()
                {
                    return i + k;
                }
            }
            i += run;
        }
        i
    }

    fn seal_with_id(&self, dst: SocketAddr, ib: &mut [u8], ip_id: u16) -> io::Result<()> {
        if ib.len() < BTH_LEN + ICRC_LEN {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "packet shorter than BTH + ICRC",
            ));
        }
        let crc = self.pseudo(self.local, dst, ib, ip_id).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "address family mismatch")
        })?;
        let n = ib.len();
        ib[n - ICRC_LEN..].copy_from_slice(&crc.to_le_bytes());
        Ok(())
    }

    /// Checks the ICRC of a packet received from `src`: exactly when the
    /// sender used IP ID 0, else by solving for the ID (IPv4).
    pub fn check_icrc(&mut self, src: SocketAddr, ib: &[u8]) -> IcrcCheck {
        if ib.len() < BTH_LEN + ICRC_LEN {
            return IcrcCheck::Unverifiable;
        }
        let n = ib.len();
        let stored = u32::from_le_bytes([ib[n - 4], ib[n - 3], ib[n - 2], ib[n - 1]]);
        let Some(c0) = self.pseudo(src, self.local, ib, 0) else {
            return IcrcCheck::Unverifiable;
        };
        if c0 == stored {
            return IcrcCheck::Ok;
        }
        if !src.is_ipv4() {
            return IcrcCheck::Unverifiable;
        }
        // 8 bytes for the LRH, 20 IPv4, 8 UDP, then BTH..pad.
        let len = 8 + 20 + 8 + n - ICRC_LEN;
        let basis = self
            .id_bases
            .entry(len)
            .or_insert_with(|| IdBasis::new(len));
        match basis.solve(stored ^ c0) {
            Some(id) => IcrcCheck::OkWithId(id),
            None => IcrcCheck::Bad,
        }
    }
}

impl Port for UdpPort {
    fn local_addr(&self) -> SocketAddr {
        self.local
    }

    fn recv_batch(&mut self, rx: &mut RxBatch) -> io::Result<usize> {
        let asked = rx.want;
        sys::recv_batch(&self.sock, rx, asked)?;
        rx.adapt(asked);
        Ok(rx.count())
    }

    fn send_burst(&mut self, bufs: &[PacketBuf]) -> io::Result<usize> {
        sys::send_burst(&self.sock, bufs, self.gso)
    }
}
