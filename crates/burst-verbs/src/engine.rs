//! The engine: the one device API. It owns the data-plane core (the port
//! and the queue pairs), stepped by its own thread ([`Drive::Thread`]) or
//! only by the application ([`Drive::Caller`]), and hands out the
//! front-end handle applications use from any thread ([`Context`]).
//!
//! Applications never touch the transport. A posted work request is checked
//! once ([`burst_transport::QpConfig::check_send`]); then a thread that
//! finds the core free hands it straight to the transport, and otherwise it
//! goes into the QP's ring with a doorbell (the QP number pushed on a
//! multi-producer, single-consumer queue) for whoever steps the core next.
//! Completions are read from CQ rings. Ring entries are the transport's own
//! `SendWr`/`RecvWr`: no pointers, only integers (addresses in registered
//! memory, lengths, keys, QP numbers) and fixed arrays, so the same rings can
//! later live in memory shared between an application and a daemon process.
//! Memory registration goes straight to the shared [`MrTable`], which is
//! built for concurrent use.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam::channel::{bounded, Receiver, Sender};
use crossbeam::queue::SegQueue;

use crate::shm::{Segment, ShmRing};

use burst_mem::{Access, MrKeys, MrTable, MwKeys, MwType, Pd, RegError};
use burst_transport::{
    InlineData, QpAttr, QpConfig, QpState, QpType, RecvWr, SendWr, VerbsError, WcOpcode, WcStatus,
    WorkCompletion,
};
use burst_wire::{Mtu, Qpn};

use crate::clock::Clock;
use crate::config::{Config, ConfigError, DeviceConfig};
use crate::{
    contain, AsyncEvent, Device, DeviceAttr, DeviceCounters, PortAttr, QpInit, SrqId, FIRST_QPN,
};

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
    fd: crate::eventfd::EventFd,
    cqs: std::sync::Mutex<Vec<(CqId, Arc<Cq>)>>,
    /// burstd's handle of this channel (a daemon client's).
    remote_id: std::sync::atomic::AtomicU32,
}

impl CompChannel {
    fn with_fd(fd: crate::eventfd::EventFd) -> CompChannel {
        CompChannel {
            fd,
            cqs: std::sync::Mutex::default(),
            remote_id: Default::default(),
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
        // One fd count per event, taken with the event: the fd stays
        // readable exactly while events are pending.
        if self.fd.drain() {
            // The engine counts the event before it signals.
            return self.take_event();
        }
        None
    }

    /// The CQ whose event count the taken fd count stands for.
    fn take_event(&self) -> Option<CqId> {
        let cqs = self.cqs.lock().unwrap_or_else(|e| e.into_inner());
        cqs.iter().find_map(|(id, q)| {
            q.events()
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .ok()
                .map(|_| *id)
        })
    }
}

/// The MPSC doorbell queue: posting threads push the QPN (or SRQ) whose ring
/// has new entries, the engine pops them. A [`ShmRing`] (in daemon mode in
/// memory each client shares with burstd, one per client and lane), bounded
/// so that ringing never allocates; a doorbell that finds the queue full
/// sets a flag that makes the engine visit every ring of that client once,
/// so no posted WQE waits forever.
#[derive(Debug)]
pub(crate) struct Doorbells {
    queue: ShmRing<u32>,
    /// Whose rings these doorbells may name (0: the engine's own process).
    owner: u32,
    /// Wakes an engine that went to sleep (daemon mode).
    wake: Option<Arc<Wake>>,
    lane: usize,
    /// Where in the segment these doorbells start.
    off: usize,
}

/// Word 0 of a doorbell segment: the overflow flag; the ring at 64.
const BELL_RING: usize = 64;

impl Doorbells {
    /// Doorbells an engine's own queue holds: far more than posts between
    /// two engine rounds.
    const DEPTH: usize = 1 << 16;
    /// A daemon client's queue, per lane.
    pub(crate) const CLIENT_DEPTH: usize = 4096;

    /// Bytes of one lane's doorbells in a segment.
    pub(crate) fn bytes(depth: usize) -> usize {
        BELL_RING + ShmRing::<u32>::bytes(ShmRing::<u32>::slots_for(depth))
    }

    fn new() -> std::io::Result<Doorbells> {
        let seg = Arc::new(Segment::anonymous(Doorbells::bytes(Doorbells::DEPTH))?);
        Doorbells::create(seg, 0, Doorbells::DEPTH, 0, None, 0)
    }

    /// Doorbells laid out at `off` of `seg` (fresh when the engine side
    /// creates them, as they are when a client attaches).
    pub(crate) fn create(
        seg: Arc<Segment>,
        off: usize,
        depth: usize,
        owner: u32,
        wake: Option<Arc<Wake>>,
        lane: usize,
    ) -> std::io::Result<Doorbells> {
        Ok(Doorbells {
            queue: ShmRing::create(seg, off + BELL_RING, ShmRing::<u32>::slots_for(depth))?,
            owner,
            wake,
            lane,
            off,
        })
    }

    pub(crate) fn attach(
        seg: Arc<Segment>,
        off: usize,
        depth: usize,
        wake: Option<Arc<Wake>>,
        lane: usize,
    ) -> std::io::Result<Doorbells> {
        Ok(Doorbells {
            queue: ShmRing::attach(seg, off + BELL_RING, ShmRing::<u32>::slots_for(depth))?,
            owner: 0,
            wake,
            lane,
            off,
        })
    }

    fn overflow(&self) -> &std::sync::atomic::AtomicU32 {
        self.queue.segment().word(self.off)
    }

    fn ring(&self, bell: u32) {
        if self.queue.push(bell).is_err() {
            self.overflow().store(1, Ordering::Release);
        }
        if let Some(w) = &self.wake {
            w.nudge(self.lane);
        }
    }

    fn pop(&self) -> Option<u32> {
        self.queue.pop()
    }

    fn take_overflow(&self) -> bool {
        self.overflow().swap(0, Ordering::AcqRel) != 0
    }
}

/// How a daemon client wakes a sleeping engine lane: a word per lane that
/// the engine sets before it blocks (in memory every client maps), and a
/// pipe per client and lane whose read end the lane also waits on (one
/// epoll set per lane). A client signals only when the word says the lane
/// sleeps: no system call per post while the engine is busy. Each client
/// has pipes of its own, so one that floods or fills its pipe wakes the
/// lane more often, at worst, and never blocks another client's signal.
#[derive(Debug)]
pub(crate) struct Wake {
    seg: Arc<Segment>,
    side: WakeSide,
}

#[derive(Debug)]
enum WakeSide {
    /// The engine's: per lane, the set it sleeps on and an eventfd of its
    /// own process (QP1's MADs queued by burstd); the clients' read ends by
    /// token (lane, owner, reader).
    Engine {
        sets: Vec<crate::eventfd::WaitSet>,
        local: Vec<crate::eventfd::EventFd>,
        readers: RwLock<HashMap<u64, WakeReader>>,
        next_token: std::sync::atomic::AtomicU64,
    },
    /// A client's: its write end per lane.
    Client {
        writers: Vec<crate::eventfd::EventFd>,
    },
}

#[derive(Debug)]
struct WakeReader {
    lane: usize,
    owner: u32,
    fd: Arc<crate::eventfd::EventFd>,
}

/// The token of a lane's own eventfd in its wait set.
const LOCAL_WAKE: u64 = u64::MAX;

impl Wake {
    /// The engine's: one word (a cache line apart), one wait set and one
    /// eventfd of its own per lane.
    fn new(lanes: usize, memfd: bool) -> std::io::Result<Wake> {
        let len = lanes * 64;
        let seg = if memfd {
            Segment::memfd("burst-wake", len)?
        } else {
            Segment::anonymous(len)?
        };
        let mut sets = Vec::new();
        let mut local = Vec::new();
        for _ in 0..lanes {
            let set = crate::eventfd::WaitSet::new()?;
            let fd = crate::eventfd::EventFd::new()?;
            set.add(std::os::fd::AsFd::as_fd(&fd), LOCAL_WAKE)?;
            sets.push(set);
            local.push(fd);
        }
        Ok(Wake {
            seg: Arc::new(seg),
            side: WakeSide::Engine {
                sets,
                local,
                readers: RwLock::default(),
                next_token: Default::default(),
            },
        })
    }

    /// A client's view of the daemon's words, with its write ends.
    pub(crate) fn attach(
        seg: Arc<Segment>,
        writers: Vec<crate::eventfd::EventFd>,
    ) -> std::io::Result<Wake> {
        if seg.len() < writers.len() * 64 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "wake segment too short",
            ));
        }
        Ok(Wake {
            seg,
            side: WakeSide::Client { writers },
        })
    }

    /// The segment clients map.
    pub(crate) fn segment(&self) -> &Segment {
        &self.seg
    }

    /// New pipes for client `owner`, one per lane: their read ends join the
    /// lanes' wait sets, their write ends are returned (to send).
    fn add_client(&self, owner: u32) -> std::io::Result<Vec<std::os::fd::OwnedFd>> {
        let WakeSide::Engine {
            sets,
            readers,
            next_token,
            ..
        } = &self.side
        else {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        };
        let mut writers = Vec::new();
        let mut added = Vec::new();
        let r = (|| {
            for (lane, set) in sets.iter().enumerate() {
                let (r, w) = crate::eventfd::EventFd::pipe(true)?;
                let token = next_token.fetch_add(1, Ordering::Relaxed);
                set.add(std::os::fd::AsFd::as_fd(&r), token)?;
                added.push(token);
                readers.write().unwrap_or_else(|e| e.into_inner()).insert(
                    token,
                    WakeReader {
                        lane,
                        owner,
                        fd: Arc::new(r),
                    },
                );
                writers.push(w.into());
            }
            Ok(())
        })();
        match r {
            Ok(()) => Ok(writers),
            Err(e) => {
                self.remove_client(owner);
                Err(e)
            }
        }
    }

    /// Client `owner` is gone: its read ends leave the wait sets.
    fn remove_client(&self, owner: u32) {
        let WakeSide::Engine { sets, readers, .. } = &self.side else {
            return;
        };
        let gone: Vec<WakeReader> = {
            let mut m = readers.write().unwrap_or_else(|e| e.into_inner());
            let tokens: Vec<u64> = m
                .iter()
                .filter(|(_, r)| r.owner == owner)
                .map(|(t, _)| *t)
                .collect();
            tokens.iter().filter_map(|t| m.remove(t)).collect()
        };
        for r in gone {
            if let Some(set) = sets.get(r.lane) {
                set.remove(std::os::fd::AsFd::as_fd(&*r.fd));
            }
        }
    }

    /// What lane `lane` sleeps on (with its port).
    fn wait_fd(&self, lane: usize) -> Option<std::os::fd::BorrowedFd<'_>> {
        match &self.side {
            WakeSide::Engine { sets, .. } => sets.get(lane).map(std::os::fd::AsFd::as_fd),
            WakeSide::Client { .. } => None,
        }
    }

    /// After a sleep: takes every pending wake-up of the lane (level
    /// signals; bounded per reader, so a client that keeps writing only
    /// makes the lane look again).
    fn drain(&self, lane: usize, tokens: &mut Vec<u64>) {
        let WakeSide::Engine {
            sets,
            local,
            readers,
            ..
        } = &self.side
        else {
            return;
        };
        tokens.clear();
        sets[lane].ready(tokens);
        for t in tokens.iter() {
            if *t == LOCAL_WAKE {
                local[lane].drain_all();
                continue;
            }
            let fd = readers
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .get(t)
                .map(|r| Arc::clone(&r.fd));
            if let Some(fd) = fd {
                fd.drain_all();
            }
        }
    }

    fn sleeping(&self, lane: usize) -> &std::sync::atomic::AtomicU32 {
        self.seg.word(lane * 64)
    }

    /// After a doorbell: wakes the lane if it sleeps.
    fn nudge(&self, lane: usize) {
        // Pairs with the engine's fence between setting the word and its
        // last look at the doorbells: one of the two sees the other.
        std::sync::atomic::fence(Ordering::SeqCst);
        let fd = match &self.side {
            WakeSide::Engine { local, .. } => local.get(lane),
            WakeSide::Client { writers } => writers.get(lane),
        };
        if let Some(fd) = fd {
            if self.sleeping(lane).load(Ordering::Relaxed) != 0 {
                fd.signal();
            }
        }
    }
}

/// The asynchronous events of an engine and the descriptor that is readable
/// while some are pending (one count per event, as a completion channel's).
/// A daemon client's events come through `remote`, which the daemon fills
/// before it signals the client's descriptor.
#[derive(Debug)]
struct AsyncEvents {
    fd: crate::eventfd::EventFd,
    queue: SegQueue<AsyncEvent>,
    remote: Option<ShmRing<AsyncEvent>>,
    /// Port 1 is down: set by the last [`AsyncEvent::Port`] raised (a
    /// daemon client's, by the last one it read).
    port_down: AtomicBool,
}

impl AsyncEvents {
    fn new() -> std::io::Result<AsyncEvents> {
        Ok(AsyncEvents {
            fd: crate::eventfd::EventFd::new()?,
            queue: SegQueue::new(),
            remote: None,
            port_down: AtomicBool::new(false),
        })
    }

    fn push(&self, ev: AsyncEvent) {
        self.note_port(ev);
        // Queued before the signal, so a reader woken by it finds it.
        self.queue.push(ev);
        self.fd.signal();
    }

    fn try_take(&self) -> Option<AsyncEvent> {
        if self.fd.drain() {
            return self.take();
        }
        None
    }

    fn read(&self) -> Option<AsyncEvent> {
        if self.fd.read() {
            return self.take();
        }
        None
    }

    fn take(&self) -> Option<AsyncEvent> {
        let ev = self
            .queue
            .pop()
            .or_else(|| self.remote.as_ref().and_then(|r| r.pop()));
        if let Some(e) = ev {
            self.note_port(e);
        }
        ev
    }

    fn note_port(&self, ev: AsyncEvent) {
        if let AsyncEvent::Port { active } = ev {
            self.port_down.store(!active, Ordering::Relaxed);
        }
    }
}

/// A completion queue: a ring, and its notification state, in one
/// segment: word 0 "armed", word 1 the events counted for its channel, the
/// ring at byte 64.
#[derive(Debug)]
pub struct Cq {
    ring: ShmRing<WorkCompletion>,
    channel: Option<Arc<CompChannel>>,
    owner: u32,
    /// A completion found the ring full and [`AsyncEvent::CqError`] was
    /// raised: once per CQ (an overrun is an error of the application, as
    /// on an RNIC; the paused QPs refilling a CQ polled two at a time would
    /// otherwise raise one per refill).
    overrun: AtomicBool,
}

const CQ_RING: usize = 64;

impl Cq {
    /// Bytes of a CQ of `slots` slots.
    pub(crate) fn bytes(slots: usize) -> usize {
        CQ_RING + ShmRing::<WorkCompletion>::bytes(slots)
    }

