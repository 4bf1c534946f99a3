//! rsockets: librdmacm's stream sockets over RC QPs (`rsocket(7)`), in
//! rdma-core's protocol, so a burst rsocket talks to one on RXE or an RNIC
//! (`rstream`, `rcopy`, middleware built on `rsocket`/`rsend`/`rrecv`).
//!
//! How a stream moves (as rdma-core's `rsocket.c` does it): each side
//! advertises, in the CM's private data ([`wire::ConnData`]), half of its
//! receive ring and a small target list the peer may write into. A send is
//! an RDMA WRITE with immediate of the bytes into the space the peer
//! advertised; the immediate says how many ([`wire::Op::Data`]). The
//! receiver copies them out when the application reads and, once half the
//! ring is free again, writes a new SGE into the sender's target list with
//! a credit update ([`wire::Op::Sgl`]). Credits (receive WQEs the receiver
//! has posted) bound the messages in flight; a few send slots stay
//! reserved for control messages (credits, shutdown, disconnect).
//!
//! ```no_run
//! use burst_verbs::rsocket::RSocket;
//! # fn f(cm: &burst_verbs::rdma_cm::RdmaCm) -> std::io::Result<()> {
//! let s = RSocket::new(cm)?;
//! s.connect("198.18.0.2:7471".parse().unwrap())?;
//! s.send(b"hello", 0)?;
//! let mut reply = [0u8; 5];
//! s.recv(&mut reply, libc::MSG_WAITALL)?;
//! # Ok(()) }
//! ```
//!
//! Direct placement (`riomap`/`riowrite`): a side that set
//! `RDMA_IOMAPSIZE` before connecting has an iomap table after its target
//! list; `riomap` registers a buffer and writes its entry into the peer's
//! table with the next send ([`wire::Op::IomapSgl`]), and the peer's
//! `riowrite` is a plain RDMA WRITE into it.
//!
//! Not here: datagram rsockets (`SOCK_DGRAM`, UD), keep-alive messages (the
//! option is kept and reported), and the iWARP variant of the protocol
//! (messages as SENDs).

mod buf;
pub mod wire;

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use burst_transport::{QpAttr, QpState, RecvWr, SendOp, SendWr, Sge, WcStatus};

use self::buf::RawBuf;
use self::wire::{ConnData, Ctrl, Op, RemoteSge};
use crate::engine::{CompChannel, CompletionQueue, Context, QueuePair};
use crate::rdma_cm::RdmaCm;
use crate::rdma_cm::{CmEvent, CmEventKind, CmId, ConnParam, EventChannel, EventParam, PortSpace};
use crate::{Access, InlineData, MrKeys, Pd, QpInit, QpType, SgList};

/// `SOL_RDMA`: rsocket options of their own.
pub const SOL_RDMA: i32 = 0x10000;
/// `RDMA_SQSIZE`: send queue depth (before connecting).
pub const RDMA_SQSIZE: i32 = 0;
/// `RDMA_RQSIZE`: receive queue depth (before connecting).
pub const RDMA_RQSIZE: i32 = 1;
/// `RDMA_INLINE`: bytes sent inline (before connecting).
pub const RDMA_INLINE: i32 = 2;
/// `RDMA_IOMAPSIZE`: iomap entries (accepted and reported; burst maps none).
pub const RDMA_IOMAPSIZE: i32 = 3;

const DEF_INLINE: u32 = 64;
const DEF_SQSIZE: u32 = 384;
const DEF_RQSIZE: u32 = 384;
const DEF_MEM: u32 = 1 << 17;
const DEF_WMEM: u32 = 1 << 17;
const QP_MIN: u32 = 16;
const QP_MAX: u32 = 0xFFFE;
const CTRL_SLOTS: u32 = 4;
const SNDLOWAT: u32 = 2048;
const OLAP_START: usize = 2048;
const MAX_TRANSFER: usize = 65536;
const MAX_CTRL_MSG: u32 = wire::SGE_BYTES as u32;
const RECV_FLAG: u64 = 1 << 63;
/// How long a blocking call polls its CQ before it arms it and sleeps
/// (rdma-core's `polling_time`).
const POLL_SPIN: Duration = Duration::from_micros(10);
/// How long a close waits for its last sends to be acknowledged.
const LINGER: Duration = Duration::from_secs(10);

/// Connection states, as bits (rdma-core's `enum rs_state`).
mod st {
    pub const INIT: u32 = 0;
    pub const BOUND: u32 = 0x1;
    pub const LISTENING: u32 = 0x2;
    pub const OPENING: u32 = 0x4;
    pub const RESOLVING_ADDR: u32 = OPENING | 0x10;
    pub const RESOLVING_ROUTE: u32 = OPENING | 0x20;
    pub const CONNECTING: u32 = OPENING | 0x40;
    pub const ACCEPTING: u32 = OPENING | 0x80;
    pub const CONNECTED: u32 = 0x100;
    pub const WRITABLE: u32 = 0x200;
    pub const READABLE: u32 = 0x400;
    pub const CONNECT_RDWR: u32 = CONNECTED | READABLE | WRITABLE;
    pub const CONNECT_ERROR: u32 = 0x800;
    pub const DISCONNECTED: u32 = 0x1000;
    pub const ERROR: u32 = 0x2000;
}

fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

fn os_errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

/// A stream rsocket. Its descriptor ([`RSocket::fd`]) is its CM event
/// channel's, as rdma-core's is: a real descriptor, so the number is unique
/// among the process's files while the socket lives.
pub struct RSocket {
    st: Mutex<Stream>,
    ch: EventChannel,
}

impl std::fmt::Debug for RSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RSocket({})", self.fd())
    }
}

/// The QP, CQ and buffers of a connection.
struct Endpoint {
    ctx: Context,
    pd: Pd,
    qp: QueuePair,
    cq: CompletionQueue,
    ch: Arc<CompChannel>,
    /// Outgoing bytes (a ring of `sbuf_size`), then the control slots.
    sbuf: RawBuf,
    smr: MrKeys,
    /// The SGEs the peer gives us (remote write).
    target: RawBuf,
    tmr: MrKeys,
    /// Incoming bytes, a ring the peer writes into (remote write).
    rbuf: RawBuf,
    rmr: MrKeys,
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // The QP first: nothing is placed in the buffers once it is gone.
        let _ = self.ctx.destroy_qp(self.qp.qpn());
        let _ = self.ctx.destroy_cq(self.cq.id());
        let _ = self.ctx.destroy_comp_channel(&self.ch);
        for k in [self.smr, self.tmr, self.rmr] {
            let _ = self.ctx.dereg_mr(k.lkey);
        }
        let _ = self.ctx.dealloc_pd(self.pd);
    }
}

/// Buffer and queue sizes (settable until the socket connects).
#[derive(Debug, Clone, Copy)]
struct Sizes {
    sbuf: u32,
    rbuf: u32,
    sq: u32,
    rq: u32,
    inline: u32,
}

/// Socket options kept for `getsockopt` (bits by option name, as rdma-core).
#[derive(Debug, Clone, Copy, Default)]
struct Opts {
    so: u64,
    tcp: u64,
    ipv6: u64,
    tos: i32,
    keepalive_time: u32,
    iomap_size: u32,
}

/// A buffer of ours registered by `riomap`.
struct Mapping {
    offset: u64,
    addr: u64,
    len: u32,
    keys: MrKeys,
    /// Its entry in the peer's iomap table (a writable mapping), and
    /// whether the entry was written there yet.
    slot: Option<usize>,
    sent: bool,
}

struct Stream {
    id: CmId,
    ch: EventChannel,
    state: u32,
    err: i32,
    nonblock: bool,
    size: Sizes,
    opts: Opts,
    ep: Option<Endpoint>,
    cq_armed: bool,
    /// Connect requests a listener's poll took off its channel.
    pending: VecDeque<CmEvent>,

