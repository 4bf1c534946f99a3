//! Work requests, completions and QP attributes, with the meanings rdma-core
//! gives them (`struct ibv_send_wr`, `struct ibv_wc`, `struct ibv_qp_attr`).

use burst_wire::{Mtu, Psn, Qpn};

use crate::VerbsError;

/// Simulated or real monotonic time in nanoseconds, supplied by the caller.
pub type Nanos = u64;

/// Folds a round-trip sample into a smoothed estimate and its mean
/// deviation (RFC 6298: gains of 1/8 and 1/4; the first sample sets the
/// estimate, and half of it the deviation). `(0, _)` is no estimate yet.
///
/// ```
/// use burst_transport::smooth_rtt;
/// assert_eq!(smooth_rtt((0, 0), 800), (800, 400));
/// assert_eq!(smooth_rtt((800, 400), 1600), (900, 500));
/// ```
pub fn smooth_rtt((srtt, rttvar): (Nanos, Nanos), sample: Nanos) -> (Nanos, Nanos) {
    let r = sample.max(1);
    match srtt {
        0 => (r, r / 2),
        s => (
            (s * 7 + r).div_ceil(8),
            (rttvar * 3 + s.abs_diff(r)).div_ceil(4),
        ),
    }
}

/// A scatter/gather element: a range of a local memory region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sge {
    /// Start address (in the region's address space).
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the region.
    pub lkey: u32,
}

/// Total bytes of an SGE list.
pub fn sg_len(sges: &[Sge]) -> u64 {
    sges.iter().map(|s| u64::from(s.length)).sum()
}

