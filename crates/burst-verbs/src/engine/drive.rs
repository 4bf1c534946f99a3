//! Who steps a lane: control calls, progress from application threads, the simulation clock.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crossbeam::channel::{bounded, Sender};

use burst_wire::Qpn;

use super::*;
use crate::{Device, FIRST_QPN};

/// Which kind of application thread steps a lane (see `engine::drivers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stepper {
    /// Polls an empty CQ: it claims the lane.
    Poller,
    /// Posts: claims the lane too, and steps to transmit only.
    Poster,
    /// Blocked for a completion event, woken by the port: waits for the
    /// core rather than leave the packets to a thread that may be asleep.
    Waiter,
    /// Took its last completion with nothing left to poll for: sends what
    /// its steps left (an ACK) without claiming the lane it is leaving; if
    /// another thread holds the core, that thread's rounds send it.
    Leaving,
}

impl Context {
    /// Runs a control request on lane 0 (SRQs live there).
    pub(super) fn call<T>(&self, make: impl FnOnce(Sender<T>) -> Control) -> Result<T, PostError> {
        self.call_on(0, make)
    }

    /// The lane that owns QP `qpn` (QPNs interleave over the lanes).
    pub(super) fn lane_of(&self, qpn: Qpn) -> usize {
        qpn.value().wrapping_sub(FIRST_QPN) as usize % self.control.len()
    }

    /// Runs a control request on `lane`'s core and waits for its reply.
    pub(super) fn call_on<T>(
        &self,
        lane: usize,
        make: impl FnOnce(Sender<T>) -> Control,
    ) -> Result<T, PostError> {
        let (tx, rx) = bounded(1);
        self.plane
            .execute(self, lane, make(tx), &|| !rx.is_empty())?;
        rx.try_recv().map_err(|_| PostError::Stopped)
    }

    /// QP1 of this engine's device (`None` for a daemon client: burstd's
    /// connection manager owns it).
    pub fn gsi(&self) -> Option<&Arc<crate::gsi::Gsi>> {
        self.shared.gsi.as_ref()
    }

    /// Queues a MAD for QP1 to send and wakes the engine; `false` when
    /// there is no QP1 here or its queue is full (counted).
    pub fn gsi_send(&self, m: crate::gsi::GsiMad) -> bool {
        let Some(gsi) = &self.shared.gsi else {
            return false;
        };
        if !gsi.queue(m) {
            return false;
        }
        // Any lane sends QP1's MADs; lane 0 is as good as any.
        self.shared.wake.nudge(0);
        true
    }

    /// Hands the data plane back to the engine thread at once: the calling
    /// thread stops polling (it is about to block elsewhere), so the
    /// engine should not wait for its claim to end (see
    /// `engine::drivers`).
    pub fn park(&self) {
        for (lane, d) in self.shared.drivers.iter().enumerate() {
            if d.release() {
                self.shared.wake.wake(lane);
            }
        }
    }

    /// Steps the data plane on the calling thread if no other thread is
    /// stepping it; returns whether there was work. Polling an empty CQ
    /// calls this, so an application that busy-polls drives its own I/O:
    /// the thread claims the lanes it steps, and their engine threads leave
    /// it their ports while it keeps polling.
    pub fn progress(&self) -> bool {
        self.plane.progress(self)
    }

    /// A daemon client polled an empty CQ: the daemon's lanes learn it
    /// (see [`Wake::client_polled`]).
    pub(crate) fn client_polled(&self) {
        for lane in 0..self.control.len() {
            self.shared.wake.client_polled(lane);
        }
    }

    /// Steps every lane of this process's engine once, waiting for a core
    /// another thread holds (no claim: the lanes' owners stay as they are).
    /// burstd runs it for a client's `Settle` request.
    pub fn settle_lanes(&self) {
        for lane in 0..self.shared.cores.len() {
            let _ = self.step_with(lane, Round::Full, Stepper::Waiter, |_| ());
        }
    }

    /// [`Context::progress`] without the receive: what posting a send does.
    /// The reply to a request cannot have arrived yet, and a bandwidth test
    /// that posts many WRs between polls would otherwise pay an empty
    /// `recvmmsg` per WR; the next poll of an empty CQ receives.
    pub(super) fn progress_transmit(&self) -> bool {
        self.step(Round::Transmit)
    }

    /// Steps every lane this thread can take: a transmit round is a
    /// post's, a full round a poll's.
    pub(super) fn step(&self, round: Round) -> bool {
        let who = match round {
            Round::Full => Stepper::Poller,
            Round::Transmit | Round::Post => Stepper::Poster,
        };
        let mut busy = false;
        for lane in 0..self.shared.cores.len() {
            busy |= self
                .step_with(lane, round, who, |_| ())
                .is_some_and(|(b, _)| b);
        }
        busy
    }

