//! A lane's core: the data-plane loop of one engine thread over its port and queue pairs.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crossbeam::channel::Receiver;

use burst_transport::{RecvWr, SendWr, WcOpcode};
use burst_wire::Qpn;

use super::*;
use crate::{contain, Device, SrqId, FIRST_QPN};

use super::drivers::Owner;

/// The data plane: the device and the completions waiting for CQ room.
pub(super) struct Core {
    pub(super) dev: Option<Device>,
    /// Completions a full CQ refused, per CQ, in order (see [`Held`]).
    pub(super) held: Held,
    pub(super) control_rx: Receiver<Control>,
    /// Daemon clients' doorbells taken this round: (owner, bell). Kept
    /// between rounds so that taking them allocates nothing.
    pub(super) bells: Vec<(u32, u32)>,
    /// Entries of clients' rings refused (see [`bad_input`]).
    pub(super) bad_input: u64,
    /// QPs with completions this round (kept between rounds, as `bells`).
    pub(super) completed: Vec<Qpn>,
    /// The send just posted waits in the device's cork: the post's round
    /// sends nothing ([`Round::Post`]).
    pub(super) post_corked: bool,
}

/// Counts an entry of a client's rings the engine refused and logs the
/// 1st, 2nd, 4th, 8th...: a client ringing others' doorbells without end
/// costs a log line per doubling, not one per doorbell.
pub(super) fn bad_input(count: &mut u64, owner: u32, what: &str) {
    *count += 1;
    if count.is_power_of_two() {
        tracing::warn!(client = owner, refused = *count, "{what}");
    }
}

