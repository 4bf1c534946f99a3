//! Moving packets: a round of transmit, receive and timers, ICRC checks,
//! demultiplexing, sealing, and what a fault in a QP does to the device.

use std::net::SocketAddr;

use burst_dsa::crc::continued;
use burst_io::{IcrcCheck, PayloadCrc, Port, RxMeta, MAX_GSO_SEGMENTS};
use burst_transport::{Qp, QpAttr, QpState, Srq};
use burst_wire::{IbPacket, Qpn, ICRC_LEN};

use crate::{contain, AsyncEvent, QpEvent, SrqId};

/// Lowest QPN handed out (0 and 1 are QP0/QP1; RXE starts at 0x11).
use super::*;

/// The ECN codepoint "congestion experienced" (RFC 3168).
pub(super) const ECN_CE: u8 = 0b11;

/// Packets one round sends at most: four GSO runs' worth.
pub(super) const TX_BURST: usize = 4 * MAX_GSO_SEGMENTS;

impl<P: Port> Device<P> {
    /// One round of progress: expired timers, transmit, receive a burst.
    ///
    /// Timers come first, so a retransmission they start leaves in this
    /// round. Transmit comes before receive: what this round's receives
    /// generate (ACKs)
    /// leaves with the next round, together with whatever the application
    /// posts in answer to this round's completions (a ping-pong's ACK and
    /// reply then share one `sendmmsg`, and the peer reads both with one
    /// `recvmmsg`).
    pub fn progress(&mut self) -> bool {
        let now = self.now();
        self.progress_at(now)
    }

    /// [`Device::progress`] with the time read by the caller (one clock
    /// read per round: they cost 30 ns each in a VM and showed in profiles).
    ///
    /// A panic while handling one QP (its packets, timers or transmit)
    /// moves that QP to the error state, flushing its work requests, and
    /// raises [`QpEvent::Fatal`]; one outside any QP (the port, the
    /// demux) fails every QP and raises [`AsyncEvent::DeviceFatal`]. Either
    /// way it is logged, the caller does not unwind, and the device keeps
    /// serving its other QPs.
    pub fn progress_at(&mut self, now: u64) -> bool {
        match contain(|| self.progress_inner(now)) {
            Ok(moved) => moved,
            Err(msg) => {
                self.device_fatal(&msg);
                true
            }
        }
    }

    pub(super) fn progress_inner(&mut self, now: u64) -> bool {
        // Expired timers before the transmit: a retransmission they start
        // leaves in this round's transmit, not a round (or, idle, a whole
        // timeout) later. But what the port holds is taken first when one
        // expired: an ACK that came while nobody stepped the lane (a thread
        // posting for longer than the timeout, one descheduled, a claim
        // lapsing) stops its timer before it fires, as on an RNIC, which
        // takes ACKs as they come.
        let mut due = std::mem::take(&mut self.due);
        while let Some(i) = self.ready.pop_expired(now) {
            let Some(s) = self.qps[i].as_mut() else {
                continue;
            };
            // The heap's deadline is a hint: the QP's own timer decides
            // (settling arms it again when it moved later). A QP without a
            // round trip of its own first follows its peer's estimate,
            // which grew if a queue built ahead of its first flight.
            self.ready.touch(i);
            self.cc.seed_rtt(&s.flow, &mut s.qp);
            if s.qp.poll_timeout().is_some_and(|t| t <= now) {
                due.push(i);
            }
        }
        let early = if due.is_empty() { 0 } else { self.receive(now) };
        let mut fired = 0;
        for i in due.drain(..) {
            let Some(s) = self.qps[i].as_mut() else {
                continue;
            };
            if s.qp.poll_timeout().is_some_and(|t| t <= now) {
                fired += 1;
                let timeouts = s.qp.counters().completer_retry_err;
                if let Err(msg) = contain(|| s.qp.handle_timeout(now)) {
                    self.qp_fatal(i, &msg);
                } else if let Some(s) = self.qps[i].as_mut() {
                    if s.qp.counters().completer_retry_err != timeouts {
                        // Rare and telling (a lost tail no probe caught, a
                        // peer gone): what the QP knew when it went back.
                        tracing::debug!(
                            qpn = s.qp.qpn().value(),
                            in_flight = s.qp.packets_in_flight(),
                            rtt = ?s.qp.rtt(),
                            seeded = s.qp.rtt_seeded(),
                            "ACK timeout: going back N"
                        );
                    }
                    let _ = self.cc.account(&mut s.flow, &mut s.qp, now);
                }
            }
        }
        self.due = due;
        self.trim_idle(now);
        self.check_link(now);
        let sent = self.transmit(now);
        let received = self.receive(now);
        self.settle();
        // Frames the link still holds count as work: nothing else would
        // wake the engine to push them out.
        let held = self.port.flush_tx();
        sent + early + received + fired > 0 || held
    }

