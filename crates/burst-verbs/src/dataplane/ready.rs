//! Which QPs a round must look at: work proportional to the QPs that have
//! something to do, not to the QPs that exist (issue 34: a lane with
//! 10,240 idle QPs costs what one with 64 does).
//!
//! A QP enters the round's view when something touches it: a post, a
//! modify, a packet for it, its timer, a fault. At the end of a round each
//! touched QP is settled once: its completions and events collected, its
//! timer armed, and, if it still has packets to send (held by the burst,
//! its window or its rate), queued for the next transmit round. Transmit
//! takes QPs from that queue in order, so the queue is also the round
//! robin among senders. Timers sit in a heap keyed by deadline; an entry
//! is only a hint (the QP's own `poll_timeout` decides), so a timer that
//! moved later costs one look when the old deadline passes, and one that
//! moved earlier is pushed again.
//!
//! A QP whose queues emptied is listed once more, to give their memory
//! back if it stays idle ([`Ready::note_idle`]): the list is in deadline
//! order because every entry waits the same time.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// A slot's membership flags.
const TOUCHED: u8 = 1;
const TRANSMIT: u8 = 2;
const COMPLETED: u8 = 4;
const IDLE: u8 = 8;

/// No timer armed for a slot.
const UNARMED: u64 = u64::MAX;

/// The QP slots with work, by kind (indexes into the device's QP table).
#[derive(Debug, Default)]
pub(super) struct Ready {
    flags: Vec<u8>,
    /// Touched since the last settle.
    touched: Vec<usize>,
    /// Packets to send: the transmit round's queue, oldest first.
    transmit: VecDeque<usize>,
    /// Completions waiting for the engine to deliver them.
    completed: Vec<usize>,
    /// (deadline, slot); the earliest first.
    timers: BinaryHeap<Reverse<(u64, usize)>>,
    /// The deadline of each slot's live heap entry ([`UNARMED`]: none).
    armed: Vec<u64>,
    /// (deadline, slot, the work its QP had taken then): QPs to trim if
    /// they take no work until the deadline; the earliest first.
    idle: VecDeque<(u64, usize, u64)>,
}

impl Ready {
    fn grow(&mut self, i: usize) {
        if i >= self.flags.len() {
            self.flags.resize(i + 1, 0);
            self.armed.resize(i + 1, UNARMED);
        }
    }

    /// Sets `flag` on slot `i`; whether it was clear (the slot joins the
    /// flag's list then, so each list holds a slot once).
    fn join(&mut self, i: usize, flag: u8) -> bool {
        self.grow(i);
        let joins = self.flags[i] & flag == 0;
        self.flags[i] |= flag;
        joins
    }

    /// Moves `list` into `out` (cleared first) and clears `flag` of its slots.
    fn drain(flags: &mut [u8], list: &mut Vec<usize>, flag: u8, out: &mut Vec<usize>) {
        out.clear();
        std::mem::swap(out, list);
        for &i in out.iter() {
            flags[i] &= !flag;
        }
    }

    /// Slot `i` has something to look at this round.
    pub fn touch(&mut self, i: usize) {
        if self.join(i, TOUCHED) {
            self.touched.push(i);
        }
    }

    /// Moves the touched slots into `out` (cleared first); they are no
    /// longer touched.
    pub fn take_touched(&mut self, out: &mut Vec<usize>) {
        Ready::drain(&mut self.flags, &mut self.touched, TOUCHED, out);
    }

    /// Slot `i` has packets to send (queued once).
    pub fn queue_transmit(&mut self, i: usize) {
        if self.join(i, TRANSMIT) {
            self.transmit.push_back(i);
        }
    }

    /// Slots queued to transmit.
    pub fn transmit_len(&self) -> usize {
        self.transmit.len()
    }

    /// The next slot to transmit, taken off the queue.
    pub fn next_transmit(&mut self) -> Option<usize> {
        let i = self.transmit.pop_front()?;
        self.flags[i] &= !TRANSMIT;
        Some(i)
    }

    /// Slot `i` has completions for the engine (listed once).
    pub fn mark_completed(&mut self, i: usize) {
        if self.join(i, COMPLETED) {
            self.completed.push(i);
        }
    }

    /// Moves the slots with completions into `out` (cleared first).
    pub fn take_completed(&mut self, out: &mut Vec<usize>) {
        Ready::drain(&mut self.flags, &mut self.completed, COMPLETED, out);
    }

    /// Slot `i`'s timer runs out at `deadline` (device ns), or not at all.
    pub fn arm(&mut self, i: usize, deadline: Option<u64>) {
        let Some(t) = deadline else { return };
        self.grow(i);
        // A later deadline waits for the armed entry to pass (then the
        // QP's own clock says when): one heap entry per slot and timeout
        // period, not one per ACK that pushes the timer on.
        if t < self.armed[i] {
            self.armed[i] = t;
            self.timers.push(Reverse((t, i)));
        }
    }

