//! Invariant CRC of RoCEv2 (IBA annex A17.3.3).
//!
//! The ICRC is the IEEE CRC-32 over: 8 bytes of 0xFF standing in for the
//! InfiniBand LRH, the IP header with its variant fields set to ones (IPv4:
//! TOS, TTL, header checksum; IPv6: traffic class, flow label, hop limit), the
//! UDP header with its checksum set to ones, the BTH with byte 4 (FECN, BECN,
//! reserved) set to ones, and everything after the BTH up to the ICRC. It is
//! stored least significant byte first.
//!
//! Own code rather than a generic helper because it sits on the per-packet hot
//! path: the masked prefix (at most 88 bytes) is assembled on the stack so
//! crc32fast sees two contiguous updates (one for a short packet, copied
//! next to the prefix), and a long payload is never copied.

use std::collections::HashMap;

use rustc_hash::FxHashMap;
use std::net::{IpAddr, SocketAddr};

use crate::bth::BTH_LEN;
use crate::error::{check_len, Result};
use crate::{emit_ip_udp, Error, IpRepr, UdpRepr, ICRC_LEN};

/// Longest IP header the ICRC code accepts (IPv4 with options).
const MAX_IP_HEADER: usize = 60;
const UDP_LEN: usize = 8;
/// Stack buffer for the masked prefix (at most 88 bytes) and, for a short
/// packet, what follows the BTH (see [`compute`]).
const FUSED: usize = 128;
const _: () = assert!(FUSED >= 8 + MAX_IP_HEADER + UDP_LEN + BTH_LEN);

/// Computes the ICRC.
///
/// * `ip_header`: the IPv4 header (with options) or the 40-byte IPv6 header,
///   as on the wire (its length fields must already be final);
/// * `udp_header`: the 8-byte UDP header (length final, checksum ignored);
/// * `ib`: BTH through pad, without the ICRC.
///
/// ```
/// // A packet built by the codec verifies; see `RoceFrame` for whole frames.
/// let ip = [0x45u8, 0, 0, 48, 0, 0, 0x40, 0, 64, 17, 0, 0, 198, 18, 0, 1, 198, 18, 0, 2];
/// let udp = [0xc0, 0, 0x12, 0xb7, 0, 28, 0, 0];
/// let bth = [0x11u8, 0x00, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 1];
/// let aeth = [0x1f, 0, 0, 1];
/// let ib: Vec<u8> = bth.iter().chain(aeth.iter()).copied().collect();
/// let c = burst_wire::icrc::compute(&ip, &udp, &ib).unwrap();
/// let mut masked_bth = bth;
/// masked_bth[4] = 0x3f; // FECN/BECN/reserved are masked: same ICRC
/// let ib2: Vec<u8> = masked_bth.iter().chain(aeth.iter()).copied().collect();
/// assert_eq!(burst_wire::icrc::compute(&ip, &udp, &ib2).unwrap(), c);
/// ```
pub fn compute(ip_header: &[u8], udp_header: &[u8], ib: &[u8]) -> Result<u32> {
    check_len("BTH", ib, BTH_LEN)?;
    let mut pre = [0u8; FUSED];
    let mut at = masked_prefix(ip_header, udp_header, &mut pre)?;
    pre[at..at + BTH_LEN].copy_from_slice(&ib[..BTH_LEN]);
    pre[at + 4] = 0xff; // FECN, BECN, reserved
    at += BTH_LEN;
    // A short packet joins the prefix in the stack buffer: one update
    // instead of two (64 B SEND: 36 -> 30 ns). Longer ones are hashed in
    // place: moving the split point changes the length of crc32fast's
    // unaligned tail, and measured slower (4 KiB: 119 -> 135 ns).
    let rest = &ib[BTH_LEN..];
    let mut h = crc32fast::Hasher::new();
    if at + rest.len() <= FUSED {
        pre[at..at + rest.len()].copy_from_slice(rest);
        h.update(&pre[..at + rest.len()]);
    } else {
        h.update(&pre[..at]);
        h.update(rest);
    }
    Ok(h.finalize())
}

