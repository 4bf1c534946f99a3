//! One queue pair: the QP state machine, the requester (send queue) and the
//! responder (receive queue) of RC, UC and UD, driven quinn-style by posted
//! work, received packets and time.

use std::collections::VecDeque;

use burst_wire::{
    AethRepr, AtomicEthRepr, BthRepr, Credits, DethRepr, IbPacket, IbRepr, Mtu, NakCode, Opcode,
    Operation, Position, Psn, Qpn, RethRepr, RnrTimer, Syndrome, Transport,
};

use crate::counters::Counters;
use crate::memory::{AtomicOp, MemError, Memory, RemoteAccess};
use crate::types::*;
use crate::{Srq, VerbsError};

/// Payload of a packet to transmit: a reference to where the bytes are, never
/// a copy. Its length is the packet's `ib.payload_len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload<'a> {
    /// No payload.
    None,
    /// Bytes at `offset` of a local SGE list (SEND and WRITE data).
    Local {
        /// The work request's SGEs.
        sges: &'a [Sge],
        /// Byte offset into their concatenation.
        offset: u64,
    },
    /// Inline data captured when the work request was posted.
    Inline(&'a [u8]),
    /// Bytes of remote-accessible memory (READ responses), already checked.
    Remote {
        /// Region key.
        rkey: u32,
        /// Address.
        va: u64,
    },
}

/// A packet the caller must build and send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit<'a> {
    /// Transport headers (the caller adds Ethernet/IP/UDP and the ICRC).
    pub ib: IbRepr,
    /// Where the payload is.
    pub payload: Payload<'a>,
    /// The caller's address handle of the destination.
    pub ah: u32,
}

impl Transmit<'_> {
    /// Gathers the payload into `out` (exactly `ib.payload_len` bytes).
    pub fn gather(&self, mem: &impl Memory, out: &mut [u8]) -> Result<(), MemError> {
        match self.payload {
            Payload::None => Ok(()),
            Payload::Local { sges, offset } => mem.read_local(sges, offset, out),
            Payload::Inline(d) => {
                out.copy_from_slice(&d[..out.len()]);
                Ok(())
            }
            Payload::Remote { rkey, va } => mem.read_remote(rkey, va, out),
        }
    }
}

/// Attributes set by `modify`.
#[derive(Debug, Clone, Copy)]
struct Attrs {
    access: QpAccess,
    qkey: u32,
    ah: u32,
    mtu: Mtu,
    dest_qpn: Qpn,
    max_dest_rd_atomic: u8,
    min_rnr_timer: u8,
    timeout: u8,
    retry_cnt: u8,
    rnr_retry: u8,
    max_rd_atomic: u8,
}

/// Largest `max_rd_atomic` / `max_dest_rd_atomic` accepted.
pub const MAX_RD_ATOMIC: u8 = 16;

#[derive(Debug)]
struct SendWqe {
    wr: SendWr,
    inline: Vec<u8>,
    len: u64,
    first_psn: Option<Psn>,
    /// PSNs the operation uses (READ: its response packets).
    npsn: u32,
    /// Next packet (index from `first_psn`) to (re)transmit.
    next_pkt: u32,
    /// READ response packets placed so far.
    read_got: u32,
    done: bool,
    status: WcStatus,
}

impl SendWqe {
    fn last_psn(&self) -> Option<Psn> {
        self.first_psn.map(|p| p + (self.npsn - 1))
    }
    fn contains(&self, psn: Psn) -> bool {
        self.first_psn.is_some_and(|f| {
            let d = f.distance_to(psn);
            d >= 0 && (d as u32) < self.npsn
        })
    }
    /// Bound of `next_pkt`: PSN index past the last one to (re)send. A READ
    /// request covers all its response PSNs; an atomic uses one.
    fn request_pkts(&self) -> u32 {
        if self.wr.op.is_atomic() {
            1
        } else {
            self.npsn
        }
    }
}

#[derive(Debug, Default)]
struct Requester {
    sq: VecDeque<SendWqe>,
    next_psn: Psn,
    una_psn: Psn,
    send_idx: usize,
    rd_atomic_inflight: u32,
    retry_left: u8,
    rnr_left: u8,
    timer: Option<Nanos>,
    rnr_until: Option<Nanos>,
    /// PSN of the last go-back, so a burst of duplicates does not rewind twice.
    last_rewind: Option<Psn>,
    /// First PSN never transmitted: anything before it is a retransmission.
    sent_high: Psn,
    /// Packets the requester lets be in flight now (0 until the first
    /// loss: the configured maximum). A go-back halves it (a receiver whose
    /// queue overflowed gets a smaller burst next time, instead of the same
    /// overflow until the retry count runs out); acknowledged packets grow
    /// it back by a sixteenth of their number (about 6% per round trip).
    cwnd: u32,
}

/// The smallest packet window a go-back shrinks to.
const MIN_WINDOW: u32 = 16;

#[derive(Debug)]
enum Out {
    Ack,
    Nak(Syndrome, Psn),
    AtomicAck { psn: Psn, orig: u64 },
    Read(ReadJob),
}

/// A READ or atomic request the responder executed, kept to answer its
/// duplicates.
#[derive(Debug, Clone, Copy)]
enum RdResource {
    Read { first_psn: Psn, npkts: u32 },
    Atomic { psn: Psn, orig: u64 },
}

