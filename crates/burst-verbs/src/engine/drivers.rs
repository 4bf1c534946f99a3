//! Who drives a lane right now: an application thread that polls, threads
//! blocked for a completion event, or the lane's engine thread.
//!
//! One owner at a time, decided by state (see docs/architecture.md, "Who
//! steps a lane"):
//! - **Polling**: an application thread of this process that polls an empty
//!   CQ (or posts) steps the lane itself (receive, process, transmit) and
//!   *claims* it
//!   ([`Drivers::claim`]): the engine thread then leaves the port alone and
//!   waits in the kernel for a doorbell or the end of the claim, so a
//!   polling thread on a shared core does a whole round trip without a
//!   context switch. A claim lasts [`CLAIM_NS`] after the thread's last
//!   empty poll: that is how long a thread that stopped polling with work
//!   outstanding (it computes) may leave packets to wait before the engine
//!   takes the port back. One that took its last completion, or armed a CQ
//!   to wait for its event, hands the port over at once, watched
//!   ([`Drivers::shorten`]). Polls that come after a pause (a thread that
//!   looks in now and then and blocks elsewhere between) step the lane
//!   and hand it over the same way instead of claiming it
//!   ([`Drivers::poll_claims`]).
//! - A claim that *lapsed* with work waiting (the thread posted, polled
//!   once and went to spin on memory for the peer's WRITE, as MPIs and
//!   qperf's `rc_rdma_write_poll_lat` do) shows the lane's threads do not
//!   come back: the lane is *unclaimed* ([`Drivers::unclaim`]) and the
//!   engine drives while their posts and polls still step it when they
//!   can. Empty polls that outnumber the engine's busy steps show a
//!   thread that spins on its CQ after all, and the lane is claimed again
//!   ([`Drivers::poller_stepped`]).
//! - **Busy** ([`super::Drive::Spin`]): the engine thread owns its core
//!   and the lane; nobody else steps or claims it.
//! - **Waiting**: a thread blocked in `ibv_get_cq_event` waits on the port
//!   as well as on its channel and steps the lane when packets come, so the
//!   thread that the event is for is the one that wakes (one wake-up per
//!   side). The engine waits for doorbells and transport timers only.
//! - **Engine**: no application thread is there; the engine thread steps
//!   while there is work and otherwise waits in the kernel on the port, the
//!   doorbells and its next timer.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// How long an application thread's claim on a lane lasts after its last
/// empty poll or post (device-clock ns): how long a thread that stopped
/// polling with work outstanding (it computes, or blocks outside burst)
/// may leave packets waiting before the engine thread takes the port back
/// (one that took its last completion hands it over: [`Drivers::shorten`]). The engine
/// does not wake to check a claim: the polling thread pushes a timer
/// forward, once per [`PUSH_NS`], that fires only when the claim lapses.
///
/// Measured in a VM (docs/performance.md, "The claim timer's cost"): a
/// `timerfd_settime` costs the polling thread 7-15 us (the timer is the
/// CPU's earliest, so the host reprograms it), and an engine woken on the
/// polling thread's core costs it 15 us. At 1 ms, pushing every 500 us put
/// one in 60 round trips of a 64 B ping-pong 8 us late (p99 11.8 us, 4.6
/// without); waking the engine every 1 ms instead, 17.6.
pub(super) const CLAIM_NS: u64 = 4_000_000;

/// How often a polling thread pushes the claim timer forward: when less
/// than `CLAIM_NS - PUSH_NS` of it is left.
pub(super) const PUSH_NS: u64 = 3_000_000;

/// What is left of a claim once its thread took its last completion with
/// nothing outstanding, on a lane whose port cannot be watched
/// ([`Drivers::shorten`]): long enough for a thread that answers a
/// completion with its next post (a READ latency loop) to keep the lane,
/// short against a round trip for one that goes to spin on memory.
pub(super) const SHORT_CLAIM_NS: u64 = 20_000;

/// A pause in an application thread's polls and posts on a lane
/// (device-clock ns) after which its polls hand the lane over instead of
/// claiming it, until they have gone on for as long again
/// ([`Drivers::poll_claims`]): a thread that polls every millisecond
/// would else keep its claim for good, and a peer's request would wait for
/// its next poll. A thread that spins on its CQ polls every few
/// microseconds; preempted, it leaves the lane to the engine for this
/// long and claims it back (two `epoll_ctl`s).
pub(super) const SLOW_POLL_NS: u64 = 200_000;

