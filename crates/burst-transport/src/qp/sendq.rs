//! A QP's send queue, held compactly. A [`SendWr`] has room for
//! [`crate::MAX_SGE`] SGEs and [`crate::MAX_INLINE`] inline bytes (464
//! bytes), the shape a ring entry takes at its largest; a queued WQE keeps
//! its head (identifier, operation, flags, progress: ~100 bytes) and puts
//! its SGEs or its inline bytes in two per-queue FIFO arenas, only as many
//! as it has. A depth-1024 queue of one-SGE WRITEs holds ~120 bytes per
//! WQE instead of 504 (rxe's send WQE is ~720 bytes, an mlx5 WQE one or
//! more 64-byte blocks), and thousands of busy QPs touch that much less
//! memory per message.
//!
//! The arenas hand out contiguous spans (packets borrow a WR's SGEs and
//! inline bytes as slices), released oldest first as WQEs complete.

use std::collections::VecDeque;

use super::SendWqe;
use crate::{SendOp, SendWr, Sge, UdDest};

/// The part of a send work request a queued WQE keeps in itself: every
/// field of [`SendWr`] but its SGEs and inline bytes, which the queue's
/// arenas hold ([`SendQueue::sges`], [`SendQueue::inline_bytes`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct WrHead {
    pub(super) wr_id: u64,
    pub(super) op: SendOp,
    /// Inline: the data was captured at post ([`SendQueue::inline_bytes`]);
    /// otherwise it is read from the SGEs when packets are built.
    pub(super) inline: bool,
    pub(super) signaled: bool,
    pub(super) fence: bool,
    pub(super) solicited: bool,
    pub(super) ud: Option<UdDest>,
    /// Where the SGEs (or, inline, the bytes) are in their arena.
    data: Span,
}

/// A WR's run of elements in an arena: start index and count.
#[derive(Debug, Clone, Copy, Default)]
struct Span {
    start: u32,
    len: u32,
}

impl Span {
    fn range(self) -> std::ops::Range<usize> {
        self.start as usize..(self.start + self.len) as usize
    }
}

/// A FIFO of contiguous runs in one buffer (a bip buffer): runs are
/// taken at the tail, wrapping to the front when the end has no room for
/// a whole run, and given back oldest first. It grows by doubling when
/// full, moving the live runs to the front (the queue relocates its WQEs'
/// spans through [`Fifo::relocated`]).
#[derive(Debug, Default)]
struct Fifo<T> {
    buf: Vec<T>,
    /// Start of the oldest live run.
    head: usize,
    /// End of the newest live run.
    tail: usize,
    /// The runs wrapped: live data is `head..wrap_at` then `0..tail`.
    wrap_at: Option<usize>,
    /// Elements live.
    live: usize,
}

impl<T: Copy + Default> Fifo<T> {
    /// Takes a run of `n`, or `None` if the buffer has no room for it.
    fn take(&mut self, n: usize) -> Option<usize> {
        if n == 0 {
            // An empty run borrows nothing: start 0 stays valid.
            return Some(0);
        }
        if self.live == 0 {
            (self.head, self.tail, self.wrap_at) = (0, 0, None);
        }
        let start = match self.wrap_at {
            None if self.tail + n <= self.buf.len() => self.tail,
            // The end cannot hold the run whole: wrap, if the front can.
            None if n <= self.head => {
                self.wrap_at = Some(self.tail);
                0
            }
            Some(_) if self.tail + n <= self.head => self.tail,
            _ => return None,
        };
        self.tail = start + n;
        self.live += n;
        Some(start)
    }

    /// Gives back the oldest run, `n` long.
    fn give_back(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        if self.wrap_at == Some(self.head) {
            (self.head, self.wrap_at) = (0, None);
        }
        self.head += n;
        self.live = self.live.saturating_sub(n);
        if self.wrap_at == Some(self.head) {
            (self.head, self.wrap_at) = (0, None);
        }
    }