/// The operation of a send work request (`ibv_wr_opcode` plus its fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// SEND.
    Send,
    /// SEND with immediate data (network byte order value as on the wire).
    SendWithImm(u32),
    /// SEND with invalidate of a remote rkey.
    SendWithInv(u32),
    /// RDMA WRITE.
    Write {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// RDMA WRITE with immediate data.
    WriteWithImm {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Immediate data.
        imm: u32,
    },
    /// RDMA READ into the local SGEs.
    Read {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// 8-byte atomic compare and swap; the original value lands in the SGE.
    CompareSwap {
        /// Remote address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Compare value.
        compare: u64,
        /// Swap value.
        swap: u64,
    },
    /// 8-byte atomic fetch and add; the original value lands in the SGE.
    FetchAdd {
        /// Remote address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Addend.
        add: u64,
    },
    /// RDMA ATOMIC WRITE (`IBV_WR_ATOMIC_WRITE`): the 8 bytes of the local
    /// SGE (or inline data) written at the responder as one store, after
    /// every earlier request; RC only, needs the responder's remote write
    /// access and a responder resource, as a READ does.
    AtomicWrite {
        /// Remote address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// Binds a memory window (`IBV_WR_BIND_MW`, and `ibv_bind_mw` for a
    /// type 1 window): a local operation, executed in send-queue order.
    BindMw(MwBind),
    /// Invalidates a local key (`IBV_WR_LOCAL_INV`): a type 2 memory
    /// window's rkey. A local operation, as [`SendOp::BindMw`].
    LocalInv(u32),
}

/// What a memory-window bind asks for (`ibv_mw_bind_info` with the
/// window's keys): the window `mw_rkey` names gets `new_rkey` (its low 8
/// bits, the key's tag; `ibv_inc_rkey`) and grants `access` to
/// `addr..addr+len` of the region `mr_lkey` names. A length of 0 unbinds
/// a type 1 window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MwBind {
    /// The window's rkey now.
    pub mw_rkey: u32,
    /// The rkey it takes (same upper 24 bits, the index).
    pub new_rkey: u32,
    /// The memory region's lkey.
    pub mr_lkey: u32,
    /// First address of the window (in the region's address space).
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Remote rights (`IBV_ACCESS_REMOTE_*` bits).
    pub access: u32,
}

impl SendOp {
    /// Its number in rdma-core's `enum ibv_wr_opcode` ([`wr_opcode`]):
    /// the one numbering of send operations (the C ABI's, and the rings
    /// burstd shares with its clients).
    pub fn wr_opcode(&self) -> u8 {
        match self {
            SendOp::Write { .. } => wr_opcode::RDMA_WRITE,
            SendOp::WriteWithImm { .. } => wr_opcode::RDMA_WRITE_WITH_IMM,
            SendOp::Send => wr_opcode::SEND,
            SendOp::SendWithImm(_) => wr_opcode::SEND_WITH_IMM,
            SendOp::Read { .. } => wr_opcode::RDMA_READ,
            SendOp::CompareSwap { .. } => wr_opcode::ATOMIC_CMP_AND_SWP,
            SendOp::FetchAdd { .. } => wr_opcode::ATOMIC_FETCH_AND_ADD,
            SendOp::LocalInv(_) => wr_opcode::LOCAL_INV,
            SendOp::BindMw(_) => wr_opcode::BIND_MW,
            SendOp::SendWithInv(_) => wr_opcode::SEND_WITH_INV,
            SendOp::AtomicWrite { .. } => wr_opcode::ATOMIC_WRITE,
        }
    }

    /// Whether the message takes a receive WQE at the responder (SEND,
    /// WRITE WITH IMMEDIATE).
    #[must_use]
    pub fn takes_receive(&self) -> bool {
        matches!(
            self,
            SendOp::Send
                | SendOp::SendWithImm(_)
                | SendOp::SendWithInv(_)
                | SendOp::WriteWithImm { .. }
        )
    }

    /// RDMA READ, atomic or ATOMIC WRITE: limited by `max_rd_atomic`,
    /// waited on by fences, finished by a response (not an ACK).
    pub fn is_read_or_atomic(&self) -> bool {
        matches!(
            self,
            SendOp::Read { .. }
                | SendOp::CompareSwap { .. }
                | SendOp::FetchAdd { .. }
                | SendOp::AtomicWrite { .. }
        )
    }
    /// RDMA ATOMIC WRITE.
    pub fn is_atomic_write(&self) -> bool {
        matches!(self, SendOp::AtomicWrite { .. })
    }
    /// Whether its local buffers are written (READ and atomic results),
    /// not read.
    pub fn scatters(&self) -> bool {
        self.is_read_or_atomic() && !self.is_atomic_write()
    }
    /// An atomic operation (compare and swap, fetch and add).
    pub fn is_atomic(&self) -> bool {
        matches!(self, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. })
    }
    /// A local operation: no packet, executed when taken by the send
    /// queue (memory-window bind, local invalidate).
    pub fn is_local(&self) -> bool {
        matches!(self, SendOp::BindMw(_) | SendOp::LocalInv(_))
    }
    /// The completion opcode of this operation.
    pub fn wc_opcode(&self) -> WcOpcode {
        match self {
            SendOp::BindMw(_) => WcOpcode::BindMw,
            SendOp::LocalInv(_) => WcOpcode::LocalInv,
            SendOp::Send | SendOp::SendWithImm(_) | SendOp::SendWithInv(_) => WcOpcode::Send,
            SendOp::Write { .. } | SendOp::WriteWithImm { .. } => WcOpcode::RdmaWrite,
            SendOp::Read { .. } => WcOpcode::RdmaRead,
            SendOp::CompareSwap { .. } => WcOpcode::CompSwap,
            SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
            SendOp::AtomicWrite { .. } => WcOpcode::AtomicWrite,
        }
    }
}

/// Where a UD send goes (the address handle's resolution plus the Q_Key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdDest {
    /// Destination QPN.
    pub remote_qpn: Qpn,
    /// Q_Key (if its high bit is set, the QP's own Q_Key is used, as in the spec).
    pub remote_qkey: u32,
    /// Caller's handle of the address (an AH index): echoed in [`crate::Transmit::ah`].
    pub ah: u32,
}

/// A send work request: plain integers and fixed arrays, no pointers and
/// no heap (`Copy`). It is the one shape a send request has from the
/// application's post to the transport: a burst ring entry is a `SendWr`,
/// so the same request can sit in memory shared with another process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendWr {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Operation.
    pub op: SendOp,
    /// Local buffers (gathered for sends and writes, scattered for reads and
    /// atomics), at most [`MAX_SGE`].
    pub sg_list: SgList,
    /// IBV_SEND_INLINE: the data is captured when posted.
    pub inline: bool,
    /// IBV_SEND_SIGNALED: generate a completion on success.
    pub signaled: bool,
    /// IBV_SEND_FENCE: wait for earlier READs and atomics to complete.
    pub fence: bool,
    /// IBV_SEND_SOLICITED.
    pub solicited: bool,
    /// UD destination (UD QPs only).
    pub ud: Option<UdDest>,
    /// Inline bytes captured when the application posted (a front end
    /// does, as `ibv_post_send` returns); `None` with `inline` set reads
    /// the SGEs when the transport takes the request.
    pub inline_data: Option<InlineData>,
}