    ctrl_seqno: u32,
    ctrl_max_seqno: u32,
    sseq_no: u16,
    sseq_comp: u16,
    rseq_no: u16,
    rseq_comp: u16,
    /// The peer's target list, and which of its SGEs we write next.
    remote_sgl: RemoteSge,
    remote_sge: u32,
    /// The peer reads SGEs big-endian.
    peer_big: bool,
    /// Which of our target SGEs the next send goes to.
    target_sge: usize,
    /// Entries in our iomap table (after the target SGEs), fixed when the
    /// endpoint is made.
    iomap_size: u32,
    /// The peer's iomap table (length: entries).
    remote_iomap: RemoteSge,
    /// Our `riomap`ped buffers.
    maps: Vec<Mapping>,
    /// Lengths of the messages received and not yet read.
    rmsg: VecDeque<u32>,
    rbuf_bytes_avail: u32,
    rbuf_free_offset: u32,
    rbuf_offset: u32,
    sqe_avail: u32,
    sbuf_bytes_avail: u32,
    /// Where the next copy into the send ring goes.
    sbuf_at: u32,
}

impl Stream {
    fn new(id: CmId, ch: EventChannel, size: Sizes, opts: Opts, nonblock: bool) -> Stream {
        Stream {
            id,
            ch,
            state: st::INIT,
            err: 0,
            nonblock,
            size,
            opts,
            ep: None,
            cq_armed: false,
            pending: VecDeque::new(),
            ctrl_seqno: 0,
            ctrl_max_seqno: CTRL_SLOTS,
            sseq_no: 0,
            sseq_comp: 0,
            rseq_no: 0,
            rseq_comp: 0,
            remote_sgl: RemoteSge::default(),
            remote_sge: 0,
            peer_big: false,
            target_sge: 0,
            iomap_size: 0,
            remote_iomap: RemoteSge::default(),
            maps: Vec::new(),
            rmsg: VecDeque::new(),
            rbuf_bytes_avail: 0,
            rbuf_free_offset: 0,
            rbuf_offset: 0,
            sqe_avail: 0,
            sbuf_bytes_avail: 0,
            sbuf_at: 0,
        }
    }

    // ------------------------------------------------------------ set-up

    /// Creates the QP, CQ and registered buffers, and posts the receives.
    fn create_ep(&mut self) -> io::Result<()> {
        let ctx = self.id.context().ok_or_else(|| errno(libc::EINVAL))?;
        let s = &mut self.size;
        s.sq = s.sq.clamp(QP_MIN, QP_MAX);
        s.rq = s.rq.clamp(QP_MIN, QP_MAX);
        s.rbuf = s.rbuf.max(2 * SNDLOWAT);
        s.sbuf = s.sbuf.max(2 * SNDLOWAT);
        let s = *s;
        let ctrl_bytes = if s.inline < MAX_CTRL_MSG {
            MAX_CTRL_MSG * CTRL_SLOTS
        } else {
            0
        };
        let sbuf = RawBuf::new((s.sbuf + ctrl_bytes) as usize)?;
        self.iomap_size = self.opts.iomap_size;
        let target = RawBuf::new(
            wire::SGL_SIZE * wire::SGE_BYTES + self.iomap_size as usize * wire::IOMAP_BYTES,
        )?;
        let rbuf = RawBuf::new(s.rbuf as usize)?;
        let pd = ctx.alloc_pd();
        let mut keys = Vec::with_capacity(3);
        let remote = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        for (b, a) in [
            (&sbuf, Access::LOCAL_WRITE),
            (&target, remote),
            (&rbuf, remote),
        ] {
            // SAFETY: the buffers live in the endpoint, which deregisters
            // them before they are freed (field order: `Endpoint::drop`
            // runs before its fields drop).
            match unsafe { ctx.reg_mr(pd, b.ptr(), b.len(), a) } {
                Ok(k) => keys.push(k),
                Err(e) => {
                    for k in &keys {
                        let _ = ctx.dereg_mr(k.lkey);
                    }
                    let _ = ctx.dealloc_pd(pd);
                    return Err(errno(e.errno()));
                }
            }
        }
        let undo_keys = |ctx: &Context| {
            for k in &keys {
                let _ = ctx.dereg_mr(k.lkey);
            }
            let _ = ctx.dealloc_pd(pd);
        };
        let ch = match ctx.create_comp_channel() {
            Ok(ch) => ch,
            Err(e) => {
                undo_keys(&ctx);
                return Err(e);
            }
        };
        let cq_id = ctx.create_cq_with((s.sq + s.rq) as usize, Some(ch.clone()));
        let Some(cq) = ctx.cq(cq_id) else {
            let _ = ctx.destroy_comp_channel(&ch);
            undo_keys(&ctx);
            return Err(errno(libc::ENOMEM));
        };
        let mut init = QpInit::new(QpType::Rc, pd);
        init.caps.max_send_wr = s.sq;
        init.caps.max_recv_wr = s.rq;
        init.caps.max_send_sge = 2;
        init.caps.max_recv_sge = 1;
        init.caps.max_inline_data = s.inline;
        let qp = match self.id.create_qp(&init, &cq, &cq) {
            Ok(qp) => qp,
            Err(e) => {
                let _ = ctx.destroy_cq(cq_id);
                let _ = ctx.destroy_comp_channel(&ch);
                undo_keys(&ctx);
                return Err(e);
            }
        };
        self.ep = Some(Endpoint {
            ctx,
            pd,
            qp,
            cq,
            ch,
            sbuf,
            smr: keys[0],
            target,
            tmr: keys[1],
            rbuf,
            rmr: keys[2],
        });
        self.sbuf_bytes_avail = s.sbuf;
        self.sbuf_at = 0;
        self.rbuf_free_offset = s.rbuf / 2;
        self.rbuf_bytes_avail = s.rbuf / 2;
        self.sqe_avail = s.sq - self.ctrl_max_seqno;
        self.rseq_comp = (s.rq / 2) as u16;
        for _ in 0..s.rq {
            self.post_recv()?;
        }
        Ok(())
    }

    fn ep(&self) -> io::Result<&Endpoint> {
        self.ep.as_ref().ok_or_else(|| errno(libc::ENOTCONN))
    }

    fn format_conn_data(&self) -> io::Result<ConnData> {
        let ep = self.ep()?;
        Ok(ConnData {
            version: wire::VERSION,
            flags: wire::FLAG_IOMAP
                | if cfg!(target_endian = "big") {
                    wire::FLAG_NET
                } else {
                    0
                },
            credits: self.size.rq as u16,
            target_iomap_size: wire::value_to_scale(self.iomap_size),
            target_sgl: RemoteSge {
                addr: ep.target.addr(0),
                key: ep.tmr.rkey,
                length: wire::SGL_SIZE as u32,
            },
            data_buf: RemoteSge {
                addr: ep.rbuf.addr(0),
                key: ep.rmr.rkey,
                length: self.size.rbuf / 2,
            },
        })
    }

    /// Takes the peer's connection data; `EPROTO` for one this side cannot
    /// follow (another version, an empty target list).
    fn save_conn_data(&mut self, c: &ConnData) -> io::Result<()> {
        if c.version != wire::VERSION || c.target_sgl.length == 0 {
            return Err(errno(libc::EPROTO));
        }
        self.remote_sgl = c.target_sgl;
        self.remote_sge = 1;
        self.peer_big = c.flags & wire::FLAG_NET != 0;
        if c.flags & wire::FLAG_IOMAP != 0 {
            self.remote_iomap = RemoteSge {
                addr: c
                    .target_sgl
                    .addr
                    .wrapping_add(u64::from(c.target_sgl.length) * wire::SGE_BYTES as u64),
                key: c.target_sgl.key,
                length: wire::scale_to_value(c.target_iomap_size),
            };
        }
        self.set_target(0, c.data_buf);
        self.target_sge = 0;
        self.sseq_comp = c.credits;
        Ok(())
    }

    fn target(&self, i: usize) -> RemoteSge {
        let Some(ep) = &self.ep else {
            return RemoteSge::default();
        };
        let at = i * wire::SGE_BYTES;
        RemoteSge {
            addr: ep.target.load_u64(at),
            key: ep.target.load_u32(at + 8),
            length: ep.target.load_u32(at + 12),
        }
    }

    fn set_target(&self, i: usize, s: RemoteSge) {
        if let Some(ep) = &self.ep {
            let at = i * wire::SGE_BYTES;
            ep.target.store_u64(at, s.addr);
            ep.target.store_u32(at + 8, s.key);
            ep.target.store_u32(at + 12, s.length);
        }
    }