    fn new(
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
        })
    }

    /// Armed for the next completion.
    fn armed(&self) -> &std::sync::atomic::AtomicU32 {
        self.ring.segment().word(0)
    }

    /// Events raised on the channel and not yet taken.
    fn events(&self) -> &std::sync::atomic::AtomicU32 {
        self.ring.segment().word(4)
    }
}

/// Where a QP's two rings sit in its segment: (send, receive, total bytes).
pub(crate) fn qp_layout(send_slots: usize, recv_slots: usize) -> (usize, usize, usize) {
    let recv = ShmRing::<SendWr>::bytes(send_slots).div_ceil(64) * 64;
    let words = (recv + ShmRing::<RecvWr>::bytes(recv_slots)).div_ceil(64) * 64;
    (0, recv, words + QpWords::BYTES)
}

/// Words a QP's front end and engine share after its rings: the state the
/// application last gave the QP (which posts it allows) and, per queue,
/// the WRs posted and those the engine retired, so that a post finds a
/// full queue as `ibv_post_*` does (ENOMEM), by outstanding work rather
/// than by room in the ring. A client that scribbles on them only misleads
/// its own posts: the transport checks state and depth again.
struct QpWords {
    seg: Arc<Segment>,
    at: usize,
}

impl QpWords {
    const BYTES: usize = 64;
    const STATE: usize = 0;
    const SEND_POSTED: usize = 8;
    const SEND_RETIRED: usize = 16;
    const RECV_POSTED: usize = 24;
    const RECV_RETIRED: usize = 32;

    fn word(&self, w: usize) -> &AtomicU64 {
        self.seg.word64(self.at + w)
    }

    fn state(&self) -> QpState {
        let v = self.word(Self::STATE).load(Ordering::Acquire);
        u32::try_from(v)
            .ok()
            .and_then(QpState::from_ibv)
            .unwrap_or(QpState::Reset)
    }

    fn set_state(&self, s: QpState) {
        self.word(Self::STATE)
            .store(u64::from(s.ibv()), Ordering::Release);
    }

    /// Takes a place in a queue of depth `depth` (`recv`: the receive
    /// queue); `false` when outstanding work fills it.
    fn reserve(&self, recv: bool, depth: u32) -> bool {
        let (p, r) = if recv {
            (Self::RECV_POSTED, Self::RECV_RETIRED)
        } else {
            (Self::SEND_POSTED, Self::SEND_RETIRED)
        };
        let posted = self.word(p).fetch_add(1, Ordering::AcqRel);
        let retired = self.word(r).load(Ordering::Acquire);
        if posted.wrapping_sub(retired) >= u64::from(depth) {
            self.word(p).fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        true
    }

    /// Gives back a place [`QpWords::reserve`] took for a post that failed.
    fn unreserve(&self, recv: bool) {
        let p = if recv {
            Self::RECV_POSTED
        } else {
            Self::SEND_POSTED
        };
        self.word(p).fetch_sub(1, Ordering::AcqRel);
    }

    /// The engine: WRs retired so far (send, receive).
    fn set_retired(&self, send: u64, recv: u64) {
        for (w, v) in [(Self::SEND_RETIRED, send), (Self::RECV_RETIRED, recv)] {
            if self.word(w).load(Ordering::Relaxed) != v {
                self.word(w).store(v, Ordering::Release);
            }
        }
    }
}

/// A QP's rings. Their entries are the transport's own work requests
/// (pointer-free), checked against `cfg` when posted (and again by the
/// engine when another process posted them).
struct QpRings {
    qpn: Qpn,
    /// The engine thread (lane) that owns the QP.
    lane: usize,
    cfg: QpConfig,
    send: ShmRing<SendWr>,
    recv: ShmRing<RecvWr>,
    send_cq: CqId,
    recv_cq: CqId,
    /// The daemon client that created it (0: the engine's own process).
    owner: u32,
    words: QpWords,
    /// WRs the engine took from the rings and refused (completed in
    /// error): retired without reaching the transport (send, receive).
    refused: (AtomicU64, AtomicU64),
}

impl QpRings {
    #[allow(clippy::too_many_arguments)]
    fn new(
        seg: Arc<Segment>,
        slots: (usize, usize),
        fresh: bool,
        qpn: Qpn,
        lane: usize,
        cfg: QpConfig,
        cqs: (CqId, CqId),
        owner: u32,
    ) -> std::io::Result<QpRings> {
        let (s_off, r_off, total) = qp_layout(slots.0, slots.1);
        let words = QpWords {
            seg: Arc::clone(&seg),
            at: total - QpWords::BYTES,
        };
        let (send, recv) = if fresh {
            (
                ShmRing::create(Arc::clone(&seg), s_off, slots.0)?,
                ShmRing::create(seg, r_off, slots.1)?,
            )
        } else {
            (
                ShmRing::attach(Arc::clone(&seg), s_off, slots.0)?,
                ShmRing::attach(seg, r_off, slots.1)?,
            )
        };
        Ok(QpRings {
            qpn,
            lane,
            cfg,
            send,
            recv,
            send_cq: cqs.0,
            recv_cq: cqs.1,
            owner,
            words,
            refused: (AtomicU64::new(0), AtomicU64::new(0)),
        })
    }
}

/// An SRQ's ring.
struct SrqRing {
    ring: ShmRing<RecvWr>,
    max_sge: u32,
    owner: u32,
}

/// Doorbells carry a QPN (24 bits) or, with this bit, an SRQ index.
const SRQ_DOORBELL: u32 = 1 << 31;

/// Control operations, answered on a reply channel (the slow path).
pub(crate) enum Control {
    CreateQp {
        init: QpInit,
        reply: Sender<Result<(Qpn, QpConfig), VerbsError>>,
    },
    DestroyQp {
        qpn: Qpn,
        reply: Sender<Result<(), VerbsError>>,
    },
    CreateSrq {
        pd: Pd,
        max_wr: u32,
        max_sge: u32,
        reply: Sender<Result<SrqId, VerbsError>>,
    },
    DestroySrq {
        srq: SrqId,
        reply: Sender<Result<(), VerbsError>>,
    },
    ModifySrq {
        srq: SrqId,
        max_wr: Option<u32>,
        limit: Option<u32>,
        reply: Sender<Result<(), VerbsError>>,
    },
    QueryQp {
        qpn: Qpn,
        reply: Sender<Option<(burst_transport::QpState, burst_transport::QpConfig)>>,
    },
    CreateAh {
        index: u32,
        owner: u32,
        gid: [u8; 16],
        sgid_index: Option<u8>,
        reply: Sender<Result<u32, VerbsError>>,
    },
    DestroyAh {
        index: u32,
        reply: Sender<()>,
    },
    /// The GID table (`ibv_query_gid`).
    Gids {
        reply: Sender<Vec<Option<std::net::IpAddr>>>,
    },
    /// `ibv_attach_mcast` (`attach`) or `ibv_detach_mcast`.
    Multicast {
        qpn: Qpn,
        mgid: [u8; 16],
        attach: bool,
        reply: Sender<Result<(), VerbsError>>,
    },
    ModifyQp {
        qpn: Qpn,
        attr: QpAttr,
        reply: Sender<Result<(), VerbsError>>,
    },
    /// Several transitions in one call; stops at the first refused
    /// (its index and error).
    ModifyQpSteps {
        qpn: Qpn,
        attrs: Vec<QpAttr>,
        reply: Sender<Result<(), (usize, VerbsError)>>,
    },
    Counters {
        reply: Sender<DeviceCounters>,
    },
    QpCounters {
        qpn: Qpn,
        reply: Sender<Option<burst_transport::Counters>>,
    },
    Congestion {
        reply: Sender<crate::CongestionReport>,
    },
    DebugPanicFor {
        qpn: Option<Qpn>,
        reply: Sender<()>,
    },
}

/// A region's owner, and the daemon's mapping of its pages (zero-copy).
type MrOwner = (u32, Option<Arc<Segment>>);

struct Shared {
    mrs: Arc<MrTable>,
    /// One MPSC doorbell queue per lane: posts reach the owning thread.
    /// (A daemon client's are its own, in memory it shares with burstd.)
    doorbells: Vec<Doorbells>,
    /// Every daemon client's doorbells (each for one lane).
    client_bells: std::sync::RwLock<Vec<Arc<Doorbells>>>,
    /// How clients wake a sleeping lane (a daemon client: the daemon's).
    wake: Arc<Wake>,
    /// Rings go into memfds (a daemon: clients map them).
    memfd: bool,
    /// The owner of each protection domain (daemon clients; 0: this process).
    pd_owner: std::sync::Mutex<std::collections::HashMap<u32, u32>>,
    /// Each memory region's owner and the daemon's mapping of its pages.
    mr_owner: std::sync::Mutex<std::collections::HashMap<u32, MrOwner>>,
    /// Each memory window's owner, by handle.
    mw_owner: std::sync::Mutex<std::collections::HashMap<u32, u32>>,
    /// Address handles: who holds which (see [`AhTable`]).
    ahs: std::sync::Mutex<AhTable>,
    /// Indexed by QPN - FIRST_QPN.
    rings: std::sync::RwLock<Vec<Option<Arc<QpRings>>>>,
    srqs: std::sync::RwLock<Vec<Option<Arc<SrqRing>>>>,
    cqs: std::sync::RwLock<Vec<Option<Arc<Cq>>>>,
    /// Asynchronous events not yet taken by the application.
    events: AsyncEvents,
    stop: AtomicBool,
    /// The data plane's state. The engine thread steps it, and so does an
    /// application thread that finds it free while it waits for work
    /// (polls an empty CQ, posts, waits for a control reply): on a machine
    /// with fewer cores than spinning threads the work then happens on the
    /// thread that wants it, not after a scheduler time slice.
    /// One core per lane (engine thread), each with its own device (port
    /// queue, QPs); QPs never move between lanes.
    cores: Vec<std::sync::Mutex<Core>>,
    /// When an application thread last stepped the core, polling or
    /// posting (device-clock ns; 0: never).
    app_stepped: std::sync::atomic::AtomicU64,
    /// When an application thread last posted (a transmit-only step).
    app_posted: std::sync::atomic::AtomicU64,
    /// An application thread is inside a step right now (a long send can
    /// take 10 us or more: the last stamp then looks old).
    app_stepping: AtomicBool,
    /// The device clock (the device holds a clone).
    clock: Clock,
    /// QP1's queues (the connection manager's MADs); a daemon client has
    /// none (QP1 is burstd's).
    gsi: Option<Arc<crate::gsi::Gsi>>,
}

impl Shared {
    /// Whether any doorbell of `lane` (the engine's own, or a client's)
    /// waits.
    fn bells_pending(&self, lane: usize) -> bool {
        if !self.doorbells[lane].queue.is_empty() {
            return true;
        }
        // QP1's MADs leave through lane 0 (gsi_send nudges it).
        if lane == 0 && self.gsi.as_ref().is_some_and(|g| g.has_transmit()) {
            return true;
        }
        let clients = self.client_bells.read().unwrap_or_else(|e| e.into_inner());
        clients.iter().any(|b| {
            b.lane == lane && (!b.queue.is_empty() || b.overflow().load(Ordering::Relaxed) != 0)
        })
    }
}

/// An application thread whose last step ended this recently is driving the
/// core (a polling or posting loop steps about every microsecond): the
/// engine thread leaves the data plane to it.
const APP_POLLING_NS: u64 = 3_000;

/// An application thread that posted this recently is alive but may be
/// spinning elsewhere (perftest's write_lat spins on memory), perhaps on the
/// engine thread's core: the engine thread then waits for packets in the
/// kernel instead of spinning, so that both get the core when they need it.
const APP_POSTED_NS: u64 = 2_000_000;

/// The data plane: the device and the completions waiting for CQ room.
struct Core {
    dev: Option<Device>,
    /// Completions a full CQ refused, per CQ, in order (see [`Held`]).
    held: Held,
    control_rx: Receiver<Control>,
    /// Daemon clients' doorbells taken this round: (owner, bell). Kept
    /// between rounds so that taking them allocates nothing.
    bells: Vec<(u32, u32)>,
    /// Entries of clients' rings refused (see [`bad_input`]).
    bad_input: u64,
}

/// Counts an entry of a client's rings the engine refused and logs the
/// 1st, 2nd, 4th, 8th...: a client ringing others' doorbells without end
/// costs a log line per doubling, not one per doorbell.
fn bad_input(count: &mut u64, owner: u32, what: &str) {
    *count += 1;
    if count.is_power_of_two() {
        tracing::warn!(client = owner, refused = *count, "{what}");
    }
}

/// The application's side of an engine: cheap to clone, usable from any thread.
#[derive(Clone)]
pub struct Context {
    shared: Arc<Shared>,
    /// The daemon client whose objects this handle reaches (0: the
    /// engine's own process). burstd gives each client its own.
    owner: u32,
    /// Set when this process is a daemon client: control calls go to burstd.
    remote: Option<Arc<crate::client::Remote>>,
    /// Each lane's control channel.
    control: Vec<Sender<Control>>,
    /// The lane the next QP goes to (round robin).
    next_lane: Arc<std::sync::atomic::AtomicUsize>,
    gid: [u8; 16],
    config: Arc<DeviceConfig>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Context(gid {:?})", std::net::Ipv6Addr::from(self.gid))
    }
}

/// Who steps an engine's data plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drive {
    /// An engine thread, and any application thread that polls or posts
    /// while the core is free (the default).
    Thread,
    /// Only the application's threads, when they post, poll or call
    /// [`Context::progress`]: no thread is started (simulations, and
    /// applications that run their own event loop).
    Caller,
}

/// How [`Engine::with_port`] builds an engine.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// The device's name (`ibv_get_device_name`).
    pub name: String,
    /// Active MTU of the port.
    pub port_mtu: Mtu,
    /// The memory-region table (a seeded one replays a simulation exactly).
    pub mrs: Arc<MrTable>,
    /// Who steps the data plane.
    pub drive: Drive,
    /// The device clock.
    pub clock: Clock,
    /// The network interface holding the device's address, when known:
    /// the GID table lists its addresses ([`Context::gid_table`]).
    pub interface: Option<String>,
    /// The loss the port injects (reported only; [`burst_io::LossyPort`] does it).
    pub drop_every: u64,
    /// Congestion control ([`burst_cc::Algorithm`]; a loss window per peer
    /// by default).
    pub congestion_control: burst_cc::Algorithm,
    /// Which kind of port it is (reported only).
    pub port: crate::config::PortKind,
    /// Rings in memfds that other processes can map (burstd), instead of
    /// anonymous memory.
    pub shared_rings: bool,
    /// What moves payload (each engine thread gets its own copier).
    pub copy: crate::config::CopyConfig,
    /// DPDK EAL arguments and keys (the `dmadev` copy backend's `dma=`).
    pub dpdk: String,
}

impl EngineOptions {
    /// Device `burst0` with a fresh memory-region table, an engine thread
    /// and the wall clock.
    pub fn new(port_mtu: Mtu) -> EngineOptions {
        EngineOptions {
            name: "burst0".into(),
            port_mtu,
            mrs: Arc::default(),
            drive: Drive::Thread,
            clock: Clock::wall(),
            interface: None,
            drop_every: 0,
            congestion_control: burst_cc::Algorithm::default(),
            port: crate::config::PortKind::Udp,
            shared_rings: false,
            copy: Default::default(),
            dpdk: String::new(),
        }
    }
}