    /// Contains a fault of the QP in slot `i`: error state (flushing its
    /// WRs), [`QpEvent::Fatal`], a log line.
    pub(super) fn qp_fatal(&mut self, i: usize, msg: &str) {
        let Some(s) = self.qps[i].as_mut() else {
            return;
        };
        let qpn = s.qp.qpn();
        self.ready.touch(i);
        // A QP already failed raises no second event (a fault that repeats
        // on every packet for it would flood the event queue).
        let first = s.qp.state() != QpState::Err;
        tracing::error!(
            qpn = qpn.value(),
            "internal fault handling QP {qpn}: {msg}; QP moved to the error state"
        );
        let to_err = QpAttr {
            state: Some(QpState::Err),
            ..Default::default()
        };
        if contain(|| s.qp.modify(&to_err)).is_err() {
            // Its state is beyond flushing: keep the QP number, in error.
            let mut fresh = Qp::new(*s.qp.config());
            let _ = fresh.modify(&to_err);
            s.qp = fresh;
            tracing::error!(
                qpn = qpn.value(),
                "QP {qpn}'s work requests could not be flushed"
            );
        }
        if first {
            self.events.push(AsyncEvent::Qp(qpn, QpEvent::Fatal));
        }
    }

    /// Fails the device after a fault outside any one QP (for an engine
    /// around it): every QP to the error state, [`AsyncEvent::DeviceFatal`].
    pub fn fail_all(&mut self, msg: &str) {
        self.device_fatal(msg);
    }

    /// Contains a fault outside any one QP: every QP to the error state,
    /// [`AsyncEvent::DeviceFatal`].
    pub(super) fn device_fatal(&mut self, msg: &str) {
        tracing::error!(
            "internal fault in the data plane: {msg}; every QP moved to the error state"
        );
        self.tx_held = 0;
        for i in 0..self.qps.len() {
            if self.qps[i]
                .as_ref()
                .is_some_and(|s| s.qp.state() != QpState::Err)
            {
                self.qp_fatal(i, msg);
            }
        }
        // Their flushed WRs complete now (the round that faulted ended
        // before its settling).
        self.settle();
        self.events.push(AsyncEvent::DeviceFatal);
    }

    /// Takes the asynchronous events raised since the last call (SRQ limits,
    /// contained faults), oldest first.
    #[must_use = "events not taken are lost"]
    pub fn take_async_events(&mut self) -> Vec<AsyncEvent> {
        for (i, s) in self.srqs.iter_mut().enumerate() {
            if s.as_mut().is_some_and(Srq::take_limit_event) {
                self.events
                    .push(AsyncEvent::SrqLimitReached(SrqId(i as u32)));
            }
        }
        std::mem::take(&mut self.events)
    }

    /// Test support for fault containment: the next packet for `qpn` makes
    /// the data plane panic while handling it (`None`: never).
    #[doc(hidden)]
    pub fn debug_panic_on_packet_for(&mut self, qpn: Option<Qpn>) {
        self.panic_for = qpn;
    }

    /// Sends what is pending (the ACKs of the last receives, newly posted
    /// requests) without receiving, and collects the completions that
    /// sending alone produces (UC and UD sends).
    pub fn transmit_now(&mut self) -> bool {
        let now = self.now();
        self.transmit_at(now)
    }

    /// [`Device::transmit_now`] with the time read by the caller.
    pub fn transmit_at(&mut self, now: u64) -> bool {
        let sent = self.transmit(now);
        self.settle();
        sent > 0
    }

    /// Sends what is pending without receiving: for a device about to close.
    pub fn flush(&mut self) {
        self.transmit_now();
    }