/// The engine thread of lane `lane`: drives the lane while no application
/// thread does ([`Owner`]), and otherwise waits in the kernel.
///
/// - Nobody else drives: it steps while there is work, then waits on the
///   port, the doorbells and its next transport timer (an idle device does
///   not wake at all). A daemon client that polls its CQ cannot step the
///   lane itself, so while one polls the engine stays awake for it,
///   yielding the core between steps.
/// - A thread of this process polls ([`Owner::Polling`]): the engine leaves
///   it the port, and waits on the doorbells until the claim ends.
/// - Threads wait for events on the port ([`Owner::Waiting`]): the engine
///   takes doorbells and timers, not the port.
///
/// No sleep and no back-off: every wait ends on an event (a packet, a
/// doorbell, the engine's drop) or on a deadline the state gives (a
/// transport timer, the end of a claim).
pub(super) fn run(shared: &Shared, lane: usize) {
    // Transport timers to the microsecond, not the default 50 us slack.
    crate::thread::fine_timer_slack();
    let d = &shared.drivers[lane];
    let Some(ready) = d.ready.as_ref() else {
        return;
    };

    let wake = &shared.wake;
    let mut tokens = Vec::new();
    let mut clients = ClientPolls::default();
    let mut last_work = 0u64;
    let mut yielding = Yielding::default();
    while !shared.stop.load(Ordering::Acquire) {
        let now = shared.clock.now();
        let owner = d.owner(now);
        let until = match owner {
            // The polling thread's steps run the timers.
            Owner::Polling(end) => end,
            Owner::Waiting | Owner::Engine => {
                // Blocks while another thread is inside a step (a futex
                // wait, woken when it lets go).
                let lapsed = d.lapsed(now);
                let mut core = shared.cores[lane].lock().unwrap_or_else(|e| e.into_inner());
                if lapsed {
                    // Sends corked by the thread whose claim lapsed waited
                    // for the lapse: that thread posts and goes away.
                    if let Some(dev) = core.dev.as_mut().filter(|d| d.corked()) {
                        dev.stop_corking();
                    }
                }
                if core.step_contained(shared, lane, Round::Full, now) {
                    // A claim that lapsed with work waiting: its thread
                    // will not come back for it (see `Drivers::unclaim`).
                    if lapsed {
                        d.unclaim();
                    } else {
                        d.engine_found_work();
                    }
                    last_work = now;
                    continue;
                }
                // Idle: the walk over the QPs' timers, not on busy steps.
                let until = idle_until(&core, now);
                drop(core);
                // After work the engine keeps looking, yielding the core
                // (unless a yield handed it to a spinner: `Yielding`),
                // for a while before it waits in the kernel:
                // - a poll-mode port's packets (DPDK) cannot wake it:
                //   POLL_MODE_SPIN_NS;
                // - a passive lane (no application thread polls or posts:
                //   a READ or WRITE target whose application waits
                //   elsewhere) would pay a wake-up (20-40 us here) per
                //   request: PASSIVE_POLL_NS, as SO_BUSY_POLL does for a
                //   socket.
                // Not otherwise: a yielding engine hands a thread that
                // spins on memory on the same core its whole time slice
                // (ib_write_lat went from 48 us back to 2 ms), and such a
                // thread posts, so its lane is not passive.
                let spin = if !ready.waitable() {
                    POLL_MODE_SPIN_NS
                } else if owner == Owner::Engine && d.passive(now) {
                    PASSIVE_POLL_NS
                } else {
                    0
                };
                let hot = now.saturating_sub(last_work) < spin;
                let wanted = owner == Owner::Engine && (hot || clients.polling(wake, lane, now));
                // (A poll-mode port cannot wake the engine: it yields.)
                match yielding.how(now, now.saturating_sub(last_work), ready.waitable()) {
                    Look::Yield if wanted => {
                        std::thread::yield_now();
                        yielding.yielded(now, shared.clock.now());
                        continue;
                    }
                    Look::Spin if wanted => {
                        std::hint::spin_loop();
                        continue;
                    }
                    _ => {}
                }
                until
            }
        };
        let polling = matches!(owner, Owner::Polling(_));
        d.parking(owner, until);
        // Say we sleep, then look once more: a thread that rang a doorbell
        // or changed the lane's owner meanwhile either sees the word (and
        // signals) or is seen here. While a thread polls, doorbells are
        // its to take: no signal then.
        if !polling {
            wake.sleeping(lane).store(1, Ordering::Relaxed);
        }
        std::sync::atomic::fence(Ordering::SeqCst);
        let now = shared.clock.now();
        let same = match (owner, d.owner(now)) {
            (Owner::Polling(_), Owner::Polling(_)) => true,
            (a, b) => a == b,
        };
        if same && (polling || !shared.bells_pending(lane)) && !shared.stop.load(Ordering::Acquire)
        {
            if let (Some(fd), Some(timer)) = (wake.wait_fd(lane), d.timer.as_ref()) {
                // A claim's end comes by its timer, which the polling
                // thread keeps pushing forward: no wake-up while it polls.
                let until = if polling && d.timer_pending(now) {
                    u64::MAX
                } else {
                    until
                };
                let timeout = if until == u64::MAX {
                    Duration::MAX
                } else {
                    Duration::from_nanos(until.saturating_sub(now))
                };
                use std::os::fd::AsFd;
                // While a thread polls or waits, the port as far as it is
                // watched: a thread took its last completion or armed a CQ
                // (`Drivers::shorten`; a waiter takes the watch off while
                // it waits on the port itself).
                let watch = d.watch.as_ref().filter(|_| owner != Owner::Engine);
                let also = [fd, timer.as_fd(), watch.map_or(fd, |w| w.as_fd())];
                let n = match owner {
                    Owner::Engine => 1,
                    _ if watch.is_some() => 3,
                    _ => 2,
                };
                let _ = ready.wait_with(owner == Owner::Engine, &also[..n], timeout);
            }
        }
        wake.sleeping(lane).store(0, Ordering::Relaxed);
        d.unparked();
        if let Some(t) = &d.timer {
            t.drain();
        }
        wake.drain(lane, &mut tokens);
    }
}

/// The engine thread of lane `lane` when it busy-polls
/// ([`super::Drive::Spin`]): it owns a core and steps the lane without
/// end, never waiting in the kernel, so no packet, doorbell or timer waits
/// for a wake-up, and no application thread steps the lane (see
/// `Context::step_with`). Between idle steps it only hints the CPU that it
/// spins, so a control call waiting for the core gets it.
pub(super) fn spin(shared: &Shared, lane: usize) {
    let mut tokens = Vec::new();
    let mut idle = 0u32;
    while !shared.stop.load(Ordering::Acquire) {
        let now = shared.clock.now();
        let busy = shared.cores[lane]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .step_contained(shared, lane, Round::Full, now);
        if busy {
            idle = 0;
            continue;
        }
        idle = idle.wrapping_add(1);
        // Wake-ups nobody waits for (a QP1 MAD queued, a waiter leaving)
        // still count up in the lane's descriptors: take them now and
        // then, so they never fill.
        if idle % 65_536 == 0 {
            shared.wake.drain(lane, &mut tokens);
        }
        std::hint::spin_loop();
    }
}