/// A running engine (and its thread, if it has one); stops when dropped.
#[derive(Debug)]
pub struct Engine {
    ctx: Context,
    threads: Vec<JoinHandle<()>>,
}

/// Why [`Engine::open`] failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Nothing (or something wrong) is configured.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// No configured device has this name.
    #[error("burst: no device named {0:?} is configured")]
    NoSuchDevice(String),
    /// The port could not be opened (address in use, permission denied…).
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// `e` (from opening `cfg`'s port) with what to change in its message; the
/// kind stays, so callers still map it to an errno (`EADDRINUSE`, ...).
fn with_remedy(e: std::io::Error, cfg: &DeviceConfig) -> std::io::Error {
    use std::io::ErrorKind;
    let remedy = match e.kind() {
        ErrorKind::AddrInUse => format!(
            "UDP port {} on {} is taken (another burst process, kernel RXE on this address, \
             or another RoCEv2 stack): give device {} another address of this host \
             (BURST_ADDR, or its addr in BURST_CONFIG), or stop what holds the port",
            burst_wire::ROCEV2_PORT,
            cfg.addr,
            cfg.name
        ),
        ErrorKind::AddrNotAvailable => format!(
            "{} is not an address of this host: set BURST_ADDR (or BURST_IFACE) to one",
            cfg.addr
        ),
        _ => return e,
    };
    std::io::Error::new(e.kind(), format!("{e}; {remedy}"))
}

/// The device an application opens: burstd's when `BURST_DAEMON` (or
/// `daemon` in the configuration file) names its socket (daemon mode; `cfg`
/// is then the daemon's business), else an
/// engine of its own on `cfg` (embedded mode). Keep the engine while the
/// context is used.
pub fn open_device(cfg: &DeviceConfig) -> std::io::Result<(Option<Engine>, Context)> {
    // The variable, else `daemon = ...` in the configuration file.
    let daemon = std::env::var_os("BURST_DAEMON")
        .filter(|s| !s.is_empty())
        .map(std::path::PathBuf::from)
        .or_else(|| Config::from_env().ok().and_then(|c| c.daemon));
    match daemon {
        Some(sock) => Ok((None, Context::connect(&sock)?)),
        None => {
            let e = Engine::start_config(cfg)?;
            let c = e.context();
            Ok((Some(e), c))
        }
    }
}

/// The packet port `cfg` names ([`DeviceConfig::port`]): a UDP socket, an
/// AF_XDP socket or a DPDK port, with its test loss. Errors say what to
/// change (an address in use, a feature not built, an interface without XDP).
pub fn open_port(cfg: &DeviceConfig) -> std::io::Result<crate::AnyPort> {
    Ok(match cfg.port {
        crate::config::PortKind::Udp => {
            let udp = burst_io::UdpPort::bind(cfg.addr).map_err(|e| with_remedy(e, cfg))?;
            lossy(udp, cfg.drop_every)
        }
        crate::config::PortKind::AfXdp { generic } => {
            lossy(open_af_xdp(cfg, generic)?, cfg.drop_every)
        }
        crate::config::PortKind::Dpdk => open_dpdk_lanes(cfg, 1)?.remove(0),
    })
}

/// One port per engine thread of `cfg` ([`DeviceConfig::threads`]): for
/// the UDP port, sockets in a reuseport group steered by destination QPN.
pub fn open_ports(cfg: &DeviceConfig) -> std::io::Result<Vec<crate::AnyPort>> {
    let lanes = cfg.threads.max(1) as usize;
    if lanes == 1 {
        return Ok(vec![open_port(cfg)?]);
    }
    match cfg.port {
        crate::config::PortKind::Udp => {
            Ok(burst_io::UdpPort::bind_lanes(cfg.addr, lanes, FIRST_QPN)
                .map_err(|e| with_remedy(e, cfg))?
                .into_iter()
                .map(|p| lossy(p, cfg.drop_every))
                .collect())
        }
        crate::config::PortKind::Dpdk => open_dpdk_lanes(cfg, lanes),
        other => Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            format!(
                "device {}: {lanes} engine threads need the UDP or DPDK port for now; the {} \
                 port runs one (set threads = 1, or BURST_PORT=udp)",
                cfg.name,
                other.name()
            ),
        )),
    }
}

/// The DPDK port of `cfg` (`BURST_DPDK`), one queue pair per engine thread.
#[cfg(feature = "dpdk")]
fn open_dpdk_lanes(cfg: &DeviceConfig, lanes: usize) -> std::io::Result<Vec<crate::AnyPort>> {
    let d = burst_io::dpdk::DpdkConfig::parse(&cfg.dpdk);
    let ports =
        burst_io::dpdk::open_lane_ports(&d, cfg.addr, lanes as u16, FIRST_QPN).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!(
                    "device {}: {e}; the UDP port works without DPDK (BURST_PORT=udp)",
                    cfg.name
                ),
            )
        })?;
    if let Some(p) = ports.first() {
        tracing::info!(
            "device {}: DPDK {} (port {}), {lanes} queue pair(s), EAL {:?}",
            cfg.name,
            burst_io::raw::FrameLink::name(p.link()),
            p.link().port_id(),
            d.eal_args()
        );
    }
    Ok(ports
        .into_iter()
        .map(|p| lossy(p, cfg.drop_every))
        .collect())
}

#[cfg(not(feature = "dpdk"))]
fn open_dpdk_lanes(cfg: &DeviceConfig, _lanes: usize) -> std::io::Result<Vec<crate::AnyPort>> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        format!(
            "device {}: BURST_PORT=dpdk, but this burst was built without the dpdk feature \
             (cargo build --features dpdk); the UDP port works without it (BURST_PORT=udp)",
            cfg.name
        ),
    ))
}

/// `port`, dropping one sent packet in `drop_every` if that is not 0.
fn lossy(port: impl burst_io::Port + Send + 'static, drop_every: u64) -> crate::AnyPort {
    match drop_every {
        0 => Box::new(port),
        n => Box::new(burst_io::LossyPort::new(port, n)),
    }
}

/// The AF_XDP port of `cfg`'s interface.
#[cfg(feature = "af-xdp")]
fn open_af_xdp(
    cfg: &DeviceConfig,
    generic: bool,
) -> std::io::Result<burst_io::raw::RawPort<burst_io::xsk::XskLink>> {
    let iface = cfg.interface.as_deref().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "device {}: AF_XDP needs an interface (BURST_IFACE)",
                cfg.name
            ),
        )
    })?;
    let mut x = burst_io::xsk::XskConfig::new(iface);
    if generic {
        x.mode = burst_io::xdp::XdpMode::Generic;
    }
    let port = burst_io::xsk::open_port(&x, cfg.addr).map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!(
                "device {} on {iface}: {e}; the UDP port works without it (BURST_PORT=udp)",
                cfg.name
            ),
        )
    })?;
    let l = port.link();
    tracing::info!(
        "device {}: AF_XDP on {iface} queue 0, XDP {:?}, {}, {}",
        cfg.name,
        l.xdp_mode(),
        if l.zero_copy() {
            "zero-copy"
        } else {
            "copy mode"
        },
        if l.multi_buffer() {
            "multi-buffer"
        } else {
            "single-buffer frames"
        }
    );
    Ok(port)
}

#[cfg(not(feature = "af-xdp"))]
fn open_af_xdp(cfg: &DeviceConfig, _generic: bool) -> std::io::Result<burst_io::UdpPort> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        format!(
            "device {}: BURST_PORT=af-xdp, but this burst was built without the af-xdp \
             feature (cargo build --features af-xdp); the UDP port works without it \
             (BURST_PORT=udp)",
            cfg.name
        ),
    ))
}

/// The configured devices (`ibv_get_device_list`): see [`crate::config`].
pub fn device_list() -> Result<Vec<DeviceConfig>, ConfigError> {
    Ok(Config::from_env()?.devices)
}

impl Engine {
    /// Opens a device on `ip` (named `burst0`) and starts its engine thread.
    pub fn start(ip: IpAddr, port_mtu: Mtu) -> std::io::Result<Engine> {
        Engine::start_config(&DeviceConfig {
            name: "burst0".into(),
            addr: ip,
            interface: None,
            mtu: port_mtu,
            drop_every: 0,
            congestion_control: burst_cc::Algorithm::default(),
            port: Default::default(),
            dpdk: String::new(),
            threads: 1,
            copy: Default::default(),
        })
    }

    /// Opens the configured device `name` ([`device_list`]) and starts its engine.
    pub fn open(name: &str) -> Result<Engine, OpenError> {
        let cfg = Config::from_env()?;
        let dev = cfg
            .device(name)
            .ok_or_else(|| OpenError::NoSuchDevice(name.into()))?;
        Ok(Engine::start_config(dev)?)
    }

    /// Opens a device as `cfg` describes and starts its engine thread.
    pub fn start_config(cfg: &DeviceConfig) -> std::io::Result<Engine> {
        let ports = open_ports(cfg)?;
        let mut o = EngineOptions::new(cfg.mtu);
        o.name.clone_from(&cfg.name);
        o.interface.clone_from(&cfg.interface);
        o.drop_every = cfg.drop_every;
        o.congestion_control = cfg.congestion_control;
        o.port = cfg.port;
        o.copy = cfg.copy;
        o.dpdk.clone_from(&cfg.dpdk);
        Engine::with_ports(ports, o)
    }

    /// An engine over any packet port (`burst_io::SimPort`, a wrapper
    /// such as `LossyPort`, a kernel-bypass port), driven and clocked as
    /// `o` says. Its address is the port's.
    ///
    /// ```
    /// use burst_io::{SimFaults, SimNet};
    /// use burst_verbs::engine::{Drive, Engine, EngineOptions};
    /// use burst_verbs::{clock::Clock, Mtu};
    /// let net = SimNet::new(1, SimFaults::default());
    /// let mut o = EngineOptions::new(Mtu::Mtu4096);
    /// o.drive = Drive::Caller;
    /// o.clock = Clock::manual();
    /// let e = Engine::with_port(net.port("198.18.0.1:4791".parse().unwrap()), o).unwrap();
    /// assert_eq!(e.context().gid()[12..], [198, 18, 0, 1]);
    /// ```
    pub fn with_port(
        port: impl burst_io::Port + Send + 'static,
        o: EngineOptions,
    ) -> std::io::Result<Engine> {
        Engine::with_ports(vec![Box::new(port) as crate::AnyPort], o)
    }

    /// An engine with one thread (lane) per port: each lane owns its port
    /// queue and the QPs placed on it (QPNs interleave, lane `k` of `n`
    /// numbering its QPs `0x11 + i * n + k`, so steering by destination QPN
    /// is arithmetic). The ports must deliver each lane's packets to it
    /// ([`burst_io::UdpPort::bind_lanes`] does, with a reuseport program).
    /// CQs, memory regions and events are shared; a QP with an SRQ goes to
    /// lane 0, where SRQs live.
    pub fn with_ports(ports: Vec<crate::AnyPort>, o: EngineOptions) -> std::io::Result<Engine> {
        let lanes = ports.len();
        if lanes == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "an engine needs at least one port",
            ));
        }
        let addr = ports[0].local_addr().ip();
        let mut readies = Vec::new();
        let mut cores = Vec::new();
        let mut controls = Vec::new();
        let mut gid = [0u8; 16];
        let gsi = Arc::new(crate::gsi::Gsi::new()?);
        for (k, port) in ports.into_iter().enumerate() {
            if o.drive == Drive::Thread {
                readies.push(port.readiness()?);
            }
            let mut dev = Device::with_port(port, o.port_mtu, Arc::clone(&o.mrs));
            dev.set_clock(o.clock.clone());
            dev.set_congestion_control(o.congestion_control);
            dev.set_copier(crate::copy::open(&o.copy, &o.dpdk)?);
            dev.set_lane(k as u32, lanes as u32);
            dev.set_gsi(Arc::clone(&gsi));
            // One GID table per device: with several lanes (each a port of
            // its own) it stays the device's address alone.
            if let (Some(iface), 1) = (&o.interface, lanes) {
                dev.set_interface(iface);
            }
            // Port events once per device: from its first lane.
            if let (Some(iface), 0) = (&o.interface, k) {
                dev.watch_link(iface);
            }
            gid = dev.gid();
            let (control, control_rx) = bounded(64);
            controls.push(control);
            cores.push(std::sync::Mutex::new(Core {
                dev: Some(dev),
                held: Held::default(),
                control_rx,
                bells: Vec::new(),
                bad_input: 0,
            }));
        }
        let shared = Arc::new(Shared {
            mrs: o.mrs,
            doorbells: (0..lanes)
                .map(|_| Doorbells::new())
                .collect::<std::io::Result<_>>()?,
            client_bells: Default::default(),
            wake: Arc::new(Wake::new(lanes, o.shared_rings)?),
            memfd: o.shared_rings,
            pd_owner: Default::default(),
            mr_owner: Default::default(),
            mw_owner: Default::default(),
            ahs: Default::default(),
            rings: std::sync::RwLock::new(Vec::new()),
            srqs: std::sync::RwLock::new(Vec::new()),
            cqs: std::sync::RwLock::new(Vec::new()),
            events: AsyncEvents::new()?,
            stop: AtomicBool::new(false),
            cores,
            app_stepped: std::sync::atomic::AtomicU64::new(0),
            app_posted: std::sync::atomic::AtomicU64::new(0),
            app_stepping: AtomicBool::new(false),
            clock: o.clock,
            gsi: Some(gsi),
        });
        let ctx = Context {
            shared: Arc::clone(&shared),
            owner: 0,
            remote: None,
            control: controls,
            next_lane: Arc::default(),
            gid,
            config: Arc::new(DeviceConfig {
                name: o.name,
                addr,
                interface: o.interface,
                mtu: o.port_mtu,
                drop_every: o.drop_every,
                congestion_control: o.congestion_control,
                port: o.port,
                dpdk: String::new(),
                threads: lanes as u32,
                copy: o.copy,
            }),
        };
        let mut threads = Vec::new();
        for (k, ready) in readies.into_iter().enumerate() {
            let shared = Arc::clone(&shared);
            threads.push(
                std::thread::Builder::new()
                    .name(format!("burst-engine-{k}"))
                    .spawn(move || {
                        let _span = tracing::info_span!("burst-engine", %addr, lane = k).entered();
                        tracing::info!("engine started");
                        run(&shared, k, &ready);
                        tracing::info!("engine stopped");
                    })?,
            );
        }
        Ok(Engine { ctx, threads })
    }

    /// A front-end handle.
    pub fn context(&self) -> Context {
        self.ctx.clone()
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.ctx.shared.stop.store(true, Ordering::Release);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        // Close the ports now, even if contexts outlive the engine.
        for core in &self.ctx.shared.cores {
            let mut core = core.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(mut dev) = core.dev.take() {
                // ACKs of the last packets received leave with the next
                // round: send them, or the peer retries into RETRY_EXC_ERR.
                dev.flush();
                tracing::debug!(counters = ?dev.counters(), "device closed");
            }
        }
    }
}

