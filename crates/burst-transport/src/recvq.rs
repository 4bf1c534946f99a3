//! Receive work requests waiting for messages (a QP's receive queue or an
//! SRQ), held compactly: a [`RecvWr`] holds room for [`crate::MAX_SGE`]
//! SGEs (144 bytes), while a queue of one-SGE receives — what almost
//! every application posts — needs 32 bytes per WR here: its identifier
//! and SGE count in one queue, the SGEs in another. A server that keeps
//! 128 receives posted on each of thousands of idle QPs holds them at an
//! RNIC's cost, not at the largest WR's.

use std::collections::VecDeque;

use crate::{RecvWr, SgList, Sge};

/// A FIFO of receive WRs (oldest first).
#[derive(Debug, Default)]
pub(crate) struct RecvQueue {
    /// (wr_id, SGEs it has), oldest first.
    wrs: VecDeque<(u64, u8)>,
    /// The WRs' SGEs, in the same order.
    sges: VecDeque<Sge>,
}

impl RecvQueue {
    /// WRs waiting.
    pub(crate) fn len(&self) -> usize {
        self.wrs.len()
    }

    /// No WR waiting.
    pub(crate) fn is_empty(&self) -> bool {
        self.wrs.is_empty()
    }

    /// Whether the queue holds memory beyond what it needs (empty with room).
    pub(crate) fn has_spare_room(&self) -> bool {
        self.is_empty() && (self.wrs.capacity() > 0 || self.sges.capacity() > 0)
    }

    /// Adds the newest WR.
    pub(crate) fn push_back(&mut self, wr: RecvWr) {
        self.sges.extend(wr.sg_list.iter().copied());
        self.wrs.push_back((wr.wr_id, wr.sg_list.len() as u8));
    }

    /// Puts a WR back as the oldest (one taken and not used).
    pub(crate) fn push_front(&mut self, wr: RecvWr) {
        for s in wr.sg_list.iter().rev() {
            self.sges.push_front(*s);
        }
        self.wrs.push_front((wr.wr_id, wr.sg_list.len() as u8));
    }

    /// Takes the oldest WR.
    pub(crate) fn pop_front(&mut self) -> Option<RecvWr> {
        let (wr_id, n) = self.wrs.pop_front()?;
        let mut sg_list = SgList::new();
        for _ in 0..n {
            // Pushed with the WR: present, and at most MAX_SGE of them.
            if let Some(s) = self.sges.pop_front() {
                let _ = sg_list.push(s);
            }
        }
        Some(RecvWr { wr_id, sg_list })
    }

    /// The SGEs of the `k`-th oldest WR (0: the next one taken), if that
    /// many wait.
    pub(crate) fn sges_of(&self, k: usize) -> Option<SgList> {
        let n = usize::from(self.wrs.get(k)?.1);
        let skip: usize = self.wrs.iter().take(k).map(|w| usize::from(w.1)).sum();
        let mut l = SgList::new();
        for s in self.sges.iter().skip(skip).take(n) {
            let _ = l.push(*s);
        }
        Some(l)
    }

    /// Takes every WR, oldest first.
    pub(crate) fn take_all(&mut self) -> Vec<RecvWr> {
        std::iter::from_fn(|| self.pop_front()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn wr(id: u64, n: usize) -> RecvWr {
        let sges: Vec<Sge> = (0..n as u64)
            .map(|k| Sge {
                addr: id * 100 + k,
                length: k as u32 + 1,
                lkey: id as u32,
            })
            .collect();
        RecvWr {
            wr_id: id,
            sg_list: SgList::try_from(&sges[..]).unwrap(),
        }
    }

    proptest! {
        /// Against a queue of whole WRs: the same WRs come out, in order,
        /// whatever mix of pushes, put-backs and takes.
        #[test]
        fn behaves_as_a_queue_of_whole_wrs(ops in proptest::collection::vec((0u8..3, 0usize..=crate::MAX_SGE), 0..200)) {
            let mut q = RecvQueue::default();
            let mut model: VecDeque<RecvWr> = VecDeque::new();
            for (k, (op, n)) in ops.into_iter().enumerate() {
                match op {
                    0 => {
                        q.push_back(wr(k as u64, n));
                        model.push_back(wr(k as u64, n));
                    }
                    1 => prop_assert_eq!(q.pop_front(), model.pop_front()),
                    _ => {
                        if let Some(w) = model.pop_front() {
                            prop_assert_eq!(q.pop_front(), Some(w));
                            q.push_front(w);
                            model.push_front(w);
                        }
                    }
                }
                prop_assert_eq!(q.len(), model.len());
            }
            let rest: Vec<RecvWr> = model.into_iter().collect();
            prop_assert_eq!(q.take_all(), rest);
            prop_assert!(q.is_empty());
        }
    }

    #[test]
    fn one_sge_receives_cost_32_bytes() {
        let mut q = RecvQueue::default();
        for id in 0..128 {
            q.push_back(wr(id, 1));
        }
        let bytes = q.wrs.capacity() * std::mem::size_of::<(u64, u8)>()
            + q.sges.capacity() * std::mem::size_of::<Sge>();
        assert_eq!(bytes, 128 * 32);
        assert!(std::mem::size_of::<RecvWr>() >= 136);
    }
}