    /// Settles the QPs touched since the last time: collects their
    /// completions and events, arms their timers, and queues those with
    /// packets to send for the next transmit round.
    pub(super) fn settle(&mut self) {
        self.seed_newly_timed();
        let mut touched = std::mem::take(&mut self.slots);
        self.ready.take_touched(&mut touched);
        for &i in &touched {
            let Some(s) = self.qps[i].as_mut() else {
                continue;
            };
            let had = s.completions.len();
            while let Some(wc) = s.qp.poll_completion() {
                s.completions.push_back(wc);
            }
            if s.completions.len() > had {
                sends_first(&mut s.completions, had);
                self.ready.mark_completed(i);
            }
            let qpn = s.qp.qpn();
            self.events.extend(
                s.qp.take_events()
                    .into_iter()
                    .map(|e| AsyncEvent::Qp(qpn, e)),
            );
            self.ready.arm(i, s.qp.poll_timeout());
            if s.qp.has_transmit_pending() {
                self.ready.queue_transmit(i);
            }
            if !self.ready.idle_listed(i) && s.trimmable() {
                let at = self.clock.now() + TRIM_AFTER_NS;
                self.ready.note_idle(i, at, s.work());
            }
        }
        self.slots = touched;
    }

    /// A peer's first round-trip sample came: its QPs without an estimate
    /// start from it (once per peer; a walk over the lane's QPs), and
    /// their timers are armed again, so that a selective QP whose first
    /// flight lost its tail probes it instead of waiting for the ACK timer.
    fn seed_newly_timed(&mut self) {
        let mut peers = std::mem::take(&mut self.timed);
        self.cc.take_newly_timed(&mut peers);
        if !peers.is_empty() {
            for (i, s) in self.qps.iter_mut().enumerate() {
                let Some(s) = s.as_mut() else { continue };
                let to = Congestion::connected_to(&s.flow).map(|(a, _)| a.ip());
                if s.qp.rtt().is_none() && to.is_some_and(|ip| peers.contains(&ip)) {
                    self.cc.seed_rtt(&s.flow, &mut s.qp);
                    self.ready.touch(i);
                }
            }
        }
        self.timed = peers;
    }

    /// Gives back the queue memory of QPs idle since their queues emptied
    /// ([`TRIM_AFTER_NS`]); one that took work meanwhile waits again.
    fn trim_idle(&mut self, now: u64) {
        while let Some((i, work)) = self.ready.pop_idle(now) {
            let Some(s) = self.qps[i].as_mut() else {
                continue;
            };
            if s.work() == work {
                s.trim();
            } else if s.trimmable() {
                self.ready.note_idle(i, now + TRIM_AFTER_NS, s.work());
            }
        }
    }

