//! # burst-verbs: the Verbs API
//!
//! [`Device`] composes burst's crates into a working RDMA device: memory
//! regions from burst-mem, queue pairs from burst-transport, and a packet
//! port from burst-io. It speaks RoCEv2 on the wire, so its peers can be
//! kernel RXE or RDMA NICs.
//!
//! This first version is a *synchronous driver*: the caller's thread makes
//! progress (receive, timers, transmit) inside [`Device::progress`], which
//! [`Device::poll_cq`] calls. The engine thread with per-QP rings and an MPSC
//! doorbell queue (the architecture's front-end/engine split) is still to
//! come; this type's interface is what it will sit behind.

pub mod config;
pub mod engine;

/// The crates burst-verbs composes, for users that reach below the Verbs
/// API (a port benchmark, a packet tool): one dependency brings them all,
/// in the versions burst-verbs was built with.
pub use {burst_io as ports, burst_mem as mem, burst_transport as transport, burst_wire as wire};

// The Verbs vocabulary, re-exported: an application or the C library
// names every type of the API through burst-verbs.
pub use burst_mem::{Access, MrKeys, Pd, RegError};
pub use burst_transport::{
    QpAccess, QpAttr, QpConfig, QpState, QpType, RecvWr, SendOp, SendWr, Sge, UdDest, VerbsError,
    WcOpcode, WcStatus, WorkCompletion,
};
pub use burst_wire::{Mtu, Psn, Qpn};
pub mod eventfd;
pub mod netif;
pub mod sim;
mod thread;

use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use burst_io::{IcrcCheck, PacketBuf, Port, RxBatch, UdpPort, BURST, MAX_GSO_SEGMENTS};
use burst_mem::MrTable;
use burst_transport::{Qp, Srq};
use burst_wire::icrc;
use burst_wire::{IbPacket, ROCEV2_PORT};

/// Device-wide counters (names after RXE's where one exists).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
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
}

/// An asynchronous event (`ibv_async_event`): something that happened to a
/// QP, SRQ or the device outside any work request's completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncEvent {
    /// The SRQ's posted receives fell below its limit, which disarms
    /// (`IBV_EVENT_SRQ_LIMIT_REACHED`).
    SrqLimitReached(SrqId),
    /// The QP hit an error no completion can report (here: a fault inside
    /// burst while handling it) and is now in the error state, its work
    /// requests flushed (`IBV_EVENT_QP_FATAL`).
    QpFatal(Qpn),
    /// The device failed outside any one QP: every QP is in the error state
    /// (`IBV_EVENT_DEVICE_FATAL`).
    DeviceFatal,
}

/// Runs `f`; a panic inside it becomes `Err` with its message (the data
/// plane contains its faults instead of unwinding into the application or
/// stopping the device: see [`Device::progress_at`]).
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
/// Most SGEs per work request (what an engine ring entry holds).
pub const MAX_SGE: u32 = burst_transport::MAX_SGE as u32;
/// Most inline bytes per send (what an engine ring entry holds).
pub const MAX_INLINE: u32 = burst_transport::MAX_INLINE as u32;

/// Vendor ID burst reports: not a real vendor's (so perftest takes its
/// generic path); 0xb0 0x57 reads "burst".
pub const VENDOR_ID: u32 = 0x00b0_57b0;

/// What [`Device::query_device`] reports (the fields of `ibv_device_attr`
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
            max_msg_sz: u32::MAX,
        }
    }
}

/// What [`Device::query_port`] reports (`ibv_port_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortAttr {
    /// Always ACTIVE while the device is open.
    pub active: bool,
    /// Largest path MTU.
    pub max_mtu: Mtu,
    /// Active MTU (from the interface MTU, as RXE computes it).
    pub active_mtu: Mtu,
    /// Link layer: Ethernet (RoCE).
    pub link_layer_ethernet: bool,
    /// GID table length.
    pub gid_tbl_len: u32,
}

impl PortAttr {
    /// Port 1 of a device whose active MTU is `active_mtu`.
    pub fn with_mtu(active_mtu: Mtu) -> PortAttr {
        PortAttr {
            active: true,
            max_mtu: Mtu::Mtu4096,
            active_mtu,
            link_layer_ethernet: true,
            gid_tbl_len: 1,
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

/// Parameters of [`Device::connect_rc`]; the defaults are those of
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
        }
    }
}

/// Handle of a shared receive queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SrqId(pub u32);

