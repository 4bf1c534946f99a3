//! Completion queues: their rings, completion channels and the verbs that create, arm and destroy them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::shm::{Segment, ShmRing};

use burst_transport::WorkCompletion;

use super::*;
use crate::AsyncEvent;

/// [`Cq::armed`]: armed by `ibv_req_notify_cq`.
const ARMED: u32 = 1;
/// [`Cq::armed`]: armed, and an empty poll since skipped its step
/// ([`Cq::poll_may_skip_step`]). The engine treats it as armed.
const ARMED_LOOKED: u32 = 2;

/// [`Cq::unseen`]: completions came without an event.
const UNSEEN: u32 = 1;

/// [`Cq::unseen`]: an event was raised since the last empty poll.
const COVERED: u32 = 2;

/// Handle of a completion queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CqId(pub u32);

/// A completion channel (`ibv_comp_channel`): CQs armed with
/// [`Context::req_notify_cq`] report their next completion here, and the
/// channel's file descriptor becomes readable. The engine counts the event
/// in the CQ's shared words and signals the descriptor (in daemon mode a
/// pipe: the daemon holds its write end, the application its read end), so
/// which CQ an event belongs to never crosses a socket.
#[derive(Debug)]
pub struct CompChannel {
    pub(super) fd: crate::eventfd::EventFd,
    pub(super) cqs: std::sync::Mutex<Vec<(CqId, Arc<Cq>)>>,
    /// burstd's handle of this channel (a daemon client's).
    pub(super) remote_id: std::sync::atomic::AtomicU32,
    /// Events made by the thread that waits on this channel in
    /// [`Context::wait_cq_event`] while it stepped the lane itself, handed
    /// over in memory instead of through the descriptor (see
    /// [`CompChannel::notify`]).
    handed: std::sync::atomic::AtomicU32,
    /// Events handed over so (a count for tests and reports).
    in_memory: std::sync::atomic::AtomicU64,
}

std::thread_local! {
    /// The channel this thread waits on in [`Context::wait_cq_event`], for
    /// the steps it takes there (null otherwise).
    static WAITING_ON: std::cell::Cell<*const CompChannel> =
        const { std::cell::Cell::new(std::ptr::null()) };
}

/// Clears [`WAITING_ON`] however [`Context::wait_cq_event`] returns.
struct Waiting;

impl Waiting {
    fn on(ch: &CompChannel) -> Waiting {
        WAITING_ON.with(|w| w.set(ch));
        Waiting
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        WAITING_ON.with(|w| w.set(std::ptr::null()));
    }
}

impl CompChannel {
    pub(crate) fn with_fd(fd: crate::eventfd::EventFd) -> CompChannel {
        CompChannel {
            fd,
            cqs: std::sync::Mutex::default(),
            remote_id: Default::default(),
            handed: Default::default(),
            in_memory: Default::default(),
        }
    }

    /// How many events this channel handed over in memory to the thread
    /// that waited on it (see `CompChannel::notify`), since it was made.
    pub fn events_in_memory(&self) -> u64 {
        self.in_memory.load(Ordering::Relaxed)
    }

    /// Tells the channel's reader of an event (counted on its CQ first).
    /// When the thread making it is the one waiting on this channel in
    /// [`Context::wait_cq_event`] (it stepped the lane itself), the event
    /// is handed over in memory: that thread takes it right after its
    /// step, so writing the descriptor only for the same thread to poll
    /// and read it again would be three system calls per event for
    /// nothing. (Another thread blocked on the descriptor meanwhile does
    /// not see this event, as if the waiter had won the race to read it.)
    pub(super) fn notify(&self) {
        if WAITING_ON.with(|w| std::ptr::eq(w.get(), self)) {
            self.handed.fetch_add(1, Ordering::Release);
            self.in_memory.fetch_add(1, Ordering::Relaxed);
        } else {
            self.fd.signal();
        }
    }

    pub(crate) fn set_remote_id(&self, id: u32) {
        self.remote_id.store(id, Ordering::Relaxed);
    }

    pub(crate) fn remote_id(&self) -> u32 {
        self.remote_id.load(Ordering::Relaxed)
    }

