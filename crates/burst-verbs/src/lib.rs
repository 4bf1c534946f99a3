#![doc = include_str!("../README.md")]

pub mod bottleneck;
pub mod client;
pub mod clock;
pub mod cm;
pub mod config;
pub mod engine;

// The Verbs vocabulary, re-exported by name: an application or the C
// library names every type of the API through burst-verbs (and no crate
// below it).
pub use burst_mem::{Access, MrKeys, MwKeys, MwType, Pd, RegError, MAX_WINDOWS};
pub use burst_transport::{
    wr_opcode, InlineData, MwBind, NetworkHeader, QpAccess, QpAttr, QpConfig, QpEvent, QpState,
    QpType, RecvWr, SendOp, SendWr, SgList, Sge, UdDest, VerbsError, WcOpcode, WcStatus,
    WorkCompletion, MAX_RD_ATOMIC,
};
pub use burst_wire::{Mtu, Psn, Qpn, ROCEV2_PORT};

/// Copies the bytes `sges` name from this process's memory into a work
/// request's inline buffer, as providers do for `IBV_SEND_INLINE`: the
/// addresses are read now, and no lkey is needed or checked. More bytes
/// than an inline buffer holds are refused ([`VerbsError::BadWr`]).
///
/// # Safety
/// Each SGE must name memory of this process readable for its length.
pub unsafe fn gather_inline(sges: &[Sge]) -> Result<InlineData, VerbsError> {
    let len: u64 = sges.iter().map(|s| u64::from(s.length)).sum();
    let len = usize::try_from(len).map_err(|_| VerbsError::BadWr("inline data too long"))?;
    let mut d = InlineData::zeroed(len)?;
    let mut at = 0;
    for s in sges.iter().filter(|s| s.length > 0) {
        let n = s.length as usize;
        // SAFETY: the caller's contract: `s` names `n` readable bytes; `d`
        // holds the sum of the lengths.
        unsafe {
            std::ptr::copy_nonoverlapping(s.addr as usize as *const u8, d[at..].as_mut_ptr(), n)
        };
        at += n;
    }
    Ok(d)
}

/// Packet ports below the Verbs API, for tools that drive one directly (a
/// raw port benchmark), record what a device sends and receives, or run
/// devices over an in-memory network (tests, fuzzing, simulation).
pub mod ports {
    pub use burst_io::capture::{CapturePort, Captured, Tap};
    pub use burst_io::{
        PacketBuf, Port, Readiness, RxBatch, SimFaults, SimNet, SimPort, MAX_GSO_SEGMENTS,
    };
}
mod congestion;
mod copy;
mod dataplane;
mod entry;
pub mod eventfd;
pub mod gids;
pub mod gsi;
pub mod netif;
pub mod protocol;
pub mod rdma_cm;
pub mod rsocket;
pub mod shm;
pub mod sim;
mod thread;

pub(crate) use dataplane::{Device, FIRST_QPN};

use burst_io::Port;

burst_wire::counters! {
    /// Device-wide counters (names after RXE's where one exists).
    #[derive(serde::Serialize, serde::Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct DeviceCounters {
        /// Packets sent.
        pub sent_pkts: u64,
        /// Packets received.
        pub rcvd_pkts: u64,
        /// Received packets whose ICRC verified.
        pub icrc_verified: u64,
        /// Received packets whose ICRC matched once the sender's IPv4 ID was
        /// solved for (16-bit strength; RXE and RNICs count IDs).
        pub icrc_id_solved: u64,
        /// Received packets whose ICRC could not be checked (too short to hold
        /// one, or an address family other than the device's).
        pub icrc_unverified: u64,
        /// Received packets dropped for a bad ICRC.
        pub icrc_errors: u64,
        /// Malformed packets dropped.
        pub malformed: u64,
        /// Packets for no QP of this device.
        pub no_qp: u64,
        /// The transport counters of every QP, live and destroyed, summed
        /// (retransmissions, NAKs by kind, RNR events, duplicates, out-of-sequence).
        pub qps: burst_transport::Counters,
        /// Congestion control: CNPs, CE marks, window and rate cuts.
        pub cc: CongestionCounters,
        /// What the port counted (whole-frame ports: frames not for burst,
        /// malformed, bad ICRC, neighbour resolution).
        pub port: burst_io::PortCounters,
        /// How payload moved: offloaded jobs, CPU and fused bytes, the
        /// backend's faults and fallbacks ([`config::CopyBackend`]).
        #[serde(default)]
        pub copy: burst_mem::CopierCounters,
        /// Sends whose transmit waited for the lane's next round, corked
        /// behind their QP's packets in flight ([`engine::Context::post_send`]).
        #[serde(default)]
        pub corked_posts: u64,
        /// Lanes that stopped corking posts because a cork outlived the
        /// claim of the thread that posted ([`dataplane::Device::stop_corking`]).
        #[serde(default)]
        pub cork_lapses: u64,
    }
}