/// How far empty polls must outnumber the engine thread's steps that
/// found work (each weighing [`ENGINE_WORK_WEIGHT`]) on an unclaimed lane
/// before polls claim it again ([`Drivers::poller_stepped`]).
pub(super) const RECLAIM_AFTER: u32 = 64;

/// What a step of the engine thread that found work weighs against empty
/// polls on an unclaimed lane ([`Drivers::poller_stepped`]).
pub(super) const ENGINE_WORK_WEIGHT: u32 = 4;

/// How long after an application thread's last poll or post its lane
/// counts as passive ([`Drivers::passive`]).
pub(super) const PASSIVE_NS: u64 = 10_000_000;

/// The drivers of one lane.
#[derive(Debug)]
pub(super) struct Drivers {
    /// Device-clock ns of the last empty poll of an application thread of
    /// this process that stepped the lane (0: no claim).
    claim: AtomicU64,
    /// Device-clock ns of the last claim, kept when it is released (0:
    /// never): whether an application thread drives the lane at all.
    last_claim: AtomicU64,
    /// Threads blocked for a completion event that step the lane when its
    /// port has traffic.
    waiters: AtomicU32,
    /// Device-clock ns of the first poll after a pause in the lane's
    /// polls and posts (0: none): [`Drivers::poll_claims`].
    slow_from: AtomicU64,
    /// The engine thread waits without the port, until [`Drivers::until`].
    excluded: AtomicBool,
    /// When the engine thread's current wait ends (device-clock ns;
    /// `u64::MAX`: no limit).
    until: AtomicU64,
    /// The port's readiness (lanes with an engine thread).
    pub(super) ready: Option<burst_io::Readiness>,
    /// Fires when a claim lapses (lanes with an engine thread).
    pub(super) timer: Option<crate::eventfd::TimerFd>,
    /// When [`Drivers::timer`] fires (device-clock ns; 0: disarmed).
    armed: AtomicU64,
    /// The port, watched while a thread that polled has nothing left to
    /// poll for ([`Drivers::shorten`]): the engine waits on it while a
    /// thread polls (lanes with an engine thread and a waitable port).
    pub(super) watch: Option<burst_io::PortWatch>,
    /// Whether [`Drivers::watch`] holds the port; changed under
    /// `watch_lock`, so the flag and the epoll set agree.
    watched: AtomicBool,
    watch_lock: std::sync::Mutex<()>,
    /// The claim was ended by [`Drivers::shorten`] (its lapse is the
    /// hand-over, not a thread gone away).
    shortened: AtomicBool,
    /// A claim lapsed with work waiting: posts and polls no longer claim
    /// the lane ([`Drivers::unclaim`]).
    unclaimed: AtomicBool,
    /// While unclaimed: empty polls, less [`ENGINE_WORK_WEIGHT`] per step
    /// of the engine that found work ([`Drivers::poller_stepped`]).
    reclaim: AtomicU32,
    /// Claims that lapsed with work waiting (diagnostics).
    lapses: AtomicU64,
    /// Busy polling ([`super::Drive::Spin`]): the engine thread owns the
    /// lane; application threads never step it or claim it.
    pub(super) busy: bool,
}

/// What the engine thread of a lane does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Owner {
    /// An application thread polls: wait until the claim ends (ns).
    Polling(u64),
    /// Threads wait for events and watch the port: take doorbells and
    /// timers only.
    Waiting,
    /// Nobody else: the engine thread drives.
    Engine,
}

impl Drivers {
    /// A lane's drivers; `ready` for a lane with an engine thread (it
    /// gets a claim timer too).
    pub(super) fn new(ready: Option<burst_io::Readiness>) -> std::io::Result<Drivers> {
        let timer = match ready {
            Some(_) => Some(crate::eventfd::TimerFd::new()?),
            None => None,
        };
        let watch = match &ready {
            Some(r) => r.watch()?,
            None => None,
        };
        Ok(Drivers {
            claim: AtomicU64::new(0),
            last_claim: AtomicU64::new(0),
            waiters: AtomicU32::new(0),
            excluded: AtomicBool::new(false),
            until: AtomicU64::new(u64::MAX),
            ready,
            timer,
            armed: AtomicU64::new(0),
            watch,
            watched: AtomicBool::new(false),
            watch_lock: std::sync::Mutex::new(()),
            shortened: AtomicBool::new(false),
            slow_from: AtomicU64::new(0),
            unclaimed: AtomicBool::new(false),
            reclaim: AtomicU32::new(0),
            lapses: AtomicU64::new(0),
            busy: false,
        })
    }