/// The address handles of a device: numbered by the engine's context (the
/// same number on every lane), owned by the client that created them, and
/// shared within a client by destination: an application that creates an
/// AH per message to one peer (or a modify per connection) reuses one
/// entry, counted. Destroyed with its last reference or with its client.
#[derive(Debug, Default)]
struct AhTable {
    /// Destination -> (index, references).
    by_dest: HashMap<AhKey, (u32, u32)>,
    /// index -> destination.
    by_index: HashMap<u32, AhKey>,
    free: Vec<u32>,
    next: u32,
}

/// Who holds an AH and where it goes: (owner, dgid, sgid index).
type AhKey = (u32, [u8; 16], Option<u8>);

impl AhTable {
    fn take_index(&mut self) -> u32 {
        self.free.pop().unwrap_or_else(|| {
            self.next += 1;
            self.next - 1
        })
    }
}

/// Completions a full CQ refused, held per CQ (and in order within each):
/// one CQ nobody polls holds back only its own completions. The QPs
/// feeding a CQ that holds some are paused (their posted WRs wait in their
/// rings, which are bounded) until it drains, so what a CQ holds is bounded
/// by what its QPs had outstanding in the transport; past
/// [`Held::LIMIT`] (a CQ fed through an SRQ), completions are lost, as on
/// an RNIC whose CQ overran, and counted.
#[derive(Default)]
struct Held {
    by_cq: HashMap<usize, VecDeque<WorkCompletion>>,
    /// QPs to visit again at the next step: their WRs were left in their
    /// rings while a CQ of theirs held completions, or past a visit's budget.
    paused: Vec<Qpn>,
    /// Channels to signal once the CQ table's lock is released.
    signals: Vec<Arc<CompChannel>>,
    /// Completions lost to [`Held::LIMIT`].
    lost: u64,
}

impl Held {
    /// Completions one CQ may hold (twice a QP's deepest queue).
    const LIMIT: usize = 2 * crate::MAX_QP_WR as usize;

    /// Whether QP rings `r` must wait: a CQ of theirs holds completions.
    fn blocks(&self, r: &QpRings) -> bool {
        !self.by_cq.is_empty()
            && (self.by_cq.contains_key(&(r.send_cq.0 as usize))
                || self.by_cq.contains_key(&(r.recv_cq.0 as usize)))
    }

    /// Notes that `qpn`'s rings were left for later.
    fn pause(&mut self, qpn: Qpn) {
        if !self.paused.contains(&qpn) {
            self.paused.push(qpn);
        }
    }

    /// Holds `wc` behind CQ `cq`'s earlier completions.
    fn push(&mut self, cq: usize, wc: WorkCompletion) {
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
    fn deliver_or_hold(&mut self, q: &Cq, cq: usize, wc: WorkCompletion, events: &AsyncEvents) {
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
    fn flush(&mut self, cqs: &[Option<Arc<Cq>>]) {
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
    fn signal(&mut self) {
        for ch in self.signals.drain(..) {
            ch.fd.signal();
        }
    }
}

fn refused(wr_id: u64, opcode: WcOpcode, qpn: Qpn) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        status: WcStatus::LocQpOpErr,
        opcode,
        byte_len: 0,
        imm_data: None,
        invalidated_rkey: None,
        qp_num: qpn,
        src_qp: Qpn::default(),
        grh: None,
    }
}

/// Runs a control request; returns the QP a modify touched (its queues may
/// have been emptied without completions: RESET discards them).
fn control(dev: &mut Device, c: Control) -> Option<Qpn> {
    let touched = match &c {
        Control::ModifyQp { qpn, .. } | Control::ModifyQpSteps { qpn, .. } => Some(*qpn),
        _ => None,
    };
    match c {
        Control::CreateQp { init, reply } => {
            let qp = dev.create_qp_with(&init).and_then(|qpn| {
                let (_, cfg) = dev.query_qp(qpn).ok_or(VerbsError::BadWr("no such QP"))?;
                Ok((qpn, cfg))
            });
            let _ = reply.send(qp);
        }
        Control::DestroyQp { qpn, reply } => {
            let _ = reply.send(dev.destroy_qp(qpn));
        }
        Control::CreateSrq {
            pd,
            max_wr,
            max_sge,
            reply,
        } => {
            let _ = reply.send(dev.create_srq(pd, max_wr, max_sge));
        }
        Control::DestroySrq { srq, reply } => {
            let _ = reply.send(dev.destroy_srq(srq));
        }
        Control::ModifySrq {
            srq,
            max_wr,
            limit,
            reply,
        } => {
            let _ = reply.send(dev.modify_srq(srq, max_wr, limit));
        }
        Control::QueryQp { qpn, reply } => {
            let _ = reply.send(dev.query_qp(qpn));
        }
        Control::CreateAh {
            index,
            owner,
            gid,
            sgid_index,
            reply,
        } => {
            let _ = reply.send(dev.create_ah(index, owner, gid, sgid_index));
        }
        Control::DestroyAh { index, reply } => {
            dev.destroy_ah(index);
            let _ = reply.send(());
        }
        Control::Gids { reply } => {
            let _ = reply.send(dev.gid_table());
        }
        Control::Multicast {
            qpn,
            mgid,
            attach,
            reply,
        } => {
            let _ = reply.send(if attach {
                dev.attach_mcast(qpn, mgid)
            } else {
                dev.detach_mcast(qpn, mgid)
            });
        }
        Control::ModifyQp { qpn, attr, reply } => {
            let _ = reply.send(dev.modify_qp(qpn, &attr));
        }
        Control::ModifyQpSteps { qpn, attrs, reply } => {
            let r = attrs
                .iter()
                .enumerate()
                .try_for_each(|(i, a)| dev.modify_qp(qpn, a).map_err(|e| (i, e)));
            let _ = reply.send(r);
        }
        Control::Counters { reply } => {
            let _ = reply.send(dev.counters());
        }
        Control::QpCounters { qpn, reply } => {
            let _ = reply.send(dev.qp_counters(qpn));
        }
        Control::Congestion { reply } => {
            let _ = reply.send(dev.congestion_state());
        }
        Control::DebugPanicFor { qpn, reply } => {
            dev.debug_panic_on_packet_for(qpn);
            let _ = reply.send(());
        }
    }
    touched
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
/// without a wake-up), and else blocks until a packet arrives (the kernel
/// wakes it at once, preempting a spinning application on the same core).
///
/// Measured over the veth pair (burst-bench, pinned): write_bw 64 KiB as with
/// the earlier flat 1 ms sleep (same context switches, ~4700 in 2 s), and
/// write_lat / read_lat / atomic_lat p50 5.2 / 10.8 / 10.8 us with p99.9
/// under 100 us; perftest's ib_write_lat through the drop-in went from
/// 1.1 ms (flat sleep) to about 100 us on loopback (four threads, 2 cores).
fn run(shared: &Shared, lane: usize, ready: &burst_io::Readiness) {
    const SPIN_NS: u64 = 2_000_000;
    const MIN_SLEEP: Duration = Duration::from_micros(10);
    const MAX_SLEEP: Duration = Duration::from_millis(1);
    // Timers (retransmissions) are checked at least this often when idle.
    const IDLE_WAIT: Duration = Duration::from_millis(1);
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
        drop(core);
        if busy {
            last_work = now;
            continue;
        }
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
            if !shared.bells_pending(lane) {
                if let Some(fd) = wake.wait_fd(lane) {
                    let _ = ready.wait_or(fd, IDLE_WAIT);
                }
            }
            wake.sleeping(lane).store(0, Ordering::Relaxed);
            wake.drain(lane, &mut tokens);
        }
    }
}

impl Core {
    /// [`Core::step`], with a fault contained: the device's own guards
    /// catch faults inside its QPs and its port; one in the engine's code
    /// around them (doorbells, rings, completion delivery) fails every QP
    /// ([`AsyncEvent::DeviceFatal`]) and is logged, and the next step runs
    /// as usual. The panic never unwinds through the core's lock, so the
    /// lock is not poisoned and the data plane never silently stops.
    fn step_contained(&mut self, shared: &Shared, lane: usize, round: Round, now: u64) -> bool {
        self.contained(shared, |core| core.step(shared, lane, round, now))
            .unwrap_or(true)
    }

    /// Runs `f` on the core with a fault contained (see
    /// [`Core::step_contained`]); `None` if it faulted.
    fn contained<R>(&mut self, shared: &Shared, f: impl FnOnce(&mut Core) -> R) -> Option<R> {
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
    fn run_control(&mut self, shared: &Shared) {
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
    fn publish_modified(dev: &Device, shared: &Shared, qpn: Qpn) {
        let rings = shared.rings.read().unwrap_or_else(|e| e.into_inner());
        if let Some(Some(r)) = rings.get(qpn.value().wrapping_sub(FIRST_QPN) as usize) {
            Core::publish_retired(dev, r);
        }
    }

    /// Moves the WRs waiting in a QP's rings into the transport, in order.
    /// A WR the transport refuses completes with an error, since the
    /// application's post call has already returned. While a CQ of the QP
    /// holds completions the WRs stay in the rings (see [`Held`]).
    fn take_rings(dev: &mut Device, held: &mut Held, r: &QpRings) -> bool {
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
    fn publish_retired(dev: &Device, r: &QpRings) {
        if let Some((send, recv)) = dev.retired(r.qpn) {
            r.words.set_retired(
                send + r.refused.0.load(Ordering::Relaxed),
                recv + r.refused.1.load(Ordering::Relaxed),
            );
        }
    }

    /// Posts a checked send WR straight into the transport (the posting
    /// thread holds the core); WRs already in the QP's ring go first.
    fn post_send_now(&mut self, r: &QpRings, wr: SendWr) -> Result<(), PostError> {
        let dev = self.dev.as_mut().ok_or(PostError::Stopped)?;
        Core::take_rings(dev, &mut self.held, r);
        if self.held.blocks(r) {
            // Behind the held completions, as a ring's WRs wait.
            return r.send.push(wr).map_err(|_| PostError::Full);
        }
        dev.post_send_checked(r.qpn, wr).map_err(PostError::Refused)
    }

    /// [`Core::post_send_now`] for a receive.
    fn post_recv_now(&mut self, r: &QpRings, wr: RecvWr) -> Result<(), PostError> {
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
    fn step(&mut self, shared: &Shared, lane: usize, round: Round, now: u64) -> bool {
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
        let held = &mut self.held;
        let bad = &mut self.bad_input;
        // QPs paused behind a CQ's held completions go on once it drained.
        if !held.paused.is_empty() {
            let paused = std::mem::take(&mut held.paused);
            let rings = shared.rings.read().unwrap_or_else(|e| e.into_inner());
            for q in paused {
                if let Some(Some(r)) = rings.get(q.value().wrapping_sub(FIRST_QPN) as usize) {
                    busy |= Core::take_rings(dev, held, r);
                }
            }
        }
        // Doorbells: move posted WQEs from the rings into the transport. A
        // doorbell lost to a full queue is made up by visiting every ring.
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
        // Daemon clients' doorbells: each may only name its own rings.
        let client_bells = &mut self.bells;
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
        drop(clients);
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
                let id = SrqId(bell & !SRQ_DOORBELL);
                let srqs = shared.srqs.read().unwrap_or_else(|e| e.into_inner());
                let Some(Some(srq)) = srqs.get(id.0 as usize) else {
                    continue;
                };
                if srq.owner != owner {
                    bad_input(bad, owner, "doorbell for another client's SRQ ignored");
                    continue;
                }
                // A ring's worth per doorbell (a client posting without end
                // rings again for the rest).
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
        // Packets moved count as work: a request received this round is
        // answered (READ response, ACK) in the next round's transmit.
        busy |= match round {
            Round::Full => dev.progress_at(now),
            Round::Transmit => dev.transmit_at(now),
        };
        for ev in dev.take_async_events() {
            shared.events.push(ev);
        }
        // Completions into the CQ rings, in order per CQ: held ones first.
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
        drop(rings);
        drop(cqs);
        // Channels are signalled with no lock held.
        held.signal();
        busy
    }
}

/// What a step of the core does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Round {
    /// Transmit, receive, timers.
    Full,
    /// Transmit only (after a post).
    Transmit,
}

/// CQ `id` (`q`) refused a completion: the first refusal of an overrun
/// raises [`AsyncEvent::CqError`].
fn overrun(q: &Cq, id: usize, events: &AsyncEvents) {
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
fn deliver(q: &Cq, wc: WorkCompletion) -> Result<Option<Arc<CompChannel>>, WorkCompletion> {
    q.ring.push(wc)?;
    if q.armed().swap(0, Ordering::AcqRel) != 0 {
        if let Some(ch) = &q.channel {
            // Counted before the signal, so a reader woken by it finds it.
            q.events().fetch_add(1, Ordering::AcqRel);
            return Ok(Some(Arc::clone(ch)));
        }
    }
    Ok(None)
}

/// Why a front-end call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostError {
    /// The ring is full (errno ENOMEM, as providers report a full queue).
    Full,
    /// No such QP or CQ.
    NoSuch,
    /// An argument the call cannot take (a CQ without a channel armed,
    /// unreadable inline data).
    Invalid,
    /// The work request fails the checks `ibv_post_send` / `ibv_post_recv`
    /// make ([`QpConfig::check_send`]), or the transport refused it.
    Refused(VerbsError),
    /// The engine has stopped (or, for a daemon client, burstd is gone).
    Stopped,
    /// The object is still in use (EBUSY).
    Busy,
}

impl PostError {
    /// The errno rdma-core returns for this failure.
    pub fn errno(self) -> i32 {
        match self {
            PostError::Full => libc::ENOMEM,
            PostError::Stopped => libc::EIO,
            PostError::Refused(v) => v.errno(),
            PostError::NoSuch | PostError::Invalid => libc::EINVAL,
            PostError::Busy => libc::EBUSY,
        }
    }
}

impl std::fmt::Display for PostError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PostError::Full => write!(f, "queue full"),
            PostError::NoSuch => write!(f, "no such QP, SRQ or CQ"),
            PostError::Invalid => write!(f, "invalid argument"),
            PostError::Refused(v) => write!(f, "{v}"),
            PostError::Stopped => write!(f, "the engine has stopped (or burstd is gone)"),
            PostError::Busy => write!(f, "still in use"),
        }
    }
}

impl std::error::Error for PostError {}

impl Context {
    /// The device's GID.
    pub fn gid(&self) -> [u8; 16] {
        self.gid
    }

    /// What the device was opened with (name, address, interface, MTU).
    pub fn config(&self) -> &DeviceConfig {
        &self.config
    }

    /// `ibv_query_device`.
    pub fn query_device(&self) -> DeviceAttr {
        DeviceAttr::for_gid(self.gid)
    }

