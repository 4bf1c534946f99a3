//! Completions held per CQ while the application has not made room.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use burst_transport::WorkCompletion;
use burst_wire::Qpn;

use super::*;

/// Completions a full CQ refused, held per CQ (and in order within each):
/// one CQ nobody polls holds back only its own completions. The QPs
/// feeding a CQ that holds some are paused (their posted WRs wait in their
/// rings, which are bounded) until it drains, so what a CQ holds is bounded
/// by what its QPs had outstanding in the transport; past
/// [`Held::LIMIT`] (a CQ fed through an SRQ), completions are lost, as on
/// an RNIC whose CQ overran, and counted.
#[derive(Default)]
pub(super) struct Held {
    pub(super) by_cq: HashMap<usize, VecDeque<WorkCompletion>>,
    /// QPs to visit again at the next step: their WRs were left in their
    /// rings while a CQ of theirs held completions, or past a visit's budget.
    pub(super) paused: Vec<Qpn>,
    /// Channels to signal once the CQ table's lock is released.
    pub(super) signals: Vec<Arc<CompChannel>>,
    /// Completions lost to [`Held::LIMIT`].
    pub(super) lost: u64,
}

impl Held {
    /// Completions one CQ may hold (twice a QP's deepest queue).
    const LIMIT: usize = 2 * crate::MAX_QP_WR as usize;

    /// Nothing held and no QP left for later.
    pub(super) fn is_empty(&self) -> bool {
        self.by_cq.is_empty() && self.paused.is_empty()
    }

    /// Whether QP rings `r` must wait: a CQ of theirs holds completions.
    pub(super) fn blocks(&self, r: &QpRings) -> bool {
        !self.by_cq.is_empty()
            && (self.by_cq.contains_key(&(r.send_cq.0 as usize))
                || self.by_cq.contains_key(&(r.recv_cq.0 as usize)))
    }

    /// Notes that `qpn`'s rings were left for later.
    pub(super) fn pause(&mut self, qpn: Qpn) {
        if !self.paused.contains(&qpn) {
            self.paused.push(qpn);
        }
    }

    /// Holds `wc` behind CQ `cq`'s earlier completions.
    pub(super) fn push(&mut self, cq: usize, wc: WorkCompletion) {
        let q = self.by_cq.entry(cq).or_default();
        if q.len() >= Held::LIMIT {
            self.lost += 1;
            if self.lost.is_power_of_two() {
                tracing::warn!(cq, lost = self.lost, "CQ overrun: completions lost");
            }
            return;
        }
        q.push_back(wc);
    }

    /// Puts `wc` into CQ `cq` (`q`), or holds it: behind held ones, or
    /// when the ring is full (the first refusal raises CQ_ERR).
    pub(super) fn deliver_or_hold(
        &mut self,
        q: &Cq,
        cq: usize,
        wc: WorkCompletion,
        events: &AsyncEvents,
    ) {
        if self.by_cq.contains_key(&cq) {
            self.push(cq, wc);
            return;
        }
        match deliver(q, wc) {
            Ok(signal) => self.signals.extend(signal),
            Err(wc) => {
                overrun(q, cq, events);
                self.push(cq, wc);
            }
        }
    }

    /// Delivers what each CQ holds while it has room; a CQ destroyed
    /// meanwhile drops its own.
    pub(super) fn flush(&mut self, cqs: &[Option<Arc<Cq>>]) {
        if self.by_cq.is_empty() {
            // The usual case: nothing held, nothing to walk.
            return;
        }
        let signals = &mut self.signals;
        self.by_cq.retain(|&cq, held| {
            let Some(Some(q)) = cqs.get(cq) else {
                return false;
            };
            while let Some(wc) = held.front() {
                match deliver(q, *wc) {
                    Ok(signal) => {
                        signals.extend(signal);
                        held.pop_front();
                    }
                    Err(_) => break,
                }
            }
            !held.is_empty()
        });
    }

    /// Signals the channels of CQs that got an event (outside any lock).
    pub(super) fn signal(&mut self) {
        for ch in self.signals.drain(..) {
            ch.notify();
        }
    }
}