pub use congestion::CongestionCounters;

/// The congestion-control state of a device
/// ([`engine::Context::congestion`]).
#[derive(Debug, Clone, PartialEq)]
pub struct CongestionReport {
    /// The algorithm configured.
    pub algorithm: burst_cc::Algorithm,
    /// Each peer's window: its address, state, and request packets in
    /// flight to it.
    pub peers: Vec<(std::net::IpAddr, burst_cc::CcState, u64)>,
    /// Each QP's DCQCN state (when DCQCN runs).
    pub qps: Vec<(Qpn, burst_cc::CcState)>,
}

/// An asynchronous event (`ibv_async_event`): something that happened to a
/// QP, SRQ or the device outside any work request's completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncEvent {
    /// The SRQ's posted receives fell below its limit, which disarms
    /// (`IBV_EVENT_SRQ_LIMIT_REACHED`).
    SrqLimitReached(SrqId),
    /// Something happened to a QP: the transport's events (COMM_EST,
    /// LAST_WQE_REACHED, SQ_DRAINED, request and access errors as
    /// responder), and [`QpEvent::Fatal`] for a fault inside burst while
    /// handling it, after which the QP is in the error state with its work
    /// requests flushed.
    Qp(Qpn, QpEvent),
    /// The device failed outside any one QP: every QP is in the error state
    /// (`IBV_EVENT_DEVICE_FATAL`).
    DeviceFatal,
    /// A completion found its CQ full (`IBV_EVENT_CQ_ERR`, as RXE raises
    /// on overflow): the application polls too slowly for the CQ's depth.
    /// Raised once per overrun; unlike RXE, no completion is lost (the
    /// engine holds it until the CQ has room).
    CqError(engine::CqId),
    /// Port 1's link went down (`IBV_EVENT_PORT_ERR`) or came back up
    /// (`IBV_EVENT_PORT_ACTIVE`), as RXE follows its network device.
    Port {
        /// Whether the port is active now.
        active: bool,
    },
}

/// Runs `f`; a panic inside it becomes `Err` with its message (the data
/// plane contains its faults instead of unwinding into the application or
/// stopping the device).
pub fn contain<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
        p.downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "panic".into())
    })
}

/// Most QPs (and SRQs) per device.
pub const MAX_QP: u32 = 1 << 16;
/// Most work requests per queue.
pub const MAX_QP_WR: u32 = 16384;
/// Most entries per completion queue.
pub const MAX_CQE: u32 = 1 << 20;
/// Most SGEs per work request (what an engine ring entry holds).
pub const MAX_SGE: u32 = burst_transport::MAX_SGE as u32;
/// Most inline bytes per send (what an engine ring entry holds).
pub const MAX_INLINE: u32 = burst_transport::MAX_INLINE as u32;

/// Vendor ID burst reports: not a real vendor's (so perftest takes its
/// generic path); 0xb0 0x57 reads "burst". Also the vendor of burst's ECE
/// options (`burst_cm::ece`).
pub const VENDOR_ID: u32 = burst_cm::ece::VENDOR_ID;

