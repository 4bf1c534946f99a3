//! burstd's control protocol: the slow-path verbs between an application
//! (the client library) and the daemon, over a Unix `SOCK_SEQPACKET`
//! socket. One request, one reply; descriptors (memfds of rings and of
//! registered memory, eventfds) ride along with `SCM_RIGHTS`.
//!
//! A message is an 8-byte header (magic `BRST`, version, reserved) and a
//! JSON body ([`Request`] or [`Reply`], serde). JSON because the path is
//! slow (one message per verb, never per work request) and a malformed or
//! hostile message must become an error reply, which serde's decoder gives
//! for free; the data path never touches this socket.
//!
//! ```
//! use burst_verbs::protocol::{decode, encode, Request};
//! let m = encode(&Request::AllocPd);
//! assert_eq!(decode::<Request>(&m).unwrap(), Request::AllocPd);
//! assert!(decode::<Request>(&m[..5]).is_err());
//! ```

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use serde::{Deserialize, Serialize};

use burst_mem::{MrKeys, MwKeys, MwType, RegError};
use burst_transport::{QpAttr, QpConfig, QpState, VerbsError};

use crate::engine::{CreateError, PostError};
use crate::{DeviceCounters, QpInit};

/// `BRST`.
pub const MAGIC: [u8; 4] = *b"BRST";
/// The protocol version; a client of another version is refused at hello.
pub const VERSION: u16 = 4;
/// The largest message either side sends or accepts.
pub const MAX_MESSAGE: usize = 64 * 1024;
/// Descriptors one message carries at most.
pub const MAX_FDS: usize = 16;

/// What a client asks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Request {
    /// First message: the client's version and the sizes of the ring
    /// entries it was built with. Carries the client's async-event eventfd.
    Hello {
        /// [`VERSION`].
        version: u16,
        /// [`layout`] of the client's build.
        layout: u64,
    },
    /// `ibv_alloc_pd`.
    AllocPd,
    /// `ibv_dealloc_pd`.
    DeallocPd {
        /// The PD.
        pd: u32,
    },
    /// `ibv_reg_mr` of pages the client moved onto memfds: one descriptor
    /// per run of pages, in order, mapped back to back by the daemon.
    RegMr {
        /// The PD.
        pd: u32,
        /// Where the region starts in its first page.
        offset: u64,
        /// Each run: (offset in its memfd, bytes), whole pages.
        pieces: Vec<(u64, u64)>,
        /// Bytes.
        len: u64,
        /// The address peers use.
        iova: u64,
        /// `ibv_access_flags`.
        access: u32,
    },
    /// `ibv_reg_mr` without a memfd: the daemon reaches the client's
    /// memory through the descriptor of its `/proc/self/mem` that comes
    /// with the message (single copy; the daemon never acts on a pid).
    RegMrCopy {
        /// The PD.
        pd: u32,
        /// The address in the client.
        addr: u64,
        /// Bytes.
        len: u64,
        /// The address peers use.
        iova: u64,
        /// `ibv_access_flags`.
        access: u32,
    },
    /// `ibv_dereg_mr`.
    DeregMr {
        /// Its lkey.
        lkey: u32,
    },
    /// `ibv_alloc_mw`.
    AllocMw {
        /// The PD.
        pd: u32,
        /// Type 1 or 2.
        kind: MwType,
    },
    /// `ibv_dealloc_mw`.
    DeallocMw {
        /// Its handle.
        handle: u32,
    },
    /// `ibv_create_comp_channel`: carries the channel's eventfd.
    CreateCompChannel,
    /// `ibv_create_cq`.
    CreateCq {
        /// Entries asked for.
        depth: u32,
        /// A channel of [`Reply::Channel`].
        channel: Option<u32>,
    },
    /// `ibv_destroy_cq`.
    DestroyCq {
        /// The CQ.
        cq: u32,
    },
    /// `ibv_create_qp`.
    CreateQp {
        /// Type, PD, SRQ, capabilities.
        init: QpInit,
        /// Send CQ.
        send_cq: u32,
        /// Receive CQ.
        recv_cq: u32,
    },
    /// `ibv_destroy_qp`.
    DestroyQp {
        /// The QP.
        qpn: u32,
    },
    /// `ibv_modify_qp`.
    ModifyQp {
        /// The QP.
        qpn: u32,
        /// What changes.
        attr: QpAttr,
    },
    /// `ibv_attach_mcast` (`attach`) or `ibv_detach_mcast`.
    Multicast {
        /// The UD QP.
        qpn: u32,
        /// The group's GID.
        mgid: [u8; 16],
        /// Attach, or detach.
        attach: bool,
    },
    /// `ibv_query_qp`.
    QueryQp {
        /// The QP.
        qpn: u32,
    },
    /// `ibv_create_srq`.
    CreateSrq {
        /// The PD.
        pd: u32,
        /// Depth.
        max_wr: u32,
        /// SGEs per WR.
        max_sge: u32,
    },
    /// `ibv_destroy_srq`.
    DestroySrq {
        /// The SRQ.
        srq: u32,
    },
    /// `ibv_modify_srq`.
    ModifySrq {
        /// The SRQ.
        srq: u32,
        /// New depth.
        max_wr: Option<u32>,
        /// New limit (arms the limit event).
        limit: Option<u32>,
    },
    /// `ibv_destroy_comp_channel`.
    DestroyCompChannel {
        /// The handle burstd gave it.
        id: u32,
    },
    /// `ibv_destroy_ah`.
    DestroyAh {
        /// Its index.
        ah: u32,
    },
    /// `ibv_create_ah`.
    CreateAh {
        /// The destination GID.
        gid: [u8; 16],
        /// The source GID's index (`None`: the device's own address).
        sgid_index: Option<u8>,
    },
    /// The GID table (`ibv_query_gid`).
    Gids,
    /// Device counters.
    Counters,
    /// One QP's counters (the client's own QP; any QP for root).
    QpCounters {
        /// The QP.
        qpn: u32,
    },
    /// Every client and its objects (the `burst` tool).
    Clients,
    /// Starts copying the device's packets to the pcapng stream written to
    /// the descriptor this message carries (a pipe or a file), for at most
    /// `packets` packets.
    Capture {
        /// Packets to capture at most.
        packets: u64,
    },
    /// Connection management through the daemon's QP1: the message carries
    /// one end of a [`mad_socketpair`], over which the daemon forwards the
    /// CM MADs for this client's connections and takes the ones it sends.
    CmAttach,
    /// Routes REQs and SIDR_REQs for `service_id` to this client (or stops
    /// to); EADDRINUSE when another client listens on it.
    CmListen {
        /// The IB service ID (port space and port).
        service_id: u64,
        /// Listen (true) or stop (false).
        listen: bool,
    },
}

