//! The RDMA session: several RC QPs to one peer, batches spread over them
//! round robin with a bound on outstanding work requests per QP, and one
//! inline SEND per QP a batch used telling the peer its share has landed
//! (RC orders the SEND after the WRITEs before it on the same QP).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use burst_verbs::engine::{CompletionQueue, Context, QueuePair};
use burst_verbs::rdma_cm::{CmId, EventChannel};
use burst_verbs::{
    InlineData, Mtu, Psn, QpAccess, QpInit, QpType, RcParams, RcPeer, RecvWr, SendOp, SendWr, Sge,
    WcStatus, WorkCompletion,
};

use crate::landing::{Landings, Notify, NOTIFY_LEN};
use crate::{check, BatchId, Landed, Op, Pool, Segment, Transfer, XferError};

/// A signalled completion at least this often per QP (the ones between
/// complete with it: RC completes in order).
const SIGNAL_EVERY: usize = 16;
/// Notifications a QP can hold before the peer's next one waits (RNR).
const RECV_SLOTS: usize = 32;
/// Segment bits of a work request ID (the rest is the batch).
const SEG_BITS: u32 = 24;
const NOTIFY_SEG: u64 = (1 << SEG_BITS) - 1;

/// How a session is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionOptions {
    /// RC QPs (batches are spread over them).
    pub qps: usize,
    /// Work requests outstanding per QP at most (its send queue depth).
    pub depth: u32,
    /// Path MTU.
    pub mtu: Mtu,
    /// Local ACK timeout exponent (4.096 us * 2^t) and retries: how long
    /// a peer that went away takes to be noticed.
    pub timeout: u8,
    /// Transport retries (0..=7).
    pub retry_cnt: u8,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            qps: 4,
            depth: 256,
            mtu: Mtu::Mtu4096,
            timeout: 14,
            retry_cnt: 7,
        }
    }
}

/// What the peer needs to reach this side (exchanged out of band: see
/// [`Endpoint::to_bytes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The device's GID.
    pub gid: [u8; 16],
    /// Each QP's number and starting PSN.
    pub qps: Vec<(u32, u32)>,
    /// The pool's address, length and rkey.
    pub addr: u64,
    /// The pool's length.
    pub len: u64,
    /// The pool's rkey.
    pub rkey: u32,
}

impl Endpoint {
    /// Its bytes (little-endian; what [`Endpoint::from_bytes`] reads).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(40 + 8 * self.qps.len());
        b.extend_from_slice(&self.gid);
        b.extend_from_slice(&self.addr.to_le_bytes());
        b.extend_from_slice(&self.len.to_le_bytes());
        b.extend_from_slice(&self.rkey.to_le_bytes());
        b.extend_from_slice(&(self.qps.len() as u32).to_le_bytes());
        for (q, p) in &self.qps {
            b.extend_from_slice(&q.to_le_bytes());
            b.extend_from_slice(&p.to_le_bytes());
        }
        b
    }

    /// Reads [`Endpoint::to_bytes`]' format.
    pub fn from_bytes(b: &[u8]) -> Option<Endpoint> {
        let u32_at = |o: usize| Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?));
        let u64_at = |o: usize| Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?));
        let n = u32_at(36)? as usize;
        if b.len() != 40 + 8 * n || n == 0 {
            return None;
        }
        Some(Endpoint {
            gid: b[..16].try_into().ok()?,
            addr: u64_at(16)?,
            len: u64_at(24)?,
            rkey: u32_at(32)?,
            qps: (0..n)
                .map(|i| Some((u32_at(40 + 8 * i)?, u32_at(44 + 8 * i)?)))
                .collect::<Option<_>>()?,
        })
    }
}

struct Lane {
    qp: QueuePair,
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

/// A session to one peer over RC QPs (see the module documentation).
pub struct RdmaSession {
    pool: Arc<Pool>,
    lanes: Vec<Lane>,
    scq: CompletionQueue,
    rcq: CompletionQueue,
    peer: Endpoint,
    depth: usize,
    /// The receive slots for the peer's notifications.
    slots: Pool,
    next_batch: u64,
    batches: HashMap<u64, Batch>,
    landings: Landings,
    broken: Option<String>,
    next_lane: usize,
    /// Work requests posted and the time spent posting them (waits for
    /// room excluded).
    posts: u64,
    post_time: Duration,
    /// Set up through rdma_cm: the channel and each QP's id.
    cm: Option<(EventChannel, Vec<CmId>)>,
}

impl std::fmt::Debug for RdmaSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaSession")
            .field("qps", &self.lanes.len())
            .field("in_flight", &self.batches.len())
            .finish_non_exhaustive()
    }
}

