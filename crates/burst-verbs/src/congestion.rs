//! The device's congestion control (burst-cc in the data plane): a loss
//! window per peer shared by the QPs that go to it, a DCQCN rate per QP
//! (paced here), CNPs answered to CE-marked packets (the notification
//! point) and taken from peers (RNICs send them for their own marks too).
//! Crate-internal: the data-plane core calls it around each QP's transmit
//! and after each packet or timer handled for a QP.

// Looked up several times per packet; keyed by the QPs' own peers.
use rustc_hash::FxHashMap as HashMap;
use std::net::{IpAddr, SocketAddr};

use burst_cc::{Algorithm, CcState, CnpGenerator, Controller, Dcqcn, LossWindow, Signal};
use burst_transport::Qp;
use burst_wire::Qpn;

/// The pacing bucket: a paced QP sends each packet when its time comes
/// (as an RNIC's rate limiter does), and when the engine comes late, the
/// packets that fell due meanwhile, up to this many at once. Pacing in
/// bursts instead (16 packets, then a 16-packet gap) let the flows through
/// a bottleneck arrive in clumps, each drawing one CNP per clump: 8 DCQCN
/// flows then overflowed a 1024-packet queue (Jain 0.61), against a queue
/// of 145 and Jain 0.99 packet by packet (`examples/bottleneck.rs`).
const PACE_BURST: u64 = 16;

/// Nanoseconds between two `mtu`-byte packets at `rate` bytes per second.
fn packet_gap(mtu: u64, rate: Option<u64>) -> u64 {
    rate.map_or(0, |r| mtu.saturating_mul(1_000_000_000) / r.max(1))
}

burst_wire::counters! {
    /// Congestion-control counters of a device.
    #[derive(serde::Serialize, serde::Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct CongestionCounters {
        /// CNPs sent (answers to CE-marked packets).
        pub cnp_sent: u64,
        /// CNPs received.
        pub cnp_rcvd: u64,
        /// Received packets marked CE (congestion experienced).
        pub ce_rcvd: u64,
        /// Cuts of a peer window (NAK-sequence errors, timeouts, CNPs).
        pub window_cuts: u64,
        /// Cuts of a DCQCN rate (CNPs).
        pub rate_cuts: u64,
        /// Times a QP with requests to send was held back by its window or rate.
        pub held: u64,
        /// Times a QP was parked behind its peer's full window (no turn
        /// until the window has room).
        pub parks: u64,
    }
}

/// A peer's shared window and what its QPs have in flight.
#[derive(Debug)]
struct Peer {
    window: LossWindow,
    in_flight: u64,
    /// QPs (the data plane's indices) parked while the window was full:
    /// they get no turn until it has room again, in this order.
    waiting: std::collections::VecDeque<usize>,
    /// The round trip to this peer, smoothed over every QP's samples, and
    /// its mean deviation (ns, RFC 6298; 0: no sample yet): the estimate
    /// a QP without one of its own starts from ([`Qp::seed_rtt`]).
    srtt: u64,
    rttvar: u64,
}

impl Peer {
    /// Folds a QP's round-trip sample into the peer's estimate.
    fn sample_rtt(&mut self, rtt: u64) {
        (self.srtt, self.rttvar) = burst_transport::smooth_rtt((self.srtt, self.rttvar), rtt);
    }
}

/// The least packets of a peer's window that a QP released from its waiting
/// list may send in its turn: a GSO run of small messages, and one ACK for
/// them, before the next waiting QP's turn.
pub const GRANT: u64 = 16;

/// One QP's congestion state.
#[derive(Debug)]
pub(crate) struct QpFlow {
    /// The peer of a connected RC/UC QP (set at RTR).
    peer: Option<SocketAddr>,
    /// The peer's QP: where CNPs for this QP's marked packets go.
    dest_qpn: Qpn,
    /// Request packets in flight at the last look.
    in_flight: u32,
    rate: Option<Dcqcn>,
    /// Paced: no request packet before this time (device-clock ns).
    next_send: u64,
    np: CnpGenerator,
    /// The last credit was 0 because the peer's window was full (or other
    /// QPs wait for its room first).
    window_full: bool,
    /// In its peer's waiting list ([`Congestion::park`]).
    pub parked: bool,
    /// Packets of its peer's window this QP may send ahead of the QPs that
    /// still wait (its share when it was released; 0: none).
    grant: u64,
}

