//! The rings a QP or SRQ shares with the engine (work requests, state words) and the doorbell queues that announce them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::shm::{Segment, ShmRing};

use burst_transport::{QpConfig, QpState, RecvWr, SendWr};

use crate::QpInit;
use burst_wire::Qpn;

use super::*;

/// The MPSC doorbell queue: posting threads push the QPN (or SRQ) whose ring
/// has new entries, the engine pops them. A [`ShmRing`] (in daemon mode in
/// memory each client shares with burstd, one per client and lane), bounded
/// so that ringing never allocates; a doorbell that finds the queue full
/// sets a flag that makes the engine visit every ring of that client once,
/// so no posted WQE waits forever.
#[derive(Debug)]
pub(crate) struct Doorbells {
    pub(super) queue: ShmRing<u32>,
    /// Whose rings these doorbells may name (0: the engine's own process).
    pub(super) owner: u32,
    /// Wakes an engine that went to sleep (daemon mode).
    pub(super) wake: Option<Arc<Wake>>,
    pub(super) lane: usize,
    /// Where in the segment these doorbells start.
    pub(super) off: usize,
}

/// Word 0 of a doorbell segment: the overflow flag; the ring at 64.
pub(super) const BELL_RING: usize = 64;

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

    pub(super) fn new() -> std::io::Result<Doorbells> {
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

    pub(super) fn overflow(&self) -> &std::sync::atomic::AtomicU32 {
        self.queue.segment().word(self.off)
    }

    pub(super) fn ring(&self, bell: u32) {
        if self.queue.push(bell).is_err() {
            self.overflow().store(1, Ordering::Release);
        }
        if let Some(w) = &self.wake {
            w.nudge(self.lane);
        }
    }

    pub(super) fn pop(&self) -> Option<u32> {
        self.queue.pop()
    }

    pub(super) fn take_overflow(&self) -> bool {
        // A plain load first: the locked swap only when there is one
        // (every step looks, a queue almost never overflows).
        let word = self.overflow();
        word.load(Ordering::Acquire) != 0 && word.swap(0, Ordering::AcqRel) != 0
    }
}

/// Every daemon client's doorbells (each for one lane), with their count
/// beside them: a step of an engine that serves no client (every embedded
/// one) looks at the count, not the lock.
#[derive(Debug, Default)]
pub(super) struct ClientBells {
    bells: std::sync::RwLock<Vec<Arc<Doorbells>>>,
    count: std::sync::atomic::AtomicUsize,
}

impl ClientBells {
    /// Adds a client's doorbells.
    pub(super) fn add(&self, bells: impl IntoIterator<Item = Arc<Doorbells>>) {
        let mut all = self.bells.write().unwrap_or_else(|e| e.into_inner());
        all.extend(bells);
        self.count.store(all.len(), Ordering::Release);
    }

    /// Removes client `owner`'s doorbells.
    pub(super) fn remove(&self, owner: u32) {
        let mut all = self.bells.write().unwrap_or_else(|e| e.into_inner());
        all.retain(|b| b.owner != owner);
        self.count.store(all.len(), Ordering::Release);
    }

    /// The doorbells, read-locked; `None` when no client has any. (A
    /// client's first doorbells may be missed by a step that looks as they
    /// are added: its nudge brings the next.)
    pub(super) fn read(&self) -> Option<std::sync::RwLockReadGuard<'_, Vec<Arc<Doorbells>>>> {
        if self.count.load(Ordering::Acquire) == 0 {
            return None;
        }
        Some(self.bells.read().unwrap_or_else(|e| e.into_inner()))
    }
}

/// The shape of a QP's two rings, from the capabilities it was created
/// with: slots for its depths, entries as large as its SGEs and inline
/// data need (as an RNIC sizes its WQEs: perftest's one-SGE QP takes 80
/// bytes per send entry where the largest WR takes 320). Both sides of a
/// daemon-mode QP compute it from the same `QpInit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QpShape {
    /// Send ring slots and bytes per entry.
    pub(crate) send: (usize, usize),
    /// Receive ring slots and bytes per entry.
    pub(crate) recv: (usize, usize),
}

impl QpShape {
    /// The rings of a QP created with `init` (the SGE limit is the one
    /// the QP's configuration checks both queues by).
    pub(crate) fn of(init: &QpInit) -> QpShape {
        let c = init.caps;
        let sge = c.max_send_sge.max(c.max_recv_sge).max(1);
        QpShape {
            send: (
                ShmRing::<SendWr>::slots_for(c.max_send_wr as usize),
                crate::entry::send_entry_size(sge, c.max_inline_data),
            ),
            recv: (
                ShmRing::<RecvWr>::slots_for(c.max_recv_wr as usize),
                crate::entry::recv_entry_size(sge),
            ),
        }
    }