    /// Keeps the claim timer at least `CLAIM_NS - PUSH_NS` ahead of `now`.
    fn push_timer(&self, now: u64) {
        let Some(t) = &self.timer else {
            return;
        };
        if self.armed.load(Ordering::Acquire) < now.saturating_add(CLAIM_NS - PUSH_NS) {
            self.armed
                .store(now.saturating_add(CLAIM_NS), Ordering::Release);
            t.arm(std::time::Duration::from_nanos(CLAIM_NS));
        }
    }

    /// Whether the claim timer is still to fire at `now` (an engine
    /// waiting for a claim's end waits on it, without a timeout).
    pub(super) fn timer_pending(&self, now: u64) -> bool {
        self.timer.is_some() && self.armed.load(Ordering::Acquire) > now
    }

    /// Who drives the lane at `now`.
    pub(super) fn owner(&self, now: u64) -> Owner {
        let claim = self.claim.load(Ordering::Acquire);
        if claim != 0 && now < claim.saturating_add(CLAIM_NS) {
            return Owner::Polling(claim.saturating_add(CLAIM_NS));
        }
        if self.waiters.load(Ordering::Acquire) > 0 {
            return Owner::Waiting;
        }
        Owner::Engine
    }

    /// An application thread polled an empty CQ or posted, and stepped the
    /// lane: it drives until [`CLAIM_NS`] after now (unless the lane is
    /// unclaimed: [`Drivers::unclaim`]).
    pub(super) fn claim(&self, now: u64) {
        self.last_claim.store(now.max(1), Ordering::Relaxed);
        if self.unclaimed.load(Ordering::Relaxed) {
            return;
        }
        self.claim.store(now.max(1), Ordering::Release);
        self.shortened.store(false, Ordering::Relaxed);
        if self.watched.load(Ordering::Acquire) {
            self.set_watch(false);
        }
        self.push_timer(now);
    }