/// Writes the ICRC's masked prefix into `pre`: 8 bytes of 0xFF for the
/// LRH, the IP header and the UDP header with their variant fields set to
/// ones. Returns its length.
fn masked_prefix(ip_header: &[u8], udp_header: &[u8], pre: &mut [u8; FUSED]) -> Result<usize> {
    check_len("UDP header", udp_header, UDP_LEN)?;
    pre[..8].fill(0xff);
    let ip_len = match ip_header.first().map(|b| b >> 4) {
        Some(4) => {
            let ihl = usize::from(ip_header[0] & 0x0f) * 4;
            if ihl < 20 || ihl > ip_header.len() {
                return Err(Error::BadIpHeader("IPv4 IHL"));
            }
            let ip = &mut pre[8..8 + ihl];
            ip.copy_from_slice(&ip_header[..ihl]);
            ip[1] = 0xff; // TOS: DSCP and ECN
            ip[8] = 0xff; // TTL
            ip[10] = 0xff; // header checksum
            ip[11] = 0xff;
            ihl
        }
        Some(6) => {
            check_len("IPv6 header", ip_header, 40)?;
            let ip = &mut pre[8..48];
            ip.copy_from_slice(&ip_header[..40]);
            ip[0] |= 0x0f; // traffic class (low nibble of byte 0 ...
            ip[1] = 0xff; // ... and high nibble of byte 1) and flow label
            ip[2] = 0xff;
            ip[3] = 0xff;
            ip[7] = 0xff; // hop limit
            40
        }
        _ => return Err(Error::BadIpHeader("IP version")),
    };
    let at = 8 + ip_len;
    pre[at..at + UDP_LEN].copy_from_slice(&udp_header[..UDP_LEN]);
    pre[at + 6] = 0xff; // UDP checksum
    pre[at + 7] = 0xff;
    Ok(at + UDP_LEN)
}

/// The ICRC's CRC-32 over its masked prefix alone (the LRH's ones, the IP
/// and UDP headers as received, variant fields set to ones), to continue
/// over the transport packet with [`continue_head`]: what a port that sees
/// whole frames hands on, so that the receiver checks the ICRC in the pass
/// that places the payload.
///
/// ```
/// let ip = [0x45u8, 0, 0, 48, 0, 0, 0x40, 0, 64, 17, 0, 0, 198, 18, 0, 1, 198, 18, 0, 2];
/// let udp = [0xc0, 0, 0x12, 0xb7, 0, 28, 0, 0];
/// let ib = [0x11u8, 0x00, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 1, 0x1f, 0, 0, 1];
/// let pseudo = burst_wire::icrc::pseudo_header_crc(&ip, &udp).unwrap();
/// let head = burst_wire::icrc::continue_head(pseudo, &ib, 12).unwrap();
/// let mut h = crc32fast::Hasher::new_with_initial(head);
/// h.update(&ib[12..]);
/// assert_eq!(h.finalize(), burst_wire::icrc::compute(&ip, &udp, &ib).unwrap());
/// ```
pub fn pseudo_header_crc(ip_header: &[u8], udp_header: &[u8]) -> Result<u32> {
    let mut pre = [0u8; FUSED];
    let n = masked_prefix(ip_header, udp_header, &mut pre)?;
    Ok(crc32fast::hash(&pre[..n]))
}

/// Whether `at` splits the transport packet `ib` between the BTH's end and
/// the ICRC's start, where a CRC of its head may stop.
fn check_head(ib: &[u8], at: usize) -> Result<()> {
    check_len("BTH + ICRC", ib, BTH_LEN + ICRC_LEN)?;
    if at < BTH_LEN || at > ib.len() - ICRC_LEN {
        return Err(Error::Truncated {
            what: "ICRC head",
            need: at.max(BTH_LEN) + ICRC_LEN,
            have: ib.len(),
        });
    }
    Ok(())
}

/// `pseudo` ([`pseudo_header_crc`]) continued over the first `at` bytes of
/// the transport packet `ib` (the BTH masked as the ICRC masks it): the
/// CRC-32 to continue over `ib[at..]` up to the ICRC.
pub fn continue_head(pseudo: u32, ib: &[u8], at: usize) -> Result<u32> {
    check_head(ib, at)?;
    let mut bth = [0u8; BTH_LEN];
    bth.copy_from_slice(&ib[..BTH_LEN]);
    bth[4] = 0xff; // FECN, BECN, reserved
    let mut h = crc32fast::Hasher::new_with_initial(pseudo);
    h.update(&bth);
    h.update(&ib[BTH_LEN..at]);
    Ok(h.finalize())
}

