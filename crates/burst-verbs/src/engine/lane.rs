//! A lane's core: the data-plane loop of one engine thread over its port and queue pairs.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crossbeam::channel::Receiver;

use burst_transport::{RecvWr, SendWr, WcOpcode};
use burst_wire::Qpn;

use super::*;
use crate::{contain, Device, SrqId, FIRST_QPN};

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

/// The engine thread: steps the core while no application thread does.
///
/// On a small machine the engine thread shares a core with the application
/// thread, so it must neither compete while the application drives its own
/// I/O nor sleep while the application waits on memory that only the engine
/// writes (perftest's write_lat polls the CQ for a few microseconds, then
/// spins on memory). So: while an application thread steps (posting or
/// polling: inside a step, or its last one ended under 3 us ago), it sleeps,
/// 10 us and a quarter longer each time it finds the application still
/// driving (up to 1 ms), back to 10 us as soon as it does not; otherwise it
/// steps; idle, it spins (yielding) for 2 ms after the last work when no
/// application thread is around (a passive target answers the next request
/// without a wake-up), and else blocks until a packet, a doorbell or its next
/// transport timer (the kernel wakes it at once, preempting a spinning
/// application on the same core): an idle device does not wake at all.
///
/// Measured over the veth pair (burst-bench, pinned): write_bw 64 KiB as with
/// the earlier flat 1 ms sleep (same context switches, ~4700 in 2 s), and
/// write_lat / read_lat / atomic_lat p50 5.2 / 10.8 / 10.8 us with p99.9
/// under 100 us; perftest's ib_write_lat through the drop-in went from
/// 1.1 ms (flat sleep) to about 100 us on loopback (four threads, 2 cores).
pub(super) fn run(shared: &Shared, lane: usize, ready: &burst_io::Readiness) {
    const SPIN_NS: u64 = 2_000_000;
    const MIN_SLEEP: Duration = Duration::from_micros(10);
    const MAX_SLEEP: Duration = Duration::from_millis(1);
    crate::thread::fine_timer_slack();
    let mut last_work = 0u64;
    let mut backoff = MIN_SLEEP;
    let mut tokens = Vec::new();
    while !shared.stop.load(Ordering::Acquire) {
        let now = shared.clock.now();
        let stepped = shared.app_stepped.load(Ordering::Relaxed);
        let driving = shared.app_stepping.load(Ordering::Relaxed)
            || (stepped != 0 && now.saturating_sub(stepped) < APP_POLLING_NS);
        let core = if driving {
            None
        } else {
            shared.cores[lane].try_lock().ok()
        };
        let Some(mut core) = core else {
            // An application thread drives (or is in a step, where waiting
            // on the socket would return at once for packets it is about
            // to read): sleep, a quarter longer each time it is still
            // driving, back to the minimum once it is not.
            std::thread::sleep(backoff);
            backoff = backoff.mul_f32(1.25).min(MAX_SLEEP);
            continue;
        };
        backoff = MIN_SLEEP;
        let busy = core.step_contained(shared, lane, Round::Full, now);
        if busy {
            drop(core);
            last_work = now;
            continue;
        }
        // Idle: how long the kernel wait below may last (a walk over the
        // QPs' timers, so not on busy steps).
        let wait = idle_wait(&core, now);
        drop(core);
        let posted = shared.app_posted.load(Ordering::Relaxed);
        let app_around = posted != 0 && now.saturating_sub(posted) < APP_POSTED_NS;
        if !app_around && now.saturating_sub(last_work) < SPIN_NS {
            std::thread::yield_now();
        } else {
            // Say we sleep, then look at the doorbells once more: a client
            // that rang meanwhile either sees the word (and signals) or its
            // doorbell is seen here.
            let wake = &shared.wake;
            wake.sleeping(lane).store(1, Ordering::Relaxed);
            std::sync::atomic::fence(Ordering::SeqCst);
            if !shared.bells_pending(lane) && !shared.stop.load(Ordering::Acquire) {
                if let Some(fd) = wake.wait_fd(lane) {
                    let _ = ready.wait_or(fd, wait);
                }
            }
            wake.sleeping(lane).store(0, Ordering::Relaxed);
            wake.drain(lane, &mut tokens);
        }
    }
}

/// How long an idle lane may wait in the kernel for a packet or a
/// doorbell: until its next transport timer (retransmission, ACK, pacing),
/// without a limit when it has none ([`Engine`]'s drop wakes it), and at
/// most [`HELD_RECHECK`] while completions wait for room in a CQ (the
/// application frees it without ringing).
fn idle_wait(core: &Core, now: u64) -> Duration {
    let timer = core
        .dev
        .as_ref()
        .and_then(Device::next_timeout)
        .map_or(Duration::MAX, |t| {
            Duration::from_nanos(t.saturating_sub(now))
        });
    if core.held.is_empty() {
        timer
    } else {
        timer.min(HELD_RECHECK)
    }
}

/// While completions wait for room in a CQ, the lane looks again this often.
const HELD_RECHECK: Duration = Duration::from_millis(1);

impl Core {
    /// [`Core::step`], with a fault contained: the device's own guards
    /// catch faults inside its QPs and its port; one in the engine's code
    /// around them (doorbells, rings, completion delivery) fails every QP
    /// ([`AsyncEvent::DeviceFatal`]) and is logged, and the next step runs
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
    pub(super) fn post_send_now(&mut self, r: &QpRings, wr: SendWr) -> Result<(), PostError> {
        let dev = self.dev.as_mut().ok_or(PostError::Stopped)?;
        Core::take_rings(dev, &mut self.held, r);
        if self.held.blocks(r) {
            // Behind the held completions, as a ring's WRs wait.
            return r.send.push(wr).map_err(|_| PostError::Full);
        }
        dev.post_send_checked(r.qpn, wr).map_err(PostError::Refused)
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
            Round::Transmit => dev.transmit_at(now),
        };
        for ev in dev.take_async_events() {
            shared.events.push(ev);
        }
        busy |= Core::deliver_completions(dev, &mut self.held, shared, lane);
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
        let clients = shared
            .client_bells
            .read()
            .unwrap_or_else(|e| e.into_inner());
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
    fn deliver_completions(
        dev: &mut Device,
        held: &mut Held,
        shared: &Shared,
        lane: usize,
    ) -> bool {
        let mut busy = false;
        let cqs = shared.cqs.read().unwrap_or_else(|e| e.into_inner());
        held.flush(&cqs);
        let rings = shared.rings.read().unwrap_or_else(|e| e.into_inner());
        for r in rings.iter().flatten().filter(|r| r.lane == lane) {
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
    /// Transmit only (after a post).
    Transmit,
}
