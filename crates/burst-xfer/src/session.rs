//! A session's logic, whatever verbs run it: batches spread over RC QPs
//! round robin with a bound on outstanding work requests per QP, and one
//! inline SEND per QP a batch used telling the peer its share has landed
//! (RC orders the SEND after the WRITEs before it on the same QP).
//!
//! The QPs themselves are an [`RcQps`]: burst-verbs' own
//! ([`crate::RdmaSession`]) or the system's libibverbs
//! ([`crate::IbvSession`], feature `libibverbs`), so the same workload
//! runs on burst, on kernel RXE and on an RNIC.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::landing::{Landings, Notify, NOTIFY_LEN};
use crate::{check, BatchId, Landed, Op, Pool, Segment, Transfer, XferError};

/// A signalled completion at least this often per QP (the ones between
/// complete with it: RC completes in order).
const SIGNAL_EVERY: usize = 16;
/// Notifications a QP can hold before the peer's next one waits (RNR).
pub(crate) const RECV_SLOTS: usize = 32;
/// Segment bits of a work request ID (the rest is the batch).
const SEG_BITS: u32 = 24;
const NOTIFY_SEG: u64 = (1 << SEG_BITS) - 1;
/// How long a post waits for room on a full QP.
const POST_WAIT: Duration = Duration::from_secs(30);

/// One send work request, in pool terms (the backend turns offsets into
/// addresses and keys).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Work {
    /// RDMA WRITE of `len` bytes from local offset to remote offset.
    Write(Segment),
    /// RDMA READ of `len` bytes from remote offset to local offset.
    Read(Segment),
    /// A SEND carrying these bytes inline.
    Notify([u8; NOTIFY_LEN]),
}

/// A work completion, in session terms.
#[derive(Debug, Clone)]
pub(crate) struct Done {
    pub wr_id: u64,
    /// The QP's index in the session.
    pub lane: usize,
    /// `None`: success; otherwise the status, as the verbs name it.
    pub error: Option<String>,
}

/// The RC QPs under a session, already connected to the peer's, with a
/// send and a receive CQ and `RECV_SLOTS` notification slots per QP.
pub(crate) trait RcQps {
    /// How many QPs.
    fn count(&self) -> usize;
    /// Posts `work` on QP `lane`.
    fn post(&mut self, lane: usize, wr_id: u64, work: &Work, signaled: bool) -> Result<(), String>;
    /// Posts notification slot `slot` (of all QPs': `lane * RECV_SLOTS +
    /// n`) as a receive on its QP, with `slot` as the work request ID.
    fn post_slot(&mut self, slot: usize) -> Result<(), String>;
    /// The notification slots' memory (registered for the QPs' receives).
    fn slots(&self) -> &Pool;
    /// Slot `slot`'s bytes.
    fn slot(&self, slot: usize) -> [u8; NOTIFY_LEN] {
        let mut b = [0u8; NOTIFY_LEN];
        self.slots().read((slot * NOTIFY_LEN) as u64, &mut b);
        b
    }
    /// The next send completion.
    fn poll_send(&mut self) -> Option<Done>;
    /// The next receive completion (`wr_id`: the slot).
    fn poll_recv(&mut self) -> Option<Done>;
}

struct Lane {
    /// Work request IDs posted and not yet known complete, in order.
    posted: VecDeque<u64>,
    unsignaled: usize,
}

struct Batch {
    /// Work requests not yet complete.
    pending: usize,
    bytes: u64,
    error: Option<XferError>,
}

/// The session over QPs `Q`.
pub(crate) struct Session<Q: RcQps> {
    pub qps: Q,
    lanes: Vec<Lane>,
    depth: usize,
    pool_len: u64,
    peer_len: u64,
    next_batch: u64,
    batches: HashMap<u64, Batch>,
    landings: Landings,
    broken: Option<String>,
    next_lane: usize,
    /// Work requests posted and the time spent posting them (waits for
    /// room excluded).
    posts: u64,
    post_time: Duration,
    /// Signalled send WRs not yet completed, and how many the send CQ
    /// holds: a session of many deep QPs shares a CQ smaller than all
    /// their queues, and waits rather than overruns it.
    signaled_out: usize,
    cq_room: usize,
}