/// What the daemon says about its device at hello.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// Device name (`burst0`).
    pub name: String,
    /// Its IP address.
    pub addr: std::net::IpAddr,
    /// Its GID.
    pub gid: [u8; 16],
    /// Active MTU in bytes.
    pub mtu: u32,
    /// The network interface, if configured.
    pub interface: Option<String>,
    /// Engine threads.
    pub lanes: u32,
    /// The port kind (`udp`, `af-xdp`, `dpdk`).
    pub port: String,
}

/// One client, as the `burst` tool shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientInfo {
    /// burstd's number for it.
    pub id: u32,
    /// Its process (SO_PEERCRED).
    pub pid: u32,
    /// Its user.
    pub uid: u32,
    /// Its command name (`/proc/PID/comm`).
    pub comm: String,
    /// Protection domains.
    pub pds: Vec<u32>,
    /// Memory regions: (lkey, bytes, zero-copy).
    pub mrs: Vec<(u32, u64, bool)>,
    /// Completion queues.
    pub cqs: Vec<u32>,
    /// Queue pairs: (QPN, state).
    pub qps: Vec<(u32, String)>,
    /// Shared receive queues.
    pub srqs: Vec<u32>,
    /// Its user's usage (all its clients) against the daemon's limits:
    /// (limit, used, allowed).
    #[serde(default)]
    pub usage: Vec<(String, u64, u64)>,
    /// Its requests and messages burstd refused (bad input, limits).
    #[serde(default)]
    pub refused: u64,
}

/// A [`VerbsError`] as it crosses the socket (its message as text).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireVerbsError {
    /// Which variant.
    pub kind: u8,
    /// The state of `InvalidState`.
    pub state: Option<QpState>,
    /// The text of the variants that carry one.
    pub what: String,
}