    /// `ibv_query_port` (port 1).
    pub fn query_port(&self) -> PortAttr {
        PortAttr {
            active: !self.shared.events.port_down.load(Ordering::Relaxed),
            ..PortAttr::with_mtu(self.config.mtu)
        }
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> Pd {
        self.try_alloc_pd().unwrap_or(Pd(0))
    }

    /// [`Context::alloc_pd`], with the error a daemon client can meet.
    pub fn try_alloc_pd(&self) -> Result<Pd, PostError> {
        if let Some(r) = &self.remote {
            return r.alloc_pd();
        }
        let pd = self.shared.mrs.alloc_pd();
        self.shared
            .pd_owner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(pd.0, self.owner);
        Ok(pd)
    }

    /// `ibv_dealloc_pd`: EBUSY while regions or QPs use it.
    pub fn dealloc_pd(&self, pd: Pd) -> Result<(), PostError> {
        if let Some(r) = &self.remote {
            return r.dealloc_pd(pd);
        }
        self.check_pd(pd)?;
        let mrs = self
            .shared
            .mr_owner
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let used = mrs
            .keys()
            .any(|k| self.shared.mrs.lookup(*k).is_some_and(|r| r.pd() == pd.0))
            || self.shared.mrs.pd_has_windows(pd);
        drop(mrs);
        let rings = self.shared.rings.read().unwrap_or_else(|e| e.into_inner());
        if used || rings.iter().flatten().any(|r| r.cfg.pd == pd.0) {
            return Err(PostError::Busy);
        }
        drop(rings);
        self.shared
            .pd_owner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&pd.0);
        Ok(())
    }

    /// `Ok` when `pd` is this handle's (a daemon client reaches only its own).
    fn check_pd(&self, pd: Pd) -> Result<(), PostError> {
        let owners = self
            .shared
            .pd_owner
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match owners.get(&pd.0) {
            Some(o) if *o == self.owner => Ok(()),
            // PDs of MrTables used directly (simulations) are unknown here.
            None if self.owner == 0 => Ok(()),
            _ => Err(PostError::NoSuch),
        }
    }