/// Enhanced Connection Establishment options (`struct ibv_ece`): what a
/// QP offers beyond IBA, exchanged with the peer at connection setup
/// (librdmacm carries it in the CM REQ and REP; other applications in
/// their own exchange, as NCCL does) and kept only when both ends offer it
/// under the same vendor ID. burst's one option is selective repeat
/// ([`ECE_SELECTIVE_REPEAT`]); toward RXE or an RNIC, whose vendor ID
/// differs or who offers nothing, the QP stays go-back-N.
///
/// ```
/// use burst_verbs::Ece;
/// let ours = Ece::offered();
/// assert!(ours.agree(&ours).selective_repeat());
/// let rnic = Ece { vendor_id: 0x15b3, options: 1 };
/// assert!(!ours.agree(&rnic).selective_repeat());
/// assert!(!ours.agree(&Ece::default()).selective_repeat());
/// ```
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ece {
    /// The offering stack's vendor ([`VENDOR_ID`] for burst; 0: none).
    pub vendor_id: u32,
    /// Options, as the vendor defines them.
    pub options: u32,
}

/// burst's ECE option bit: selective repeat (`QpAttr::selective_repeat`).
pub const ECE_SELECTIVE_REPEAT: u32 = burst_cm::ece::SELECTIVE_REPEAT;

impl Ece {
    /// What a burst QP offers.
    pub const fn offered() -> Ece {
        Ece {
            vendor_id: VENDOR_ID,
            options: ECE_SELECTIVE_REPEAT,
        }
    }

    /// The options both `self` (ours) and `peer` offer: none unless both
    /// are burst's.
    #[must_use]
    pub fn agree(&self, peer: &Ece) -> Ece {
        if self.vendor_id != VENDOR_ID || peer.vendor_id != VENDOR_ID {
            return Ece::default();
        }
        Ece {
            vendor_id: VENDOR_ID,
            options: self.options & peer.options & ECE_SELECTIVE_REPEAT,
        }
    }

    /// Whether these (agreed) options turn selective repeat on.
    pub fn selective_repeat(&self) -> bool {
        self.vendor_id == VENDOR_ID && self.options & ECE_SELECTIVE_REPEAT != 0
    }
}

/// What [`engine::Context::query_device`] reports (the fields of `ibv_device_attr`
/// an application sizes itself by); every limit is one the stack enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Vendor ID ([`VENDOR_ID`]).
    pub vendor_id: u32,
    /// Node GUID (EUI-64 derived from the address).
    pub node_guid: u64,
    /// Queue pairs.
    pub max_qp: u32,
    /// Work requests per queue.
    pub max_qp_wr: u32,
    /// SGEs per work request.
    pub max_sge: u32,
    /// Inline bytes per send.
    pub max_inline_data: u32,
    /// Shared receive queues.
    pub max_srq: u32,
    /// Work requests per SRQ.
    pub max_srq_wr: u32,
    /// Outstanding RDMA READ/atomic per QP, as target and as initiator.
    pub max_qp_rd_atom: u32,
    /// Largest message.
    pub max_msg_sz: u32,
}

impl DeviceAttr {
    /// The attributes of the device whose GID is `gid`.
    pub fn for_gid(g: [u8; 16]) -> DeviceAttr {
        DeviceAttr {
            vendor_id: VENDOR_ID,
            node_guid: u64::from_be_bytes([g[8] ^ 2, g[9], g[10], 0xff, 0xfe, g[13], g[14], g[15]]),
            max_qp: MAX_QP,
            max_qp_wr: MAX_QP_WR,
            max_sge: MAX_SGE,
            max_inline_data: MAX_INLINE,
            max_srq: MAX_QP,
            max_srq_wr: MAX_QP_WR,
            max_qp_rd_atom: u32::from(burst_transport::MAX_RD_ATOMIC),
            max_msg_sz: burst_transport::MAX_MSG_SIZE as u32,
        }
    }
}

/// What [`engine::Context::query_port`] reports (`ibv_port_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortAttr {
    /// ACTIVE while the device's interface is up and running (RXE follows
    /// its network device so; [`AsyncEvent::Port`] says when it changes).
    pub active: bool,
    /// Largest path MTU.
    pub max_mtu: Mtu,
    /// Active MTU (from the interface MTU, as RXE computes it).
    pub active_mtu: Mtu,
    /// Link layer: Ethernet (RoCE).
    pub link_layer_ethernet: bool,
    /// GID table length (RXE's: [`crate::gids::GID_TABLE_LEN`]).
    pub gid_tbl_len: u32,
    /// Longest message (2^31, the IBA's limit: C9-94).
    pub max_msg_sz: u32,
}