    // ------------------------------------------------------------ posting

    fn post_recv(&self) -> io::Result<()> {
        let wr = RecvWr {
            wr_id: RECV_FLAG,
            sg_list: [].into(),
        };
        self.ep()?.qp.post_recv(&wr).map_err(|e| errno(e.errno()))
    }

    /// Posts a WRITE with immediate `msg` (the completion's wr_id carries
    /// it too): of `sges` from the send ring, or of `inline` bytes.
    fn post_write_msg(
        &self,
        msg: u32,
        sges: &[Sge],
        inline: Option<&[u8]>,
        remote_addr: u64,
        rkey: u32,
    ) -> io::Result<()> {
        let op = SendOp::WriteWithImm {
            remote_addr,
            rkey,
            imm: msg,
        };
        self.post_write(op, msg, sges, inline)
    }

    /// Posts `op` (a WRITE, with immediate or not) whose completion carries
    /// `msg`.
    fn post_write(
        &self,
        op: SendOp,
        msg: u32,
        sges: &[Sge],
        inline: Option<&[u8]>,
    ) -> io::Result<()> {
        let ep = self.ep()?;
        let mut list = SgList::default();
        for s in sges {
            list.push(*s).map_err(|_| errno(libc::EINVAL))?;
        }
        let mut wr = SendWr::new(u64::from(msg), op, list);
        if let Some(bytes) = inline {
            let mut d = InlineData::zeroed(bytes.len()).map_err(|_| errno(libc::EINVAL))?;
            d.copy_from_slice(bytes);
            wr.sg_list = [Sge {
                addr: bytes.as_ptr() as u64,
                length: bytes.len() as u32,
                lkey: 0,
            }]
            .into();
            wr.inline = true;
            wr.inline_data = Some(d);
        }
        ep.qp.post_send(&wr).map_err(|e| errno(e.errno()))
    }

    fn ctrl_avail(&self) -> bool {
        self.ctrl_seqno != self.ctrl_max_seqno
    }

    /// Tells the peer how many messages it may send, and gives it the next
    /// half of the receive ring when that half is free.
    fn send_credits(&mut self) -> io::Result<()> {
        self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
        self.rseq_comp = self.rseq_no.wrapping_add((self.size.rq / 2) as u16);
        let credits = u32::from(self.rseq_no) + self.size.rq;
        let msg = wire::msg(Op::Sgl, credits);
        let half = self.size.rbuf / 2;
        if self.rbuf_bytes_avail < half {
            return self.post_write_msg(msg, &[], None, 0, 0);
        }
        let ep = self.ep()?;
        let sge = RemoteSge {
            addr: ep.rbuf.addr(self.rbuf_free_offset as usize),
            key: ep.rmr.rkey,
            length: half,
        }
        .to_bytes(self.peer_big);
        let to = self
            .remote_sgl
            .addr
            .wrapping_add(u64::from(self.remote_sge) * wire::SGE_BYTES as u64);
        if self.size.inline < MAX_CTRL_MSG {
            let at = self.size.sbuf + MAX_CTRL_MSG * (self.ctrl_seqno & (CTRL_SLOTS - 1));
            ep.sbuf.write(at as usize, &sge);
            let s = Sge {
                addr: ep.sbuf.addr(at as usize),
                length: MAX_CTRL_MSG,
                lkey: ep.smr.lkey,
            };
            self.post_write_msg(msg, &[s], None, to, self.remote_sgl.key)?;
        } else {
            self.post_write_msg(msg, &[], Some(&sge), to, self.remote_sgl.key)?;
        }
        self.rbuf_bytes_avail -= half;
        self.rbuf_free_offset += half;
        if self.rbuf_free_offset >= self.size.rbuf {
            self.rbuf_free_offset = 0;
        }
        self.remote_sge += 1;
        if self.remote_sge >= self.remote_sgl.length {
            self.remote_sge = 0;
        }
        Ok(())
    }

    fn give_credits(&self) -> bool {
        (self.rbuf_bytes_avail >= self.size.rbuf / 2
            || (self.rseq_no.wrapping_sub(self.rseq_comp) as i16) >= 0)
            && self.ctrl_avail()
            && self.state & st::CONNECTED != 0
    }

    fn update_credits(&mut self) {
        if self.give_credits() {
            if let Err(e) = self.send_credits() {
                self.fail(os_errno(&e));
            }
        }
    }

    fn fail(&mut self, e: i32) {
        tracing::debug!(errno = e, "rsocket: connection failed");
        self.state = st::ERROR;
        self.err = e;
    }

    // ------------------------------------------------------------ progress

    /// Takes every completion waiting; reposts the receives they used.
    fn poll_cq(&mut self) {
        let Some(ep) = &self.ep else { return };
        let cq = ep.cq.clone();
        let mut rcnt = 0u32;
        // One poll that may step the lane, then only what the ring holds
        // (`CompletionQueue::poll_held`: the ACK of what arrived goes with
        // the reply).
        let mut next = cq.poll();
        while let Some(wc) = next.take() {
            next = cq.poll_held();
            if wc.wr_id & RECV_FLAG != 0 {
                if wc.status != WcStatus::Success {
                    // Flushed: the QP went to the error state (the
                    // connection is gone); anything else is an error.
                    if self.state & st::CONNECTED != 0 {
                        if wc.status == WcStatus::WrFlushErr {
                            self.state = st::DISCONNECTED;
                        } else {
                            self.fail(libc::EIO);
                        }
                    }
                    continue;
                }
                rcnt += 1;
                let Some(imm) = wc.imm_data else {
                    // A SEND: the iWARP form of the protocol, not used on
                    // RoCE.
                    continue;
                };
                match wire::parse(imm) {
                    (Op::Sgl, credits) => self.sseq_comp = credits as u16,
                    (Op::Ctrl, c) if c == Ctrl::Disconnect as u32 => {
                        self.state = st::DISCONNECTED;
                        return;
                    }
                    (Op::Ctrl, c) if c == Ctrl::Shutdown as u32 => {
                        if self.state & st::WRITABLE != 0 {
                            self.state &= !st::READABLE;
                        } else {
                            self.state = st::DISCONNECTED;
                            return;
                        }
                    }
                    (Op::Data, len) => {
                        // A peer that ignores its credits or names more bytes
                        // than the ring holds breaks the stream.
                        if self.rmsg.len() > self.size.rq as usize || len > self.size.rbuf {
                            tracing::warn!(
                                len,
                                queued = self.rmsg.len(),
                                "rsocket: the peer sent past its credits or the ring"
                            );
                            self.fail(libc::EPROTO);
                            return;
                        }
                        self.rmsg.push_back(len);
                    }
                    // Keep-alives, iomap updates and kinds this side does not
                    // know need nothing.
                    _ => {}
                }
            } else {
                match wire::parse(wc.wr_id as u32) {
                    (Op::Sgl, _) => self.ctrl_max_seqno = self.ctrl_max_seqno.wrapping_add(1),
                    (Op::Ctrl, c) => {
                        self.ctrl_max_seqno = self.ctrl_max_seqno.wrapping_add(1);
                        if c == Ctrl::Disconnect as u32 {
                            self.state = st::DISCONNECTED;
                        }
                    }
                    (Op::IomapSgl, _) => {
                        self.sqe_avail += 1;
                        self.sbuf_bytes_avail = self
                            .sbuf_bytes_avail
                            .saturating_add(wire::IOMAP_BYTES as u32);
                    }
                    (_, len) => {
                        self.sqe_avail += 1;
                        self.sbuf_bytes_avail = self.sbuf_bytes_avail.saturating_add(len);
                    }
                }
                if wc.status != WcStatus::Success && self.state & st::CONNECTED != 0 {
                    self.fail(libc::EIO);
                }
            }
        }
        if self.state & st::CONNECTED != 0 {
            for _ in 0..rcnt {
                if let Err(e) = self.post_recv() {
                    self.fail(os_errno(&e));
                    break;
                }
            }
        }
    }

    fn process(&mut self) {
        self.update_credits();
        self.poll_cq();
    }