impl RdResource {
    fn contains(&self, psn: Psn) -> bool {
        match *self {
            RdResource::Read { first_psn, npkts } => {
                let d = first_psn.distance_to(psn);
                d >= 0 && (d as u32) < npkts
            }
            RdResource::Atomic { psn: p, .. } => p == psn,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct ReadJob {
    rkey: u32,
    va: u64,
    len: u64,
    first_psn: Psn,
    npkts: u32,
    next_pkt: u32,
}

#[derive(Debug)]
struct RecvInProgress {
    wr: RecvWr,
    offset: u64,
}

#[derive(Debug, Clone, Copy)]
struct WriteInProgress {
    rkey: u32,
    va: u64,
    remaining: u64,
    total: u64,
}

#[derive(Debug, Default)]
struct Responder {
    epsn: Psn,
    msn: u32,
    rq: VecDeque<RecvWr>,
    cur_recv: Option<RecvInProgress>,
    cur_write: Option<WriteInProgress>,
    /// A NAK (sequence or RNR) is outstanding: stay quiet until the gap fills.
    nak_outstanding: bool,
    out: VecDeque<Out>,
    /// The last `max_dest_rd_atomic` READ and atomic requests executed: all
    /// a duplicate of one may be answered from (RXE's responder resources).
    resources: VecDeque<RdResource>,
    unacked_pkts: u32,
    /// The last ACK psn put in `out`, to coalesce.
    ack_psn: Psn,
}

/// A queue pair's transport state.
#[derive(Debug)]
pub struct Qp {
    cfg: QpConfig,
    state: QpState,
    attrs: Attrs,
    req: Requester,
    resp: Responder,
    completions: VecDeque<WorkCompletion>,
    counters: Counters,
}

fn ceil_div(a: u64, b: u64) -> u64 {
    a.div_ceil(b)
}

impl Qp {
    /// A QP in the RESET state.
    pub fn new(cfg: QpConfig) -> Qp {
        Qp {
            cfg,
            state: QpState::Reset,
            attrs: Attrs {
                access: QpAccess::default(),
                qkey: 0,
                ah: 0,
                mtu: cfg.port_mtu,
                dest_qpn: Qpn::default(),
                max_dest_rd_atomic: 0,
                min_rnr_timer: 0,
                timeout: 0,
                retry_cnt: 0,
                rnr_retry: 0,
                max_rd_atomic: 0,
            },
            req: Requester::default(),
            resp: Responder::default(),
            completions: VecDeque::new(),
            counters: Counters::default(),
        }
    }

    /// QP number.
    pub fn qpn(&self) -> Qpn {
        self.cfg.qpn
    }
    /// Current state.
    pub fn state(&self) -> QpState {
        self.state
    }
    /// Creation-time configuration.
    pub fn config(&self) -> &QpConfig {
        &self.cfg
    }
    /// Counters, named after RXE's.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }
    /// Path MTU in use.
    pub fn mtu(&self) -> Mtu {
        self.attrs.mtu
    }
    /// A one-line summary of the requester's state, for diagnostics.
    pub fn requester_summary(&self) -> String {
        let r = &self.req;
        let head: Vec<String> =
            r.sq.iter()
                .take(3)
                .map(|w| {
                    format!(
                        "[{:?} first={:?} npsn={} next={} got={} done={}]",
                        w.wr.op.wc_opcode(),
                        w.first_psn,
                        w.npsn,
                        w.next_pkt,
                        w.read_got,
                        w.done
                    )
                })
                .collect();
        format!(
            "send_idx={} next_psn={:?} una={:?} timer={:?} rnr_until={:?} rd_inflight={} sq={} {}",
            r.send_idx,
            r.next_psn,
            r.una_psn,
            r.timer,
            r.rnr_until,
            r.rd_atomic_inflight,
            r.sq.len(),
            head.join(" ")
        )
    }

    /// A one-line summary of the responder's state, for diagnostics.
    pub fn responder_summary(&self) -> String {
        let r = &self.resp;
        format!(
            "epsn={:?} msn={} nak_outstanding={} out={} rq={} recv_in_progress={} write_in_progress={}",
            r.epsn, r.msn, r.nak_outstanding, r.out.len(), r.rq.len(), r.cur_recv.is_some(), r.cur_write.is_some()
        )
    }

    /// Send work requests posted and not yet completed.
    pub fn send_queue_len(&self) -> usize {
        self.req.sq.len()
    }
    /// Receive work requests posted and not yet consumed.
    pub fn recv_queue_len(&self) -> usize {
        self.resp.rq.len() + usize::from(self.resp.cur_recv.is_some())
    }

    // ---------------------------------------------------------------- modify

    /// `ibv_modify_qp`: moves the QP to `attr.state` with the attributes the
    /// transition requires and allows (the table of the IB spec that
    /// rdma-core's `ibv_modify_qp` and the kernel's `ib_modify_qp_is_ok` apply).
    pub fn modify(&mut self, attr: &QpAttr) -> Result<(), VerbsError> {
        use QpState::{Init, Reset, Rtr, Rts, Sqd, Sqe};
        let to = attr.state.ok_or(VerbsError::MissingAttr("IBV_QP_STATE"))?;
        let t = self.cfg.qp_type;
        let from = self.state;
        // (required, optional) attribute names for the transition
        let (req, opt): (&[&str], &[&str]) = match (from, to, t) {
            (_, Reset, _) | (_, QpState::Err, _) => (&[], &[]),
            (Reset, Init, QpType::Ud) => (&["pkey_index", "port", "qkey"], &[]),
            (Reset, Init, _) => (&["pkey_index", "port", "access"], &[]),
            (Init, Init, QpType::Ud) => (&[], &["pkey_index", "port", "qkey"]),
            (Init, Init, _) => (&[], &["pkey_index", "port", "access"]),
            (Init, Rtr, QpType::Rc) => (
                &[
                    "ah",
                    "path_mtu",
                    "dest_qpn",
                    "rq_psn",
                    "max_dest_rd_atomic",
                    "min_rnr_timer",
                ],
                &["access", "pkey_index"],
            ),
            (Init, Rtr, QpType::Uc) => (
                &["ah", "path_mtu", "dest_qpn", "rq_psn"],
                &["access", "pkey_index"],
            ),
            (Init, Rtr, QpType::Ud) => (&[], &["pkey_index", "qkey"]),
            (Rtr, Rts, QpType::Rc) => (
                &[
                    "sq_psn",
                    "timeout",
                    "retry_cnt",
                    "rnr_retry",
                    "max_rd_atomic",
                ],
                &["access", "min_rnr_timer"],
            ),
            (Rtr, Rts, QpType::Uc) => (&["sq_psn"], &["access"]),
            (Rtr, Rts, QpType::Ud) => (&["sq_psn"], &["qkey"]),
            (Rts | Sqd, Rts, QpType::Rc) => (
                &[],
                &[
                    "access",
                    "min_rnr_timer",
                    "timeout",
                    "retry_cnt",
                    "rnr_retry",
                    "max_rd_atomic",
                ],
            ),
            (Rts | Sqd, Rts, QpType::Uc) => (&[], &["access"]),
            (Rts | Sqd, Rts, QpType::Ud) => (&[], &["qkey"]),
            (Sqe, Rts, QpType::Uc) => (&[], &["access"]),
            (Sqe, Rts, QpType::Ud) => (&[], &["qkey"]),
            (Rts, Sqd, _) | (Sqd, Sqd, _) => (&[], &[]),
            _ => return Err(VerbsError::InvalidState(from)),
        };
        let given: [(&str, bool); 15] = [
            ("pkey_index", attr.pkey_index.is_some()),
            ("port", attr.port.is_some()),
            ("access", attr.access.is_some()),
            ("qkey", attr.qkey.is_some()),
            ("ah", attr.ah.is_some()),
            ("path_mtu", attr.path_mtu.is_some()),
            ("dest_qpn", attr.dest_qpn.is_some()),
            ("rq_psn", attr.rq_psn.is_some()),
            ("max_dest_rd_atomic", attr.max_dest_rd_atomic.is_some()),
            ("min_rnr_timer", attr.min_rnr_timer.is_some()),
            ("sq_psn", attr.sq_psn.is_some()),
            ("timeout", attr.timeout.is_some()),
            ("retry_cnt", attr.retry_cnt.is_some()),
            ("rnr_retry", attr.rnr_retry.is_some()),
            ("max_rd_atomic", attr.max_rd_atomic.is_some()),
        ];
        if to != Reset && to != QpState::Err {
            for r in req {
                if !given.iter().any(|(n, g)| n == r && *g) {
                    return Err(VerbsError::MissingAttr(r));
                }
            }
            for (n, g) in given {
                if g && !req.contains(&n) && !opt.contains(&n) {
                    return Err(VerbsError::UnexpectedAttr(n));
                }
            }
        }
        if attr.port.is_some_and(|p| p != 1) {
            return Err(VerbsError::InvalidValue("port"));
        }
        let check = |v: Option<u8>, max: u8, name| match v {
            Some(x) if x > max => Err(VerbsError::InvalidValue(name)),
            _ => Ok(()),
        };
        check(attr.timeout, 31, "timeout")?;
        check(attr.retry_cnt, 7, "retry_cnt")?;
        check(attr.rnr_retry, 7, "rnr_retry")?;
        check(attr.min_rnr_timer, 31, "min_rnr_timer")?;
        check(attr.max_rd_atomic, MAX_RD_ATOMIC, "max_rd_atomic")?;
        check(attr.max_dest_rd_atomic, MAX_RD_ATOMIC, "max_dest_rd_atomic")?;

        let a = &mut self.attrs;
        if let Some(v) = attr.access {
            a.access = v;
        }
        if let Some(v) = attr.qkey {
            a.qkey = v;
        }
        if let Some(v) = attr.ah {
            a.ah = v;
        }
        if let Some(v) = attr.path_mtu {
            a.mtu = v;
        }
        if let Some(v) = attr.dest_qpn {
            a.dest_qpn = v;
        }
        if let Some(v) = attr.max_dest_rd_atomic {
            a.max_dest_rd_atomic = v;
        }
        if let Some(v) = attr.min_rnr_timer {
            a.min_rnr_timer = v;
        }
        if let Some(v) = attr.timeout {
            a.timeout = v;
        }
        if let Some(v) = attr.retry_cnt {
            a.retry_cnt = v;
            self.req.retry_left = v;
        }
        if let Some(v) = attr.rnr_retry {
            a.rnr_retry = v;
            self.req.rnr_left = v;
        }
        if let Some(v) = attr.max_rd_atomic {
            a.max_rd_atomic = v;
        }
        if let Some(p) = attr.rq_psn {
            self.resp.epsn = p;
            self.resp.ack_psn = p - 1;
        }
        if let Some(p) = attr.sq_psn {
            self.req.next_psn = p;
            self.req.una_psn = p;
            self.req.sent_high = p;
        }
        match to {
            Reset => {
                self.req = Requester::default();
                self.resp = Responder::default();
                self.completions.clear();
            }
            QpState::Err => self.enter_error(),
            _ => {}
        }
        self.state = to;
        Ok(())
    }

    fn enter_error(&mut self) {
        self.state = QpState::Err;
        let qpn = self.cfg.qpn;
        for w in self.req.sq.drain(..) {
            if !w.done || w.status != WcStatus::Success || w.wr.signaled {
                let status = if w.done {
                    w.status
                } else {
                    WcStatus::WrFlushErr
                };
                self.completions.push_back(WorkCompletion {
                    wr_id: w.wr.wr_id,
                    status,
                    opcode: w.wr.op.wc_opcode(),
                    byte_len: 0,
                    imm_data: None,
                    invalidated_rkey: None,
                    qp_num: qpn,
                    src_qp: Qpn::default(),
                    grh: false,
                });
            }
        }
        self.req.send_idx = 0;
        self.req.timer = None;
        self.req.rnr_until = None;
        let cur = self.resp.cur_recv.take().map(|r| r.wr);
        // WQEs of a shared receive queue stay with the SRQ (which is lent to
        // this QP while one of its packets is handled); only the one this QP
        // had started is flushed.
        let own = if self.cfg.srq {
            Vec::new()
        } else {
            self.resp.rq.drain(..).collect()
        };
        for wr in cur.into_iter().chain(own) {
            self.completions.push_back(recv_wc(
                qpn,
                wr.wr_id,
                WcStatus::WrFlushErr,
                WcOpcode::Recv,
                0,
            ));
        }
        self.resp.cur_write = None;
        // Responses already owed (NAKs) still go out; READ data does not.
        self.resp.out.retain(|o| !matches!(o, Out::Read(_)));
    }

    // ------------------------------------------------------------------ post

    /// `ibv_post_send`. Inline data is captured from `mem` now.
    pub fn post_send(&mut self, mut wr: SendWr, mem: &impl Memory) -> Result<(), VerbsError> {
        let t = self.cfg.qp_type;
        match self.state {
            QpState::Reset | QpState::Init | QpState::Rtr => {
                return Err(VerbsError::InvalidState(self.state))
            }
            _ => {}
        }
        if self.req.sq.len() >= self.cfg.max_send_wr as usize {
            return Err(VerbsError::QueueFull);
        }
        if wr.sg_list.len() > self.cfg.max_sge as usize {
            return Err(VerbsError::TooManySge);
        }
        let len = sg_len(&wr.sg_list);
        let allowed = match (t, &wr.op) {
            (QpType::Rc, _) => true,
            (QpType::Uc, op) => !op.is_read_or_atomic() && !matches!(op, SendOp::SendWithInv(_)),
            (QpType::Ud, SendOp::Send | SendOp::SendWithImm(_)) => true,
            _ => false,
        };
        if !allowed {
            return Err(VerbsError::BadWr("opcode not supported by this QP type"));
        }
        if t == QpType::Ud {
            if wr.ud.is_none() {
                return Err(VerbsError::BadWr("UD send without address handle"));
            }
            if len > self.attrs.mtu.bytes() as u64 {
                return Err(VerbsError::BadWr("UD message larger than the path MTU"));
            }
        }
        if wr.op.is_atomic() {
            if len != 8 || wr.sg_list.len() != 1 {
                return Err(VerbsError::BadWr("atomic needs one 8-byte SGE"));
            }
            let va = match wr.op {
                SendOp::CompareSwap { remote_addr, .. } | SendOp::FetchAdd { remote_addr, .. } => {
                    remote_addr
                }
                _ => 0,
            };
            if va % 8 != 0 {
                return Err(VerbsError::BadWr(
                    "atomic remote address not 8-byte aligned",
                ));
            }
        }
        if len > u64::from(u32::MAX) {
            return Err(VerbsError::BadWr("message longer than 2^32-1"));
        }
        if wr.inline && (wr.op.is_read_or_atomic() || len > u64::from(self.cfg.max_inline)) {
            return Err(VerbsError::BadWr("inline data too long or not allowed"));
        }
        let mut inline = Vec::new();
        let mut status = WcStatus::Success;
        if wr.inline {
            match wr.inline_data.take() {
                Some(d) if d.len() as u64 == len => inline = d,
                Some(_) => {
                    return Err(VerbsError::BadWr(
                        "inline data length differs from the SGEs",
                    ))
                }
                None => {
                    inline.resize(len as usize, 0);
                    if mem.read_local(&wr.sg_list, 0, &mut inline).is_err() {
                        status = WcStatus::LocProtErr;
                    }
                }
            }
        } else if mem
            .check_local(self.cfg.pd, &wr.sg_list, wr.op.is_read_or_atomic())
            .is_err()
        {
            status = WcStatus::LocProtErr;
        }
        let mtu = self.attrs.mtu.bytes() as u64;
        let npsn = if wr.op.is_atomic() {
            1
        } else {
            ceil_div(len, mtu).max(1) as u32
        };
        let wqe = SendWqe {
            wr,
            inline,
            len,
            first_psn: None,
            npsn,
            next_pkt: 0,
            read_got: 0,
            done: status != WcStatus::Success,
            status,
        };
        if self.state == QpState::Err {
            self.req.sq.push_back(wqe);
            self.enter_error();
            return Ok(());
        }
        self.req.sq.push_back(wqe);
        if status != WcStatus::Success {
            // A local protection error completes in order and breaks the QP.
            self.complete_in_order();
        }
        Ok(())
    }

    /// `ibv_post_recv`.
    pub fn post_recv(&mut self, wr: RecvWr, mem: &impl Memory) -> Result<(), VerbsError> {
        if self.cfg.srq {
            return Err(VerbsError::InvalidValue("post_recv on a QP with an SRQ"));
        }
        if self.state == QpState::Reset {
            return Err(VerbsError::InvalidState(self.state));
        }
        if self.recv_queue_len() >= self.cfg.max_recv_wr as usize {
            return Err(VerbsError::QueueFull);
        }
        if wr.sg_list.len() > self.cfg.max_sge as usize {
            return Err(VerbsError::TooManySge);
        }
        if self.state == QpState::Err {
            self.completions.push_back(recv_wc(
                self.cfg.qpn,
                wr.wr_id,
                WcStatus::WrFlushErr,
                WcOpcode::Recv,
                0,
            ));
            return Ok(());
        }
        if mem.check_local(self.cfg.pd, &wr.sg_list, true).is_err() {
            self.completions.push_back(recv_wc(
                self.cfg.qpn,
                wr.wr_id,
                WcStatus::LocProtErr,
                WcOpcode::Recv,
                0,
            ));
            return Ok(());
        }
        self.resp.rq.push_back(wr);
        Ok(())
    }

    /// Next work completion, in the order the spec demands (send completions
    /// in posting order, receive completions in arrival order).
    pub fn poll_completion(&mut self) -> Option<WorkCompletion> {
        self.completions.pop_front()
    }

    /// The next time [`Qp::handle_timeout`] must run.
    pub fn poll_timeout(&self) -> Option<Nanos> {
        match (self.req.timer, self.req.rnr_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn ack_timeout_ns(&self) -> Option<Nanos> {
        // 4.096 us * 2^timeout; 0 means infinite.
        (self.attrs.timeout != 0).then(|| 4096u64 << self.attrs.timeout.min(31))
    }

    /// Runs expired timers.
    pub fn handle_timeout(&mut self, now: Nanos) {
        self.run_timers(now);
        self.guard_outstanding(now);
    }

    fn run_timers(&mut self, now: Nanos) {
        if self.req.rnr_until.is_some_and(|t| t <= now) {
            self.req.rnr_until = None;
        }
        if self.req.timer.is_some_and(|t| t <= now) {
            self.req.timer = None;
            if self.state != QpState::Rts && self.state != QpState::Sqd {
                return;
            }
            if self.req.una_psn == self.req.next_psn {
                return;
            }
            self.counters.completer_retry_err += 1;
            if self.req.retry_left == 0 {
                self.counters.retry_exceeded_err += 1;
                self.fail_front(WcStatus::RetryExcErr);
                return;
            }
            self.req.retry_left -= 1;
            let una = self.req.una_psn;
            self.req.last_rewind = None;
            self.rewind(una);
            self.req.timer = self.ack_timeout_ns().map(|d| now + d);
        }
    }

    /// The requester's liveness rule: an RC requester that may send and has
    /// unacknowledged packets always waits on a timer (the ACK timeout, or
    /// the RNR delay), or it could wait forever when its resends are held by
    /// the window: the local ACK timeout guards every unacknowledged packet.
    /// The RNR delay and the ACK timer never run together, so the end of an
    /// RNR delay is where the ACK timer is armed again.
    fn guard_outstanding(&mut self, now: Nanos) {
        if self.outstanding_without_timer() {
            self.req.timer = self.ack_timeout_ns().map(|d| now + d);
        }
    }

    fn outstanding_without_timer(&self) -> bool {
        self.cfg.qp_type == QpType::Rc
            && matches!(self.state, QpState::Rts | QpState::Sqd)
            && self.req.una_psn != self.req.next_psn
            && self.req.timer.is_none()
            && self.req.rnr_until.is_none()
            && self.attrs.timeout != 0
    }

    /// One line with the QP's state, both sides' summaries and its counters
    /// (for reports of a stuck run).
    pub fn describe(&self) -> String {
        format!(
            "qp {} state {:?}: requester {}; responder {}; {:?}",
            self.qpn(),
            self.state(),
            self.requester_summary(),
            self.responder_summary(),
            self.counters()
        )
    }

    /// Checks the invariants a correct QP holds between calls; the simulator
    /// asserts them at every step. `Err` says which one is broken.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.outstanding_without_timer() {
            return Err(format!(
                "qp {:?}: unacknowledged packets (una {:?}, next {:?}) and no timer",
                self.cfg.qpn, self.req.una_psn, self.req.next_psn
            ));
        }
        Ok(())
    }

    /// Completes the oldest unfinished send WR with `status` and moves the QP
    /// to the error state (which flushes the rest).
    fn fail_front(&mut self, status: WcStatus) {
        if let Some(w) = self.req.sq.iter_mut().find(|w| !w.done) {
            w.done = true;
            w.status = status;
        }
        self.complete_in_order();
        self.enter_error();
    }

    fn complete_in_order(&mut self) {
        // Every PSN of a finished WQE is acknowledged, even when the
        // finishing response (an atomic ACK, the last READ response) came
        // while an older READ was still missing data.
        let floor = self
            .req
            .sq
            .iter()
            .find(|w| !w.done)
            .map_or(self.req.next_psn, |w| {
                w.first_psn.unwrap_or(self.req.next_psn)
            });
        if self.req.una_psn.distance_to(floor) > 0 {
            self.req.una_psn = floor;
            if floor == self.req.next_psn {
                self.req.timer = None;
            }
        }
        let qpn = self.cfg.qpn;
        while self.req.sq.front().is_some_and(|w| w.done) {
            let Some(w) = self.req.sq.pop_front() else {
                break;
            };
            self.req.send_idx = self.req.send_idx.saturating_sub(1);
            if w.first_psn.is_some() && w.wr.op.is_read_or_atomic() && w.status == WcStatus::Success
            {
                self.req.rd_atomic_inflight = self.req.rd_atomic_inflight.saturating_sub(1);
            }
            if w.status != WcStatus::Success || w.wr.signaled {
                self.completions.push_back(WorkCompletion {
                    wr_id: w.wr.wr_id,
                    status: w.status,
                    opcode: w.wr.op.wc_opcode(),
                    byte_len: if matches!(w.wr.op, SendOp::Read { .. }) || w.wr.op.is_atomic() {
                        w.len as u32
                    } else {
                        0
                    },
                    imm_data: None,
                    invalidated_rkey: None,
                    qp_num: qpn,
                    src_qp: Qpn::default(),
                    grh: false,
                });
            }
            if w.status != WcStatus::Success && self.state != QpState::Err {
                self.enter_error();
                return;
            }
        }
    }

    /// Go-back-N: retransmit from `psn`.
    fn rewind(&mut self, psn: Psn) {
        if self.req.last_rewind == Some(psn) {
            return;
        }
        let Some(i) = self.req.sq.iter().position(|w| w.contains(psn)) else {
            return;
        };
        self.req.last_rewind = Some(psn);
        let end = self.req.send_idx.max(i + 1).min(self.req.sq.len());
        for (j, w) in self.req.sq.iter_mut().enumerate().take(end).skip(i) {
            if w.done {
                w.next_pkt = w.request_pkts();
                continue;
            }
            w.next_pkt = if matches!(w.wr.op, SendOp::Read { .. }) {
                w.read_got
            } else if j == i && !w.wr.op.is_atomic() {
                w.first_psn.map_or(0, |f| f.distance_to(psn) as u32)
            } else {
                0
            };
        }
        self.req.send_idx = i;
        self.counters.retransmits_started += 1;
        self.req.cwnd = (self.window() / 2).max(MIN_WINDOW);
    }

    /// The packet window now (see `Requester::cwnd`).
    fn window(&self) -> u32 {
        let max = self.cfg.max_inflight_packets.max(1);
        match self.req.cwnd {
            0 => max,
            c => c.min(max),
        }
    }

    // -------------------------------------------------------------- transmit

    /// The next packet to send, if any: responses first (ACKs, NAKs, READ
    /// responses, atomic ACKs), then requests.
    pub fn poll_transmit(&mut self, now: Nanos) -> Option<Transmit<'_>> {
        let request = self.next_request();
        // Responder packets go first, except a lone coalesced ACK when a
        // request is ready: the ACK is off the peer's critical path, while
        // the request (often the reply to the message being ACKed) is on
        // it. The two are in different PSN spaces, so their order is free.
        let ack_last = request.is_some()
            && self.resp.out.len() == 1
            && matches!(self.resp.out.front(), Some(Out::Ack));
        if !self.resp.out.is_empty() && !ack_last {
            self.counters.sent_pkts += 1;
            return self.poll_response();
        }
        self.poll_request(request?, now)
    }

    fn credits(&self) -> Credits {
        if self.cfg.srq {
            // C9-151: a QP on an SRQ advertises the invalid credit count.
            return Credits::UNLIMITED;
        }
        Credits::from_count(self.resp.rq.len() as u32)
    }

    fn poll_response(&mut self) -> Option<Transmit<'_>> {
        let mtu = self.attrs.mtu.bytes() as u64;
        let dest = self.attrs.dest_qpn;
        let ah = self.attrs.ah;
        let msn = self.resp.msn;
        let credits = self.credits();
        let front = self.resp.out.front_mut()?;
        let aeth = |syndrome| Some(AethRepr { syndrome, msn });
        let (ib, payload, pop) = match front {
            Out::Ack => {
                let mut ib = IbRepr::new(BthRepr::new(
                    Opcode::RC_ACKNOWLEDGE,
                    dest,
                    self.resp.ack_psn,
                ));
                ib.aeth = aeth(Syndrome::Ack(credits));
                (ib, Payload::None, true)
            }
            Out::Nak(s, psn) => {
                let mut ib = IbRepr::new(BthRepr::new(Opcode::RC_ACKNOWLEDGE, dest, *psn));
                ib.aeth = aeth(*s);
                (ib, Payload::None, true)
            }
            Out::AtomicAck { psn, orig } => {
                let mut ib = IbRepr::new(BthRepr::new(Opcode::RC_ATOMIC_ACKNOWLEDGE, dest, *psn));
                ib.aeth = aeth(Syndrome::Ack(credits));
                ib.atomic_ack = Some(*orig);
                (ib, Payload::None, true)
            }
            Out::Read(job) => {
                let k = job.next_pkt;
                let op = match (job.npkts, k) {
                    (1, _) => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
                    (_, 0) => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
                    (n, k) if k + 1 == n => Opcode::RC_RDMA_READ_RESPONSE_LAST,
                    _ => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
                };
                let off = u64::from(k) * mtu;
                let len = (job.len - off.min(job.len)).min(mtu);
                let mut ib = IbRepr::new(BthRepr::new(op, dest, job.first_psn + k));
                if op != Opcode::RC_RDMA_READ_RESPONSE_MIDDLE {
                    ib.aeth = aeth(Syndrome::Ack(credits));
                }
                ib.payload_len = len as usize;
                job.next_pkt += 1;
                let done = job.next_pkt >= job.npkts;
                (
                    ib,
                    Payload::Remote {
                        rkey: job.rkey,
                        va: job.va + off,
                    },
                    done,
                )
            }
        };
        if pop {
            self.resp.out.pop_front();
        }
        self.counters.sent_bytes += ib.payload_len as u64;
        Some(Transmit { ib, payload, ah })
    }

    /// The send-queue index of the request packet that may go now, if any:
    /// skips finished WQEs, then applies the admission rules (fence, READ
    /// and atomic credits, the packet window).
    fn next_request(&mut self) -> Option<usize> {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) || self.req.rnr_until.is_some() {
            return None;
        }
        let t = self.cfg.qp_type;
        // Skip over WQEs with nothing left to send.
        loop {
            let w = self.req.sq.get(self.req.send_idx)?;
            if w.done || w.next_pkt >= w.request_pkts() {
                self.req.send_idx += 1;
            } else {
                break;
            }
        }
        let idx = self.req.send_idx;
        let inflight = self.req.una_psn.distance_to(self.req.next_psn).max(0) as u32;
        let window = self.window();
        let w = &self.req.sq[idx];
        if w.first_psn.is_none() {
            // Admission of a new WQE.
            if self.state == QpState::Sqd {
                return None;
            }
            if t == QpType::Rc {
                let max_rd = u32::from(self.attrs.max_rd_atomic.max(1));
                if w.wr.fence && self.req.rd_atomic_inflight > 0 {
                    return None;
                }
                if w.wr.op.is_read_or_atomic() && self.req.rd_atomic_inflight >= max_rd {
                    return None;
                }
                if inflight > 0 && inflight + w.npsn.min(window) > window {
                    return None;
                }
            }
        } else if t == QpType::Rc && !w.wr.op.is_read_or_atomic() {
            // Every packet of an admitted WQE (first sends and go-back
            // resends alike) stays within the window of the oldest
            // unacknowledged PSN. Not a READ's re-request: the oldest
            // unacknowledged PSN stays at the READ's first one until its
            // last response is in, so a re-request far into a large READ
            // would wait forever.
            let psn = w.first_psn.unwrap_or_default() + w.next_pkt;
            if self.req.una_psn.distance_to(psn) >= window as i32 {
                return None;
            }
        }
        Some(idx)
    }

