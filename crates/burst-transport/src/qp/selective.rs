//! Selective repeat between burst peers (the QP attribute
//! `selective_repeat`, negotiated as burst's ECE option; off toward every
//! other peer, whose wire stays go-back-N as IBA 9.7 has it).
//!
//! Nothing new goes on the wire; both ends read the same packets
//! differently:
//!
//! - The responder places a WRITE packet ahead of the expected PSN when it
//!   knows where it goes: its message is the one in progress, or the
//!   message's first packet (with the RETH, checked as in order) arrived
//!   out of order too, but for a message's last (or only) packet, whose
//!   bytes it keeps and places when the sweep reaches it ([`HeldTail`]:
//!   the last byte of a message, or a flag a later WRITE sets, becomes
//!   visible only after the data before it, as with go-back-N). It
//!   remembers the PSN, still NAKs the gap once
//!   (a PSN sequence error, as IBA), and when the gap fills, sweeps the
//!   expected PSN over what it holds, finishing messages in order (MSN,
//!   ACK). A hole it already knows of (PSNs held past it) is NAKed at once.
//!   SEND packets past a gap are placed too, when their receive WQE and
//!   offset are known: the requester puts in the BTH's seven reserved bits
//!   ([`send_tag`]) a SEND's receive WQE number (its first packet: which
//!   of the messages that take a receive it is, IRN's receive WQE
//!   sequence number) or the packet's index in its message (the others),
//!   both modulo 127 and plus one (0, what every other peer sends, says
//!   nothing), and keeps fewer than 127 such messages unacknowledged, so
//!   the number is exact. The responder holds a first packet in the
//!   receive WQE that number names (its own receive queue, not an SRQ,
//!   whose WQEs other QPs take), and a later packet of the message in
//!   progress or of a message whose first packet it holds, when the index
//!   can belong to no later message (`Qp::hold_send_ahead`). Anything else
//!   out of order (READ, atomic, a last packet that invalidates or WRITE
//!   WITH IMMEDIATE's, a WRITE or SEND whose first packet is missing) is
//!   dropped as before.
//! - The requester, on a sequence NAK for PSN `p` of a WRITE or SEND,
//!   resends only what the responder cannot hold: `p` itself, or the whole
//!   message when `p` is its first packet (the rest had nowhere to go).
//!   For any other operation it goes back N from `p`. When nothing
//!   progresses for a few round trips (a lost tail draws no NAK) it
//!   probes: the oldest unacknowledged SEND or WRITE packet again, or a
//!   READ's first hole asked for again (`Qp::probe_oldest`). A timeout
//!   always goes back N.
//! - READ responses are the requester's to hold: it knows where each one
//!   goes, so one past a missing response is placed and remembered, and
//!   the hole before it (to the next held response) is asked for again
//!   alone, once, by a duplicate READ request of the hole's PSNs and bytes
//!   (`Qp::ask_read_hole`); so is a hole an ACK or a later READ's first
//!   response past the READ shows (an implied NAK: a lost tail has no
//!   response behind it in its own stream), and what that ACK
//!   acknowledged behind the READ stays done. The responder answers such
//!   a request first and keeps what it had queued (a go-back-N responder
//!   drops the rest of the stream in favour of the new request, which the
//!   probe then repairs).
//!
//! Either end alone is correct: a go-back-N requester resends what a
//! selective responder already holds (duplicates, dropped); a selective
//! requester facing a go-back-N responder resends one message per NAK and
//! the ACK timer's go-back repairs the rest. RXE and RNICs never see it.

use super::placement::Refusal;
use super::*;

/// How far past the expected PSN the responder holds packets (the
/// requester's default window, [`QpConfig::max_inflight_packets`]).
pub(super) const WINDOW: u32 = 1024;

/// Most WRITE messages whose first packet arrived out of order held at
/// once.
const MESSAGES: usize = 16;

/// Holes one recovery repairs one by one before it goes back N (see
/// `Qp::retry_selective`).
const HOLES_BEFORE_GO_BACK: u32 = 4;

/// A SEND packet's receive WQE number or index in its message travels
/// modulo this (in the BTH's seven reserved bits, 0 meaning none), so the
/// responder holds SEND packets less than this far past its expected PSN.
pub(super) const SEND_TAG_SPAN: u32 = 127;

/// The tag a selective requester puts in the BTH's reserved bits of
/// packet `k` of a SEND whose receive WQE number is `rsn`: that number on
/// its first packet, the index on the others, modulo [`SEND_TAG_SPAN`],
/// plus one, so that 0 (what RXE, RNICs and burst before tags send) says
/// nothing.
pub(super) fn send_tag(k: u32, rsn: u32) -> u8 {
    (if k == 0 { rsn } else { k } % SEND_TAG_SPAN + 1) as u8
}

/// What a SEND packet's tag says (see [`send_tag`]), if anything.
fn read_send_tag(resv7: u8) -> Option<u64> {
    u64::from(resv7).checked_sub(1)
}

/// The shortest wait before a probe (see `Qp::probe_deadline`): a few
/// round trips of a software stack on one host.
pub(super) const PROBE_FLOOR_NS: Nanos = 16_000;

/// PSNs received past a hole, a ring indexed by the PSN's low bits: only
/// PSNs within [`WINDOW`] past the oldest missing one are ever set, so no
/// two set PSNs share a bit.
#[derive(Debug, Clone)]
pub(super) struct PsnBits {
    bits: [u64; (WINDOW / 64) as usize],
    /// How many bits are set.
    count: u32,
}

