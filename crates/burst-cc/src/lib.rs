#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod dcqcn;
mod window;

pub use dcqcn::{CnpGenerator, Dcqcn, DcqcnConfig, DcqcnStage};
pub use window::{LossWindow, LossWindowConfig};

/// Nanoseconds on the caller's clock (the data plane's monotonic clock or a
/// simulation's manual one).
pub type Nanos = u64;

/// A congestion signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Signal {
    /// A congestion notification packet arrived (RoCEv2 annex A17.9.2).
    Cnp,
    /// The peer NAKed a PSN sequence error: packets were lost on the way.
    SequenceError,
    /// The local ACK timer expired with packets unacknowledged.
    Timeout,
    /// The peer NAKed one missing packet and kept what came after it
    /// (selective repeat between burst peers): a single loss, resent alone.
    /// Random loss and congestion both make holes; [`LossWindow`] tells
    /// them apart by how many packets of a round trip are missing.
    Hole,
}

/// Progress reported to a controller: request packets the peer
/// acknowledged (or answered, for READs), with a round-trip sample when one
/// was timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Acked {
    /// Packets newly acknowledged.
    pub packets: u64,
    /// A round-trip time measured on one of them (Karn: never on a
    /// retransmitted packet).
    pub rtt: Option<Nanos>,
}

/// The state a controller shows in counters and logs.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CcState {
    /// The pacing rate, bytes per second (`None`: unpaced).
    pub rate: Option<u64>,
    /// The window, packets (`None`: unlimited).
    pub window: Option<u64>,
    /// DCQCN's alpha (0 for controllers without one).
    pub alpha: f64,
    /// Congestion signals that cut the rate or window.
    pub cuts: u64,
    /// The smoothed round trip, ns (0: none measured).
    pub srtt: Nanos,
}

/// A congestion controller: fed events and the time, asked for a window
/// and a rate. Implementations keep timers lazily: every call catches up
/// to `now`, and [`Controller::poll_timeout`] says when the next timed
/// change is due (for a caller that sleeps).
pub trait Controller: std::fmt::Debug + Send {
    /// `bytes` of request packets left at `now`.
    fn on_sent(&mut self, now: Nanos, bytes: u64);
    /// The peer acknowledged progress.
    fn on_ack(&mut self, now: Nanos, acked: Acked);
    /// A congestion signal arrived.
    fn on_congestion(&mut self, now: Nanos, signal: Signal);
    /// Runs the timed changes due by `now`.
    fn handle_timeout(&mut self, now: Nanos);
    /// When the next timed change is due.
    fn poll_timeout(&self) -> Option<Nanos>;
    /// Request packets that may be unacknowledged (`None`: no limit).
    fn window(&self) -> Option<u64>;
    /// Bytes per second to pace at (`None`: unpaced).
    fn rate(&self) -> Option<u64>;
    /// Counters and state for users.
    fn state(&self) -> CcState;
    /// The algorithm's name (`"dcqcn"`, `"loss-window"`).
    fn name(&self) -> &'static str;
}

/// The congestion control a device runs, as configured.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Algorithm {
    /// No control: each QP's own packet window only.
    None,
    /// DCQCN per QP, reacting to CNPs; peers that never send CNPs are not
    /// slowed by it.
    Dcqcn(DcqcnConfig),
    /// A loss- and delay-driven window per peer (the default: it is what
    /// keeps burst from overrunning kernel RXE, which sends no CNPs).
    #[default]
    LossWindow,
    /// Both: DCQCN's rate per QP inside a loss window per peer.
    DcqcnAndLossWindow(DcqcnConfig),
}

impl Algorithm {
    /// Parses a configuration name: `none`, `dcqcn`, `loss-window`,
    /// `dcqcn+loss-window`.
    ///
    /// ```
    /// use burst_cc::Algorithm;
    /// assert_eq!(Algorithm::from_name("none"), Some(Algorithm::None));
    /// assert!(matches!(Algorithm::from_name("dcqcn"), Some(Algorithm::Dcqcn(_))));
    /// assert_eq!(Algorithm::from_name("cubic"), None);
    /// ```
    pub fn from_name(name: &str) -> Option<Algorithm> {
        Some(match name.trim().to_ascii_lowercase().as_str() {
            "none" | "off" => Algorithm::None,
            "dcqcn" => Algorithm::Dcqcn(DcqcnConfig::default()),
            "loss-window" | "loss" | "window" => Algorithm::LossWindow,
            "dcqcn+loss-window" | "both" => Algorithm::DcqcnAndLossWindow(DcqcnConfig::default()),
            _ => return None,
        })
    }

    /// The configuration name ([`Algorithm::from_name`] reads it back).
    pub fn name(&self) -> &'static str {
        match self {
            Algorithm::None => "none",
            Algorithm::Dcqcn(_) => "dcqcn",
            Algorithm::LossWindow => "loss-window",
            Algorithm::DcqcnAndLossWindow(_) => "dcqcn+loss-window",
        }
    }

    /// Whether a per-QP DCQCN rate runs.
    pub fn dcqcn(&self) -> Option<DcqcnConfig> {
        match *self {
            Algorithm::Dcqcn(c) | Algorithm::DcqcnAndLossWindow(c) => Some(c),
            _ => None,
        }
    }

    /// Whether a per-peer loss window runs.
    pub fn loss_window(&self) -> bool {
        matches!(
            self,
            Algorithm::LossWindow | Algorithm::DcqcnAndLossWindow(_)
        )
    }
}

/// Jain's fairness index of `rates`: 1 when all are equal, 1/n when one
/// flow has everything (R. Jain et al., DEC-TR-301, 1984).
///
/// ```
/// assert_eq!(burst_cc::jain_index(&[5.0, 5.0, 5.0]), 1.0);
/// assert_eq!(burst_cc::jain_index(&[1.0, 0.0]), 0.5);
/// ```
pub fn jain_index(rates: &[f64]) -> f64 {
    let n = rates.len() as f64;
    let sum: f64 = rates.iter().sum();
    let sq: f64 = rates.iter().map(|r| r * r).sum();
    if n == 0.0 || sq == 0.0 {
        return 1.0;
    }
    sum * sum / (n * sq)
}