/// The ICRC a transport packet carries (its last 4 bytes, least
/// significant first); `None` when it is too short to hold a BTH and one.
fn stored_icrc(ib: &[u8]) -> Option<u32> {
    let n = ib.len();
    (n >= BTH_LEN + ICRC_LEN)
        .then(|| u32::from_le_bytes([ib[n - 4], ib[n - 3], ib[n - 2], ib[n - 1]]))
}

/// The ICRC of a transport packet `ib` (BTH through ICRC; the ICRC bytes
/// themselves are not read) carried in a UDP datagram from `src` to `dst`,
/// with the IP and UDP headers a host stack builds for it: IPv4 with DF and
/// identification `ip_id`, or IPv6 (`ip_id` unused). This is the pseudo
/// header a port that sees only UDP payloads (a socket) needs; the variant
/// fields are masked anyway, so TTL, TOS, flow label and checksums need not
/// be known.
///
/// ```
/// use std::net::SocketAddr;
/// let src: SocketAddr = "198.18.0.1:49152".parse().unwrap();
/// let dst: SocketAddr = "198.18.0.2:4791".parse().unwrap();
/// let ib = [0x11u8, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 1, 0x1f, 0, 0, 1, 0, 0, 0, 0];
/// let a = burst_wire::icrc::for_udp_payload(src, dst, &ib, 0).unwrap();
/// let b = burst_wire::icrc::for_udp_payload(src, dst, &ib, 1).unwrap();
/// assert_ne!(a, b); // the IPv4 identification is covered
/// ```
pub fn for_udp_payload(src: SocketAddr, dst: SocketAddr, ib: &[u8], ip_id: u16) -> Result<u32> {
    for_udp_payload_head(src, dst, ib, ip_id, ib.len().saturating_sub(ICRC_LEN))
}

/// [`for_udp_payload`] over the first `at` bytes of `ib` only (the IP and
/// UDP lengths still those of the whole packet): the CRC-32 to continue
/// over `ib[at..]` up to the ICRC. A sender that took the payload's CRC
/// while gathering it joins the two (CRC-32 combination) instead of
/// reading the payload again.
///
/// ```
/// use std::net::SocketAddr;
/// let src: SocketAddr = "198.18.0.1:49152".parse().unwrap();
/// let dst: SocketAddr = "198.18.0.2:4791".parse().unwrap();
/// let mut ib = vec![0x04u8, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 1];
/// ib.extend_from_slice(b"payload!");
/// ib.extend_from_slice(&[0; 4]); // the ICRC's place
/// let head = burst_wire::icrc::for_udp_payload_head(src, dst, &ib, 7, 12).unwrap();
/// let mut h = crc32fast::Hasher::new_with_initial(head);
/// h.update(b"payload!");
/// assert_eq!(h.finalize(), burst_wire::icrc::for_udp_payload(src, dst, &ib, 7).unwrap());
/// ```
pub fn for_udp_payload_head(
    src: SocketAddr,
    dst: SocketAddr,
    ib: &[u8],
    ip_id: u16,
    at: usize,
) -> Result<u32> {
    check_head(ib, at)?;
    let udp_len = UDP_LEN + ib.len();
    match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            // Per packet, both ways: the header written here rather than by
            // the codec's emit, which computes a checksum the ICRC masks
            // (25-30 ns of each seal and check). The test
            // `ipv4_pseudo_header_is_the_codecs` keeps the two equal.
            let total =
                u16::try_from(20 + udp_len).map_err(|_| Error::OutOfRange("IPv4 length"))?;
            let mut hdr = [0u8; 20 + UDP_LEN];
            hdr[0] = 0x45;
            hdr[2..4].copy_from_slice(&total.to_be_bytes());
            hdr[4..6].copy_from_slice(&ip_id.to_be_bytes());
            hdr[6] = 0x40; // DF, as a host stack sends it
            hdr[8] = 64;
            hdr[9] = 17; // UDP
            hdr[12..16].copy_from_slice(&s.octets());
            hdr[16..20].copy_from_slice(&d.octets());
            hdr[20..22].copy_from_slice(&src.port().to_be_bytes());
            hdr[22..24].copy_from_slice(&dst.port().to_be_bytes());
            hdr[24..26].copy_from_slice(&(total - 20).to_be_bytes());
            compute(&hdr[..20], &hdr[20..], &ib[..at])
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let ip = IpRepr::v6(s, d);
            let udp = UdpRepr {
                src_port: src.port(),
                dst_port: dst.port(),
                checksum: 0,
            };
            let mut hdr = [0u8; 48];
            let n = emit_ip_udp(&ip, &udp, udp_len, &mut hdr)?;
            let ip_len = ip.header_len();
            compute(&hdr[..ip_len], &hdr[ip_len..n], &ib[..at])
        }
        _ => Err(Error::BadIpHeader("address families differ")),
    }
}

