//! One queue pair: the QP state machine, the requester (send queue) and the
//! responder (receive queue) of RC, UC and UD, driven quinn-style by posted
//! work, received packets and time.

mod completer;
mod placement;
mod requester;
mod responder;
mod selective;
mod sendq;
mod unreliable;

use std::collections::VecDeque;

use burst_wire::{
    AethRepr, AtomicEthRepr, BthRepr, Credits, DethRepr, IbPacket, IbRepr, Mtu, NakCode, Opcode,
    Operation, Position, Psn, Qpn, RethRepr, RnrTimer, Syndrome, Transport,
};

use crate::counters::Counters;
use crate::memory::{AtomicOp, MemError, Memory, QpScope, RemoteAccess};
use crate::types::*;
use crate::{Srq, VerbsError};
use sendq::{SendQueue, WrHead};

/// Payload of a packet to transmit: a reference to where the bytes are, never
/// a copy. Its length is the packet's `ib.payload_len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload<'a> {
    /// No payload.
    None,
    /// Bytes at `offset` of a local SGE list (SEND and WRITE data).
    Local {
        /// The QP's protection domain: every SGE must name one of its regions.
        pd: u32,
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
            Payload::Local { pd, sges, offset } => mem.read_local(pd, sges, offset, out),
            Payload::Inline(d) => {
                out.copy_from_slice(&d[..out.len()]);
                Ok(())
            }
            Payload::Remote { rkey, va } => mem.read_remote(rkey, va, out),
        }
    }

    /// [`Transmit::gather`], with the payload's CRC-32 when the memory
    /// computed it while copying ([`Memory::read_local_crc`]).
    pub fn gather_crc(&self, mem: &impl Memory, out: &mut [u8]) -> Result<Option<u32>, MemError> {
        match self.payload {
            Payload::Local { pd, sges, offset } => mem.read_local_crc(pd, sges, offset, out),
            Payload::Remote { rkey, va } => mem.read_remote_crc(rkey, va, out),
            Payload::None | Payload::Inline(_) => self.gather(mem, out).map(|()| None),
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
    /// Selective repeat ([`QpAttr::selective_repeat`]).
    selective_repeat: bool,
    /// No request leaves before the peer is heard ([`QpAttr::wait_for_peer`]).
    wait_for_peer: bool,
}

/// Largest `max_rd_atomic` / `max_dest_rd_atomic` accepted.
pub const MAX_RD_ATOMIC: u8 = 16;

#[derive(Debug)]
struct SendWqe {
    wr: WrHead,
    len: u64,
    first_psn: Option<Psn>,
    /// PSNs the operation uses (READ: its response packets).
    npsn: u32,
    /// Next packet (index from `first_psn`) to (re)transmit.
    next_pkt: u32,
    /// READ response packets placed so far.
    read_got: u32,
    /// A READ whose responses showed a gap was asked for again from the
    /// gap; until the ACK timer expires, later gaps ask for nothing more.
    read_rerequested: bool,
    /// A message that takes a receive WQE (SEND, WRITE WITH IMMEDIATE):
    /// which, counted from 0 since the QP left RESET, as the responder
    /// counts them (`Responder::rsn`). Set when its first packet goes.
    rsn: u32,
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
    sq: SendQueue,
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
    /// Request packets the data plane lets out now, PSNs counted (`None`:
    /// no limit): its congestion control's share for this QP.
    credit: Option<u32>,
    /// Consecutive ACK timeouts without progress: each doubles the next
    /// timeout, up to four times the QP's (see `Qp::retransmit_deadline`).
    backoff: u8,
    /// The PSN whose acknowledgement times a round trip, and when it left
    /// (never a retransmitted packet: Karn's rule).
    rtt_probe: Option<(Psn, Nanos)>,
    /// What the path saw since [`Qp::take_path_events`].
    events: PathEvents,
    /// Selective repeat: the PSNs still to resend (first, count) before
    /// anything else, within one WQE.
    resend: Option<(Psn, u32)>,
    /// Selective repeat: the run of PSNs resent last (first, last, when
    /// the last went), to know a NAK the responder sent before they
    /// arrived.
    resent: Option<(Psn, Psn, Nanos)>,
    /// Selective repeat: the current recovery (the first PSN past what was
    /// sent when it began, and the holes NAKed in it so far).
    recovery: Option<(Psn, u32)>,
    /// Selective repeat: READ responses placed past a missing one.
    read_held: Option<Box<selective::PsnBits>>,
    /// Selective repeat: the first PSN of the last READ hole asked for
    /// again (each hole once; a lost re-request is the probe's).
    read_hole: Option<Psn>,
    /// Messages that take a receive WQE, sent so far (see `SendWqe::rsn`),
    /// and completed so far (the responder took their WQEs).
    next_rsn: u32,
    acked_rsn: u32,
    /// Smoothed round-trip time (0: no sample yet) and its mean deviation
    /// (RFC 6298).
    srtt: Nanos,
    rttvar: Nanos,
    /// The estimate is the peer's ([`Qp::seed_rtt`]), no sample of the
    /// QP's own yet.
    rtt_seeded: bool,
    /// Selective repeat: when the last progress (or probe) was, and the
    /// probes sent since (see `Qp::probe_deadline`).
    probe_from: Nanos,
    probes: u8,
}

#[derive(Debug)]
enum Out {
    /// An ACK of every request up to this PSN, fixed when queued: a later
    /// request must not make an ACK queued before a READ's responses
    /// acknowledge that READ (the requester would take the ACK as an
    /// implied NAK of the READ and ask for it again).
    Ack(Psn),
    Nak(Syndrome, Psn),
    AtomicAck {
        psn: Psn,
        orig: u64,
    },
    /// An ATOMIC WRITE's response: a READ RESPONSE ONLY with no payload.
    AtomicWriteAck(Psn),
    Read(ReadJob),
}

/// A READ or atomic request the responder executed, kept to answer its
/// duplicates.
#[derive(Debug, Clone, Copy)]
enum RdResource {
    Read { first_psn: Psn, npkts: u32 },
    Atomic { psn: Psn, orig: u64 },
    AtomicWrite { psn: Psn },
}

impl RdResource {
    fn contains(&self, psn: Psn) -> bool {
        match *self {
            RdResource::Read { first_psn, npkts } => {
                let d = first_psn.distance_to(psn);
                d >= 0 && (d as u32) < npkts
            }
            RdResource::Atomic { psn: p, .. } | RdResource::AtomicWrite { psn: p } => p == psn,
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
    rq: crate::recvq::RecvQueue,
    cur_recv: Option<RecvInProgress>,
    cur_write: Option<WriteInProgress>,
    /// A NAK (sequence or RNR) is outstanding: stay quiet until the gap fills.
    nak_outstanding: bool,
    out: VecDeque<Out>,
    /// The last `max_dest_rd_atomic` READ and atomic requests executed: all
    /// a duplicate of one may be answered from (RXE's responder resources).
    resources: VecDeque<RdResource>,
    unacked_pkts: u32,
    /// Selective repeat: WRITE packets placed past the expected PSN.
    held: Option<Box<selective::Held>>,
    /// Receive WQEs messages took since the QP left RESET (IRN's receive
    /// WQE sequence number): a selective requester names a SEND's by its
    /// low bits, so one past a gap finds its receive WQE.
    rsn: u32,
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
    /// Asynchronous events not yet taken ([`Qp::take_events`]).
    events: Vec<QpEvent>,
    /// COMM_EST was raised since the QP last left RESET.
    established: bool,
    /// SQ_DRAINED was raised since the QP last entered SQD.
    drained: bool,
}

/// An asynchronous event of one QP (`enum ibv_event_type`), raised by the
/// transport for the data plane to deliver on the device's event queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpEvent {
    /// The first packet reached the QP in RTR (`IBV_EVENT_COMM_EST`).
    CommEstablished,
    /// The QP, attached to an SRQ, entered the error state: no more
    /// receives of the SRQ will complete on it
    /// (`IBV_EVENT_QP_LAST_WQE_REACHED`).
    LastWqeReached,
    /// The QP is in SQD with no send outstanding (`IBV_EVENT_SQ_DRAINED`).
    SqDrained,
    /// As responder, an invalid request moved the QP to the error state
    /// (`IBV_EVENT_QP_REQ_ERR`).
    RequestError,
    /// As responder, a remote access violation moved the QP to the error
    /// state (`IBV_EVENT_QP_ACCESS_ERR`).
    AccessError,
    /// As responder, an operational error moved the QP to the error state
    /// (`IBV_EVENT_QP_FATAL`).
    Fatal,
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
                selective_repeat: false,
                wait_for_peer: false,
            },
            req: Requester::default(),
            resp: Responder::default(),
            completions: VecDeque::new(),
            counters: Counters::default(),
            events: Vec::new(),
            established: false,
            drained: false,
        }
    }

    /// Takes the asynchronous events raised since the last call.
    pub fn take_events(&mut self) -> Vec<QpEvent> {
        std::mem::take(&mut self.events)
    }

    /// Raises SQ_DRAINED once the QP is in SQD with no send outstanding.
    fn check_drained(&mut self) {
        if self.state == QpState::Sqd && !self.drained && self.req.sq.is_empty() {
            self.drained = true;
            self.events.push(QpEvent::SqDrained);
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

    /// Whether [`Qp::trim`] would give memory back: a queue is empty and
    /// still holds the room its busiest moment grew it to.
    pub fn trimmable(&self) -> bool {
        self.req.sq.has_spare_room()
            || self.resp.rq.has_spare_room()
            || (self.resp.out.is_empty() && self.resp.out.capacity() > 0)
            || (self.completions.is_empty() && self.completions.capacity() > 0)
            || self.resp.held.as_ref().is_some_and(|h| h.is_empty())
            || self.req.read_held.as_ref().is_some_and(|h| h.is_empty())
    }

    /// Gives back the memory of the queues that are empty (the caller
    /// does this to a QP that has stayed idle: a queue regrows when work
    /// comes back, one allocation per doubling). A depth-128 send queue
    /// that was full holds 128 heads of 120 bytes and their SGEs until then.
    pub fn trim(&mut self) {
        if self.req.sq.is_empty() {
            self.req.sq = SendQueue::default();
        }
        if self.resp.rq.is_empty() {
            self.resp.rq = Default::default();
        }
        if self.resp.out.is_empty() {
            self.resp.out = VecDeque::new();
        }
        if self.completions.is_empty() {
            self.completions = VecDeque::new();
        }
        if self.resp.held.as_ref().is_some_and(|h| h.is_empty()) {
            self.resp.held = None;
        }
        if self.req.read_held.as_ref().is_some_and(|h| h.is_empty()) {
            self.req.read_held = None;
        }
    }

    // ---------------------------------------------------------------- modify

    /// `ibv_modify_qp`: moves the QP to `attr.state` with the attributes the
    /// transition requires and allows (the table of the IB spec that
    /// rdma-core's `ibv_modify_qp` and the kernel's `ib_modify_qp_is_ok` apply).
    pub fn modify(&mut self, attr: &QpAttr) -> Result<(), VerbsError> {
        use QpState::{Reset, Sqd};
        // Without IBV_QP_STATE: attributes changed in the current state
        // (RTS to RTS and the like), as the kernel's ib_modify_qp_is_ok.
        let to = attr.state.unwrap_or(self.state);
        let t = self.cfg.qp_type;
        let from = self.state;
        let (req, opt) = transition_attrs(from, to, t).ok_or(VerbsError::InvalidState(from))?;
        check_attrs(attr, to, req, opt)?;
        self.apply_attrs(attr);
        match to {
            Reset => {
                self.req = Requester::default();
                self.resp = Responder::default();
                self.completions.clear();
                self.established = false;
                // A QP connected again (by hand, or by another CM) must
                // not stay held for a peer of its last connection.
                self.attrs.wait_for_peer = false;
            }
            QpState::Err => self.enter_error(),
            _ => {}
        }
        if to == Sqd && from != Sqd {
            self.drained = false;
        }
        self.state = to;
        self.check_drained();
        Ok(())
    }

    /// Takes the attributes `attr` gives (a transition already checked).
    fn apply_attrs(&mut self, attr: &QpAttr) {
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
        if let Some(v) = attr.selective_repeat {
            a.selective_repeat = v && self.cfg.qp_type == QpType::Rc;
            if !a.selective_repeat {
                // Held packets are placed again when they come in order.
                self.resp.held = None;
                self.req.read_held = None;
                self.req.resend = None;
            }
        }
        if let Some(v) = attr.wait_for_peer {
            a.wait_for_peer = v && self.cfg.qp_type != QpType::Ud;
        }
        if let Some(p) = attr.rq_psn {
            self.resp.epsn = p;
        }
        if let Some(p) = attr.sq_psn {
            self.req.next_psn = p;
            self.req.una_psn = p;
            self.req.sent_high = p;
        }
    }

    fn enter_error(&mut self) {
        if self.cfg.srq && self.state != QpState::Err {
            // Receives of the SRQ stay with it; none will complete here.
            self.events.push(QpEvent::LastWqeReached);
        }
        self.state = QpState::Err;
        let qpn = self.cfg.qpn;
        for w in self.req.sq.drain() {
            if !w.done || w.status != WcStatus::Success || w.wr.signaled {
                let status = if w.done {
                    w.status
                } else {
                    WcStatus::WrFlushErr
                };
                self.completions.push_back(WorkCompletion::of(
                    qpn,
                    w.wr.wr_id,
                    status,
                    w.wr.op.wc_opcode(),
                ));
            }
        }
        self.req.send_idx = 0;
        self.req.timer = None;
        self.req.rnr_until = None;
        self.req.resend = None;
        self.req.read_held = None;
        self.resp.held = None;
        let cur = self.resp.cur_recv.take().map(|r| r.wr);
        // WQEs of a shared receive queue stay with the SRQ (which is lent to
        // this QP while one of its packets is handled); only the one this QP
        // had started is flushed.
        let own = if self.cfg.srq {
            Vec::new()
        } else {
            self.resp.rq.take_all()
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

    /// `ibv_post_send`: [`QpConfig::check_send`], then
    /// [`Qp::post_send_checked`].
    pub fn post_send(&mut self, wr: SendWr, mem: &mut impl Memory) -> Result<(), VerbsError> {
        self.cfg.check_send(&wr)?;
        self.post_send_checked(wr, mem)
    }

    /// Takes a work request that passed [`QpConfig::check_send`] (a front
    /// end checks when the application posts, not again here): what still
    /// depends on the QP's current state is checked (state, room in the
    /// send queue, a UD message within the path MTU). Inline data not yet
    /// captured is read from `mem` now, and a local operation (window
    /// bind, local invalidate) is executed now: after every request posted
    /// before it was taken, before any posted after (as RXE's requester,
    /// which runs them when it reaches them); it completes in order.
    pub fn post_send_checked(
        &mut self,
        mut wr: SendWr,
        mem: &mut impl Memory,
    ) -> Result<(), VerbsError> {
        debug_assert_eq!(self.cfg.check_send(&wr).err(), None);
        match self.state {
            QpState::Reset | QpState::Init | QpState::Rtr => {
                return Err(VerbsError::InvalidState(self.state))
            }
            _ => {}
        }
        if self.req.sq.len() >= self.cfg.max_send_wr as usize {
            return Err(VerbsError::QueueFull);
        }
        let len = wr.sg_list.total_len();
        if self.cfg.qp_type == QpType::Ud && len > self.attrs.mtu.bytes() as u64 {
            return Err(VerbsError::BadWr("UD message larger than the path MTU"));
        }
        let mut status = WcStatus::Success;
        if wr.op.is_local() {
            return self.post_local(wr, mem);
        }
        if wr.inline {
            if wr.inline_data.is_none() {
                let mut d = InlineData::zeroed(len as usize)?;
                if mem.read_local(self.cfg.pd, &wr.sg_list, 0, &mut d).is_err() {
                    status = WcStatus::LocProtErr;
                }
                wr.inline_data = Some(d);
            }
        } else if mem
            .check_local(self.cfg.pd, &wr.sg_list, wr.op.scatters())
            .is_err()
        {
            status = WcStatus::LocProtErr;
        }
        let mtu = self.attrs.mtu.bytes() as u64;
        let npsn = if wr.op.is_atomic() || wr.op.is_atomic_write() {
            1
        } else {
            ceil_div(len, mtu).max(1) as u32
        };
        let wqe = SendWqe {
            wr: SendQueue::head_of(&wr),
            len,
            first_psn: None,
            npsn,
            next_pkt: 0,
            read_got: 0,
            read_rerequested: false,
            rsn: 0,
            done: status != WcStatus::Success,
            status,
        };
        if self.state == QpState::Err {
            self.req.sq.push_back(wqe, &wr);
            self.enter_error();
            return Ok(());
        }
        self.req.sq.push_back(wqe, &wr);
        if status != WcStatus::Success {
            // A local protection error completes in order and breaks the QP.
            self.complete_in_order();
        }
        Ok(())
    }

    /// Executes a local operation and queues its completion (in order with
    /// the sends before it). A refused one completes in error
    /// (MW_BIND_ERR for a bind, LOC_QP_OP_ERR for an invalidate, as RXE)
    /// and moves the QP to the error state; in the error state it is
    /// flushed, not executed.
    fn post_local(&mut self, wr: SendWr, mem: &mut impl Memory) -> Result<(), VerbsError> {
        let status = if self.state == QpState::Err {
            WcStatus::WrFlushErr
        } else {
            let scope = self.scope();
            match wr.op {
                SendOp::BindMw(b) => match mem.bind_window(scope, &b) {
                    Ok(()) => WcStatus::Success,
                    Err(_) => WcStatus::MwBindErr,
                },
                SendOp::LocalInv(rkey) => match mem.invalidate(scope, rkey) {
                    Ok(()) => WcStatus::Success,
                    Err(_) => WcStatus::LocQpOpErr,
                },
                _ => WcStatus::LocQpOpErr,
            }
        };
        self.req.sq.push_back(
            SendWqe {
                wr: SendQueue::head_of(&wr),
                len: 0,
                first_psn: None,
                npsn: 0,
                next_pkt: 0,
                read_got: 0,
                read_rerequested: false,
                rsn: 0,
                done: true,
                status,
            },
            &wr,
        );
        if self.state == QpState::Err {
            self.enter_error();
        } else {
            self.complete_in_order();
        }
        Ok(())
    }

    /// The QP as memory checks see it.
    pub(super) fn scope(&self) -> QpScope {
        QpScope {
            pd: self.cfg.pd,
            qpn: self.cfg.qpn,
        }
    }

    /// `ibv_post_recv`.
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), VerbsError> {
        self.cfg.check_recv(&wr)?;
        self.post_recv_checked(wr)
    }

    /// Takes a receive that passed [`QpConfig::check_recv`] when it was
    /// posted (as [`Qp::post_send_checked`] for sends): only what depends
    /// on the moment is checked (state, room in the receive queue). The
    /// SGEs' keys are checked when a message lands in them, as RXE and
    /// RNICs do: a bad one completes that receive with LOC_PROT_ERR (and,
    /// on RC, NAKs the sender with a remote operational error).
    pub fn post_recv_checked(&mut self, wr: RecvWr) -> Result<(), VerbsError> {
        debug_assert_eq!(self.cfg.check_recv(&wr).err(), None);
        if self.state == QpState::Reset {
            return Err(VerbsError::InvalidState(self.state));
        }
        if self.recv_queue_len() >= self.cfg.max_recv_wr as usize {
            return Err(VerbsError::QueueFull);
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
        self.resp.rq.push_back(wr);
        Ok(())
    }

    /// Next work completion, in the order the spec demands (send completions
    /// in posting order, receive completions in arrival order).
    #[must_use = "a completion not taken is lost"]
    pub fn poll_completion(&mut self) -> Option<WorkCompletion> {
        self.completions.pop_front()
    }

    /// Request packets in flight: PSNs from the oldest unacknowledged one to
    /// the next one the requester will send (after a go-back, what lies
    /// beyond the resend point counts as lost). What a congestion window
    /// limits; 0 for UC and UD, which get no acknowledgements.
    pub fn packets_in_flight(&self) -> u32 {
        let r = &self.req;
        if self.cfg.qp_type != QpType::Rc
            || r.una_psn == r.next_psn
            || !matches!(self.state, QpState::Rts | QpState::Sqd)
        {
            return 0;
        }
        r.una_psn.distance_to(self.send_position()).max(0) as u32
    }

    /// The PSN of the next request packet the requester will send.
    pub(super) fn send_position(&self) -> Psn {
        for w in self.req.sq.iter().skip(self.req.send_idx) {
            if w.done || w.next_pkt >= w.request_pkts() {
                continue;
            }
            return w.first_psn.map_or(self.req.next_psn, |f| f + w.next_pkt);
        }
        self.req.next_psn
    }

    /// Whether the requester has request packets it has not sent (new work
    /// requests, or resends after a go-back) and may send them (not
    /// waiting for its peer, [`QpAttr::wait_for_peer`]).
    pub fn has_requests_pending(&self) -> bool {
        (self.req.send_idx < self.req.sq.len() || self.req.resend.is_some())
            && !self.attrs.wait_for_peer
    }

    /// Whether the requester's next request packet is a resend after a
    /// go-back (a NAK or timeout rewound it below what it had sent): a
    /// recovery, which a data plane lets out before new requests of other
    /// QPs.
    pub fn go_back_pending(&self) -> bool {
        self.cfg.qp_type == QpType::Rc && self.send_position().distance_to(self.req.sent_high) > 0
    }

    /// Whether the QP waits to hear from its peer before it sends
    /// ([`QpAttr::wait_for_peer`]).
    pub fn waits_for_peer(&self) -> bool {
        self.attrs.wait_for_peer
    }

    /// Whether [`Qp::poll_transmit`] may have a packet: responses queued or
    /// requests pending (a cheap test for a data plane with many idle QPs).
    pub fn has_transmit_pending(&self) -> bool {
        !self.resp.out.is_empty() || self.has_requests_pending()
    }

    /// Whether packets the congestion credit never holds wait to be sent:
    /// responses (ACKs, NAKs, READ responses, atomic ACKs) and selective
    /// resends. A QP with none, and no credit, has nothing to send.
    pub fn has_unheld_pending(&self) -> bool {
        !self.resp.out.is_empty() || self.req.resend.is_some()
    }

    /// Whether completions wait for [`Qp::poll_completion`].
    pub fn has_completions(&self) -> bool {
        !self.completions.is_empty()
    }

    /// The address handle and QP of the peer of a connected RC or UC QP
    /// (from RTR on).
    pub fn remote(&self) -> Option<(u32, Qpn)> {
        (self.cfg.qp_type != QpType::Ud
            && matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd))
        .then_some((self.attrs.ah, self.attrs.dest_qpn))
    }

    /// Lets `credit` more request packets (PSNs) out, `None` for no limit:
    /// the data plane's congestion control sets it before asking for
    /// packets. Responses (ACKs, READ responses) are never held by it.
    pub fn set_request_credit(&mut self, credit: Option<u32>) {
        self.req.credit = credit;
    }

    /// Takes what the requester's path saw since the last call: packets
    /// acknowledged, a round-trip sample, NAK-sequence errors and
    /// timeouts that started a retry, request bytes sent (the input of
    /// congestion control).
    pub fn take_path_events(&mut self) -> PathEvents {
        std::mem::take(&mut self.req.events)
    }

    /// The next time [`Qp::handle_timeout`] must run.
    #[must_use = "the deadline to call handle_timeout at"]
    pub fn poll_timeout(&self) -> Option<Nanos> {
        [self.req.timer, self.req.rnr_until, self.probe_deadline()]
            .into_iter()
            .flatten()
            .min()
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
                "qp {:?}: packets in flight (una {:?}, next {:?}, sending at {:?}) and no timer",
                self.cfg.qpn,
                self.req.una_psn,
                self.req.next_psn,
                self.send_position()
            ));
        }
        Ok(())
    }

    // -------------------------------------------------------------- transmit

    /// The next packet to send, if any: responses first (ACKs, NAKs, READ
    /// responses, atomic ACKs), then requests.
    #[must_use = "a packet not taken is never sent"]
    pub fn poll_transmit(&mut self, now: Nanos) -> Option<Transmit<'_>> {
        let request = self.next_request();
        // Responder packets go first, except a lone coalesced ACK when a
        // request is ready: the ACK is off the peer's critical path, while
        // the request (often the reply to the message being ACKed) is on
        // it. The two are in different PSN spaces, so their order is free.
        let ack_last = request.is_some()
            && self.resp.out.len() == 1
            && matches!(self.resp.out.front(), Some(Out::Ack(_)));
        if !self.resp.out.is_empty() && !ack_last {
            self.counters.sent_pkts += 1;
            return self.poll_response();
        }
        self.poll_request(request?, now)
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
        // A UD QP also takes multicast (QPN 0xFFFFFF): the caller hands it
        // only the groups the QP is attached to.
        let multicast = self.cfg.qp_type == QpType::Ud && pkt.bth().dest_qp().value() == 0xff_ffff;
        if !ok_type || (pkt.bth().dest_qp() != self.cfg.qpn && !multicast) {
            self.counters.dropped_pkts += 1;
            return;
        }
        // The peer's QP sends, so it receives: ours may send too.
        self.attrs.wait_for_peer = false;
        // o11-5.1.1: connected QPs only.
        if self.state == QpState::Rtr && !self.established && self.cfg.qp_type != QpType::Ud {
            self.established = true;
            self.events.push(QpEvent::CommEstablished);
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
        self.check_drained();
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
        (SendOp::AtomicWrite { .. }, _) => 0x1d,
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
        byte_len,
        ..WorkCompletion::of(qpn, wr_id, status, opcode)
    }
}

/// The (required, optional) attributes of a transition `from` -> `to` of
/// a QP of type `t` (IBA 11.2.4.2, Modify Queue Pair; as rdma-core's
/// `ibv_modify_qp` masks name them); `None`: no such transition.
fn transition_attrs(
    from: QpState,
    to: QpState,
    t: QpType,
) -> Option<(&'static [&'static str], &'static [&'static str])> {
    use QpState::{Init, Reset, Rtr, Rts, Sqd, Sqe};
    let r: (&[&str], &[&str]) = match (from, to, t) {
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
        _ => return None,
    };
    Some(r)
}

/// Checks `attr` for a transition to `to`: every required attribute
/// given, none outside the required and optional ones, values in range.
fn check_attrs(
    attr: &QpAttr,
    to: QpState,
    req: &[&'static str],
    opt: &[&'static str],
) -> Result<(), VerbsError> {
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
    if to != QpState::Reset && to != QpState::Err {
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
    Ok(())
}