    /// Where a live run starting at `start` is after [`Fifo::grow`].
    fn relocated(&self, start: usize) -> usize {
        match self.wrap_at {
            Some(w) if start < self.head => start + (w - self.head),
            _ => start - self.head,
        }
    }

    /// Moves the live runs to the front of a buffer with room for `n`
    /// more (at least twice the old size). Call [`Fifo::relocated`] for
    /// every live run's start *before*.
    fn grow(&mut self, n: usize) {
        let cap = (self.buf.len() * 2).max(self.live + n).max(16);
        let mut buf = Vec::with_capacity(cap);
        match self.wrap_at {
            _ if self.live == 0 => {}
            Some(w) => {
                buf.extend_from_slice(&self.buf[self.head..w]);
                buf.extend_from_slice(&self.buf[..self.tail]);
            }
            None => buf.extend_from_slice(&self.buf[self.head..self.tail]),
        }
        buf.resize(cap, T::default());
        (self.buf, self.head, self.tail, self.wrap_at) = (buf, 0, self.live, None);
    }
}

/// A QP's send queue: WQE heads oldest first, their SGEs and inline
/// bytes in arenas beside them.
#[derive(Debug, Default)]
pub(super) struct SendQueue {
    wqes: VecDeque<SendWqe>,
    sges: Fifo<Sge>,
    inline: Fifo<u8>,
}

impl SendQueue {
    /// WQEs queued.
    pub(super) fn len(&self) -> usize {
        self.wqes.len()
    }

    /// No WQE queued.
    pub(super) fn is_empty(&self) -> bool {
        self.wqes.is_empty()
    }

    /// Empty, yet holding memory (what an idle QP gives back).
    pub(super) fn has_spare_room(&self) -> bool {
        self.is_empty()
            && (self.wqes.capacity() > 0
                || !self.sges.buf.is_empty()
                || !self.inline.buf.is_empty())
    }

    /// Queues `wr` as the newest WQE: `wqe` is its head and progress
    /// (made by [`SendQueue::head_of`] of the same `wr`), the SGEs (or,
    /// inline, the captured bytes) go to the arenas.
    pub(super) fn push_back(&mut self, mut wqe: SendWqe, wr: &SendWr) {
        let (inline, sges): (&[u8], &[Sge]) = match (wr.inline, &wr.inline_data) {
            (true, Some(d)) => (d, &[]),
            _ => (&[], &wr.sg_list),
        };
        wqe.wr.data = if wqe.wr.inline {
            let start = take_run(&mut self.inline, &mut self.wqes, true, inline.len());
            self.inline.buf[start..start + inline.len()].copy_from_slice(inline);
            Span {
                start: start as u32,
                len: inline.len() as u32,
            }
        } else {
            let start = take_run(&mut self.sges, &mut self.wqes, false, sges.len());
            self.sges.buf[start..start + sges.len()].copy_from_slice(sges);
            Span {
                start: start as u32,
                len: sges.len() as u32,
            }
        };
        self.wqes.push_back(wqe);
    }

    /// The head a WQE of `wr` keeps (its data placed by
    /// [`SendQueue::push_back`]). `inline` only with captured bytes.
    pub(super) fn head_of(wr: &SendWr) -> WrHead {
        WrHead {
            wr_id: wr.wr_id,
            op: wr.op,
            inline: wr.inline && wr.inline_data.is_some(),
            signaled: wr.signaled,
            fence: wr.fence,
            solicited: wr.solicited,
            ud: wr.ud,
            data: Span::default(),
        }
    }

    /// Takes the oldest WQE (its SGEs and bytes are given back).
    pub(super) fn pop_front(&mut self) -> Option<SendWqe> {
        let w = self.wqes.pop_front()?;
        self.give_back(&w);
        Some(w)
    }

    fn give_back(&mut self, w: &SendWqe) {
        if w.wr.inline {
            self.inline.give_back(w.wr.data.len as usize);
        } else {
            self.sges.give_back(w.wr.data.len as usize);
        }
    }

