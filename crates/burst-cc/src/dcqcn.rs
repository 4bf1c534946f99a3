//! DCQCN (Zhu et al., *Congestion Control for Large-Scale RDMA
//! Deployments*, SIGCOMM 2015, §3): the reaction point (RP) a sender runs
//! per QP, and the notification point (NP) a receiver runs per QP.
//!
//! RP, paper §3.1:
//! - on a CNP: `RT = RC; RC = RC * (1 - alpha/2); alpha = (1-g)*alpha + g`,
//!   and the rate-increase timer and byte counter start over;
//! - every `K` without a CNP: `alpha = (1-g)*alpha`;
//! - every `T` (timer) and every `B` bytes sent (byte counter), one
//!   increase step: fast recovery `RC = (RT+RC)/2` while both counters are
//!   below `F`; then additive increase `RT += R_AI` first; hyper increase
//!   `RT += i*R_HAI` once both exceed `F` (`i` = the smaller count - F).
//!
//! NP, paper §3.1: at most one CNP per QP per `N` for CE-marked packets.

use crate::{Acked, CcState, Controller, Nanos, Signal};

const MICROS: Nanos = 1_000;

/// DCQCN's parameters. Defaults are the paper's (§3, §5) where it gives
/// one, and NVIDIA's RNIC firmware defaults (ConnectX-4 and later, "DCQCN
/// CC Parameters", DOCA SDK 3.4 documentation) for the limits the paper
/// leaves open; rates are bytes per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DcqcnConfig {
    /// The line rate: where a flow starts and what it recovers to (100 Gb/s).
    pub line_rate: u64,
    /// `g`, alpha's gain: 1/256 (paper).
    pub g: f64,
    /// `K`, alpha's decay period without CNPs: 55 us (paper: just above the
    /// NP's 50 us CNP interval).
    pub alpha_period: Nanos,
    /// Alpha before the first CNP: 1 (paper; NVIDIA `initial_alpha_value`
    /// 1023/1024).
    pub initial_alpha: f64,
    /// `T`, the rate-increase timer: 55 us (paper).
    pub timer: Nanos,
    /// `B`, the byte counter: 10 MB (paper).
    pub byte_counter: u64,
    /// `F`, fast-recovery steps: 5 (paper).
    pub fast_recovery_steps: u32,
    /// `R_AI`, the additive increase: 40 Mb/s (paper).
    pub ai_rate: u64,
    /// `R_HAI`, the hyper increase: 10 x `R_AI` (the paper leaves it open;
    /// burst's choice).
    pub hai_rate: u64,
    /// The lowest rate a cut reaches: 1 Mb/s (NVIDIA `rpg_min_rate`).
    pub min_rate: u64,
    /// The most one cut takes away: a cut keeps at least this share of the
    /// rate, 0.5 (NVIDIA `rpg_min_dec_fac` 50%).
    pub min_dec_factor: f64,
    /// At most one cut per this period: 4 us (NVIDIA
    /// `rate_reduce_monitor_period`).
    pub cut_period: Nanos,
    /// `N`, the NP's least time between two CNPs of one QP: 50 us (paper).
    pub cnp_interval: Nanos,
}

impl Default for DcqcnConfig {
    fn default() -> Self {
        DcqcnConfig {
            line_rate: 100_000_000_000 / 8,
            g: 1.0 / 256.0,
            alpha_period: 55 * MICROS,
            initial_alpha: 1.0,
            timer: 55 * MICROS,
            byte_counter: 10_000_000,
            fast_recovery_steps: 5,
            ai_rate: 40_000_000 / 8,
            hai_rate: 400_000_000 / 8,
            min_rate: 1_000_000 / 8,
            min_dec_factor: 0.5,
            cut_period: 4 * MICROS,
            cnp_interval: 50 * MICROS,
        }
    }
}

impl DcqcnConfig {
    /// The defaults with `line_rate` (bytes per second).
    pub fn with_line_rate(line_rate: u64) -> DcqcnConfig {
        DcqcnConfig {
            line_rate: line_rate.max(1),
            ..DcqcnConfig::default()
        }
    }
}

/// Where a DCQCN flow is in its recovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DcqcnStage {
    /// At the line rate, no cut to recover from.
    LineRate,
    /// `RC` moving halfway to `RT` per step.
    FastRecovery,
    /// `RT` growing by `R_AI` per step.
    AdditiveIncrease,
    /// `RT` growing by `i*R_HAI` per step.
    HyperIncrease,
}