    /// Runs `first` on the core, then a step of `round`, if this thread can
    /// take the core (a [`Stepper::Waiter`] waits for it); `None` if another
    /// thread holds it. The inner `None`: `first` faulted (contained).
    pub(super) fn step_with<R>(
        &self,
        lane: usize,
        round: Round,
        who: Stepper,
        first: impl FnOnce(&mut Core) -> R,
    ) -> Option<(bool, Option<R>)> {
        let sh = &*self.shared;
        if sh.stop.load(Ordering::Acquire) {
            return None;
        }
        let now = sh.clock.now();
        let d = sh.drivers.get(lane);
        // A busy-polling engine owns its lane: posts go through the rings,
        // polls read the CQs, and nobody else takes the core.
        if d.is_some_and(|d| d.busy) {
            return None;
        }
        // A poll claims the lane even when another thread holds the core
        // right now: this thread polls all the same.
        // A poll or a post claims the lane even when another thread holds
        // the core right now: this thread drives all the same. (Posts too:
        // a bandwidth test posts for a while between polls and finds
        // completions waiting when it polls; an engine thread stepping
        // meanwhile on the same core halved its rate.)
        // (Except the polls of a thread that polls now and then, which
        // hand the lane over below: `Drivers::poll_claims`.)
        let hand_over = who == Stepper::Poller && d.is_some_and(|d| !d.poll_claims(now));
        if let (Stepper::Poller | Stepper::Poster, Some(d)) = (who, d) {
            if !hand_over {
                d.claim(now);
            }
        }
        let core = sh.cores.get(lane)?;
        let mut core = if who == Stepper::Waiter {
            core.lock().unwrap_or_else(|e| e.into_inner())
        } else {
            match core.try_lock() {
                Ok(core) => core,
                Err(_) => {
                    // An unclaimed lane's engine thread that always finds
                    // work (a bandwidth test) holds the core whenever a
                    // thread spinning on its CQ looks, on a shared core
                    // always: such polls count toward the reclaim too, or
                    // the two threads split the core for good.
                    if let (Stepper::Poller, Some(d)) = (who, d) {
                        d.poller_stepped();
                    }
                    return None;
                }
            }
        };
        let r = core.contained(sh, first);
        let busy = core.step_contained(sh, lane, round, now);
        if who == Stepper::Poller {
            if let Some(d) = d {
                d.poller_stepped();
                // A thread that polls now and then leaves the lane to the
                // engine once its step is done. The engine, parked for a
                // claim, wakes through the watch when traffic comes; work
                // the step left (more of a READ response than a round
                // sends, corked sends) wakes it now, since no packet may
                // come to do it.
                if hand_over {
                    d.shorten(now);
                    let left = busy || core.dev.as_ref().is_some_and(Device::corked);
                    if left && d.ready.is_some() {
                        sh.wake.wake(lane);
                    }
                }
            }
        }
        // A post or a waiter's step may arm a transport timer earlier than
        // the one the engine thread waits for (a poller's own steps run
        // the timers, and the engine runs none while one polls): wake it
        // to wait again. (A caller-driven lane has no engine thread.)
        if busy && who != Stepper::Poller {
            if let Some(d) = d.filter(|d| d.ready.is_some()) {
                let until = d.timer_wait();
                if until != 0 && super::lane::idle_until(&core, now) < until {
                    sh.wake.wake(lane);
                }
            }
        }
        drop(core);
        Some((busy, r))
    }

    /// Runs `f` on the data plane's device, waiting for the core if another
    /// thread steps it (diagnostics and simulation, not the data path).
    pub(super) fn with_device<R>(
        &self,
        lane: usize,
        f: impl FnOnce(&mut Device) -> R,
    ) -> Option<R> {
        let mut core = self
            .shared
            .cores
            .get(lane)?
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        core.dev.as_mut().map(f)
    }

    /// [`Context::with_device`] on every lane, in order.
    pub(super) fn each_device<R>(&self, mut f: impl FnMut(&mut Device) -> R) -> Vec<R> {
        (0..self.shared.cores.len())
            .filter_map(|l| self.with_device(l, &mut f))
            .collect()
    }

    /// Whether an application thread's claim holds one of the lanes now:
    /// it polls, and the engine threads leave it those ports (see
    /// docs/architecture.md, "Who steps a lane"). Diagnostics.
    pub fn claimed_by_application(&self) -> bool {
        let now = self.shared.clock.now();
        self.shared
            .drivers
            .iter()
            .any(|d| matches!(d.owner(now), drivers::Owner::Polling(_)))
    }

    /// How many times an application thread's claim on a lane lapsed with
    /// work waiting, so that the engine thread took the lane back until
    /// polls show a thread that polls again (see docs/architecture.md,
    /// "Who steps a lane"). Diagnostics.
    pub fn claim_lapses(&self) -> u64 {
        self.shared.drivers.iter().map(|d| d.lapses()).sum()
    }

    /// The device clock (ns): the time base of [`Context::next_timeout`].
    pub fn now(&self) -> u64 {
        self.shared.clock.now()
    }

    /// Moves a manual device clock ([`EngineOptions::clock`]) to `ns`;
    /// returns false (and does nothing) on the wall clock.
    pub fn advance_clock_to(&self, ns: u64) -> bool {
        self.shared.clock.advance_to(ns)
    }

    /// The earliest transport timer of any QP (device-clock ns): when the
    /// data plane must next be stepped if no packet comes first.
    pub fn next_timeout(&self) -> Option<u64> {
        self.each_device(|d| d.next_timeout())
            .into_iter()
            .flatten()
            .min()
    }

    /// Checks every QP's invariants (a requester with unacknowledged
    /// packets has a timer, ...): the simulator asserts them at every step.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.each_device(|d| d.check_invariants())
            .into_iter()
            .collect()
    }

    /// One line per QP with its state and counters (for reports).
    pub fn describe_qps(&self) -> Vec<String> {
        self.each_device(|d| d.describe_qps()).concat()
    }

    /// Send work requests of a QP that the transport holds and has not
    /// completed (those still in the QP's ring not counted).
    pub fn send_queue_len(&self, qpn: Qpn) -> Option<usize> {
        self.with_device(self.lane_of(qpn), |d| d.send_queue_len(qpn))
            .flatten()
    }
}