    /// Takes every WQE, oldest first.
    pub(super) fn drain(&mut self) -> impl Iterator<Item = SendWqe> + '_ {
        std::iter::from_fn(|| self.pop_front())
    }

    /// The WQE at `i` (0: the oldest).
    pub(super) fn get(&self, i: usize) -> Option<&SendWqe> {
        self.wqes.get(i)
    }

    /// The WQEs, oldest first.
    pub(super) fn iter(&self) -> std::collections::vec_deque::Iter<'_, SendWqe> {
        self.wqes.iter()
    }

    /// The WQEs, oldest first, to update.
    pub(super) fn iter_mut(&mut self) -> std::collections::vec_deque::IterMut<'_, SendWqe> {
        self.wqes.iter_mut()
    }

    /// The oldest WQE.
    pub(super) fn front(&self) -> Option<&SendWqe> {
        self.wqes.front()
    }

    /// The SGEs of WQE `i` (none for an inline one).
    pub(super) fn sges(&self, i: usize) -> &[Sge] {
        match self.wqes.get(i) {
            Some(w) if !w.wr.inline => &self.sges.buf[w.wr.data.range()],
            _ => &[],
        }
    }

    /// WQE `i` to update, with its SGEs and its inline bytes.
    pub(super) fn entry_mut(&mut self, i: usize) -> Option<(&mut SendWqe, &[Sge], &[u8])> {
        let w = self.wqes.get_mut(i)?;
        let r = w.wr.data.range();
        Some(if w.wr.inline {
            (w, &[], &self.inline.buf[r])
        } else {
            (w, &self.sges.buf[r], &[])
        })
    }
}

/// A run of `n` in `arena` (the inline bytes' with `inline`, else the
/// SGEs'), grown if full: the runs of the WQEs that live there are
/// relocated first.
fn take_run<T: Copy + Default>(
    arena: &mut Fifo<T>,
    wqes: &mut VecDeque<SendWqe>,
    inline: bool,
    n: usize,
) -> usize {
    if let Some(s) = arena.take(n) {
        return s;
    }
    for w in wqes
        .iter_mut()
        .filter(|w| w.wr.inline == inline && w.wr.data.len > 0)
    {
        w.wr.data.start = arena.relocated(w.wr.data.start as usize) as u32;
    }
    arena.grow(n);
    arena.take(n).unwrap_or(0)
}

impl std::ops::Index<usize> for SendQueue {
    type Output = SendWqe;
    fn index(&self, i: usize) -> &SendWqe {
        &self.wqes[i]
    }
}

impl std::ops::IndexMut<usize> for SendQueue {
    fn index_mut(&mut self, i: usize) -> &mut SendWqe {
        &mut self.wqes[i]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Runs taken and given back in any FIFO interleaving, with growth:
        /// every live run keeps its contents (relocated on growth).
        #[test]
        fn a_fifo_keeps_every_live_run(ops in prop::collection::vec((any::<bool>(), 0usize..40), 1..400)) {
            let mut f: Fifo<u32> = Fifo::default();
            // (start, len, tag) oldest first
            let mut live: VecDeque<(usize, usize, u32)> = VecDeque::new();
            for (k, (push, n)) in ops.into_iter().enumerate() {
                let tag = k as u32 + 1;
                if push || live.is_empty() {
                    let start = match f.take(n) {
                        Some(s) => s,
                        None => {
                            for r in live.iter_mut().filter(|r| r.1 > 0) {
                                r.0 = f.relocated(r.0);
                            }
                            f.grow(n);
                            f.take(n).expect("room after growth")
                        }
                    };
                    f.buf[start..start + n].fill(tag);
                    live.push_back((start, n, tag));
                } else if let Some((_, n, _)) = live.pop_front() {
                    f.give_back(n);
                }
                for &(s, n, t) in &live {
                    prop_assert!(f.buf[s..s + n].iter().all(|&v| v == t));
                }
                prop_assert_eq!(f.live, live.iter().map(|r| r.1).sum::<usize>());
            }
        }
    }