/// Queue sizes asked for at QP creation (`ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// What [`Device::create_qp_with`] needs (`ibv_qp_init_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    pub fn new(qp_type: QpType, pd: Pd) -> QpInit {
        QpInit {
            qp_type,
            pd,
            srq: None,
            caps: QpCaps::default(),
        }
    }
}

/// Lowest QPN handed out (0 and 1 are QP0/QP1; RXE starts at 0x11).
pub(crate) const FIRST_QPN: u32 = 0x11;

#[derive(Debug)]
struct QpSlot {
    qp: Qp,
    completions: VecDeque<WorkCompletion>,
    srq: Option<usize>,
}

/// The port a [`Device`] has unless told otherwise: any port, chosen when
/// the device opens (a UDP socket, the same behind a [`burst_io::LossyPort`]
/// for loss tests, an in-memory [`burst_io::SimPort`], AF_XDP later).
pub type AnyPort = Box<dyn Port + Send>;

/// A burst RDMA device on one IP address, over packet port `P`.
pub struct Device<P: Port = AnyPort> {
    port: P,
    /// ICRC checking, with the IP ID solved for where the port hides it.
    icrc: icrc::Checker,
    mrs: Arc<MrTable>,
    /// Indexed by QPN - FIRST_QPN: O(1) lookup per packet and per post.
    qps: Vec<Option<QpSlot>>,
    free_qps: VecDeque<usize>,
    srqs: Vec<Option<Srq>>,
    /// Counters of destroyed QPs, kept for the device totals.
    destroyed: burst_transport::Counters,
    ahs: Vec<SocketAddr>,
    rx: RxBatch,
    tx: Vec<PacketBuf>,
    /// Sealed packets at the front of `tx` that the port had no room for
    /// (a full socket buffer): sent before anything new is taken from the
    /// QPs, so a slow port holds the transport back instead of losing what
    /// it already handed out.
    tx_held: usize,
    start: Instant,
    /// When a packet last arrived (for the linger on close).
    /// When a packet last arrived (ns on the device clock, [`Device::now`]).
    last_rx: u64,
    port_mtu: Mtu,
    counters: DeviceCounters,
    /// Linger on drop to re-ACK a peer's retransmissions ([`LINGER`]): on
    /// real networks only, where the device clock is the wall clock.
    linger: bool,
    /// Asynchronous events not yet taken ([`Device::take_async_events`]).
    events: Vec<AsyncEvent>,
    /// Test support: the QPN whose next packet makes the device panic
    /// ([`Device::debug_panic_on_packet_for`]).
    panic_for: Option<Qpn>,
}

impl<P: Port> std::fmt::Debug for Device<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("addr", &self.port.local_addr())
            .field("port_mtu", &self.port_mtu)
            .field("qps", &self.qps.iter().flatten().count())
            .field("counters", &self.counters)
            .finish()
    }
}

/// A GID as RoCE v2 uses it: the IPv6 address, or the IPv4-mapped one.
pub fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v) => v.to_ipv6_mapped().octets(),
        IpAddr::V6(v) => v.octets(),
    }
}