/// The DCQCN reaction point of one flow (a QP): a pacing rate cut by CNPs
/// and recovered by a timer and a byte counter.
///
/// ```
/// use burst_cc::{Controller, Dcqcn, DcqcnConfig, DcqcnStage, Signal};
/// let cfg = DcqcnConfig::with_line_rate(1_000_000);
/// let mut rp = Dcqcn::new(cfg);
/// rp.on_congestion(0, Signal::Cnp);
/// assert_eq!(rp.rate(), Some(500_000));
/// rp.handle_timeout(cfg.timer); // one timer step of fast recovery
/// assert_eq!(rp.rate(), Some(750_000));
/// assert_eq!(rp.stage(), DcqcnStage::FastRecovery);
/// ```
#[derive(Debug, Clone)]
pub struct Dcqcn {
    cfg: DcqcnConfig,
    /// `RC`, the current rate.
    rc: f64,
    /// `RT`, the target rate.
    rt: f64,
    alpha: f64,
    /// Timer steps since the last cut.
    t_steps: u32,
    /// Byte-counter steps since the last cut.
    b_steps: u32,
    /// Bytes toward the next byte-counter step.
    bytes: u64,
    /// When alpha next decays (`None`: before the first CNP).
    next_alpha: Option<Nanos>,
    /// When the timer next steps (`None`: at the line rate).
    next_step: Option<Nanos>,
    last_cut: Option<Nanos>,
    cuts: u64,
}

impl Dcqcn {
    /// A flow at the line rate (its timers start with the first CNP).
    pub fn new(cfg: DcqcnConfig) -> Dcqcn {
        Dcqcn {
            cfg,
            rc: cfg.line_rate as f64,
            rt: cfg.line_rate as f64,
            alpha: cfg.initial_alpha,
            t_steps: 0,
            b_steps: 0,
            bytes: 0,
            next_alpha: None,
            next_step: None,
            last_cut: None,
            cuts: 0,
        }
    }

    /// Alpha, the estimate of how congested the path is (0..=1).
    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    /// `RT`, the rate the flow recovers toward (bytes per second).
    pub fn target_rate(&self) -> u64 {
        self.rt as u64
    }

    /// The recovery stage.
    pub fn stage(&self) -> DcqcnStage {
        let f = self.cfg.fast_recovery_steps;
        if self.next_step.is_none() {
            DcqcnStage::LineRate
        } else if self.t_steps.max(self.b_steps) <= f {
            DcqcnStage::FastRecovery
        } else if self.t_steps.min(self.b_steps) > f {
            DcqcnStage::HyperIncrease
        } else {
            DcqcnStage::AdditiveIncrease
        }
    }

    fn cut(&mut self, now: Nanos) {
        if self
            .last_cut
            .is_some_and(|t| now < t.saturating_add(self.cfg.cut_period))
        {
            return;
        }
        let c = &self.cfg;
        self.rt = self.rc;
        let floor = (self.rc * c.min_dec_factor).max(c.min_rate as f64);
        self.rc = (self.rc * (1.0 - self.alpha / 2.0)).max(floor);
        self.alpha = (1.0 - c.g) * self.alpha + c.g;
        self.t_steps = 0;
        self.b_steps = 0;
        self.bytes = 0;
        self.next_alpha = Some(now + c.alpha_period);
        self.next_step = Some(now + c.timer);
        self.last_cut = Some(now);
        self.cuts += 1;
    }

    /// One increase step, in the stage the step counts (just incremented)
    /// put the flow.
    fn increase(&mut self) {
        let c = &self.cfg;
        let f = c.fast_recovery_steps;
        let line = c.line_rate as f64;
        match self.stage() {
            DcqcnStage::LineRate | DcqcnStage::FastRecovery => {}
            DcqcnStage::AdditiveIncrease => self.rt += c.ai_rate as f64,
            DcqcnStage::HyperIncrease => {
                let i = self.t_steps.min(self.b_steps) - f;
                self.rt += f64::from(i) * c.hai_rate as f64;
            }
        }
        self.rt = self.rt.min(line);
        self.rc = ((self.rt + self.rc) / 2.0).min(line);
        if line - self.rc < 1.0 {
            // Recovered: nothing left to time.
            self.rc = line;
            self.rt = line;
            self.next_step = None;
        }
    }

    /// Runs the timers due by `now` (alpha decay, timer steps).
    fn catch_up(&mut self, now: Nanos) {
        if let Some(t) = self.next_alpha.filter(|&t| t <= now) {
            let k = self.cfg.alpha_period.max(1);
            let n = (now - t) / k + 1;
            self.alpha *= (1.0 - self.cfg.g).powi(n.min(i32::MAX as u64) as i32);
            self.next_alpha = Some(t + n * k);
        }
        // Bounded: a flow reaches the line rate after a few thousand steps
        // at most (hyper increase grows each step).
        let mut guard = 0;
        while let Some(t) = self.next_step.filter(|&t| t <= now) {
            self.t_steps = self.t_steps.saturating_add(1);
            self.next_step = Some(t + self.cfg.timer.max(1));
            self.increase();
            guard += 1;
            if guard > 1_000_000 {
                self.rc = self.cfg.line_rate as f64;
                self.rt = self.rc;
                self.next_step = None;
            }
        }
    }
}