impl From<VerbsError> for WireVerbsError {
    fn from(e: VerbsError) -> WireVerbsError {
        let (kind, state, what) = match e {
            VerbsError::InvalidState(s) => (0, Some(s), ""),
            VerbsError::MissingAttr(w) => (1, None, w),
            VerbsError::UnexpectedAttr(w) => (2, None, w),
            VerbsError::InvalidValue(w) => (3, None, w),
            VerbsError::QueueFull => (4, None, ""),
            VerbsError::TooManySge => (5, None, ""),
            VerbsError::BadWr(w) => (6, None, w),
            VerbsError::Busy(w) => (7, None, w),
            VerbsError::Unsupported(w) => (8, None, w),
        };
        WireVerbsError {
            kind,
            state,
            what: what.into(),
        }
    }
}

/// `s` as a `&'static str`: the texts of errors are a small fixed set (the
/// transport's literals), kept once each; past 256 distinct ones a generic
/// text stands in.
fn intern(s: &str) -> &'static str {
    static SEEN: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(k) = seen.iter().find(|k| **k == s) {
        return k;
    }
    if seen.len() >= 256 {
        return "(reported by burstd)";
    }
    let k: &'static str = Box::leak(s.to_owned().into_boxed_str());
    seen.push(k);
    k
}

impl WireVerbsError {
    /// Back to the transport's error.
    pub fn into_verbs(self) -> VerbsError {
        let w = intern(&self.what);
        match self.kind {
            0 => VerbsError::InvalidState(self.state.unwrap_or(QpState::Err)),
            1 => VerbsError::MissingAttr(w),
            2 => VerbsError::UnexpectedAttr(w),
            3 => VerbsError::InvalidValue(w),
            4 => VerbsError::QueueFull,
            5 => VerbsError::TooManySge,
            7 => VerbsError::Busy(w),
            8 => VerbsError::Unsupported(w),
            _ => VerbsError::BadWr(w),
        }
    }
}

/// What the daemon answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Reply {
    /// Welcome: the device, the client's number, and the layout of the
    /// segment carried with it (async events, then each lane's doorbells);
    /// descriptors: that segment, the daemon's wake segment, one wake
    /// eventfd per lane.
    Hello {
        /// The device.
        device: DeviceInfo,
        /// The client's number.
        client: u32,
        /// Slots of the async-event ring at offset 0.
        event_slots: u32,
        /// Where the first lane's doorbells start.
        bells_offset: u64,
        /// Bytes of one lane's doorbells.
        bells_stride: u64,
        /// Doorbells each lane's queue holds.
        bells_depth: u32,
        /// Bytes of the client's segment.
        segment_len: u64,
        /// Bytes of the wake segment.
        wake_len: u64,
    },
    /// Done, nothing to return.
    Done,
    /// A new PD.
    Pd {
        /// Its handle.
        pd: u32,
    },
    /// A registered region.
    Mr {
        /// Its keys.
        keys: MrKeys,
    },
    /// A memory window.
    Mw {
        /// Its handle and rkey.
        keys: MwKeys,
    },
    /// A completion channel registered.
    Channel {
        /// Its handle.
        id: u32,
    },
    /// A CQ; its segment rides along.
    Cq {
        /// Its handle.
        cq: u32,
        /// Slots of its ring.
        slots: u32,
        /// Bytes of its segment.
        len: u64,
    },
    /// A QP; its rings' segment rides along.
    Qp {
        /// Its number.
        qpn: u32,
        /// What the transport made of the request.
        cfg: QpConfig,
        /// The engine thread that owns it.
        lane: u32,
        /// Bytes of its segment.
        len: u64,
    },
    /// `ibv_query_qp`.
    QpState {
        /// The state.
        state: QpState,
        /// Creation config.
        cfg: QpConfig,
    },
    /// An SRQ; its ring's segment rides along.
    Srq {
        /// Its handle.
        srq: u32,
        /// Bytes of its segment.
        len: u64,
    },
    /// An address handle.
    Ah {
        /// Its number.
        ah: u32,
    },
    /// The GID table: entry `i` is GID index `i` (`None`: empty).
    Gids(Vec<Option<[u8; 16]>>),
    /// Device counters.
    Counters(Box<DeviceCounters>),
    /// One QP's counters.
    QpCounters(Box<burst_transport::Counters>),
    /// Every client.
    Clients(Vec<ClientInfo>),
    /// The call failed: rdma-core's errno, a message for the logs, and
    /// the error itself (the client returns exactly this one).
    Error {
        /// errno.
        errno: i32,
        /// What went wrong.
        message: String,
        /// The typed error.
        failure: Failure,
    },
}