impl Default for PsnBits {
    fn default() -> Self {
        PsnBits {
            bits: [0; (WINDOW / 64) as usize],
            count: 0,
        }
    }
}

impl PsnBits {
    fn slot(psn: Psn) -> (usize, u64) {
        let i = psn.value() % WINDOW;
        ((i / 64) as usize, 1 << (i % 64))
    }
    pub(super) fn has(&self, psn: Psn) -> bool {
        let (w, b) = Self::slot(psn);
        self.bits[w] & b != 0
    }
    pub(super) fn set(&mut self, psn: Psn) {
        let (w, b) = Self::slot(psn);
        if self.bits[w] & b == 0 {
            self.bits[w] |= b;
            self.count += 1;
        }
    }
    pub(super) fn clear(&mut self, psn: Psn) {
        let (w, b) = Self::slot(psn);
        if self.bits[w] & b != 0 {
            self.bits[w] &= !b;
            self.count -= 1;
        }
    }
    fn clear_all(&mut self) {
        *self = PsnBits::default();
    }
    pub(super) fn is_empty(&self) -> bool {
        self.count == 0
    }
    /// How many PSNs from `from` on (at most `len`, at most [`WINDOW`])
    /// come before the first one set: the length of the hole at `from`.
    /// A word at a time, so a long hole costs 16 reads, not 1,024.
    pub(super) fn hole_at(&self, from: Psn, len: u32) -> u32 {
        let len = len.min(WINDOW);
        if self.count == 0 {
            return len;
        }
        let mut k = 0;
        while k < len {
            let i = (from + k).value() % WINDOW;
            let (w, bit) = ((i / 64) as usize, i % 64);
            // Bits of this word from `bit` on, within the range.
            let word = self.bits[w] >> bit;
            let span = (64 - bit).min(len - k);
            let word = if span < 64 {
                word & ((1u64 << span) - 1)
            } else {
                word
            };
            if word != 0 {
                return k + word.trailing_zeros();
            }
            k += span;
        }
        len
    }
}

/// What a selective-repeat responder holds past its expected PSN.
/// Allocated on a QP's first out-of-order packet, kept until RESET.
#[derive(Debug)]
pub(super) struct Held {
    /// PSNs placed.
    bits: PsnBits,
    /// WRITE messages whose first packet was placed out of order.
    messages: Vec<HeldWrite>,
    /// The last packet of the SEND in progress, placed out of order.
    send_last: Option<HeldSendLast>,
    /// SEND messages whose first packet was placed out of order (fewer
    /// than [`SEND_TAG_SPAN`]: no more can be unacknowledged).
    sends: Vec<HeldSend>,
    /// The last (or only) packets of WRITE messages that arrived ahead,
    /// kept unplaced until the sweep reaches them (see [`HeldTail`]).
    tails: Vec<HeldTail>,
    /// Their payloads, packed ([`HeldTail::at`]); at most [`TAIL_BYTES`].
    tail_bytes: Vec<u8>,
}

/// The last (or only) packet of a WRITE that arrived ahead of the
/// expected PSN. Its bytes reach the application's memory only when
/// every packet before it has: an application that polls the last byte
/// of a message, or a flag a later WRITE sets, must not see it before
/// the data it announces (what go-back-N RNICs and RXE give it), and a
/// later WRITE to the same bytes must land after an earlier one resent.
#[derive(Debug, Clone, Copy)]
struct HeldTail {
    psn: Psn,
    rkey: u32,
    va: u64,
    /// Where its payload starts in `Held::tail_bytes`.
    at: usize,
    len: usize,
}

/// Most payload bytes of held WRITE tails per QP: one MTU-sized last
/// packet for each of [`MESSAGES`] held messages. Past it a tail is left
/// to be resent; the buffer is freed when no tail is held.
const TAIL_BYTES: usize = MESSAGES * 4096;

/// A SEND message whose first packet arrived ahead of the expected PSN,
/// placed in the receive WQE its tag named.
#[derive(Debug, Clone, Copy)]
struct HeldSend {
    first: Psn,
    /// The receive WQE's number (`Responder::rsn` when it is taken).
    rsn: u32,
    /// Its last packet, once held (an only packet is its own).
    last: Option<HeldSendLast>,
}

/// The last packet of the SEND message in progress, held: what its
/// completion needs when the sweep reaches it.
#[derive(Debug, Clone, Copy)]
struct HeldSendLast {
    psn: Psn,
    len: u32,
    imm: Option<u32>,
}

/// A WRITE message whose RETH arrived ahead of the expected PSN.
#[derive(Debug, Clone, Copy)]
struct HeldWrite {
    first: Psn,
    rkey: u32,
    va: u64,
    len: u64,
}

impl Default for Held {
    fn default() -> Self {
        Held {
            bits: PsnBits::default(),
            messages: Vec::with_capacity(MESSAGES),
            send_last: None,
            sends: Vec::new(),
            tails: Vec::new(),
            tail_bytes: Vec::new(),
        }
    }
}

impl Held {
    fn has(&self, psn: Psn) -> bool {
        self.bits.has(psn)
    }
    fn set(&mut self, psn: Psn) {
        self.bits.set(psn)
    }
    fn clear(&mut self, psn: Psn) {
        self.bits.clear(psn)
    }
    fn clear_all(&mut self) {
        self.bits.clear_all();
        self.send_last = None;
        self.tails.clear();
    }
    pub(super) fn is_empty(&self) -> bool {
        self.bits.is_empty()
            && self.messages.is_empty()
            && self.send_last.is_none()
            && self.sends.is_empty()
            && self.tails.is_empty()
    }

