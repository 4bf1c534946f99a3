//! A port wrapper that drops a random share of what it sends: loss tests on
//! real sockets (`BURST_TEST_DROP`) without loss code in the data plane.

use std::cell::RefCell;
use std::io;

use crate::{PacketBuf, Port, RxBatch, RxVisit};

/// Wraps a [`Port`] and drops each sent packet with probability 1/`every`
/// (0: none), at random rather than periodically (a periodic drop can line
/// up with a go-back-N window forever).
///
/// The drops are decided in [`Port::assign_ip_ids`] and the kept packets
/// are grouped there as they will be sent, so the IDs (which the ICRC
/// covers) are those the inner port gives them.
#[derive(Debug)]
pub struct LossyPort<P> {
    inner: P,
    every: u64,
    rng: RefCell<u64>,
    /// Drop decisions of the last [`Port::assign_ip_ids`] call.
    plan: RefCell<Vec<bool>>,
    dropped: u64,
}

impl<P: Port> LossyPort<P> {
    /// Wraps `inner`, dropping one packet in `every` on average.
    pub fn new(inner: P, every: u64) -> LossyPort<P> {
        LossyPort {
            inner,
            every,
            rng: RefCell::new(0x2545_f491_4f6c_dd1d),
            plan: RefCell::new(Vec::new()),
            dropped: 0,
        }
    }

    /// Packets dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The wrapped port.
    pub fn inner(&self) -> &P {
        &self.inner
    }

    fn decide(&self, n: usize) {
        let mut plan = self.plan.borrow_mut();
        let mut x = self.rng.borrow_mut();
        plan.clear();
        plan.extend((0..n).map(|_| {
            *x ^= *x << 13;
            *x ^= *x >> 7;
            *x ^= *x << 17;
            self.every > 0 && *x % self.every == 0
        }));
    }

    /// Calls `f` on each maximal range of kept packets.
    fn kept_ranges(
        plan: &[bool],
        mut f: impl FnMut(std::ops::Range<usize>) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut i = 0;
        while i < plan.len() {
            if plan[i] {
                i += 1;
                continue;
            }
            let start = i;
            while i < plan.len() && !plan[i] {
                i += 1;
            }
            f(start..i)?;
        }
        Ok(())
    }
}

impl<P: Port> Port for LossyPort<P> {
    fn recv_frames(&mut self, max: usize, visit: &mut RxVisit<'_>) -> io::Result<usize> {
        self.inner.recv_frames(max, visit)
    }

    fn recv_batch(&mut self, rx: &mut RxBatch) -> io::Result<usize> {
        self.inner.recv_batch(rx)
    }

    fn assign_ip_ids(&self, bufs: &mut [PacketBuf]) {
        self.decide(bufs.len());
        let plan = self.plan.borrow();
        let _ = Self::kept_ranges(&plan, |r| {
            self.inner.assign_ip_ids(&mut bufs[r]);
            Ok(())
        });
    }

    fn send_burst(&mut self, bufs: &[PacketBuf]) -> io::Result<usize> {
        if self.plan.borrow().len() != bufs.len() {
            // Not prepared by assign_ip_ids: decide now.
            self.decide(bufs.len());
        }
        let plan = std::mem::take(&mut *self.plan.borrow_mut());
        self.dropped += plan.iter().filter(|&&d| d).count() as u64;
        let inner = &mut self.inner;
        Self::kept_ranges(&plan, |r| inner.send_burst(&bufs[r]).map(|_| ()))?;
        Ok(bufs.len())
    }

    crate::forward_port_control!(self => self.inner);
}
