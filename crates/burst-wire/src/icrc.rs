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

use crate::bth::BTH_LEN;
use crate::error::{check_len, Result};
use crate::Error;

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
    check_len("UDP header", udp_header, UDP_LEN)?;
    check_len("BTH", ib, BTH_LEN)?;
    let mut pre = [0u8; FUSED];
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
    let mut at = 8 + ip_len;
    pre[at..at + UDP_LEN].copy_from_slice(&udp_header[..UDP_LEN]);
    pre[at + 6] = 0xff; // UDP checksum
    pre[at + 7] = 0xff;
    at += UDP_LEN;
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