/// Outcome of an ICRC check ([`Checker::check`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// Verified at full strength (the IP ID was known, or IPv6).
    Ok,
    /// Consistent with the given IPv4 ID, which was not known but solved for
    /// (16 bits of the ICRC's protection are spent on finding it).
    OkWithId(u16),
    /// Wrong: drop the packet.
    Bad,
    /// Cannot be checked (too short to hold an ICRC, or mixed families).
    Unverifiable,
}

/// Most packet lengths whose ID syndromes [`Checker`] keeps (one small basis
/// each); past it the cache starts over.
pub const MAX_CACHED_LENGTHS: usize = 512;

/// Most peers whose IP ID habits [`Checker`] remembers; past it the table
/// starts over.
pub const MAX_TRACKED_PEERS: usize = 4096;

/// The IDs a burst peer's UDP port gives its packets: the index in a GSO
/// run, below this (burst-io's `MAX_GSO_SEGMENTS`).
pub const GSO_ID_RANGE: u16 = 64;

/// Packets with ID 0 a peer must have sent, with no ID ever at or above
/// [`GSO_ID_RANGE`], before [`Checker`] holds it to that range. A burst
/// peer starts every GSO run and every lone packet at 0; a peer whose IDs
/// count passes 0 once in 65,536 packets, and leaves the range long before.
const PEER_LEARN: u32 = 16;

#[derive(Debug, Clone, Copy, Default)]
struct PeerIds {
    zeros: u32,
    max_id: u16,
}

/// ICRC checking for packets whose IPv4 identification may be unknown (a
/// UDP socket does not show it). The CRC is affine in the 16 ID bits, so the
/// stored ICRC is consistent with *some* ID exactly when
/// `stored ^ icrc(ID = 0)` lies in the span of the 16 bit-flip syndromes,
/// precomputed once per packet length. A peer seen to use only the IDs of
/// burst's GSO runs (below [`GSO_ID_RANGE`]) is then held to them, which
/// gives back 10 of the 16 bits; a peer whose IDs count (RXE, RNICs) keeps
/// the 16-bit check. Both tables are bounded.
#[derive(Debug, Default)]
pub struct Checker {
    /// By ICRC input length (lengths are at most 64 Ki and the map is
    /// bounded, so a fast hash cannot be pushed into long probe chains).
    bases: FxHashMap<usize, IdBasis>,
    /// Peers other than `last`.
    peers: HashMap<SocketAddr, PeerIds>,
    /// The peer of the last packet, kept out of `peers`: a burst of packets
    /// comes from one peer, and a hash per packet showed in profiles (the
    /// map's keys are the network's to choose, so it keeps SipHash).
    last: Option<(SocketAddr, PeerIds)>,
}

impl Checker {
    /// An empty checker.
    pub fn new() -> Checker {
        Checker::default()
    }

    /// Checks `ib` (BTH through ICRC) received from `src` on `dst`; `ip_id`
    /// is the IPv4 identification when the port saw it.
    ///
    /// ```
    /// use burst_wire::icrc::{for_udp_payload, Check, Checker};
    /// let src = "198.18.0.1:49152".parse().unwrap();
    /// let dst = "198.18.0.2:4791".parse().unwrap();
    /// let mut ib = vec![0x11u8, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 1, 0x1f, 0, 0, 1, 0, 0, 0, 0];
    /// let crc = for_udp_payload(src, dst, &ib, 7).unwrap();
    /// ib[16..].copy_from_slice(&crc.to_le_bytes());
    /// let mut c = Checker::new();
    /// assert_eq!(c.check(src, dst, &ib, Some(7)), Check::Ok);
    /// assert_eq!(c.check(src, dst, &ib, None), Check::OkWithId(7));
    /// assert_eq!(c.check(src, dst, &ib, Some(8)), Check::Bad);
    /// ```
    pub fn check(
        &mut self,
        src: SocketAddr,
        dst: SocketAddr,
        ib: &[u8],
        ip_id: Option<u16>,
    ) -> Check {
        let at = ib.len().saturating_sub(ICRC_LEN);
        self.check_with(src, dst, ib, ip_id, at, |crc| crc)
    }