impl Reply {
    /// An error reply of the daemon's own (limits, bad requests): its
    /// typed error is the one the errno stands for.
    pub fn error(errno: i32, message: impl Into<String>) -> Reply {
        Reply::Error {
            errno,
            message: message.into(),
            failure: Failure::of_errno(errno),
        }
    }

    /// The reply to a failed verb: its error, typed, with its errno.
    pub fn failed(failure: impl Into<Failure>, what: &str) -> Reply {
        let failure = failure.into();
        Reply::Error {
            errno: failure.errno(),
            message: format!("{what}: {}", failure.describe()),
            failure,
        }
    }
}

/// A verb's error as it crosses the socket: burstd sends the error its
/// in-process control plane returned, the client returns the same value
/// (no errno or message decoding).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Failure {
    /// [`PostError::Full`].
    Full,
    /// [`PostError::NoSuch`].
    NoSuch,
    /// [`PostError::Invalid`].
    Invalid,
    /// [`PostError::Stopped`].
    Stopped,
    /// [`PostError::Busy`].
    Busy,
    /// [`PostError::Refused`].
    Refused(WireVerbsError),
    /// [`CreateError::Verbs`].
    Verbs(WireVerbsError),
    /// A registration verb's [`RegError`].
    Reg(RegError),
    /// A system call failed in the daemon (descriptors, memory): its errno.
    Os(i32),
}

impl From<PostError> for Failure {
    fn from(e: PostError) -> Failure {
        match e {
            PostError::Full => Failure::Full,
            PostError::NoSuch => Failure::NoSuch,
            PostError::Invalid => Failure::Invalid,
            PostError::Stopped => Failure::Stopped,
            PostError::Busy => Failure::Busy,
            PostError::Refused(v) => Failure::Refused(v.into()),
        }
    }
}

impl From<CreateError> for Failure {
    fn from(e: CreateError) -> Failure {
        match e {
            CreateError::Post(p) => p.into(),
            CreateError::Verbs(v) => Failure::Verbs(v.into()),
        }
    }
}

impl From<RegError> for Failure {
    fn from(e: RegError) -> Failure {
        Failure::Reg(e)
    }
}

impl Failure {
    /// The error of a reply the daemon made itself (a limit, a bad
    /// request), from its errno.
    pub fn of_errno(errno: i32) -> Failure {
        match errno {
            libc::ENOMEM => Failure::Full,
            libc::EBUSY => Failure::Busy,
            libc::EIO => Failure::Stopped,
            libc::EINVAL => Failure::Invalid,
            libc::ENOENT => Failure::NoSuch,
            n => Failure::Os(n),
        }
    }

    /// rdma-core's errno for it.
    pub fn errno(&self) -> i32 {
        match self {
            Failure::Os(n) => *n,
            Failure::Reg(e) => e.errno(),
            Failure::Verbs(v) => v.clone().into_verbs().errno(),
            f => f.clone().post().errno(),
        }
    }

    fn describe(&self) -> String {
        match self {
            Failure::Os(n) => std::io::Error::from_raw_os_error(*n).to_string(),
            Failure::Reg(e) => e.to_string(),
            Failure::Verbs(v) => v.clone().into_verbs().to_string(),
            f => f.clone().post().to_string(),
        }
    }

    /// As a [`PostError`] (a registration error as the closest one).
    pub fn post(self) -> PostError {
        match self {
            Failure::Full => PostError::Full,
            Failure::NoSuch => PostError::NoSuch,
            Failure::Invalid => PostError::Invalid,
            Failure::Stopped => PostError::Stopped,
            Failure::Busy => PostError::Busy,
            Failure::Refused(v) | Failure::Verbs(v) => PostError::Refused(v.into_verbs()),
            Failure::Reg(RegError::Exhausted) => PostError::Full,
            Failure::Reg(RegError::InUse) => PostError::Busy,
            Failure::Reg(_) => PostError::Invalid,
            Failure::Os(libc::ENOMEM | libc::EMFILE | libc::ENFILE | libc::EAGAIN) => {
                PostError::Full
            }
            Failure::Os(_) => PostError::Invalid,
        }
    }