    /// Registers application memory (accessed in place by the engine).
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay valid until [`Context::dereg_mr`] returns.
    pub unsafe fn reg_mr(
        &self,
        pd: Pd,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<MrKeys, RegError> {
        // SAFETY: forwarded contract.
        unsafe { self.reg_mr_iova(pd, ptr, len, ptr as u64, access) }
    }

    /// Registers application memory that peers address from `iova`
    /// (`ibv_reg_mr_iova2`). A daemon client's pages move onto a memfd the
    /// daemon maps too ([`crate::client`]), or the daemon copies through
    /// `process_vm_readv`/`process_vm_writev` where they cannot.
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay valid until [`Context::dereg_mr`] returns.
    pub unsafe fn reg_mr_iova(
        &self,
        pd: Pd,
        ptr: *mut u8,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MrKeys, RegError> {
        if let Some(r) = &self.remote {
            return r.reg_mr(pd, ptr, len, iova, access);
        }
        // SAFETY: forwarded contract.
        self.register(pd, None, || unsafe {
            self.shared.mrs.register(pd, ptr, len, iova, access)
        })
    }

    /// Registers memory the daemon mapped for a client: `len` bytes at
    /// `offset` of `pages` (memfds the client moved its pages onto),
    /// addressed as `iova`. The mapping lives until deregistration.
    pub fn reg_mr_mapped(
        &self,
        pd: Pd,
        pages: Arc<Segment>,
        offset: usize,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MrKeys, RegError> {
        if offset.checked_add(len).is_none_or(|e| e > pages.len()) {
            return Err(RegError::InvalidLength);
        }
        let base = pages.as_ptr();
        // SAFETY: `pages` stays mapped while the region is registered (held
        // in `mr_owner` until `dereg_mr` has waited for the last user), and
        // `offset..offset+len` lies inside it (checked above).
        self.register(pd, Some(pages), || unsafe {
            self.shared
                .mrs
                .register(pd, base.add(offset), len, iova, access)
        })
    }

    /// Registers memory of another process that the engine reaches
    /// through `mem`, a descriptor of that process's `/proc/self/mem` it
    /// opened and handed over (one copy per access, no remapping).
    pub fn reg_mr_foreign(
        &self,
        pd: Pd,
        mem: Arc<std::os::fd::OwnedFd>,
        addr: u64,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MrKeys, RegError> {
        self.register(pd, None, || {
            self.shared
                .mrs
                .register_foreign(pd, mem, addr, len, iova, access)
        })
    }

    /// Runs `register` if `pd` is this handle's, and records the region as
    /// its owner's (with the daemon's mapping of its pages, if any).
    fn register(
        &self,
        pd: Pd,
        pages: Option<Arc<Segment>>,
        register: impl FnOnce() -> Result<MrKeys, RegError>,
    ) -> Result<MrKeys, RegError> {
        if self.check_pd(pd).is_err() {
            return Err(RegError::NoSuchPd);
        }
        let keys = register()?;
        self.shared
            .mr_owner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(keys.lkey, (self.owner, pages));
        Ok(keys)
    }

    /// Deregisters; returns once the engine no longer uses the region.
    pub fn dereg_mr(&self, lkey: u32) -> Result<(), RegError> {
        if let Some(r) = &self.remote {
            return r.dereg_mr(lkey);
        }
        let mut owners = self
            .shared
            .mr_owner
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match owners.get(&lkey) {
            Some((o, _)) if *o == self.owner => {}
            None if self.owner == 0 => {}
            _ => return Err(RegError::NoSuchRegion),
        }
        let held = owners.remove(&lkey);
        drop(owners);
        let r = self.shared.mrs.deregister(lkey);
        // The daemon's mapping goes only now, after the last user let go.
        drop(held);
        r
    }

    /// `ibv_alloc_mw`: a memory window of `pd` (see [`burst_mem::MwType`]);
    /// it is bound by a [`burst_transport::SendOp::BindMw`] work request.
    pub fn alloc_mw(&self, pd: Pd, kind: MwType) -> Result<MwKeys, RegError> {
        if let Some(r) = &self.remote {
            return r.alloc_mw(pd, kind);
        }
        if self.check_pd(pd).is_err() {
            return Err(RegError::NoSuchPd);
        }
        let keys = self.shared.mrs.alloc_window(pd, kind)?;
        self.shared
            .mw_owner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(keys.handle, self.owner);
        Ok(keys)
    }

    /// `ibv_dealloc_mw`.
    pub fn dealloc_mw(&self, handle: u32) -> Result<(), RegError> {
        if let Some(r) = &self.remote {
            return r.dealloc_mw(handle);
        }
        let mut owners = self
            .shared
            .mw_owner
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match owners.get(&handle) {
            Some(o) if *o == self.owner => {}
            None if self.owner == 0 => {}
            _ => return Err(RegError::NoSuchRegion),
        }
        owners.remove(&handle);
        drop(owners);
        self.shared.mrs.dealloc_window(handle)
    }

    /// Creates a completion queue ring of `depth` entries.
    pub fn create_cq(&self, depth: usize) -> CqId {
        self.create_cq_with(depth, None)
    }

    /// `ibv_create_comp_channel`.
    pub fn create_comp_channel(&self) -> std::io::Result<Arc<CompChannel>> {
        let Some(r) = &self.remote else {
            return Ok(Arc::new(CompChannel::with_fd(
                crate::eventfd::EventFd::new()?,
            )));
        };
        // burstd signals a pipe whose write end it keeps.
        let (id, fd) = r.create_channel()?;
        let ch = CompChannel::with_fd(crate::eventfd::EventFd::pipe_reader(fd));
        ch.set_remote_id(id);
        Ok(Arc::new(ch))
    }

    /// `ibv_destroy_comp_channel` (no CQ may still use it: `Busy`). burstd
    /// lets go of its write end; in embedded mode the channel goes with
    /// its last `Arc`.
    pub fn destroy_comp_channel(&self, ch: &CompChannel) -> Result<(), PostError> {
        match &self.remote {
            Some(r) => r.destroy_channel(ch.remote_id()),
            None => Ok(()),
        }
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
        let (id, seg) = match &self.remote {
            Some(r) => r.create_cq(depth, channel.as_ref())?,
            None => (None, Arc::new(self.segment("burst-cq", Cq::bytes(slots))?)),
        };
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
        if let Some(r) = &self.remote {
            r.destroy_cq(cq)?;
        } else {
            let rings = self.shared.rings.read().unwrap_or_else(|e| e.into_inner());
            if rings
                .iter()
                .flatten()
                .any(|r| r.send_cq == cq || r.recv_cq == cq)
            {
                return Err(PostError::Busy);
            }
        }
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
    fn cq_ref(&self, cq: CqId) -> Result<Arc<Cq>, PostError> {
        let cqs = self.shared.cqs.read().unwrap_or_else(|e| e.into_inner());
        match cqs.get(cq.0 as usize) {
            Some(Some(q)) if q.owner == self.owner => Ok(Arc::clone(q)),
            _ => Err(PostError::NoSuch),
        }
    }

    /// A segment for rings: a memfd in a daemon, anonymous memory otherwise.
    fn segment(&self, name: &str, len: usize) -> Result<Segment, PostError> {
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
    pub fn req_notify_cq(&self, cq: CqId) -> Result<(), PostError> {
        let q = self.cq_ref(cq)?;
        if q.channel.is_none() {
            return Err(PostError::Invalid);
        }
        q.armed().store(1, Ordering::Release);
        Ok(())
    }

    /// Runs a control request on lane 0 (SRQs live there).
    fn call<T>(&self, make: impl FnOnce(Sender<T>) -> Control) -> Result<T, PostError> {
        self.call_on(0, make)
    }

    /// The lane that owns QP `qpn` (QPNs interleave over the lanes).
    fn lane_of(&self, qpn: Qpn) -> usize {
        qpn.value().wrapping_sub(FIRST_QPN) as usize % self.control.len()
    }

    /// Runs a control request on `lane`'s core and waits for its reply.
    fn call_on<T>(
        &self,
        lane: usize,
        make: impl FnOnce(Sender<T>) -> Control,
    ) -> Result<T, PostError> {
        let (tx, rx) = bounded(1);
        if let Some(r) = &self.remote {
            // The daemon runs it: the request crosses the control socket.
            r.execute(make(tx))?;
            return rx.try_recv().map_err(|_| PostError::Stopped);
        }
        self.control
            .get(lane)
            .ok_or(PostError::NoSuch)?
            .send(make(tx))
            .map_err(|_| PostError::Stopped)?;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(v) = rx.try_recv() {
                return Ok(v);
            }
            if self.shared.stop.load(Ordering::Acquire) || std::time::Instant::now() > deadline {
                return Err(PostError::Stopped);
            }
            // Whoever holds the core runs the request at its next step;
            // with the core free, this thread runs it (and only it: a
            // control call moves no packets).
            match self.shared.cores[lane].try_lock() {
                Ok(mut core) => {
                    let sh = &*self.shared;
                    core.contained(sh, |c| c.run_control(sh));
                }
                Err(_) => std::thread::yield_now(),
            }
        }
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

    /// Hands progress back to the engine thread at once (call before the
    /// thread blocks, e.g. in `ibv_get_cq_event`), instead of after the
    /// engine notices this thread stopped stepping.
    pub fn park(&self) {
        self.shared.app_stepped.store(0, Ordering::Relaxed);
        self.shared.app_posted.store(0, Ordering::Relaxed);
    }

    /// Steps the data plane on the calling thread if no other thread is
    /// stepping it; returns whether there was work. Posting and polling
    /// call this, so an application that busy-polls drives its own I/O.
    pub fn progress(&self) -> bool {
        if self.remote.is_some() {
            // A daemon client has no core to step: the daemon's engine
            // thread does the work. Polling an empty CQ hands the CPU over
            // instead of spinning against that thread (on a machine with
            // fewer cores than spinning threads, a 64-byte send_lat went
            // from 2 ms to microseconds).
            std::thread::yield_now();
            return false;
        }
        self.step(Round::Full)
    }

    /// [`Context::progress`] without the receive: what posting a send does.
    /// The reply to a request cannot have arrived yet, and a bandwidth test
    /// that posts many WRs between polls would otherwise pay an empty
    /// `recvmmsg` per WR; the next poll of an empty CQ receives.
    fn progress_transmit(&self) -> bool {
        self.step(Round::Transmit)
    }

    /// Steps every lane this thread can take.
    fn step(&self, round: Round) -> bool {
        let mut busy = false;
        for lane in 0..self.shared.cores.len() {
            busy |= self.step_with(lane, round, |_| ()).is_some_and(|(b, _)| b);
        }
        busy
    }

    /// Runs `first` on the core, then a step of `round`, if this thread can
    /// take the core; `None` if another thread holds it. The inner `None`:
    /// `first` faulted (contained).
    fn step_with<R>(
        &self,
        lane: usize,
        round: Round,
        first: impl FnOnce(&mut Core) -> R,
    ) -> Option<(bool, Option<R>)> {
        let sh = &*self.shared;
        if sh.stop.load(Ordering::Acquire) {
            return None;
        }
        // Recorded even when the engine thread holds the core: the thread
        // is polling (or posting) all the same.
        let now = sh.clock.now();
        // Posting counts as driving too: a bandwidth test posts for a while
        // between polls, and an engine thread stepping meanwhile on the same
        // core halved its rate (29 -> 8-12 Gb/s over the veth pair).
        sh.app_stepped.store(now.max(1), Ordering::Relaxed);
        if round == Round::Transmit {
            sh.app_posted.store(now.max(1), Ordering::Relaxed);
        }
        let mut core = sh.cores.get(lane)?.try_lock().ok()?;
        sh.app_stepping.store(true, Ordering::Relaxed);
        let r = core.contained(sh, first);
        let busy = core.step_contained(sh, lane, round, now);
        drop(core);
        // Stamped again at the end: a step may take a while (a 64 KiB send
        // is ~10 us), and the gap the engine thread measures is the one
        // between the application's steps.
        sh.app_stepped
            .store(sh.clock.now().max(1), Ordering::Relaxed);
        sh.app_stepping.store(false, Ordering::Relaxed);
        Some((busy, r))
    }

    /// Runs `f` on the data plane's device, waiting for the core if another
    /// thread steps it (diagnostics and simulation, not the data path).
    fn with_device<R>(&self, lane: usize, f: impl FnOnce(&mut Device) -> R) -> Option<R> {
        let mut core = self
            .shared
            .cores
            .get(lane)?
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        core.dev.as_mut().map(f)
    }

    /// [`Context::with_device`] on every lane, in order.
    fn each_device<R>(&self, mut f: impl FnMut(&mut Device) -> R) -> Vec<R> {
        (0..self.shared.cores.len())
            .filter_map(|l| self.with_device(l, &mut f))
            .collect()
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

    /// Creates a QP with its rings (depth `depth` each) and default sizes;
    /// returns its number.
    pub fn create_qp(
        &self,
        qp_type: QpType,
        pd: Pd,
        send_cq: CqId,
        recv_cq: CqId,
        depth: usize,
    ) -> Result<Qpn, PostError> {
        let mut init = QpInit::new(qp_type, pd);
        init.caps.max_send_wr = depth as u32;
        init.caps.max_recv_wr = depth as u32;
        self.create_qp_with(&init, send_cq, recv_cq)
            .map(|q| q.qpn())
            .map_err(|e| match e {
                CreateError::Post(p) => p,
                CreateError::Verbs(_) => PostError::Invalid,
            })
    }

    /// `ibv_create_qp`: a QP in RESET with rings sized by `init.caps`,
    /// completing into `send_cq` / `recv_cq`.
    pub fn create_qp_with(
        &self,
        init: &QpInit,
        send_cq: CqId,
        recv_cq: CqId,
    ) -> Result<QueuePair, CreateError> {
        self.cq_ref(send_cq)?;
        self.cq_ref(recv_cq)?;
        self.check_pd(init.pd)?;
        if let Some(srq) = init.srq {
            self.srq_ref(srq)?;
        }
        let init = *init;
        // Checked before any ring is mapped (the transport checks again).
        if init.caps.max_send_wr > crate::MAX_QP_WR || init.caps.max_recv_wr > crate::MAX_QP_WR {
            return Err(CreateError::Verbs(VerbsError::InvalidValue(
                "max_send_wr/max_recv_wr",
            )));
        }
        let slots = (
            ShmRing::<SendWr>::slots_for(init.caps.max_send_wr as usize),
            ShmRing::<RecvWr>::slots_for(init.caps.max_recv_wr as usize),
        );
        let rings = if let Some(r) = &self.remote {
            let (qpn, cfg, lane, seg) = r.create_qp(&init, send_cq, recv_cq)?;
            QpRings::new(seg, slots, false, qpn, lane, cfg, (send_cq, recv_cq), 0)
                .map_err(|_| PostError::Invalid)?
        } else {
            // Round robin over the lanes; a QP with an SRQ goes where SRQs live.
            let lane = if init.srq.is_some() {
                0
            } else {
                self.next_lane.fetch_add(1, Ordering::Relaxed) % self.control.len()
            };
            let seg = Arc::new(self.segment("burst-qp", qp_layout(slots.0, slots.1).2)?);
            let (qpn, cfg) = self
                .call_on(lane, |reply| Control::CreateQp { init, reply })?
                .map_err(CreateError::Verbs)?;
            QpRings::new(
                seg,
                slots,
                true,
                qpn,
                lane,
                cfg,
                (send_cq, recv_cq),
                self.owner,
            )
            .map_err(|_| PostError::Invalid)?
        };
        let rings = Arc::new(rings);
        let i = (rings.qpn.value() - FIRST_QPN) as usize;
        let mut all = self.shared.rings.write().unwrap_or_else(|e| e.into_inner());
        if all.len() <= i {
            all.resize(i + 1, None);
        }
        all[i] = Some(Arc::clone(&rings));
        Ok(QueuePair {
            rings,
            ctx: self.clone(),
        })
    }

    /// `ibv_destroy_qp`.
    pub fn destroy_qp(&self, qpn: Qpn) -> Result<(), CreateError> {
        self.ring(qpn)?;
        if let Some(r) = &self.remote {
            r.destroy_qp(qpn)?;
        }
        {
            let mut all = self.shared.rings.write().unwrap_or_else(|e| e.into_inner());
            if let Some(slot) = all.get_mut(qpn.value().wrapping_sub(FIRST_QPN) as usize) {
                *slot = None;
            }
        }
        if self.remote.is_some() {
            return Ok(());
        }
        self.call_on(self.lane_of(qpn), |reply| Control::DestroyQp { qpn, reply })?
            .map_err(CreateError::Verbs)
    }

    /// The segment of a QP's rings, with their slots (send, receive) and
    /// its lane: burstd hands them to the client.
    pub fn qp_segment(&self, qpn: Qpn) -> Result<(Arc<Segment>, usize, usize, usize), PostError> {
        let r = self.ring(qpn)?;
        Ok((
            Arc::clone(r.send.segment()),
            r.send.capacity(),
            r.recv.capacity(),
            r.lane,
        ))
    }

    /// SRQ `srq`, if this handle may reach it.
    fn srq_ref(&self, srq: SrqId) -> Result<Arc<SrqRing>, PostError> {
        let all = self.shared.srqs.read().unwrap_or_else(|e| e.into_inner());
        match all.get(srq.0 as usize) {
            Some(Some(s)) if s.owner == self.owner => Ok(Arc::clone(s)),
            _ => Err(PostError::NoSuch),
        }
    }

    /// The segment of an SRQ's ring, with its slots.
    pub fn srq_segment(&self, srq: SrqId) -> Result<(Arc<Segment>, usize), PostError> {
        let s = self.srq_ref(srq)?;
        Ok((Arc::clone(s.ring.segment()), s.ring.capacity()))
    }

    /// `ibv_query_qp`: state and creation config.
    pub fn query_qp(
        &self,
        qpn: Qpn,
    ) -> Result<(burst_transport::QpState, burst_transport::QpConfig), PostError> {
        self.ring(qpn)?;
        self.call_on(self.lane_of(qpn), |reply| Control::QueryQp { qpn, reply })?
            .ok_or(PostError::NoSuch)
    }

    /// `ibv_create_srq`.
    pub fn create_srq(
        &self,
        pd: Pd,
        max_wr: u32,
        max_sge: u32,
    ) -> Result<SharedReceiveQueue, CreateError> {
        self.check_pd(pd)?;
        if max_wr > crate::MAX_QP_WR {
            return Err(CreateError::Verbs(VerbsError::InvalidValue("max_wr")));
        }
        let slots = ShmRing::<RecvWr>::slots_for(max_wr as usize);
        let (id, ring) = if let Some(r) = &self.remote {
            let (id, seg) = r.create_srq(pd, max_wr, max_sge)?;
            let ring = ShmRing::attach(seg, 0, slots).map_err(|_| PostError::Invalid)?;
            (id, ring)
        } else {
            let seg = Arc::new(self.segment("burst-srq", ShmRing::<RecvWr>::bytes(slots))?);
            let id = self
                .call(|reply| Control::CreateSrq {
                    pd,
                    max_wr,
                    max_sge,
                    reply,
                })?
                .map_err(CreateError::Verbs)?;
            (
                id,
                ShmRing::create(seg, 0, slots).map_err(|_| PostError::Invalid)?,
            )
        };
        let ring = Arc::new(SrqRing {
            ring,
            max_sge,
            owner: self.owner,
        });
        let mut all = self.shared.srqs.write().unwrap_or_else(|e| e.into_inner());
        let i = id.0 as usize;
        if all.len() <= i {
            all.resize(i + 1, None);
        }
        all[i] = Some(Arc::clone(&ring));
        Ok(SharedReceiveQueue {
            id,
            ring,
            ctx: self.clone(),
        })
    }

    /// `ibv_destroy_srq` (EBUSY while QPs use it).
    pub fn destroy_srq(&self, srq: SrqId) -> Result<(), CreateError> {
        self.srq_ref(srq)?;
        self.call(|reply| Control::DestroySrq { srq, reply })?
            .map_err(CreateError::Verbs)?;
        let mut all = self.shared.srqs.write().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = all.get_mut(srq.0 as usize) {
            *slot = None;
        }
        Ok(())
    }

    /// `ibv_modify_srq`: resize and/or arm the limit event.
    pub fn modify_srq(
        &self,
        srq: SrqId,
        max_wr: Option<u32>,
        limit: Option<u32>,
    ) -> Result<(), CreateError> {
        self.srq_ref(srq)?;
        self.call(|reply| Control::ModifySrq {
            srq,
            max_wr,
            limit,
            reply,
        })?
        .map_err(CreateError::Verbs)
    }

    /// The next asynchronous event, if one is pending (never blocks).
    pub fn take_async_event(&self) -> Option<AsyncEvent> {
        self.shared.events.try_take()
    }

    /// `ibv_get_async_event` exactly: reads the event descriptor (blocking
    /// unless the application made it non-blocking) and returns its event.
    pub fn read_async_event(&self) -> Option<AsyncEvent> {
        self.shared.events.read()
    }

    /// The descriptor that is readable while asynchronous events are
    /// pending (the context's `async_fd`).
    pub fn async_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.shared.events.fd)
    }

    /// Test support for fault containment (see
    /// the device's `debug_panic_on_packet_for`).
    #[doc(hidden)]
    pub fn debug_panic_on_packet_for(&self, qpn: Option<Qpn>) -> Result<(), PostError> {
        for lane in 0..self.control.len() {
            self.call_on(lane, |reply| Control::DebugPanicFor { qpn, reply })?;
        }
        Ok(())
    }

    /// Creates an address handle for destination GID `gid`, sent to from
    /// the device's own address ([`Context::gid`]).
    pub fn create_ah(&self, gid: [u8; 16]) -> Result<u32, PostError> {
        self.create_ah_from(gid, None)
    }

    /// Creates an address handle for destination GID `gid`, sent to from
    /// the device's GID at `sgid_index` ([`Context::gid_table`]; `None`:
    /// its own address); an empty index, or GIDs of different IP versions,
    /// are refused ([`VerbsError::InvalidValue`], EINVAL).
    pub fn create_ah_from(&self, gid: [u8; 16], sgid_index: Option<u8>) -> Result<u32, PostError> {
        if self.remote.is_some() {
            // burstd numbers and owns it.
            return self
                .call(|reply| Control::CreateAh {
                    index: 0,
                    owner: 0,
                    gid,
                    sgid_index,
                    reply,
                })?
                .map_err(PostError::Refused);
        }
        let key = (self.owner, gid, sgid_index);
        let (index, reused) = {
            let mut t = self.shared.ahs.lock().unwrap_or_else(|e| e.into_inner());
            match t.by_dest.get(&key) {
                Some((i, _)) => (*i, true),
                None => (t.take_index(), false),
            }
        };
        // Every lane holds every address handle, under the same number
        // (lanes share one GID table: with several, the device's address).
        // A reused entry is made again: the GID table may have changed.
        let made = (0..self.control.len()).try_for_each(|lane| {
            self.call_on(lane, |reply| Control::CreateAh {
                index,
                owner: self.owner,
                gid,
                sgid_index,
                reply,
            })?
            .map(|_| ())
            .map_err(PostError::Refused)
        });
        let mut t = self.shared.ahs.lock().unwrap_or_else(|e| e.into_inner());
        if reused {
            made?;
            match t.by_dest.get_mut(&key) {
                Some((i, refs)) if *i == index => *refs += 1,
                // Destroyed meanwhile by another thread of the client.
                _ => {
                    t.by_dest.insert(key, (index, 1));
                    t.by_index.insert(index, key);
                }
            }
            return Ok(index);
        }
        match made {
            Ok(()) => {
                t.by_dest.insert(key, (index, 1));
                t.by_index.insert(index, key);
                Ok(index)
            }
            Err(e) => {
                t.free.push(index);
                Err(e)
            }
        }
    }

    /// `ibv_destroy_ah`: drops one reference to this client's AH `ah`
    /// (the entry goes with the last); `NoSuch` for another client's.
    pub fn destroy_ah(&self, ah: u32) -> Result<(), PostError> {
        if let Some(r) = &self.remote {
            return r.destroy_ah(ah);
        }
        self.release_ah(ah, false)
    }

    /// Drops one reference to this owner's AH `ah` (every reference with
    /// `all`: the client is gone); the last removes it from every lane.
    fn release_ah(&self, ah: u32, all: bool) -> Result<(), PostError> {
        {
            let mut t = self.shared.ahs.lock().unwrap_or_else(|e| e.into_inner());
            let key = match t.by_index.get(&ah) {
                Some(k) if k.0 == self.owner => *k,
                _ => return Err(PostError::NoSuch),
            };
            if let Some((_, refs)) = t.by_dest.get_mut(&key) {
                *refs = if all { 0 } else { refs.saturating_sub(1) };
                if *refs > 0 {
                    return Ok(());
                }
            }
            t.by_dest.remove(&key);
            t.by_index.remove(&ah);
        }
        for lane in 0..self.control.len() {
            self.call_on(lane, |reply| Control::DestroyAh { index: ah, reply })?;
        }
        self.shared
            .ahs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .free
            .push(ah);
        Ok(())
    }

    /// The GID table of port 1, as `ibv_query_gid` reads it: entry `i` is
    /// GID index `i` (`None`: an empty slot); read again from the interface
    /// when older than a tenth of a second, so it follows address changes.
    /// A device on an address of no interface has that address at 0.
    pub fn gid_table(&self) -> Result<Vec<Option<[u8; 16]>>, PostError> {
        let t = self.call(|reply| Control::Gids { reply })?;
        Ok(t.into_iter().map(|g| g.map(crate::gid_of)).collect())
    }

    /// The index of `gid` in the GID table, else of the device's own
    /// address (the source an address vector names when a packet came to
    /// no GID of the table, a multicast group's), else 0.
    pub fn sgid_index_for(&self, gid: [u8; 16]) -> u8 {
        let table = self.gid_table().unwrap_or_default();
        let at = |g: [u8; 16]| table.iter().position(|e| *e == Some(g));
        at(gid)
            .or_else(|| at(self.gid))
            .and_then(|i| u8::try_from(i).ok())
            .unwrap_or(0)
    }

    /// `ibv_attach_mcast` (`attach`) or `ibv_detach_mcast` of UD QP `qpn`
    /// and multicast group `mgid`, on the QP's lane (whose port joins or
    /// leaves the group).
    pub fn multicast(
        &self,
        qpn: Qpn,
        mgid: [u8; 16],
        attach: bool,
    ) -> Result<Result<(), VerbsError>, PostError> {
        self.ring(qpn)?;
        self.call_on(self.lane_of(qpn), |reply| Control::Multicast {
            qpn,
            mgid,
            attach,
            reply,
        })
    }

    /// `ibv_modify_qp`, executed by the engine.
    pub fn modify_qp(&self, qpn: Qpn, attr: &QpAttr) -> Result<Result<(), VerbsError>, PostError> {
        let ring = self.ring(qpn)?;
        let attr = *attr;
        if let Err(e) = self.check_ah(&attr) {
            return Ok(Err(e));
        }
        let r = self.call_on(self.lane_of(qpn), |reply| Control::ModifyQp {
            qpn,
            attr,
            reply,
        })?;
        if let (Ok(()), Some(s)) = (&r, attr.state) {
            ring.words.set_state(s);
        }
        Ok(r)
    }

    /// A QP takes only an address handle its owner created (a daemon
    /// client cannot point its QP at another client's AH).
    fn check_ah(&self, attr: &QpAttr) -> Result<(), VerbsError> {
        let (Some(ah), None) = (attr.ah, &self.remote) else {
            return Ok(());
        };
        let t = self.shared.ahs.lock().unwrap_or_else(|e| e.into_inner());
        match t.by_index.get(&ah) {
            Some(k) if k.0 == self.owner => Ok(()),
            _ => Err(VerbsError::InvalidValue("ah")),
        }
    }

    /// Several `ibv_modify_qp` transitions of `qpn` in one trip to the
    /// engine (a connection manager's INIT, RTR, RTS); the first refused
    /// stops the rest and is returned with its index.
    pub fn modify_qp_steps(
        &self,
        qpn: Qpn,
        attrs: &[QpAttr],
    ) -> Result<Result<(), (usize, VerbsError)>, PostError> {
        let ring = self.ring(qpn)?;
        if self.remote.is_some() {
            // burstd takes them one by one.
            for (i, a) in attrs.iter().enumerate() {
                if let Err(e) = self.modify_qp(qpn, a)? {
                    return Ok(Err((i, e)));
                }
            }
            return Ok(Ok(()));
        }
        if let Some((i, e)) = attrs
            .iter()
            .enumerate()
            .find_map(|(i, a)| self.check_ah(a).err().map(|e| (i, e)))
        {
            return Ok(Err((i, e)));
        }
        let steps = attrs.to_vec();
        let r = self.call_on(self.lane_of(qpn), |reply| Control::ModifyQpSteps {
            qpn,
            attrs: steps,
            reply,
        })?;
        // The state of the last transition that was made.
        let made = match &r {
            Ok(()) => attrs.len(),
            Err((i, _)) => *i,
        };
        if let Some(s) = attrs[..made].iter().rev().find_map(|a| a.state) {
            ring.words.set_state(s);
        }
        Ok(r)
    }

    /// Takes RC QP `qpn` from RESET to RTS towards `peer`: an address
    /// handle for its GID, then the INIT, RTR and RTS transitions
    /// ([`crate::RcParams::transitions`]).
    pub fn connect_rc(
        &self,
        qpn: Qpn,
        peer: &crate::RcPeer,
        p: &crate::RcParams,
    ) -> Result<(), CreateError> {
        let ah = self.create_ah(peer.gid)?;
        for attr in p.transitions(ah, peer) {
            self.modify_qp(qpn, &attr)?.map_err(CreateError::Verbs)?;
        }
        Ok(())
    }

    /// Device counters.
    pub fn counters(&self) -> Result<DeviceCounters, PostError> {
        let mut total = self.call(|reply| Control::Counters { reply })?;
        for lane in 1..self.control.len() {
            total.add(&self.call_on(lane, |reply| Control::Counters { reply })?);
        }
        Ok(total)
    }

    /// One QP's counters (RXE's per-QP names).
    pub fn qp_counters(&self, qpn: Qpn) -> Result<burst_transport::Counters, PostError> {
        self.ring(qpn)?;
        self.call_on(self.lane_of(qpn), |reply| Control::QpCounters {
            qpn,
            reply,
        })?
        .ok_or(PostError::NoSuch)
    }

    /// The congestion control's state: the algorithm, each peer's window,
    /// each QP's DCQCN rate.
    pub fn congestion(&self) -> Result<crate::CongestionReport, PostError> {
        self.call(|reply| Control::Congestion { reply })
    }

    fn ring(&self, qpn: Qpn) -> Result<Arc<QpRings>, PostError> {
        let rings = self.shared.rings.read().unwrap_or_else(|e| e.into_inner());
        match rings.get(qpn.value().wrapping_sub(FIRST_QPN) as usize) {
            Some(Some(r)) if r.owner == self.owner => Ok(Arc::clone(r)),
            _ => Err(PostError::NoSuch),
        }
    }

    /// `ibv_post_send`: checks the work request ([`QpConfig::check_send`],
    /// errors returned now with rdma-core's errno), captures inline data
    /// as `ibv_post_send` does, then hands it to the transport: directly
    /// when this thread can hold the core (and steps it to transmit), else
    /// through the QP's ring and a doorbell. (A [`QueuePair`] handle does
    /// the same without looking the QP up.)
    pub fn post_send(&self, qpn: Qpn, wr: &SendWr) -> Result<(), PostError> {
        self.post_send_to(&*self.ring(qpn)?, wr)
    }

    fn post_send_to(&self, ring: &QpRings, wr: &SendWr) -> Result<(), PostError> {
        let wr = *wr;
        let len = ring.cfg.check_send(&wr).map_err(PostError::Refused)?;
        if self.remote.as_ref().is_some_and(|r| r.is_dead()) {
            return Err(PostError::Stopped);
        }
        // As RXE: sends need RTS (or later: in SQD, SQE and ERR they queue,
        // in ERR to be flushed); the queue's depth bounds outstanding WRs.
        let state = ring.words.state();
        if matches!(state, QpState::Reset | QpState::Init | QpState::Rtr) {
            return Err(PostError::Refused(VerbsError::InvalidState(state)));
        }
        if !ring.words.reserve(false, ring.cfg.max_send_wr) {
            return Err(PostError::Refused(VerbsError::QueueFull));
        }
        let r = self.post_send_reserved(ring, wr, len);
        if r.is_err() {
            ring.words.unreserve(false);
        }
        r
    }

    fn post_send_reserved(
        &self,
        ring: &QpRings,
        mut wr: SendWr,
        len: u64,
    ) -> Result<(), PostError> {
        if let Some(r) = &self.remote {
            if r.is_dead() {
                return Err(PostError::Stopped);
            }
            if wr.inline && wr.inline_data.is_none() {
                // As providers do: the bytes are read from the addresses
                // now, whatever the lkeys (inline data needs no region).
                let mut d = InlineData::zeroed(len as usize).map_err(PostError::Refused)?;
                let mut at = 0;
                for s in wr.sg_list.iter() {
                    let n = s.length as usize;
                    // SAFETY: the application passed these SGEs to
                    // ibv_post_send with IBV_SEND_INLINE: readable now
                    // (rdma-core's providers memcpy them the same way);
                    // their total is `len`, which `d` holds.
                    unsafe {
                        std::ptr::copy_nonoverlapping(s.addr as *const u8, d[at..].as_mut_ptr(), n)
                    };
                    at += n;
                }
                wr.inline_data = Some(d);
            }
        }
        if wr.inline && wr.inline_data.is_none() {
            let mut d = InlineData::zeroed(len as usize).map_err(PostError::Refused)?;
            let mem = self.shared.mrs.memory();
            burst_transport::Memory::read_local(&mem, ring.cfg.pd, &wr.sg_list, 0, &mut d)
                .map_err(|_| PostError::Invalid)?;
            wr.inline_data = Some(d);
        }
        match self.step_with(ring.lane, Round::Transmit, |core| {
            core.post_send_now(ring, wr)
        }) {
            Some((_, Some(r))) => r,
            // A fault contained while posting: the QPs are in error now.
            Some((_, None)) => Err(PostError::Stopped),
            None => {
                ring.send.push(wr).map_err(|_| PostError::Full)?;
                self.shared.doorbells[ring.lane].ring(ring.qpn.value());
                // Whoever holds the core takes it at its next step; if
                // that thread just let go, this step takes it.
                self.progress_transmit();
                Ok(())
            }
        }
    }

    /// `ibv_post_recv`: checked now ([`QpConfig::check_recv`]), then into
    /// the transport directly when the core is free, else through the ring.
    pub fn post_recv(&self, qpn: Qpn, wr: &RecvWr) -> Result<(), PostError> {
        self.post_recv_to(&*self.ring(qpn)?, wr)
    }

    fn post_recv_to(&self, ring: &QpRings, wr: &RecvWr) -> Result<(), PostError> {
        ring.cfg.check_recv(wr).map_err(PostError::Refused)?;
        if self.device_failed() {
            return Err(PostError::Stopped);
        }
        // Receives may be posted from INIT on (IBA C10-49; in ERR they are
        // flushed); the queue's depth bounds outstanding WRs.
        let state = ring.words.state();
        if state == QpState::Reset {
            return Err(PostError::Refused(VerbsError::InvalidState(state)));
        }
        if !ring.words.reserve(true, ring.cfg.max_recv_wr) {
            return Err(PostError::Refused(VerbsError::QueueFull));
        }
        let r = self.post_recv_reserved(ring, wr);
        if r.is_err() {
            ring.words.unreserve(true);
        }
        r
    }

    fn post_recv_reserved(&self, ring: &QpRings, wr: &RecvWr) -> Result<(), PostError> {
        // No step: the next post_send or poll of an empty CQ steps. Stepping
        // here would send the deferred ACK of the message just received
        // alone, a system call before the reply the application is about to
        // post and it could ride with (ping-pong: four sends per round trip
        // instead of two).
        let sh = &*self.shared;
        if let Some(Ok(mut core)) = sh.cores.get(ring.lane).map(|c| c.try_lock()) {
            if let Some(r) = core.contained(sh, |c| c.post_recv_now(ring, *wr)) {
                return r;
            }
            return Err(PostError::Stopped);
        }
        ring.recv.push(*wr).map_err(|_| PostError::Full)?;
        sh.doorbells[ring.lane].ring(ring.qpn.value());
        Ok(())
    }

    /// Takes a completion from a CQ ring (never blocks; steps the data
    /// plane once when the ring is empty).
    pub fn poll_cq(&self, cq: CqId) -> Option<WorkCompletion> {
        let q = self.cq_ref(cq).ok()?;
        q.ring.pop().or_else(|| {
            self.progress();
            q.ring.pop()
        })
    }

    /// Takes a completion already in a CQ ring, without stepping the data
    /// plane (a caller that steps it itself, such as a simulator).
    pub fn take_completion(&self, cq: CqId) -> Option<WorkCompletion> {
        self.cq_ref(cq).ok()?.ring.pop()
    }

    /// A handle on CQ `cq` that polls without any lookup.
    pub fn cq(&self, cq: CqId) -> Option<CompletionQueue> {
        self.cq_ref(cq).ok().map(|q| CompletionQueue {
            id: cq,
            cq: q,
            ctx: self.clone(),
        })
    }
}

/// Why a create/destroy call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateError {
    /// The engine could not be reached, or an ID was unknown.
    Post(PostError),
    /// The transport refused (with rdma-core's errno in [`VerbsError::errno`]).
    Verbs(VerbsError),
}

impl std::fmt::Display for CreateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CreateError::Post(p) => write!(f, "{p}"),
            CreateError::Verbs(v) => write!(f, "{v}"),
        }
    }
}

impl std::error::Error for CreateError {}

impl From<PostError> for CreateError {
    fn from(e: PostError) -> CreateError {
        CreateError::Post(e)
    }
}

impl CreateError {
    /// The errno rdma-core would return.
    pub fn errno(self) -> i32 {
        match self {
            CreateError::Verbs(v) => v.errno(),
            CreateError::Post(PostError::Full) => libc::ENOMEM,
            CreateError::Post(PostError::Stopped) => libc::EIO,
            CreateError::Post(PostError::Busy) => libc::EBUSY,
            CreateError::Post(_) => libc::EINVAL,
        }
    }
}

/// A queue pair (typed handle): posts go straight into its rings.
#[derive(Clone)]
pub struct QueuePair {
    rings: Arc<QpRings>,
    ctx: Context,
}

impl std::fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QueuePair({:#x})", self.rings.qpn.value())
    }
}

impl QueuePair {
    /// Its QP number.
    pub fn qpn(&self) -> Qpn {
        self.rings.qpn
    }