/// SGEs a work request holds (send or receive): a burst ring entry's
/// room, the device's `max_sge`, and more than RXE's usual 32-SGE limit
/// is never needed by the applications burst targets.
pub const MAX_SGE: usize = 8;

/// The longest message (and RETH DMA length) the IBA allows, 2^31 bytes
/// (C9-94): the port's `max_msg_sz`.
pub const MAX_MSG_SIZE: u64 = 1 << 31;

/// Inline bytes a send work request holds (the device's `max_inline_data`).
pub const MAX_INLINE: usize = 256;

/// The scatter/gather list of a work request: up to [`MAX_SGE`] entries
/// held in place (`Copy`, no heap), read as a slice (`Deref<Target = [Sge]>`).
///
/// ```
/// use burst_transport::{SgList, Sge, MAX_SGE};
/// let one = Sge { addr: 0x1000, length: 64, lkey: 1 };
/// let l = SgList::from([one, one]);
/// assert_eq!(l.len(), 2);
/// assert_eq!(l.total_len(), 128);
/// assert!(SgList::try_from(&[one; MAX_SGE + 1][..]).is_err());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct SgList {
    len: u8,
    sges: [Sge; MAX_SGE],
}

impl SgList {
    /// An empty list.
    pub const fn new() -> SgList {
        SgList {
            len: 0,
            sges: [Sge {
                addr: 0,
                length: 0,
                lkey: 0,
            }; MAX_SGE],
        }
    }

    /// Appends an entry; `TooManySge` past [`MAX_SGE`].
    pub fn push(&mut self, sge: Sge) -> Result<(), VerbsError> {
        let i = usize::from(self.len);
        *self.sges.get_mut(i).ok_or(VerbsError::TooManySge)? = sge;
        self.len += 1;
        Ok(())
    }

    /// Total bytes of the entries.
    pub fn total_len(&self) -> u64 {
        sg_len(self)
    }
}

impl std::ops::Deref for SgList {
    type Target = [Sge];
    fn deref(&self) -> &[Sge] {
        &self.sges[..usize::from(self.len)]
    }
}

impl std::ops::DerefMut for SgList {
    fn deref_mut(&mut self) -> &mut [Sge] {
        &mut self.sges[..usize::from(self.len)]
    }
}

impl std::fmt::Debug for SgList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<const N: usize> From<[Sge; N]> for SgList {
    fn from(a: [Sge; N]) -> SgList {
        const { assert!(N <= MAX_SGE, "an SgList holds at most MAX_SGE entries") };
        let mut l = SgList::new();
        l.sges[..N].copy_from_slice(&a);
        l.len = N as u8;
        l
    }
}

impl TryFrom<&[Sge]> for SgList {
    type Error = VerbsError;
    fn try_from(s: &[Sge]) -> Result<SgList, VerbsError> {
        let mut l = SgList::new();
        l.sges
            .get_mut(..s.len())
            .ok_or(VerbsError::TooManySge)?
            .copy_from_slice(s);
        l.len = s.len() as u8;
        Ok(l)
    }
}

impl TryFrom<Vec<Sge>> for SgList {
    type Error = VerbsError;
    fn try_from(v: Vec<Sge>) -> Result<SgList, VerbsError> {
        SgList::try_from(&v[..])
    }
}

/// Inline bytes of a send work request, held in place (at most
/// [`MAX_INLINE`]).
#[derive(Clone, Copy)]
pub struct InlineData {
    len: u16,
    bytes: [u8; MAX_INLINE],
}

impl InlineData {
    /// `data` captured; `BadWr` if it is longer than [`MAX_INLINE`].
    pub fn try_from_slice(data: &[u8]) -> Result<InlineData, VerbsError> {
        let mut d = InlineData {
            len: data.len() as u16,
            bytes: [0; MAX_INLINE],
        };
        d.bytes
            .get_mut(..data.len())
            .ok_or(VerbsError::BadWr("inline data longer than max_inline_data"))?
            .copy_from_slice(data);
        Ok(d)
    }