    /// An application thread is about to poll an empty CQ at `now`:
    /// whether the poll claims the lane ([`Drivers::claim`]). Not for
    /// [`SLOW_POLL_NS`] after a pause of as long in the lane's polls and
    /// posts: such a thread polls now and then (UCX's `ucx_perftest`
    /// server polls its worker's CQs, then blocks a millisecond on its
    /// control socket), and its polls step the lane and hand it over
    /// ([`Drivers::shorten`]), so that a peer's READ is answered by the
    /// engine while the thread is away instead of at its next poll (1.1 ms
    /// per `ucp_get` before). A thread still polling after that spins, and
    /// claims the lane again.
    pub(super) fn poll_claims(&self, now: u64) -> bool {
        let now = now.max(1);
        let last = self.last_claim.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) >= SLOW_POLL_NS {
            self.slow_from.store(now, Ordering::Relaxed);
        }
        let from = self.slow_from.load(Ordering::Relaxed);
        if from != 0 && now.saturating_sub(from) < SLOW_POLL_NS {
            self.last_claim.store(now, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Turns the port watch on or off (a no-op if it already is).
    fn set_watch(&self, on: bool) {
        let Some(w) = &self.watch else {
            return;
        };
        let _g = self.watch_lock.lock().unwrap_or_else(|e| e.into_inner());
        if self.watched.load(Ordering::Acquire) != on && w.set(on).is_ok() {
            self.watched.store(on, Ordering::Release);
        }
    }

    /// A poll took the last completion of a CQ and the lane's QPs have no
    /// work outstanding, or the thread armed a CQ to wait for its event
    /// (maybe in its own `poll` on the channel, out of burst's sight): the
    /// thread has nothing left to poll for, and may
    /// go and spin on memory (perftest's write_lat waits so for the peer's
    /// WRITE, which only the engine can place). With a port watch the claim
    /// ends now and the port is watched: the engine, still waiting as
    /// while the thread polled, wakes when traffic comes, and a thread
    /// that polls or posts again first (a READ latency loop) takes the
    /// watch off. Two `epoll_ctl`s, no timer: re-arming the claim timer
    /// twice per round trip cost perftest's ib_read_lat 15 us of its 23 in
    /// this VM. Without one the claim ends [`SHORT_CLAIM_NS`] from now by
    /// the claim timer.
    ///
    /// The engine thread needs no wake-up: parked for a polling thread or
    /// for waiters, it waits on the watch too.
    pub(super) fn shorten(&self, now: u64) {
        let claim = self.claim.load(Ordering::Acquire);
        if claim == 0 {
            return;
        }
        if self.watch.is_some() {
            if self
                .claim
                .compare_exchange(claim, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                self.shortened.store(true, Ordering::Relaxed);
                // The engine waits on the watch whether it parked for a
                // polling thread or for waiters: no wake-up.
                self.set_watch(true);
            }
            return;
        }
        let end = now.saturating_add(SHORT_CLAIM_NS);
        if claim.saturating_add(CLAIM_NS) <= end {
            return;
        }
        let short = end.saturating_sub(CLAIM_NS).max(1);
        if self
            .claim
            .compare_exchange(claim, short, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            self.shortened.store(true, Ordering::Relaxed);
            if let Some(t) = &self.timer {
                self.armed.store(end, Ordering::Release);
                t.arm(std::time::Duration::from_nanos(SHORT_CLAIM_NS));
            }
        }
    }

    /// The engine thread is about to step the lane at `now`: whether a
    /// claim lapsed since (the thread that held it neither polled nor
    /// posted for [`CLAIM_NS`], and did not hand the lane over). The claim
    /// is cleared, so each lapse is seen once; if the step finds work, the
    /// engine calls [`Drivers::unclaim`].
    pub(super) fn lapsed(&self, now: u64) -> bool {
        let claim = self.claim.load(Ordering::Acquire);
        if claim == 0 || now < claim.saturating_add(CLAIM_NS) {
            return false;
        }
        self.claim
            .compare_exchange(claim, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
            && !self.shortened.swap(false, Ordering::Relaxed)
    }

    /// A claim lapsed with work waiting: the lane's threads post and go
    /// away (they spin on memory for a peer's WRITE, or compute), so every
    /// round trip would wait for the claim to lapse again. From now on the
    /// engine drives the lane, waiting on its port; posts and polls still
    /// step it when they find its core free, without claiming it.
    pub(super) fn unclaim(&self) {
        self.lapses.fetch_add(1, Ordering::Relaxed);
        self.reclaim.store(0, Ordering::Relaxed);
        self.unclaimed.store(true, Ordering::Release);
    }

    /// Claims that lapsed with work waiting, so far (diagnostics).
    pub(super) fn lapses(&self) -> u64 {
        self.lapses.load(Ordering::Relaxed)
    }

    /// While the lane is unclaimed, a thread polled an empty CQ and stepped
    /// the lane. A thread that spins on its CQ polls many times for each
    /// packet the engine takes (the engine, woken per packet, mostly finds
    /// it taken); one that posts, polls once and goes away polls about
    /// once. Each poll counts one, each step of the engine that found work
    /// takes [`ENGINE_WORK_WEIGHT`] off ([`Drivers::engine_found_work`]);
    /// at [`RECLAIM_AFTER`] the lane is claimed again. Returns whether it
    /// was.
    pub(super) fn poller_stepped(&self) -> bool {
        if !self.unclaimed.load(Ordering::Relaxed) {
            return false;
        }
        if self.reclaim.fetch_add(1, Ordering::Relaxed) + 1 < RECLAIM_AFTER {
            return false;
        }
        self.reclaim.store(0, Ordering::Relaxed);
        self.unclaimed.store(false, Ordering::Release);
        true
    }

    /// While the lane is unclaimed, the engine thread's step found work
    /// (see [`Drivers::poller_stepped`]).
    pub(super) fn engine_found_work(&self) {
        if self.unclaimed.load(Ordering::Relaxed) {
            let _ = self
                .reclaim
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    Some(n.saturating_sub(ENGINE_WORK_WEIGHT))
                });
        }
    }

    /// Whether no application thread of this process has polled or posted
    /// on the lane within [`PASSIVE_NS`] of `now`: the lane serves only its
    /// peers (a READ or WRITE target whose application waits elsewhere).
    pub(super) fn passive(&self, now: u64) -> bool {
        let last = self.last_claim.load(Ordering::Relaxed);
        last == 0 || now.saturating_sub(last) >= PASSIVE_NS
    }

    /// The thread that polled stops (it is about to block elsewhere):
    /// returns whether the engine, waiting without the port, must be woken
    /// to take it back now.
    pub(super) fn release(&self) -> bool {
        self.claim.store(0, Ordering::Release);
        self.excluded.load(Ordering::Acquire)
    }

    /// A thread starts waiting for an event on the lane's port: the
    /// engine need not watch it too (both would wake for each packet).
    pub(super) fn add_waiter(&self) {
        self.waiters.fetch_add(1, Ordering::AcqRel);
        if self.watched.load(Ordering::Acquire) {
            self.set_watch(false);
        }
    }

    /// A waiting thread returns (with its event, or interrupted): the lane
    /// is handed back as a claim ([`Drivers::claim`]), since the thread
    /// polls its CQ next, or comes back to wait; the claim timer wakes the
    /// engine if it does neither. Returns whether the engine thread must be
    /// woken now: the lane is unclaimed ([`Drivers::unclaim`]), so the
    /// engine drives, but it waits without the port (it parked while the
    /// thread waited), and traffic that comes now would wake nobody.
    pub(super) fn remove_waiter(&self, now: u64) -> bool {
        let left = self.waiters.fetch_sub(1, Ordering::AcqRel) == 1;
        self.claim(now);
        left && self.unclaimed.load(Ordering::Relaxed) && self.excluded.load(Ordering::Acquire)
    }

    /// The engine thread is about to wait in the kernel until `until`
    /// (device-clock ns) for `owner`: with the port (the engine drives) or
    /// without.
    pub(super) fn parking(&self, owner: Owner, until: u64) {
        let timers = !matches!(owner, Owner::Polling(_));
        self.until
            .store(if timers { until } else { 0 }, Ordering::Release);
        self.excluded
            .store(owner != Owner::Engine, Ordering::Release);
    }

    /// The engine thread woke.
    pub(super) fn unparked(&self) {
        self.excluded.store(false, Ordering::Release);
        self.until.store(0, Ordering::Release);
    }

    /// The transport timer the engine thread waits for, when it runs the
    /// lane's timers while waiting (0: it does not: it is awake, or a
    /// polling thread runs them).
    pub(super) fn timer_wait(&self) -> u64 {
        self.until.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_lasts_its_window_then_the_engine_drives() {
        let d = Drivers::new(None).unwrap();
        assert_eq!(d.owner(5), Owner::Engine);
        d.claim(1_000);
        assert_eq!(
            d.owner(1_000 + CLAIM_NS - 1),
            Owner::Polling(1_000 + CLAIM_NS)
        );
        assert_eq!(d.owner(1_000 + CLAIM_NS), Owner::Engine);
        d.claim(2_000);
        assert!(!d.release(), "the engine is not waiting without the port");
        assert_eq!(d.owner(2_001), Owner::Engine);
        // Nothing left to poll for: the claim ends soon, unless renewed.
        d.claim(10_000_000);
        d.shorten(10_000_100);
        assert_eq!(
            d.owner(10_000_200),
            Owner::Polling(10_000_100 + SHORT_CLAIM_NS)
        );
        assert_eq!(d.owner(10_000_100 + SHORT_CLAIM_NS), Owner::Engine);
        d.claim(10_000_300);
        assert_eq!(d.owner(10_000_400), Owner::Polling(10_000_300 + CLAIM_NS));
    }

    #[test]
    fn a_claim_that_lapsed_with_work_waiting_is_not_taken_again_until_polls_find_work() {
        let d = Drivers::new(None).unwrap();
        // A thread posts, polls once and goes away: its claim lapses.
        d.claim(1_000);
        assert!(!d.lapsed(1_000 + CLAIM_NS - 1), "still claimed");
        assert!(d.lapsed(1_000 + CLAIM_NS));
        assert!(!d.lapsed(1_000 + CLAIM_NS + 1), "a lapse is seen once");
        // The engine's step found work: posts and polls no longer claim.
        d.unclaim();
        assert_eq!(d.lapses(), 1);
        d.claim(10_000_000);
        assert_eq!(d.owner(10_000_001), Owner::Engine);
        assert!(!d.passive(10_000_001), "the thread still posts");
        // A thread that waited for an event returns: no claim hands the
        // lane back, so the engine, parked without the port, is woken.
        d.add_waiter();
        d.parking(Owner::Waiting, u64::MAX);
        assert!(d.remove_waiter(10_000_002));
        d.unparked();
        assert_eq!(d.owner(10_000_003), Owner::Engine);
        // A thread that spins on its CQ polls many times for each packet
        // the engine takes; one that posts and polls once does not.
        for _ in 0..RECLAIM_AFTER * 4 {
            assert!(!d.poller_stepped());
            d.engine_found_work();
        }
        for _ in 0..RECLAIM_AFTER - 1 {
            assert!(!d.poller_stepped());
        }
        assert!(d.poller_stepped(), "reclaimed");
        d.claim(11_000_000);
        assert_eq!(d.owner(11_000_001), Owner::Polling(11_000_000 + CLAIM_NS));
        // A claim handed over (shortened) that then lapses is no lapse: the
        // thread said it had nothing left to poll for.
        d.claim(20_000_000);
        d.shorten(20_000_100);
        assert!(!d.lapsed(20_000_100 + CLAIM_NS));
        assert_eq!(d.lapses(), 1);
    }

    #[test]
    fn a_thread_that_polls_now_and_then_leaves_the_lane_to_the_engine() {
        let d = Drivers::new(None).unwrap();
        let t0 = 10_000_000;
        assert!(d.poll_claims(t0), "a first poll claims");
        d.claim(t0);
        // A thread that spins polls again within microseconds: it claims.
        assert!(d.poll_claims(t0 + 5_000));
        d.claim(t0 + 5_000);
        // One that comes back a millisecond later, still within its claim,
        // does not claim; its polls hand the lane over (the engine drives
        // until it polls again).
        let later = t0 + 5_000 + 1_000_000;
        assert_eq!(d.owner(later), Owner::Polling(t0 + 5_000 + CLAIM_NS));
        assert!(!d.poll_claims(later));
        // (Without a port watch, as here, what is left of the claim is
        // short: the claim timer ends it.)
        d.shorten(later);
        assert_eq!(d.owner(later + SHORT_CLAIM_NS), Owner::Engine);
        // The rest of its burst of polls (UCX polls each of its CQs) does
        // not claim either.
        assert!(!d.poll_claims(later + 3_000));
        assert!(!d.poll_claims(later + SLOW_POLL_NS - 1));
        assert_eq!(d.owner(later + SLOW_POLL_NS), Owner::Engine);
        // A thread still polling after as long spins: it claims again.
        assert!(d.poll_claims(later + SLOW_POLL_NS));
        d.claim(later + SLOW_POLL_NS);
        assert!(matches!(
            d.owner(later + SLOW_POLL_NS + 1),
            Owner::Polling(_)
        ));
        assert!(!d.lapsed(later + CLAIM_NS), "handed over: no lapse");
        assert_eq!(d.lapses(), 0);
    }

    #[test]
    fn waiters_own_the_port_and_hand_it_back_as_a_claim() {
        let d = Drivers::new(None).unwrap();
        d.add_waiter();
        assert_eq!(d.owner(10), Owner::Waiting);
        d.parking(Owner::Waiting, u64::MAX);
        assert_eq!(d.timer_wait(), u64::MAX, "the engine runs the timers");
        assert!(!d.remove_waiter(20), "the claim timer wakes the engine");
        assert_eq!(d.owner(21), Owner::Polling(20 + CLAIM_NS));
        d.parking(Owner::Polling(20 + CLAIM_NS), 20 + CLAIM_NS);
        assert_eq!(d.timer_wait(), 0, "the polling thread runs the timers");
        // The thread blocks elsewhere: the engine must take the port now.
        assert!(d.release());
        d.unparked();
        assert_eq!(d.timer_wait(), 0);
    }

    #[test]
    fn the_claim_timer_fires_only_after_polling_stops() {
        let ready = burst_io::Readiness::poll_mode();
        let d = Drivers::new(Some(ready)).unwrap();
        let t = d.timer.as_ref().unwrap();
        let readable = |ms| {
            burst_io::wait_fds(
                &[std::os::fd::AsFd::as_fd(t)],
                std::time::Duration::from_millis(ms),
            )
            .unwrap()
                != 0
        };
        let clock = crate::clock::Clock::wall();
        // Polls for four claims: the timer is pushed forward and never
        // fires meanwhile (unless the machine stalled this thread for
        // `CLAIM_NS - PUSH_NS` anywhere in the loop: then nothing is
        // asserted).
        let start = std::time::Instant::now();
        let (mut fired, mut last, mut gap) = (false, clock.now(), 0);
        while start.elapsed() < std::time::Duration::from_nanos(4 * CLAIM_NS) {
            let now = clock.now();
            d.claim(now);
            fired |= readable(0);
            let after = clock.now();
            gap = gap.max(now - last).max(after - now);
            last = after;
        }
        assert!(
            !fired || gap >= CLAIM_NS - PUSH_NS,
            "the timer fired while the thread polled"
        );
        // Still armed, unless this thread stalled since its last claim
        // longer than a claim outlives its push (a loaded machine).
        let now = clock.now();
        assert!(d.timer_pending(now) || now - last >= CLAIM_NS - PUSH_NS);
        // Polling stops: it fires within the claim.
        assert!(readable(50), "the claim's end never fired");
        t.drain();
        assert!(!readable(0));
    }

    /// Whether the engine, waiting on `watch`, would wake within 100 ms.
    fn watch_readable(watch: &burst_io::PortWatch) -> bool {
        use std::os::fd::AsFd;
        burst_io::wait_fds(&[watch.as_fd()], std::time::Duration::from_millis(100)).unwrap() != 0
    }

    #[test]
    fn a_thread_with_nothing_to_poll_for_hands_the_port_over_watched() {
        use burst_io::Port;
        let port = burst_io::UdpPort::bind("127.0.151.1".parse().unwrap()).unwrap();
        let d = Drivers::new(Some(port.readiness().unwrap())).unwrap();
        let watch = d.watch.as_ref().expect("a socket port can be watched");
        let readable = || watch_readable(watch);
        let peer = std::net::UdpSocket::bind("127.0.151.2:0").unwrap();
        peer.send_to(b"traffic", port.local_addr()).unwrap();
        d.claim(1_000);
        assert_eq!(d.owner(2_000), Owner::Polling(1_000 + CLAIM_NS));
        assert!(
            !readable(),
            "the engine ignores the port while a thread polls"
        );
        // The thread took its last completion: the engine drives, and the
        // traffic that waits wakes it (no timer, no wake-up by the thread).
        d.shorten(3_000);
        assert_eq!(d.owner(3_001), Owner::Engine);
        assert!(readable(), "the watched port wakes the engine");
        // The thread polls again before the engine took the port: the
        // watch is off, the lane the thread's.
        d.claim(4_000);
        assert_eq!(d.owner(4_001), Owner::Polling(4_000 + CLAIM_NS));
        assert!(!readable());
        // Shortening twice, or claiming twice, keeps flag and set in step.
        d.shorten(5_000);
        d.shorten(5_001);
        assert!(readable());
        d.claim(6_000);
        d.claim(6_001);
        assert!(!readable());
    }

    #[test]
    fn a_waiter_takes_the_watch_off_and_an_engine_parked_for_waiters_watches_it_after() {
        use burst_io::Port;
        let port = burst_io::UdpPort::bind("127.0.151.3".parse().unwrap()).unwrap();
        let d = Drivers::new(Some(port.readiness().unwrap())).unwrap();
        let watch = d.watch.as_ref().unwrap();
        let readable = || watch_readable(watch);
        let peer = std::net::UdpSocket::bind("127.0.151.4:0").unwrap();
        peer.send_to(b"traffic", port.local_addr()).unwrap();
        // The engine parked while a thread polled: it waits on the watch,
        // so handing over needs no wake-up.
        d.claim(1_000);
        d.parking(Owner::Polling(1_000 + CLAIM_NS), 1_000 + CLAIM_NS);
        d.shorten(2_000);
        assert!(readable(), "the engine sees the watch");
        // A thread waits for an event on the port itself: the engine need
        // not watch it too.
        d.add_waiter();
        assert!(!readable(), "waiter and engine would both wake");
        assert!(!d.remove_waiter(3_000));
        // The engine parked while the thread waited (doorbells, timers and
        // the watch, switched off): handing over switches the watch on, and
        // the traffic wakes the engine; no wake-up by the thread.
        d.parking(Owner::Waiting, 9_000_000);
        assert!(!readable());
        d.shorten(4_000);
        assert!(readable(), "the engine parked for waiters sees the watch");
    }
}