    /// Keeps a WRITE's last packet for the sweep; `false` when the held
    /// tails already fill [`TAIL_BYTES`].
    fn hold_tail(&mut self, psn: Psn, rkey: u32, va: u64, data: &[u8]) -> bool {
        let live: usize = self.tails.iter().map(|t| t.len).sum();
        if live + data.len() > TAIL_BYTES {
            return false;
        }
        if self.tail_bytes.len() + data.len() > TAIL_BYTES {
            // Close the gaps swept tails left.
            self.tails.sort_unstable_by_key(|t| t.at);
            let mut end = 0;
            for t in &mut self.tails {
                self.tail_bytes.copy_within(t.at..t.at + t.len, end);
                t.at = end;
                end += t.len;
            }
            self.tail_bytes.truncate(end);
        }
        self.tails.push(HeldTail {
            psn,
            rkey,
            va,
            at: self.tail_bytes.len(),
            len: data.len(),
        });
        self.tail_bytes.extend_from_slice(data);
        true
    }

    /// Forgets the tails behind `epsn` (not what the requester sent
    /// there); frees the buffer when none is left.
    fn retain_tails(&mut self, epsn: Psn) {
        self.tails.retain(|t| epsn.distance_to(t.psn) > 0);
        if self.tails.is_empty() {
            self.tail_bytes = Vec::new();
        }
    }
}

impl Qp {
    /// Whether this QP repeats selectively (both roles).
    pub fn selective_repeat(&self) -> bool {
        self.attrs.selective_repeat
    }

    /// Requester: the smoothed round-trip time and its mean deviation
    /// (ns, RFC 6298), `None` before the first sample or seed.
    pub fn rtt(&self) -> Option<(Nanos, Nanos)> {
        (self.req.srtt != 0).then_some((self.req.srtt, self.req.rttvar))
    }

    /// Requester: starts the round-trip estimate of a QP that has none
    /// from other QPs' to the same peer, as TCP starts a connection from
    /// the metrics it keeps per destination. A selective QP then probes a
    /// lost tail of its first flight after a few round trips instead of
    /// waiting for the ACK timer (thousands of QPs starting together, one
    /// receive-buffer overflow: each QP that lost its tail timed out).
    /// Until the QP times a round trip of its own, later seeds replace
    /// earlier ones: the data plane seeds again from the peer's current
    /// estimate before it looks at the QP's timers, so a first flight
    /// queued behind thousands of others follows the queue's growth
    /// instead of probing on the estimate of an empty queue (1,000 flows
    /// starting together: 1,181 spurious probes). No effect with `srtt` 0
    /// or once the QP has a sample of its own.
    ///
    /// ```
    /// use burst_transport::{Qp, QpConfig, QpType};
    /// use burst_wire::Qpn;
    /// let mut qp = Qp::new(QpConfig::new(Qpn::new(0x11).unwrap(), QpType::Rc, 1));
    /// assert_eq!(qp.rtt(), None);
    /// qp.seed_rtt(40_000, 10_000);
    /// assert!(qp.rtt_seeded());
    /// qp.seed_rtt(90_000, 30_000);
    /// assert_eq!(qp.rtt(), Some((90_000, 30_000)));
    /// qp.seed_rtt(0, 0);
    /// assert_eq!(qp.rtt(), Some((90_000, 30_000)));
    /// ```
    pub fn seed_rtt(&mut self, srtt: Nanos, rttvar: Nanos) {
        if (self.req.srtt == 0 || self.req.rtt_seeded) && srtt > 0 {
            (self.req.srtt, self.req.rttvar) = (srtt, rttvar);
            self.req.rtt_seeded = true;
        }
    }

    /// Requester: whether the round-trip estimate is a seed
    /// ([`Qp::seed_rtt`]), not yet refined by a sample of the QP's own.
    pub fn rtt_seeded(&self) -> bool {
        self.req.rtt_seeded
    }

    /// Responder: a WRITE packet `d` PSNs past the expected one, placed
    /// and remembered when its destination is known. The caller NAKs the
    /// gap (once) whatever happens here.
    pub(super) fn hold_ahead(&mut self, pkt: &IbPacket<&[u8]>, d: u32, mem: &mut impl Memory) {
        if d >= WINDOW || self.state == QpState::Err {
            return;
        }
        let info = pkt.info();
        let send = info.operation == Operation::Send;
        if !send && (info.operation != Operation::RdmaWrite || pkt.imm_dt().is_some()) {
            return;
        }
        let psn = pkt.bth().psn();
        let mut held = self.resp.held.take().unwrap_or_default();
        if held.has(psn) {
            self.counters.duplicate_request += 1;
        } else if send {
            if self.hold_send_ahead(&mut held, pkt, d, mem) {
                held.set(psn);
                self.counters.sr_held_pkts += 1;
            }
        } else if self.place_ahead(&mut held, pkt, d, mem).is_ok() {
            held.set(psn);
            self.counters.sr_held_pkts += 1;
        }
        self.resp.held = Some(held);
    }