    /// `len` zero bytes to fill in place (`len` at most [`MAX_INLINE`]).
    pub fn zeroed(len: usize) -> Result<InlineData, VerbsError> {
        if len > MAX_INLINE {
            return Err(VerbsError::BadWr("inline data longer than max_inline_data"));
        }
        Ok(InlineData {
            len: len as u16,
            bytes: [0; MAX_INLINE],
        })
    }
}

impl std::ops::Deref for InlineData {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl std::ops::DerefMut for InlineData {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.bytes[..usize::from(self.len)]
    }
}

impl PartialEq for InlineData {
    fn eq(&self, o: &InlineData) -> bool {
        **self == **o
    }
}

impl Eq for InlineData {}

impl std::fmt::Debug for InlineData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "InlineData({} bytes)", self.len)
    }
}

impl SendWr {
    /// A signaled work request with no flags.
    ///
    /// ```
    /// use burst_transport::{SendOp, SendWr, Sge};
    /// let wr = SendWr::new(7, SendOp::Send, [Sge { addr: 0x1000, length: 64, lkey: 1 }]);
    /// assert_eq!(wr.sg_list.total_len(), 64);
    /// ```
    #[must_use]
    pub fn new(wr_id: u64, op: SendOp, sg_list: impl Into<SgList>) -> SendWr {
        SendWr {
            wr_id,
            op,
            sg_list: sg_list.into(),
            inline: false,
            signaled: true,
            fence: false,
            solicited: false,
            ud: None,
            inline_data: None,
        }
    }
}

/// A receive work request (`Copy`, no heap, like [`SendWr`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvWr {
    /// Caller's identifier.
    pub wr_id: u64,
    /// Buffers the incoming message is scattered into (at most [`MAX_SGE`]).
    pub sg_list: SgList,
}

/// `enum ibv_wc_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcStatus {
    /// IBV_WC_SUCCESS.
    Success = 0,
    /// IBV_WC_LOC_LEN_ERR: the receive buffer is too small.
    LocLenErr = 1,
    /// IBV_WC_LOC_QP_OP_ERR.
    LocQpOpErr = 2,
    /// IBV_WC_LOC_PROT_ERR: a local SGE failed its key or bounds check.
    LocProtErr = 4,
    /// IBV_WC_WR_FLUSH_ERR: flushed because the QP is in error.
    WrFlushErr = 5,
    /// IBV_WC_MW_BIND_ERR: a memory-window bind was refused.
    MwBindErr = 6,
    /// IBV_WC_BAD_RESP_ERR.
    BadRespErr = 7,
    /// IBV_WC_LOC_ACCESS_ERR.
    LocAccessErr = 8,
    /// IBV_WC_REM_INV_REQ_ERR: the responder NAKed with invalid request.
    RemInvReqErr = 9,
    /// IBV_WC_REM_ACCESS_ERR: the responder NAKed with remote access error.
    RemAccessErr = 10,
    /// IBV_WC_REM_OP_ERR: the responder NAKed with remote operational error.
    RemOpErr = 11,
    /// IBV_WC_RETRY_EXC_ERR: transport retries exhausted.
    RetryExcErr = 12,
    /// IBV_WC_RNR_RETRY_EXC_ERR: RNR retries exhausted.
    RnrRetryExcErr = 13,
}

/// `enum ibv_wc_opcode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcOpcode {
    /// IBV_WC_SEND.
    Send = 0,
    /// IBV_WC_RDMA_WRITE.
    RdmaWrite = 1,
    /// IBV_WC_RDMA_READ.
    RdmaRead = 2,
    /// IBV_WC_COMP_SWAP.
    CompSwap = 3,
    /// IBV_WC_FETCH_ADD.
    FetchAdd = 4,
    /// IBV_WC_BIND_MW.
    BindMw = 5,
    /// IBV_WC_LOCAL_INV.
    LocalInv = 6,
    /// IBV_WC_ATOMIC_WRITE.
    AtomicWrite = 9,
    /// IBV_WC_RECV.
    Recv = 128,
    /// IBV_WC_RECV_RDMA_WITH_IMM.
    RecvRdmaWithImm = 129,
}

