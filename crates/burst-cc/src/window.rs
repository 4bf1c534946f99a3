//! A loss- and delay-driven window for peers that send no CNPs (kernel RXE
//! ignores ECN and never sends CNPs) and for lossy paths: one window of
//! request packets shared by every QP that goes to one peer, so that many
//! QPs together never overrun a receiver that one QP alone would not.
//!
//! - Slow start from [`LossWindowConfig::initial`], doubling per round trip;
//!   then one packet per window of acknowledged packets (additive increase).
//! - A NAK-sequence error (the receiver saw a gap: a packet was dropped)
//!   halves the window, once per round trip (a burst of NAKs from the QPs
//!   that lost packets in one overflow is one congestion event).
//! - A local ACK timeout (nothing came back at all) halves it too, once
//!   per round trip (not a restart from the minimum as TCP's RTO: the
//!   window is shared by every QP to the peer).
//! - Growth stops while the measured round trip exceeds the smallest one
//!   by more than [`LossWindowConfig::delay_target`]: a queue is building
//!   at the receiver (a socket buffer, a slow VM) before it overflows.
//! - A hole that a selective-repeat peer reported ([`Signal::Hole`]: one
//!   packet missing, the rest kept) cuts in proportion to the share of
//!   packets lost, as DCTCP cuts in proportion to the share marked
//!   (Alizadeh et al., SIGCOMM 2010): `alpha`, a moving average (gain
//!   1/16 per round trip) of the fraction of a round trip's packets that
//!   were holes, and at most once per round trip `cwnd *= 1 - a/2`, where
//!   `a` is the larger of `alpha` and the last round trip's fraction (an
//!   overflow is answered in the next round trip, not over sixteen).
//!   `alpha` starts at 1, so a first hole halves as a NAK does; an
//!   overflow that loses a large share keeps halving; a path that loses
//!   one packet in a hundred at random costs half a percent per round trip
//!   instead of half the window (an AIMD window halved per loss holds
//!   about `1.22/sqrt(p)` packets, 12 at 1% loss: 0.41-0.55x of lossless on
//!   a veth pair, docs/performance.md). Go-back-N peers never report holes:
//!   toward RXE and RNICs every NAK still halves.

use crate::{Acked, CcState, Controller, Nanos, Signal};

/// Parameters of a [`LossWindow`] (packets and nanoseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LossWindowConfig {
    /// The window a peer starts with.
    pub initial: u64,
    /// The least window.
    pub min: u64,
    /// The largest window.
    pub max: u64,
    /// Queueing delay (round trip above the smallest seen) above which the
    /// window stops growing (0: never held).
    pub delay_target: Nanos,
    /// The least time between two cuts when no round trip is measured yet.
    pub min_epoch: Nanos,
}

impl Default for LossWindowConfig {
    fn default() -> Self {
        LossWindowConfig {
            // 16 packets: 64 flows starting at once into a 1024-packet
            // bottleneck queue overflowed it at 64 each (1317 drops, flows
            // starved by 67 ms ACK timeouts, Jain 0.66) and shared it at 16
            // (0 drops, Jain 0.999; burst-verbs `examples/bottleneck.rs`).
            initial: 16,
            min: 2,
            max: 8192,
            delay_target: 2_000_000,
            min_epoch: 100_000,
        }
    }
}

