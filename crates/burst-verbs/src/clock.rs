//! The data plane's clock: nanoseconds from an epoch, the time base of
//! the transport's timers. The wall clock for real networks; a manual one
//! that the caller advances for simulations (the seed sweep steps whole
//! engines over `burst_io::SimNet` on simulated time).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// A device clock (cheap to clone; clones read the same time).
///
/// ```
/// use burst_verbs::clock::Clock;
/// let c = Clock::manual();
/// c.advance_to(5_000);
/// assert_eq!(c.now(), 5_000);
/// assert!(Clock::wall().now() < 1_000_000_000);
/// ```
#[derive(Debug, Clone)]
pub enum Clock {
    /// Time since an instant.
    Wall(Instant),
    /// Time the caller sets ([`Clock::advance_to`]).
    Manual(Arc<AtomicU64>),
}

impl Clock {
    /// The wall clock, counting from now.
    pub fn wall() -> Clock {
        Clock::Wall(Instant::now())
    }

    /// A manual clock at 0.
    pub fn manual() -> Clock {
        Clock::Manual(Arc::default())
    }

    /// Nanoseconds since the epoch.
    pub fn now(&self) -> u64 {
        match self {
            Clock::Wall(start) => start.elapsed().as_nanos() as u64,
            Clock::Manual(t) => t.load(Ordering::Acquire),
        }
    }

    /// Moves a manual clock forward to `ns` (never back); returns whether
    /// this is a manual clock.
    pub fn advance_to(&self, ns: u64) -> bool {
        match self {
            Clock::Wall(_) => false,
            Clock::Manual(t) => {
                t.fetch_max(ns, Ordering::AcqRel);
                true
            }
        }
    }

    /// Whether this is the wall clock.
    pub fn is_wall(&self) -> bool {
        matches!(self, Clock::Wall(_))
    }
}