    /// Returns the packets received.
    ///
    /// The port lends its frames ([`Port::recv_frames`]): each is checked,
    /// demultiplexed and placed where the port holds it, with no copy into
    /// a batch of the device's. An offloading copier is the exception: its
    /// placements finish after the frame's call returns, so the frames are
    /// first received into the device's batch, whose buffers stay until
    /// the drain.
    pub(super) fn receive(&mut self, now: u64) -> usize {
        let local = self.port.local_addr();
        let mut faulted: Vec<(usize, String)> = Vec::new();
        let (icrc, counters, gsi, mcast) =
            (&mut self.icrc, &mut self.counters, &self.gsi, &self.mcast);
        let (qps, srqs, cc, lane, panic_for, ready) = (
            &mut self.qps,
            &mut self.srqs,
            &mut self.cc,
            self.lane,
            self.panic_for,
            &mut self.ready,
        );
        let mut frame = |mem: &mut burst_mem::TableMemory<'_>, meta: RxMeta, bytes: &[u8]| {
            let peer = meta.peer;
            counters.rcvd_pkts += 1;
            let Ok(pkt) = IbPacket::new_checked(bytes) else {
                counters.malformed += 1;
                return;
            };
            // A datagram to a multicast group or to another of the device's
            // GIDs: its ICRC covers that address.
            let local = meta
                .dest
                .map_or(local, |g| SocketAddr::new(g, local.port()));
            let qpn = pkt.bth().dest_qp();
            // The payload of a packet whose destination follows from its
            // QP's state is placed while its ICRC is computed, one pass
            // over it (`Qp::in_order_placement`); the transport's write
            // of it then finds it done.
            let unicast = !meta.dest.is_some_and(|g| g.is_multicast())
                && qpn.value() != crate::gsi::GSI_QPN
                && qpn.value() != MULTICAST_QPN;
            let placement = (unicast && !meta.icrc_verified)
                .then(|| qp_index_in(qps, lane, qpn).ok())
                .flatten()
                .and_then(|i| qps[i].as_ref())
                .and_then(|s| s.qp.in_order_placement(&pkt));
            let check = if meta.icrc_verified {
                // Checked by the port over the headers as received.
                IcrcCheck::Ok
            } else if let Some(place) = placement {
                let payload = pkt.payload();
                let at = payload.as_ptr() as usize - bytes.as_ptr() as usize;
                let pad = &bytes[at + payload.len()..bytes.len() - ICRC_LEN];
                let rest = |head| {
                    let crc = mem
                        .place_received_crc(&place, payload, head)
                        .unwrap_or_else(|| continued(head, payload));
                    continued(crc, pad)
                };
                match meta.pseudo_crc {
                    // A whole-frame port's headers as they came.
                    Some(pseudo) => icrc.check_after(pseudo, bytes, at, rest),
                    None => icrc.check_with(peer, local, bytes, meta.ip_id, at, rest),
                }
            } else if let Some(pseudo) = meta.pseudo_crc {
                let end = bytes.len().saturating_sub(ICRC_LEN);
                icrc.check_after(pseudo, bytes, end, |crc| crc)
            } else {
                icrc.check(peer, local, bytes, meta.ip_id)
            };
            match check {
                IcrcCheck::Ok => counters.icrc_verified += 1,
                IcrcCheck::OkWithId(_) => counters.icrc_id_solved += 1,
                IcrcCheck::Unverifiable => counters.icrc_unverified += 1,
                IcrcCheck::Bad => {
                    // What it placed lies where the good packet's payload
                    // will, in a message not complete yet.
                    mem.forget_placed();
                    counters.icrc_errors += 1;
                    return;
                }
            }
            if qpn.value() == crate::gsi::GSI_QPN {
                match &gsi {
                    Some(gsi) => gsi.receive(peer.ip(), &pkt),
                    None => counters.no_qp += 1,
                }
                return;
            }
            // QPN 0xFFFFFF to a group: a copy for every QP attached to it
            // (each checks its Q_Key); to our own address it names no QP.
            let targets: &[Qpn] = match meta.dest {
                Some(g) if g.is_multicast() && qpn.value() == MULTICAST_QPN => {
                    mcast.get(&burst_wire::gid_of(g)).map_or(&[], Vec::as_slice)
                }
                Some(g) if g.is_multicast() => &[],
                _ if qpn.value() == MULTICAST_QPN => &[],
                _ => std::slice::from_ref(&qpn),
            };
            if targets.is_empty() {
                counters.no_qp += 1;
                return;
            }
            for &qpn in targets {
                let Ok(i) = qp_index_in(qps, lane, qpn) else {
                    counters.no_qp += 1;
                    continue;
                };
                let Some(s) = qps[i].as_mut() else {
                    continue;
                };
                ready.touch(i);
                if pkt.info().transport == burst_wire::Transport::Cnp {
                    // Congestion notification: for the controllers, not the QP.
                    cc.on_cnp(&mut s.flow, now);
                    continue;
                }
                if meta.ecn == ECN_CE {
                    cc.on_ce(&mut s.flow, now);
                }
                // Only UD receives carry a GRH area: don't build it for RC/UC.
                let grh = (pkt.info().transport == burst_wire::Transport::Ud)
                    .then(|| burst_wire::ud_grh_for(peer.ip(), local.ip(), bytes.len()))
                    .flatten();
                let srq = s.srq.and_then(|i| srqs.get_mut(i)).and_then(Option::as_mut);
                let inject = panic_for == Some(qpn);
                let handled = contain(|| {
                    assert!(!inject, "fault injected for QP {qpn}");
                    match srq {
                        Some(srq) => s.qp.handle_packet_srq(now, &pkt, grh.as_ref(), mem, srq),
                        None => s.qp.handle_packet(now, &pkt, grh.as_ref(), mem),
                    }
                });
                if let Err(msg) = handled {
                    faulted.push((i, msg));
                } else {
                    let _ = cc.account(&mut s.flow, &mut s.qp, now);
                }
            }
            mem.forget_placed();
        };
        let n = if self.copier.offloads() {
            let rx = self.rx.get_or_insert_with(|| RxBatch::new(BURST));
            let n = self.port.recv_batch(rx).unwrap_or(0);
            // SAFETY: the batch's buffers are not touched again before the
            // drain below (the next receive reuses them).
            unsafe { self.copier.defer_from(rx.buffers()) };
            let mut mem = self.mrs.memory_through(&mut self.copier);
            for (meta, bytes) in rx.frames() {
                frame(&mut mem, meta, bytes);
            }
            n
        } else {
            let mut mem = self.mrs.memory_through(&mut self.copier);
            self.port
                .recv_frames(BURST, &mut |meta, bytes| frame(&mut mem, meta, bytes))
                .unwrap_or(0)
        };
        if n > 0 {
            self.last_rx = now;
        }
        // Every placement lands before anything it precedes is seen: the
        // completions collected next, the ACKs sent next.
        self.copier.drain();
        for (i, msg) in faulted {
            self.qp_fatal(i, &msg);
        }
        n
    }

    /// Returns the packets handed to the port.
    pub(super) fn transmit(&mut self, now: u64) -> usize {
        // What was posted or touched since the last round joins the queue,
        // corked sends too.
        self.corked = 0;
        self.settle();
        let mut sent = 0;
        if self.tx_held > 0 {
            sent = self.send_held(self.tx_held);
            if self.tx_held > 0 {
                return sent;
            }
        }
        // Packets are built where the port sends them from, where it lends
        // its frames (DPDK mbufs); a buffer keeps its frame until it is sent.
        self.port.lend_frames(&mut self.tx);
        // SAFETY: the send buffers past the held ones are filled here and
        // read only after the drain below (sealing).
        unsafe {
            self.copier.defer_into(
                self.tx
                    .iter_mut()
                    .map(|b| (b.data.as_mut_ptr(), b.data.len())),
            )
        };
        let mem = self.mrs.memory_through(&mut self.copier);
        let mut n = 0;
        // CNPs first: they are what slows the congested senders down.
        while n < self.tx.len() {
            let Some((peer, dest)) = self.cc.cnps.pop() else {
                break;
            };
            let ib = burst_wire::IbRepr::cnp(dest);
            let len = ib.buffer_len();
            let buf = &mut self.tx[n];
            if ib.emit(&mut buf.data[..len]).is_ok() {
                buf.len = len;
                buf.peer = peer;
                buf.src = None;
                buf.payload_crc = None;
                self.counters.sent_pkts += 1;
                self.cc.counters.cnp_sent += 1;
                n += 1;
            }
        }
        // Then connection management (rare, small, time-critical for the
        // peer's CM timers).
        if let Some(gsi) = &self.gsi {
            while n < self.tx.len() && gsi.has_transmit() {
                let buf = &mut self.tx[n];
                let Some((len, peer)) = gsi.transmit(&mut buf.data[..]) else {
                    break;
                };
                buf.len = len;
                buf.peer = peer;
                buf.src = None;
                buf.payload_crc = None;
                self.counters.sent_pkts += 1;
                n += 1;
            }
        }
        self.cc.begin_round();
        // QPs parked behind a full peer window whose window has room again
        // take their turns.
        let mut released = std::mem::take(&mut self.released);
        self.cc.release(&mut released);
        for (i, grant) in released.drain(..) {
            if let Some(s) = self.qps[i].as_mut() {
                s.flow.unpark(grant);
                self.ready.queue_transmit(i);
            }
        }
        self.released = released;
        let mut faulted: Vec<(usize, String)> = Vec::new();
        // Each QP in the queue gets a turn in order (the round robin: a QP
        // the full burst left out goes first next round, one still sending
        // after its turn goes to the back).
        let mut turns = self.ready.transmit_len();
        while turns > 0 && n < self.tx.len() {
            turns -= 1;
            let Some(i) = self.ready.next_transmit() else {
                break;
            };
            let Some(s) = self.qps[i].as_mut() else {
                continue;
            };
            if !s.qp.has_transmit_pending() {
                continue;
            }
            let credit = self.cc.credit(&mut s.flow, &mut s.qp, now);
            // Only requests to send and a full peer window: parked until
            // the window has room (no turn meanwhile).
            if credit == Some(0) && !s.qp.has_unheld_pending() && self.cc.park(&mut s.flow, i) {
                continue;
            }
            // At most what the burst has room for: the last packet that fits
            // then asks for an ACK (a turn cut short by the full burst may
            // wait behind the peer's waiting QPs before its next one).
            let room = (self.tx.len() - n).min(u32::MAX as usize) as u32;
            s.qp.set_request_credit(credit.map(|c| c.min(room)));
            let q = &mut s.qp;
            let (tx, ahs, counters) = (&mut self.tx, &self.ahs, &mut self.counters);
            let start = n;
            let filled = contain(|| {
                let mut n = start;
                while n < tx.len() {
                    let Some(t) = q.poll_transmit(now) else { break };
                    let Some(Some(Ah { peer, src, .. })) = ahs.get(t.ah as usize).copied() else {
                        continue;
                    };
                    let len = t.ib.buffer_len();
                    let buf = &mut tx[n];
                    if len > buf.data.len() || t.ib.emit(&mut buf.data[..len]).is_err() {
                        continue;
                    }
                    let at = t.ib.header_len();
                    let plen = t.ib.payload_len;
                    let Ok(crc) = t.gather_crc(&mem, &mut buf.data[at..at + plen]) else {
                        continue;
                    };
                    counters.sent_pkts += 1;
                    buf.len = len;
                    buf.peer = peer;
                    buf.src = src;
                    buf.payload_crc = crc.map(|crc| PayloadCrc { at, len: plen, crc });
                    n += 1;
                }
                q.flush_unreliable();
                n
            });
            match filled {
                Ok(k) => {
                    // Requests left while the burst had room: held by the
                    // window or rate.
                    let held = k < tx.len() && credit.is_some() && q.has_requests_pending();
                    n = k;
                    self.cc.sent(&mut s.flow, &mut s.qp, held, now);
                    if k > start || s.qp.has_completions() {
                        // Its timer, completions and queue place change.
                        self.ready.touch(i);
                    } else if s.qp.has_transmit_pending() {
                        // Held back, nothing else changed: its turn again
                        // next round, without settling (a thousand QPs
                        // behind a full peer window cost a queue push
                        // each, not a settle).
                        self.ready.queue_transmit(i);
                    }
                }
                // What this QP built before its fault is not sent.
                Err(msg) => {
                    self.ready.touch(i);
                    faulted.push((i, msg));
                }
            }
        }
        // Gathers into the send buffers finish before sealing reads them.
        self.copier.drain();
        for (i, msg) in faulted {
            self.qp_fatal(i, &msg);
        }
        if n > 0 {
            // Sealed last: a packet's IP ID (in its ICRC) may depend on the
            // whole burst (a UDP socket's GSO runs).
            self.port.assign_ip_ids(&mut self.tx[..n]);
            let sealed = burst_io::seal_all(self.port.local_addr(), &mut self.tx[..n]);
            sent += self.send_held(sealed);
        }
        sent
    }

    /// Sends the first `n` (sealed) packets of `tx`; keeps what the port
    /// refused at the front of `tx` for the next round (the port takes
    /// whole GSO runs, so the IDs of the rest stay right).
    pub(super) fn send_held(&mut self, n: usize) -> usize {
        // The port may take the buffers it sends (the SimPort queues them):
        // every packet is built anew in whatever buffer is here next round.
        let took = match self.port.send_frames(&mut self.tx[..n]) {
            Ok(k) => k.min(n),
            Err(e) => {
                // Not a full queue: the transport retransmits what is lost.
                tracing::debug!("send: {e}");
                n
            }
        };
        self.tx[..n].rotate_left(took);
        self.tx_held = n - took;
        took
    }
}