/// The window of one peer (see the module documentation).
///
/// ```
/// use burst_cc::{Acked, Controller, LossWindow, LossWindowConfig, Signal};
/// let mut w = LossWindow::new(LossWindowConfig::default());
/// assert_eq!(w.window(), Some(16));
/// w.on_ack(1_000, Acked { packets: 16, rtt: Some(50_000) }); // slow start
/// assert_eq!(w.window(), Some(32));
/// w.on_congestion(2_000, Signal::SequenceError);
/// assert_eq!(w.window(), Some(16));
/// w.on_congestion(3_000, Signal::SequenceError); // same round trip
/// assert_eq!(w.window(), Some(16));
/// ```
#[derive(Debug, Clone)]
pub struct LossWindow {
    cfg: LossWindowConfig,
    /// Window, packets (fractional growth kept in `grow`).
    cwnd: u64,
    ssthresh: u64,
    /// Acknowledged packets toward the next additive step.
    grow: u64,
    srtt: Nanos,
    min_rtt: Nanos,
    last_rtt: Nanos,
    /// No cut before this time (one cut per round trip).
    epoch_end: Nanos,
    cuts: u64,
    /// The moving average of the fraction of packets that were holes,
    /// in 1/65536 (starts at 1: the first hole halves).
    alpha: u32,
    /// Packets acknowledged and holes reported in the current round trip
    /// of `alpha`'s, which ends at `alpha_end`.
    round_acked: u64,
    round_holes: u64,
    alpha_end: Nanos,
    /// The last finished round trip's share of holes (1/65536).
    last_frac: u32,
    holes: u64,
}

/// `alpha`'s unit (1.0).
const ALPHA_ONE: u32 = 1 << 16;
/// `alpha`'s gain per round trip (DCTCP's g = 1/16), as a shift.
const ALPHA_GAIN_SHIFT: u32 = 4;

/// `part` of `total` in `alpha`'s unit, at most 1.0 (0 of nothing is 0).
fn share(part: u64, total: u64) -> u32 {
    (u128::from(part) * u128::from(ALPHA_ONE) / u128::from(total.max(1))).min(u128::from(ALPHA_ONE))
        as u32
}

impl LossWindow {
    /// A window at [`LossWindowConfig::initial`].
    pub fn new(cfg: LossWindowConfig) -> LossWindow {
        let min = cfg.min.max(1);
        LossWindow {
            cfg: LossWindowConfig { min, ..cfg },
            cwnd: cfg.initial.clamp(min, cfg.max.max(min)),
            ssthresh: u64::MAX,
            grow: 0,
            srtt: 0,
            min_rtt: 0,
            last_rtt: 0,
            epoch_end: 0,
            cuts: 0,
            alpha: ALPHA_ONE,
            round_acked: 0,
            round_holes: 0,
            alpha_end: 0,
            last_frac: 0,
            holes: 0,
        }
    }

    /// Holes reported so far ([`Signal::Hole`]).
    pub fn holes(&self) -> u64 {
        self.holes
    }

    /// The moving average of the share of packets lost as holes (1.0 until
    /// round trips without holes bring it down).
    pub fn alpha(&self) -> f64 {
        f64::from(self.alpha) / f64::from(ALPHA_ONE)
    }

    /// Folds a round trip's share of holes into `alpha` when the round trip
    /// ended by `now`.
    fn end_round(&mut self, now: Nanos) {
        if now < self.alpha_end {
            return;
        }
        if self.alpha_end != 0 || self.round_acked + self.round_holes > 0 {
            let frac = share(self.round_holes, self.round_acked + self.round_holes);
            self.alpha = self.alpha - (self.alpha >> ALPHA_GAIN_SHIFT) + (frac >> ALPHA_GAIN_SHIFT);
            self.last_frac = frac;
        }
        self.round_acked = 0;
        self.round_holes = 0;
        self.alpha_end = now.saturating_add(self.epoch());
    }

    /// Whether the last round trip says a queue is building.
    fn delayed(&self) -> bool {
        self.cfg.delay_target > 0
            && self.min_rtt > 0
            && self.last_rtt > self.min_rtt.saturating_add(self.cfg.delay_target)
    }

    fn epoch(&self) -> Nanos {
        self.srtt.max(self.cfg.min_epoch)
    }
}

impl Controller for LossWindow {
    fn on_sent(&mut self, _now: Nanos, _bytes: u64) {}