    /// Builds the next packet of WQE `idx` (admitted by [`Qp::next_request`]).
    fn poll_request(&mut self, idx: usize, now: Nanos) -> Option<Transmit<'_>> {
        let t = self.cfg.qp_type;
        let mtu = self.attrs.mtu.bytes() as u64;
        let timeout = self.ack_timeout_ns();
        let qkey_own = self.attrs.qkey;
        let (dest_qpn, own_ah, own_qpn) = (self.attrs.dest_qpn, self.attrs.ah, self.cfg.qpn);
        let (window, una) = (self.window(), self.req.una_psn);
        let w = &mut self.req.sq[idx];
        if w.first_psn.is_none() {
            if t == QpType::Rc && w.wr.op.is_read_or_atomic() {
                self.req.rd_atomic_inflight += 1;
            }
            w.first_psn = Some(self.req.next_psn);
            self.req.next_psn += w.npsn;
        }
        let first = w.first_psn.unwrap_or_default();
        let k = w.next_pkt;
        let psn = first + k;
        if psn.distance_to(self.req.sent_high) > 0 {
            self.counters.retransmitted_pkts += 1;
        } else {
            let span = if w.wr.op.is_read_or_atomic() {
                w.npsn
            } else {
                1
            };
            self.req.sent_high = psn + span;
        }
        let dest = match w.wr.ud {
            Some(d) if t == QpType::Ud => d.remote_qpn,
            _ => dest_qpn,
        };
        let ah = w.wr.ud.map_or(own_ah, |d| d.ah);
        let mut bth = BthRepr::new(Opcode(0), dest, psn);
        bth.ack_req = t == QpType::Rc;
        let mut ib;
        let payload;
        match w.wr.op {
            SendOp::Read { remote_addr, rkey } => {
                // After a go-back the READ resumes at the first missing response.
                let off = u64::from(k) * mtu;
                bth.opcode = Opcode::RC_RDMA_READ_REQUEST;
                ib = IbRepr::new(bth);
                ib.reth = Some(RethRepr {
                    virtual_address: remote_addr + off,
                    rkey,
                    dma_length: (w.len - off) as u32,
                });
                payload = Payload::None;
                w.next_pkt = w.npsn;
            }
            SendOp::CompareSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            } => {
                bth.opcode = Opcode::RC_COMPARE_SWAP;
                ib = IbRepr::new(bth);
                ib.atomic_eth = Some(AtomicEthRepr {
                    virtual_address: remote_addr,
                    rkey,
                    swap_add: swap,
                    compare,
                });
                payload = Payload::None;
                w.next_pkt = 1;
            }
            SendOp::FetchAdd {
                remote_addr,
                rkey,
                add,
            } => {
                bth.opcode = Opcode::RC_FETCH_ADD;
                ib = IbRepr::new(bth);
                ib.atomic_eth = Some(AtomicEthRepr {
                    virtual_address: remote_addr,
                    rkey,
                    swap_add: add,
                    compare: 0,
                });
                payload = Payload::None;
                w.next_pkt = 1;
            }
            op => {
                let off = u64::from(k) * mtu;
                let plen = (w.len - off.min(w.len)).min(mtu);
                let pos = match (w.npsn, k) {
                    (1, _) => Position::Only,
                    (_, 0) => Position::First,
                    (n, k) if k + 1 == n => Position::Last,
                    _ => Position::Middle,
                };
                let end = matches!(pos, Position::Last | Position::Only);
                bth.opcode = request_opcode(t, &op, pos);
                bth.solicited = end && w.wr.solicited;
                // Also ask for an ACK on the last packet the window lets
                // out: the sender stops there, and a responder only ACKs
                // every few packets, or a duplicate that asks (after a
                // go-back, resends below its expected PSN would otherwise
                // draw no ACK and the retry count would run out).
                let fills_window = una.distance_to(psn + 1) >= window as i32;
                bth.ack_req &= end || fills_window;
                ib = IbRepr::new(bth);
                match op {
                    SendOp::Write { remote_addr, rkey }
                    | SendOp::WriteWithImm {
                        remote_addr, rkey, ..
                    } if matches!(pos, Position::First | Position::Only) => {
                        ib.reth = Some(RethRepr {
                            virtual_address: remote_addr,
                            rkey,
                            dma_length: w.len as u32,
                        });
                    }
                    _ => {}
                }
                if end {
                    match op {
                        SendOp::SendWithImm(imm) | SendOp::WriteWithImm { imm, .. } => {
                            ib.imm = Some(imm)
                        }
                        SendOp::SendWithInv(rkey) => ib.ieth = Some(rkey),
                        _ => {}
                    }
                }
                if let (QpType::Ud, Some(d)) = (t, w.wr.ud) {
                    // A Q_Key with its high bit set means "use the QP's own".
                    let qkey = if d.remote_qkey & 0x8000_0000 != 0 {
                        qkey_own
                    } else {
                        d.remote_qkey
                    };
                    ib.deth = Some(DethRepr {
                        qkey,
                        src_qp: own_qpn,
                    });
                }
                ib.payload_len = plen as usize;
                payload = if w.wr.inline {
                    Payload::Inline(&w.inline[off as usize..(off + plen) as usize])
                } else {
                    Payload::Local {
                        sges: &w.wr.sg_list,
                        offset: off,
                    }
                };
                w.next_pkt += 1;
            }
        }
        if t != QpType::Rc && w.next_pkt >= w.request_pkts() {
            // Unreliable: done once the last packet is handed out; the
            // completion follows on `flush_unreliable`.
            w.done = true;
        }
        if t == QpType::Rc && self.req.timer.is_none() {
            self.req.timer = timeout.map(|d| now + d);
        }
        self.counters.sent_pkts += 1;
        self.counters.sent_bytes += ib.payload_len as u64;
        Some(Transmit { ib, payload, ah })
    }

    /// Produces the completions of unreliable sends handed out so far.
    pub fn flush_unreliable(&mut self) {
        if self.cfg.qp_type != QpType::Rc {
            self.complete_in_order();
        }
    }

    // --------------------------------------------------------------- receive

    /// [`Qp::handle_packet`] for a QP created on a shared receive queue:
    /// receive WQEs are taken from `srq`.
    pub fn handle_packet_srq(
        &mut self,
        now: Nanos,
        pkt: &IbPacket<&[u8]>,
        grh: Option<&[u8; 40]>,
        mem: &mut impl Memory,
        srq: &mut Srq,
    ) {
        debug_assert!(self.cfg.srq, "handle_packet_srq on a QP without an SRQ");
        // The responder consumes from its own queue; lend it the SRQ's for
        // the length of this packet (a pointer swap, no copy).
        std::mem::swap(&mut self.resp.rq, &mut srq.queue);
        self.handle_packet(now, pkt, grh, mem);
        std::mem::swap(&mut self.resp.rq, &mut srq.queue);
        srq.check_limit();
    }

    /// Handles a received, ICRC-checked transport packet addressed to this QP.
    /// `grh` is the 40-byte GRH area for UD receive buffers (see
    /// `burst_wire::RoceFrame::ud_grh`).
    pub fn handle_packet(
        &mut self,
        now: Nanos,
        pkt: &IbPacket<&[u8]>,
        grh: Option<&[u8; 40]>,
        mem: &mut impl Memory,
    ) {
        self.counters.rcvd_pkts += 1;
        self.counters.rcvd_bytes += pkt.payload().len() as u64;
        if !matches!(
            self.state,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        ) {
            self.counters.dropped_pkts += 1;
            return;
        }
        let info = pkt.info();
        let ok_type = matches!(
            (self.cfg.qp_type, info.transport),
            (QpType::Rc, Transport::Rc) | (QpType::Uc, Transport::Uc) | (QpType::Ud, Transport::Ud)
        );
        if !ok_type || pkt.bth().dest_qp() != self.cfg.qpn {
            self.counters.dropped_pkts += 1;
            return;
        }
        match info.operation {
            Operation::Acknowledge | Operation::AtomicAcknowledge | Operation::RdmaReadResponse => {
                if self.state != QpState::Rtr {
                    self.handle_response(now, pkt, mem);
                }
            }
            _ => match self.cfg.qp_type {
                QpType::Rc => self.rc_request(pkt, mem),
                QpType::Uc => self.uc_request(pkt, mem),
                QpType::Ud => self.ud_request(pkt, grh, mem),
            },
        }
    }

    // ------------------------------------------------------ requester side

    /// Marks everything up to and including `psn` acknowledged.
    fn ack_upto(&mut self, now: Nanos, psn: Psn) -> Option<Psn> {
        let mut lost_response = None;
        let mut progress = false;
        for w in self.req.sq.iter_mut() {
            let (Some(_first), Some(last)) = (w.first_psn, w.last_psn()) else {
                break;
            };
            if w.done {
                continue;
            }
            if last.distance_to(psn) < 0 {
                break;
            }
            if w.wr.op.is_read_or_atomic() {
                // The responder went past a READ/atomic whose response we
                // lack: ask again from the first missing PSN.
                if lost_response.is_none() {
                    lost_response = Some(w.first_psn.unwrap_or_default() + w.read_got);
                }
                continue;
            }
            if lost_response.is_none() {
                w.done = true;
                progress = true;
            }
        }
        // The oldest unacknowledged PSN never passes a READ or atomic whose
        // response is missing, so the retransmit timer keeps guarding it.
        let new_una = match lost_response {
            Some(l) if l.distance_to(psn + 1) > 0 => l,
            _ => psn + 1,
        };
        if self.req.una_psn.distance_to(new_una) > 0 && new_una.distance_to(self.req.next_psn) >= 0
        {
            let acked = self.req.una_psn.distance_to(new_una) as u32;
            if self.req.cwnd != 0 {
                self.req.cwnd =
                    (self.req.cwnd + (acked / 16).max(1)).min(self.cfg.max_inflight_packets.max(1));
            }
            self.req.una_psn = new_una;
            progress = true;
        }
        if progress {
            self.req.retry_left = self.attrs.retry_cnt;
            self.req.rnr_left = self.attrs.rnr_retry;
            self.req.timer = (self.req.una_psn != self.req.next_psn)
                .then(|| self.ack_timeout_ns().map(|d| now + d))
                .flatten();
        }
        lost_response
    }

    fn handle_response(&mut self, now: Nanos, pkt: &IbPacket<&[u8]>, mem: &mut impl Memory) {
        if self.cfg.qp_type != QpType::Rc {
            return;
        }
        let psn = pkt.bth().psn();
        // Responses for PSNs never sent are ghosts.
        if psn.distance_to(self.req.next_psn) <= 0 || self.req.una_psn.distance_to(psn) < -(1 << 22)
        {
            self.counters.dropped_pkts += 1;
            return;
        }
        let syndrome = pkt.aeth().map(|a| Syndrome::from_byte(a.syndrome()));
        match pkt.info().operation {
            Operation::Acknowledge => match syndrome {
                Some(Syndrome::Ack(_)) => {
                    if let Some(p) = self.ack_upto(now, psn) {
                        self.rewind(p);
                    }
                }
                Some(Syndrome::RnrNak(t)) => {
                    self.counters.rcvd_rnr_err += 1;
                    // A READ or atomic before the NAKed PSN whose response is
                    // missing is asked for again first.
                    let lost = self.ack_upto(now, psn - 1);
                    if self.req.rnr_left == 0 {
                        self.counters.retry_rnr_exceeded_err += 1;
                        self.fail_front(WcStatus::RnrRetryExcErr);
                    } else {
                        if self.req.rnr_left != 7 {
                            self.req.rnr_left -= 1;
                        }
                        self.req.last_rewind = None;
                        self.rewind(lost.unwrap_or(psn));
                        self.req.rnr_until = Some(now + u64::from(RnrTimer(t.0).micros()) * 1000);
                        self.req.timer = None;
                    }
                }
                Some(Syndrome::Nak(NakCode::PsnSequenceError)) => {
                    self.counters.rcvd_seq_err += 1;
                    let lost = self.ack_upto(now, psn - 1);
                    self.rewind(lost.unwrap_or(psn));
                }
                Some(Syndrome::Nak(code)) => {
                    self.counters.rcvd_err_nak += 1;
                    let _ = self.ack_upto(now, psn - 1);
                    let status = match code {
                        NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                        NakCode::RemoteOperationalError => WcStatus::RemOpErr,
                        _ => WcStatus::RemInvReqErr,
                    };
                    self.fail_front(status);
                }
                _ => self.counters.dropped_pkts += 1,
            },
            Operation::AtomicAcknowledge => {
                let Some(i) = self.req.sq.iter().position(|w| w.contains(psn)) else {
                    return;
                };
                if !self.req.sq[i].wr.op.is_atomic() || self.req.sq[i].done {
                    return;
                }
                let _ = self.ack_upto(now, psn - 1);
                let orig = pkt.atomic_ack_eth().map_or(0, |a| a.original());
                let w = &mut self.req.sq[i];
                let res = mem.write_local(&w.wr.sg_list, 0, &orig.to_ne_bytes());
                w.done = true;
                w.status = if res.is_ok() {
                    WcStatus::Success
                } else {
                    WcStatus::LocProtErr
                };
                let _ = self.ack_upto(now, psn);
            }
            Operation::RdmaReadResponse => {
                let Some(i) = self.req.sq.iter().position(|w| w.contains(psn)) else {
                    return;
                };
                let mtu = self.attrs.mtu.bytes() as u64;
                let w = &self.req.sq[i];
                if !matches!(w.wr.op, SendOp::Read { .. }) || w.done {
                    return;
                }
                let first = w.first_psn.unwrap_or_default();
                let expected = first + w.read_got;
                let d = expected.distance_to(psn);
                if d < 0 {
                    return; // duplicate response
                }
                if d > 0 {
                    self.counters.rcvd_seq_err += 1;
                    self.rewind(expected);
                    return;
                }
                let k = w.read_got;
                let pos = pkt.info().position;
                let last = k + 1 == w.npsn;
                let len_ok = match pos {
                    Some(Position::Only) => last && pkt.payload_len() as u64 == w.len,
                    Some(Position::First) => k == 0 && !last && pkt.payload_len() as u64 == mtu,
                    Some(Position::Middle) => k > 0 && !last && pkt.payload_len() as u64 == mtu,
                    Some(Position::Last) => {
                        k > 0 && last && pkt.payload_len() as u64 == w.len - u64::from(k) * mtu
                    }
                    None => false,
                };
                if !len_ok {
                    // A response of the wrong shape: after a re-request the
                    // responder restarts with FIRST/ONLY, which is fine when
                    // it lines up with what we still miss.
                    let restart = matches!(pos, Some(Position::First | Position::Only))
                        && pkt.payload_len() as u64 <= w.len - u64::from(k) * mtu;
                    if !restart {
                        self.counters.dropped_pkts += 1;
                        return;
                    }
                }
                if k == 0 || matches!(pos, Some(Position::First | Position::Only)) {
                    let _ = self.ack_upto(now, first - 1);
                }
                let w = &mut self.req.sq[i];
                if mem
                    .write_local(&w.wr.sg_list, u64::from(k) * mtu, pkt.payload())
                    .is_err()
                {
                    w.done = true;
                    w.status = WcStatus::LocProtErr;
                } else {
                    w.read_got += 1;
                    if w.read_got >= w.npsn {
                        w.done = true;
                    }
                }
                let _ = self.ack_upto(now, psn);
            }
            _ => {}
        }
        self.req.last_rewind = self
            .req
            .last_rewind
            .filter(|r| self.req.una_psn.distance_to(*r) >= 0);
        self.complete_in_order();
    }

    // ------------------------------------------------------ responder side

    fn queue_ack(&mut self) {
        self.resp.ack_psn = self.resp.epsn - 1;
        self.resp.unacked_pkts = 0;
        if !matches!(self.resp.out.back(), Some(Out::Ack)) {
            self.resp.out.push_back(Out::Ack);
        }
    }

    fn nak(&mut self, code: NakCode) {
        self.counters.send_err += 1;
        let psn = self.resp.epsn;
        self.resp.out.push_back(Out::Nak(Syndrome::Nak(code), psn));
        self.enter_error();
    }

    fn rc_request(&mut self, pkt: &IbPacket<&[u8]>, mem: &mut impl Memory) {
        let bth = pkt.bth();
        let psn = bth.psn();
        let d = self.resp.epsn.distance_to(psn);
        if d < 0 {
            self.rc_duplicate(pkt, mem);
            return;
        }
        if d > 0 {
            self.counters.out_of_seq_request += 1;
            if !self.resp.nak_outstanding {
                self.resp.nak_outstanding = true;
                self.counters.send_seq_nak += 1;
                let e = self.resp.epsn;
                self.resp
                    .out
                    .push_back(Out::Nak(Syndrome::Nak(NakCode::PsnSequenceError), e));
            }
            return;
        }
        if self.state == QpState::Err {
            return;
        }
        let info = pkt.info();
        let pos = info.position.unwrap_or(Position::Only);
        let starts = matches!(pos, Position::First | Position::Only);
        let ends = matches!(pos, Position::Last | Position::Only);
        let mtu = self.attrs.mtu.bytes();
        // Packet length rules of the path MTU.
        if self
            .attrs
            .mtu
            .check_payload(pkt.opcode(), pkt.payload_len())
            .is_err()
            && !matches!(
                info.operation,
                Operation::RdmaReadRequest | Operation::CompareSwap | Operation::FetchAdd
            )
        {
            self.nak(NakCode::InvalidRequest);
            return;
        }
        let pd = self.cfg.pd;
        let mut epsn_step = 1u32;
        match info.operation {
            Operation::Send => {
                if starts == self.resp.cur_recv.is_some() || self.resp.cur_write.is_some() {
                    self.nak(NakCode::InvalidRequest);
                    return;
                }
                if starts {
                    let Some(wr) = self.resp.rq.pop_front() else {
                        self.rnr_nak();
                        return;
                    };
                    self.resp.cur_recv = Some(RecvInProgress { wr, offset: 0 });
                }
                let Some(cur) = self.resp.cur_recv.as_mut() else {
                    return;
                };
                let data = pkt.payload();
                if cur.offset + data.len() as u64 > sg_len(&cur.wr.sg_list) {
                    let wr = cur.wr.wr_id;
                    self.resp.cur_recv = None;
                    self.completions.push_back(recv_wc(
                        self.cfg.qpn,
                        wr,
                        WcStatus::LocLenErr,
                        WcOpcode::Recv,
                        0,
                    ));
                    self.nak(NakCode::InvalidRequest);
                    return;
                }
                if mem.write_local(&cur.wr.sg_list, cur.offset, data).is_err() {
                    let wr = cur.wr.wr_id;
                    self.resp.cur_recv = None;
                    self.completions.push_back(recv_wc(
                        self.cfg.qpn,
                        wr,
                        WcStatus::LocProtErr,
                        WcOpcode::Recv,
                        0,
                    ));
                    self.nak(NakCode::RemoteOperationalError);
                    return;
                }
                cur.offset += data.len() as u64;
                if ends {
                    let Some(cur) = self.resp.cur_recv.take() else {
                        return;
                    };
                    let mut wc = recv_wc(
                        self.cfg.qpn,
                        cur.wr.wr_id,
                        WcStatus::Success,
                        WcOpcode::Recv,
                        cur.offset as u32,
                    );
                    wc.imm_data = pkt.imm_dt().map(|i| i.imm());
                    if let Some(i) = pkt.ieth() {
                        if mem.invalidate(pd, i.rkey()).is_err() {
                            self.completions.push_back(WorkCompletion {
                                status: WcStatus::RemInvReqErr,
                                ..wc
                            });
                            self.nak(NakCode::InvalidRequest);
                            return;
                        }
                        wc.invalidated_rkey = Some(i.rkey());
                    }
                    self.completions.push_back(wc);
                    self.resp.msn = self.resp.msn.wrapping_add(1) & 0xff_ffff;
                    self.counters.rdma_recvs += 1;
                }
            }
            Operation::RdmaWrite => {
                if self.resp.cur_recv.is_some() || starts == self.resp.cur_write.is_some() {
                    self.nak(NakCode::InvalidRequest);
                    return;
                }
                // WRITE WITH IMM needs a receive WQE: refuse before any side effect.
                if ends && pkt.imm_dt().is_some() && self.resp.rq.is_empty() {
                    self.rnr_nak();
                    return;
                }
                if starts {
                    let Some(r) = pkt.reth() else { return };
                    let len = u64::from(r.dma_length());
                    if !self.attrs.access.remote_write {
                        self.nak(NakCode::RemoteAccessError);
                        return;
                    }
                    if len > 0
                        && mem
                            .check_remote(
                                pd,
                                r.rkey(),
                                r.virtual_address(),
                                len,
                                RemoteAccess::Write,
                            )
                            .is_err()
                    {
                        self.nak(NakCode::RemoteAccessError);
                        return;
                    }
                    if (pos == Position::Only && pkt.payload_len() as u64 != len)
                        || (pos == Position::First && len <= mtu as u64)
                    {
                        self.nak(NakCode::InvalidRequest);
                        return;
                    }
                    self.resp.cur_write = Some(WriteInProgress {
                        rkey: r.rkey(),
                        va: r.virtual_address(),
                        remaining: len,
                        total: len,
                    });
                }
                let Some(mut w) = self.resp.cur_write else {
                    return;
                };
                let data = pkt.payload();
                if data.len() as u64 > w.remaining || (ends && data.len() as u64 != w.remaining) {
                    self.resp.cur_write = None;
                    self.nak(NakCode::InvalidRequest);
                    return;
                }
                if !data.is_empty() && mem.write_remote(w.rkey, w.va, data).is_err() {
                    self.resp.cur_write = None;
                    self.nak(NakCode::RemoteAccessError);
                    return;
                }
                w.va += data.len() as u64;
                w.remaining -= data.len() as u64;
                self.resp.cur_write = Some(w);
                if ends {
                    self.resp.cur_write = None;
                    if let Some(imm) = pkt.imm_dt() {
                        if let Some(wr) = self.resp.rq.pop_front() {
                            let mut wc = recv_wc(
                                self.cfg.qpn,
                                wr.wr_id,
                                WcStatus::Success,
                                WcOpcode::RecvRdmaWithImm,
                                w.total as u32,
                            );
                            wc.imm_data = Some(imm.imm());
                            self.completions.push_back(wc);
                        }
                    }
                    self.resp.msn = self.resp.msn.wrapping_add(1) & 0xff_ffff;
                }
            }
            Operation::RdmaReadRequest => {
                // No responder resources: READ and atomics are invalid
                // requests here (as RXE answers them).
                if self.resp.cur_recv.is_some()
                    || self.resp.cur_write.is_some()
                    || self.attrs.max_dest_rd_atomic == 0
                {
                    self.nak(NakCode::InvalidRequest);
                    return;
                }
                let Some(r) = pkt.reth() else { return };
                let len = u64::from(r.dma_length());
                if !self.attrs.access.remote_read
                    || (len > 0
                        && mem
                            .check_remote(
                                pd,
                                r.rkey(),
                                r.virtual_address(),
                                len,
                                RemoteAccess::Read,
                            )
                            .is_err())
                {
                    self.nak(NakCode::RemoteAccessError);
                    return;
                }
                let npkts = ceil_div(len, mtu as u64).max(1) as u32;
                epsn_step = npkts;
                self.keep_resource(RdResource::Read {
                    first_psn: psn,
                    npkts,
                });
                self.resp.out.push_back(Out::Read(ReadJob {
                    rkey: r.rkey(),
                    va: r.virtual_address(),
                    len,
                    first_psn: psn,
                    npkts,
                    next_pkt: 0,
                }));
                self.resp.msn = self.resp.msn.wrapping_add(1) & 0xff_ffff;
            }
            Operation::CompareSwap | Operation::FetchAdd => {
                if self.resp.cur_recv.is_some()
                    || self.resp.cur_write.is_some()
                    || self.attrs.max_dest_rd_atomic == 0
                {
                    self.nak(NakCode::InvalidRequest);
                    return;
                }
                let Some(a) = pkt.atomic_eth() else { return };
                if !self.attrs.access.remote_atomic {
                    self.nak(NakCode::RemoteAccessError);
                    return;
                }
                if a.virtual_address() % 8 != 0 {
                    self.nak(NakCode::InvalidRequest);
                    return;
                }
                let op = if info.operation == Operation::CompareSwap {
                    AtomicOp::CompareSwap {
                        compare: a.compare(),
                        swap: a.swap_add(),
                    }
                } else {
                    AtomicOp::FetchAdd { add: a.swap_add() }
                };
                match mem.atomic(pd, a.rkey(), a.virtual_address(), op) {
                    Ok(orig) => {
                        self.keep_resource(RdResource::Atomic { psn, orig });
                        self.resp.out.push_back(Out::AtomicAck { psn, orig });
                        self.resp.msn = self.resp.msn.wrapping_add(1) & 0xff_ffff;
                    }
                    Err(MemError::Misaligned) => {
                        self.nak(NakCode::InvalidRequest);
                        return;
                    }
                    Err(_) => {
                        self.nak(NakCode::RemoteAccessError);
                        return;
                    }
                }
            }
            _ => {
                self.nak(NakCode::InvalidRequest);
                return;
            }
        }
        self.resp.epsn += epsn_step;
        self.resp.nak_outstanding = false;
        self.resp.unacked_pkts += 1;
        let acked_by_response = matches!(
            info.operation,
            Operation::RdmaReadRequest | Operation::CompareSwap | Operation::FetchAdd
        );
        if acked_by_response {
            // READ responses and atomic ACKs acknowledge this PSN themselves.
            self.resp.ack_psn = self.resp.epsn - 1;
            self.resp.unacked_pkts = 0;
        } else if bth.ack_req() || ends || self.resp.unacked_pkts >= self.cfg.ack_every {
            self.queue_ack();
        }
    }

    fn rnr_nak(&mut self) {
        self.counters.send_rnr_err += 1;
        self.resp.nak_outstanding = true;
        let psn = self.resp.epsn;
        self.resp.out.push_back(Out::Nak(
            Syndrome::RnrNak(RnrTimer(self.attrs.min_rnr_timer)),
            psn,
        ));
    }

    /// Keeps an executed READ/atomic for its duplicates: the last
    /// `max_dest_rd_atomic` only, the oldest replaced first.
    fn keep_resource(&mut self, r: RdResource) {
        let max = usize::from(self.attrs.max_dest_rd_atomic.max(1));
        while self.resp.resources.len() >= max {
            self.resp.resources.pop_front();
        }
        self.resp.resources.push_back(r);
    }

    fn rc_duplicate(&mut self, pkt: &IbPacket<&[u8]>, mem: &mut impl Memory) {
        self.counters.duplicate_request += 1;
        let psn = pkt.bth().psn();
        let op = pkt.info().operation;
        let resource = self
            .resp
            .resources
            .iter()
            .find(|r| r.contains(psn))
            .copied();
        if matches!(
            op,
            Operation::RdmaReadRequest | Operation::CompareSwap | Operation::FetchAdd
        ) && resource.is_none()
        {
            // Older than the last max_dest_rd_atomic READ/atomic requests
            // (or never executed): nothing to answer from, so a peer cannot
            // make the responder replay arbitrary history.
            self.counters.dup_rd_atomic_dropped += 1;
            return;
        }
        match op {
            Operation::RdmaReadRequest => {
                // Replay by reading memory again (the spec lets a duplicate
                // READ return current data), from the requested PSN to the
                // end of the original READ at most.
                let Some(r) = pkt.reth() else { return };
                let Some(RdResource::Read { first_psn, npkts }) = resource else {
                    self.counters.dup_rd_atomic_dropped += 1;
                    return;
                };
                let left = (npkts - first_psn.distance_to(psn) as u32) as u64;
                let mtu = self.attrs.mtu.bytes() as u64;
                let len = u64::from(r.dma_length()).min(left * mtu);
                if !self.attrs.access.remote_read
                    || (len > 0
                        && mem
                            .check_remote(
                                self.cfg.pd,
                                r.rkey(),
                                r.virtual_address(),
                                len,
                                RemoteAccess::Read,
                            )
                            .is_err())
                {
                    return;
                }
                let npkts = ceil_div(len, mtu).max(1) as u32;
                // The new request supersedes what older streams would still
                // send from `psn` on: drop those, cut those that reach it.
                self.resp
                    .out
                    .retain(|o| !matches!(o, Out::Read(j) if psn.distance_to(j.first_psn) >= 0));
                for o in self.resp.out.iter_mut() {
                    if let Out::Read(j) = o {
                        let d = j.first_psn.distance_to(psn);
                        if d > 0 && (d as u32) < j.npkts {
                            j.npkts = d as u32;
                        }
                    }
                }
                self.resp
                    .out
                    .retain(|o| !matches!(o, Out::Read(j) if j.next_pkt >= j.npkts));
                self.resp.out.push_back(Out::Read(ReadJob {
                    rkey: r.rkey(),
                    va: r.virtual_address(),
                    len,
                    first_psn: psn,
                    npkts,
                    next_pkt: 0,
                }));
            }
            Operation::CompareSwap | Operation::FetchAdd => {
                // Never execute twice: answer from the kept result.
                if let Some(RdResource::Atomic { psn, orig }) = resource {
                    self.resp.out.push_back(Out::AtomicAck { psn, orig });
                }
            }
            _ => {
                let pos = pkt.info().position;
                if pkt.bth().ack_req() || matches!(pos, Some(Position::Last | Position::Only)) {
                    self.queue_ack();
                }
            }
        }
    }

    fn uc_request(&mut self, pkt: &IbPacket<&[u8]>, mem: &mut impl Memory) {
        let psn = pkt.bth().psn();
        let info = pkt.info();
        let pos = info.position.unwrap_or(Position::Only);
        let starts = matches!(pos, Position::First | Position::Only);
        let ends = matches!(pos, Position::Last | Position::Only);
        if self.resp.epsn.distance_to(psn) < 0 {
            // A duplicate: UC never retransmits, so it is the network's copy.
            self.counters.duplicate_request += 1;
            return;
        }
        if psn != self.resp.epsn
            || (starts && (self.resp.cur_recv.is_some() || self.resp.cur_write.is_some()))
        {
            // A lost packet drops the message in progress; its receive WQE
            // is reused by the next message.
            self.counters.out_of_seq_request += u64::from(psn != self.resp.epsn);
            if let Some(cur) = self.resp.cur_recv.take() {
                self.resp.rq.push_front(cur.wr);
            }
            self.resp.cur_write = None;
            self.resp.epsn = psn;
        }
        self.resp.epsn = psn + 1;
        if !starts && self.resp.cur_recv.is_none() && self.resp.cur_write.is_none() {
            self.counters.dropped_pkts += 1;
            return;
        }
        if self
            .attrs
            .mtu
            .check_payload(pkt.opcode(), pkt.payload_len())
            .is_err()
        {
            self.uc_drop();
            return;
        }
        let data = pkt.payload();
        match info.operation {
            Operation::Send => {
                if starts {
                    let Some(wr) = self.resp.rq.pop_front() else {
                        self.counters.dropped_pkts += 1;
                        return;
                    };
                    self.resp.cur_recv = Some(RecvInProgress { wr, offset: 0 });
                }
                let Some(cur) = self.resp.cur_recv.as_mut() else {
                    return;
                };
                if cur.offset + data.len() as u64 > sg_len(&cur.wr.sg_list)
                    || mem.write_local(&cur.wr.sg_list, cur.offset, data).is_err()
                {
                    let wr = cur.wr.wr_id;
                    self.resp.cur_recv = None;
                    self.completions.push_back(recv_wc(
                        self.cfg.qpn,
                        wr,
                        WcStatus::LocLenErr,
                        WcOpcode::Recv,
                        0,
                    ));
                    return;
                }
                cur.offset += data.len() as u64;
                if ends {
                    let Some(cur) = self.resp.cur_recv.take() else {
                        return;
                    };
                    let mut wc = recv_wc(
                        self.cfg.qpn,
                        cur.wr.wr_id,
                        WcStatus::Success,
                        WcOpcode::Recv,
                        cur.offset as u32,
                    );
                    wc.imm_data = pkt.imm_dt().map(|i| i.imm());
                    self.completions.push_back(wc);
                }
            }
            Operation::RdmaWrite => {
                if starts {
                    let Some(r) = pkt.reth() else { return };
                    let len = u64::from(r.dma_length());
                    if !self.attrs.access.remote_write
                        || (len > 0
                            && mem
                                .check_remote(
                                    self.cfg.pd,
                                    r.rkey(),
                                    r.virtual_address(),
                                    len,
                                    RemoteAccess::Write,
                                )
                                .is_err())
                    {
                        self.uc_drop();
                        return;
                    }
                    self.resp.cur_write = Some(WriteInProgress {
                        rkey: r.rkey(),
                        va: r.virtual_address(),
                        remaining: len,
                        total: len,
                    });
                }
                let Some(mut w) = self.resp.cur_write else {
                    return;
                };
                if data.len() as u64 > w.remaining || (ends && data.len() as u64 != w.remaining) {
                    self.uc_drop();
                    return;
                }
                if !data.is_empty() && mem.write_remote(w.rkey, w.va, data).is_err() {
                    self.uc_drop();
                    return;
                }
                w.va += data.len() as u64;
                w.remaining -= data.len() as u64;
                self.resp.cur_write = if ends { None } else { Some(w) };
                if ends {
                    if let Some(imm) = pkt.imm_dt() {
                        if let Some(wr) = self.resp.rq.pop_front() {
                            let mut wc = recv_wc(
                                self.cfg.qpn,
                                wr.wr_id,
                                WcStatus::Success,
                                WcOpcode::RecvRdmaWithImm,
                                w.total as u32,
                            );
                            wc.imm_data = Some(imm.imm());
                            self.completions.push_back(wc);
                        }
                    }
                }
            }
            _ => self.counters.dropped_pkts += 1,
        }
    }

    fn uc_drop(&mut self) {
        self.counters.dropped_pkts += 1;
        if let Some(cur) = self.resp.cur_recv.take() {
            self.resp.rq.push_front(cur.wr);
        }
        self.resp.cur_write = None;
    }

    fn ud_request(&mut self, pkt: &IbPacket<&[u8]>, grh: Option<&[u8; 40]>, mem: &mut impl Memory) {
        let Some(deth) = pkt.deth() else { return };
        if deth.qkey() != self.attrs.qkey {
            self.counters.dropped_pkts += 1;
            return;
        }
        if pkt.payload_len() > self.attrs.mtu.bytes() {
            self.counters.dropped_pkts += 1;
            return;
        }
        let Some(wr) = self.resp.rq.pop_front() else {
            self.counters.dropped_pkts += 1;
            return;
        };
        let data = pkt.payload();
        let total = 40 + data.len() as u64;
        let mut wc = recv_wc(
            self.cfg.qpn,
            wr.wr_id,
            WcStatus::Success,
            WcOpcode::Recv,
            total as u32,
        );
        wc.src_qp = deth.src_qp();
        wc.grh = true;
        wc.imm_data = pkt.imm_dt().map(|i| i.imm());
        if total > sg_len(&wr.sg_list) {
            wc.status = WcStatus::LocLenErr;
        } else {
            let zero = [0u8; 40];
            if mem
                .write_local(&wr.sg_list, 0, grh.unwrap_or(&zero))
                .is_err()
                || mem.write_local(&wr.sg_list, 40, data).is_err()
            {
                wc.status = WcStatus::LocProtErr;
            }
        }
        self.completions.push_back(wc);
    }
}