/// Whether a daemon client polls its CQs: each empty poll counts in the
/// lane's word of the wake segment ([`Wake::client_polled`]); the engine
/// stays awake while the count moved within [`CLIENT_POLL_NS`].
#[derive(Debug, Default)]
struct ClientPolls {
    seen: u32,
    moved: u64,
}

/// How long an engine over a poll-mode port (DPDK), which nothing can
/// wait on, keeps looking at it after work before it naps between looks:
/// the one timed rule left, for ports without an event (memif's interrupt
/// mode would remove it).
const POLL_MODE_SPIN_NS: u64 = 2_000_000;

/// How long a passive lane's engine keeps looking at a waitable port after
/// work (see `run`): several round trips of a request-response peer.
const PASSIVE_POLL_NS: u64 = 200_000;

/// How long after a daemon client's last empty poll the engine still
/// steps for it without waiting in the kernel.
const CLIENT_POLL_NS: u64 = 100_000;

/// How the engine thread keeps looking at its lane after work, when it
/// does ([`Yielding::how`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Look {
    /// Step again, yielding the core first.
    Yield,
    /// Step again at once, without yielding.
    Spin,
    /// Wait in the kernel.
    Wait,
}

/// Whether the engine thread may yield its core while it keeps looking.
/// A yield that lasted longer than [`LONG_YIELD_NS`] gave the core to a
/// thread that does not block (riostream's latency test spins on its
/// buffer; through burstd each hop waited for its time slice: 2.5-3.6 ms
/// per round trip): every further yield would hand it another slice. For
/// [`NO_YIELD_NS`] then the engine steps without yielding for
/// [`SHORT_SPIN_NS`] after work (a ping-pong's next doorbell comes within
/// microseconds from another core; a spinner on this one waits that long
/// at most) and otherwise waits in the kernel, where a doorbell or a
/// packet wakes it and it preempts the spinner.
#[derive(Debug, Default)]
struct Yielding {
    /// Device-clock ns until which the engine does not yield.
    no_yield_until: u64,
}

impl Yielding {
    /// How to keep looking at `now`, `since_work` ns after the last step
    /// that found work, over a port that can (`waitable`) or cannot wake
    /// the engine (a poll-mode port: always yield).
    fn how(&self, now: u64, since_work: u64, waitable: bool) -> Look {
        if !waitable || now >= self.no_yield_until {
            Look::Yield
        } else if since_work < SHORT_SPIN_NS {
            Look::Spin
        } else {
            Look::Wait
        }
    }

    /// A yield that began at `start` returned at `end`.
    fn yielded(&mut self, start: u64, end: u64) {
        if end.saturating_sub(start) > LONG_YIELD_NS {
            self.no_yield_until = start.saturating_add(NO_YIELD_NS);
        }
    }
}

/// A yield longer than this handed the core to a thread that does not
/// block ([`Yielding`]): a time slice, not the wait of a thread that
/// blocks again soon.
const LONG_YIELD_NS: u64 = 1_000_000;

/// How long the engine does not yield after a long one ([`Yielding`]).
const NO_YIELD_NS: u64 = 50_000_000;

/// How long after work an engine that does not yield keeps stepping before
/// it waits in the kernel ([`Yielding`]).
const SHORT_SPIN_NS: u64 = 20_000;

impl ClientPolls {
    fn polling(&mut self, wake: &Wake, lane: usize, now: u64) -> bool {
        let n = wake.client_polls(lane);
        if n != self.seen {
            self.seen = n;
            self.moved = now;
        }
        self.moved != 0 && now.saturating_sub(self.moved) < CLIENT_POLL_NS
    }
}

/// When an idle lane's kernel wait ends (device-clock ns): at its next
/// transport timer (retransmission, ACK, pacing), never when it has none
/// ([`Engine`]'s drop wakes it), and at most [`HELD_RECHECK`] away while
/// completions wait for room in a CQ (the application frees it without
/// ringing).
pub(super) fn idle_until(core: &Core, now: u64) -> u64 {
    let timer = core
        .dev
        .as_ref()
        .and_then(Device::next_timeout)
        .unwrap_or(u64::MAX);
    if core.held.is_empty() {
        timer
    } else {
        timer.min(now.saturating_add(HELD_RECHECK.as_nanos() as u64))
    }
}