fn setup<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> XferError {
    move |e| XferError::Setup(format!("{what}: {e}"))
}

/// What a session is built from while its QPs connect: its CQs, receive
/// slots and the QPs made so far (with their rdma_cm ids). Dropped
/// unfinished (a failed setup), it destroys what it made.
pub(crate) struct Parts {
    ctx: Context,
    pub scq: CompletionQueue,
    pub rcq: CompletionQueue,
    /// The receive slots for the peer's notifications (the pool's PD).
    slots: Option<Pool>,
    /// How each QP is made.
    pub init: QpInit,
    depth: usize,
    /// The QPs, in lane order.
    pub qps: Vec<QueuePair>,
    /// Set up through rdma_cm: the channel and each QP's id.
    pub cm: Option<(EventChannel, Vec<CmId>)>,
    /// Turned into a session (which destroys all of it in its turn).
    finished: bool,
}

impl Parts {
    pub fn new(ctx: &Context, pool: &Pool, o: &SessionOptions) -> Result<Parts, XferError> {
        let Some(pd) = pool.pd() else {
            return Err(XferError::Setup("the pool is not registered".into()));
        };
        if o.qps == 0 || o.depth < 2 {
            return Err(XferError::Setup("at least one QP, two deep".into()));
        }
        let depth = o.depth as usize;
        let cq = |n: usize| {
            ctx.cq(ctx.create_cq(n))
                .ok_or_else(|| XferError::Setup("CQ".into()))
        };
        let scq = cq(depth * o.qps + 1)?;
        let rcq = match cq(RECV_SLOTS * o.qps + 1) {
            Ok(c) => c,
            Err(e) => {
                let _ = ctx.destroy_cq(scq.id());
                return Err(e);
            }
        };
        let mut init = QpInit::new(QpType::Rc, pd);
        init.caps.max_send_wr = o.depth;
        init.caps.max_recv_wr = RECV_SLOTS as u32;
        init.caps.max_inline_data = NOTIFY_LEN as u32;
        let mut parts = Parts {
            ctx: ctx.clone(),
            scq,
            rcq,
            slots: None,
            init,
            depth,
            qps: Vec::with_capacity(o.qps),
            cm: None,
            finished: false,
        };
        parts.slots = Some(Pool::registered_in(
            ctx,
            pd,
            RECV_SLOTS * o.qps * NOTIFY_LEN,
        )?);
        Ok(parts)
    }

    /// This side's endpoint without its QPs.
    pub fn endpoint(&self, pool: &Pool) -> Endpoint {
        Endpoint {
            gid: self.ctx.gid(),
            qps: Vec::new(),
            addr: pool.addr(),
            len: pool.len() as u64,
            rkey: pool.keys().map_or(0, |k| k.rkey),
        }
    }

    /// The session over the connected (or connecting) QPs, their receive
    /// slots posted.
    pub fn finish(mut self, pool: Arc<Pool>, peer: Endpoint) -> Result<RdmaSession, XferError> {
        let slots = self
            .slots
            .take()
            .ok_or_else(|| XferError::Setup("slots".into()))?;
        let s = RdmaSession {
            pool,
            lanes: std::mem::take(&mut self.qps)
                .into_iter()
                .map(|qp| Lane {
                    qp,
                    posted: VecDeque::new(),
                    unsignaled: 0,
                })
                .collect(),
            scq: self.scq.clone(),
            rcq: self.rcq.clone(),
            peer,
            depth: self.depth,
            slots,
            next_batch: 1,
            batches: HashMap::new(),
            landings: Landings::default(),
            broken: None,
            next_lane: 0,
            posts: 0,
            post_time: Duration::ZERO,
            cm: self.cm.take(),
        };
        // The session owns the CQs now (its Drop destroys them).
        self.finished = true;
        for lane in 0..s.lanes.len() {
            for slot in 0..RECV_SLOTS {
                s.post_slot(lane, slot)?;
            }
        }
        Ok(s)
    }
}

impl Drop for Parts {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        release(
            &self.ctx,
            self.cm.take(),
            self.qps.drain(..),
            &self.scq,
            &self.rcq,
        );
        // `slots` deregisters itself once the QPs that could use it are gone.
    }
}

/// Disconnects and destroys the rdma_cm ids, then the QPs and the CQs.
fn release(
    ctx: &Context,
    cm: Option<(EventChannel, Vec<CmId>)>,
    qps: impl Iterator<Item = QueuePair>,
    scq: &CompletionQueue,
    rcq: &CompletionQueue,
) {
    if let Some((_, ids)) = cm {
        for id in ids {
            let _ = id.disconnect();
            id.destroy();
        }
    }
    for qp in qps {
        let _ = ctx.destroy_qp(qp.qpn());
    }
    let _ = ctx.destroy_cq(scq.id());
    let _ = ctx.destroy_cq(rcq.id());
}