    /// Takes the CQ's event after a wait (the CQ is to be armed again).
    fn take_cq_events(&mut self) {
        if !self.cq_armed {
            return;
        }
        if let Some(ep) = &self.ep {
            let mut got = false;
            while ep.ch.try_get_cq_event().is_some() {
                got = true;
            }
            if got {
                self.cq_armed = false;
            }
        }
    }

    fn arm(&mut self) {
        if let Some(ep) = &self.ep {
            if !self.cq_armed && ep.ctx.req_notify_cq(ep.cq.id()).is_ok() {
                self.cq_armed = true;
            }
        }
    }

    /// The descriptors a waiter sleeps on: the CM channel, and the CQ's
    /// channel once there is one.
    fn wait_fds(&self) -> ([RawFd; 2], usize) {
        let cm = self.ch.as_fd().as_raw_fd();
        match &self.ep {
            Some(ep) => ([cm, ep.ch.fd()], 2),
            None => ([cm, -1], 1),
        }
    }

    /// Handles the CM events of a connected socket (a disconnect).
    fn check_cm(&mut self) {
        if self.state & (st::OPENING | st::LISTENING) != 0 {
            return;
        }
        while let Ok(ev) = self.ch.get_event() {
            if ev.kind == CmEventKind::Disconnected && self.state & st::CONNECTED != 0 {
                self.state = st::DISCONNECTED;
            }
        }
    }

    // ------------------------------------------------------------ tests

    fn can_send(&self) -> bool {
        self.sqe_avail > 0
            && self.sbuf_bytes_avail >= SNDLOWAT
            && self.sseq_no != self.sseq_comp
            && self.target(self.target_sge).length != 0
    }

    fn conn_can_send(&self) -> bool {
        self.can_send() || self.state & st::WRITABLE == 0
    }

    fn conn_can_send_ctrl(&self) -> bool {
        self.ctrl_avail() || self.state & st::CONNECTED == 0
    }

    fn have_rdata(&self) -> bool {
        !self.rmsg.is_empty()
    }

    fn conn_have_rdata(&self) -> bool {
        self.have_rdata() || self.state & st::READABLE == 0
    }

    fn conn_all_sends_done(&self) -> bool {
        self.ctrl_max_seqno
            .wrapping_sub(self.ctrl_seqno)
            .wrapping_add(self.sqe_avail)
            == self.size.sq
            || self.state & st::CONNECTED == 0
    }

    // ------------------------------------------------------------ connecting