impl QpFlow {
    /// Taken out of its peer's waiting list with `grant` packets of room
    /// ([`Congestion::release`]).
    pub fn unpark(&mut self, grant: u64) {
        self.parked = false;
        self.grant = grant;
    }
}

impl Peer {
    /// Request packets the window lets out now.
    fn room(&self) -> u64 {
        self.window
            .window()
            .unwrap_or(u64::MAX)
            .saturating_sub(self.in_flight)
    }
}

/// The device's congestion control.
#[derive(Debug)]
pub(crate) struct Congestion {
    algo: Algorithm,
    peers: HashMap<IpAddr, Peer>,
    pub counters: CongestionCounters,
    /// CNPs to send: (peer, its QP).
    pub cnps: Vec<(SocketAddr, Qpn)>,
    /// The earliest time a QP held by its rate may send again.
    pace_wakeup: Option<u64>,
    /// Peers with parked QPs.
    parked_at: Vec<IpAddr>,
    /// Peers whose first round-trip sample came since the data plane last
    /// looked ([`Congestion::take_newly_timed`]).
    newly_timed: Vec<IpAddr>,
}

impl Congestion {
    pub fn new(algo: Algorithm) -> Congestion {
        Congestion {
            algo,
            peers: HashMap::default(),
            counters: CongestionCounters::default(),
            cnps: Vec::new(),
            pace_wakeup: None,
            parked_at: Vec::new(),
            newly_timed: Vec::new(),
        }
    }

    pub fn algorithm(&self) -> Algorithm {
        self.algo
    }

    /// A new QP's state.
    pub fn flow(&self) -> QpFlow {
        let dcqcn = self.algo.dcqcn();
        QpFlow {
            peer: None,
            dest_qpn: Qpn::default(),
            in_flight: 0,
            rate: None,
            next_send: 0,
            np: CnpGenerator::new(dcqcn.unwrap_or_default().cnp_interval),
            window_full: false,
            parked: false,
            grant: 0,
        }
    }

    /// The QP was connected to `peer`'s QP `dest_qpn` (modify to RTR).
    pub fn connect(&mut self, f: &mut QpFlow, qp: &Qp, peer: SocketAddr, dest: Qpn) {
        self.forget(f, qp);
        f.peer = Some(peer);
        f.dest_qpn = dest;
        // A place in another peer's list is that list's to release.
        f.parked = false;
        f.grant = 0;
        f.rate = self.algo.dcqcn().map(Dcqcn::new);
        if self.algo.loss_window() {
            self.peers.entry(peer.ip()).or_insert_with(|| Peer {
                window: LossWindow::new(Default::default()),
                in_flight: 0,
                waiting: Default::default(),
                srtt: 0,
                rttvar: 0,
            });
        }
    }

    /// The QP is going away: what it had in flight no longer counts.
    pub fn forget(&mut self, f: &mut QpFlow, _qp: &Qp) {
        if let Some(p) = f.peer.and_then(|a| self.peers.get_mut(&a.ip())) {
            p.in_flight = p.in_flight.saturating_sub(u64::from(f.in_flight));
        }
        f.in_flight = 0;
    }

    /// After the QP handled packets or timers: its events reach the
    /// controllers, its in-flight count the peer's. Returns the request
    /// packets and bytes it sent since the last call.
    pub fn account(&mut self, f: &mut QpFlow, qp: &mut Qp, now: u64) -> (u64, u64) {
        let ev = qp.take_path_events();
        let in_flight = qp.packets_in_flight();
        let sent = (ev.sent_pkts, ev.sent_bytes);
        let Some(peer) = f.peer else {
            return sent;
        };
        if !ev.is_empty() {
            if let Some(r) = f.rate.as_mut() {
                ev.feed(now, r);
            }
            if let Some(p) = self.peers.get_mut(&peer.ip()) {
                let before = p.window.state().cuts;
                ev.feed(now, &mut p.window);
                self.counters.window_cuts += p.window.state().cuts - before;
                if let Some(rtt) = ev.rtt {
                    if p.srtt == 0 {
                        self.newly_timed.push(peer.ip());
                    }
                    p.sample_rtt(rtt);
                }
            }
        }
        self.seed_rtt(f, qp);
        if in_flight != f.in_flight {
            if let Some(p) = self.peers.get_mut(&peer.ip()) {
                p.in_flight =
                    (p.in_flight + u64::from(in_flight)).saturating_sub(u64::from(f.in_flight));
            }
            f.in_flight = in_flight;
        }
        sent
    }