    /// The file descriptor to `poll()` for readability.
    pub fn fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.fd)
    }

    /// `ibv_get_cq_event`: the next CQ with an event, waiting up to `timeout`.
    pub fn get_cq_event(&self, timeout: Duration) -> Option<CqId> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(cq) = self.try_get_cq_event() {
                return Some(cq);
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() || !self.fd.wait(left) {
                return self.try_get_cq_event();
            }
        }
    }

    /// `ibv_get_cq_event` exactly: reads the descriptor (blocking unless the
    /// application made it non-blocking) and returns the CQ of that event.
    pub fn read_cq_event(&self) -> Option<CqId> {
        if self.fd.read() {
            return self.take_event();
        }
        None
    }

    /// The next CQ with an event, if one is pending (never blocks).
    pub fn try_get_cq_event(&self) -> Option<CqId> {
        if let Some(cq) = self.take_handed() {
            return Some(cq);
        }
        // One fd count per event, taken with the event: the fd stays
        // readable exactly while events are pending.
        if self.fd.drain() {
            // The engine counts the event before it signals.
            return self.take_event();
        }
        None
    }

    /// An event handed over in memory ([`CompChannel::notify`]), if one
    /// is (no system call).
    fn take_handed(&self) -> Option<CqId> {
        if self.handed.load(Ordering::Acquire) != 0
            && self
                .handed
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok()
        {
            return self.take_event();
        }
        None
    }

    /// The CQ whose event count the taken fd count stands for.
    pub(super) fn take_event(&self) -> Option<CqId> {
        let cqs = self.cqs.lock().unwrap_or_else(|e| e.into_inner());
        cqs.iter().find_map(|(id, q)| {
            q.events()
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .ok()
                .map(|_| *id)
        })
    }
}

/// A completion queue: a ring, and its notification state, in one
/// segment: word 0 "armed", word 1 the events counted for its channel, the
/// ring at byte 64.
#[derive(Debug)]
pub struct Cq {
    pub(super) ring: ShmRing<WorkCompletion>,
    pub(super) channel: Option<Arc<CompChannel>>,
    pub(super) owner: u32,
    /// A completion found the ring full and [`AsyncEvent::CqError`] was
    /// raised: once per CQ (an overrun is an error of the application, as
    /// on an RNIC; the paused QPs refilling a CQ polled two at a time would
    /// otherwise raise one per refill).
    pub(super) overrun: AtomicBool,
    /// QPs reset or destroyed while their completions were in the ring:
    /// (QPN, the ring position before which its entries are dropped at
    /// poll), as mlx5 cleans a CQ of a QP moved to RESET. Set only by the
    /// consumer's own verbs, so a daemon client's view needs no daemon.
    stale: std::sync::Mutex<Vec<(burst_wire::Qpn, u64)>>,
    /// `stale` is not empty (the poll looks at it only then).
    any_stale: AtomicBool,
}

pub(super) const CQ_RING: usize = 64;

impl Cq {
    /// Bytes of a CQ of `slots` slots.
    pub(crate) fn bytes(slots: usize) -> usize {
        CQ_RING + ShmRing::<WorkCompletion>::bytes(slots)
    }

    pub(super) fn new(
        seg: Arc<Segment>,
        slots: usize,
        fresh: bool,
        channel: Option<Arc<CompChannel>>,
        owner: u32,
    ) -> std::io::Result<Cq> {
        let ring = if fresh {
            ShmRing::create(seg, CQ_RING, slots)?
        } else {
            ShmRing::attach(seg, CQ_RING, slots)?
        };
        Ok(Cq {
            ring,
            channel,
            owner,
            overrun: AtomicBool::new(false),
            stale: std::sync::Mutex::new(Vec::new()),
            any_stale: AtomicBool::new(false),
        })
    }

    /// QP `qpn` was reset or destroyed: the completions it has in the
    /// ring now are never polled (an application that resets a QP to use
    /// it again must not find the old connection's flushes first).
    pub(super) fn drop_completions_of(&self, qpn: burst_wire::Qpn) {
        let fence = self.ring.next_position();
        let mut stale = self.stale.lock().unwrap_or_else(|e| e.into_inner());
        stale.retain(|(q, _)| *q != qpn);
        stale.push((qpn, fence));
        self.any_stale.store(true, Ordering::Release);
    }