impl RdmaSession {
    /// Sets a session up over `pool` (registered on `ctx`): makes the QPs,
    /// hands this side's [`Endpoint`] to `exchange`, which returns the
    /// peer's (over TCP, a file, rdma_cm private data: the caller's
    /// choice), and connects. Both sides call it.
    pub fn connect(
        ctx: &Context,
        pool: Arc<Pool>,
        o: &SessionOptions,
        exchange: impl FnOnce(&Endpoint) -> std::io::Result<Endpoint>,
    ) -> Result<RdmaSession, XferError> {
        let mut parts = Parts::new(ctx, &pool, o)?;
        let mut mine = parts.endpoint(&pool);
        for _ in 0..o.qps {
            let qp = ctx
                .create_qp_with(&parts.init, parts.scq.id(), parts.rcq.id())
                .map_err(setup("creating a QP"))?;
            mine.qps
                .push((qp.qpn().value(), burst_verbs::random_psn().value()));
            parts.qps.push(qp);
        }
        let peer = exchange(&mine).map_err(setup("exchanging endpoints"))?;
        if peer.qps.len() != o.qps {
            return Err(XferError::Setup(format!(
                "the peer has {} QPs, this side {}",
                peer.qps.len(),
                o.qps
            )));
        }
        for (i, qp) in parts.qps.iter().enumerate() {
            let (qpn, psn) = peer.qps[i];
            let remote = RcPeer {
                gid: peer.gid,
                qpn: burst_verbs::Qpn::new(qpn)
                    .ok_or_else(|| XferError::Setup(format!("peer QPN {qpn:#x}")))?,
                psn: Psn::new(psn),
            };
            let mut p = RcParams::new(Psn::new(mine.qps[i].1), o.mtu);
            p.access = QpAccess {
                remote_write: true,
                remote_read: true,
                remote_atomic: false,
            };
            p.timeout = o.timeout;
            p.retry_cnt = o.retry_cnt;
            p.rd_atomic = 16;
            qp.connect_rc(&remote, &p)
                .map_err(setup("connecting a QP"))?;
        }
        parts.finish(pool, peer)
    }

    /// The local pool.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// The peer's pool size.
    pub fn peer_len(&self) -> u64 {
        self.peer.len
    }

    fn post_slot(&self, lane: usize, slot: usize) -> Result<(), XferError> {
        let at = (lane * RECV_SLOTS + slot) * NOTIFY_LEN;
        let keys = self
            .slots
            .keys()
            .ok_or_else(|| XferError::Setup("slots".into()))?;
        let wr = RecvWr {
            wr_id: at as u64,
            sg_list: [Sge {
                addr: self.slots.addr() + at as u64,
                length: NOTIFY_LEN as u32,
                lkey: keys.lkey,
            }]
            .into(),
        };
        self.lanes[lane]
            .qp
            .post_recv(&wr)
            .map_err(|e| XferError::Broken(format!("posting a receive: {e}")))
    }