impl Controller for Dcqcn {
    fn on_sent(&mut self, now: Nanos, bytes: u64) {
        self.catch_up(now);
        if self.next_step.is_none() {
            return;
        }
        self.bytes += bytes;
        let b = self.cfg.byte_counter.max(1);
        while self.bytes >= b && self.next_step.is_some() {
            self.bytes -= b;
            self.b_steps = self.b_steps.saturating_add(1);
            self.increase();
        }
    }

    fn on_ack(&mut self, now: Nanos, _acked: Acked) {
        self.catch_up(now);
    }

    fn on_congestion(&mut self, now: Nanos, signal: Signal) {
        self.catch_up(now);
        // An RNIC's DCQCN reacts to CNPs only; losses are the transport's.
        if signal == Signal::Cnp {
            self.cut(now);
        }
    }

    fn handle_timeout(&mut self, now: Nanos) {
        self.catch_up(now);
    }

    fn poll_timeout(&self) -> Option<Nanos> {
        match (self.next_alpha, self.next_step) {
            (Some(a), Some(s)) => Some(a.min(s)),
            (a, s) => a.or(s),
        }
    }

    fn window(&self) -> Option<u64> {
        None
    }

    fn rate(&self) -> Option<u64> {
        Some(self.rc as u64)
    }

    fn state(&self) -> CcState {
        CcState {
            rate: self.rate(),
            window: None,
            alpha: self.alpha,
            cuts: self.cuts,
            srtt: 0,
        }
    }

    fn name(&self) -> &'static str {
        "dcqcn"
    }
}

/// The DCQCN notification point of one QP: whether a CE-marked packet
/// arriving now is answered with a CNP (at most one per `N`).
///
/// ```
/// use burst_cc::CnpGenerator;
/// let mut np = CnpGenerator::new(50_000);
/// assert!(np.on_marked(0));
/// assert!(!np.on_marked(49_999));
/// assert!(np.on_marked(50_000));
/// ```
#[derive(Debug, Clone, Copy)]
pub struct CnpGenerator {
    interval: Nanos,
    last: Option<Nanos>,
    sent: u64,
}

impl CnpGenerator {
    /// A generator sending at most one CNP per `interval`.
    pub fn new(interval: Nanos) -> CnpGenerator {
        CnpGenerator {
            interval,
            last: None,
            sent: 0,
        }
    }

    /// A CE-marked packet arrived at `now`: whether to send a CNP.
    pub fn on_marked(&mut self, now: Nanos) -> bool {
        if self
            .last
            .is_some_and(|l| now < l.saturating_add(self.interval))
        {
            return false;
        }
        self.last = Some(now);
        self.sent += 1;
        true
    }