    /// Responder: places a SEND packet `d` PSNs past the expected one when
    /// its receive WQE and offset are known; `true` when held.
    ///
    /// Its tag ([`send_tag`]) says where. A first (or only) packet names
    /// its receive WQE modulo [`SEND_TAG_SPAN`], exact because a selective
    /// requester keeps fewer messages that take a receive unacknowledged;
    /// the WQE is that many behind the next one in the queue. A later
    /// packet gives its index in its message: a packet of a message that
    /// started after a known first PSN `f` has an index below `psn - f`,
    /// so an index matching `psn - f` below the span is that message's
    /// (for the message in progress, whose start lies before the expected
    /// PSN, any later message's index is below `d`, while its own is at
    /// least `d`). Packets past the span of a longer message are not held:
    /// its requester goes back N for them. Anything else, and a last
    /// packet that invalidates (its completion has more to do), is left
    /// to be resent.
    fn hold_send_ahead(
        &mut self,
        held: &mut Held,
        pkt: &IbPacket<&[u8]>,
        d: u32,
        mem: &mut impl Memory,
    ) -> bool {
        let span = u64::from(SEND_TAG_SPAN);
        let psn = pkt.bth().psn();
        let Some(tag) = read_send_tag(pkt.bth().resv7()) else {
            return false;
        };
        let pos = pkt.info().position.unwrap_or(Position::Only);
        let ends = matches!(pos, Position::Last | Position::Only);
        if (ends && pkt.ieth().is_some())
            || self
                .attrs
                .mtu
                .check_payload(pkt.opcode(), pkt.payload_len())
                .is_err()
        {
            return false;
        }
        let mtu = self.attrs.mtu.bytes() as u64;
        let data = pkt.payload();
        let last = ends.then(|| HeldSendLast {
            psn,
            len: data.len() as u32,
            imm: pkt.imm_dt().map(|i| i.imm()),
        });
        if matches!(pos, Position::First | Position::Only) {
            // Its receive WQE, `k` behind the next one taken: exact, as a
            // selective requester keeps fewer than the span of them
            // unacknowledged (`Qp::next_request`); and at most one for each
            // message started since the expected PSN, and one for a WRITE
            // WITH IMMEDIATE in progress (it takes its WQE last).
            let k = (tag + span - u64::from(self.resp.rsn) % span) % span;
            if self.cfg.srq || held.sends.len() >= SEND_TAG_SPAN as usize || k > u64::from(d) + 1 {
                return false;
            }
            let rsn = self.resp.rsn.wrapping_add(k as u32);
            if held.sends.iter().any(|h| h.rsn == rsn) {
                return false;
            }
            let Some(sges) = self.resp.rq.sges_of(k as usize) else {
                return false;
            };
            if data.len() as u64 > sg_len(&sges)
                || mem.write_local(self.cfg.pd, &sges, 0, data).is_err()
            {
                // Refused when it comes in order (LOC_LEN_ERR, LOC_PROT_ERR).
                return false;
            }
            held.sends.push(HeldSend {
                first: psn,
                rsn,
                last,
            });
            return true;
        }
        // A later packet: of the message in progress (its packets before
        // the expected PSN each carried the MTU, C9-92), or of one held.
        let before = |l: Option<HeldSendLast>| l.is_none_or(|l| psn.distance_to(l.psn) > 0);
        let in_progress = self.resp.cur_recv.as_ref().and_then(|cur| {
            let index = cur.offset / mtu + u64::from(d);
            (index < span && index == tag && before(held.send_last)).then_some((
                index,
                cur.wr.sg_list,
                None,
            ))
        });
        let found = in_progress.or_else(|| {
            let (i, h) = held.sends.iter().enumerate().find(|(_, h)| {
                let index = h.first.distance_to(psn);
                index > 0 && (index as u64) < span && index as u64 == tag && before(h.last)
            })?;
            let sges = self
                .resp
                .rq
                .sges_of(h.rsn.wrapping_sub(self.resp.rsn) as usize)?;
            Some((h.first.distance_to(psn) as u64, sges, Some(i)))
        });
        let Some((index, sges, which)) = found else {
            return false;
        };
        let ending = match which {
            Some(i) => &mut held.sends[i].last,
            None => &mut held.send_last,
        };
        if last.is_some() && ending.is_some() {
            // Another last packet for a message that has one.
            return false;
        }
        let at = index * mtu;
        if at + data.len() as u64 > sg_len(&sges)
            || mem.write_local(self.cfg.pd, &sges, at, data).is_err()
        {
            return false;
        }
        if last.is_some() {
            *ending = last;
        }
        true
    }

    /// Places one packet ahead of the expected PSN: the checks of in-order
    /// placement, against the message the packet belongs to.
    fn place_ahead(
        &mut self,
        held: &mut Held,
        pkt: &IbPacket<&[u8]>,
        d: u32,
        mem: &mut impl Memory,
    ) -> Result<(), Refusal> {
        let psn = pkt.bth().psn();
        let mtu = self.attrs.mtu.bytes() as u64;
        let data = pkt.payload();
        let pos = pkt.info().position.unwrap_or(Position::Only);
        let (rkey, va, new) = match pos {
            Position::First | Position::Only => {
                let r = pkt.reth().ok_or(Refusal::Length)?;
                let len = u64::from(r.dma_length());
                let fits = match pos {
                    Position::Only => data.len() as u64 == len,
                    _ => len > mtu && data.len() as u64 == mtu,
                };
                if len > MAX_MSG_SIZE || !fits || held.messages.len() >= MESSAGES {
                    return Err(Refusal::Length);
                }
                if !self.write_allowed(mem, r.rkey(), r.virtual_address(), len) {
                    return Err(Refusal::RemoteAccess);
                }
                let m = HeldWrite {
                    first: psn,
                    rkey: r.rkey(),
                    va: r.virtual_address(),
                    len,
                };
                (m.rkey, m.va, Some(m))
            }
            Position::Middle | Position::Last => {
                // Bytes of the message left from this packet on.
                let (rkey, va, left) = match self.resp.cur_write {
                    Some(w) if u64::from(d) * mtu < w.remaining => {
                        let off = u64::from(d) * mtu;
                        (w.rkey, w.va + off, w.remaining - off)
                    }
                    _ => {
                        let m = held
                            .messages
                            .iter()
                            .find(|m| {
                                let k = m.first.distance_to(psn);
                                k > 0 && (k as u64) * mtu < m.len
                            })
                            .ok_or(Refusal::Length)?;
                        let off = m.first.distance_to(psn) as u64 * mtu;
                        (m.rkey, m.va + off, m.len - off)
                    }
                };
                let fits = match pos {
                    Position::Middle => data.len() as u64 == mtu && left > mtu,
                    _ => data.len() as u64 == left,
                };
                if !fits {
                    return Err(Refusal::Length);
                }
                (rkey, va, None)
            }
        };
        if matches!(pos, Position::Last | Position::Only) {
            // Placed when the sweep reaches it (see `HeldTail`).
            if !held.hold_tail(psn, rkey, va, data) {
                return Err(Refusal::Length);
            }
        } else if !data.is_empty() && mem.write_remote(rkey, va, data).is_err() {
            return Err(Refusal::RemoteAccess);
        }
        if let Some(m) = new {
            held.messages.push(m);
        }
        Ok(())
    }