    /// Where the two rings sit in the QP's segment: (send, receive, total
    /// bytes). The shared words come first, the send ring's header on the
    /// same page: an idle QP touches two pages of its segment (that one
    /// and the receive ring's header), not one per ring and the words.
    pub(crate) fn layout(&self) -> (usize, usize, usize) {
        let send = QpWords::BYTES;
        let recv =
            (send + ShmRing::<SendWr>::bytes_sized(self.send.0, self.send.1)).div_ceil(64) * 64;
        let end = recv + ShmRing::<RecvWr>::bytes_sized(self.recv.0, self.recv.1);
        (send, recv, end)
    }
}

/// Words a QP's front end and engine share after its rings: the state the
/// application last gave the QP (which posts it allows) and, per queue,
/// the WRs posted and those the engine retired, so that a post finds a
/// full queue as `ibv_post_*` does (ENOMEM), by outstanding work rather
/// than by room in the ring. A client that scribbles on them only misleads
/// its own posts: the transport checks state and depth again.
pub(super) struct QpWords {
    pub(super) seg: Arc<Segment>,
    pub(super) at: usize,
}

impl QpWords {
    const BYTES: usize = 64;
    const STATE: usize = 0;
    const SEND_POSTED: usize = 8;
    const SEND_RETIRED: usize = 16;
    const RECV_POSTED: usize = 24;
    const RECV_RETIRED: usize = 32;

    pub(super) fn word(&self, w: usize) -> &AtomicU64 {
        self.seg.word64(self.at + w)
    }

    pub(super) fn state(&self) -> QpState {
        let v = self.word(Self::STATE).load(Ordering::Acquire);
        u32::try_from(v)
            .ok()
            .and_then(QpState::from_ibv)
            .unwrap_or(QpState::Reset)
    }

    pub(super) fn set_state(&self, s: QpState) {
        self.word(Self::STATE)
            .store(u64::from(s.ibv()), Ordering::Release);
    }

    /// Takes a place in a queue of depth `depth` (`recv`: the receive
    /// queue); `false` when outstanding work fills it.
    pub(super) fn reserve(&self, recv: bool, depth: u32) -> bool {
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
    pub(super) fn unreserve(&self, recv: bool) {
        let p = if recv {
            Self::RECV_POSTED
        } else {
            Self::SEND_POSTED
        };
        self.word(p).fetch_sub(1, Ordering::AcqRel);
    }

    /// Whether WRs posted to either queue are not retired yet.
    pub(super) fn outstanding(&self) -> bool {
        let (sp, sr) = (self.word(Self::SEND_POSTED), self.word(Self::SEND_RETIRED));
        let (rp, rr) = (self.word(Self::RECV_POSTED), self.word(Self::RECV_RETIRED));
        sp.load(Ordering::Acquire) != sr.load(Ordering::Acquire)
            || rp.load(Ordering::Acquire) != rr.load(Ordering::Acquire)
    }

    /// The engine: WRs retired so far (send, receive).
    pub(super) fn set_retired(&self, send: u64, recv: u64) {
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
pub(crate) struct QpRings {
    pub(super) qpn: Qpn,
    /// The engine thread (lane) that owns the QP.
    pub(super) lane: usize,
    pub(super) cfg: QpConfig,
    pub(super) send: ShmRing<SendWr>,
    pub(super) recv: ShmRing<RecvWr>,
    pub(super) send_cq: CqId,
    pub(super) recv_cq: CqId,
    /// The daemon client that created it (0: the engine's own process).
    pub(super) owner: u32,
    pub(super) words: QpWords,
    /// WRs the engine took from the rings and refused (completed in
    /// error): retired without reaching the transport (send, receive).
    pub(super) refused: (AtomicU64, AtomicU64),
}

impl QpRings {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        seg: Arc<Segment>,
        shape: QpShape,
        fresh: bool,
        qpn: Qpn,
        lane: usize,
        cfg: QpConfig,
        cqs: (CqId, CqId),
        owner: u32,
    ) -> std::io::Result<QpRings> {
        let (s_off, r_off, _) = shape.layout();
        let (s, r) = (shape.send, shape.recv);
        let words = QpWords {
            seg: Arc::clone(&seg),
            at: 0,
        };
        let (send, recv) = if fresh {
            (
                ShmRing::create_sized(Arc::clone(&seg), s_off, s.0, s.1)?,
                ShmRing::create_sized(seg, r_off, r.0, r.1)?,
            )
        } else {
            (
                ShmRing::attach_sized(Arc::clone(&seg), s_off, s.0, s.1)?,
                ShmRing::attach_sized(seg, r_off, r.0, r.1)?,
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
pub(super) struct SrqRing {
    pub(super) ring: ShmRing<RecvWr>,
    pub(super) max_sge: u32,
    pub(super) owner: u32,
}

/// Doorbells carry a QPN (24 bits) or, with this bit, an SRQ index.
pub(super) const SRQ_DOORBELL: u32 = 1 << 31;

/// ... or, with this bit, a CQ index: the CQ was armed over completions
/// that raised no event (`Cq::arm`), and the engine signals its channel.
pub(super) const CQ_DOORBELL: u32 = 1 << 30;