impl<Q: RcQps> Session<Q> {
    /// The session over connected `qps` of `depth` send work requests
    /// each, its notification slots posted.
    pub fn new(qps: Q, depth: usize, pool_len: u64, peer_len: u64) -> Result<Self, XferError> {
        let mut s = Session {
            lanes: (0..qps.count())
                .map(|_| Lane {
                    posted: VecDeque::new(),
                    unsignaled: 0,
                })
                .collect(),
            qps,
            depth,
            pool_len,
            peer_len,
            next_batch: 1,
            batches: HashMap::new(),
            landings: Landings::default(),
            broken: None,
            next_lane: 0,
            posts: 0,
            post_time: Duration::ZERO,
            signaled_out: 0,
            cq_room: usize::MAX,
        };
        for slot in 0..s.lanes.len() * RECV_SLOTS {
            s.qps
                .post_slot(slot)
                .map_err(|e| XferError::Setup(format!("posting a receive: {e}")))?;
        }
        Ok(s)
    }

    /// The peer's pool size.
    pub fn peer_len(&self) -> u64 {
        self.peer_len
    }

    /// The send CQ holds `entries` completions: at most that many
    /// signalled WRs are outstanding at once.
    pub fn limit_signaled(&mut self, entries: usize) {
        self.cq_room = entries.max(1);
    }

    /// Posts one work request on `lane`, waiting while the lane is full
    /// (or, for one to be signalled, the send CQ).
    fn post(&mut self, lane: usize, wr_id: u64, work: &Work, last: bool) -> Result<(), XferError> {
        let deadline = Instant::now() + POST_WAIT;
        // Often enough that a full queue always holds a signalled one.
        let every = (self.depth / 2).clamp(1, SIGNAL_EVERY);
        let signaled = last || self.lanes[lane].unsignaled + 1 >= every;
        while self.lanes[lane].posted.len() >= self.depth - 1
            || (signaled && self.signaled_out >= self.cq_room)
        {
            self.progress();
            // Let the engine (and the peer, on a small host) run.
            std::thread::yield_now();
            if let Some(b) = &self.broken {
                return Err(XferError::Broken(b.clone()));
            }
            if Instant::now() > deadline {
                return Err(XferError::Timeout(POST_WAIT));
            }
        }
        let l = &mut self.lanes[lane];
        let t = Instant::now();
        let r = self.qps.post(lane, wr_id, work, signaled);
        self.post_time += t.elapsed();
        self.posts += 1;
        r.map_err(|e| XferError::Segment {
            batch: wr_id >> SEG_BITS,
            segment: segment_of(wr_id),
            status: format!("post: {e}"),
        })?;
        l.posted.push_back(wr_id);
        l.unsignaled = if signaled { 0 } else { l.unsignaled + 1 };
        self.signaled_out += usize::from(signaled);
        Ok(())
    }

    /// Takes completions: the send queue's (batches done or failed) and
    /// the receive queue's (the peer's notifications).
    pub fn progress(&mut self) {
        while let Some(wc) = self.qps.poll_send() {
            self.on_send_completion(wc);
        }
        while let Some(wc) = self.qps.poll_recv() {
            if let Some(e) = wc.error {
                self.broken.get_or_insert_with(|| format!("receive: {e}"));
                continue;
            }
            let slot = wc.wr_id as usize;
            if slot < self.lanes.len() * RECV_SLOTS {
                self.landings.bytes(&self.qps.slot(slot));
                if let Err(e) = self.qps.post_slot(slot) {
                    self.broken
                        .get_or_insert_with(|| format!("posting a receive: {e}"));
                }
            }
        }
    }

    fn on_send_completion(&mut self, wc: Done) {
        // One per signalled WR (and flushed ones: never below zero).
        self.signaled_out = self.signaled_out.saturating_sub(1);
        let lane = wc.lane.min(self.lanes.len().saturating_sub(1));
        if let Some(status) = wc.error {
            let batch = wc.wr_id >> SEG_BITS;
            let e = XferError::Segment {
                batch,
                segment: segment_of(wc.wr_id),
                status,
            };
            self.broken.get_or_insert_with(|| e.to_string());
            // The QP is in error: everything in flight on it fails.
            for id in self.lanes[lane].posted.drain(..) {
                if let Some(b) = self.batches.get_mut(&(id >> SEG_BITS)) {
                    b.pending = 0;
                    b.error.get_or_insert_with(|| e.clone());
                }
            }
            if let Some(b) = self.batches.get_mut(&batch) {
                b.error = Some(e);
            }
            return;
        }
        // RC completes in order: everything up to this one is done.
        let l = &mut self.lanes[lane];
        while let Some(id) = l.posted.pop_front() {
            if let Some(b) = self.batches.get_mut(&(id >> SEG_BITS)) {
                b.pending = b.pending.saturating_sub(1);
            }
            if id == wc.wr_id {
                break;
            }
        }
    }

    fn fail_batch(&mut self, id: u64, e: &XferError) {
        if let Some(b) = self.batches.get_mut(&id) {
            b.error.get_or_insert_with(|| e.clone());
        }
    }