    /// The oldest completion that is not stale ([`Cq::drop_completions_of`]).
    fn take(&self) -> Option<WorkCompletion> {
        loop {
            let (pos, wc) = self.ring.pop_positioned()?;
            if !self.any_stale.load(Ordering::Acquire) {
                return Some(wc);
            }
            let mut stale = self.stale.lock().unwrap_or_else(|e| e.into_inner());
            // Fences the consumer has passed are done with.
            stale.retain(|(_, fence)| fence.wrapping_sub(pos) as i64 > 0);
            let dropped = stale
                .iter()
                .any(|(q, fence)| *q == wc.qp_num && (fence.wrapping_sub(pos) as i64) > 0);
            if stale.is_empty() {
                self.any_stale.store(false, Ordering::Release);
            }
            if !dropped {
                return Some(wc);
            }
        }
    }

    /// What the application has heard of the ring's completions since a
    /// poll last found it empty: 0 nothing came, [`UNSEEN`] completions
    /// came without an event, [`COVERED`] an event was raised (the
    /// completions that come after it, before the application polls, are
    /// its to find: it polls after the event, as on RXE and RNICs, where a
    /// completion into a CQ not armed raises nothing, and re-arming over
    /// them raises nothing either). Shared with burstd like the other
    /// words: its engine delivers, the client arms.
    fn unseen(&self) -> &std::sync::atomic::AtomicU32 {
        self.ring.segment().word(8)
    }

    /// Takes the next completion; one found missing clears
    /// [`Cq::unseen`] (and looks once more, so one put in meanwhile is
    /// not left behind a cleared flag).
    pub(super) fn pop(&self) -> Option<WorkCompletion> {
        if let Some(wc) = self.take() {
            return Some(wc);
        }
        if self.unseen().load(Ordering::Acquire) == 0 {
            return None;
        }
        self.unseen().store(0, Ordering::SeqCst);
        self.take()
    }

    /// `ibv_req_notify_cq`; returns whether the CQ holds completions that
    /// came after the application last found it empty and raised no event
    /// (it was not armed). An application that arms several CQs one after
    /// the other and then sleeps without polling them again (UCX's verbs
    /// transports) would never hear of one that came to the second while
    /// it armed the first: those raise the event at once
    /// ([`Cq::fire_unseen`], by whoever can signal the channel). A
    /// spurious event costs the application a look at an empty CQ; a lost
    /// one hangs it.
    pub(super) fn arm(&self) -> bool {
        // SeqCst with `deliver`'s flag-then-look (a store then a load on
        // each side): one of the two sees the other's store.
        self.armed().store(ARMED, Ordering::SeqCst);
        self.unseen().load(Ordering::SeqCst) == UNSEEN && !self.ring.is_empty()
    }

    /// The event of an armed CQ whose ring holds unseen completions
    /// ([`Cq::arm`]); returns the channel to signal.
    pub(super) fn fire_unseen(&self) -> Option<&Arc<CompChannel>> {
        let flagged = self
            .unseen()
            .compare_exchange(UNSEEN, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok();
        if !flagged || self.ring.is_empty() {
            return None;
        }
        self.fire()
    }

    /// A completion went in and raised no event (the CQ was not armed
    /// when [`Cq::fire`] looked): flags it for the next arm, unless an
    /// event since the last empty poll covers it ([`COVERED`]). An arm
    /// between that look and this flag found no flag, so its event is
    /// raised here; returns the channel to signal.
    fn flag_unseen(&self) -> Option<&Arc<CompChannel>> {
        if self
            .unseen()
            .compare_exchange(0, UNSEEN, Ordering::SeqCst, Ordering::SeqCst)
            == Err(COVERED)
        {
            return None;
        }
        if self.armed().load(Ordering::SeqCst) == 0 {
            return None;
        }
        self.fire_unseen()
    }

    /// The event of an armed CQ, once (whoever disarms it counts it);
    /// returns the channel to signal.
    fn fire(&self) -> Option<&Arc<CompChannel>> {
        if self.armed().swap(0, Ordering::SeqCst) == 0 {
            return None;
        }
        let ch = self.channel.as_ref()?;
        // What comes until the application next finds the ring empty is
        // this event's to report.
        self.unseen().store(COVERED, Ordering::SeqCst);
        // Counted before the signal, so a reader woken by it finds it.
        self.events().fetch_add(1, Ordering::AcqRel);
        Some(ch)
    }

    /// Armed for the next completion: 0 not armed, [`ARMED`], or
    /// [`ARMED_LOOKED`] (armed, and a poll found the ring empty since).
    pub(super) fn armed(&self) -> &std::sync::atomic::AtomicU32 {
        self.ring.segment().word(0)
    }

    /// Whether an empty poll of this CQ may leave the data plane alone:
    /// the first empty poll since the CQ was armed. That poll is
    /// rdma-core's race check between `ibv_req_notify_cq` and
    /// `ibv_get_cq_event`: the application is about to wait, and the wait
    /// steps the lane when its port has traffic (or the engine does), so
    /// a step here would only look at an empty port once more (one system
    /// call per event). Later empty polls of a CQ still armed step as
    /// usual: an application that arms and then keeps polling is not left
    /// without progress.
    pub(super) fn poll_may_skip_step(&self) -> bool {
        self.channel.is_some()
            && self
                .armed()
                .compare_exchange(ARMED, ARMED_LOOKED, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
    }

    /// Events raised on the channel and not yet taken.
    pub(super) fn events(&self) -> &std::sync::atomic::AtomicU32 {
        self.ring.segment().word(4)
    }
}

/// CQ `id` (`q`) refused a completion: the first refusal of an overrun
/// raises [`AsyncEvent::CqError`].
pub(super) fn overrun(q: &Cq, id: usize, events: &AsyncEvents) {
    if !q.overrun.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            cq = id,
            "CQ full: its completions wait in the engine (IBV_EVENT_CQ_ERR)"
        );
        events.push(AsyncEvent::CqError(CqId(id as u32)));
    }
}

