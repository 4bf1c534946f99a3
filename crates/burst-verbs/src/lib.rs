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

pub mod engine;
pub mod eventfd;

use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use burst_io::{IcrcCheck, PacketBuf, Port, UdpPort, BURST};
use burst_mem::{Access, MrKeys, MrTable, Pd, RegError};
use burst_transport::{
    Qp, QpAccess, QpAttr, QpConfig, QpState, QpType, RecvWr, SendWr, VerbsError, WorkCompletion,
};
use burst_wire::{IbPacket, Mtu, Psn, Qpn, ROCEV2_PORT};

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
    /// Received packets whose ICRC could not be checked (IPv6 peers whose
    /// ICRC does not match the header burst reconstructs).
    pub icrc_unverified: u64,
    /// Received packets dropped for a bad ICRC.
    pub icrc_errors: u64,
    /// Malformed packets dropped.
    pub malformed: u64,
    /// Packets for no QP of this device.
    pub no_qp: u64,
    /// Outgoing packets dropped by the test drop option.
    pub test_dropped: u64,
}

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
    /// Outstanding RDMA READ/atomic per QP, as target and as initiator.
    pub max_qp_rd_atom: u32,
    /// Largest message.
    pub max_msg_sz: u32,
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

/// A burst RDMA device on one IP address.
#[derive(Debug)]
pub struct Device {
    port: UdpPort,
    mrs: Arc<MrTable>,
    qps: Vec<Qp>,
    ahs: Vec<SocketAddr>,
    completions: Vec<VecDeque<WorkCompletion>>,
    rx: Vec<PacketBuf>,
    tx: Vec<PacketBuf>,
    start: Instant,
    port_mtu: Mtu,
    counters: DeviceCounters,
    /// Drop one outgoing packet in N on average (0 = never): loss tests.
    drop_every: u64,
    /// xorshift state of the drop decision: random, not periodic, because a
    /// periodic drop can line up with a go-back-N window forever.
    drop_rng: u64,
    next_qpn: u32,
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
        Ok(Device {
            port: UdpPort::bind(ip)?,
            mrs,
            qps: Vec::new(),
            ahs: Vec::new(),
            completions: Vec::new(),
            rx: (0..BURST).map(|_| PacketBuf::new()).collect(),
            tx: (0..BURST).map(|_| PacketBuf::new()).collect(),
            start: Instant::now(),
            port_mtu,
            counters: DeviceCounters::default(),
            drop_every: 0,
            drop_rng: 0x2545_f491_4f6c_dd1d,
            next_qpn: 0x11,
        })
    }

    /// The device's RoCE v2 GID (index 0 here).
    pub fn gid(&self) -> [u8; 16] {
        gid_of(self.port.local_addr().ip())
    }

    /// `ibv_query_device`.
    pub fn query_device(&self) -> DeviceAttr {
        let g = self.gid();
        DeviceAttr {
            vendor_id: VENDOR_ID,
            node_guid: u64::from_be_bytes([g[8] ^ 2, g[9], g[10], 0xff, 0xfe, g[13], g[14], g[15]]),
            max_qp: 1 << 16,
            max_qp_wr: 4096,
            max_sge: 32,
            max_inline_data: 256,
            max_qp_rd_atom: u32::from(burst_transport::MAX_RD_ATOMIC),
            max_msg_sz: u32::MAX,
        }
    }

    /// `ibv_query_port` (port 1, the only one).
    pub fn query_port(&self) -> PortAttr {
        PortAttr {
            active: true,
            max_mtu: Mtu::Mtu4096,
            active_mtu: self.port_mtu,
            link_layer_ethernet: true,
            gid_tbl_len: 1,
        }
    }

    /// `ibv_query_gid`: index 0 is the RoCE v2 GID of the device's address.
    pub fn query_gid(&self, index: u32) -> Option<[u8; 16]> {
        (index == 0).then(|| self.gid())
    }

    /// Counters.
    pub fn counters(&self) -> DeviceCounters {
        self.counters
    }

    /// Drops outgoing packets with probability 1/`n` (0 disables): for loss tests.
    pub fn set_drop_every(&mut self, n: u64) {
        self.drop_every = n;
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

    /// Creates a QP in RESET; returns its number.
    pub fn create_qp(&mut self, qp_type: QpType, pd: Pd) -> Qpn {
        let qpn = Qpn::from_wire(self.next_qpn);
        self.next_qpn += 1;
        let mut cfg = QpConfig::new(qpn, qp_type, pd.0);
        cfg.port_mtu = self.port_mtu;
        self.qps.push(Qp::new(cfg));
        self.completions.push(VecDeque::new());
        qpn
    }

    /// Creates an address handle for a peer's GID; returns its index.
    pub fn create_ah(&mut self, gid: [u8; 16]) -> u32 {
        self.ahs.push(SocketAddr::new(ip_of_gid(gid), ROCEV2_PORT));
        (self.ahs.len() - 1) as u32
    }

    fn qp_index(&self, qpn: Qpn) -> Result<usize, VerbsError> {
        self.qps
            .iter()
            .position(|q| q.qpn() == qpn)
            .ok_or(VerbsError::BadWr("no such QP"))
    }

    /// `ibv_modify_qp`.
    pub fn modify_qp(&mut self, qpn: Qpn, attr: &QpAttr) -> Result<(), VerbsError> {
        let _span =
            tracing::debug_span!("modify_qp", qpn = qpn.value(), to = ?attr.state).entered();
        if attr.ah.is_some_and(|a| a as usize >= self.ahs.len()) {
            tracing::warn!("modify_qp: unknown address handle {:?}", attr.ah);
            return Err(VerbsError::InvalidValue("ah"));
        }
        let i = self.qp_index(qpn)?;
        let r = self.qps[i].modify(attr);
        match &r {
            Ok(()) => tracing::debug!(state = ?self.qps[i].state(), "QP modified"),
            Err(e) => tracing::warn!("modify_qp refused: {e} (errno {})", e.errno()),
        }
        r
    }

    /// Moves an RC QP from RESET to RTS towards `peer` (INIT, RTR and RTS
    /// with the attributes each transition requires).
    pub fn connect_rc(&mut self, qpn: Qpn, peer: RcPeer, p: &RcParams) -> Result<(), VerbsError> {
        let ah = self.create_ah(peer.gid);
        self.modify_qp(
            qpn,
            &QpAttr {
                state: Some(QpState::Init),
                pkey_index: Some(0),
                port: Some(1),
                access: Some(p.access),
                ..Default::default()
            },
        )?;
        self.modify_qp(
            qpn,
            &QpAttr {
                state: Some(QpState::Rtr),
                ah: Some(ah),
                path_mtu: Some(p.mtu),
                dest_qpn: Some(peer.qpn),
                rq_psn: Some(peer.psn),
                max_dest_rd_atomic: Some(p.rd_atomic),
                min_rnr_timer: Some(p.min_rnr_timer),
                ..Default::default()
            },
        )?;
        self.modify_qp(
            qpn,
            &QpAttr {
                state: Some(QpState::Rts),
                sq_psn: Some(p.psn),
                timeout: Some(p.timeout),
                retry_cnt: Some(p.retry_cnt),
                rnr_retry: Some(p.rnr_retry),
                max_rd_atomic: Some(p.rd_atomic),
                ..Default::default()
            },
        )
    }

    /// `ibv_post_send`.
    pub fn post_send(&mut self, qpn: Qpn, wr: SendWr) -> Result<(), VerbsError> {
        let i = self.qp_index(qpn)?;
        let mem = self.mrs.memory();
        self.qps[i].post_send(wr, &mem)?;
        self.progress();
        Ok(())
    }

    /// `ibv_post_recv`.
    pub fn post_recv(&mut self, qpn: Qpn, wr: RecvWr) -> Result<(), VerbsError> {
        let i = self.qp_index(qpn)?;
        let mem = self.mrs.memory();
        self.qps[i].post_recv(wr, &mem)
    }

    /// Posts without making progress (the engine batches progress itself).
    pub fn post_send_quiet(&mut self, qpn: Qpn, wr: SendWr) -> Result<(), VerbsError> {
        let i = self.qp_index(qpn)?;
        let mem = self.mrs.memory();
        self.qps[i].post_send(wr, &mem)
    }

    /// Takes a completion of `qpn` gathered by earlier progress.
    pub fn take_completion(&mut self, qpn: Qpn) -> Option<WorkCompletion> {
        let i = self.qp_index(qpn).ok()?;
        self.completions[i].pop_front()
    }

    /// `ibv_poll_cq` on the QP's completion queue (after making progress).
    pub fn poll_cq(&mut self, qpn: Qpn) -> Option<WorkCompletion> {
        self.progress();
        let i = self.qp_index(qpn).ok()?;
        self.completions[i].pop_front()
    }

    /// Counters of one QP.
    pub fn qp_counters(&self, qpn: Qpn) -> Option<burst_transport::Counters> {
        self.qp_index(qpn).ok().map(|i| *self.qps[i].counters())
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// One round of progress: receive a burst, run timers, transmit.
    pub fn progress(&mut self) {
        let now = self.now();
        self.receive(now);
        for q in &mut self.qps {
            if q.poll_timeout().is_some_and(|t| t <= now) {
                q.handle_timeout(now);
            }
        }
        self.transmit(now);
        for (q, cq) in self.qps.iter_mut().zip(self.completions.iter_mut()) {
            while let Some(wc) = q.poll_completion() {
                cq.push_back(wc);
            }
        }
    }

    fn receive(&mut self, now: u64) {
        let n = match self.port.recv_burst(&mut self.rx) {
            Ok(n) => n,
            Err(_) => return,
        };
        let local = self.port.local_addr();
        let mut mem = self.mrs.memory();
        for b in &self.rx[..n] {
            self.counters.rcvd_pkts += 1;
            let Ok(pkt) = IbPacket::new_checked(b.bytes()) else {
                self.counters.malformed += 1;
                continue;
            };
            match self.port.check_icrc(b.peer, b.bytes()) {
                IcrcCheck::Ok => self.counters.icrc_verified += 1,
                IcrcCheck::OkWithId(_) => self.counters.icrc_id_solved += 1,
                IcrcCheck::Unverifiable => self.counters.icrc_unverified += 1,
                IcrcCheck::Bad => {
                    self.counters.icrc_errors += 1;
                    continue;
                }
            }
            let qpn = pkt.bth().dest_qp();
            let Some(q) = self.qps.iter_mut().find(|q| q.qpn() == qpn) else {
                self.counters.no_qp += 1;
                continue;
            };
            // Only UD receives carry a GRH area: don't build it for RC/UC.
            let grh = (pkt.info().transport == burst_wire::Transport::Ud)
                .then(|| grh_for(b.peer.ip(), local.ip(), b.len));
            q.handle_packet(now, &pkt, grh.as_ref(), &mut mem);
        }
    }

    fn transmit(&mut self, now: u64) {
        let mem = self.mrs.memory();
        let mut n = 0;
        for q in &mut self.qps {
            while n < self.tx.len() {
                let Some(t) = q.poll_transmit(now) else { break };
                let Some(&peer) = self.ahs.get(t.ah as usize) else {
                    continue;
                };
                let len = t.ib.buffer_len();
                let buf = &mut self.tx[n];
                if len > buf.data.len() || t.ib.emit(&mut buf.data[..len]).is_err() {
                    continue;
                }
                let at = t.ib.header_len();
                if t.gather(&mem, &mut buf.data[at..at + t.ib.payload_len])
                    .is_err()
                {
                    continue;
                }
                if self.port.seal(peer, &mut buf.data[..len]).is_err() {
                    continue;
                }
                self.counters.sent_pkts += 1;
                self.drop_rng ^= self.drop_rng << 13;
                self.drop_rng ^= self.drop_rng >> 7;
                self.drop_rng ^= self.drop_rng << 17;
                if self.drop_every > 0 && self.drop_rng % self.drop_every == 0 {
                    self.counters.test_dropped += 1;
                    continue;
                }
                buf.len = len;
                buf.peer = peer;
                n += 1;
            }
            q.flush_unreliable();
        }
        if n > 0 {
            let _ = self.port.send_burst(&self.tx[..n]);
        }
    }
}

/// The 40-byte GRH area of a UD receive buffer for a packet from `src` to
/// `dst` of `len` UDP payload bytes (IPv4: 20 zero bytes and an IPv4 header).
fn grh_for(src: IpAddr, dst: IpAddr, len: usize) -> [u8; 40] {
    let mut g = [0u8; 40];
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let h = &mut g[20..];
            h[0] = 0x45;
            h[2..4].copy_from_slice(&((20 + 8 + len) as u16).to_be_bytes());
            h[6] = 0x40;
            h[8] = 64;
            h[9] = 17;
            h[12..16].copy_from_slice(&s.octets());
            h[16..20].copy_from_slice(&d.octets());
        }
        (s, d) => {
            g[0] = 0x60;
            g[4..6].copy_from_slice(&((8 + len) as u16).to_be_bytes());
            g[6] = 17;
            g[7] = 64;
            g[8..24].copy_from_slice(&gid_of(s));
            g[24..40].copy_from_slice(&gid_of(d));
        }
    }
    g
}