    /// The next CM event of this id, waiting for one when `block`.
    fn next_event(&self, block: bool) -> io::Result<CmEvent> {
        loop {
            match self.ch.get_event() {
                Ok(ev) => return Ok(ev),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && block => {
                    wait(&[self.ch.as_fd().as_raw_fd()], None)?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Drives connection set-up as far as its events allow: `EINPROGRESS`
    /// while it waits for one (`nonblock`), the connection's error once it
    /// failed.
    fn do_connect(&mut self, nonblock: bool) -> io::Result<()> {
        let r = self.connect_steps(nonblock);
        if let Err(e) = &r {
            let e = os_errno(e);
            if e != libc::EINPROGRESS && self.state & st::OPENING != 0 {
                self.state = st::CONNECT_ERROR;
                self.err = e;
            }
        }
        r
    }

    fn connect_steps(&mut self, nonblock: bool) -> io::Result<()> {
        loop {
            match self.state {
                st::RESOLVING_ADDR | st::RESOLVING_ROUTE | st::CONNECTING | st::ACCEPTING => {}
                st::CONNECT_ERROR | st::DISCONNECTED | st::ERROR => {
                    return Err(errno(libc::ENOTCONN));
                }
                s if s & st::CONNECTED != 0 => return Ok(()),
                _ => return Err(errno(libc::EINVAL)),
            }
            let ev = match self.next_event(!nonblock) {
                Ok(ev) => ev,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return Err(errno(libc::EINPROGRESS));
                }
                Err(e) => return Err(e),
            };
            let failed = |status: i32, or: i32| errno(if status < 0 { -status } else { or });
            match (self.state, ev.kind) {
                (st::RESOLVING_ADDR, CmEventKind::AddrResolved) => {
                    self.id.resolve_route()?;
                    self.state = st::RESOLVING_ROUTE;
                }
                (st::RESOLVING_ROUTE, CmEventKind::RouteResolved) => {
                    self.create_ep()?;
                    let param = ConnParam {
                        private_data: self.format_conn_data()?.to_bytes().to_vec(),
                        flow_control: true,
                        retry_count: 7,
                        rnr_retry_count: 7,
                        ..ConnParam::default()
                    };
                    self.id.connect(Some(&param))?;
                    self.state = st::CONNECTING;
                }
                (st::CONNECTING, CmEventKind::Established) => {
                    let EventParam::Conn(p) = &ev.param else {
                        return Err(errno(libc::EPROTO));
                    };
                    let c = ConnData::parse(&p.private_data).ok_or_else(|| errno(libc::EPROTO))?;
                    self.save_conn_data(&c)?;
                    self.state = st::CONNECT_RDWR;
                }
                (st::ACCEPTING, CmEventKind::Established) => self.state = st::CONNECT_RDWR,
                (_, CmEventKind::Rejected) => return Err(errno(libc::ECONNREFUSED)),
                (_, CmEventKind::Unreachable) => return Err(failed(ev.status, libc::ETIMEDOUT)),
                (_, CmEventKind::AddrError) => return Err(failed(ev.status, libc::EHOSTUNREACH)),
                (_, CmEventKind::ConnectError) => {
                    return Err(failed(ev.status, libc::ECONNREFUSED))
                }
                (_, CmEventKind::Disconnected) => return Err(errno(libc::ECONNRESET)),
                // Events of no interest here (a connect response of an id
                // without a QP does not happen: the id has ours).
                _ => {}
            }
        }
    }
}

/// Waits until one of `fds` is readable (or `timeout` passes).
fn wait(fds: &[RawFd], timeout: Option<Duration>) -> io::Result<()> {
    let mut p: [libc::pollfd; 2] = [libc::pollfd {
        fd: -1,
        events: libc::POLLIN,
        revents: 0,
    }; 2];
    let n = fds.len().min(2);
    for (q, &fd) in p.iter_mut().zip(fds) {
        q.fd = fd;
    }
    let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
    // SAFETY: `p` holds `n` initialised pollfds.
    let r = unsafe { libc::poll(p.as_mut_ptr(), n as libc::nfds_t, ms) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A CM event channel whose descriptor never blocks (waits are `poll`s).
fn nonblocking_channel() -> io::Result<EventChannel> {
    let ch = EventChannel::new()?;
    let fd = ch.as_fd().as_raw_fd();
    // SAFETY: fcntl on a descriptor the channel owns.
    let ok = unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        fl >= 0 && libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) == 0
    };
    if !ok {
        return Err(io::Error::last_os_error());
    }
    Ok(ch)
}

/// `SHUT_RD`, `SHUT_WR`, `SHUT_RDWR`.
pub use std::net::Shutdown;

impl RSocket {
    /// `rsocket(AF_INET or AF_INET6, SOCK_STREAM, 0)` on `cm`'s devices.
    pub fn new(cm: &RdmaCm) -> io::Result<RSocket> {
        let ch = nonblocking_channel()?;
        let id = cm.create_id(&ch, PortSpace::Tcp);
        let size = Sizes {
            sbuf: DEF_WMEM,
            rbuf: DEF_MEM,
            sq: DEF_SQSIZE,
            rq: DEF_RQSIZE,
            inline: DEF_INLINE,
        };
        Ok(RSocket {
            st: Mutex::new(Stream::new(id, ch.clone(), size, Opts::default(), false)),
            ch,
        })
    }

    /// The socket's descriptor (see [`RSocket`]).
    pub fn fd(&self) -> RawFd {
        self.ch.as_fd().as_raw_fd()
    }

    fn lock(&self) -> MutexGuard<'_, Stream> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `rbind`.
    pub fn bind(&self, a: SocketAddr) -> io::Result<()> {
        let mut s = self.lock();
        s.id.bind_addr(a)?;
        s.state = st::BOUND;
        Ok(())
    }

    /// `rlisten` (the backlog is the CM's).
    pub fn listen(&self) -> io::Result<()> {
        let mut s = self.lock();
        if s.state == st::LISTENING {
            return Ok(());
        }
        s.id.listen()?;
        s.state = st::LISTENING;
        Ok(())
    }

    /// `raccept`: the next connection, set up with rsocket's connection
    /// data (`EAGAIN` on a non-blocking listener with none waiting). A
    /// request this side cannot take (another protocol version) is
    /// rejected and the next one awaited.
    pub fn accept(&self) -> io::Result<RSocket> {
        loop {
            let mut s = self.lock();
            if s.state != st::LISTENING {
                return Err(errno(libc::EINVAL));
            }
            let ev = match s.pending.pop_front() {
                Some(ev) => ev,
                None => match s.ch.get_event() {
                    Ok(ev) => ev,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock && !s.nonblock => {
                        drop(s);
                        wait(&[self.fd()], None)?;
                        continue;
                    }
                    Err(e) => return Err(e),
                },
            };
            if ev.kind != CmEventKind::ConnectRequest {
                continue;
            }
            let (size, opts, nonblock) = (s.size, s.opts, s.nonblock);
            drop(s);
            match Self::take_request(ev, size, opts, nonblock) {
                Ok(rs) => return Ok(rs),
                Err(e) => tracing::info!(error = %e, "raccept: a connection request was refused"),
            }
        }
    }

    fn take_request(ev: CmEvent, size: Sizes, opts: Opts, nonblock: bool) -> io::Result<RSocket> {
        let id = ev.id;
        let refuse = |id: &CmId, e: io::Error| {
            let _ = id.reject(&[]);
            id.destroy();
            e
        };
        let ch = match nonblocking_channel() {
            Ok(ch) => ch,
            Err(e) => return Err(refuse(&id, e)),
        };
        id.migrate(&ch);
        let EventParam::Conn(p) = ev.param else {
            return Err(refuse(&id, errno(libc::EPROTO)));
        };
        let mut s = Stream::new(id.clone(), ch.clone(), size, opts, nonblock);
        let setup = ConnData::parse(&p.private_data)
            .ok_or_else(|| errno(libc::EPROTO))
            .and_then(|c| {
                if c.version != wire::VERSION {
                    return Err(errno(libc::EPROTO));
                }
                s.create_ep()?;
                s.save_conn_data(&c)?;
                s.format_conn_data()
            });
        let ours = match setup {
            Ok(c) => c,
            Err(e) => {
                drop(s.ep.take());
                return Err(refuse(&id, e));
            }
        };
        let param = ConnParam {
            private_data: ours.to_bytes().to_vec(),
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            flow_control: p.flow_control,
            retry_count: p.retry_count,
            rnr_retry_count: p.rnr_retry_count,
            ..ConnParam::default()
        };
        if let Err(e) = id.accept(Some(&param)) {
            drop(s.ep.take());
            return Err(refuse(&id, e));
        }
        s.state = st::ACCEPTING;
        let rs = RSocket {
            st: Mutex::new(s),
            ch,
        };
        if !nonblock {
            rs.lock().do_connect(false)?;
        }
        Ok(rs)
    }

    /// `rconnect`: `EINPROGRESS` on a non-blocking socket (then poll for
    /// `POLLOUT` and read [`RSocket::take_error`]).
    pub fn connect(&self, to: SocketAddr) -> io::Result<()> {
        let mut s = self.lock();
        if matches!(s.state, st::INIT | st::BOUND) {
            s.id.resolve_addr(None, to)?;
            s.state = st::RESOLVING_ADDR;
        }
        let nb = s.nonblock;
        s.do_connect(nb)
    }

    /// Blocks (unless `nonblock`) until `test` holds, taking completions and
    /// giving credits meanwhile; the lock is let go while it sleeps.
    fn get_comp<'a>(
        &'a self,
        mut s: MutexGuard<'a, Stream>,
        nonblock: bool,
        test: fn(&Stream) -> bool,
        deadline: Option<Instant>,
    ) -> (MutexGuard<'a, Stream>, io::Result<()>) {
        let start = Instant::now();
        loop {
            s.process();
            if test(&s) {
                s.update_credits();
                return (s, Ok(()));
            }
            if nonblock {
                return (s, Err(errno(libc::EWOULDBLOCK)));
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return (s, Err(errno(libc::ETIMEDOUT)));
            }
            if start.elapsed() < POLL_SPIN {
                continue;
            }
            if !s.cq_armed {
                // Armed, then looked at once more: a completion that came
                // before the arm is not waited for.
                s.arm();
                continue;
            }
            let (fds, n) = s.wait_fds();
            drop(s);
            let slice = Duration::from_millis(500);
            let t = deadline.map_or(slice, |d| {
                d.saturating_duration_since(Instant::now()).min(slice)
            });
            let waited = wait(&fds[..n], Some(t));
            s = self.lock();
            s.take_cq_events();
            s.check_cm();
            if let Err(e) = waited {
                return (s, Err(e));
            }
        }
    }

    /// The stream locked for a send or receive with `flags`, and whether
    /// the call must not block: set-up finished first when it is still
    /// under way (`EAGAIN` while it waits, non-blocking), `ENOTCONN` for a
    /// socket that never connected.
    fn stream(&self, flags: i32) -> io::Result<(MutexGuard<'_, Stream>, bool)> {
        let mut s = self.lock();
        let nonblock = s.nonblock || flags & libc::MSG_DONTWAIT != 0;
        if s.state & st::OPENING != 0 {
            s.do_connect(nonblock).map_err(in_progress_is_again)?;
        }
        if s.state & (st::CONNECTED | st::DISCONNECTED | st::ERROR) == 0 {
            return Err(errno(libc::ENOTCONN));
        }
        Ok((s, nonblock))
    }

    /// `rsend`: as much of `buf` as the peer has room for (all of it when
    /// blocking); `EAGAIN` when non-blocking (or `MSG_DONTWAIT`) and there
    /// is no room; `ECONNRESET` once the stream cannot send.
    pub fn send(&self, buf: &[u8], flags: i32) -> io::Result<usize> {
        let (mut s, nonblock) = self.stream(flags)?;
        // (rdma-core looks only when it has to wait, so a send after
        // SHUT_WR with room left went out; a peer that read the shutdown
        // does not expect it.)
        if s.state & st::WRITABLE == 0 {
            return Err(errno(libc::ECONNRESET));
        }
        let (g, r) = self.send_iomaps(s, nonblock);
        s = g;
        r?;
        let mut done = 0usize;
        let mut olen = OLAP_START;
        let mut err = None;
        while done < buf.len() {
            let (g, r) = self.room(s, nonblock);
            s = g;
            if let Err(e) = r {
                err = Some(e);
                break;
            }
            let mut xfer = next_piece(&mut olen, buf.len() - done);
            let t = s.target(s.target_sge);
            xfer = xfer.min(s.sbuf_bytes_avail as usize).min(t.length as usize);
            if let Err(e) = s.write_data(&buf[done..done + xfer], t) {
                err = Some(e);
                break;
            }
            done += xfer;
        }
        match err {
            Some(e) if done == 0 => Err(e),
            _ => Ok(done),
        }
    }

    /// Waits (unless `nonblock`) until a message may go: a send slot, room
    /// in the send ring, a credit and a target SGE; `ECONNRESET` once the
    /// stream cannot send.
    fn room<'a>(
        &'a self,
        s: MutexGuard<'a, Stream>,
        nonblock: bool,
    ) -> (MutexGuard<'a, Stream>, io::Result<()>) {
        if s.can_send() {
            return (s, Ok(()));
        }
        let (s, r) = self.get_comp(s, nonblock, Stream::conn_can_send, None);
        if let Err(e) = r {
            return (s, Err(e));
        }
        if s.state & st::WRITABLE == 0 {
            return (s, Err(errno(libc::ECONNRESET)));
        }
        (s, Ok(()))
    }

    /// Writes the entries of new writable mappings into the peer's iomap
    /// table (each a WRITE with immediate, as a data message).
    fn send_iomaps<'a>(
        &'a self,
        mut s: MutexGuard<'a, Stream>,
        nonblock: bool,
    ) -> (MutexGuard<'a, Stream>, io::Result<()>) {
        while let Some(i) = s.maps.iter().position(|m| m.slot.is_some() && !m.sent) {
            let (g, r) = self.room(s, nonblock);
            s = g;
            if let Err(e) = r {
                return (s, Err(e));
            }
            let m = &s.maps[i];
            let slot = m.slot.unwrap_or_default();
            let entry = wire::IoMap {
                offset: m.offset,
                sge: RemoteSge {
                    addr: m.addr,
                    key: m.keys.rkey,
                    length: m.len,
                },
            }
            .to_bytes(s.peer_big);
            let msg = wire::msg(Op::IomapSgl, slot as u32);
            let op = SendOp::WriteWithImm {
                remote_addr: s
                    .remote_iomap
                    .addr
                    .wrapping_add((slot * wire::IOMAP_BYTES) as u64),
                rkey: s.remote_iomap.key,
                imm: msg,
            };
            if let Err(e) = s.write_staged(op, msg, &entry) {
                return (s, Err(e));
            }
            s.sseq_no = s.sseq_no.wrapping_add(1);
            s.sqe_avail -= 1;
            s.sbuf_bytes_avail -= wire::IOMAP_BYTES as u32;
            s.maps[i].sent = true;
        }
        (s, Ok(()))
    }