/// While completions wait for room in a CQ, the lane looks again this often.
const HELD_RECHECK: Duration = Duration::from_millis(1);

impl Core {
    /// [`Core::step`], with a fault contained: the device's own guards
    /// catch faults inside its QPs and its port; one in the engine's code
    /// around them (doorbells, rings, completion delivery) fails every QP
    /// ([`crate::AsyncEvent::DeviceFatal`]) and is logged, and the next step runs
    /// as usual. The panic never unwinds through the core's lock, so the
    /// lock is not poisoned and the data plane never silently stops.
    pub(super) fn step_contained(
        &mut self,
        shared: &Shared,
        lane: usize,
        round: Round,
        now: u64,
    ) -> bool {
        self.contained(shared, |core| core.step(shared, lane, round, now))
            .unwrap_or(true)
    }

    /// Runs `f` on the core with a fault contained (see
    /// [`Core::step_contained`]); `None` if it faulted.
    pub(super) fn contained<R>(
        &mut self,
        shared: &Shared,
        f: impl FnOnce(&mut Core) -> R,
    ) -> Option<R> {
        match contain(|| f(self)) {
            Ok(r) => Some(r),
            Err(msg) => {
                tracing::error!("internal fault in the engine: {msg}");
                if let Some(dev) = self.dev.as_mut() {
                    dev.fail_all(&msg);
                    for ev in dev.take_async_events() {
                        shared.events.push(ev);
                    }
                }
                None
            }
        }
    }

    /// Runs the control requests waiting.
    pub(super) fn run_control(&mut self, shared: &Shared) {
        if let Some(dev) = self.dev.as_mut() {
            while let Ok(c) = self.control_rx.try_recv() {
                if let Some(qpn) = control(dev, c) {
                    Core::publish_modified(dev, shared, qpn);
                    // A control call steps nothing (it may run on the
                    // caller's thread): work the transition let out is
                    // the lane's driver's, wake it if it sleeps.
                    if dev.transmit_pending(qpn) {
                        shared.wake.nudge(dev.lane());
                    }
                }
            }
        }
    }

    /// After a modify: the QP's queues may have changed without a
    /// completion (RESET empties them), so its front end learns now.
    pub(super) fn publish_modified(dev: &Device, shared: &Shared, qpn: Qpn) {
        let rings = shared.rings.read().unwrap_or_else(|e| e.into_inner());
        if let Some(Some(r)) = rings.get(qpn.value().wrapping_sub(FIRST_QPN) as usize) {
            Core::publish_retired(dev, r);
        }
    }

    /// Moves the WRs waiting in a QP's rings into the transport, in order.
    /// A WR the transport refuses completes with an error, since the
    /// application's post call has already returned. While a CQ of the QP
    /// holds completions the WRs stay in the rings (see [`Held`]).
    pub(super) fn take_rings(dev: &mut Device, held: &mut Held, r: &QpRings) -> bool {
        if held.blocks(r) {
            held.pause(r.qpn);
            return false;
        }
        let mut busy = false;
        // WRs another process posted are checked again here: its own check
        // ran in memory it controls.
        let foreign = r.owner != 0;
        // A ring's worth per visit: a client that posts without end cannot
        // hold the lane; what is left is taken at the next step.
        let mut budget = r.recv.capacity() + r.send.capacity();
        while let Some(w) = (budget > 0).then(|| r.recv.pop()).flatten() {
            budget -= 1;
            busy = true;
            let id = w.wr_id;
            if (foreign && r.cfg.check_recv(&w).is_err())
                || dev.post_recv_checked(r.qpn, w).is_err()
            {
                r.refused.1.fetch_add(1, Ordering::Relaxed);
                held.push(r.recv_cq.0 as usize, refused(id, WcOpcode::Recv, r.qpn));
            }
        }
        while let Some(w) = (budget > 0).then(|| r.send.pop()).flatten() {
            budget -= 1;
            busy = true;
            let (id, op) = (w.wr_id, w.op.wc_opcode());
            // A client's UD request may only name its own address handles.
            let others_ah = foreign && w.ud.is_some_and(|d| dev.ah_owner(d.ah) != Some(r.owner));
            if others_ah
                || (foreign && r.cfg.check_send(&w).is_err())
                || dev.post_send_checked(r.qpn, w).is_err()
            {
                r.refused.0.fetch_add(1, Ordering::Relaxed);
                held.push(r.send_cq.0 as usize, refused(id, op, r.qpn));
            }
        }
        if budget == 0 {
            held.pause(r.qpn);
        }
        if busy {
            Core::publish_retired(dev, r);
        }
        busy
    }