    /// Posts one work request on `lane`, waiting while the lane is full.
    fn post(&mut self, lane: usize, mut wr: SendWr, last: bool) -> Result<(), XferError> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.lanes[lane].posted.len() >= self.depth - 1 {
            self.progress();
            // Let the engine (and the peer, on a small host) run.
            std::thread::yield_now();
            if let Some(b) = &self.broken {
                return Err(XferError::Broken(b.clone()));
            }
            if Instant::now() > deadline {
                return Err(XferError::Timeout(Duration::from_secs(30)));
            }
        }
        let l = &mut self.lanes[lane];
        // Often enough that a full queue always holds a signalled one.
        let every = (self.depth / 2).clamp(1, SIGNAL_EVERY);
        wr.signaled = last || l.unsignaled + 1 >= every;
        let t = Instant::now();
        let r = l.qp.post_send(&wr);
        self.post_time += t.elapsed();
        self.posts += 1;
        r.map_err(|e| XferError::Segment {
            batch: wr.wr_id >> SEG_BITS,
            segment: segment_of(wr.wr_id),
            status: format!("post: {e}"),
        })?;
        l.posted.push_back(wr.wr_id);
        l.unsignaled = if wr.signaled { 0 } else { l.unsignaled + 1 };
        Ok(())
    }

    /// Takes completions: the send queue's (batches done or failed) and
    /// the receive queue's (the peer's notifications).
    pub fn progress(&mut self) {
        while let Some(wc) = self.scq.poll() {
            self.on_send_completion(&wc);
        }
        while let Some(wc) = self.rcq.poll() {
            if wc.status != WcStatus::Success {
                if self.broken.is_none() {
                    self.broken = Some(format!("receive: {:?}", wc.status));
                }
                continue;
            }
            let at = wc.wr_id as usize;
            let mut b = [0u8; NOTIFY_LEN];
            if self.slots.read(at as u64, &mut b) {
                self.landings.bytes(&b);
            }
            let (lane, slot) = (at / NOTIFY_LEN / RECV_SLOTS, at / NOTIFY_LEN % RECV_SLOTS);
            if lane < self.lanes.len() {
                let _ = self.post_slot(lane, slot);
            }
        }
    }

    fn on_send_completion(&mut self, wc: &WorkCompletion) {
        let lane = self
            .lanes
            .iter()
            .position(|l| l.qp.qpn() == wc.qp_num)
            .unwrap_or(0);
        if wc.status != WcStatus::Success {
            let batch = wc.wr_id >> SEG_BITS;
            let e = XferError::Segment {
                batch,
                segment: segment_of(wc.wr_id),
                status: format!("{:?}", wc.status),
            };
            if self.broken.is_none() {
                self.broken = Some(e.to_string());
            }
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
}

fn segment_of(wr_id: u64) -> Option<usize> {
    match wr_id & NOTIFY_SEG {
        NOTIFY_SEG => None,
        s => Some(s as usize),
    }
}

impl Transfer for RdmaSession {
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
        let bytes = check(segments, self.pool.len() as u64, self.peer.len)?;
        let lkey = self.pool.keys().map_or(0, |k| k.lkey);
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
            let remote_addr = self.peer.addr + s.remote;
            let rkey = self.peer.rkey;
            let sop = match op {
                Op::Write => SendOp::Write { remote_addr, rkey },
                Op::Read => SendOp::Read { remote_addr, rkey },
            };
            let sge = Sge {
                addr: self.pool.addr() + s.local,
                length: s.len,
                lkey,
            };
            let wr = SendWr::new((id << SEG_BITS) | i as u64, sop, [sge]);
            let last = op == Op::Read && last_on[lane] == i;
            if let Err(e) = self.post(lane, wr, last) {
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
                }
                .encode();
                let mut wr = SendWr::new(
                    (id << SEG_BITS) | NOTIFY_SEG,
                    SendOp::Send,
                    [Sge {
                        addr: 0,
                        length: NOTIFY_LEN as u32,
                        lkey: 0,
                    }],
                );
                // The bytes travel in the request (no memory to read).
                wr.inline = true;
                wr.inline_data = InlineData::try_from_slice(&note).ok();
                if let Err(e) = self.post(lane, wr, true) {
                    self.fail_batch(id, &e);
                    return Err(e);
                }
            }
        }
        Ok(BatchId(id))
    }

    fn wait(&mut self, id: BatchId, timeout: Duration) -> Result<u64, XferError> {
        let deadline = Instant::now() + timeout;
        loop {
            let Some(b) = self.batches.get(&id.0) else {
                return Err(XferError::NoSuchBatch(id.0));
            };
            if let Some(e) = &b.error {
                let e = e.clone();
                self.batches.remove(&id.0);
                return Err(e);
            }
            if b.pending == 0 {
                let bytes = b.bytes;
                self.batches.remove(&id.0);
                return Ok(bytes);
            }
            if Instant::now() > deadline {
                return Err(XferError::Timeout(timeout));
            }
            self.progress();
            // Let the engine (and the peer, on a small host) run.
            std::thread::yield_now();
        }
    }

    fn wait_landed(&mut self, timeout: Duration) -> Result<Landed, XferError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(l) = self.landings.next() {
                return Ok(l);
            }
            if let Some(b) = &self.broken {
                return Err(XferError::Broken(b.clone()));
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

impl RdmaSession {
    fn fail_batch(&mut self, id: u64, e: &XferError) {
        if let Some(b) = self.batches.get_mut(&id) {
            b.error.get_or_insert_with(|| e.clone());
        }
    }
}

impl Drop for RdmaSession {
    fn drop(&mut self) {
        // The QPs go before the pools they point into (the fields' own
        // Drop: the slots' and the pool's registrations).
        let Some(ctx) = self.lanes.first().map(|l| l.qp.context().clone()) else {
            return;
        };
        release(
            &ctx,
            self.cm.take(),
            self.lanes.drain(..).map(|l| l.qp),
            &self.scq,
            &self.rcq,
        );
    }
}