/// Moves the send completions among `completions[from..]` ahead of the
/// receive completions, each kind in its own order (no allocation).
///
/// IBA orders a work queue's completions, not a QP's send queue against
/// its receive queue, but applications see the order RNICs and RXE give:
/// they ACK a message when it lands, so the ACK of a peer's message comes
/// before the peer's reply, and the send completes before the reply's
/// receive. burst's peer sends its ACK with the reply (after it: the reply
/// is on the critical path), in one GSO datagram: taken in one round here,
/// they complete in the order an RNIC's would. perftest's `ib_send_lat -e`
/// waits for its send's event on a channel both CQs share, and read a
/// completion that was not there when the receive's event came first.
fn sends_first(
    completions: &mut std::collections::VecDeque<burst_transport::WorkCompletion>,
    from: usize,
) {
    // Usually one kind only: nothing to move, no rearranging of the deque.
    let mut kinds = completions.range(from..).map(|w| w.is_recv());
    if !kinds.any(|r| r) || !kinds.any(|r| !r) {
        return;
    }
    let new = &mut completions.make_contiguous()[from..];
    let mut first_recv: Option<usize> = None;
    for j in 0..new.len() {
        match (new[j].is_recv(), first_recv) {
            (true, None) => first_recv = Some(j),
            (false, Some(k)) => {
                new[k..=j].rotate_right(1);
                first_recv = Some(k + 1);
            }
            _ => {}
        }
    }
}