    /// [`Checker::check`] with the CRC over `ib[at..]` (up to the ICRC)
    /// taken by the caller: `rest` gets the CRC of everything before `at`
    /// and returns it continued over those bytes (as crc32fast's
    /// `Hasher::new_with_initial` continues). A receiver that places the
    /// payload while it checksums it reads the payload once.
    ///
    /// ```
    /// use burst_wire::icrc::{for_udp_payload, Check, Checker};
    /// let src = "198.18.0.1:49152".parse().unwrap();
    /// let dst = "198.18.0.2:4791".parse().unwrap();
    /// let mut ib = vec![0x04u8, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 1];
    /// ib.extend_from_slice(b"payload!");
    /// ib.extend_from_slice(&[0; 4]);
    /// let crc = for_udp_payload(src, dst, &ib, 7).unwrap();
    /// ib[20..].copy_from_slice(&crc.to_le_bytes());
    /// let mut seen = Vec::new();
    /// let rest = |head: u32| {
    ///     seen.extend_from_slice(b"payload!");
    ///     let mut h = crc32fast::Hasher::new_with_initial(head);
    ///     h.update(b"payload!");
    ///     h.finalize()
    /// };
    /// assert_eq!(Checker::new().check_with(src, dst, &ib, Some(7), 12, rest), Check::Ok);
    /// assert_eq!(seen, b"payload!");
    /// ```
    pub fn check_with(
        &mut self,
        src: SocketAddr,
        dst: SocketAddr,
        ib: &[u8],
        ip_id: Option<u16>,
        at: usize,
        rest: impl FnOnce(u32) -> u32,
    ) -> Check {
        let n = ib.len();
        let Some(stored) = stored_icrc(ib) else {
            return Check::Unverifiable;
        };
        let Ok(head) = for_udp_payload_head(src, dst, ib, ip_id.unwrap_or(0), at) else {
            return Check::Unverifiable;
        };
        let c0 = rest(head);
        if c0 == stored {
            self.note(src, 0);
            return Check::Ok;
        }
        // IPv6 masks every field a host may vary; a known ID is final.
        if !src.is_ipv4() || ip_id.is_some() {
            return Check::Bad;
        }
        // 8 bytes for the LRH, 20 IPv4, 8 UDP, then BTH..pad.
        let len = 8 + 20 + UDP_LEN + n - ICRC_LEN;
        if self.bases.len() >= MAX_CACHED_LENGTHS && !self.bases.contains_key(&len) {
            self.bases.clear();
        }
        let basis = self.bases.entry(len).or_insert_with(|| IdBasis::new(len));
        let Some(id) = basis.solve(stored ^ c0) else {
            return Check::Bad;
        };
        let p = *self.peer(src);
        if p.zeros >= PEER_LEARN && p.max_id < GSO_ID_RANGE && id >= GSO_ID_RANGE {
            return Check::Bad;
        }
        self.note(src, id);
        Check::OkWithId(id)
    }