/// Puts a completion in a CQ ring; if the CQ was armed, counts the event
/// and returns the channel to signal (by the caller, once no lock is held).
pub(super) fn deliver(
    q: &Cq,
    wc: WorkCompletion,
) -> Result<Option<Arc<CompChannel>>, WorkCompletion> {
    q.ring.push(wc)?;
    // A CQ without a channel is never armed: no event, no flag, no fence
    // per completion (a polled application's CQs).
    if q.channel.is_none() {
        return Ok(None);
    }
    Ok(q.fire().or_else(|| q.flag_unseen()).map(Arc::clone))
}

impl Context {
    /// `ibv_get_cq_event` on a blocking channel: the next CQ with an event
    /// on `ch`, waiting up to `timeout` ([`Duration::MAX`]: no limit;
    /// `Ok(None)` when it passed). A signal ends the wait with
    /// [`std::io::ErrorKind::Interrupted`] (EINTR, as rdma-core's read of
    /// the channel).
    ///
    /// On a device of one lane with an engine thread, this thread waits on
    /// the lane's port as well as on the channel and steps the lane when
    /// packets come: the completion is made by the thread that wants it,
    /// which wakes once (the engine thread leaves it the port meanwhile,
    /// and takes doorbells and timers). Elsewhere (several lanes, a daemon
    /// client) it waits on the channel alone.
    pub fn wait_cq_event(
        &self,
        ch: &CompChannel,
        timeout: Duration,
    ) -> std::io::Result<Option<CqId>> {
        use std::os::fd::AsFd;
        let deadline = (timeout != Duration::MAX).then(|| std::time::Instant::now() + timeout);
        let left = || {
            deadline.map_or(Duration::MAX, |d| {
                d.saturating_duration_since(std::time::Instant::now())
            })
        };
        let sh = &*self.shared;
        let lane = match (&sh.drivers[..], self.plane.client_id()) {
            // A busy-polling engine makes every completion: wait for the
            // channel alone.
            ([d], None) if !d.busy => d.ready.as_ref().filter(|r| r.waitable()).map(|r| (d, r)),
            _ => None,
        };
        let Some((d, ready)) = lane else {
            loop {
                // (First looked at here; the lane's waiter below looks
                // after its first step, one system call fewer per event.)
                if let Some(cq) = ch.try_get_cq_event() {
                    return Ok(Some(cq));
                }
                let l = left();
                if l.is_zero() {
                    return Ok(None);
                }
                burst_io::wait_fds(&[ch.fd.as_fd()], l)?;
            }
        };
        d.add_waiter();
        // Whatever way this returns, the lane is handed back.
        let _back = Leave(self);
        // What this thread's last steps left for the next round (an ACK)
        // leaves before it sleeps: the peer may wait for it. Nothing to
        // send costs no system call.
        let _ = self.step_with(0, Round::Transmit, Stepper::Waiter, |_| ());
        // Events this thread's steps make for `ch` come back in memory
        // (`CompChannel::notify`), taken after each step below.
        let _waiting = Waiting::on(ch);
        // The thread steps when the wait says the port has traffic, and
        // again while a step finds work (an answer goes out in the next
        // round); it reads the descriptor only when the wait says it is
        // readable (an event another thread made). Nothing else can need
        // this thread: doorbells and timers are the engine's while a
        // thread waits. So a wait for a reply not yet sent costs one
        // system call, the wait itself.
        let (mut step, mut fd_ready) = (false, false);
        loop {
            let busy = step
                && self
                    .step_with(0, Round::Full, Stepper::Waiter, |_| ())
                    .is_some_and(|(b, _)| b);
            if let Some(cq) = ch.take_handed() {
                return Ok(Some(cq));
            }
            if fd_ready {
                if let Some(cq) = ch.try_get_cq_event() {
                    return Ok(Some(cq));
                }
            }
            if busy {
                continue;
            }
            // A message longer than a round's packets (a 64 KiB UC SEND)
            // still has packets to send, and nothing else would send them:
            // no answer comes to wake this thread (UC, UD), and the engine
            // thread leaves the lane to it. (It hung `ibv_uc_pingpong -s
            // 65536 -e`.) Only while rounds send: a QP that waits for its
            // peer's ACKs to send more is woken by them through the port.
            if self.with_device(0, |d| d.wants_transmit()) == Some(true)
                && self
                    .step_with(0, Round::Transmit, Stepper::Waiter, |_| ())
                    .is_some_and(|(b, _)| b)
            {
                continue;
            }
            let l = left();
            if l.is_zero() {
                return Ok(ch.try_get_cq_event());
            }
            let woken = ready.wait_with(true, &[ch.fd.as_fd()], l)?;
            step = woken.port;
            fd_ready = woken.also & 1 != 0;
        }
    }