impl WcOpcode {
    /// Every completion opcode burst produces.
    pub const ALL: [WcOpcode; 10] = [
        WcOpcode::Send,
        WcOpcode::RdmaWrite,
        WcOpcode::RdmaRead,
        WcOpcode::CompSwap,
        WcOpcode::FetchAdd,
        WcOpcode::BindMw,
        WcOpcode::LocalInv,
        WcOpcode::AtomicWrite,
        WcOpcode::Recv,
        WcOpcode::RecvRdmaWithImm,
    ];
}

/// A work completion (`struct ibv_wc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The work request's identifier.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// Opcode (meaningful for successful completions, as in rdma-core).
    pub opcode: WcOpcode,
    /// Bytes received (receive completions) or transferred (RDMA READ).
    pub byte_len: u32,
    /// Immediate data (IBV_WC_WITH_IMM).
    pub imm_data: Option<u32>,
    /// Invalidated rkey (IBV_WC_WITH_INV).
    pub invalidated_rkey: Option<u32>,
    /// Local QPN.
    pub qp_num: Qpn,
    /// Source QPN (UD receives).
    pub src_qp: Qpn,
    /// The buffer's first 40 bytes hold the packet's network header
    /// (IBV_WC_GRH, UD receives), and which one it is.
    pub grh: Option<NetworkHeader>,
}

/// The network header a RoCE v2 datagram arrived with, in the 40-byte GRH
/// area of a UD receive buffer (`enum rdma_network_type`): IPv6 fills the
/// area, IPv4 the last 20 bytes of it (RoCE v2 Annex A17.4.5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkHeader {
    /// An IPv4 header at offset 20.
    Ipv4,
    /// An IPv6 header at offset 0.
    Ipv6,
}

impl NetworkHeader {
    /// Which header a GRH area holds: IPv6 starts with version 6.
    pub fn of_grh_area(area: &[u8; 40]) -> Self {
        if area[0] >> 4 == 6 {
            Self::Ipv6
        } else {
            Self::Ipv4
        }
    }
}

impl WorkCompletion {
    /// A completion of `wr_id` on QP `qp_num` with nothing but its status
    /// and opcode (no data, immediate, GRH): what errors and flushes give.
    pub fn of(qp_num: Qpn, wr_id: u64, status: WcStatus, opcode: WcOpcode) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status,
            opcode,
            byte_len: 0,
            imm_data: None,
            invalidated_rkey: None,
            qp_num,
            src_qp: Qpn::default(),
            grh: None,
        }
    }

    /// True for completions of the receive queue.
    pub fn is_recv(&self) -> bool {
        matches!(self.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
    }
    /// `wc_flags` bits as rdma-core defines them (GRH 1, WITH_IMM 2, WITH_INV 8).
    pub fn wc_flags(&self) -> u32 {
        u32::from(self.grh.is_some())
            | (u32::from(self.imm_data.is_some()) << 1)
            | (u32::from(self.invalidated_rkey.is_some()) << 3)
    }
}

/// Transport service of a QP.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable connected.
    Rc,
    /// Unreliable connected.
    Uc,
    /// Unreliable datagram.
    Ud,
}

/// `enum ibv_qp_state`.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Reset.
    Reset,
    /// Initialized.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Send queue drained.
    Sqd,
    /// Send queue error.
    Sqe,
    /// Error.
    Err,
}

impl QpState {
    /// Its `enum ibv_qp_state` value.
    pub fn ibv(self) -> u32 {
        self as u32
    }

    /// The state an `enum ibv_qp_state` value names.
    ///
    /// ```
    /// use burst_transport::QpState;
    /// assert_eq!(QpState::from_ibv(3), Some(QpState::Rts));
    /// assert_eq!(QpState::from_ibv(QpState::Err.ibv()), Some(QpState::Err));
    /// assert_eq!(QpState::from_ibv(7), None);
    /// ```
    pub fn from_ibv(v: u32) -> Option<QpState> {
        Some(match v {
            0 => QpState::Reset,
            1 => QpState::Init,
            2 => QpState::Rtr,
            3 => QpState::Rts,
            4 => QpState::Sqd,
            5 => QpState::Sqe,
            6 => QpState::Err,
            _ => return None,
        })
    }
}