    fn on_ack(&mut self, now: Nanos, acked: Acked) {
        if let Some(rtt) = acked.rtt {
            let rtt = rtt.max(1);
            self.last_rtt = rtt;
            self.min_rtt = if self.min_rtt == 0 {
                rtt
            } else {
                self.min_rtt.min(rtt)
            };
            self.srtt = if self.srtt == 0 {
                rtt
            } else {
                (7 * self.srtt + rtt) / 8
            };
        }
        self.end_round(now);
        self.round_acked += acked.packets;
        if acked.packets == 0 || self.delayed() {
            return;
        }
        if self.cwnd < self.ssthresh {
            self.cwnd = self.cwnd.saturating_add(acked.packets).min(self.ssthresh);
        } else {
            self.grow += acked.packets;
            while self.grow >= self.cwnd {
                self.grow -= self.cwnd;
                self.cwnd += 1;
            }
        }
        self.cwnd = self.cwnd.min(self.cfg.max.max(self.cfg.min));
    }

    fn on_congestion(&mut self, now: Nanos, signal: Signal) {
        if signal == Signal::Hole {
            self.end_round(now);
            self.round_holes += 1;
            self.holes += 1;
        }
        if now < self.epoch_end {
            return;
        }
        match signal {
            Signal::Hole => {
                // The last round trip's share, and this one's so far (over
                // at least a window: a round trip carries about that many),
                // count at once, so an overflow that loses many packets is
                // cut as hard as it deserves before `alpha` catches up.
                let total = (self.round_acked + self.round_holes).max(self.cwnd);
                let now_frac = share(self.round_holes, total);
                let a = u64::from(self.alpha.max(self.last_frac).max(now_frac));
                let cut = (self.cwnd * a / (2 * u64::from(ALPHA_ONE))).max(1);
                self.cwnd = self.cwnd.saturating_sub(cut).max(self.cfg.min);
                self.ssthresh = self.cwnd;
            }
            // A timeout halves too, rather than restarting from the
            // minimum as TCP does: the window is shared by every QP to the
            // peer, and one QP's lost ACK would otherwise throttle them all
            // (4,000 QPs of `ib_write_bw -q 4000 -n 5 -s 64` on loopback:
            // 0.006 Mpps restarting, 0.038 halving).
            Signal::SequenceError | Signal::Cnp | Signal::Timeout => {
                self.ssthresh = (self.cwnd / 2).max(self.cfg.min);
                self.cwnd = self.ssthresh;
            }
        }
        self.grow = 0;
        self.epoch_end = now.saturating_add(self.epoch());
        self.cuts += 1;
    }

    fn handle_timeout(&mut self, _now: Nanos) {}

    fn poll_timeout(&self) -> Option<Nanos> {
        None
    }

    fn window(&self) -> Option<u64> {
        Some(self.cwnd)
    }

    fn rate(&self) -> Option<u64> {
        None
    }

    fn state(&self) -> CcState {
        CcState {
            rate: None,
            window: Some(self.cwnd),
            alpha: 0.0,
            cuts: self.cuts,
            srtt: self.srtt,
        }
    }

    fn name(&self) -> &'static str {
        "loss-window"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(packets: u64, rtt: Nanos) -> Acked {
        Acked {
            packets,
            rtt: Some(rtt),
        }
    }

    #[test]
    fn slow_start_then_additive_increase() {
        let mut w = LossWindow::new(LossWindowConfig {
            initial: 4,
            ..Default::default()
        });
        w.on_ack(0, ack(4, 10_000));
        w.on_ack(0, ack(8, 10_000));
        assert_eq!(w.window(), Some(16), "doubling per window acknowledged");
        w.on_congestion(1_000, Signal::SequenceError);
        assert_eq!(w.window(), Some(8));
        // Past ssthresh: one packet per window of acknowledgements.
        w.on_ack(200_000, ack(7, 10_000));
        assert_eq!(w.window(), Some(8));
        w.on_ack(200_000, ack(1, 10_000));
        assert_eq!(w.window(), Some(9));
    }

    #[test]
    fn a_timeout_halves_the_shared_window() {
        let mut w = starting_at(64);
        w.on_congestion(0, Signal::Timeout);
        assert_eq!(w.window(), Some(32));
        // Past ssthresh: additive increase (1 per 32 acknowledged).
        w.on_ack(1_000_000, ack(64, 10_000));
        assert_eq!(w.window(), Some(33));
        assert_eq!(w.state().cuts, 1);
    }