impl PortAttr {
    /// Port 1 of a device whose active MTU is `active_mtu`.
    pub fn with_mtu(active_mtu: Mtu) -> PortAttr {
        PortAttr {
            active: true,
            max_mtu: Mtu::Mtu4096,
            active_mtu,
            link_layer_ethernet: true,
            gid_tbl_len: crate::gids::GID_TABLE_LEN as u32,
            max_msg_sz: burst_transport::MAX_MSG_SIZE as u32,
        }
    }
}

/// The active RoCE MTU for an interface MTU, as RXE computes it: the
/// largest IB MTU that fits with the RoCEv2 headers (1500 → 1024, 9000 → 4096).
pub fn active_mtu_for(if_mtu: usize) -> Mtu {
    // RXE subtracts GRH (40) + UDP + BTH + AtomicETH + ICRC.
    let room = if_mtu.saturating_sub(40 + 8 + 12 + 28 + 4);
    Mtu::ALL
        .iter()
        .rev()
        .copied()
        .find(|m| m.bytes() <= room)
        .unwrap_or(Mtu::Mtu256)
}

/// The far end of an RC (or UC) connection, as exchanged out of band.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RcPeer {
    /// Its GID.
    pub gid: [u8; 16],
    /// Its QP number.
    pub qpn: Qpn,
    /// Its starting PSN (our receive PSN).
    pub psn: Psn,
}

/// Parameters of [`engine::Context::connect_rc`]; the defaults are those of
/// rdma-core's `ibv_rc_pingpong` (timeout 14, retry 7, RNR retry 7,
/// min RNR timer 12, one outstanding READ/atomic).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RcParams {
    /// Our starting PSN.
    pub psn: Psn,
    /// Path MTU.
    pub mtu: Mtu,
    /// Remote access this QP grants.
    pub access: QpAccess,
    /// Local ACK timeout exponent.
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries (7 = infinite).
    pub rnr_retry: u8,
    /// RNR NAK timer code we answer with.
    pub min_rnr_timer: u8,
    /// READs/atomics we issue at once, and accept from the peer.
    pub rd_atomic: u8,
    /// Selective repeat, when the peer agreed to it ([`Ece::agree`]).
    pub selective_repeat: bool,
}

impl RcParams {
    /// The three `modify_qp` calls that take an RC QP from RESET to RTS
    /// towards `peer` (reached through address handle `ah`): INIT, RTR and
    /// RTS with the attributes rdma-core requires for each.
    ///
    /// ```
    /// use burst_verbs::{RcParams, RcPeer};
    /// use burst_transport::QpState;
    /// use burst_wire::{Mtu, Psn, Qpn};
    /// let peer = RcPeer { gid: [0; 16], qpn: Qpn::new(0x12).unwrap(), psn: Psn::new(7) };
    /// let [init, rtr, rts] = RcParams::new(Psn::new(1), Mtu::Mtu1024).transitions(0, &peer);
    /// assert_eq!((init.state, rtr.state, rts.state), (Some(QpState::Init), Some(QpState::Rtr), Some(QpState::Rts)));
    /// assert_eq!(rtr.rq_psn, Some(Psn::new(7)));
    /// ```
    pub fn transitions(&self, ah: u32, peer: &RcPeer) -> [QpAttr; 3] {
        [
            QpAttr {
                state: Some(QpState::Init),
                pkey_index: Some(0),
                port: Some(1),
                access: Some(self.access),
                ..Default::default()
            },
            QpAttr {
                state: Some(QpState::Rtr),
                ah: Some(ah),
                path_mtu: Some(self.mtu),
                dest_qpn: Some(peer.qpn),
                rq_psn: Some(peer.psn),
                max_dest_rd_atomic: Some(self.rd_atomic),
                min_rnr_timer: Some(self.min_rnr_timer),
                selective_repeat: self.selective_repeat.then_some(true),
                ..Default::default()
            },
            QpAttr {
                state: Some(QpState::Rts),
                sq_psn: Some(self.psn),
                timeout: Some(self.timeout),
                retry_cnt: Some(self.retry_cnt),
                rnr_retry: Some(self.rnr_retry),
                max_rd_atomic: Some(self.rd_atomic),
                ..Default::default()
            },
        ]
    }