    /// Tells `r`'s front end how many of its WRs are finished with.
    pub(super) fn publish_retired(dev: &Device, r: &QpRings) {
        if let Some((send, recv)) = dev.retired(r.qpn) {
            r.words.set_retired(
                send + r.refused.0.load(Ordering::Relaxed),
                recv + r.refused.1.load(Ordering::Relaxed),
            );
        }
    }

    /// Posts a checked send WR straight into the transport (the posting
    /// thread holds the core); WRs already in the QP's ring go first.
    /// `len`: the WR's length, for the cork, and `more`: more WRs of the
    /// same list follow ([`Device::cork_post`]).
    pub(super) fn post_send_now(
        &mut self,
        r: &QpRings,
        wr: SendWr,
        len: u64,
        more: bool,
    ) -> Result<(), PostError> {
        let dev = self.dev.as_mut().ok_or(PostError::Stopped)?;
        Core::take_rings(dev, &mut self.held, r);
        if self.held.blocks(r) {
            // Behind the held completions, as a ring's WRs wait.
            return r.send.push(wr).map_err(|_| PostError::Full);
        }
        let op = wr.op;
        dev.post_send_checked(r.qpn, wr)
            .map_err(PostError::Refused)?;
        self.post_corked = dev.cork_post(r.qpn, &op, len, more);
        Ok(())
    }

    /// [`Core::post_send_now`] for a receive.
    pub(super) fn post_recv_now(&mut self, r: &QpRings, wr: RecvWr) -> Result<(), PostError> {
        let dev = self.dev.as_mut().ok_or(PostError::Stopped)?;
        Core::take_rings(dev, &mut self.held, r);
        if self.held.blocks(r) {
            return r.recv.push(wr).map_err(|_| PostError::Full);
        }
        dev.post_recv_checked(r.qpn, wr).map_err(PostError::Refused)
    }

    /// One round: control requests, doorbells, transmit (and, for a full
    /// round, receive and timers), completions into the CQ rings. Returns
    /// whether there was work.
    /// `now`: the device clock (`shared.clock`, which the device shares).
    pub(super) fn step(&mut self, shared: &Shared, lane: usize, round: Round, now: u64) -> bool {
        let Some(dev) = self.dev.as_mut() else {
            return false;
        };
        // A corked post sent nothing and completed nothing: the round that
        // sends it (sure to come, `Device::cork_post`) takes the control
        // requests and doorbells too.
        if round == Round::Post && std::mem::take(&mut self.post_corked) {
            return false;
        }
        let mut busy = false;
        while let Ok(c) = self.control_rx.try_recv() {
            busy = true;
            if let Some(qpn) = control(dev, c) {
                Core::publish_modified(dev, shared, qpn);
            }
        }
        busy |= Core::resume_paused(dev, &mut self.held, shared);
        busy |= Core::take_doorbells(
            dev,
            &mut self.held,
            &mut self.bells,
            &mut self.bad_input,
            shared,
            lane,
        );
        // Packets moved count as work: a request received this round is
        // answered (READ response, ACK) in the next round's transmit.
        busy |= match round {
            Round::Full => dev.progress_at(now),
            Round::Transmit | Round::Post => dev.transmit_at(now),
        };
        for ev in dev.take_async_events() {
            shared.events.push(ev);
        }
        busy |= Core::deliver_completions(dev, &mut self.held, &mut self.completed, shared);
        // Channels are signalled with no lock held.
        self.held.signal();
        busy
    }

    /// QPs paused behind a CQ's held completions go on once it drained.
    fn resume_paused(dev: &mut Device, held: &mut Held, shared: &Shared) -> bool {
        if held.paused.is_empty() {
            return false;
        }
        let mut busy = false;
        let paused = std::mem::take(&mut held.paused);
        let rings = shared.rings.read().unwrap_or_else(|e| e.into_inner());
        for q in paused {
            if let Some(Some(r)) = rings.get(q.value().wrapping_sub(FIRST_QPN) as usize) {
                busy |= Core::take_rings(dev, held, r);
            }
        }
        busy
    }