    /// A QP that has not timed a round trip yet starts from its peer's
    /// estimate ([`Qp::seed_rtt`]), if the peer has one, and follows it
    /// until it has a sample of its own.
    pub fn seed_rtt(&self, f: &QpFlow, qp: &mut Qp) {
        if qp.rtt().is_none() || qp.rtt_seeded() {
            if let Some(p) = f.peer.and_then(|a| self.peers.get(&a.ip())) {
                qp.seed_rtt(p.srtt, p.rttvar);
            }
        }
    }

    /// Peers whose first round-trip sample came since the last call, into
    /// `out`: their QPs that sent before it (a first flight whose tail was
    /// lost takes no more turns and hears nothing) are seeded by the data
    /// plane ([`Congestion::seed_rtt`]).
    pub fn take_newly_timed(&mut self, out: &mut Vec<IpAddr>) {
        out.clear();
        out.append(&mut self.newly_timed);
    }

    /// Before the QP transmits: how many request packets it may send now.
    /// While QPs wait in its peer's list, room goes to them first, oldest
    /// first ([`Congestion::release`]): a QP that was not released gets
    /// none and joins the back of the list, so the QPs that hold the
    /// window cannot take every packet of room their own ACKs free (at
    /// 0.1% loss, 1,000 flows behind a window cut to less than they need
    /// had Jain's index 0.04-0.16).
    pub fn credit(&mut self, f: &mut QpFlow, qp: &mut Qp, now: u64) -> Option<u32> {
        let _ = self.account(f, qp, now);
        f.window_full = false;
        let peer = f.peer?;
        let mut credit: Option<u32> = None;
        if let Some(p) = self.peers.get(&peer.ip()) {
            // A go-back's resends are a recovery: they take room without
            // waiting their turn (waiting, a QP at 1% loss spent its ACK
            // timer behind a thousand others, and its peer's window halved).
            // With nobody waiting a grant no longer limits.
            let room = if p.waiting.is_empty() || qp.go_back_pending() {
                p.room()
            } else {
                p.room().min(f.grant)
            };
            f.window_full = room == 0;
            credit = Some(room.min(u64::from(u32::MAX)) as u32);
        }
        if let Some(r) = f.rate.as_mut() {
            r.handle_timeout(now);
            if now < f.next_send {
                credit = Some(0);
                self.wake_at(f.next_send);
            } else {
                let gap = packet_gap(qp.mtu().bytes() as u64, r.rate());
                let due = (1 + (now - f.next_send) / gap.max(1)).min(PACE_BURST) as u32;
                credit = Some(credit.map_or(due, |c| c.min(due)));
            }
        }
        credit
    }

    /// Parks QP `i` (flow `f`) in its peer's waiting list when its last
    /// credit was 0 for a full window: it needs no turn until the window
    /// has room ([`Congestion::release`]), so a thousand QPs behind one
    /// full window cost nothing per round. `false` when not parked (held
    /// by its rate, or no shared window): it keeps its turns.
    pub fn park(&mut self, f: &mut QpFlow, i: usize) -> bool {
        let Some(p) = f.peer.filter(|_| f.window_full) else {
            return false;
        };
        let Some(peer) = self.peers.get_mut(&p.ip()) else {
            return false;
        };
        if !f.parked {
            f.parked = true;
            self.counters.parks += 1;
            if peer.waiting.is_empty() {
                self.parked_at.push(p.ip());
            }
            peer.waiting.push_back(i);
        }
        true
    }

    /// QPs whose peer's window has room again, oldest first, each with a
    /// grant of an eighth of the window (or the room left), while the room
    /// holds at least [`GRANT`] packets (a quarter of the window when that
    /// is less); each then gets a turn, the rest wait. Less room waits for
    /// more ACKs: a QP let out one packet at a time draws an ACK per packet
    /// (1,024 QPs of 64 B WRITEs over veth: 0.16 M msg/s against 1.45 M),
    /// and grants of 16 packets one per 16 (0.93 M). The caller unparks
    /// them ([`QpFlow::unpark`]).
    pub fn release(&mut self, out: &mut Vec<(usize, u64)>) {
        let peers = &mut self.peers;
        self.parked_at.retain(|ip| {
            let Some(p) = peers.get_mut(ip) else {
                return false;
            };
            let mut room = p.room();
            let window = p.window.window().unwrap_or(u64::MAX);
            // Room for less than `least` waits for more ACKs; a grant is
            // an eighth of the window, or what room is left.
            let least = GRANT.min(window / 4).max(1);
            let grant = least.max(window / 8);
            while room >= least {
                let Some(i) = p.waiting.pop_front() else {
                    break;
                };
                let g = grant.min(room);
                out.push((i, g));
                room -= g;
            }
            !p.waiting.is_empty()
        });
    }