    /// Creates a completion queue ring of `depth` entries.
    pub fn create_cq(&self, depth: usize) -> CqId {
        self.create_cq_with(depth, None)
    }

    /// `ibv_create_comp_channel`.
    pub fn create_comp_channel(&self) -> std::io::Result<Arc<CompChannel>> {
        self.plane.create_comp_channel(self)
    }

    /// `ibv_destroy_comp_channel` (no CQ may still use it: `Busy`). burstd
    /// lets go of its write end; in embedded mode the channel goes with
    /// its last `Arc`.
    pub fn destroy_comp_channel(&self, ch: &CompChannel) -> Result<(), PostError> {
        self.plane.destroy_comp_channel(self, ch)
    }

    /// A completion channel of a daemon client: the engine signals a pipe
    /// whose write end only it holds (non-blocking); the read end,
    /// returned, goes to the client. Nothing the client does to its end
    /// can make the engine wait.
    pub fn comp_channel_for_client(
        &self,
    ) -> std::io::Result<(Arc<CompChannel>, std::os::fd::OwnedFd)> {
        let (r, w) = crate::eventfd::EventFd::pipe(false)?;
        Ok((Arc::new(CompChannel::with_fd(w)), r.into()))
    }

    /// Creates a CQ that reports events on `channel` once armed.
    pub fn create_cq_with(&self, depth: usize, channel: Option<Arc<CompChannel>>) -> CqId {
        self.try_create_cq(depth, channel).unwrap_or(CqId(u32::MAX))
    }

    /// [`Context::create_cq_with`] with its errors (out of memory, the
    /// daemon gone).
    pub fn try_create_cq(
        &self,
        depth: usize,
        channel: Option<Arc<CompChannel>>,
    ) -> Result<CqId, PostError> {
        if depth == 0 || depth > crate::MAX_CQE as usize {
            return Err(PostError::Invalid);
        }
        let slots = ShmRing::<WorkCompletion>::slots_for(depth);
        let (id, seg) = self.plane.cq_memory(self, depth, slots, channel.as_ref())?;
        let cq = Arc::new(
            Cq::new(seg, slots, id.is_none(), channel.clone(), self.owner)
                .map_err(|_| PostError::Invalid)?,
        );
        let mut cqs = self.shared.cqs.write().unwrap_or_else(|e| e.into_inner());
        let i = match id {
            Some(i) => i.0 as usize,
            None => cqs.iter().position(Option::is_none).unwrap_or(cqs.len()),
        };
        if cqs.len() <= i {
            cqs.resize(i + 1, None);
        }
        cqs[i] = Some(Arc::clone(&cq));
        let id = CqId(i as u32);
        if let Some(ch) = channel {
            ch.cqs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((id, cq));
        }
        Ok(id)
    }