    /// CNPs this generator asked for.
    pub fn sent(&self) -> u64 {
        self.sent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> DcqcnConfig {
        DcqcnConfig {
            line_rate: 1_000_000,
            g: 1.0 / 256.0,
            alpha_period: 55_000,
            initial_alpha: 1.0,
            timer: 55_000,
            byte_counter: 10_000,
            fast_recovery_steps: 5,
            ai_rate: 10_000,
            hai_rate: 100_000,
            min_rate: 1_000,
            min_dec_factor: 0.0,
            cut_period: 4_000,
            cnp_interval: 50_000,
        }
    }

    #[test]
    fn rate_after_k_cnps_follows_the_papers_recurrence() {
        // CNPs 10 us apart (less than K: alpha only grows).
        let c = cfg();
        let mut rp = Dcqcn::new(c);
        let (mut rc, mut alpha) = (1_000_000f64, 1.0f64);
        for k in 0..6u64 {
            rp.on_congestion(k * 10_000, Signal::Cnp);
            rc *= 1.0 - alpha / 2.0;
            alpha = (1.0 - c.g) * alpha + c.g;
            assert_eq!(rp.rate(), Some(rc as u64), "after {} CNPs", k + 1);
            assert!((rp.alpha() - alpha).abs() < 1e-12);
        }
        assert_eq!(rp.target_rate(), (rc / (1.0 - alpha / 2.0)) as u64);
    }

    #[test]
    fn alpha_decays_every_k_without_a_cnp() {
        let c = cfg();
        let mut rp = Dcqcn::new(c);
        rp.on_congestion(0, Signal::Cnp);
        let a0 = rp.alpha();
        rp.handle_timeout(3 * 55_000 + 1);
        let want = a0 * (1.0 - c.g).powi(3);
        assert!(
            (rp.alpha() - want).abs() < 1e-12,
            "{} vs {want}",
            rp.alpha()
        );
        // The next cut uses the decayed alpha.
        let rc = rp.rate().unwrap() as f64;
        rp.on_congestion(3 * 55_000 + 2, Signal::Cnp);
        assert_eq!(rp.rate(), Some((rc * (1.0 - want / 2.0)) as u64));
    }

    #[test]
    fn recovery_stages_by_timer() {
        // One cut to 500k (RT 1M), then timer steps only: five fast-recovery
        // steps halve the distance to RT, then RT is already at the line
        // rate, so additive steps keep halving toward it.
        let c = cfg();
        let mut rp = Dcqcn::new(c);
        rp.on_congestion(0, Signal::Cnp);
        let mut rc = 500_000f64;
        let mut t = 0;
        for step in 1..=5 {
            t += c.timer;
            rp.handle_timeout(t);
            rc = (1_000_000.0 + rc) / 2.0;
            assert_eq!(rp.rate(), Some(rc as u64), "fast recovery step {step}");
            assert_eq!(rp.stage(), DcqcnStage::FastRecovery);
        }
        // Steps until within 1 B/s of the line rate: then it is there.
        for _ in 0..40 {
            t += c.timer;
            rp.handle_timeout(t);
        }
        assert_eq!(rp.rate(), Some(1_000_000));
        assert_eq!(rp.stage(), DcqcnStage::LineRate);
        assert_eq!(rp.poll_timeout(), rp.next_alpha);
    }

    #[test]
    fn additive_and_hyper_increase_raise_the_target() {
        // Two cuts so RT is below the line: RT = 500k after the second.
        let c = cfg();
        let mut rp = Dcqcn::new(c);
        rp.on_congestion(0, Signal::Cnp); // RC 500k, RT 1M, alpha 1
        rp.on_congestion(10_000, Signal::Cnp); // RC 250k, RT 500k
        assert_eq!(rp.target_rate(), 500_000);
        let (mut rc, mut rt) = (250_000f64, 500_000f64);
        let mut t = 10_000;
        // Five timer steps: fast recovery.
        for _ in 0..5 {
            t += c.timer;
            rp.handle_timeout(t);
            rc = (rt + rc) / 2.0;
        }
        assert_eq!(rp.rate(), Some(rc as u64));
        // The sixth: additive increase (timer count 6 > F, bytes 0 < F).
        t += c.timer;
        rp.handle_timeout(t);
        rt += 10_000.0;
        rc = (rt + rc) / 2.0;
        assert_eq!((rp.target_rate(), rp.rate()), (rt as u64, Some(rc as u64)));
        assert_eq!(rp.stage(), DcqcnStage::AdditiveIncrease);
        // Six byte-counter steps: the first five are additive (bytes <= F),
        // then both counts pass F: hyper increase by (min - F) * R_HAI.
        for b in 1..=6u32 {
            rp.on_sent(t, c.byte_counter);
            if b <= 5 {
                rt += 10_000.0;
            } else {
                rt += 100_000.0;
            }
            rc = (rt + rc) / 2.0;
            assert_eq!(rp.target_rate(), rt as u64, "byte step {b}");
        }
        assert_eq!(rp.stage(), DcqcnStage::HyperIncrease);
        assert_eq!(rp.rate(), Some(rc as u64));
    }

    #[test]
    fn cuts_are_bounded_below_and_spaced() {
        let mut c = cfg();
        c.min_dec_factor = 0.75;
        let mut rp = Dcqcn::new(c);
        rp.on_congestion(0, Signal::Cnp);
        assert_eq!(rp.rate(), Some(750_000), "min_dec_factor bounds one cut");
        rp.on_congestion(1_000, Signal::Cnp);
        assert_eq!(rp.rate(), Some(750_000), "within the cut period");
        for k in 1..200 {
            rp.on_congestion(k * 5_000, Signal::Cnp);
        }
        assert_eq!(rp.rate(), Some(1_000), "never below min_rate");
        // Losses are not DCQCN's signal.
        let mut other = Dcqcn::new(c);
        other.on_congestion(0, Signal::Timeout);
        other.on_congestion(0, Signal::SequenceError);
        assert_eq!(other.rate(), Some(1_000_000));
    }

    #[test]
    fn cnp_generator_spaces_cnps_per_qp() {
        let mut np = CnpGenerator::new(50_000);
        let sent: Vec<bool> = [0, 10_000, 49_999, 50_000, 60_000, 100_000]
            .iter()
            .map(|&t| np.on_marked(t))
            .collect();
        assert_eq!(sent, [true, false, false, true, false, true]);
        assert_eq!(np.sent(), 3);
    }
}