    /// `riomap`: registers `len` bytes at `buf` for the peer to write with
    /// `riowrite` at offsets `offset..offset + len` (`None`: the buffer's
    /// address), when `writable`; a mapping that is not writable is only
    /// registered, as rdma-core's. The entry reaches the peer with the
    /// next send. `ENOMEM` when the peer's iomap table (its
    /// `RDMA_IOMAPSIZE`) is full, `EINVAL` before the socket connects.
    ///
    /// # Safety
    /// `buf..buf + len` must stay valid until [`RSocket::iounmap`] of it or
    /// the socket's close; the peer writes it at any time meanwhile.
    pub unsafe fn iomap(
        &self,
        buf: *mut u8,
        len: usize,
        writable: bool,
        offset: Option<u64>,
    ) -> io::Result<u64> {
        let mut s = self.lock();
        let Some(ep) = &s.ep else {
            return Err(errno(libc::EINVAL));
        };
        let len32 = u32::try_from(len).map_err(|_| errno(libc::EINVAL))?;
        let slot = if writable {
            let used: Vec<usize> = s.maps.iter().filter_map(|m| m.slot).collect();
            let free = (0..s.remote_iomap.length as usize).find(|i| !used.contains(i));
            Some(free.ok_or_else(|| errno(libc::ENOMEM))?)
        } else {
            None
        };
        let access = if writable {
            Access::LOCAL_WRITE | Access::REMOTE_WRITE
        } else {
            Access::LOCAL_WRITE
        };
        // SAFETY: the caller's contract: the buffer outlives the mapping.
        let keys =
            unsafe { ep.ctx.reg_mr(ep.pd, buf, len, access) }.map_err(|e| errno(e.errno()))?;
        let offset = offset.unwrap_or(buf as u64);
        s.maps.push(Mapping {
            offset,
            addr: buf as u64,
            len: len32,
            keys,
            slot,
            sent: false,
        });
        Ok(offset)
    }

    /// `riounmap`: ends the mapping of exactly `buf`, `len` (`EINVAL` when
    /// there is none).
    pub fn iounmap(&self, buf: *mut u8, len: usize) -> io::Result<()> {
        let mut s = self.lock();
        let Some(i) = s
            .maps
            .iter()
            .position(|m| m.addr == buf as u64 && m.len as usize == len)
        else {
            return Err(errno(libc::EINVAL));
        };
        let m = s.maps.remove(i);
        if let Some(ep) = &s.ep {
            let _ = ep.ctx.dereg_mr(m.keys.lkey);
        }
        Ok(())
    }

    /// `riowrite`: writes `buf` into the peer's memory it mapped at
    /// `offset..` (an RDMA WRITE: the peer's application sees the bytes, no
    /// receive completes). How many bytes went (0 when no mapping of the
    /// peer's holds `offset`).
    pub fn iowrite(&self, buf: &[u8], offset: u64, flags: i32) -> io::Result<usize> {
        let mut s = self.lock();
        let nonblock = s.nonblock || flags & libc::MSG_DONTWAIT != 0;
        if s.state & st::WRITABLE == 0 {
            return Err(errno(if s.state & st::CONNECTED == 0 {
                libc::ENOTCONN
            } else {
                libc::ECONNRESET
            }));
        }
        let (g, r) = self.send_iomaps(s, nonblock);
        s = g;
        r?;
        let mut done = 0usize;
        let mut olen = OLAP_START;
        let mut err = None;
        while done < buf.len() {
            let at = offset.wrapping_add(done as u64);
            let Some(m) = s.find_iomap(at) else { break };
            let (g, r) = self.room(s, nonblock);
            s = g;
            if let Err(e) = r {
                err = Some(e);
                break;
            }
            let mut xfer = next_piece(&mut olen, buf.len() - done);
            let room = m.offset + u64::from(m.sge.length) - at;
            xfer = xfer
                .min(s.sbuf_bytes_avail as usize)
                .min(usize::try_from(room).unwrap_or(usize::MAX));
            let msg = wire::msg(Op::Write, xfer as u32);
            let op = SendOp::Write {
                remote_addr: m.sge.addr.wrapping_add(at - m.offset),
                rkey: m.sge.key,
            };
            if let Err(e) = s.write_staged(op, msg, &buf[done..done + xfer]) {
                err = Some(e);
                break;
            }
            s.sqe_avail -= 1;
            s.sbuf_bytes_avail -= xfer as u32;
            done += xfer;
        }
        match err {
            Some(e) if done == 0 => Err(e),
            _ => Ok(done),
        }
    }

    /// `rrecv`: bytes received (blocking until some, unless non-blocking or
    /// `MSG_DONTWAIT`: `EAGAIN`); 0 once the peer shut its side and all
    /// was read. `MSG_PEEK` and `MSG_WAITALL` as for TCP.
    pub fn recv(&self, buf: &mut [u8], flags: i32) -> io::Result<usize> {
        let (mut s, nonblock) = self.stream(flags)?;
        let mut done = 0usize;
        let mut err = None;
        loop {
            if !s.have_rdata() {
                let (g, r) = self.get_comp(s, nonblock, Stream::conn_have_rdata, None);
                s = g;
                if let Err(e) = r {
                    err = Some(e);
                    break;
                }
            }
            if flags & libc::MSG_PEEK != 0 {
                done = s.peek(buf);
                break;
            }
            done += s.read_ring(&mut buf[done..]);
            if done == buf.len() || flags & libc::MSG_WAITALL == 0 || s.state & st::READABLE == 0 {
                break;
            }
        }
        match err {
            Some(e) if done == 0 => Err(e),
            _ => Ok(done),
        }
    }