/// The request opcode for a SEND or WRITE packet at `pos` of its message.
fn request_opcode(t: QpType, op: &SendOp, pos: Position) -> Opcode {
    let prefix = match t {
        QpType::Rc => 0x00,
        QpType::Uc => 0x20,
        QpType::Ud => 0x60,
    };
    let code = match (op, pos) {
        (SendOp::Write { .. } | SendOp::WriteWithImm { .. }, Position::First) => 0x06,
        (SendOp::Write { .. } | SendOp::WriteWithImm { .. }, Position::Middle) => 0x07,
        (SendOp::WriteWithImm { .. }, Position::Last) => 0x09,
        (SendOp::Write { .. }, Position::Last) => 0x08,
        (SendOp::WriteWithImm { .. }, Position::Only) => 0x0b,
        (SendOp::Write { .. }, Position::Only) => 0x0a,
        (_, Position::First) => 0x00,
        (_, Position::Middle) => 0x01,
        (SendOp::SendWithImm(_), Position::Last) => 0x03,
        (SendOp::SendWithInv(_), Position::Last) => 0x16,
        (_, Position::Last) => 0x02,
        (SendOp::SendWithImm(_), Position::Only) => 0x05,
        (SendOp::SendWithInv(_), Position::Only) => 0x17,
        (_, Position::Only) => 0x04,
    };
    Opcode(prefix | code)
}

fn recv_wc(
    qpn: Qpn,
    wr_id: u64,
    status: WcStatus,
    opcode: WcOpcode,
    byte_len: u32,
) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        status,
        opcode,
        byte_len,
        imm_data: None,
        invalidated_rkey: None,
        qp_num: qpn,
        src_qp: Qpn::default(),
        grh: false,
    }
}