/// The IP address a RoCE v2 GID stands for.
pub fn ip_of_gid(gid: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

impl Device {
    /// Opens a device on `ip` (an address of this host), binding UDP 4791.
    /// `port_mtu` is the active MTU ([`active_mtu_for`] the interface's).
    pub fn open(ip: IpAddr, port_mtu: Mtu) -> io::Result<Device> {
        Device::open_with(ip, port_mtu, Arc::new(MrTable::new()))
    }

    /// Opens a device whose memory regions live in `mrs` (shared with an
    /// engine's front-end, which registers memory without a round trip).
    pub fn open_with(ip: IpAddr, port_mtu: Mtu, mrs: Arc<MrTable>) -> io::Result<Device> {
        Device::open_lossy(ip, port_mtu, mrs, 0)
    }

    /// [`Device::open_with`], dropping one sent packet in `drop_every` at
    /// random (0: none) through a [`burst_io::LossyPort`]: loss tests.
    pub fn open_lossy(
        ip: IpAddr,
        port_mtu: Mtu,
        mrs: Arc<MrTable>,
        drop_every: u64,
    ) -> io::Result<Device> {
        let udp = UdpPort::bind(ip)?;
        let port: AnyPort = match drop_every {
            0 => Box::new(udp),
            n => Box::new(burst_io::LossyPort::new(udp, n)),
        };
        let mut dev = Device::with_port(port, port_mtu, mrs);
        dev.linger = true;
        Ok(dev)
    }
}

impl<P: Port> Device<P> {
    /// A device over `port` (its address is the device's), with active MTU
    /// `port_mtu` and memory regions in `mrs`.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use burst_io::{SimFaults, SimNet};
    /// let net = SimNet::new(1, SimFaults::default());
    /// let port = net.port("198.18.0.1:4791".parse().unwrap());
    /// let dev = burst_verbs::Device::with_port(port, burst_wire::Mtu::Mtu4096, Arc::default());
    /// assert_eq!(dev.query_gid(0).unwrap()[12..], [198, 18, 0, 1]);
    /// ```
    pub fn with_port(port: P, port_mtu: Mtu, mrs: Arc<MrTable>) -> Device<P> {
        Device {
            port,
            icrc: icrc::Checker::new(),
            mrs,
            qps: Vec::new(),
            free_qps: VecDeque::new(),
            srqs: Vec::new(),
            destroyed: burst_transport::Counters::default(),
            ahs: Vec::new(),
            rx: RxBatch::new(BURST),
            // A round sends up to a full GSO run per QP burst.
            tx: (0..TX_BURST).map(|_| PacketBuf::new()).collect(),
            tx_held: 0,
            start: Instant::now(),
            last_rx: 0,
            port_mtu,
            counters: DeviceCounters::default(),
            linger: false,
            events: Vec::new(),
            panic_for: None,
        }
    }

    /// The packet port.
    pub fn port(&self) -> &P {
        &self.port
    }

    /// The packet port, mutable (tests reach a wrapper port's knobs).
    pub fn port_mut(&mut self) -> &mut P {
        &mut self.port
    }

    /// The device's RoCE v2 GID (index 0 here).
    pub fn gid(&self) -> [u8; 16] {
        gid_of(self.port.local_addr().ip())
    }

    /// `ibv_query_device`.
    pub fn query_device(&self) -> DeviceAttr {
        DeviceAttr::for_gid(self.gid())
    }

    /// `ibv_query_port` (port 1, the only one).
    pub fn query_port(&self) -> PortAttr {
        PortAttr::with_mtu(self.port_mtu)
    }

    /// `ibv_query_gid`: index 0 is the RoCE v2 GID of the device's address.
    pub fn query_gid(&self, index: u32) -> Option<[u8; 16]> {
        (index == 0).then(|| self.gid())
    }

    /// Device counters, with the QPs' transport counters summed in.
    pub fn counters(&self) -> DeviceCounters {
        let mut c = self.counters;
        c.qps = self.destroyed;
        for s in self.qps.iter().flatten() {
            c.qps.accumulate(s.qp.counters());
        }
        c
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> Pd {
        self.mrs.alloc_pd()
    }

    /// Registers application memory (accessed in place).
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay valid until [`Device::dereg_mr`] returns.
    pub unsafe fn reg_mr(
        &self,
        pd: Pd,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<MrKeys, RegError> {
        // SAFETY: forwarded contract.
        unsafe { self.mrs.register(pd, ptr, len, ptr as u64, access) }
    }

    /// Deregisters a memory region.
    pub fn dereg_mr(&self, lkey: u32) -> Result<(), RegError> {
        self.mrs.deregister(lkey)
    }

    /// Creates a QP in RESET with default sizes; returns its number.
    pub fn create_qp(&mut self, qp_type: QpType, pd: Pd) -> Qpn {
        self.create_qp_with(&QpInit::new(qp_type, pd))
            .expect("default sizes are within the device limits")
    }

    /// `ibv_create_qp`: a QP in RESET; returns its number. Sizes beyond the
    /// device's limits and unknown SRQs are refused (EINVAL).
    pub fn create_qp_with(&mut self, init: &QpInit) -> Result<Qpn, VerbsError> {
        let c = init.caps;
        if c.max_send_wr > MAX_QP_WR
            || c.max_recv_wr > MAX_QP_WR
            || c.max_send_sge > MAX_SGE
            || c.max_recv_sge > MAX_SGE
            || c.max_inline_data > MAX_INLINE
        {
            return Err(VerbsError::InvalidValue("qp cap beyond device limits"));
        }
        let srq = match init.srq {
            Some(SrqId(i)) if self.srqs.get(i as usize).is_some_and(Option::is_some) => {
                Some(i as usize)
            }
            Some(_) => return Err(VerbsError::InvalidValue("srq")),
            None => None,
        };
        if self.qps.len() - self.free_qps.len() >= MAX_QP as usize {
            return Err(VerbsError::QueueFull);
        }
        let index = self.free_qps.pop_front().unwrap_or(self.qps.len());
        let qpn = Qpn::from_wire(FIRST_QPN + index as u32);
        let mut cfg = QpConfig::new(qpn, init.qp_type, init.pd.0);
        cfg.port_mtu = self.port_mtu;
        cfg.max_send_wr = c.max_send_wr.max(1);
        cfg.max_recv_wr = c.max_recv_wr.max(1);
        cfg.max_sge = c.max_send_sge.max(c.max_recv_sge).max(1);
        cfg.max_inline = c.max_inline_data;
        cfg.srq = srq.is_some();
        let slot = QpSlot {
            qp: Qp::new(cfg),
            completions: VecDeque::new(),
            srq,
        };
        if index == self.qps.len() {
            self.qps.push(Some(slot));
        } else {
            self.qps[index] = Some(slot);
        }
        Ok(qpn)
    }

    /// `ibv_destroy_qp`: the QP stops at once; completions not yet taken
    /// are discarded, and its number is reused later.
    pub fn destroy_qp(&mut self, qpn: Qpn) -> Result<(), VerbsError> {
        let i = self.qp_index(qpn)?;
        // Its ACKs of the last receives go out first (they leave a round
        // after the receive; the peer needs them to complete its sends).
        self.flush();
        if let Some(s) = self.qps[i].take() {
            self.destroyed.accumulate(s.qp.counters());
        }
        self.free_qps.push_back(i);
        Ok(())
    }

    /// `ibv_create_srq`.
    pub fn create_srq(&mut self, pd: Pd, max_wr: u32, max_sge: u32) -> Result<SrqId, VerbsError> {
        if max_wr == 0 || max_wr > MAX_QP_WR || max_sge == 0 || max_sge > MAX_SGE {
            return Err(VerbsError::InvalidValue("srq size beyond device limits"));
        }
        let srq = Srq::new(pd.0, max_wr, max_sge);
        let i = match self.srqs.iter().position(Option::is_none) {
            Some(i) => {
                self.srqs[i] = Some(srq);
                i
            }
            None => {
                self.srqs.push(Some(srq));
                self.srqs.len() - 1
            }
        };
        Ok(SrqId(i as u32))
    }

    fn srq_mut(&mut self, id: SrqId) -> Result<&mut Srq, VerbsError> {
        srq_in(&mut self.srqs, id)
    }

    /// `ibv_destroy_srq`: refused (EBUSY) while a QP still uses it.
    pub fn destroy_srq(&mut self, id: SrqId) -> Result<(), VerbsError> {
        self.srq_mut(id)?;
        let i = id.0 as usize;
        if self.qps.iter().flatten().any(|s| s.srq == Some(i)) {
            return Err(VerbsError::Busy("SRQ still has QPs"));
        }
        self.srqs[i] = None;
        Ok(())
    }

    /// `ibv_post_srq_recv`.
    pub fn post_srq_recv(&mut self, id: SrqId, wr: RecvWr) -> Result<(), VerbsError> {
        let mem = self.mrs.memory();
        srq_in(&mut self.srqs, id)?.post_recv(wr, &mem)
    }

    /// `ibv_modify_srq`: `max_wr` resizes, `limit` arms the limit event.
    pub fn modify_srq(
        &mut self,
        id: SrqId,
        max_wr: Option<u32>,
        limit: Option<u32>,
    ) -> Result<(), VerbsError> {
        let srq = self.srq_mut(id)?;
        if let Some(n) = max_wr {
            if n > MAX_QP_WR {
                return Err(VerbsError::InvalidValue("max_wr"));
            }
            srq.resize(n)?;
        }
        if let Some(l) = limit {
            srq.set_limit(l)?;
        }
        Ok(())
    }

    /// `ibv_query_srq`: (max_wr, max_sge, armed limit).
    pub fn query_srq(&mut self, id: SrqId) -> Result<(u32, u32, u32), VerbsError> {
        let s = self.srq_mut(id)?;
        Ok((s.max_wr(), s.max_sge(), s.limit()))
    }

    /// Creates an address handle for a peer's GID; returns its index.
    pub fn create_ah(&mut self, gid: [u8; 16]) -> u32 {
        self.ahs.push(SocketAddr::new(ip_of_gid(gid), ROCEV2_PORT));
        (self.ahs.len() - 1) as u32
    }

    fn qp_index(&self, qpn: Qpn) -> Result<usize, VerbsError> {
        qp_index_in(&self.qps, qpn)
    }

    fn slot(&mut self, qpn: Qpn) -> Result<&mut QpSlot, VerbsError> {
        slot_in(&mut self.qps, qpn)
    }

    /// `ibv_modify_qp`.
    pub fn modify_qp(&mut self, qpn: Qpn, attr: &QpAttr) -> Result<(), VerbsError> {
        let _span =
            tracing::debug_span!("modify_qp", qpn = qpn.value(), to = ?attr.state).entered();
        if attr.ah.is_some_and(|a| a as usize >= self.ahs.len()) {
            tracing::warn!("modify_qp: unknown address handle {:?}", attr.ah);
            return Err(VerbsError::InvalidValue("ah"));
        }
        let qp = &mut self.slot(qpn)?.qp;
        let r = qp.modify(attr);
        match &r {
            Ok(()) => tracing::debug!(state = ?qp.state(), "QP modified"),
            Err(e) => tracing::warn!("modify_qp refused: {e} (errno {})", e.errno()),
        }
        r
    }

    /// Moves an RC QP from RESET to RTS towards `peer` (INIT, RTR and RTS
    /// with the attributes each transition requires).
    pub fn connect_rc(&mut self, qpn: Qpn, peer: RcPeer, p: &RcParams) -> Result<(), VerbsError> {
        let ah = self.create_ah(peer.gid);
        for attr in p.transitions(ah, &peer) {
            self.modify_qp(qpn, &attr)?;
        }
        Ok(())
    }

    /// `ibv_post_send`.
    pub fn post_send(&mut self, qpn: Qpn, wr: SendWr) -> Result<(), VerbsError> {
        self.post_send_quiet(qpn, wr)?;
        self.progress();
        Ok(())
    }

    /// `ibv_post_recv`.
    pub fn post_recv(&mut self, qpn: Qpn, wr: RecvWr) -> Result<(), VerbsError> {
        let mem = self.mrs.memory();
        slot_in(&mut self.qps, qpn)?.qp.post_recv(wr, &mem)
    }

    /// Takes a WR that passed [`burst_transport::QpConfig::check_send`] when
    /// it was posted, without making progress.
    pub fn post_send_checked(&mut self, qpn: Qpn, wr: SendWr) -> Result<(), VerbsError> {
        let mem = self.mrs.memory();
        slot_in(&mut self.qps, qpn)?.qp.post_send_checked(wr, &mem)
    }

    /// Posts without making progress (the engine batches progress itself).
    pub fn post_send_quiet(&mut self, qpn: Qpn, wr: SendWr) -> Result<(), VerbsError> {
        let mem = self.mrs.memory();
        slot_in(&mut self.qps, qpn)?.qp.post_send(wr, &mem)
    }

    /// Takes a completion of `qpn` gathered by earlier progress.
    pub fn take_completion(&mut self, qpn: Qpn) -> Option<WorkCompletion> {
        self.slot(qpn).ok()?.completions.pop_front()
    }

    /// `ibv_poll_cq` on the QP's completion queue (after making progress).
    pub fn poll_cq(&mut self, qpn: Qpn) -> Option<WorkCompletion> {
        self.progress();
        self.take_completion(qpn)
    }

    /// Counters of one QP.
    pub fn qp_counters(&self, qpn: Qpn) -> Option<burst_transport::Counters> {
        let i = self.qp_index(qpn).ok()?;
        self.qps[i].as_ref().map(|s| *s.qp.counters())
    }

    /// `ibv_query_qp`: the QP's state and creation config.
    pub fn query_qp(&self, qpn: Qpn) -> Option<(QpState, QpConfig)> {
        let i = self.qp_index(qpn).ok()?;
        self.qps[i].as_ref().map(|s| (s.qp.state(), *s.qp.config()))
    }

    /// Send work requests of a QP not yet completed.
    pub fn send_queue_len(&self, qpn: Qpn) -> Option<usize> {
        let i = self.qp_index(qpn).ok()?;
        self.qps[i].as_ref().map(|s| s.qp.send_queue_len())
    }

    /// Checks every QP's invariants (`burst_transport::Qp::check_invariants`):
    /// the simulator asserts them after every step.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.qps
            .iter()
            .flatten()
            .try_for_each(|s| s.qp.check_invariants())
    }

    /// One line per QP with its state and counters (for reports).
    pub fn describe_qps(&self) -> Vec<String> {
        self.qps.iter().flatten().map(|s| s.qp.describe()).collect()
    }

    /// The device clock: nanoseconds since the device opened (the time base
    /// of the transport's timers).
    pub fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// The earliest transport timer of any QP (device-clock ns): when
    /// [`Device::progress_at`] must next run if no packet comes first.
    pub fn next_timeout(&self) -> Option<u64> {
        self.qps
            .iter()
            .flatten()
            .filter_map(|s| s.qp.poll_timeout())
            .min()
    }

    /// A handle that blocks until packets arrive, usable while the device
    /// is in use on another thread.
    pub fn readiness(&self) -> io::Result<burst_io::Readiness> {
        self.port.readiness()
    }

    /// The instant the device clock counts from.
    pub fn epoch(&self) -> Instant {
        self.start
    }

    /// One round of progress: expired timers, transmit, receive a burst.
    ///
    /// Timers come first, so a retransmission they start leaves in this
    /// round. Transmit comes before receive: what this round's receives
    /// generate (ACKs)
    /// leaves with the next round, together with whatever the application
    /// posts in answer to this round's completions (a ping-pong's ACK and
    /// reply then share one `sendmmsg`, and the peer reads both with one
    /// `recvmmsg`).
    pub fn progress(&mut self) -> bool {
        let now = self.now();
        self.progress_at(now)
    }

    /// [`Device::progress`] with the time read by the caller (one clock
    /// read per round: they cost 30 ns each in a VM and showed in profiles).
    ///
    /// A panic while handling one QP (its packets, timers or transmit)
    /// moves that QP to the error state, flushing its work requests, and
    /// raises [`AsyncEvent::QpFatal`]; one outside any QP (the port, the
    /// demux) fails every QP and raises [`AsyncEvent::DeviceFatal`]. Either
    /// way it is logged, the caller does not unwind, and the device keeps
    /// serving its other QPs.
    pub fn progress_at(&mut self, now: u64) -> bool {
        match contain(|| self.progress_inner(now)) {
            Ok(moved) => moved,
            Err(msg) => {
                self.device_fatal(&msg);
                true
            }
        }
    }

    fn progress_inner(&mut self, now: u64) -> bool {
        // Expired timers first: a retransmission they start leaves in this
        // round's transmit, not a round (or, idle, a whole timeout) later.
        let mut fired = 0;
        for i in 0..self.qps.len() {
            let Some(s) = self.qps[i].as_mut() else {
                continue;
            };
            if s.qp.poll_timeout().is_some_and(|t| t <= now) {
                fired += 1;
                if let Err(msg) = contain(|| s.qp.handle_timeout(now)) {
                    self.qp_fatal(i, &msg);
                }
            }
        }
        let sent = self.transmit(now);
        let received = self.receive(now);
        self.collect_completions();
        sent + received + fired > 0
    }

    /// Contains a fault of the QP in slot `i`: error state (flushing its
    /// WRs), [`AsyncEvent::QpFatal`], a log line.
    fn qp_fatal(&mut self, i: usize, msg: &str) {
        let Some(s) = self.qps[i].as_mut() else {
            return;
        };
        let qpn = s.qp.qpn();
        // A QP already failed raises no second event (a fault that repeats
        // on every packet for it would flood the event queue).
        let first = s.qp.state() != QpState::Err;
        tracing::error!(
            qpn = qpn.value(),
            "internal fault handling QP {qpn}: {msg}; QP moved to the error state"
        );
        let to_err = QpAttr {
            state: Some(QpState::Err),
            ..Default::default()
        };
        if contain(|| s.qp.modify(&to_err)).is_err() {
            // Its state is beyond flushing: keep the QP number, in error.
            let mut fresh = Qp::new(*s.qp.config());
            let _ = fresh.modify(&to_err);
            s.qp = fresh;
            tracing::error!(
                qpn = qpn.value(),
                "QP {qpn}'s work requests could not be flushed"
            );
        }
        while let Some(wc) = s.qp.poll_completion() {
            s.completions.push_back(wc);
        }
        if first {
            self.events.push(AsyncEvent::QpFatal(qpn));
        }
    }

    /// Fails the device after a fault outside any one QP (for an engine
    /// around it): every QP to the error state, [`AsyncEvent::DeviceFatal`].
    pub fn fail_all(&mut self, msg: &str) {
        self.device_fatal(msg);
    }

    /// Contains a fault outside any one QP: every QP to the error state,
    /// [`AsyncEvent::DeviceFatal`].
    fn device_fatal(&mut self, msg: &str) {
        tracing::error!(
            "internal fault in the data plane: {msg}; every QP moved to the error state"
        );
        self.tx_held = 0;
        for i in 0..self.qps.len() {
            if self.qps[i]
                .as_ref()
                .is_some_and(|s| s.qp.state() != QpState::Err)
            {
                self.qp_fatal(i, msg);
            }
        }
        self.events.push(AsyncEvent::DeviceFatal);
    }

    /// Takes the asynchronous events raised since the last call (SRQ limits,
    /// contained faults), oldest first.
    pub fn take_async_events(&mut self) -> Vec<AsyncEvent> {
        for (i, s) in self.srqs.iter_mut().enumerate() {
            if s.as_mut().is_some_and(Srq::take_limit_event) {
                self.events
                    .push(AsyncEvent::SrqLimitReached(SrqId(i as u32)));
            }
        }
        std::mem::take(&mut self.events)
    }

    /// Test support for fault containment: the next packet for `qpn` makes
    /// the data plane panic while handling it (`None`: never).
    #[doc(hidden)]
    pub fn debug_panic_on_packet_for(&mut self, qpn: Option<Qpn>) {
        self.panic_for = qpn;
    }

    /// Sends what is pending (the ACKs of the last receives, newly posted
    /// requests) without receiving, and collects the completions that
    /// sending alone produces (UC and UD sends).
    pub fn transmit_now(&mut self) -> bool {
        let now = self.now();
        self.transmit_at(now)
    }

    /// [`Device::transmit_now`] with the time read by the caller.
    pub fn transmit_at(&mut self, now: u64) -> bool {
        let sent = self.transmit(now);
        self.collect_completions();
        sent > 0
    }

    /// Sends what is pending without receiving: for a device about to close.
    pub fn flush(&mut self) {
        self.transmit_now();
    }

    fn collect_completions(&mut self) {
        for s in self.qps.iter_mut().flatten() {
            while let Some(wc) = s.qp.poll_completion() {
                s.completions.push_back(wc);
            }
        }
    }

    /// Returns the packets received.
    fn receive(&mut self, now: u64) -> usize {
        let n = match self.port.recv_batch(&mut self.rx) {
            Ok(n) => n,
            Err(_) => return 0,
        };
        if n > 0 {
            self.last_rx = now;
        }
        let local = self.port.local_addr();
        let mut mem = self.mrs.memory();
        let mut faulted: Vec<(usize, String)> = Vec::new();
        for (meta, bytes) in self.rx.frames() {
            let peer = meta.peer;
            self.counters.rcvd_pkts += 1;
            let Ok(pkt) = IbPacket::new_checked(bytes) else {
                self.counters.malformed += 1;
                continue;
            };
            match self.icrc.check(peer, local, bytes, meta.ip_id) {
                IcrcCheck::Ok => self.counters.icrc_verified += 1,
                IcrcCheck::OkWithId(_) => self.counters.icrc_id_solved += 1,
                IcrcCheck::Unverifiable => self.counters.icrc_unverified += 1,
                IcrcCheck::Bad => {
                    self.counters.icrc_errors += 1;
                    continue;
                }
            }
            let qpn = pkt.bth().dest_qp();
            let Ok(i) = qp_index_in(&self.qps, qpn) else {
                self.counters.no_qp += 1;
                continue;
            };
            let Some(s) = self.qps[i].as_mut() else {
                continue;
            };
            // Only UD receives carry a GRH area: don't build it for RC/UC.
            let grh = (pkt.info().transport == burst_wire::Transport::Ud)
                .then(|| burst_wire::ud_grh_for(peer.ip(), local.ip(), bytes.len()))
                .flatten();
            let srq = s
                .srq
                .and_then(|i| self.srqs.get_mut(i))
                .and_then(Option::as_mut);
            let inject = self.panic_for == Some(qpn);
            let handled = contain(|| {
                assert!(!inject, "fault injected for QP {qpn}");
                match srq {
                    Some(srq) => {
                        s.qp.handle_packet_srq(now, &pkt, grh.as_ref(), &mut mem, srq)
                    }
                    None => s.qp.handle_packet(now, &pkt, grh.as_ref(), &mut mem),
                }
            });
            if let Err(msg) = handled {
                faulted.push((i, msg));
            }
        }
        for (i, msg) in faulted {
            self.qp_fatal(i, &msg);
        }
        n
    }

    /// Returns the packets handed to the port.
    fn transmit(&mut self, now: u64) -> usize {
        let mut sent = 0;
        if self.tx_held > 0 {
            sent = self.send_held(self.tx_held);
            if self.tx_held > 0 {
                return sent;
            }
        }
        let mem = self.mrs.memory();
        let mut n = 0;
        let mut faulted: Vec<(usize, String)> = Vec::new();
        for (i, slot) in self.qps.iter_mut().enumerate() {
            let Some(q) = slot.as_mut().map(|s| &mut s.qp) else {
                continue;
            };
            let (tx, ahs, counters) = (&mut self.tx, &self.ahs, &mut self.counters);
            let start = n;
            let filled = contain(|| {
                let mut n = start;
                while n < tx.len() {
                    let Some(t) = q.poll_transmit(now) else { break };
                    let Some(&peer) = ahs.get(t.ah as usize) else {
                        continue;
                    };
                    let len = t.ib.buffer_len();
                    let buf = &mut tx[n];
                    if len > buf.data.len() || t.ib.emit(&mut buf.data[..len]).is_err() {
                        continue;
                    }
                    let at = t.ib.header_len();
                    if t.gather(&mem, &mut buf.data[at..at + t.ib.payload_len])
                        .is_err()
                    {
                        continue;
                    }
                    counters.sent_pkts += 1;
                    buf.len = len;
                    buf.peer = peer;
                    n += 1;
                }
                q.flush_unreliable();
                n
            });
            match filled {
                Ok(k) => n = k,
                // What this QP built before its fault is not sent.
                Err(msg) => faulted.push((i, msg)),
            }
        }
        for (i, msg) in faulted {
            self.qp_fatal(i, &msg);
        }
        if n > 0 {
            // Sealed last: a packet's IP ID (in its ICRC) may depend on the
            // whole burst (a UDP socket's GSO runs).
            self.port.assign_ip_ids(&mut self.tx[..n]);
            let sealed = burst_io::seal_all(self.port.local_addr(), &mut self.tx[..n]);
            sent += self.send_held(sealed);
        }
        sent
    }

    /// Sends the first `n` (sealed) packets of `tx`; keeps what the port
    /// refused at the front of `tx` for the next round (the port takes
    /// whole GSO runs, so the IDs of the rest stay right).
    fn send_held(&mut self, n: usize) -> usize {
        let took = match self.port.send_burst(&self.tx[..n]) {
            Ok(k) => k.min(n),
            Err(e) => {
                // Not a full queue: the transport retransmits what is lost.
                tracing::debug!("send: {e}");
                n
            }
        };
        self.tx[..n].rotate_left(took);
        self.tx_held = n - took;
        took
    }
}

/// Packets one round sends at most: four GSO runs' worth.
const TX_BURST: usize = 4 * MAX_GSO_SEGMENTS;

/// The slot of `qpn` (QPNs index the table from [`FIRST_QPN`]).
fn qp_index_in(qps: &[Option<QpSlot>], qpn: Qpn) -> Result<usize, VerbsError> {
    let i = qpn.value().wrapping_sub(FIRST_QPN) as usize;
    match qps.get(i) {
        Some(Some(_)) => Ok(i),
        _ => Err(VerbsError::BadWr("no such QP")),
    }
}

/// [`qp_index_in`], borrowed mutably (leaves the device's other fields free).
fn slot_in(qps: &mut [Option<QpSlot>], qpn: Qpn) -> Result<&mut QpSlot, VerbsError> {
    let i = qp_index_in(qps, qpn)?;
    Ok(qps[i].as_mut().expect("qp_index_in checked"))
}

fn srq_in(srqs: &mut [Option<Srq>], id: SrqId) -> Result<&mut Srq, VerbsError> {
    srqs.get_mut(id.0 as usize)
        .and_then(Option::as_mut)
        .ok_or(VerbsError::InvalidValue("no such SRQ"))
}

/// How long a closing device keeps answering a peer that was active in
/// the last [`LINGER_IF_ACTIVE`] (like TCP's TIME_WAIT): if the last ACK is
/// lost, the peer retransmits after its ACK timeout (67 ms at timeout 14)
/// and would otherwise retry forever against a closed port.
const LINGER: std::time::Duration = std::time::Duration::from_millis(200);
/// See [`LINGER`].
const LINGER_IF_ACTIVE: std::time::Duration = std::time::Duration::from_millis(100);

impl<P: Port> Drop for Device<P> {
    /// Sends the pending ACKs of the last receives (they leave a round after
    /// the receive), then lingers briefly if a peer was just talking, to
    /// re-ACK its retransmissions should that last ACK be lost.
    fn drop(&mut self) {
        self.flush();
        if self.linger
            && self.last_rx > 0
            && self.now().saturating_sub(self.last_rx) < LINGER_IF_ACTIVE.as_nanos() as u64
        {
            let end = Instant::now() + LINGER;
            while Instant::now() < end {
                self.progress();
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        }
    }
}