    /// `ibv_destroy_cq`: EBUSY while a QP completes into it.
    pub fn destroy_cq(&self, cq: CqId) -> Result<(), PostError> {
        let q = self.cq_ref(cq)?;
        self.plane.destroy_cq(self, cq)?;
        if let Some(ch) = &q.channel {
            ch.cqs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|(id, _)| *id != cq);
        }
        let mut cqs = self.shared.cqs.write().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = cqs.get_mut(cq.0 as usize) {
            *slot = None;
        }
        Ok(())
    }

    /// The segment of a CQ, with its slots (burstd hands it to the client).
    pub fn cq_segment(&self, cq: CqId) -> Result<(Arc<Segment>, usize), PostError> {
        let q = self.cq_ref(cq)?;
        Ok((Arc::clone(q.ring.segment()), q.ring.capacity()))
    }

    /// CQ `cq`, if this handle may reach it.
    pub(super) fn cq_ref(&self, cq: CqId) -> Result<Arc<Cq>, PostError> {
        let cqs = self.shared.cqs.read().unwrap_or_else(|e| e.into_inner());
        match cqs.get(cq.0 as usize) {
            Some(Some(q)) if q.owner == self.owner => Ok(Arc::clone(q)),
            _ => Err(PostError::NoSuch),
        }
    }

    /// A segment for rings: a memfd in a daemon, anonymous memory otherwise.
    pub(super) fn segment(&self, name: &str, len: usize) -> Result<Segment, PostError> {
        let seg = if self.shared.memfd {
            Segment::memfd(name, len)
        } else {
            Segment::anonymous(len)
        };
        seg.map_err(|e| {
            tracing::warn!("could not map {len} bytes for {name}: {e}");
            PostError::Full
        })
    }

    /// `ibv_req_notify_cq`: the next completion added to `cq` raises one
    /// event on its channel (completions already in the ring do not).
    ///
    /// Arming says the thread is about to wait for an event, maybe in its
    /// own `poll`/`epoll` on the channel's descriptor, where burst cannot
    /// see it: its claim on the lanes ends here and the engine thread
    /// watches the ports (`Context::hand_over`), so a completion
    /// is made when its packet comes, not when the claim would have lapsed
    /// (4 ms). A thread that waits in [`Context::wait_cq_event`] takes the
    /// watch off again, and one that keeps polling claims the lanes back.
    pub fn req_notify_cq(&self, cq: CqId) -> Result<(), PostError> {
        let q = self.cq_ref(cq)?;
        if q.channel.is_none() {
            return Err(PostError::Invalid);
        }
        if q.arm() {
            if self.plane.client_id().is_some() {
                // Only burstd can signal a client's channel.
                self.shared.doorbells[0].ring(CQ_DOORBELL | cq.0);
            } else if let Some(ch) = q.fire_unseen() {
                ch.notify();
            }
        }
        self.hand_over();
        Ok(())
    }
}