    #[test]
    fn one_cut_per_round_trip() {
        let mut w = starting_at(64);
        w.on_ack(0, ack(0, 500_000));
        w.on_congestion(1_000_000, Signal::SequenceError);
        w.on_congestion(1_400_000, Signal::SequenceError);
        assert_eq!(w.window(), Some(32));
        w.on_congestion(1_500_000, Signal::Timeout);
        assert_eq!(w.window(), Some(16), "a new round trip: cut again");
    }

    #[test]
    fn growth_holds_while_a_queue_builds() {
        let mut w = starting_at(64);
        w.on_ack(0, ack(0, 100_000));
        w.on_ack(0, ack(64, 3_000_000));
        assert_eq!(w.window(), Some(64), "rtt 3 ms over a 0.1 ms floor");
        w.on_ack(0, ack(64, 200_000));
        assert_eq!(w.window(), Some(128));
    }

    #[test]
    fn the_window_stays_within_its_bounds() {
        let cfg = LossWindowConfig {
            initial: 8,
            min: 2,
            max: 100,
            ..Default::default()
        };
        let mut w = LossWindow::new(cfg);
        for _ in 0..100 {
            w.on_ack(0, ack(1_000, 1_000));
        }
        assert_eq!(w.window(), Some(100));
        for k in 0..50 {
            w.on_congestion(k * 1_000_000, Signal::SequenceError);
        }
        assert_eq!(w.window(), Some(2));
    }

    /// A window that starts at `initial` packets, the rest default.
    fn starting_at(initial: u64) -> LossWindow {
        LossWindow::new(LossWindowConfig {
            initial,
            ..Default::default()
        })
    }

    /// A window past slow start at `w` packets, `alpha` brought down by
    /// `rounds` round trips of 100 us without holes.
    fn settled(w: u64, rounds: u64) -> (LossWindow, Nanos) {
        let mut lw = starting_at(w);
        lw.ssthresh = w;
        let mut now = 0;
        for _ in 0..rounds {
            now += 100_000;
            lw.on_ack(now, ack(w, 100_000));
        }
        (lw, now)
    }

    #[test]
    fn a_first_hole_halves_as_a_nak_does() {
        let mut w = starting_at(64);
        w.on_congestion(0, Signal::Hole);
        assert_eq!(w.window(), Some(32));
        assert_eq!((w.holes(), w.state().cuts), (1, 1));
    }

    #[test]
    fn random_holes_cost_a_share_of_the_window_not_half() {
        // One packet in a hundred lost at random, every round trip: the
        // proportional cut keeps the window near where it was; the same
        // losses as NAKs (a go-back-N peer) halve it every round trip.
        let run = |signal: Signal| {
            let (mut w, mut now) = settled(200, 100);
            for _ in 0..200 {
                now += 100_000;
                let cwnd = w.window().unwrap();
                w.on_ack(now, ack(cwnd, 100_000));
                for _ in 0..(cwnd / 100).max(1) {
                    w.on_congestion(now + 50_000, signal);
                }
            }
            w.window().unwrap()
        };
        let (holes, naks) = (run(Signal::Hole), run(Signal::SequenceError));
        assert!(holes >= 100, "holes: {holes}");
        assert!(naks <= 20, "naks: {naks}");
    }

    #[test]
    fn a_round_trip_that_loses_a_large_share_is_cut_hard() {
        let (mut w, now) = settled(200, 100);
        assert!(w.alpha() < 0.01, "{}", w.alpha());
        let before = w.window().unwrap();
        // An overflow: 60 holes in one round trip of about 200 packets.
        for k in 0..60 {
            w.on_congestion(now + 10_000 + k, Signal::Hole);
        }
        let first = w.window().unwrap();
        assert!(first < before && first + 3 >= before, "{before} -> {first}");
        // The next round trip's first hole cuts by half the share seen.
        let later = now + 200_000;
        w.on_ack(later, ack(140, 100_000));
        w.on_congestion(later + 1, Signal::Hole);
        let second = w.window().unwrap();
        assert!(second * 100 <= first * 92, "{first} -> {second}");
        assert!(w.alpha() > 0.01, "{}", w.alpha());
    }
}
