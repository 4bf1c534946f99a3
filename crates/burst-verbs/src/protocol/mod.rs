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

use serde::{Deserialize, Serialize};

use burst_mem::{MrKeys, MwKeys, MwType};
use burst_transport::{QpAttr, QpConfig, QpState};

use crate::{DeviceCounters, QpInit};

mod failure;
mod socket;

pub use failure::{Failure, WireVerbsError};
pub use socket::*;

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
    /// `ibv_rereg_mr`'s step: the region registered as `new` takes over
    /// `old`'s keys (both the client's).
    ReplaceMr {
        /// The region whose keys stay.
        old: u32,
        /// The registration that replaces it.
        new: u32,
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
    /// Steps the device's lanes before the reply ([`Reply::Done`]): what
    /// the client posted before is taken (`ibv_resize_cq` then counts the
    /// completions of the UD sends posted before it, as on RXE).
    Settle,
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsFd, FromRawFd, OwnedFd};

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