    /// Doorbells: moves posted WQEs from the rings into the transport. A
    /// doorbell lost to a full queue is made up by visiting every ring.
    fn take_doorbells(
        dev: &mut Device,
        held: &mut Held,
        client_bells: &mut Vec<(u32, u32)>,
        bad: &mut u64,
        shared: &Shared,
        lane: usize,
    ) -> bool {
        let mut busy = false;
        let mut missed: Vec<u32> = Vec::new();
        let doorbell = &shared.doorbells[lane];
        if doorbell.take_overflow() {
            let rings = shared.rings.read().unwrap_or_else(|e| e.into_inner());
            missed.extend(
                rings
                    .iter()
                    .flatten()
                    .filter(|r| r.lane == lane)
                    .map(|r| r.qpn.value()),
            );
            if lane == 0 {
                let srqs = shared.srqs.read().unwrap_or_else(|e| e.into_inner());
                missed.extend((0..srqs.len() as u32).map(|i| SRQ_DOORBELL | i));
                // No CQ doorbells here: only daemon clients ring them (this
                // process's own arms signal their channels directly).
            }
        }
        Core::collect_client_bells(client_bells, shared, lane);
        let mut next_bell = || {
            doorbell
                .pop()
                .map(|b| (0, b))
                .or_else(|| missed.pop().map(|b| (0, b)))
                .or_else(|| client_bells.pop())
        };
        while let Some((owner, bell)) = next_bell() {
            busy = true;
            if bell & SRQ_DOORBELL != 0 {
                Core::take_srq(dev, bad, shared, owner, SrqId(bell & !SRQ_DOORBELL));
                continue;
            }
            if bell & CQ_DOORBELL != 0 {
                let cqs = shared.cqs.read().unwrap_or_else(|e| e.into_inner());
                match cqs.get((bell & !CQ_DOORBELL) as usize) {
                    Some(Some(q)) if q.owner == owner => {
                        held.signals.extend(q.fire_unseen().cloned());
                    }
                    _ => bad_input(bad, owner, "doorbell for another client's CQ ignored"),
                }
                continue;
            }
            let rings = shared.rings.read().unwrap_or_else(|e| e.into_inner());
            if let Some(Some(r)) = rings.get(bell.wrapping_sub(FIRST_QPN) as usize) {
                if r.owner == owner {
                    Core::take_rings(dev, held, r);
                } else {
                    bad_input(bad, owner, "doorbell for another client's QP ignored");
                }
            }
        }
        busy
    }

    /// Daemon clients' doorbells of `lane`: each may only name its own
    /// rings.
    fn collect_client_bells(client_bells: &mut Vec<(u32, u32)>, shared: &Shared, lane: usize) {
        client_bells.clear();
        let Some(clients) = shared.client_bells.read() else {
            return;
        };
        for b in clients.iter().filter(|b| b.lane == lane) {
            if b.take_overflow() {
                let rings = shared.rings.read().unwrap_or_else(|e| e.into_inner());
                client_bells.extend(
                    rings
                        .iter()
                        .flatten()
                        .filter(|r| r.lane == lane && r.owner == b.owner)
                        .map(|r| (b.owner, r.qpn.value())),
                );
                if lane == 0 {
                    let srqs = shared.srqs.read().unwrap_or_else(|e| e.into_inner());
                    client_bells.extend(srqs.iter().enumerate().filter_map(|(i, s)| {
                        s.as_ref()
                            .filter(|s| s.owner == b.owner)
                            .map(|_| (b.owner, SRQ_DOORBELL | i as u32))
                    }));
                    let cqs = shared.cqs.read().unwrap_or_else(|e| e.into_inner());
                    client_bells.extend(cqs.iter().enumerate().filter_map(|(i, q)| {
                        q.as_ref()
                            .filter(|q| q.owner == b.owner)
                            .map(|_| (b.owner, CQ_DOORBELL | i as u32))
                    }));
                }
            }
            // Bounded: a client that rings without end cannot hold the lane.
            for _ in 0..Doorbells::CLIENT_DEPTH {
                match b.pop() {
                    Some(bell) => client_bells.push((b.owner, bell)),
                    None => break,
                }
            }
        }
    }