    /// Responder, after the expected PSN moved `step` PSNs in order: moves
    /// it on over the packets held past it, finishing their messages in
    /// order and placing their held last packets. Returns how many it
    /// swept and whether a hole is known (held packets remain past the new
    /// expected PSN).
    pub(super) fn sweep_held(&mut self, step: u32, mem: &mut impl Memory) -> (u32, bool) {
        let Some(mut held) = self.resp.held.take() else {
            return (0, false);
        };
        if held.is_empty() {
            self.resp.held = Some(held);
            return (0, false);
        }
        let mtu = self.attrs.mtu.bytes() as u64;
        // PSNs a multi-PSN step jumped (a READ's responses) hold nothing
        // a correct requester sent; forget what a wrong one put there (all
        // of it past a whole window: a bit left behind would stand for a
        // PSN a window later, never received).
        if step >= WINDOW {
            held.clear_all();
        } else {
            for k in 1..=step {
                held.clear(self.resp.epsn - k);
            }
        }
        let mut swept = 0;
        while held.has(self.resp.epsn) {
            let psn = self.resp.epsn;
            held.clear(psn);
            let send = held.sends.iter().position(|h| h.first == psn);
            if self.resp.cur_recv.is_some() || send.is_some() {
                // A SEND packet placed ahead (`Qp::hold_send_ahead`).
                if !self.sweep_send(&mut held, send, psn, mtu) {
                    self.resp.held = Some(held);
                    self.nak(NakCode::InvalidRequest);
                    return (swept, false);
                }
                self.resp.epsn += 1;
                swept += 1;
                continue;
            }
            let first = held.messages.iter().position(|m| m.first == psn);
            let w = match first {
                Some(i) => {
                    let m = held.messages.swap_remove(i);
                    if self.resp.cur_write.is_some() || self.resp.cur_recv.is_some() {
                        // A new message inside another: what in order
                        // would have NAKed.
                        self.resp.held = Some(held);
                        self.nak(NakCode::InvalidRequest);
                        return (swept, false);
                    }
                    WriteInProgress {
                        rkey: m.rkey,
                        va: m.va,
                        remaining: m.len,
                        total: m.len,
                    }
                }
                None => match self.resp.cur_write {
                    Some(w) => w,
                    None => {
                        self.resp.held = Some(held);
                        self.nak(NakCode::InvalidRequest);
                        return (swept, false);
                    }
                },
            };
            if let Some(i) = held.tails.iter().position(|t| t.psn == psn) {
                let t = held.tails.swap_remove(i);
                let data = &held.tail_bytes[t.at..t.at + t.len];
                if !data.is_empty() && mem.write_remote(t.rkey, t.va, data).is_err() {
                    // What the packet would have drawn in order.
                    self.resp.cur_write = None;
                    self.resp.held = Some(held);
                    self.nak(NakCode::RemoteAccessError);
                    return (swept, false);
                }
            }
            let n = w.remaining.min(mtu);
            let w = WriteInProgress {
                va: w.va + n,
                remaining: w.remaining - n,
                ..w
            };
            if w.remaining == 0 {
                self.resp.cur_write = None;
                self.resp.msn = self.resp.msn.wrapping_add(1) & 0xff_ffff;
            } else {
                self.resp.cur_write = Some(w);
            }
            self.resp.epsn += 1;
            swept += 1;
        }
        // Messages that start behind the expected PSN were not what the
        // requester sent there: forget them.
        let epsn = self.resp.epsn;
        held.messages.retain(|m| epsn.distance_to(m.first) > 0);
        held.sends.retain(|m| epsn.distance_to(m.first) > 0);
        held.retain_tails(epsn);
        let hole = !held.bits.is_empty();
        self.resp.held = Some(held);
        (swept, hole)
    }

