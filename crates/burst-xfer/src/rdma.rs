//! The RDMA session over burst-verbs: its QPs, CQs and notification
//! slots, set up with an out-of-band [`Endpoint`] exchange or rdma_cm
//! (`cm.rs`); the session's logic is `session.rs`.

use std::sync::Arc;

use burst_verbs::engine::{CompletionQueue, Context, QueuePair};
use burst_verbs::rdma_cm::{CmId, EventChannel};
use burst_verbs::{
    InlineData, Mtu, Psn, QpAccess, QpInit, QpType, RcParams, RcPeer, RecvWr, SendOp, SendWr, Sge,
    WcStatus, WorkCompletion,
};

use crate::landing::NOTIFY_LEN;
use crate::session::{transfer_by_session, Done, RcQps, Session, Work, RECV_SLOTS};
use crate::{Pool, Segment, XferError};

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
    /// Entries of the send CQ all QPs share (0: room for every QP's
    /// whole queue, up to the device's `max_cqe`). With fewer, the session
    /// waits for completions before it posts another signalled WR.
    pub cq_entries: usize,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            qps: 4,
            depth: 256,
            mtu: Mtu::Mtu4096,
            timeout: 14,
            retry_cnt: 7,
            cq_entries: 0,
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

/// burst-verbs' QPs under a session (and what they need: CQs, the
/// notification slots, the rdma_cm ids they were connected with).
pub(crate) struct BurstQps {
    pool: Arc<Pool>,
    qps: Vec<QueuePair>,
    scq: CompletionQueue,
    rcq: CompletionQueue,
    peer: Endpoint,
    /// The receive slots for the peer's notifications.
    slots: Pool,
    /// Set up through rdma_cm: the channel and each QP's id.
    cm: Option<(EventChannel, Vec<CmId>)>,
}

/// A session to one peer over burst-verbs' RC QPs (see the crate
/// documentation).
pub struct RdmaSession {
    inner: Session<BurstQps>,
}

transfer_by_session!(RdmaSession);

impl std::fmt::Debug for RdmaSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaSession")
            .field("qps", &self.inner.qps.qps.len())
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
    /// Entries of the send CQ.
    cq_entries: usize,
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
        // Room for every QP's queue when the device allows it; beyond
        // (10,240 QPs of 128), the session waits for room instead.
        let cq_entries = match o.cq_entries {
            0 => (depth * o.qps + 1).min(burst_verbs::MAX_CQE as usize),
            n => n.max(2),
        };
        let scq = cq(cq_entries)?;
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
            cq_entries,
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
        let (pool_len, peer_len) = (pool.len() as u64, peer.len);
        let room = self.cq_entries - 1;
        let qps = BurstQps {
            pool,
            qps: std::mem::take(&mut self.qps),
            scq: self.scq.clone(),
            rcq: self.rcq.clone(),
            peer,
            slots,
            cm: self.cm.take(),
        };
        // The QPs own the CQs now (their Drop destroys them).
        self.finished = true;
        let mut inner = Session::new(qps, self.depth, pool_len, peer_len)?;
        inner.limit_signaled(room);
        Ok(RdmaSession { inner })
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
        &self.inner.qps.pool
    }

    /// The peer's pool size.
    pub fn peer_len(&self) -> u64 {
        self.inner.peer_len()
    }

    /// Takes completions: the send queue's (batches done or failed) and
    /// the receive queue's (the peer's notifications).
    pub fn progress(&mut self) {
        self.inner.progress();
    }
}

impl RcQps for BurstQps {
    fn count(&self) -> usize {
        self.qps.len()
    }

    fn post(&mut self, lane: usize, wr_id: u64, work: &Work, signaled: bool) -> Result<(), String> {
        let lkey = self.pool.keys().map_or(0, |k| k.lkey);
        let (rkey, base) = (self.peer.rkey, self.peer.addr);
        let local = |s: &Segment| Sge {
            addr: self.pool.addr() + s.local,
            length: s.len,
            lkey,
        };
        let mut wr = match work {
            Work::Write(s) => SendWr::new(
                wr_id,
                SendOp::Write {
                    remote_addr: base + s.remote,
                    rkey,
                },
                [local(s)],
            ),
            Work::Read(s) => SendWr::new(
                wr_id,
                SendOp::Read {
                    remote_addr: base + s.remote,
                    rkey,
                },
                [local(s)],
            ),
            Work::Notify(note) => {
                let sge = Sge {
                    addr: 0,
                    length: NOTIFY_LEN as u32,
                    lkey: 0,
                };
                let mut wr = SendWr::new(wr_id, SendOp::Send, [sge]);
                // The bytes travel in the request (no memory to read).
                wr.inline = true;
                wr.inline_data = InlineData::try_from_slice(note).ok();
                wr
            }
        };
        wr.signaled = signaled;
        self.qps[lane].post_send(&wr).map_err(|e| e.to_string())
    }

    fn post_slot(&mut self, slot: usize) -> Result<(), String> {
        let at = (slot * NOTIFY_LEN) as u64;
        let lkey = self.slots.keys().map_or(0, |k| k.lkey);
        let wr = RecvWr {
            wr_id: slot as u64,
            sg_list: [Sge {
                addr: self.slots.addr() + at,
                length: NOTIFY_LEN as u32,
                lkey,
            }]
            .into(),
        };
        let qp = self.qps.get(slot / RECV_SLOTS).ok_or("no such slot")?;
        qp.post_recv(&wr).map_err(|e| e.to_string())
    }

    fn slots(&self) -> &Pool {
        &self.slots
    }

    fn poll_send(&mut self) -> Option<Done> {
        let wc = self.scq.poll()?;
        Some(self.done(&wc))
    }

    fn poll_recv(&mut self) -> Option<Done> {
        let wc = self.rcq.poll()?;
        Some(self.done(&wc))
    }
}

impl BurstQps {
    fn done(&self, wc: &WorkCompletion) -> Done {
        Done {
            wr_id: wc.wr_id,
            lane: self
                .qps
                .iter()
                .position(|q| q.qpn() == wc.qp_num)
                .unwrap_or(0),
            error: (wc.status != WcStatus::Success).then(|| format!("{:?}", wc.status)),
        }
    }
}

impl Drop for BurstQps {
    fn drop(&mut self) {
        // The QPs go before the pools they point into (the fields' own
        // Drop: the slots' and the pool's registrations).
        let Some(ctx) = self.qps.first().map(|q| q.context().clone()) else {
            return;
        };
        release(
            &ctx,
            self.cm.take(),
            self.qps.drain(..),
            &self.scq,
            &self.rcq,
        );
    }
}