    /// After the QP transmitted (`held`: requests its credit did not cover
    /// are left).
    pub fn sent(&mut self, f: &mut QpFlow, qp: &mut Qp, held: bool, now: u64) {
        let (pkts, bytes) = self.account(f, qp, now);
        // A grant lasts until spent: a turn that the full burst cut short
        // keeps the rest for the next round (its last packet asked for no
        // ACK; parked, it would wait a whole cycle of the list for one).
        f.grant = f.grant.saturating_sub(pkts);
        if held || !qp.has_requests_pending() {
            f.grant = 0;
        }
        if bytes > 0 {
            if let Some(rate) = f.rate.as_ref().and_then(|r| r.rate()) {
                // The bucket holds at most PACE_BURST packets' worth of
                // time: an idle QP does not save up a longer burst.
                let depth = PACE_BURST * packet_gap(qp.mtu().bytes() as u64, Some(rate));
                let from = f.next_send.max(now.saturating_sub(depth));
                f.next_send = from + bytes.saturating_mul(1_000_000_000) / rate.max(1);
            }
        }
        if held {
            self.counters.held += 1;
            if f.rate.is_some() && f.next_send > now {
                self.wake_at(f.next_send);
            }
        }
    }

    /// A CNP for this QP arrived: it cuts the QP's DCQCN rate and its
    /// peer's window (a path congested for one QP is for all of them).
    pub fn on_cnp(&mut self, f: &mut QpFlow, now: u64) {
        self.counters.cnp_rcvd += 1;
        if let Some(r) = f.rate.as_mut() {
            let before = r.state().cuts;
            r.on_congestion(now, Signal::Cnp);
            self.counters.rate_cuts += r.state().cuts - before;
        }
        if let Some(p) = f.peer.and_then(|a| self.peers.get_mut(&a.ip())) {
            let before = p.window.state().cuts;
            p.window.on_congestion(now, Signal::Cnp);
            self.counters.window_cuts += p.window.state().cuts - before;
        }
    }

    /// A CE-marked request for this QP arrived (the notification point):
    /// a CNP to the sender's QP, at most one per interval.
    pub fn on_ce(&mut self, f: &mut QpFlow, now: u64) {
        self.counters.ce_rcvd += 1;
        if let Some(peer) = f.peer {
            if f.np.on_marked(now) {
                self.cnps.push((peer, f.dest_qpn));
            }
        }
    }

    /// A paced QP may send again at `t`: the round's wake-up is the earliest.
    fn wake_at(&mut self, t: u64) {
        self.pace_wakeup = Some(self.pace_wakeup.map_or(t, |w| w.min(t)));
    }

    /// A transmit round begins: the pacing wake-up is found again.
    pub fn begin_round(&mut self) {
        self.pace_wakeup = None;
    }

    /// When a QP held by its rate in the last round may send again (for a
    /// caller that sleeps).
    pub fn pace_wakeup(&self) -> Option<u64> {
        self.pace_wakeup
    }

    /// Whether the QP is connected to a peer.
    pub fn connected_to(f: &QpFlow) -> Option<(SocketAddr, Qpn)> {
        f.peer.map(|p| (p, f.dest_qpn))
    }

    /// The state of every peer window and the device's counters.
    pub fn peer_states(&self) -> Vec<(IpAddr, CcState, u64)> {
        let mut v: Vec<_> = self
            .peers
            .iter()
            .map(|(ip, p)| (*ip, p.window.state(), p.in_flight))
            .collect();
        v.sort_by_key(|(ip, _, _)| *ip);
        v
    }

    /// The QP's DCQCN state, if it runs one.
    pub fn rate_state(f: &QpFlow) -> Option<CcState> {
        f.rate.as_ref().map(Controller::state)
    }
}