/// Remote access rights of a QP (`IBV_ACCESS_REMOTE_*`).
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpAccess {
    /// Accept RDMA WRITE.
    pub remote_write: bool,
    /// Accept RDMA READ.
    pub remote_read: bool,
    /// Accept atomics.
    pub remote_atomic: bool,
}

/// `ibv_qp_attr` fields the transport uses; `None` means "not in the mask".
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpAttr {
    /// IBV_QP_STATE: the target state (`None`: stay in the current one,
    /// changing only the attributes that state allows).
    pub state: Option<QpState>,
    /// IBV_QP_PKEY_INDEX.
    pub pkey_index: Option<u16>,
    /// IBV_QP_PORT.
    pub port: Option<u8>,
    /// IBV_QP_ACCESS_FLAGS (RC/UC).
    pub access: Option<QpAccess>,
    /// IBV_QP_QKEY (UD).
    pub qkey: Option<u32>,
    /// IBV_QP_AV: the caller's address handle of the peer (RC/UC).
    pub ah: Option<u32>,
    /// IBV_QP_PATH_MTU (RC/UC).
    pub path_mtu: Option<Mtu>,
    /// IBV_QP_DEST_QPN (RC/UC).
    pub dest_qpn: Option<Qpn>,
    /// IBV_QP_RQ_PSN.
    pub rq_psn: Option<Psn>,
    /// IBV_QP_MAX_DEST_RD_ATOMIC (RC).
    pub max_dest_rd_atomic: Option<u8>,
    /// IBV_QP_MIN_RNR_TIMER (RC).
    pub min_rnr_timer: Option<u8>,
    /// IBV_QP_SQ_PSN.
    pub sq_psn: Option<Psn>,
    /// IBV_QP_TIMEOUT (RC): local ACK timeout 4.096 us * 2^timeout, 0 = infinite.
    pub timeout: Option<u8>,
    /// IBV_QP_RETRY_CNT (RC, 0..=7).
    pub retry_cnt: Option<u8>,
    /// IBV_QP_RNR_RETRY (RC, 0..=7, 7 = infinite).
    pub rnr_retry: Option<u8>,
    /// IBV_QP_MAX_QP_RD_ATOMIC (RC).
    pub max_rd_atomic: Option<u8>,
    /// Selective repeat toward a burst peer (RC; burst's ECE option,
    /// `ibv_set_ece`): not an IBA attribute, so any transition may carry
    /// it. Both ends must agree for it to pay (see `Qp`'s selective
    /// repeat); either end alone stays correct.
    #[cfg_attr(feature = "serde", serde(default))]
    pub selective_repeat: Option<bool>,
    /// An RC or UC QP that sends no request until a packet from its peer
    /// arrives, or until a later transition clears it: burst's one
    /// round-trip connection setup makes the passive side ready at its
    /// REP, before the active side's QP can receive (a first packet would
    /// be dropped and wait for the ACK timeout). Not an IBA attribute:
    /// any transition may carry it; posting is accepted meanwhile.
    #[cfg_attr(feature = "serde", serde(default))]
    pub wait_for_peer: Option<bool>,
}

/// Fixed properties of a QP, given at creation.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpConfig {
    /// QP number.
    pub qpn: Qpn,
    /// Transport.
    pub qp_type: QpType,
    /// Protection domain handle, passed to every memory check.
    pub pd: u32,
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// SGEs per work request.
    pub max_sge: u32,
    /// Largest inline send.
    pub max_inline: u32,
    /// The responder ACKs at least every this many packets.
    pub ack_every: u32,
    /// Most request packets in flight before the requester waits for ACKs.
    pub max_inflight_packets: u32,
    /// The port's active MTU: the largest UD message.
    pub port_mtu: Mtu,
    /// Receives come from a shared receive queue ([`crate::Srq`]) the
    /// caller lends to [`crate::Qp::handle_packet_srq`]; `post_recv` is refused.
    pub srq: bool,
}