    /// As a [`CreateError`].
    pub fn create(self) -> CreateError {
        match self {
            Failure::Verbs(v) => CreateError::Verbs(v.into_verbs()),
            f => CreateError::Post(f.post()),
        }
    }

    /// As a [`RegError`].
    pub fn reg(self) -> RegError {
        match self {
            Failure::Reg(e) => e,
            Failure::NoSuch => RegError::NoSuchRegion,
            Failure::Busy => RegError::InUse,
            Failure::Invalid => RegError::InvalidLength,
            _ => RegError::Exhausted,
        }
    }

    /// As an `std::io::Error` of its errno.
    pub fn io(self) -> std::io::Error {
        std::io::Error::from_raw_os_error(self.errno())
    }
}

/// A fingerprint of the ring-entry layouts of this build: client and
/// daemon must agree byte for byte.
pub fn layout() -> u64 {
    use crate::shm::Entry;
    let sizes = [
        <burst_transport::SendWr as Entry>::SIZE,
        <burst_transport::RecvWr as Entry>::SIZE,
        <burst_transport::WorkCompletion as Entry>::SIZE,
        <crate::AsyncEvent as Entry>::SIZE,
    ];
    sizes.iter().fold(u64::from(VERSION), |h, s| {
        h.wrapping_mul(1_000_003) ^ *s as u64
    })
}

/// Why a message was refused.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// Shorter than the header, or longer than [`MAX_MESSAGE`].
    #[error("message of {0} bytes (header 8, at most {MAX_MESSAGE})")]
    Size(usize),
    /// Not `BRST`.
    #[error("bad magic")]
    Magic,
    /// Another version.
    #[error("protocol version {0}, this build speaks {VERSION}")]
    Version(u16),
    /// The body does not decode.
    #[error("malformed message: {0}")]
    Body(#[from] serde_json::Error),
}

/// A message: header and JSON body.
pub fn encode<T: Serialize>(m: &T) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&[0, 0]);
    // Serializing our own types to a Vec cannot fail.
    serde_json::to_writer(&mut out, m).unwrap_or_default();
    out
}

/// The message in `b`, checked.
pub fn decode<T: for<'de> Deserialize<'de>>(b: &[u8]) -> Result<T, ProtocolError> {
    if b.len() < 8 || b.len() > MAX_MESSAGE {
        return Err(ProtocolError::Size(b.len()));
    }
    if b[..4] != MAGIC {
        return Err(ProtocolError::Magic);
    }
    let v = u16::from_le_bytes([b[4], b[5]]);
    if v != VERSION {
        return Err(ProtocolError::Version(v));
    }
    Ok(serde_json::from_slice(&b[8..])?)
}

/// Sends one message with descriptors.
pub fn send(sock: BorrowedFd<'_>, msg: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many descriptors",
        ));
    }
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let mut iov = libc::iovec {
        iov_base: msg.as_ptr().cast_mut().cast(),
        iov_len: msg.len(),
    };
    let mut cbuf = [0u64; 32]; // CMSG_SPACE(16 fds) fits in 256 bytes, aligned
                               // SAFETY: a zeroed msghdr is valid; every pointer set below is live for
                               // the call.
    let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
    hdr.msg_iov = &mut iov;
    hdr.msg_iovlen = 1;
    if !raw.is_empty() {
        let bytes = std::mem::size_of_val(raw.as_slice());
        // SAFETY: CMSG_SPACE is arithmetic.
        let space = unsafe { libc::CMSG_SPACE(bytes as u32) } as usize;
        hdr.msg_control = cbuf.as_mut_ptr().cast();
        hdr.msg_controllen = space;
        // SAFETY: msg_control points at `space` bytes of our buffer (space
        // <= 256 for 16 fds), so the first header and its data fit.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&hdr);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(bytes as u32) as usize;
            std::ptr::copy_nonoverlapping(raw.as_ptr(), libc::CMSG_DATA(c).cast(), raw.len());
        }
    }
    loop {
        // SAFETY: `hdr` and everything it points at are live.
        let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &hdr, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Receives one message and its descriptors; `Ok(None)` when the peer
/// closed. Descriptors beyond [`MAX_FDS`] and truncated messages are refused.
pub fn recv(sock: BorrowedFd<'_>) -> io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    let mut buf = vec![0u8; MAX_MESSAGE + 1];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cbuf = [0u64; 40];
    // SAFETY: as in `send`.
    let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
    hdr.msg_iov = &mut iov;
    hdr.msg_iovlen = 1;
    hdr.msg_control = cbuf.as_mut_ptr().cast();
    hdr.msg_controllen = std::mem::size_of_val(&cbuf);
    let n = loop {
        // SAFETY: `hdr` points at live buffers of the sizes it states.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut hdr, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel wrote into `cbuf`,
    // with the libc macros that bound each step by msg_controllen.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&hdr);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                let len = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..len / std::mem::size_of::<RawFd>() {
                    // Each descriptor the kernel installed is ours now.
                    fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            c = libc::CMSG_NXTHDR(&hdr, c);
        }
    }
    if n == 0 && fds.is_empty() {
        return Ok(None);
    }
    if hdr.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 || fds.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "truncated message or too many descriptors",
        ));
    }
    buf.truncate(n);
    Ok(Some((buf, fds)))
}