    /// Responder, sweeping: held SEND packet `psn`, the first of held
    /// message `start` or a later one of the message in progress, moves
    /// the receive on; a last one completes it. `false` for a packet the
    /// message cannot take (a new message inside another, or a receive
    /// WQE taken out of turn: what in order would have NAKed).
    fn sweep_send(&mut self, held: &mut Held, start: Option<usize>, psn: Psn, mtu: u64) -> bool {
        if let Some(i) = start {
            let h = held.sends.swap_remove(i);
            if self.resp.cur_recv.is_some()
                || self.resp.cur_write.is_some()
                || h.rsn != self.resp.rsn
                || held.send_last.is_some()
            {
                return false;
            }
            let Some(wr) = self.resp.rq.pop_front() else {
                return false;
            };
            self.resp.rsn = self.resp.rsn.wrapping_add(1);
            self.resp.cur_recv = Some(RecvInProgress { wr, offset: 0 });
            held.send_last = h.last;
        }
        let last = held.send_last.filter(|l| l.psn == psn);
        let Some(cur) = self.resp.cur_recv.as_mut() else {
            return false;
        };
        let Some(last) = last else {
            cur.offset += mtu;
            return true;
        };
        held.send_last = None;
        cur.offset += u64::from(last.len);
        let Some(cur) = self.resp.cur_recv.take() else {
            return false;
        };
        let wc = self.recv_done(&cur, last.imm);
        self.completions.push_back(wc);
        self.resp.msn = self.resp.msn.wrapping_add(1) & 0xff_ffff;
        self.counters.rdma_recvs += 1;
        true
    }

    /// Requester, a selective QP: a PSN sequence NAK for `psn` (everything
    /// before it acknowledged). Resends what the responder cannot hold;
    /// `false` when the retry count was spent (the QP failed).
    pub(super) fn retry_selective(&mut self, now: Nanos, psn: Psn) -> bool {
        // A NAK for a PSN resent within about a round trip was sent before
        // the resend arrived (the responder, filling the range's first
        // packet, found the next still missing): nothing to do.
        if let Some((lo, hi, at)) = self.req.resent {
            let recent = now.saturating_sub(at) < (2 * self.req.srtt).max(PROBE_FLOOR_NS);
            if recent && lo.distance_to(psn) >= 0 && psn.distance_to(hi) >= 0 {
                return true;
            }
        }
        // Holes are repaired one per round trip (a NAK names one); when
        // losses come dense (an overrun receive buffer, congestion control
        // off) that is slower than resending everything: past a few holes
        // in one recovery, go back N.
        let (end, holes) = match self.req.recovery {
            Some((end, holes)) if self.req.una_psn.distance_to(end) > 0 => (end, holes + 1),
            _ => (self.req.sent_high, 1),
        };
        if holes > HOLES_BEFORE_GO_BACK {
            self.req.recovery = None;
            self.counters.sr_go_backs += 1;
            return self.retry_from(psn);
        }
        self.req.recovery = Some((end, holes));
        let Some(w) = self.req.sq.iter().find(|w| w.contains(psn) && !w.done) else {
            return self.retry_from(psn);
        };
        let first = w.first_psn.unwrap_or_default();
        let k = first.distance_to(psn) as u32;
        let count = match w.wr.op {
            // The first packet lost: the rest of what was sent of the
            // message had nowhere to go.
            SendOp::Write { .. } | SendOp::WriteWithImm { .. } if k < w.next_pkt => {
                if k == 0 {
                    w.next_pkt.min(w.npsn)
                } else {
                    1
                }
            }
            // A SEND of at most SEND_TAG_SPAN packets: those past `psn`
            // were held (their tags tell the responder where they go), but
            // for the last packet of a SEND with invalidate; a longer one
            // goes back N, as the responder holds none of its packets past
            // the span.
            SendOp::Send | SendOp::SendWithImm(_) | SendOp::SendWithInv(_)
                if k < w.next_pkt && w.npsn <= SEND_TAG_SPAN =>
            {
                let sent = w.next_pkt.min(w.npsn);
                let inv = matches!(w.wr.op, SendOp::SendWithInv(_));
                if k == 0 || inv {
                    sent - k
                } else {
                    1
                }
            }
            // Not a WRITE, or a go-back already resends it.
            _ => return self.retry_from(psn),
        };
        let fresh = self.req.last_rewind != Some(psn);
        if !self.spend_retry(psn, true) {
            return false;
        }
        if fresh {
            self.counters.retransmits_started += 1;
            self.req.rtt_probe = None;
        }
        self.req.last_rewind = Some(psn);
        // A range still being resent that reaches past `psn` is kept whole
        // (its packets before `psn` arrived).
        let end = match self.req.resend {
            Some((s, n)) if s.distance_to(psn) >= 0 && psn.distance_to(s + n) > 0 => {
                let a = psn.distance_to(s + n) as u32;
                a.max(count)
            }
            _ => count,
        };
        self.req.resend = Some((psn, end));
        true
    }

    /// Requester, a selective QP with packets in flight: when to resend
    /// the oldest unacknowledged packet if nothing progresses (a lost
    /// resend, NAK, ACK or last packet would otherwise wait for the ACK
    /// timeout, which the application sets for RNICs: 2-67 ms): four
    /// smoothed round trips or the smoothed time and four mean deviations
    /// (RFC 6298's RTO), whichever is longer, at least [`PROBE_FLOOR_NS`]
    /// (none before the first sample), doubling per probe without
    /// progress, never past the ACK timer. When that lies past the timer
    /// (a queue milliseconds deep makes four round trips longer than the
    /// application's timeout), one probe a quarter timeout before the
    /// timer instead: cheaper than the timeout, which also spends a retry
    /// and halves the peer's window.
    pub(super) fn probe_deadline(&self) -> Option<Nanos> {
        let r = &self.req;
        if !self.attrs.selective_repeat || r.resend.is_some() {
            return None;
        }
        // No round trip measured yet, no probe: the guess would be the
        // floor, and thousands of QPs starting at once behind one peer's
        // window each wait longer than that for their first ACK (every
        // one probed, spuriously, at 10,240 QPs). A first flight's lost
        // tail waits for the ACK timer, as go-back-N's does.
        if r.srtt == 0 {
            return None;
        }
        let timer = r.timer?;
        let base = (4 * r.srtt).max(r.srtt + 4 * r.rttvar).max(PROBE_FLOOR_NS);
        let at = r.probe_from + (base << r.probes.min(8));
        if at < timer {
            return Some(at);
        }
        let early = timer.saturating_sub(self.ack_timeout_ns()? / 4);
        (early >= r.probe_from + PROBE_FLOOR_NS).then_some(early)
    }