    /// `ibv_post_send` ([`Context::post_send`]).
    pub fn post_send(&self, wr: &SendWr) -> Result<(), PostError> {
        self.ctx.post_send_to(&self.rings, wr)
    }

    /// `ibv_post_recv` ([`Context::post_recv`]).
    pub fn post_recv(&self, wr: &RecvWr) -> Result<(), PostError> {
        self.ctx.post_recv_to(&self.rings, wr)
    }

    /// What the QP was created with (sizes the posts are checked against).
    pub fn config(&self) -> &QpConfig {
        &self.rings.cfg
    }

    /// `ibv_modify_qp`.
    pub fn modify(&self, attr: &QpAttr) -> Result<(), CreateError> {
        self.ctx
            .modify_qp(self.rings.qpn, attr)?
            .map_err(CreateError::Verbs)
    }

    /// Several transitions in one trip ([`Context::modify_qp_steps`]).
    pub fn modify_steps(
        &self,
        attrs: &[QpAttr],
    ) -> Result<Result<(), (usize, VerbsError)>, PostError> {
        self.ctx.modify_qp_steps(self.rings.qpn, attrs)
    }

    /// Takes this RC QP from RESET to RTS towards `peer`
    /// ([`Context::connect_rc`]).
    pub fn connect_rc(&self, peer: &crate::RcPeer, p: &crate::RcParams) -> Result<(), CreateError> {
        self.ctx.connect_rc(self.rings.qpn, peer, p)
    }
}

/// A shared receive queue (typed handle).
#[derive(Clone)]
pub struct SharedReceiveQueue {
    id: SrqId,
    ring: Arc<SrqRing>,
    ctx: Context,
}

impl std::fmt::Debug for SharedReceiveQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedReceiveQueue({})", self.id.0)
    }
}

impl SharedReceiveQueue {
    /// Its handle, for [`QpInit::srq`].
    pub fn id(&self) -> SrqId {
        self.id
    }

    /// `ibv_post_srq_recv`: checked now (SGE count), then into the ring.
    pub fn post_recv(&self, wr: &RecvWr) -> Result<(), PostError> {
        if wr.sg_list.len() > self.ring.max_sge as usize {
            return Err(PostError::Refused(VerbsError::TooManySge));
        }
        self.ring.ring.push(*wr).map_err(|_| PostError::Full)?;
        // SRQs live on lane 0.
        self.ctx.shared.doorbells[0].ring(SRQ_DOORBELL | self.id.0);
        // No step: see `Context::post_recv`.
        Ok(())
    }
}

/// A completion queue (typed handle): polls its ring directly.
#[derive(Clone)]
pub struct CompletionQueue {
    id: CqId,
    cq: Arc<Cq>,
    ctx: Context,
}

impl std::fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CompletionQueue({})", self.id.0)
    }
}

impl CompletionQueue {
    /// Its handle.
    pub fn id(&self) -> CqId {
        self.id
    }

    /// `ibv_poll_cq` for one completion (never blocks; steps the data
    /// plane once when the ring is empty).
    pub fn poll(&self) -> Option<WorkCompletion> {
        self.cq.ring.pop().or_else(|| {
            self.ctx.progress();
            self.cq.ring.pop()
        })
    }

    /// Completions waiting.
    pub fn len(&self) -> usize {
        self.cq.ring.len()
    }

    /// The device failed for good (a daemon client whose burstd died).
    pub fn device_failed(&self) -> bool {
        self.ctx.device_failed()
    }

    /// No completion waiting.
    pub fn is_empty(&self) -> bool {
        self.cq.ring.is_empty()
    }
}

/// What burstd keeps per client in the engine: the segment the client
/// maps (its async-event ring, then one doorbell queue per lane) and the
/// write end of the pipe behind the client's async-event descriptor.
#[derive(Debug)]
pub struct ClientLink {
    owner: u32,
    seg: Arc<Segment>,
    events: ShmRing<AsyncEvent>,
    events_fd: crate::eventfd::EventFd,
    /// The layout, as [`crate::protocol::Reply::Hello`] announces it.
    pub layout: ClientLayout,
}