/// A waiter of [`Context::wait_cq_event`] leaving lane 0.
struct Leave<'a>(&'a Context);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        let sh = &*self.0.shared;
        if sh.drivers[0].remove_waiter(sh.clock.now()) {
            sh.wake.wake(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(ch: &CompChannel) -> bool {
        ch.fd.wait(Duration::ZERO)
    }

    fn completion(wr_id: u64) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status: burst_transport::WcStatus::Success,
            opcode: burst_transport::WcOpcode::Recv,
            byte_len: 8,
            imm_data: None,
            invalidated_rkey: None,
            qp_num: burst_wire::Qpn::new(0x11).unwrap(),
            src_qp: burst_wire::Qpn::new(0x22).unwrap(),
            grh: None,
        }
    }

    fn cq_with_channel() -> (Cq, Arc<CompChannel>) {
        let ch = Arc::new(CompChannel::with_fd(
            crate::eventfd::EventFd::new().unwrap(),
        ));
        let slots = ShmRing::<WorkCompletion>::slots_for(16);
        let seg = Arc::new(Segment::anonymous(Cq::bytes(slots)).unwrap());
        let q = Cq::new(seg, slots, true, Some(Arc::clone(&ch)), 0).unwrap();
        (q, ch)
    }

    /// UCX's sleep: the application finds the CQ empty, arms it and
    /// sleeps, while an engine on another core completes into it. The
    /// interleaving that hung `ucx_perftest -E sleep` through burstd one
    /// run in three: the engine looks (not armed), the application arms
    /// (no flag yet), the engine flags. One event must still come.
    #[test]
    fn an_arm_between_the_engines_look_and_its_flag_still_raises_the_event() {
        let (q, _ch) = cq_with_channel();
        q.ring.push(completion(1)).unwrap();
        assert!(q.fire().is_none(), "not armed yet");
        assert!(!q.arm(), "the flag is not set yet");
        assert!(q.flag_unseen().is_some(), "the event was lost");
        // Raised once: the arm is spent.
        assert!(q.fire_unseen().is_none() && q.fire().is_none());
    }

    /// The other orders raise one event each, and a completion that
    /// raised its event leaves no flag behind (the next arm over it, the
    /// usual get-event / arm / poll loop, raises no spurious event).
    #[test]
    fn a_completion_before_or_after_the_arm_raises_one_event() {
        let (q, _ch) = cq_with_channel();
        // Before: flagged, and the arm raises it.
        deliver(&q, completion(1)).unwrap();
        assert!(q.arm());
        assert!(q.fire_unseen().is_some());
        assert!(q.fire_unseen().is_none());
        // After: the delivery raises it, and no flag is left.
        assert!(!q.arm());
        assert!(deliver(&q, completion(2)).unwrap().is_some());
        assert!(
            !q.arm(),
            "a completion that raised its event flagged itself"
        );
    }

    /// qperf's event loop: get the event, arm, then poll. The send and
    /// the receive completion of a round trip come in one step: the first
    /// raises the event, the second finds the CQ disarmed. Re-arming over
    /// it raises no second event (RXE raises none: the application polls
    /// after arming); once a poll found the CQ empty, a completion that
    /// comes before the next arm raises one at that arm (UCX's sleep).
    #[test]
    fn an_event_covers_the_completions_that_come_before_the_next_empty_poll() {
        let (q, _ch) = cq_with_channel();
        assert!(!q.arm());
        assert!(deliver(&q, completion(1)).unwrap().is_some());
        assert!(deliver(&q, completion(2)).unwrap().is_none());
        assert!(!q.arm(), "a spurious event for the second completion");
        assert!(q.fire_unseen().is_none());
        assert_eq!(q.pop().map(|w| w.wr_id), Some(1));
        // A poll that still finds completions leaves the event in charge.
        assert!(deliver(&q, completion(3)).unwrap().is_some(), "armed above");
        assert!(deliver(&q, completion(4)).unwrap().is_none());
        assert!(!q.arm());
        for id in [2, 3, 4] {
            assert_eq!(q.pop().map(|w| w.wr_id), Some(id));
        }
        assert!(q.pop().is_none());
        // Found empty: what comes now, not armed, the next arm reports.
        q.armed().store(0, Ordering::SeqCst);
        assert!(deliver(&q, completion(5)).unwrap().is_none());
        assert!(q.arm(), "a completion since the empty poll, no event");
        assert!(q.fire_unseen().is_some());
    }

    #[test]
    fn an_event_for_the_channel_this_thread_waits_on_stays_in_memory() {
        let ch = CompChannel::with_fd(crate::eventfd::EventFd::new().unwrap());
        {
            let _w = Waiting::on(&ch);
            ch.notify();
            assert!(!readable(&ch), "the descriptor was written");
            assert_eq!(ch.events_in_memory(), 1);
            assert_eq!(ch.handed.load(Ordering::Relaxed), 1);
            // Taken by the next look (no CQ is attached: no CQ to name).
            assert_eq!(ch.try_get_cq_event(), None);
            assert_eq!(ch.handed.load(Ordering::Relaxed), 0);
        }
        // Not waiting (or waiting on another channel): the descriptor.
        ch.notify();
        assert!(readable(&ch));
        let other = CompChannel::with_fd(crate::eventfd::EventFd::new().unwrap());
        let _w = Waiting::on(&other);
        ch.notify();
        assert_eq!(ch.events_in_memory(), 1);
        assert!(ch.fd.drain() && ch.fd.drain() && !ch.fd.drain());
        // Another thread's notify while this one waits: the descriptor.
        let ch = Arc::new(ch);
        let c2 = Arc::clone(&ch);
        let _mine = Waiting::on(&ch);
        std::thread::spawn(move || c2.notify()).join().unwrap();
        assert!(readable(&ch));
        assert_eq!(ch.events_in_memory(), 1);
    }
}