    /// The check of a packet whose IP and UDP headers the port saw: `pseudo`
    /// is their CRC ([`pseudo_header_crc`]), so nothing is solved or
    /// assumed; `rest` continues the CRC over `ib[at..]` as in
    /// [`Checker::check_with`]. A packet too short to hold a BTH and an
    /// ICRC, or an `at` outside them, is `Bad`, never let through
    /// unverified: there is nothing this check could not know.
    ///
    /// ```
    /// use burst_wire::icrc::{compute, pseudo_header_crc, Check, Checker};
    /// let ip = [0x45u8, 0, 0, 52, 0, 9, 0, 0, 64, 17, 0, 0, 198, 18, 0, 1, 198, 18, 0, 2];
    /// let udp = [0xc0, 0, 0x12, 0xb7, 0, 32, 0, 0];
    /// let mut ib = vec![0x04u8, 0, 0xff, 0xff, 0, 0, 0, 0x11, 0, 0, 0, 1];
    /// ib.extend_from_slice(b"payload!");
    /// let crc = compute(&ip, &udp, &ib).unwrap(); // no DF: the port's own headers
    /// ib.extend_from_slice(&crc.to_le_bytes());
    /// let pseudo = pseudo_header_crc(&ip, &udp).unwrap();
    /// let plain = |c: u32| {
    ///     let mut h = crc32fast::Hasher::new_with_initial(c);
    ///     h.update(b"payload!");
    ///     h.finalize()
    /// };
    /// assert_eq!(Checker::new().check_after(pseudo, &ib, 12, plain), Check::Ok);
    /// assert_eq!(Checker::new().check_after(pseudo, &ib[..14], 12, plain), Check::Bad);
    /// ib[13] ^= 1;
    /// let corrupt = |c: u32| {
    ///     let mut h = crc32fast::Hasher::new_with_initial(c);
    ///     h.update(&ib[12..20]);
    ///     h.finalize()
    /// };
    /// assert_eq!(Checker::new().check_after(pseudo, &ib, 12, corrupt), Check::Bad);
    /// ```
    pub fn check_after(
        &mut self,
        pseudo: u32,
        ib: &[u8],
        at: usize,
        rest: impl FnOnce(u32) -> u32,
    ) -> Check {
        let Some(stored) = stored_icrc(ib) else {
            return Check::Bad;
        };
        let Ok(head) = continue_head(pseudo, ib, at) else {
            return Check::Bad;
        };
        if rest(head) == stored {
            Check::Ok
        } else {
            Check::Bad
        }
    }

    fn note(&mut self, src: SocketAddr, id: u16) {
        let p = self.peer(src);
        p.zeros = p.zeros.saturating_add(u32::from(id == 0));
        p.max_id = p.max_id.max(id);
    }

    /// What is known of `src`, made the `last` peer.
    fn peer(&mut self, src: SocketAddr) -> &mut PeerIds {
        if let Some((a, p)) = self.last.take_if(|(a, _)| *a != src) {
            // With `last` the total stays within the bound.
            if self.peers.len() + 1 >= MAX_TRACKED_PEERS {
                self.peers.clear();
            }
            self.peers.insert(a, p);
        }
        let peers = &mut self.peers;
        &mut self
            .last
            .get_or_insert_with(|| (src, peers.remove(&src).unwrap_or_default()))
            .1
    }

    /// Lengths and peers currently cached (both bounded).
    pub fn cached(&self) -> (usize, usize) {
        (
            self.bases.len(),
            self.peers.len() + usize::from(self.last.is_some()),
        )
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::net::Ipv4Addr;

    proptest! {
        /// The IPv4 pseudo header written by hand for the hot path gives
        /// the ICRC the codec's own header gives (`IpRepr::v4`: DF, TTL 64).
        #[test]
        fn ipv4_pseudo_header_is_the_codecs(
            s in any::<u32>(), d in any::<u32>(), sp in any::<u16>(), dp in any::<u16>(),
            id in any::<u16>(), ib in proptest::collection::vec(any::<u8>(), 16..600),
            cut in any::<prop::sample::Index>(),
        ) {
            let (s, d) = (Ipv4Addr::from(s), Ipv4Addr::from(d));
            let src = SocketAddr::new(s.into(), sp);
            let dst = SocketAddr::new(d.into(), dp);
            let at = BTH_LEN + cut.index(ib.len() - ICRC_LEN - BTH_LEN + 1);
            let mut ip = IpRepr::v4(s, d);
            if let IpRepr::V4(v) = &mut ip {
                v.ident = id;
            }
            let udp = UdpRepr { src_port: sp, dst_port: dp, checksum: 0 };
            let mut hdr = [0u8; 48];
            let n = emit_ip_udp(&ip, &udp, UDP_LEN + ib.len(), &mut hdr).unwrap();
            let want = compute(&hdr[..20], &hdr[20..n], &ib[..at]).unwrap();
            prop_assert_eq!(for_udp_payload_head(src, dst, &ib, id, at).unwrap(), want);
        }
    }
}