    /// An SRQ's doorbell: moves its posted receives into the transport.
    fn take_srq(dev: &mut Device, bad: &mut u64, shared: &Shared, owner: u32, id: SrqId) {
        let srqs = shared.srqs.read().unwrap_or_else(|e| e.into_inner());
        let Some(Some(srq)) = srqs.get(id.0 as usize) else {
            return;
        };
        if srq.owner != owner {
            bad_input(bad, owner, "doorbell for another client's SRQ ignored");
            return;
        }
        // A ring's worth per doorbell (a client posting without end rings
        // again for the rest).
        for w in std::iter::from_fn(|| srq.ring.pop()).take(srq.ring.capacity()) {
            if owner != 0 && w.sg_list.len() > srq.max_sge as usize {
                bad_input(bad, owner, "SRQ receive with too many SGEs dropped");
                continue;
            }
            // Checked at post time; a WR refused here (the SRQ was
            // destroyed meanwhile) has no QP to complete on.
            if dev.post_srq_recv(id, w).is_err() {
                bad_input(bad, owner, "SRQ receive dropped (the SRQ is full or gone)");
            }
        }
    }

    /// Completions into the CQ rings, in order per CQ: held ones first.
    /// Only QPs that completed something are visited (idle QPs cost
    /// nothing per round).
    fn deliver_completions(
        dev: &mut Device,
        held: &mut Held,
        completed: &mut Vec<Qpn>,
        shared: &Shared,
    ) -> bool {
        let mut busy = false;
        dev.take_completed(completed);
        // Most steps complete nothing and hold nothing: no lock taken.
        if completed.is_empty() && held.by_cq.is_empty() {
            return false;
        }
        let cqs = shared.cqs.read().unwrap_or_else(|e| e.into_inner());
        held.flush(&cqs);
        if completed.is_empty() {
            return false;
        }
        let rings = shared.rings.read().unwrap_or_else(|e| e.into_inner());
        for &qpn in completed.iter() {
            let Some(Some(r)) = rings.get(qpn.value().wrapping_sub(FIRST_QPN) as usize) else {
                // Not published yet: delivered when it is.
                dev.keep_completed(qpn);
                continue;
            };
            // Published with completions, before them: a slot is free again
            // by the time the application sees the completion that frees
            // it, and idle QPs cost nothing per step. (Unsignaled sends
            // free their slots with the next completion, as on an RNIC.)
            let mut published = false;
            while let Some(wc) = dev.take_completion(r.qpn) {
                if !published {
                    Core::publish_retired(dev, r);
                    published = true;
                }
                busy = true;
                let cq = if wc.is_recv() { r.recv_cq } else { r.send_cq }.0 as usize;
                if let Some(Some(q)) = cqs.get(cq) {
                    held.deliver_or_hold(q, cq, wc, &shared.events);
                }
            }
        }
        busy
    }
}

/// What a step of the core does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Round {
    /// Transmit, receive, timers.
    Full,
    /// Transmit only.
    Transmit,
    /// A post's: transmit only, and nothing when the post was corked
    /// (`Device::cork_post`: a round soon sends it with others).
    Post,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The engine yields while yields are short; one that took a time
    /// slice stops the yields for [`NO_YIELD_NS`]: it steps without
    /// yielding for [`SHORT_SPIN_NS`] after work, then waits; a poll-mode
    /// port, which cannot wake it, keeps yielding.
    #[test]
    fn a_yield_that_took_a_time_slice_stops_the_yields_for_a_while() {
        let mut y = Yielding::default();
        let t = 1_000_000_000;
        assert_eq!(y.how(t, 0, true), Look::Yield);
        y.yielded(t, t + 5_000);
        assert_eq!(y.how(t + 10_000, 0, true), Look::Yield, "a short yield");
        y.yielded(t + 10_000, t + 10_000 + 3_000_000);
        let after = t + 3_020_000;
        assert_eq!(y.how(after, 1_000, true), Look::Spin);
        assert_eq!(y.how(after, SHORT_SPIN_NS, true), Look::Wait);
        assert_eq!(y.how(after, 1_000, false), Look::Yield, "poll-mode port");
        assert_eq!(y.how(t + 10_000 + NO_YIELD_NS, 0, true), Look::Yield);
    }
}