/// Where things sit in a client's segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientLayout {
    /// Slots of the async-event ring at offset 0.
    pub event_slots: u32,
    /// Where lane 0's doorbells start.
    pub bells_offset: u64,
    /// Bytes per lane's doorbells.
    pub bells_stride: u64,
    /// Doorbells per lane.
    pub bells_depth: u32,
    /// Bytes of the segment.
    pub len: u64,
}

impl ClientLink {
    /// The segment to send to the client.
    pub fn segment(&self) -> &Segment {
        &self.seg
    }

    /// Queues an asynchronous event for the client and signals its fd
    /// (never blocks: the pipe's write end is the daemon's, non-blocking).
    pub fn push_event(&self, ev: AsyncEvent) {
        if self.events.push(ev).is_ok() {
            self.events_fd.signal();
        } else {
            tracing::warn!(client = self.owner, "async event ring full: {ev:?} dropped");
        }
    }
}

/// Everything one daemon client owns (the `burst` tool, cleanup).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Owned {
    /// Protection domains.
    pub pds: Vec<u32>,
    /// Memory regions: (lkey, bytes, zero-copy mapping).
    pub mrs: Vec<(u32, u64, bool)>,
    /// CQs.
    pub cqs: Vec<CqId>,
    /// QPs.
    pub qps: Vec<Qpn>,
    /// SRQs.
    pub srqs: Vec<SrqId>,
}

/// Async events a client's ring holds.
const CLIENT_EVENTS: usize = 256;

impl Context {
    /// This engine's handle for daemon client `owner`: every object it
    /// creates belongs to `owner`, and it reaches no other's.
    pub fn for_client(&self, owner: u32) -> Context {
        let mut c = self.clone();
        c.owner = owner;
        c
    }

    /// The client this handle acts for (0: the engine's own process).
    pub fn owner(&self) -> u32 {
        self.owner
    }

    /// Sets up client `self.owner()`'s segment (async events and
    /// doorbells, which the engine starts reading now), the pipe behind its
    /// async-event descriptor and its wake pipes. Returns the link and the
    /// descriptors to send: the async events' read end, then one wake
    /// write end per lane.
    pub fn attach_client(&self) -> std::io::Result<(ClientLink, Vec<std::os::fd::OwnedFd>)> {
        let lanes = self.shared.doorbells.len();
        let event_bytes = ShmRing::<AsyncEvent>::bytes(CLIENT_EVENTS).div_ceil(64) * 64;
        let stride = Doorbells::bytes(Doorbells::CLIENT_DEPTH).div_ceil(64) * 64;
        let len = event_bytes + lanes * stride;
        let seg = Arc::new(Segment::memfd(
            &format!("burst-client-{}", self.owner),
            len,
        )?);
        let events = ShmRing::create(Arc::clone(&seg), 0, CLIENT_EVENTS)?;
        let (events_reader, events_fd) = crate::eventfd::EventFd::pipe(false)?;
        let mut handout: Vec<std::os::fd::OwnedFd> = vec![events_reader.into()];
        handout.extend(self.shared.wake.add_client(self.owner)?);
        let mut bells = Vec::new();
        for lane in 0..lanes {
            bells.push(Arc::new(Doorbells::create(
                Arc::clone(&seg),
                event_bytes + lane * stride,
                Doorbells::CLIENT_DEPTH,
                self.owner,
                None,
                lane,
            )?));
        }
        self.shared
            .client_bells
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .extend(bells);
        let link = ClientLink {
            owner: self.owner,
            layout: ClientLayout {
                event_slots: CLIENT_EVENTS as u32,
                bells_offset: event_bytes as u64,
                bells_stride: stride as u64,
                bells_depth: Doorbells::CLIENT_DEPTH as u32,
                len: seg.len() as u64,
            },
            seg,
            events,
            events_fd,
        };
        Ok((link, handout))
    }

    /// The segment of words that say which lanes sleep (every client maps it).
    pub fn wake_segment(&self) -> &Segment {
        self.shared.wake.segment()
    }

    /// Every object client `self.owner()` owns.
    pub fn owned(&self) -> Owned {
        let o = self.owner;
        let sh = &self.shared;
        let mut pds: Vec<u32> = sh
            .pd_owner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, w)| **w == o)
            .map(|(p, _)| *p)
            .collect();
        pds.sort_unstable();
        let mut mrs: Vec<(u32, u64, bool)> = sh
            .mr_owner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, (w, _))| *w == o)
            .map(|(k, (_, seg))| (*k, sh.mrs.lookup(*k).map_or(0, |r| r.len()), seg.is_some()))
            .collect();
        mrs.sort_unstable();
        let cqs = sh
            .cqs
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .enumerate()
            .filter(|(_, q)| q.as_ref().is_some_and(|q| q.owner == o))
            .map(|(i, _)| CqId(i as u32))
            .collect();
        let qps = sh
            .rings
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .flatten()
            .filter(|r| r.owner == o)
            .map(|r| r.qpn)
            .collect();
        let srqs = sh
            .srqs
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .enumerate()
            .filter(|(_, s)| s.as_ref().is_some_and(|s| s.owner == o))
            .map(|(i, _)| SrqId(i as u32))
            .collect();
        Owned {
            pds,
            mrs,
            cqs,
            qps,
            srqs,
        }
    }

    /// Destroys everything client `self.owner()` owns (it died or left):
    /// its QPs first (peers then meet a QP that no longer exists, as with
    /// an RNIC whose QP was destroyed), then SRQs, CQs, regions and PDs,
    /// and stops reading its doorbells.
    pub fn destroy_owned(&self) -> Owned {
        let all = self.owned();
        for q in &all.qps {
            if let Err(e) = self.destroy_qp(*q) {
                tracing::warn!(qpn = q.value(), "cleanup: destroy QP: {e}");
            }
        }
        for s in &all.srqs {
            if let Err(e) = self.destroy_srq(*s) {
                tracing::warn!(srq = s.0, "cleanup: destroy SRQ: {e}");
            }
        }
        for c in &all.cqs {
            if let Err(e) = self.destroy_cq(*c) {
                tracing::warn!(cq = c.0, "cleanup: destroy CQ: {e:?}");
            }
        }
        // Windows before regions: a region with windows bound stays.
        let windows: Vec<u32> = self
            .shared
            .mw_owner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, o)| **o == self.owner)
            .map(|(h, _)| *h)
            .collect();
        for h in windows {
            if let Err(e) = self.dealloc_mw(h) {
                tracing::warn!(handle = h, "cleanup: dealloc MW: {e}");
            }
        }
        let ahs: Vec<u32> = self
            .shared
            .ahs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .by_index
            .iter()
            .filter(|(_, k)| k.0 == self.owner)
            .map(|(i, _)| *i)
            .collect();
        for ah in ahs {
            if let Err(e) = self.release_ah(ah, true) {
                tracing::warn!(ah, "cleanup: destroy AH: {e}");
            }
        }
        for (k, _, _) in &all.mrs {
            if let Err(e) = self.dereg_mr(*k) {
                tracing::warn!(lkey = k, "cleanup: deregister: {e}");
            }
        }
        for p in &all.pds {
            if let Err(e) = self.dealloc_pd(Pd(*p)) {
                tracing::warn!(pd = p, "cleanup: dealloc PD: {e:?}");
            }
        }
        self.shared
            .client_bells
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|b| b.owner != self.owner);
        self.shared.wake.remove_client(self.owner);
        all
    }

    /// The client that owns QP `qpn` (event routing).
    pub fn owner_of_qp(&self, qpn: Qpn) -> Option<u32> {
        let rings = self.shared.rings.read().unwrap_or_else(|e| e.into_inner());
        match rings.get(qpn.value().wrapping_sub(FIRST_QPN) as usize) {
            Some(Some(r)) => Some(r.owner),
            _ => None,
        }
    }

    /// The client that owns CQ `cq` (event routing).
    pub fn owner_of_cq(&self, cq: CqId) -> Option<u32> {
        let cqs = self.shared.cqs.read().unwrap_or_else(|e| e.into_inner());
        cqs.get(cq.0 as usize)?.as_ref().map(|c| c.owner)
    }

    /// The client that owns SRQ `srq` (event routing).
    pub fn owner_of_srq(&self, srq: SrqId) -> Option<u32> {
        let srqs = self.shared.srqs.read().unwrap_or_else(|e| e.into_inner());
        srqs.get(srq.0 as usize)?.as_ref().map(|s| s.owner)
    }

    /// Whether this is a daemon client whose daemon is gone (every verb
    /// fails; the async fd reported `DeviceFatal`).
    pub fn device_failed(&self) -> bool {
        self.remote.as_ref().is_some_and(|r| r.is_dead())
    }

    /// Sends `req` to burstd and returns its reply (the `burst` tool's
    /// queries); `Invalid` on an embedded context.
    pub fn daemon_request(
        &self,
        req: &crate::protocol::Request,
        fds: &[std::os::fd::BorrowedFd<'_>],
    ) -> Result<(crate::protocol::Reply, Vec<std::os::fd::OwnedFd>), PostError> {
        self.remote
            .as_ref()
            .ok_or(PostError::Invalid)?
            .call(req, fds)
    }

    /// burstd's number for this client.
    pub fn client_id(&self) -> Option<u32> {
        self.remote.as_ref().map(|r| r.client())
    }

    /// Whether this context is a burstd client.
    pub fn is_daemon_client(&self) -> bool {
        self.remote.is_some()
    }

    /// Connects to burstd at `path` (daemon mode): the device is the
    /// daemon's, rings and doorbells are memory shared with it.
    pub fn connect(path: &std::path::Path) -> std::io::Result<Context> {
        Context::connect_with(path, crate::client::MrMode::from_env())
    }

    /// [`Context::connect`], registering memory as `mode` says (remapped
    /// onto shared memfds, or copied by the daemon).
    pub fn connect_with(
        path: &std::path::Path,
        mode: crate::client::MrMode,
    ) -> std::io::Result<Context> {
        use crate::protocol::{self as p, Reply, Request};
        use std::os::fd::AsFd;
        let sock = p::connect(path).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("burst: cannot reach burstd at {}: {e}", path.display()),
            )
        })?;
        p::send(
            sock.as_fd(),
            &p::encode(&Request::Hello {
                version: p::VERSION,
                layout: p::layout(),
            }),
            &[],
        )?;
        let bad = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidData, m);
        let (msg, fds) =
            p::recv(sock.as_fd())?.ok_or_else(|| bad("burstd closed the socket".into()))?;
        let reply = p::decode::<Reply>(&msg).map_err(|e| bad(format!("burstd: {e}")))?;
        let Reply::Hello {
            device,
            client,
            event_slots,
            bells_offset,
            bells_stride,
            bells_depth,
            segment_len,
            wake_len,
        } = reply
        else {
            return Err(match reply {
                Reply::Error { errno, message, .. } => std::io::Error::new(
                    std::io::Error::from_raw_os_error(errno).kind(),
                    format!("burstd refused this client: {message}"),
                ),
                _ => bad("burstd: unexpected reply to hello".into()),
            });
        };
        let lanes = device.lanes.max(1) as usize;
        let mut fds = fds.into_iter();
        let (Some(seg_fd), Some(wake_fd), Some(events_fd)) = (fds.next(), fds.next(), fds.next())
        else {
            return Err(bad("burstd: hello without its segments".into()));
        };
        let seg = Arc::new(Segment::from_fd(seg_fd, segment_len as usize)?);
        let wake_fds = fds
            .map(crate::eventfd::EventFd::pipe_writer)
            .collect::<std::io::Result<Vec<_>>>()?;
        if wake_fds.len() != lanes {
            return Err(bad("burstd: one wake pipe per lane expected".into()));
        }
        let wake = Arc::new(Wake::attach(
            Arc::new(Segment::from_fd(wake_fd, wake_len as usize)?),
            wake_fds,
        )?);
        let doorbells = (0..lanes)
            .map(|l| {
                Doorbells::attach(
                    Arc::clone(&seg),
                    bells_offset as usize + l * bells_stride as usize,
                    bells_depth as usize,
                    Some(Arc::clone(&wake)),
                    l,
                )
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        let events = AsyncEvents {
            fd: crate::eventfd::EventFd::pipe_reader(events_fd),
            queue: SegQueue::new(),
            remote: Some(ShmRing::attach(Arc::clone(&seg), 0, event_slots as usize)?),
            port_down: AtomicBool::new(false),
        };
        let shared = Arc::new(Shared {
            mrs: Arc::default(),
            doorbells,
            client_bells: Default::default(),
            wake,
            memfd: false,
            pd_owner: Default::default(),
            mr_owner: Default::default(),
            mw_owner: Default::default(),
            ahs: Default::default(),
            rings: Default::default(),
            srqs: Default::default(),
            cqs: Default::default(),
            events,
            stop: AtomicBool::new(false),
            cores: Vec::new(),
            app_stepped: Default::default(),
            app_posted: Default::default(),
            app_stepping: AtomicBool::new(false),
            clock: Clock::wall(),
            gsi: None,
        });
        let remote = Arc::new(crate::client::Remote::new(sock, client, mode));
        let mtu = Mtu::from_bytes(device.mtu as usize).unwrap_or(Mtu::Mtu1024);
        let ctx = Context {
            shared: Arc::clone(&shared),
            owner: 0,
            remote: Some(Arc::clone(&remote)),
            control: (0..lanes).map(|_| bounded(1).0).collect(),
            next_lane: Arc::default(),
            gid: device.gid,
            config: Arc::new(DeviceConfig {
                name: device.name,
                addr: device.addr,
                interface: device.interface,
                mtu,
                drop_every: 0,
                congestion_control: burst_cc::Algorithm::default(),
                port: Default::default(),
                dpdk: String::new(),
                threads: lanes as u32,
                copy: Default::default(),
            }),
        };
        tracing::info!(
            client,
            socket = %path.display(),
            "burst: daemon mode (burstd serves device {})",
            ctx.config.name
        );
        watch_daemon(Arc::downgrade(&shared), Arc::downgrade(&remote));
        Ok(ctx)
    }
}

/// Watches a client's control socket: when burstd dies the socket hangs
/// up, and every QP's application learns it at once (`DeviceFatal` on the
/// async fd, every verb failing) instead of hanging.
fn watch_daemon(shared: std::sync::Weak<Shared>, remote: std::sync::Weak<crate::client::Remote>) {
    let spawned = std::thread::Builder::new()
        .name("burst-watch".into())
        .spawn(move || loop {
            let Some(r) = remote.upgrade() else {
                return;
            };
            let mut p = libc::pollfd {
                fd: std::os::fd::AsRawFd::as_raw_fd(&r.socket()),
                events: 0,
                revents: 0,
            };
            // SAFETY: one live pollfd.
            let n = unsafe { libc::poll(&mut p, 1, 100) };
            if n > 0 && p.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
                tracing::error!("burst: burstd is gone: every verb fails from now on");
                r.set_dead();
                if let Some(sh) = shared.upgrade() {
                    sh.events.push(AsyncEvent::DeviceFatal);
                }
                return;
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("burst: no thread to watch burstd: {e}");
    }
}