    /// A slot whose armed deadline is at or before `now` (disarmed), for
    /// the caller to look at its QP's timer; stale entries are dropped.
    pub fn pop_expired(&mut self, now: u64) -> Option<usize> {
        while let Some(&Reverse((t, i))) = self.timers.peek() {
            if t > now {
                return None;
            }
            self.timers.pop();
            if self.armed[i] == t {
                self.armed[i] = UNARMED;
                return Some(i);
            }
        }
        None
    }

    /// The earliest deadline in the heap or the idle list (it may be
    /// stale, or one a QP has since moved later: looking then is
    /// harmless, and drops it).
    pub fn next_deadline(&self) -> Option<u64> {
        let timer = self.timers.peek().map(|&Reverse((t, _))| t);
        let idle = self.idle.front().map(|&(t, _, _)| t);
        timer.into_iter().chain(idle).min()
    }

    /// Whether slot `i` waits in the idle list.
    pub fn idle_listed(&self, i: usize) -> bool {
        self.flags.get(i).is_some_and(|f| f & IDLE != 0)
    }

    /// Slot `i`'s queues are empty: look again at `deadline` (later than
    /// every entry listed before), when `work` tells whether it took any
    /// since. Listed once.
    pub fn note_idle(&mut self, i: usize, deadline: u64, work: u64) {
        if self.join(i, IDLE) {
            self.idle.push_back((deadline, i, work));
        }
    }

    /// A slot whose idle deadline passed, and the work noted with it.
    pub fn pop_idle(&mut self, now: u64) -> Option<(usize, u64)> {
        let &(t, i, work) = self.idle.front()?;
        if t > now {
            return None;
        }
        self.idle.pop_front();
        self.flags[i] &= !IDLE;
        Some((i, work))
    }

    /// Slot `i`'s QP is gone: its timer with it (list entries left behind
    /// find the slot empty, or its next QP, which looks for itself).
    pub fn forget(&mut self, i: usize) {
        if i < self.armed.len() {
            self.armed[i] = UNARMED;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_list_holds_a_slot_once_until_taken() {
        let mut r = Ready::default();
        r.touch(3);
        r.touch(3);
        r.touch(1);
        let mut out = Vec::new();
        r.take_touched(&mut out);
        assert_eq!(out, [3, 1]);
        r.take_touched(&mut out);
        assert!(out.is_empty());
        r.queue_transmit(2);
        r.queue_transmit(5);
        r.queue_transmit(2);
        assert_eq!(r.transmit_len(), 2);
        assert_eq!(r.next_transmit(), Some(2));
        r.queue_transmit(2);
        assert_eq!((r.next_transmit(), r.next_transmit()), (Some(5), Some(2)));
        r.mark_completed(7);
        r.mark_completed(7);
        r.take_completed(&mut out);
        assert_eq!(out, [7]);
    }

    #[test]
    fn timers_fire_in_deadline_order_and_only_for_the_live_entry() {
        let mut r = Ready::default();
        r.arm(1, Some(300));
        r.arm(2, Some(100));
        // Later than the armed one: kept for when that passes.
        r.arm(2, Some(500));
        // Earlier: pushed, and the old entry goes stale.
        r.arm(1, Some(200));
        assert_eq!(r.next_deadline(), Some(100));
        assert_eq!(r.pop_expired(99), None);
        assert_eq!(r.pop_expired(250), Some(2));
        assert_eq!(r.pop_expired(250), Some(1));
        // Slot 1's stale entry at 300 is skipped.
        assert_eq!(r.pop_expired(1_000), None);
        assert_eq!(r.next_deadline(), None);
        r.arm(3, Some(40));
        r.arm(3, Some(30));
        // The stale entry (40) outlives the live one: one harmless look.
        assert_eq!(r.pop_expired(35), Some(3));
        assert_eq!(r.next_deadline(), Some(40));
        assert_eq!(r.pop_expired(45), None);
        r.arm(4, Some(10));
        r.forget(4);
        assert_eq!(r.pop_expired(1_000), None);
    }

    #[test]
    fn idle_slots_are_listed_once_and_come_back_at_their_deadline() {
        let mut r = Ready::default();
        r.note_idle(2, 100, 7);
        r.note_idle(2, 150, 8);
        r.note_idle(5, 120, 1);
        assert!(r.idle_listed(2) && r.idle_listed(5) && !r.idle_listed(3));
        assert_eq!(r.next_deadline(), Some(100));
        r.arm(1, Some(90));
        assert_eq!(r.next_deadline(), Some(90));
        assert_eq!(r.pop_idle(99), None);
        assert_eq!(r.pop_idle(130), Some((2, 7)));
        assert!(!r.idle_listed(2));
        assert_eq!(r.pop_idle(130), Some((5, 1)));
        assert_eq!(r.pop_idle(1_000), None);
        r.note_idle(2, 200, 9);
        assert_eq!(r.pop_idle(200), Some((2, 9)));
    }
}