    /// Progresses until `ready` says so, the session breaks or `timeout`.
    fn until<T>(
        &mut self,
        timeout: Duration,
        mut ready: impl FnMut(&mut Self) -> Option<Result<T, XferError>>,
    ) -> Result<T, XferError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(r) = ready(self) {
                return r;
            }
            if Instant::now() > deadline {
                return Err(XferError::Timeout(timeout));
            }
            self.progress();
            // Let the engine (and the peer, on a small host) run.
            std::thread::yield_now();
        }
    }
}

fn segment_of(wr_id: u64) -> Option<usize> {
    match wr_id & NOTIFY_SEG {
        NOTIFY_SEG => None,
        s => Some(s as usize),
    }
}

impl<Q: RcQps> Transfer for Session<Q> {
    fn post_stats(&self) -> Option<(u64, Duration)> {
        Some((self.posts, self.post_time))
    }

    fn submit(&mut self, op: Op, segments: &[Segment]) -> Result<BatchId, XferError> {
        if let Some(b) = &self.broken {
            return Err(XferError::Broken(b.clone()));
        }
        if segments.len() as u64 >= NOTIFY_SEG {
            return Err(XferError::Unsupported("more than 16M segments in a batch"));
        }
        let bytes = check(segments, self.pool_len, self.peer_len)?;
        let id = self.next_batch;
        self.next_batch += 1;
        let n = self.lanes.len();
        // Whole batches round robin over the QPs when small, segments
        // round robin when the batch can use them all.
        let first = self.next_lane;
        self.next_lane = (self.next_lane + 1) % n;
        let used = n.min(segments.len().max(1));
        let mut share = vec![0u64; n];
        self.batches.insert(
            id,
            Batch {
                pending: segments.len() + if op == Op::Write { used } else { 0 },
                bytes,
                error: None,
            },
        );
        let mut last_on = vec![usize::MAX; n];
        for i in 0..segments.len() {
            last_on[(first + i) % n] = i;
        }
        for (i, s) in segments.iter().enumerate() {
            let lane = (first + i) % n;
            share[lane] += u64::from(s.len);
            let work = match op {
                Op::Write => Work::Write(*s),
                Op::Read => Work::Read(*s),
            };
            let last = op == Op::Read && last_on[lane] == i;
            if let Err(e) = self.post(lane, (id << SEG_BITS) | i as u64, &work, last) {
                self.fail_batch(id, &e);
                return Err(e);
            }
        }
        if op == Op::Write {
            for k in 0..used {
                let lane = (first + k) % n;
                let note = Notify {
                    batch: id,
                    bytes: share[lane],
                    shares: used as u32,
                };
                let work = Work::Notify(note.encode());
                if let Err(e) = self.post(lane, (id << SEG_BITS) | NOTIFY_SEG, &work, true) {
                    self.fail_batch(id, &e);
                    return Err(e);
                }
            }
        }
        Ok(BatchId(id))
    }

    fn wait(&mut self, id: BatchId, timeout: Duration) -> Result<u64, XferError> {
        self.until(timeout, |s| {
            let Some(b) = s.batches.get(&id.0) else {
                return Some(Err(XferError::NoSuchBatch(id.0)));
            };
            let r = match &b.error {
                Some(e) => Err(e.clone()),
                None if b.pending == 0 => Ok(b.bytes),
                None => return None,
            };
            s.batches.remove(&id.0);
            Some(r)
        })
    }

    fn wait_landed(&mut self, timeout: Duration) -> Result<Landed, XferError> {
        self.until(timeout, |s| {
            if let Some(l) = s.landings.next() {
                return Some(Ok(l));
            }
            s.broken.clone().map(|b| Err(XferError::Broken(b)))
        })
    }
}

/// Implements [`Transfer`] for a wrapper whose `inner` is a [`Session`].
macro_rules! transfer_by_session {
    ($t:ty) => {
        impl $crate::Transfer for $t {
            fn submit(
                &mut self,
                op: $crate::Op,
                segments: &[$crate::Segment],
            ) -> Result<$crate::BatchId, $crate::XferError> {
                self.inner.submit(op, segments)
            }
            fn wait(
                &mut self,
                id: $crate::BatchId,
                timeout: std::time::Duration,
            ) -> Result<u64, $crate::XferError> {
                self.inner.wait(id, timeout)
            }
            fn wait_landed(
                &mut self,
                timeout: std::time::Duration,
            ) -> Result<$crate::Landed, $crate::XferError> {
                self.inner.wait_landed(timeout)
            }
            fn post_stats(&self) -> Option<(u64, std::time::Duration)> {
                self.inner.post_stats()
            }
        }
    };
}
pub(crate) use transfer_by_session;
