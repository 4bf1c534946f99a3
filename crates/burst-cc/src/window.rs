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
        }
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

    fn on_ack(&mut self, _now: Nanos, acked: Acked) {
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
        if now < self.epoch_end {
            return;
        }
        match signal {
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
        let mut w = LossWindow::new(LossWindowConfig {
            initial: 64,
            ..Default::default()
        });
        w.on_congestion(0, Signal::Timeout);
        assert_eq!(w.window(), Some(32));
        // Past ssthresh: additive increase (1 per 32 acknowledged).
        w.on_ack(1_000_000, ack(64, 10_000));
        assert_eq!(w.window(), Some(33));
        assert_eq!(w.state().cuts, 1);
    }

    #[test]
    fn one_cut_per_round_trip() {
        let mut w = LossWindow::new(LossWindowConfig {
            initial: 64,
            ..Default::default()
        });
        w.on_ack(0, ack(0, 500_000));
        w.on_congestion(1_000_000, Signal::SequenceError);
        w.on_congestion(1_400_000, Signal::SequenceError);
        assert_eq!(w.window(), Some(32));
        w.on_congestion(1_500_000, Signal::Timeout);
        assert_eq!(w.window(), Some(16), "a new round trip: cut again");
    }

    #[test]
    fn growth_holds_while_a_queue_builds() {
        let mut w = LossWindow::new(LossWindowConfig {
            initial: 64,
            ..Default::default()
        });
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
}