    /// `rshutdown`: tells the peer (a shutdown or disconnect message) and
    /// waits for what was sent to be acknowledged (at most 10 s).
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        let mut s = self.lock();
        if s.state & st::CONNECTED == 0 {
            return Ok(());
        }
        let ctrl = match how {
            Shutdown::Both => {
                s.state &= !(st::READABLE | st::WRITABLE);
                Ctrl::Disconnect
            }
            Shutdown::Write => {
                s.state &= !st::WRITABLE;
                if s.state & st::READABLE != 0 {
                    Ctrl::Shutdown
                } else {
                    Ctrl::Disconnect
                }
            }
            Shutdown::Read => {
                s.state &= !st::READABLE;
                if s.state & st::WRITABLE != 0 {
                    return Ok(());
                }
                Ctrl::Disconnect
            }
        };
        let deadline = Some(Instant::now() + LINGER);
        if !s.ctrl_avail() {
            let (g, r) = self.get_comp(s, false, Stream::conn_can_send_ctrl, deadline);
            s = g;
            r?;
        }
        if s.state & st::CONNECTED != 0 && s.ctrl_avail() {
            s.ctrl_seqno = s.ctrl_seqno.wrapping_add(1);
            s.post_write_msg(wire::msg(Op::Ctrl, ctrl as u32), &[], None, 0, 0)?;
        }
        if s.state & st::CONNECTED != 0 {
            let (g, r) = self.get_comp(s, false, Stream::conn_all_sends_done, deadline);
            s = g;
            r?;
        }
        if s.state & st::DISCONNECTED != 0 {
            // As librdmacm's shutdown of an IB/RoCE id: the QP to the error
            // state, which flushes the receives (a waiter wakes).
            if let Some(ep) = &s.ep {
                let attr = QpAttr {
                    state: Some(QpState::Err),
                    ..QpAttr::default()
                };
                let _ = ep.qp.modify(&attr);
            }
        }
        Ok(())
    }

    /// `rclose` (also what dropping the socket does): a connected stream is
    /// shut down first.
    pub fn close(self) {
        drop(self);
    }

    /// `fcntl(F_SETFL, O_NONBLOCK)`.
    pub fn set_nonblocking(&self, on: bool) {
        self.lock().nonblock = on;
    }

    /// Whether the socket is non-blocking.
    pub fn is_nonblocking(&self) -> bool {
        self.lock().nonblock
    }

    /// `SO_ERROR`: the error that ended a connection attempt (0: none),
    /// cleared by reading it.
    pub fn take_error(&self) -> i32 {
        std::mem::take(&mut self.lock().err)
    }

    /// `rgetsockname`.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.lock().id.route().src
    }

    /// `rgetpeername`.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.lock().id.route().dst
    }

    /// `rsetsockopt` of an integer option: the sizes (`SO_SNDBUF`,
    /// `SO_RCVBUF` doubled as the kernel does, and `SOL_RDMA`'s, before
    /// connecting), and the flags rdma-core keeps for `getsockopt`
    /// (`SO_REUSEADDR`, `SO_KEEPALIVE`, `TCP_NODELAY`, ...). `ENOTSUP` for
    /// an option rsockets do not have.
    pub fn set_option(&self, level: i32, name: i32, v: i32) -> io::Result<()> {
        let mut s = self.lock();
        let connected = s.ep.is_some() || s.state & st::OPENING != 0;
        let bit = |on: bool, set: &mut u64| {
            if (0..64).contains(&name) {
                if on {
                    *set |= 1 << name;
                } else {
                    *set &= !(1 << name);
                }
            }
        };
        let on = v != 0;
        match (level, name) {
            (libc::SOL_SOCKET, libc::SO_REUSEADDR | libc::SO_OOBINLINE | libc::SO_KEEPALIVE) => {
                bit(on, &mut s.opts.so)
            }
            (libc::SOL_SOCKET, libc::SO_RCVBUF) => {
                if !connected {
                    s.size.rbuf = (v.max(0) as u32).saturating_mul(2);
                }
            }
            (libc::SOL_SOCKET, libc::SO_SNDBUF) => {
                if !connected {
                    s.size.sbuf = (v.max(0) as u32).saturating_mul(2).max(2 * SNDLOWAT);
                }
            }
            (libc::SOL_SOCKET, libc::SO_LINGER) => bit(!on, &mut s.opts.so),
            (libc::IPPROTO_IP, libc::IP_TOS) => s.opts.tos = v,
            (libc::IPPROTO_TCP, libc::TCP_KEEPCNT | libc::TCP_KEEPINTVL | libc::TCP_MAXSEG) => {}
            (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => {
                if v <= 0 {
                    return Err(errno(libc::EINVAL));
                }
                s.opts.keepalive_time = v as u32;
            }
            (libc::IPPROTO_TCP, libc::TCP_NODELAY) => bit(on, &mut s.opts.tcp),
            (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => bit(on, &mut s.opts.ipv6),
            (SOL_RDMA, _) if connected => return Err(errno(libc::EINVAL)),
            (SOL_RDMA, RDMA_SQSIZE) => s.size.sq = (v.max(0) as u32).min(QP_MAX),
            (SOL_RDMA, RDMA_RQSIZE) => s.size.rq = (v.max(0) as u32).min(QP_MAX),
            (SOL_RDMA, RDMA_INLINE) => s.size.inline = (v.max(0) as u32).min(QP_MAX),
            (SOL_RDMA, RDMA_IOMAPSIZE) => {
                s.opts.iomap_size = wire::scale_to_value(wire::value_to_scale(v.max(0) as u32))
            }
            _ => return Err(errno(libc::ENOTSUP)),
        }
        Ok(())
    }

    /// `rgetsockopt` of an integer option (`SO_ERROR` reads and clears the
    /// connection error). `ENOTSUP` for one rsockets do not have.
    pub fn option(&self, level: i32, name: i32) -> io::Result<i32> {
        let mut s = self.lock();
        let bit = |set: u64| i32::from((0..64).contains(&name) && set & (1 << name) != 0);
        Ok(match (level, name) {
            (libc::SOL_SOCKET, libc::SO_REUSEADDR | libc::SO_KEEPALIVE | libc::SO_OOBINLINE) => {
                bit(s.opts.so)
            }
            (libc::SOL_SOCKET, libc::SO_RCVBUF) => s.size.rbuf as i32,
            (libc::SOL_SOCKET, libc::SO_SNDBUF) => s.size.sbuf as i32,
            (libc::SOL_SOCKET, libc::SO_ERROR) => std::mem::take(&mut s.err),
            (libc::SOL_SOCKET, libc::SO_LINGER) => i32::from(bit(s.opts.so) == 0),
            (libc::IPPROTO_IP, libc::IP_TOS) => s.opts.tos,
            (libc::IPPROTO_TCP, libc::TCP_KEEPCNT | libc::TCP_KEEPINTVL) => 1,
            (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => s.opts.keepalive_time as i32,
            (libc::IPPROTO_TCP, libc::TCP_NODELAY) => bit(s.opts.tcp),
            (libc::IPPROTO_TCP, libc::TCP_MAXSEG) => {
                s.id.route().mtu.map_or(2048, |m| m.bytes() as i32)
            }
            (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => bit(s.opts.ipv6),
            (SOL_RDMA, RDMA_SQSIZE) => s.size.sq as i32,
            (SOL_RDMA, RDMA_RQSIZE) => s.size.rq as i32,
            (SOL_RDMA, RDMA_INLINE) => s.size.inline as i32,
            (SOL_RDMA, RDMA_IOMAPSIZE) => s.opts.iomap_size as i32,
            _ => return Err(errno(libc::ENOTSUP)),
        })
    }

    /// Whether the stream is established (for `TCP_INFO`'s state).
    pub fn is_connected(&self) -> bool {
        self.lock().state & st::CONNECTED != 0
    }

    /// `rpoll`'s look at one socket, never blocking: which of `events`
    /// (`POLLIN`, `POLLOUT`) hold, plus `POLLHUP`/`POLLERR`. `woken`: the
    /// caller slept on [`RSocket::arm`]'s descriptors since its last look
    /// (their events are taken now).
    pub fn poll_ready(&self, events: i16, woken: bool) -> i16 {
        let mut s = self.lock();
        if woken {
            s.take_cq_events();
            s.check_cm();
        }
        Self::revents(&mut s, events)
    }

    fn revents(s: &mut Stream, events: i16) -> i16 {
        if s.state == st::LISTENING {
            if s.pending.is_empty() {
                if let Ok(ev) = s.ch.get_event() {
                    s.pending.push_back(ev);
                }
            }
            return if s.pending.is_empty() {
                0
            } else {
                events & libc::POLLIN
            };
        }
        if s.state & st::OPENING != 0 {
            match s.do_connect(true) {
                Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => return 0,
                _ => {}
            }
        }
        if s.state == st::CONNECT_ERROR {
            return (events & (libc::POLLIN | libc::POLLOUT)) | libc::POLLERR;
        }
        if s.state & (st::CONNECTED | st::DISCONNECTED | st::ERROR) == 0 {
            return 0;
        }
        s.process();
        let mut r = 0;
        if events & libc::POLLIN != 0 && s.conn_have_rdata() {
            r |= libc::POLLIN;
        }
        if events & libc::POLLOUT != 0 && s.can_send() {
            r |= libc::POLLOUT;
        }
        if s.state == st::DISCONNECTED {
            // The hang-up is reported once the data the peer sent before
            // it has been read, as a TCP socket reads a closed peer's data
            // first. rdma-core reports both at once: rstream's async mode
            // (`-T a`), which takes POLLHUP for an error, then failed
            // whenever the peer's last data and its disconnect came in one
            // batch. Pollers of POLLOUT alone hear of it at once.
            if r & libc::POLLIN == 0 || !s.have_rdata() {
                r |= libc::POLLHUP;
            }
        } else if s.state & st::CONNECTED == 0 {
            r |= libc::POLLERR;
        }
        r
    }

    /// Before `rpoll` sleeps: arms the CQ and looks once more (returned:
    /// the events that hold now, in which case the caller does not sleep),
    /// and the descriptors to sleep on.
    pub fn arm(&self, events: i16) -> (i16, [RawFd; 2], usize) {
        let mut s = self.lock();
        s.arm();
        let r = Self::revents(&mut s, events);
        let (fds, n) = s.wait_fds();
        (r, fds, n)
    }
}

/// The next piece of a transfer with `left` bytes to go: rdma-core's
/// overlap, 2 KiB first and doubling up to 64 KiB, so the first bytes leave
/// while the rest are copied.
fn next_piece(olen: &mut usize, left: usize) -> usize {
    if *olen >= left {
        return left;
    }
    let piece = *olen;
    if *olen < MAX_TRANSFER {
        *olen <<= 1;
    }
    piece
}

fn in_progress_is_again(e: io::Error) -> io::Error {
    if e.raw_os_error() == Some(libc::EINPROGRESS) {
        errno(libc::EAGAIN)
    } else {
        e
    }
}

impl Stream {
    /// Sends `data` into the peer's target SGE `t` (a WRITE with
    /// immediate): inline when short, else from the send ring.
    fn write_data(&mut self, data: &[u8], t: RemoteSge) -> io::Result<()> {
        let len = data.len() as u32;
        let msg = wire::msg(Op::Data, len);
        let op = SendOp::WriteWithImm {
            remote_addr: t.addr,
            rkey: t.key,
            imm: msg,
        };
        // The target entry is used up before the WRITE goes (as rdma-core
        // does): once it is posted, the peer may read the data and write a
        // fresh entry into this slot, which a later store would overwrite
        // (a credit lost, both sides waiting).
        let mut rest = t;
        rest.addr = rest.addr.wrapping_add(u64::from(len));
        rest.length -= len;
        self.set_target(self.target_sge, rest);
        if rest.length == 0 {
            self.target_sge = (self.target_sge + 1) % wire::SGL_SIZE;
        }
        self.write_staged(op, msg, data)?;
        self.sseq_no = self.sseq_no.wrapping_add(1);
        self.sqe_avail -= 1;
        self.sbuf_bytes_avail -= len;
        Ok(())
    }

    /// Posts `op` for `data`: inline when short, else copied into the send
    /// ring (in two pieces where it wraps). The ring's room is the
    /// caller's to have checked (`sbuf_bytes_avail`).
    fn write_staged(&mut self, op: SendOp, msg: u32, data: &[u8]) -> io::Result<()> {
        if data.len() as u32 <= self.size.inline {
            return self.post_write(op, msg, &[], Some(data));
        }
        let ep = self.ep()?;
        let at = self.sbuf_at as usize;
        let first = data.len().min(self.size.sbuf as usize - at);
        ep.sbuf.write(at, &data[..first]);
        let mut sges = [Sge {
            addr: ep.sbuf.addr(at),
            length: first as u32,
            lkey: ep.smr.lkey,
        }; 2];
        let mut n = 1;
        if first < data.len() {
            ep.sbuf.write(0, &data[first..]);
            sges[1] = Sge {
                addr: ep.sbuf.addr(0),
                length: (data.len() - first) as u32,
                lkey: ep.smr.lkey,
            };
            n = 2;
        }
        self.post_write(op, msg, &sges[..n], None)?;
        self.sbuf_at = ((at + data.len()) % self.size.sbuf as usize) as u32;
        Ok(())
    }

    /// Our iomap entry `i`, as the peer wrote it.
    fn target_iomap(&self, i: usize) -> wire::IoMap {
        let Some(ep) = &self.ep else {
            return wire::IoMap::default();
        };
        let at = wire::SGL_SIZE * wire::SGE_BYTES + i * wire::IOMAP_BYTES;
        wire::IoMap {
            offset: ep.target.load_u64(at),
            sge: RemoteSge {
                addr: ep.target.load_u64(at + 8),
                key: ep.target.load_u32(at + 16),
                length: ep.target.load_u32(at + 20),
            },
        }
    }

    /// The peer's mapping that holds `offset`, if any.
    fn find_iomap(&self, offset: u64) -> Option<wire::IoMap> {
        (0..self.iomap_size as usize)
            .map(|i| self.target_iomap(i))
            .find(|m| {
                m.sge.length > 0
                    && offset >= m.offset
                    && offset - m.offset < u64::from(m.sge.length)
            })
    }

    /// Copies received bytes out of the ring into `out`, consuming them.
    fn read_ring(&mut self, out: &mut [u8]) -> usize {
        let mut done = 0;
        while done < out.len() {
            let Some(&head) = self.rmsg.front() else {
                break;
            };
            let want = out.len() - done;
            let n = if (want as u32) < head {
                if let Some(h) = self.rmsg.front_mut() {
                    *h -= want as u32;
                }
                want as u32
            } else {
                self.rmsg.pop_front();
                self.rseq_no = self.rseq_no.wrapping_add(1);
                head
            };
            self.copy_out(&mut out[done..done + n as usize]);
            done += n as usize;
        }
        done
    }

    /// `MSG_PEEK`: copies without consuming.
    fn peek(&mut self, out: &mut [u8]) -> usize {
        let saved = self.rbuf_offset;
        let mut done = 0;
        for &len in &self.rmsg {
            if done == out.len() {
                break;
            }
            let n = (len as usize).min(out.len() - done);
            let mut at = self.rbuf_offset;
            done += Self::ring_copy(
                self.ep.as_ref(),
                self.size.rbuf,
                &mut at,
                &mut out[done..done + n],
            );
            self.rbuf_offset = at;
        }
        self.rbuf_offset = saved;
        done
    }

    fn copy_out(&mut self, out: &mut [u8]) {
        let mut at = self.rbuf_offset;
        let n = Self::ring_copy(self.ep.as_ref(), self.size.rbuf, &mut at, out);
        self.rbuf_offset = at;
        self.rbuf_bytes_avail = self.rbuf_bytes_avail.saturating_add(n as u32);
    }

    /// Copies from the receive ring at `*at` (wrapping at `size`), moving
    /// `*at` on; never reads outside the ring whatever lengths a peer
    /// claimed.
    fn ring_copy(ep: Option<&Endpoint>, size: u32, at: &mut u32, out: &mut [u8]) -> usize {
        let Some(ep) = ep else { return 0 };
        let mut done = 0;
        while done < out.len() && size > 0 {
            let n = (out.len() - done).min((size - *at) as usize);
            ep.rbuf.read(*at as usize, &mut out[done..done + n]);
            done += n;
            *at = (*at + n as u32) % size;
        }
        done
    }
}

impl Drop for RSocket {
    fn drop(&mut self) {
        if self.lock().state & st::CONNECTED != 0 {
            let _ = self.shutdown(Shutdown::Both);
        }
        let mut s = self.lock();
        if s.state & (st::CONNECTED | st::DISCONNECTED | st::ERROR) != 0 {
            let _ = s.id.disconnect();
        }
        s.id.destroy();
        if let Some(ep) = &s.ep {
            for m in &s.maps {
                let _ = ep.ctx.dereg_mr(m.keys.lkey);
            }
        }
        s.maps.clear();
        drop(s.ep.take());
        // Connect requests a poll took and nobody accepted.
        for ev in s.pending.drain(..) {
            let _ = ev.id.reject(&[]);
            ev.id.destroy();
        }
    }
}