/// The credentials of the peer of a Unix socket (`SO_PEERCRED`): pid, uid, gid.
pub fn peer_credentials(sock: BorrowedFd<'_>) -> io::Result<(u32, u32, u32)> {
    // SAFETY: a zeroed ucred is valid.
    let mut c: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt into a live ucred of the stated length.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut c as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((c.pid as u32, c.uid, c.gid))
}

/// A connected `SOCK_SEQPACKET` socket to `path`.
pub fn connect(path: &std::path::Path) -> io::Result<OwnedFd> {
    let fd = seqpacket()?;
    let (addr, len) = sockaddr(path)?;
    // SAFETY: connect with a sockaddr_un of the stated length.
    let rc = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// A `SOCK_SEQPACKET` socket listening on `path` (an old socket file there
/// is replaced).
pub fn listen(path: &std::path::Path) -> io::Result<OwnedFd> {
    let fd = seqpacket()?;
    let (addr, len) = sockaddr(path)?;
    let _ = std::fs::remove_file(path);
    // SAFETY: bind and listen with a sockaddr_un of the stated length.
    unsafe {
        if libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            len,
        ) < 0
            || libc::listen(fd.as_raw_fd(), 128) < 0
        {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(fd)
}

/// Accepts a connection.
pub fn accept(listener: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    loop {
        // SAFETY: accept4 without an address; the result is checked.
        let fd = unsafe {
            libc::accept4(
                listener.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        };
        if fd >= 0 {
            // SAFETY: a fresh descriptor we own.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

fn seqpacket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket call; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn sockaddr(path: &std::path::Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: a zeroed sockaddr_un is valid.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let p = path.as_os_str().as_bytes();
    if p.len() >= a.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "socket path too long",
        ));
    }
    for (d, s) in a.sun_path.iter_mut().zip(p) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + p.len() + 1;
    Ok((a, len as libc::socklen_t))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn bad_messages_are_refused_not_crashed_on() {
        let good = encode(&Request::Counters);
        assert!(decode::<Request>(&good).is_ok());
        let mut v = good.clone();
        v[4] = 9;
        assert!(matches!(
            decode::<Request>(&v),
            Err(ProtocolError::Version(9))
        ));
        let mut m = good.clone();
        m[0] = b'X';
        assert!(matches!(decode::<Request>(&m), Err(ProtocolError::Magic)));
        assert!(decode::<Request>(&good[..good.len() - 1]).is_err());
        let mut unknown = good[..8].to_vec();
        unknown.extend_from_slice(br#""FormatDisk""#);
        assert!(decode::<Request>(&unknown).is_err());
        assert!(decode::<Request>(&vec![0u8; MAX_MESSAGE + 1]).is_err());
    }

    #[test]
    fn descriptors_cross_a_socket_pair() {
        let mut sv = [0; 2];
        assert_eq!(
            // SAFETY: socketpair into a live array of two.
            unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0, sv.as_mut_ptr()) },
            0
        );
        // SAFETY: fresh descriptors we own.
        let (a, b) = unsafe { (OwnedFd::from_raw_fd(sv[0]), OwnedFd::from_raw_fd(sv[1])) };
        let seg = crate::shm::Segment::memfd("t", 4096).unwrap();
        seg.word(8).store(42, std::sync::atomic::Ordering::Relaxed);
        send(a.as_fd(), &encode(&Request::AllocPd), &[seg.fd().unwrap()]).unwrap();
        let (m, fds) = recv(b.as_fd()).unwrap().unwrap();
        assert_eq!(decode::<Request>(&m).unwrap(), Request::AllocPd);
        let other = crate::shm::Segment::from_fd(fds.into_iter().next().unwrap(), 4096).unwrap();
        assert_eq!(other.word(8).load(std::sync::atomic::Ordering::Relaxed), 42);
        drop(a);
        assert!(
            recv(b.as_fd()).unwrap().is_none(),
            "EOF after the peer closed"
        );
        let (pid, _, _) = peer_credentials(b.as_fd()).unwrap();
        assert_eq!(pid, std::process::id());
    }
}

/// Size of a datagram on a MAD socket: the peer's address as 16 bytes
/// (IPv4-mapped for IPv4), then the 256-byte MAD.
pub const MAD_DATAGRAM: usize = 16 + burst_wire::mad::MAD_LEN;

/// A pair of connected SOCK_SEQPACKET sockets for CM MADs between a client
/// and the daemon (non-blocking both).
pub fn mad_socketpair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut sv = [0 as libc::c_int; 2];
    // SAFETY: `sv` is a live array of two ints the call fills.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
            sv.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: two fresh descriptors we own.
    Ok(unsafe { (OwnedFd::from_raw_fd(sv[0]), OwnedFd::from_raw_fd(sv[1])) })
}

/// Sends one MAD on a MAD socket without blocking; `false` when the
/// socket is full or gone (the CM retransmits).
pub fn send_mad(sock: BorrowedFd<'_>, m: &crate::gsi::GsiMad) -> bool {
    let mut b = [0u8; MAD_DATAGRAM];
    let ip = match m.peer {
        std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        std::net::IpAddr::V6(v6) => v6,
    };
    b[..16].copy_from_slice(&ip.octets());
    b[16..].copy_from_slice(&m.mad);
    // SAFETY: sends `b`, live for the call, on a descriptor we borrow.
    let n = unsafe {
        libc::send(
            sock.as_raw_fd(),
            b.as_ptr().cast(),
            b.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    n == b.len() as isize
}

/// Sends `msg` (no descriptors) without waiting: `false` if the socket's
/// buffer is full or it is gone (a refusal to a peer that may never read).
pub fn send_nowait(sock: BorrowedFd<'_>, msg: &[u8]) -> bool {
    // SAFETY: sends `msg`, live for the call, on a descriptor we borrow.
    let n = unsafe {
        libc::send(
            sock.as_raw_fd(),
            msg.as_ptr().cast(),
            msg.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    n == msg.len() as isize
}

/// What reading a MAD socket gave.
#[derive(Debug, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)] // read once per MAD, on the stack
pub enum MadRecv {
    /// A MAD.
    Mad(crate::gsi::GsiMad),
    /// Nothing waits.
    Empty,
    /// A datagram of the wrong size (dropped).
    Bad,
    /// The other end is gone.
    Closed,
}

/// Takes one MAD from a MAD socket without blocking.
pub fn recv_mad(sock: BorrowedFd<'_>) -> MadRecv {
    let mut b = [0u8; MAD_DATAGRAM + 1];
    // SAFETY: receives into `b`, live for the call, on a descriptor we borrow.
    let n = unsafe {
        libc::recv(
            sock.as_raw_fd(),
            b.as_mut_ptr().cast(),
            b.len(),
            libc::MSG_DONTWAIT,
        )
    };
    match n {
        0 => MadRecv::Closed,
        n if n < 0 => match io::Error::last_os_error().kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => MadRecv::Empty,
            _ => MadRecv::Closed,
        },
        n if n as usize != MAD_DATAGRAM => MadRecv::Bad,
        _ => {
            let mut ip = [0u8; 16];
            ip.copy_from_slice(&b[..16]);
            let v6 = std::net::Ipv6Addr::from(ip);
            let peer = v6
                .to_ipv4_mapped()
                .map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4);
            let mut mad = [0u8; burst_wire::mad::MAD_LEN];
            mad.copy_from_slice(&b[16..MAD_DATAGRAM]);
            MadRecv::Mad(crate::gsi::GsiMad { peer, mad })
        }
    }
}