impl QpConfig {
    /// The checks `ibv_post_send` makes before it accepts a work request
    /// (the errno each failure maps to is rdma-core's: EINVAL, through
    /// [`VerbsError::errno`]): SGE count, an opcode the QP type offers, a
    /// UD destination, the shape of an atomic, the message length and
    /// inline size. A front end runs them once, when the application
    /// posts; [`crate::Qp::post_send_checked`] takes what passed.
    /// Returns the message length.
    ///
    /// ```
    /// use burst_transport::{QpConfig, QpType, SendOp, SendWr, Sge};
    /// use burst_wire::Qpn;
    /// let cfg = QpConfig::new(Qpn::new(0x11).unwrap(), QpType::Uc, 1);
    /// let sge = Sge { addr: 0x1000, length: 8, lkey: 1 };
    /// let read = SendWr::new(1, SendOp::Read { remote_addr: 0, rkey: 2 }, [sge]);
    /// assert!(cfg.check_send(&read).is_err(), "UC has no READ");
    /// assert_eq!(cfg.check_send(&SendWr::new(2, SendOp::Send, [sge])), Ok(8));
    /// ```
    pub fn check_send(&self, wr: &SendWr) -> Result<u64, VerbsError> {
        let t = self.qp_type;
        if wr.sg_list.len() > self.max_sge as usize {
            return Err(VerbsError::TooManySge);
        }
        let len = wr.sg_list.total_len();
        let allowed = match (t, &wr.op) {
            // As RXE: a bind on RC and UC, a local invalidate on RC only.
            (QpType::Uc, SendOp::LocalInv(_)) => false,
            (QpType::Rc, _) => true,
            (QpType::Uc, op) => !op.is_read_or_atomic() && !matches!(op, SendOp::SendWithInv(_)),
            (QpType::Ud, SendOp::Send | SendOp::SendWithImm(_)) => true,
            _ => false,
        };
        if !allowed {
            return Err(VerbsError::BadWr("opcode not supported by this QP type"));
        }
        if t == QpType::Ud && wr.ud.is_none() {
            return Err(VerbsError::BadWr("UD send without address handle"));
        }
        if wr.op.is_atomic_write() && len != 8 {
            return Err(VerbsError::BadWr("atomic write needs 8 bytes"));
        }
        if wr.op.is_atomic() && (len != 8 || wr.sg_list.len() != 1) {
            return Err(VerbsError::BadWr("atomic needs one 8-byte SGE"));
        }
        if wr.op.is_atomic() || wr.op.is_atomic_write() {
            let va = match wr.op {
                SendOp::CompareSwap { remote_addr, .. }
                | SendOp::FetchAdd { remote_addr, .. }
                | SendOp::AtomicWrite { remote_addr, .. } => remote_addr,
                _ => 0,
            };
            if va % 8 != 0 {
                return Err(VerbsError::BadWr(
                    "atomic remote address not 8-byte aligned",
                ));
            }
        }
        if len > MAX_MSG_SIZE {
            return Err(VerbsError::BadWr("message longer than max_msg_sz (2^31)"));
        }
        // An atomic write's 8 bytes are captured as inline data whatever
        // the QP's inline size (`ibv_wr_atomic_write` takes a pointer).
        let inline_ok = wr.op.is_atomic_write()
            || (!wr.op.is_read_or_atomic() && len <= u64::from(self.max_inline));
        if wr.inline && !inline_ok {
            return Err(VerbsError::BadWr("inline data too long or not allowed"));
        }
        if let Some(d) = &wr.inline_data {
            if !wr.inline || d.len() as u64 != len {
                return Err(VerbsError::BadWr(
                    "inline data length differs from the SGEs",
                ));
            }
        }
        Ok(len)
    }

    /// The checks `ibv_post_recv` makes before it accepts a work request.
    pub fn check_recv(&self, wr: &RecvWr) -> Result<(), VerbsError> {
        if self.srq {
            return Err(VerbsError::InvalidValue("post_recv on a QP with an SRQ"));
        }
        if wr.sg_list.len() > self.max_sge as usize {
            return Err(VerbsError::TooManySge);
        }
        Ok(())
    }

    /// Defaults close to what RXE offers.
    #[must_use]
    pub fn new(qpn: Qpn, qp_type: QpType, pd: u32) -> QpConfig {
        QpConfig {
            qpn,
            qp_type,
            pd,
            max_send_wr: 4096,
            max_recv_wr: 4096,
            max_sge: MAX_SGE as u32,
            max_inline: MAX_INLINE as u32,
            ack_every: 16,
            // 4 MiB at MTU 4096: 256 packets left the sender waiting for
            // ACKs (15 vs 27 Gb/s, write_bw 64 KiB over the veth pair,
            // docs/performance.md); the port's 16 MiB socket buffers hold it.
            max_inflight_packets: 1024,
            port_mtu: Mtu::Mtu4096,
            srq: false,
        }
    }
}