    /// Requester, a selective QP: READ response `psn` of WQE `i`, past the
    /// first one missing. Placed where it goes (the requester knows the
    /// offset of every response of its READs) and remembered, and the hole
    /// before it asked for again once (`Qp::ask_read_hole`). `None` when
    /// it cannot be held (past the window): the caller goes back as
    /// go-back-N does. `Some(go_on)`: whether completions may be reaped (a
    /// placement that failed completes the READ in error).
    pub(super) fn hold_read_response(
        &mut self,
        i: usize,
        psn: Psn,
        pkt: &IbPacket<&[u8]>,
        mem: &mut impl Memory,
    ) -> Option<bool> {
        let mtu = self.attrs.mtu.bytes() as u64;
        let w = &self.req.sq[i];
        let first = w.first_psn?;
        if self.req.una_psn.distance_to(psn) >= WINDOW as i32 {
            return None;
        }
        let k = first.distance_to(psn) as u32;
        // Whatever its opcode (a re-request's responses start with FIRST
        // or ONLY anywhere in the READ), a response must carry exactly the
        // bytes of its place.
        let want = if k + 1 == w.npsn {
            w.len - u64::from(k) * mtu
        } else {
            mtu
        };
        let mut held = self.req.read_held.take().unwrap_or_default();
        let go_on = if held.has(psn) {
            false
        } else if pkt.payload_len() as u64 != want {
            self.counters.dropped_pkts += 1;
            false
        } else {
            let placed = mem.write_local(
                self.cfg.pd,
                self.req.sq.sges(i),
                u64::from(k) * mtu,
                pkt.payload(),
            );
            if placed.is_err() {
                let w = &mut self.req.sq[i];
                w.done = true;
                w.status = WcStatus::LocProtErr;
                true
            } else {
                held.set(psn);
                self.counters.sr_held_pkts += 1;
                false
            }
        };
        self.req.read_held = Some(held);
        if !go_on && !self.ask_read_hole(i) {
            return Some(false);
        }
        Some(go_on)
    }

    /// Requester: READ WQE `i` took a response in order; moves its count
    /// on over the responses held past it, and asks for the next hole
    /// when held ones remain beyond it.
    pub(super) fn sweep_read(&mut self, i: usize) {
        let Some(mut held) = self.req.read_held.take() else {
            return;
        };
        let w = &mut self.req.sq[i];
        let first = w.first_psn.unwrap_or_default();
        while w.read_got < w.npsn && held.has(first + w.read_got) {
            held.clear(first + w.read_got);
            w.read_got += 1;
        }
        if w.read_got >= w.npsn {
            w.done = true;
        }
        let left = w.npsn - w.read_got;
        let more = left > 0 && !held.is_empty() && held.hole_at(first + w.read_got, left) < left;
        self.req.read_held = Some(held);
        if more {
            // A QP that spent its retries failed: its completions are out.
            let _ = self.ask_read_hole(i);
        }
    }

    /// Requester: how many responses of READ WQE `i` are missing from its
    /// first missing one to the next held one (or its end).
    fn read_hole_len(&self, i: usize) -> u32 {
        let w = &self.req.sq[i];
        let left = w.npsn.saturating_sub(w.read_got);
        let start = w.first_psn.unwrap_or_default() + w.read_got;
        self.req
            .read_held
            .as_ref()
            .map_or(left, |h| h.hole_at(start, left))
    }

    /// Requester: asks again for READ WQE `i`'s first hole, the responses
    /// from its first missing one to the next held one, unless that hole
    /// was asked for already (a lost re-request is found by the probe or
    /// the ACK timer) or another resend is pending (the next response
    /// held past the hole asks again). A round of the retry count, as a
    /// WRITE's hole is, restored when the hole fills; `false` when the
    /// count was spent (the QP failed).
    pub(super) fn ask_read_hole(&mut self, i: usize) -> bool {
        let w = &self.req.sq[i];
        if w.done || !matches!(w.wr.op, SendOp::Read { .. }) {
            return true;
        }
        let Some(first) = w.first_psn else {
            return true;
        };
        let start = first + w.read_got;
        let n = self.read_hole_len(i);
        if n == 0 || self.req.read_hole == Some(start) || self.req.resend.is_some() {
            return true;
        }
        if !self.spend_retry(start, true) {
            return false;
        }
        if self.req.last_rewind != Some(start) {
            self.counters.retransmits_started += 1;
        }
        self.req.last_rewind = Some(start);
        self.req.rtt_probe = None;
        self.req.read_hole = Some(start);
        self.req.resend = Some((start, n));
        true
    }