    fn write(id: u64, sges: usize, inline: Option<&[u8]>) -> SendWr {
        let mut wr = SendWr {
            wr_id: id,
            op: SendOp::Write {
                remote_addr: 0x1000,
                rkey: 7,
            },
            sg_list: crate::SgList::new(),
            inline: inline.is_some(),
            signaled: true,
            fence: false,
            solicited: false,
            ud: None,
            inline_data: inline.map(|d| crate::InlineData::try_from_slice(d).expect("short")),
        };
        for k in 0..sges as u64 {
            let _ = wr.sg_list.push(Sge {
                addr: id * 1000 + k,
                length: 10,
                lkey: k as u32,
            });
        }
        wr
    }

    fn push(q: &mut SendQueue, wr: &SendWr) {
        let wqe = SendWqe {
            wr: SendQueue::head_of(wr),
            len: 0,
            first_psn: None,
            npsn: 1,
            next_pkt: 0,
            read_got: 0,
            read_rerequested: false,
            rsn: 0,
            done: false,
            status: crate::WcStatus::Success,
        };
        q.push_back(wqe, wr);
    }

    #[test]
    fn one_sge_writes_cost_a_quarter_of_a_send_wr() {
        let mut q = SendQueue::default();
        for id in 0..128 {
            push(&mut q, &write(id, 1, None));
        }
        let bytes = q.wqes.capacity() * std::mem::size_of::<SendWqe>()
            + q.sges.buf.len() * std::mem::size_of::<Sge>()
            + q.inline.buf.len();
        assert!(bytes <= 128 * 136, "{bytes} bytes for 128 WRITEs");
        assert!(std::mem::size_of::<SendWr>() >= 464);
    }

    proptest! {
        /// WQEs of any shape (0-8 SGEs, inline bytes) pushed and completed
        /// in any interleaving read back their own SGEs and bytes.
        #[test]
        fn every_wqe_keeps_its_own_sges_and_bytes(ops in prop::collection::vec((0usize..3, 0usize..9, 0usize..200), 1..300)) {
            let mut q = SendQueue::default();
            let mut model: VecDeque<SendWr> = VecDeque::new();
            for (k, (what, n, len)) in ops.into_iter().enumerate() {
                let id = k as u64;
                match what {
                    0 => {
                        let bytes: Vec<u8> = (0..len).map(|b| (b as u64 + id) as u8).collect();
                        let wr = write(id, 0, Some(&bytes));
                        push(&mut q, &wr);
                        model.push_back(wr);
                    }
                    1 => {
                        let wr = write(id, n, None);
                        push(&mut q, &wr);
                        model.push_back(wr);
                    }
                    _ => {
                        let got = q.pop_front().map(|w| w.wr.wr_id);
                        prop_assert_eq!(got, model.pop_front().map(|w| w.wr_id));
                    }
                }
                prop_assert_eq!(q.len(), model.len());
                for (i, wr) in model.iter().enumerate() {
                    let (w, sges, inline) = q.entry_mut(i).expect("queued");
                    prop_assert_eq!(w.wr.wr_id, wr.wr_id);
                    if wr.inline {
                        prop_assert!(w.wr.inline);
                        prop_assert!(sges.is_empty());
                        prop_assert_eq!(inline, &wr.inline_data.as_ref().expect("inline")[..]);
                    } else {
                        prop_assert_eq!(sges, &wr.sg_list[..]);
                        prop_assert!(inline.is_empty());
                        prop_assert_eq!(q.sges(i), &wr.sg_list[..]);
                    }
                }
            }
        }
    }

    #[test]
    fn a_full_queue_of_one_sge_writes_reuses_its_arena() {
        let mut f: Fifo<u8> = Fifo::default();
        let cap = {
            f.grow(1);
            f.buf.len()
        };
        // Taking and giving back one at a time, forever, never grows.
        for _ in 0..10 * cap {
            let s = f.take(3).expect("room");
            assert!(s + 3 <= cap);
            f.give_back(3);
        }
        assert_eq!(f.buf.len(), cap);
    }
}