/// What a requester's path saw since it was last asked
/// ([`crate::Qp::take_path_events`]): the input of congestion control.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PathEvents {
    /// Request PSNs newly acknowledged (ACKs, READ responses, atomic ACKs).
    pub acked: u64,
    /// A round trip timed on a packet sent once (Karn's rule), ns.
    pub rtt: Option<Nanos>,
    /// NAK-sequence errors (and implied NAKs) that started a go-back-N
    /// retry.
    pub seq_errs: u32,
    /// NAK-sequence errors that a selective QP repaired by resending the
    /// missing packets alone (the peer kept what came after them).
    pub holes: u32,
    /// Local ACK timeouts that started a retry.
    pub timeouts: u32,
    /// Request packets sent, and their bytes (headers included).
    pub sent_pkts: u64,
    /// See `sent_pkts`.
    pub sent_bytes: u64,
}

impl PathEvents {
    /// Hands the events to a congestion controller at `now`: bytes sent,
    /// progress with its round-trip sample, one signal per NAK-sequence
    /// error, hole and timeout.
    ///
    /// ```
    /// use burst_cc::{Controller, LossWindow, LossWindowConfig};
    /// use burst_transport::PathEvents;
    /// let mut cc = LossWindow::new(LossWindowConfig::default());
    /// PathEvents { seq_errs: 1, ..Default::default() }.feed(0, &mut cc);
    /// assert_eq!(cc.window(), Some(8)); // half the initial 16
    /// ```
    pub fn feed(&self, now: Nanos, cc: &mut (impl burst_cc::Controller + ?Sized)) {
        if self.sent_bytes > 0 {
            cc.on_sent(now, self.sent_bytes);
        }
        if self.acked > 0 || self.rtt.is_some() {
            cc.on_ack(
                now,
                burst_cc::Acked {
                    packets: self.acked,
                    rtt: self.rtt,
                },
            );
        }
        for _ in 0..self.seq_errs.min(4) {
            cc.on_congestion(now, burst_cc::Signal::SequenceError);
        }
        // Each hole counts toward the share of packets lost (a
        // proportional cut), so all are told, up to a bound per call.
        for _ in 0..self.holes.min(256) {
            cc.on_congestion(now, burst_cc::Signal::Hole);
        }
        for _ in 0..self.timeouts.min(4) {
            cc.on_congestion(now, burst_cc::Signal::Timeout);
        }
    }

    /// Whether nothing happened.
    pub fn is_empty(&self) -> bool {
        *self == PathEvents::default()
    }
}

/// rdma-core's `enum ibv_wr_opcode` (verbs.h): the numbers
/// [`SendOp::wr_opcode`] gives.
pub mod wr_opcode {
    /// `IBV_WR_RDMA_WRITE`.
    pub const RDMA_WRITE: u8 = 0;
    /// `IBV_WR_RDMA_WRITE_WITH_IMM`.
    pub const RDMA_WRITE_WITH_IMM: u8 = 1;
    /// `IBV_WR_SEND`.
    pub const SEND: u8 = 2;
    /// `IBV_WR_SEND_WITH_IMM`.
    pub const SEND_WITH_IMM: u8 = 3;
    /// `IBV_WR_RDMA_READ`.
    pub const RDMA_READ: u8 = 4;
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`.
    pub const ATOMIC_CMP_AND_SWP: u8 = 5;
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`.
    pub const ATOMIC_FETCH_AND_ADD: u8 = 6;
    /// `IBV_WR_LOCAL_INV`.
    pub const LOCAL_INV: u8 = 7;
    /// `IBV_WR_BIND_MW`.
    pub const BIND_MW: u8 = 8;
    /// `IBV_WR_SEND_WITH_INV`.
    pub const SEND_WITH_INV: u8 = 9;
    /// `IBV_WR_ATOMIC_WRITE`.
    pub const ATOMIC_WRITE: u8 = 15;
}