    /// Requester: a probe resends the oldest unacknowledged packet when it
    /// is a SEND's or WRITE's (taken again at any responder: placed, or
    /// answered with an ACK). For a READ whose responses stopped short (the
    /// tail lost: nothing behind it shows the gap), it asks again for the
    /// rest, from the first missing response, as a timeout would, but
    /// without spending a retry; the responder answers a duplicate READ
    /// from the PSN it names. An atomic (or atomic write) waits for the
    /// ACK timer.
    /// `answered`: called for progress after a probe, where a READ, asked
    /// for again already, is left alone (its responses are coming).
    pub(super) fn probe_oldest(&mut self, answered: bool) {
        let una = self.req.una_psn;
        let Some(w) = self.req.sq.iter().find(|w| w.contains(una) && !w.done) else {
            return;
        };
        let k = w.first_psn.map_or(0, |f| f.distance_to(una) as u32);
        let read = matches!(w.wr.op, SendOp::Read { .. });
        let atomic = w.wr.op.is_atomic() || w.wr.op.is_atomic_write();
        if atomic || (read && answered) || k >= w.next_pkt {
            return;
        }
        // A READ's first hole: its first missing response to the next one
        // held (or its end).
        let n = if read {
            let i = self.req.sq.iter().position(|w| w.contains(una) && !w.done);
            i.map_or(1, |i| self.read_hole_len(i))
        } else {
            1
        };
        self.req.resend = Some((una, n.max(1)));
    }

    /// Requester: the WQE holding the next PSN of the selective resend
    /// range, if it is still unacknowledged (the range is dropped when not).
    pub(super) fn next_resend(&mut self) -> Option<usize> {
        let (mut p, mut n) = self.req.resend?;
        let una = self.req.una_psn;
        let behind = p.distance_to(una);
        if behind > 0 {
            // Acknowledged meanwhile.
            n = n.saturating_sub(behind as u32);
            p = una;
        }
        let i = (n > 0)
            .then(|| {
                self.req
                    .sq
                    .iter()
                    .position(|w| w.contains(p) && !w.done && w.first_psn.is_some())
            })
            .flatten();
        self.req.resend = i.map(|_| (p, n));
        i
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hole at a PSN ends at the next one set, across word boundaries
    /// and the PSN space's wrap, and never reaches past the range asked.
    #[test]
    fn a_hole_ends_at_the_next_psn_set() {
        let mut b = PsnBits::default();
        let from = Psn::new(0xff_ffc0);
        assert_eq!(b.hole_at(from, 500), 500);
        assert_eq!(b.hole_at(from, 5000), WINDOW);
        for k in [1u32, 63, 64, 65, 130, 700] {
            let mut b = PsnBits::default();
            b.set(from + k);
            assert_eq!(b.hole_at(from, 1000), k, "set at {k}");
            assert_eq!(b.hole_at(from, k), k, "range ends at {k}");
            assert_eq!(b.hole_at(from + k, 10), 0);
            assert_eq!(b.hole_at(from + (k + 1), 10), 10);
        }
        b.set(from + 70);
        b.set(from + 3);
        assert_eq!(b.hole_at(from, 1000), 3);
        b.clear(from + 3);
        assert_eq!(b.hole_at(from, 1000), 70);
        assert_eq!(b.count, 1);
    }

    /// A step of a whole window or more (a long READ's responses) leaves no
    /// held bit behind: one left would stand for a PSN a window later and
    /// be swept as received.
    #[test]
    fn a_step_past_the_window_forgets_every_held_psn() {
        let mut qp = Qp::new(QpConfig::new(Qpn::new(0x11).unwrap(), QpType::Rc, 1));
        let start = Psn::new(100);
        qp.resp.epsn = start;
        let mut held = Held::default();
        held.set(start + 5);
        held.set(start + 900);
        qp.resp.held = Some(Box::new(held));
        let step = WINDOW + 76;
        qp.resp.epsn = start + step;
        let mut mem = crate::sim::SimMemory::default();
        assert_eq!(qp.sweep_held(step, &mut mem), (0, false));
        let held = qp.resp.held.as_ref().unwrap();
        assert!(held.bits.is_empty());
        // The PSN aliasing `start + 5` a window later is not taken as held.
        assert!(!held.has(start + 5 + WINDOW * 2));

        // A shorter step forgets only what it jumped.
        let mut held = Held::default();
        held.set(start + step + 3);
        held.set(start + step + 10);
        qp.resp.held = Some(Box::new(held));
        qp.resp.epsn = start + step + 5;
        assert_eq!(qp.sweep_held(5, &mut mem), (0, true));
        assert_eq!(qp.resp.held.as_ref().unwrap().bits.count, 1);
    }

    /// Held tails stay within [`TAIL_BYTES`]: a swept tail's room is
    /// reused (the live ones packed, their bytes intact), a tail past the
    /// bound is refused, and the buffer is freed when none is left.
    #[test]
    fn held_tails_are_bounded_and_packed() {
        let mut held = Held::default();
        let start = Psn::new(7);
        let page = |k: u32| vec![k as u8; 4096];
        for k in 0..MESSAGES as u32 {
            assert!(held.hold_tail(start + k, 1, u64::from(k), &page(k)));
        }
        assert!(!held.hold_tail(start + 99, 1, 0, &[1]));
        // The first half swept: room for as many again.
        held.retain_tails(start + MESSAGES as u32 / 2);
        for k in 0..MESSAGES as u32 / 2 {
            assert!(held.hold_tail(start + 100 + k, 1, 0, &page(100 + k)));
        }
        assert!(held.tail_bytes.len() <= TAIL_BYTES);
        for t in &held.tails {
            let k = start.distance_to(t.psn) as u8;
            assert!(held.tail_bytes[t.at..t.at + t.len].iter().all(|&b| b == k));
        }
        held.retain_tails(start + 200);
        assert!(held.tails.is_empty() && held.tail_bytes.capacity() == 0);
    }
}