    /// ibv_rc_pingpong's values with our starting PSN and path MTU.
    #[must_use]
    pub fn new(psn: Psn, mtu: Mtu) -> RcParams {
        RcParams {
            psn,
            mtu,
            access: QpAccess::default(),
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            rd_atomic: 1,
            selective_repeat: false,
        }
    }
}

/// The three `ibv_modify_qp` steps that take a UD QP from RESET to RTS
/// with Q_Key `qkey` (port 1, P_Key index 0; a UD QP has no peer).
///
/// ```
/// use burst_verbs::{ud_transitions, Psn, QpState};
/// let [init, rtr, rts] = ud_transitions(0x11, Psn::new(0));
/// assert_eq!((init.qkey, rtr.state, rts.sq_psn), (Some(0x11), Some(QpState::Rtr), Some(Psn::new(0))));
/// ```
pub fn ud_transitions(qkey: u32, sq_psn: Psn) -> [QpAttr; 3] {
    [
        QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            port: Some(1),
            qkey: Some(qkey),
            ..Default::default()
        },
        QpAttr {
            state: Some(QpState::Rtr),
            ..Default::default()
        },
        QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(sq_psn),
            ..Default::default()
        },
    ]
}

/// Handle of a shared receive queue.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SrqId(pub u32);

/// Queue sizes asked for at QP creation (`ibv_qp_cap`).
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth (ignored on an SRQ).
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Inline bytes per send.
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    fn default() -> QpCaps {
        QpCaps {
            max_send_wr: 1024,
            max_recv_wr: 1024,
            max_send_sge: 8,
            max_recv_sge: 8,
            max_inline_data: 256,
        }
    }
}

/// What [`engine::Context::create_qp_with`] needs (`ibv_qp_init_attr`).
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInit {
    /// Transport.
    pub qp_type: QpType,
    /// Protection domain.
    pub pd: Pd,
    /// Shared receive queue to receive from.
    pub srq: Option<SrqId>,
    /// Queue sizes.
    pub caps: QpCaps,
}

impl QpInit {
    /// A QP of `qp_type` in `pd` with default sizes and no SRQ.
    #[must_use]
    pub fn new(qp_type: QpType, pd: Pd) -> QpInit {
        QpInit {
            qp_type,
            pd,
            srq: None,
            caps: QpCaps::default(),
        }
    }
}

pub use burst_wire::{gid_of, ip_of_gid};

/// A random starting PSN, as a QP's first should be (a predictable one
/// lets a stale packet of an earlier connection look current).
///
/// ```
/// assert!(burst_verbs::random_psn().value() <= 0xff_ffff);
/// ```
pub fn random_psn() -> Psn {
    let mut b = [0u8; 4];
    // Without entropy the time still differs per call and process.
    if getrandom::fill(&mut b).is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        b = (t ^ std::process::id().rotate_left(16)).to_ne_bytes();
    }
    Psn::new(u32::from_ne_bytes(b) & 0xff_ffff)
}

/// The port a device has unless told otherwise: any port, chosen when
/// the device opens (a UDP socket, the same behind a [`burst_io::LossyPort`]
/// for loss tests, an in-memory [`burst_io::SimPort`], AF_XDP later).
pub type AnyPort = Box<dyn Port + Send>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_counters_sum_every_field_of_every_part() {
        let lane = DeviceCounters {
            sent_pkts: 2,
            qps: burst_transport::Counters {
                retransmitted_pkts: 3,
                ..Default::default()
            },
            port: burst_io::PortCounters {
                // The two a hand-written sum once left out.
                steered_unknown_qpn: 5,
                rx_handed_off: 7,
                ..Default::default()
            },
            copy: burst_mem::CopierCounters {
                backend_errors: 11,
                ..Default::default()
            },
            cc: CongestionCounters {
                held: 13,
                ..Default::default()
            },
            ..Default::default()
        };
        let mut total = lane;
        total.add(&lane);
        assert_eq!(total.sent_pkts, 4);
        assert_eq!(total.qps.retransmitted_pkts, 6);
        assert_eq!(total.port.steered_unknown_qpn, 10);
        assert_eq!(total.port.rx_handed_off, 14);
        assert_eq!(total.copy.backend_errors, 22);
        assert_eq!(total.cc.held, 26);
    }
}
