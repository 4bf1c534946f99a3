//! The data-plane core: one device over one packet port. It demultiplexes
//! received packets by QPN, checks their ICRC (solving for the IP ID where
//! the port hides it), builds and seals what the QPs transmit (UD GRH
//! included), runs the transport's timers, places and gathers payload in
//! registered memory (burst-mem), and collects completions. It is
//! crate-internal: the [`crate::engine`] owns it and is the one API.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr, SocketAddrV6};
use std::sync::Arc;
use std::time::Instant;

use burst_io::{IcrcCheck, PacketBuf, PayloadCrc, Port, RxBatch, BURST, MAX_GSO_SEGMENTS};
use burst_mem::{MrTable, Pd};
use burst_transport::{
    Qp, QpAttr, QpConfig, QpState, RecvWr, SendWr, Srq, VerbsError, WorkCompletion,
};
use burst_wire::icrc;
use burst_wire::{IbPacket, Mtu, Qpn, ROCEV2_PORT};

use crate::congestion::{Congestion, QpFlow};
use crate::{
    clock, contain, gid_of, ip_of_gid, AnyPort, AsyncEvent, DeviceCounters, QpEvent, QpInit, SrqId,
    MAX_INLINE, MAX_QP, MAX_QP_WR, MAX_SGE,
};

/// Lowest QPN handed out (0 and 1 are QP0/QP1; RXE starts at 0x11).
pub(crate) const FIRST_QPN: u32 = 0x11;

#[derive(Debug)]
struct QpSlot {
    qp: Qp,
    completions: VecDeque<WorkCompletion>,
    srq: Option<usize>,
    flow: QpFlow,
    /// Send and receive WRs the transport took (the retired ones are these
    /// less what its queues still hold).
    accepted: (u64, u64),
}

/// The destination QPN of multicast packets (IBA 10.5.2.3).
const MULTICAST_QPN: u32 = 0xff_ffff;

/// An address handle: where packets go and, when it is not the port's
/// own address, the GID (address) they leave from.
#[derive(Debug, Clone, Copy)]
struct Ah {
    peer: SocketAddr,
    src: Option<IpAddr>,
    /// The daemon client that created it (0: the engine's own process).
    owner: u32,
}

/// The interface a device's GID table follows ([`Device::set_interface`]).
#[derive(Debug)]
struct GidSource {
    iface: String,
    ifindex: u32,
    /// When the interface's addresses were last read.
    scanned: Option<Instant>,
    /// Addresses the port could not serve (warned about once).
    refused: Vec<IpAddr>,
}

/// The interface whose link the port follows ([`Device::watch_link`]).
#[derive(Debug)]
struct LinkWatch {
    iface: String,
    up: bool,
    /// When to look again (device clock, ns).
    next_ns: u64,
}

/// How often the link is looked at (the engine steps at least every
/// millisecond, idle or not).
const LINK_CHECK_NS: u64 = 100_000_000;

/// How stale the GID table may be when it is read (an address added to the
/// interface shows within this).
const GID_RESCAN: std::time::Duration = std::time::Duration::from_millis(100);

/// A burst RDMA device on one IP address, over packet port `P`.
pub(crate) struct Device<P: Port = AnyPort> {
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
    /// Address handles by index (the engine's context numbers them alike
    /// on every lane; `None`: destroyed, its index free for the next).
    ahs: Vec<Option<Ah>>,
    /// The GID table: the port's address, or every address of its
    /// interface laid out as RXE's ([`crate::gids`]).
    gids: crate::gids::GidTable,
    gid_source: Option<GidSource>,
    link: Option<LinkWatch>,
    /// Multicast groups (MGID) and the UD QPs attached to each.
    mcast: std::collections::HashMap<[u8; 16], Vec<Qpn>>,
    rx: RxBatch,
    tx: Vec<PacketBuf>,
    /// How payload moves between packets and memory (fused CPU gathers,
    /// or an offload backend drained before what the copies precede).
    copier: burst_mem::Copier,
    /// Sealed packets at the front of `tx` that the port had no room for
    /// (a full socket buffer): sent before anything new is taken from the
    /// QPs, so a slow port holds the transport back instead of losing what
    /// it already handed out.
    tx_held: usize,
    clock: clock::Clock,
    /// When a packet last arrived (ns on the device clock, [`Device::now`]).
    last_rx: u64,
    port_mtu: Mtu,
    counters: DeviceCounters,
    /// Linger on drop to re-ACK a peer's retransmissions ([`LINGER`]): on
    /// the wall clock only (a simulation's manual clock turns it off).
    linger: bool,
    /// Asynchronous events not yet taken ([`Device::take_async_events`]).
    events: Vec<AsyncEvent>,
    /// QP1: MADs in and out for the connection manager (every lane
    /// shares the device's).
    gsi: Option<Arc<crate::gsi::Gsi>>,
    /// Test support: the QPN whose next packet makes the device panic
    /// ([`Device::debug_panic_on_packet_for`]).
    panic_for: Option<Qpn>,
    /// Congestion control: peer windows, QP rates, CNPs.
    cc: Congestion,
    /// The QP slot the next transmit round starts at (round robin, so the
    /// first QPs do not take every round's burst and window).
    tx_next: usize,
    /// The QPN space this device (one engine thread of a device) owns:
    /// QPNs `FIRST_QPN + slot * count + index` ([`Device::set_lane`]).
    lane: QpnLane,
}

/// Which QPNs a device owns: every `count`-th from `FIRST_QPN + index`
/// (engine threads of one device interleave their QPNs, so the owner of a
/// packet's QP follows from its QPN, for the steering programs too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QpnLane {
    pub index: u32,
    pub count: u32,
}

impl QpnLane {
    /// The slot of `qpn` in this lane's table, if the lane owns it.
    fn slot_of(self, qpn: Qpn) -> Option<usize> {
        let i = qpn.value().wrapping_sub(FIRST_QPN);
        (i % self.count == self.index).then_some((i / self.count) as usize)
    }

    fn qpn_of(self, slot: usize) -> Qpn {
        Qpn::from_wire(FIRST_QPN + slot as u32 * self.count + self.index)
    }
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

impl<P: Port> Device<P> {
    /// A device over `port` (its address is the device's), with active MTU
    /// `port_mtu` and memory regions in `mrs` (an engine builds one:
    /// [`engine::Engine::with_port`]).
    pub fn with_port(port: P, port_mtu: Mtu, mrs: Arc<MrTable>) -> Device<P> {
        let gids = crate::gids::GidTable::for_address(port.local_addr().ip());
        Device {
            port,
            gids,
            gid_source: None,
            link: None,
            icrc: icrc::Checker::new(),
            mrs,
            qps: Vec::new(),
            free_qps: VecDeque::new(),
            srqs: Vec::new(),
            destroyed: burst_transport::Counters::default(),
            ahs: Vec::new(),
            mcast: Default::default(),
            rx: RxBatch::new(BURST),
            // A round sends up to a full GSO run per QP burst.
            tx: (0..TX_BURST).map(|_| PacketBuf::new()).collect(),
            copier: burst_mem::Copier::default(),
            tx_held: 0,
            clock: clock::Clock::wall(),
            last_rx: 0,
            port_mtu,
            counters: DeviceCounters::default(),
            linger: true,
            events: Vec::new(),
            gsi: None,
            panic_for: None,
            cc: Congestion::new(burst_cc::Algorithm::default()),
            tx_next: 0,
            lane: QpnLane { index: 0, count: 1 },
        }
    }

    /// Makes this device lane `index` of `count` (before any QP exists):
    /// it numbers its QPs `FIRST_QPN + slot * count + index`.
    pub fn set_lane(&mut self, index: u32, count: u32) {
        self.lane = QpnLane {
            index,
            count: count.max(1),
        };
    }

    /// Hands QP1's traffic to (and takes it from) `gsi`.
    pub fn set_gsi(&mut self, gsi: Arc<crate::gsi::Gsi>) {
        self.gsi = Some(gsi);
    }

    /// Selects how payload moves (before traffic: a pending copy is
    /// drained when the old copier drops).
    pub fn set_copier(&mut self, copier: burst_mem::Copier) {
        self.copier = copier;
    }

    /// Selects the congestion control (before any QP is created).
    pub fn set_congestion_control(&mut self, algo: burst_cc::Algorithm) {
        self.cc = Congestion::new(algo);
    }

    /// The congestion control in use, each peer window's state (peer,
    /// state, request packets in flight to it) and the DCQCN state of
    /// each QP that runs one.
    pub fn congestion_state(&self) -> crate::CongestionReport {
        crate::CongestionReport {
            algorithm: self.cc.algorithm(),
            peers: self.cc.peer_states(),
            qps: self
                .qps
                .iter()
                .flatten()
                .filter_map(|s| Congestion::rate_state(&s.flow).map(|r| (s.qp.qpn(), r)))
                .collect(),
        }
    }

    /// The device's RoCE v2 GID (index 0 here).
    pub fn gid(&self) -> [u8; 16] {
        gid_of(self.port.local_addr().ip())
    }

    /// Device counters, with the QPs' transport counters summed in.
    pub fn counters(&self) -> DeviceCounters {
        let mut c = self.counters;
        c.cc = self.cc.counters;
        c.port = self.port.counters();
        c.copy = self.copier.counters();
        c.qps = self.destroyed;
        for s in self.qps.iter().flatten() {
            c.qps.accumulate(s.qp.counters());
        }
        c
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
        let qpn = self.lane.qpn_of(index);
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
            flow: self.cc.flow(),
            accepted: (0, 0),
        };
        if index == self.qps.len() {
            self.qps.push(Some(slot));
        } else {
            self.qps[index] = Some(slot);
        }
        // Kernel-side steering (AF_XDP's map) sends its frames to this lane.
        self.port.steer_qp(qpn.value(), self.lane.index);
        Ok(qpn)
    }

    /// `ibv_attach_mcast`: UD QP `qpn` receives what is sent to multicast
    /// group `mgid` (an IPv6 multicast address, or an IPv4 one mapped) and
    /// QPN 0xFFFFFF, with its own Q_Key check, as on RXE. The port joins
    /// the group with its first QP (EOPNOTSUPP where the port cannot);
    /// attaching twice is one attachment.
    pub fn attach_mcast(&mut self, qpn: Qpn, mgid: [u8; 16]) -> Result<(), VerbsError> {
        if self.slot(qpn)?.qp.config().qp_type != burst_transport::QpType::Ud {
            return Err(VerbsError::InvalidValue("multicast needs a UD QP"));
        }
        let group = burst_wire::ip_of_gid(mgid);
        if !group.is_multicast() {
            return Err(VerbsError::InvalidValue("the GID is not a multicast group"));
        }
        let members = self.mcast.entry(mgid).or_default();
        if members.contains(&qpn) {
            return Ok(());
        }
        if members.is_empty() {
            if let Err(e) = self.port.join_multicast(group) {
                tracing::warn!(%group, "ibv_attach_mcast: the port cannot join: {e}");
                self.mcast.remove(&mgid);
                return Err(if e.kind() == std::io::ErrorKind::Unsupported {
                    VerbsError::Unsupported("multicast on this port")
                } else {
                    VerbsError::InvalidValue("the port could not join the group")
                });
            }
        }
        self.mcast.entry(mgid).or_default().push(qpn);
        Ok(())
    }

    /// `ibv_detach_mcast`: EINVAL when `qpn` is not attached to `mgid`; the
    /// port leaves the group with its last QP.
    pub fn detach_mcast(&mut self, qpn: Qpn, mgid: [u8; 16]) -> Result<(), VerbsError> {
        let members = self
            .mcast
            .get_mut(&mgid)
            .filter(|m| m.contains(&qpn))
            .ok_or(VerbsError::InvalidValue(
                "the QP is not attached to the group",
            ))?;
        members.retain(|q| *q != qpn);
        if members.is_empty() {
            self.mcast.remove(&mgid);
            let _ = self.port.leave_multicast(burst_wire::ip_of_gid(mgid));
        }
        Ok(())
    }

    /// `ibv_destroy_qp`: the QP stops at once; completions not yet taken
    /// are discarded, and its number is reused later.
    pub fn destroy_qp(&mut self, qpn: Qpn) -> Result<(), VerbsError> {
        let i = self.qp_index(qpn)?;
        let groups: Vec<[u8; 16]> = self
            .mcast
            .iter()
            .filter(|(_, m)| m.contains(&qpn))
            .map(|(g, _)| *g)
            .collect();
        for g in groups {
            let _ = self.detach_mcast(qpn, g);
        }
        // Its ACKs of the last receives go out first (they leave a round
        // after the receive; the peer needs them to complete its sends).
        self.flush();
        if let Some(mut s) = self.qps[i].take() {
            self.cc.forget(&mut s.flow, &s.qp);
            self.destroyed.accumulate(s.qp.counters());
        }
        self.port.unsteer_qp(qpn.value());
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

    /// Creates address handle `index` for a peer's GID, sent to from the
    /// GID at `sgid_index` of the device's table (`None`: the port's
    /// address). The caller numbers handles (the same on every lane).
    pub fn create_ah(
        &mut self,
        index: u32,
        owner: u32,
        gid: [u8; 16],
        sgid_index: Option<u8>,
    ) -> Result<u32, VerbsError> {
        let src = match sgid_index {
            None => self.port.local_addr().ip(),
            Some(i) => match self.gids.get(usize::from(i)) {
                Some(ip) => ip,
                None => {
                    tracing::warn!(sgid_index = i, "address handle: no GID at this index");
                    return Err(VerbsError::InvalidValue("sgid_index: no such GID"));
                }
            },
        };
        let dst = ip_of_gid(gid);
        if dst.is_ipv4() != src.is_ipv4() {
            tracing::warn!(%src, %dst, "address handle: source and destination GIDs of different IP versions");
            return Err(VerbsError::InvalidValue(
                "dgid: not of the sgid's IP version",
            ));
        }
        let peer = match dst {
            // A link-local peer is reached through the device's interface.
            IpAddr::V6(v6) if v6.is_unicast_link_local() => {
                let scope = self.gid_source.as_ref().map_or(0, |g| g.ifindex);
                SocketAddr::V6(SocketAddrV6::new(v6, ROCEV2_PORT, 0, scope))
            }
            d => SocketAddr::new(d, ROCEV2_PORT),
        };
        let src = (src != self.port.local_addr().ip()).then_some(src);
        let i = index as usize;
        if self.ahs.len() <= i {
            self.ahs.resize(i + 1, None);
        }
        self.ahs[i] = Some(Ah { peer, src, owner });
        Ok(index)
    }

    /// Who created address handle `index` (`None`: no such handle): a
    /// daemon client's work requests may only name its own.
    pub fn ah_owner(&self, index: u32) -> Option<u32> {
        self.ahs.get(index as usize)?.map(|a| a.owner)
    }

    /// Destroys address handle `index` (its number may be given again).
    pub fn destroy_ah(&mut self, index: u32) {
        if let Some(a) = self.ahs.get_mut(index as usize) {
            *a = None;
        }
        while self.ahs.last().is_some_and(|a| a.is_none()) {
            self.ahs.pop();
        }
    }

    /// Makes the GID table follow interface `iface` (every address of it,
    /// laid out as RXE's) when the port's address is one of its addresses.
    /// The port serves every listed address; a slot whose address it
    /// cannot serve (ports that serve one address) stays empty.
    pub fn set_interface(&mut self, iface: &str) {
        self.gid_source = Some(GidSource {
            iface: iface.to_string(),
            ifindex: crate::netif::ifindex(iface),
            scanned: None,
            refused: Vec::new(),
        });
        self.refresh_gids();
    }

    /// Follows interface `iface`'s link: port 1 goes down with it and up
    /// again, each change an [`AsyncEvent::Port`] (RXE's PORT_ERR and
    /// PORT_ACTIVE).
    pub fn watch_link(&mut self, iface: &str) {
        self.link = Some(LinkWatch {
            iface: iface.to_string(),
            up: crate::netif::link_up(iface).unwrap_or(true),
            next_ns: 0,
        });
    }

    fn check_link(&mut self, now: u64) {
        let Some(l) = &mut self.link else {
            return;
        };
        if now < l.next_ns {
            return;
        }
        l.next_ns = now + LINK_CHECK_NS;
        let Some(up) = crate::netif::link_up(&l.iface) else {
            return;
        };
        if up != l.up {
            l.up = up;
            tracing::info!(iface = %l.iface, up, "port 1 {}", if up { "active" } else { "down" });
            self.events.push(AsyncEvent::Port { active: up });
        }
    }

    /// The GID table, read again from the interface if older than
    /// [`GID_RESCAN`]: slot `i` is GID index `i` (`None`: empty).
    pub fn gid_table(&mut self) -> Vec<Option<IpAddr>> {
        self.refresh_gids();
        self.gids.slots().to_vec()
    }

    /// Follows the interface's addresses: the port serves what the table
    /// gains and drops what it loses (RXE follows netdev events the same).
    fn refresh_gids(&mut self) {
        let Some(src) = &mut self.gid_source else {
            return;
        };
        if src.scanned.is_some_and(|t| t.elapsed() < GID_RESCAN) {
            return;
        }
        src.scanned = Some(Instant::now());
        let primary = self.port.local_addr().ip();
        let Some(change) = self.gids.follow(primary, &src.iface) else {
            return;
        };
        for ip in change.removed {
            self.port.remove_address(ip);
        }
        for (index, ip) in change.added {
            if ip == primary {
                continue;
            }
            let at = match ip {
                IpAddr::V6(v6) if v6.is_unicast_link_local() => {
                    SocketAddr::V6(SocketAddrV6::new(v6, 0, 0, src.ifindex))
                }
                ip => SocketAddr::new(ip, 0),
            };
            if let Err(e) = self.port.add_address(at) {
                // Listed still, as RXE lists every address of its interface
                // (software that scans the table, UCX for one, stops at an
                // empty slot); nothing is sent from it or received on it.
                if !src.refused.contains(&ip) {
                    tracing::warn!(index, %ip, "GID not served: the port cannot use this address: {e}");
                    src.refused.push(ip);
                }
            }
        }
    }

    fn qp_index(&self, qpn: Qpn) -> Result<usize, VerbsError> {
        qp_index_in(&self.qps, self.lane, qpn)
    }

    fn slot(&mut self, qpn: Qpn) -> Result<&mut QpSlot, VerbsError> {
        slot_in(&mut self.qps, self.lane, qpn)
    }

    /// `ibv_modify_qp`.
    pub fn modify_qp(&mut self, qpn: Qpn, attr: &QpAttr) -> Result<(), VerbsError> {
        let _span =
            tracing::debug_span!("modify_qp", qpn = qpn.value(), to = ?attr.state).entered();
        if attr
            .ah
            .is_some_and(|a| self.ahs.get(a as usize).is_none_or(|a| a.is_none()))
        {
            tracing::warn!("modify_qp: unknown address handle {:?}", attr.ah);
            return Err(VerbsError::InvalidValue("ah"));
        }
        let s = slot_in(&mut self.qps, self.lane, qpn)?;
        let r = s.qp.modify(attr);
        match &r {
            Ok(()) => tracing::debug!(state = ?s.qp.state(), "QP modified"),
            Err(e) => tracing::warn!("modify_qp refused: {e} (errno {})", e.errno()),
        }
        // A connected QP joins its peer's congestion state.
        match s.qp.remote() {
            Some((ah, dest)) => {
                if let Some(Some(Ah { peer, .. })) = self.ahs.get(ah as usize) {
                    let peer = *peer;
                    if Congestion::connected_to(&s.flow) != Some((peer, dest)) {
                        self.cc.connect(&mut s.flow, &s.qp, peer, dest);
                    }
                }
            }
            None => self.cc.forget(&mut s.flow, &s.qp),
        }
        r
    }

    /// Takes a receive that passed `QpConfig::check_recv` when it was posted.
    pub fn post_recv_checked(&mut self, qpn: Qpn, wr: RecvWr) -> Result<(), VerbsError> {
        let mem = self.mrs.memory();
        let s = slot_in(&mut self.qps, self.lane, qpn)?;
        s.qp.post_recv_checked(wr, &mem)?;
        s.accepted.1 += 1;
        Ok(())
    }

    /// Send and receive WRs of `qpn` the transport has finished with
    /// (completed, flushed or refused once taken), counted since creation.
    /// The front end keeps each queue's outstanding work within its depth
    /// from this.
    pub fn retired(&self, qpn: Qpn) -> Option<(u64, u64)> {
        let s = self.qps[self.qp_index(qpn).ok()?].as_ref()?;
        Some((
            s.accepted.0.saturating_sub(s.qp.send_queue_len() as u64),
            s.accepted.1.saturating_sub(s.qp.recv_queue_len() as u64),
        ))
    }

    /// Takes a WR that passed [`burst_transport::QpConfig::check_send`] when
    /// it was posted, without making progress.
    pub fn post_send_checked(&mut self, qpn: Qpn, wr: SendWr) -> Result<(), VerbsError> {
        let mut mem = self.mrs.memory();
        let s = slot_in(&mut self.qps, self.lane, qpn)?;
        s.qp.post_send_checked(wr, &mut mem)?;
        s.accepted.0 += 1;
        Ok(())
    }

    /// Takes a completion of `qpn` gathered by earlier progress.
    pub fn take_completion(&mut self, qpn: Qpn) -> Option<WorkCompletion> {
        self.slot(qpn).ok()?.completions.pop_front()
    }

    /// `ibv_query_qp`: the QP's state and creation config.
    pub fn query_qp(&self, qpn: Qpn) -> Option<(QpState, QpConfig)> {
        let i = self.qp_index(qpn).ok()?;
        self.qps[i].as_ref().map(|s| (s.qp.state(), *s.qp.config()))
    }

    /// One QP's counters (RXE's names, per QP).
    pub fn qp_counters(&self, qpn: Qpn) -> Option<burst_transport::Counters> {
        let i = self.qp_index(qpn).ok()?;
        self.qps[i].as_ref().map(|s| *s.qp.counters())
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
        self.clock.now()
    }

    /// The earliest transport timer of any QP (device-clock ns): when
    /// [`Device::progress_at`] must next run if no packet comes first.
    pub fn next_timeout(&self) -> Option<u64> {
        self.qps
            .iter()
            .flatten()
            .filter_map(|s| s.qp.poll_timeout())
            .chain(self.cc.pace_wakeup())
            .min()
    }

    /// Runs the device on `clock` (a manual one for simulations); the
    /// linger on close ([`LINGER`]) is for the wall clock only.
    pub fn set_clock(&mut self, clock: clock::Clock) {
        self.linger &= clock.is_wall();
        self.clock = clock;
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
    /// raises [`QpEvent::Fatal`]; one outside any QP (the port, the
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
                } else if let Some(s) = self.qps[i].as_mut() {
                    let _ = self.cc.account(&mut s.flow, &mut s.qp, now);
                }
            }
        }
        self.check_link(now);
        let sent = self.transmit(now);
        let received = self.receive(now);
        self.collect_completions();
        sent + received + fired > 0
    }

    /// Contains a fault of the QP in slot `i`: error state (flushing its
    /// WRs), [`QpEvent::Fatal`], a log line.
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
            self.events.push(AsyncEvent::Qp(qpn, QpEvent::Fatal));
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
            let qpn = s.qp.qpn();
            self.events.extend(
                s.qp.take_events()
                    .into_iter()
                    .map(|e| AsyncEvent::Qp(qpn, e)),
            );
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
        // SAFETY: the batch's buffers are not touched again before the
        // drain below (the next receive reuses them).
        unsafe { self.copier.defer_from(self.rx.buffers()) };
        let mut mem = self.mrs.memory_through(&mut self.copier);
        let mut faulted: Vec<(usize, String)> = Vec::new();
        for (meta, bytes) in self.rx.frames() {
            let peer = meta.peer;
            self.counters.rcvd_pkts += 1;
            let Ok(pkt) = IbPacket::new_checked(bytes) else {
                self.counters.malformed += 1;
                continue;
            };
            // A datagram to a multicast group or to another of the device's
            // GIDs: its ICRC covers that address.
            let local = meta
                .dest
                .map_or(local, |g| SocketAddr::new(g, local.port()));
            let check = if meta.icrc_verified {
                // Checked by the port over the headers as received.
                IcrcCheck::Ok
            } else {
                self.icrc.check(peer, local, bytes, meta.ip_id)
            };
            match check {
                IcrcCheck::Ok => self.counters.icrc_verified += 1,
                IcrcCheck::OkWithId(_) => self.counters.icrc_id_solved += 1,
                IcrcCheck::Unverifiable => self.counters.icrc_unverified += 1,
                IcrcCheck::Bad => {
                    self.counters.icrc_errors += 1;
                    continue;
                }
            }
            let qpn = pkt.bth().dest_qp();
            if qpn.value() == crate::gsi::GSI_QPN {
                match &self.gsi {
                    Some(gsi) => gsi.receive(peer.ip(), &pkt),
                    None => self.counters.no_qp += 1,
                }
                continue;
            }
            // QPN 0xFFFFFF to a group: a copy for every QP attached to it
            // (each checks its Q_Key); to our own address it names no QP.
            let targets: &[Qpn] = match meta.dest {
                Some(g) if g.is_multicast() && qpn.value() == MULTICAST_QPN => self
                    .mcast
                    .get(&burst_wire::gid_of(g))
                    .map_or(&[], Vec::as_slice),
                Some(g) if g.is_multicast() => &[],
                _ if qpn.value() == MULTICAST_QPN => &[],
                _ => std::slice::from_ref(&qpn),
            };
            if targets.is_empty() {
                self.counters.no_qp += 1;
                continue;
            }
            for &qpn in targets {
                let Ok(i) = qp_index_in(&self.qps, self.lane, qpn) else {
                    self.counters.no_qp += 1;
                    continue;
                };
                let Some(s) = self.qps[i].as_mut() else {
                    continue;
                };
                if pkt.info().transport == burst_wire::Transport::Cnp {
                    // Congestion notification: for the controllers, not the QP.
                    self.cc.on_cnp(&mut s.flow, now);
                    continue;
                }
                if meta.ecn == ECN_CE {
                    self.cc.on_ce(&mut s.flow, now);
                }
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
                } else {
                    let _ = self.cc.account(&mut s.flow, &mut s.qp, now);
                }
            }
        }
        // Every placement lands before anything it precedes is seen: the
        // completions collected next, the ACKs sent next.
        self.copier.drain();
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
        // SAFETY: the send buffers past the held ones are filled here and
        // read only after the drain below (sealing).
        unsafe {
            self.copier.defer_into(
                self.tx
                    .iter_mut()
                    .map(|b| (b.data.as_mut_ptr(), b.data.len())),
            )
        };
        let mem = self.mrs.memory_through(&mut self.copier);
        let mut n = 0;
        // CNPs first: they are what slows the congested senders down.
        while n < self.tx.len() {
            let Some((peer, dest)) = self.cc.cnps.pop() else {
                break;
            };
            let ib = burst_wire::IbRepr::cnp(dest);
            let len = ib.buffer_len();
            let buf = &mut self.tx[n];
            if ib.emit(&mut buf.data[..len]).is_ok() {
                buf.len = len;
                buf.peer = peer;
                buf.src = None;
                buf.payload_crc = None;
                self.counters.sent_pkts += 1;
                self.cc.counters.cnp_sent += 1;
                n += 1;
            }
        }
        // Then connection management (rare, small, time-critical for the
        // peer's CM timers).
        if let Some(gsi) = &self.gsi {
            while n < self.tx.len() && gsi.has_transmit() {
                let buf = &mut self.tx[n];
                let Some((len, peer)) = gsi.transmit(&mut buf.data[..]) else {
                    break;
                };
                buf.len = len;
                buf.peer = peer;
                buf.src = None;
                buf.payload_crc = None;
                self.counters.sent_pkts += 1;
                n += 1;
            }
        }
        self.cc.begin_round();
        let mut faulted: Vec<(usize, String)> = Vec::new();
        let nq = self.qps.len();
        let start = if nq == 0 { 0 } else { self.tx_next % nq };
        self.tx_next = start + 1;
        for i in (start..nq).chain(0..start) {
            let Some(s) = self.qps[i].as_mut() else {
                continue;
            };
            if !s.qp.has_transmit_pending() {
                continue;
            }
            let credit = self.cc.credit(&mut s.flow, &mut s.qp, now);
            s.qp.set_request_credit(credit);
            let q = &mut s.qp;
            let (tx, ahs, counters) = (&mut self.tx, &self.ahs, &mut self.counters);
            let start = n;
            let filled = contain(|| {
                let mut n = start;
                while n < tx.len() {
                    let Some(t) = q.poll_transmit(now) else { break };
                    let Some(Some(Ah { peer, src, .. })) = ahs.get(t.ah as usize).copied() else {
                        continue;
                    };
                    let len = t.ib.buffer_len();
                    let buf = &mut tx[n];
                    if len > buf.data.len() || t.ib.emit(&mut buf.data[..len]).is_err() {
                        continue;
                    }
                    let at = t.ib.header_len();
                    let plen = t.ib.payload_len;
                    let Ok(crc) = t.gather_crc(&mem, &mut buf.data[at..at + plen]) else {
                        continue;
                    };
                    counters.sent_pkts += 1;
                    buf.len = len;
                    buf.peer = peer;
                    buf.src = src;
                    buf.payload_crc = crc.map(|crc| PayloadCrc { at, len: plen, crc });
                    n += 1;
                }
                q.flush_unreliable();
                n
            });
            match filled {
                Ok(k) => {
                    // Requests left while the burst had room: held by the
                    // window or rate.
                    let held = k < tx.len() && credit.is_some() && q.has_requests_pending();
                    n = k;
                    self.cc.sent(&mut s.flow, &mut s.qp, held, now);
                }
                // What this QP built before its fault is not sent.
                Err(msg) => faulted.push((i, msg)),
            }
        }
        // Gathers into the send buffers finish before sealing reads them.
        self.copier.drain();
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

/// The ECN codepoint "congestion experienced" (RFC 3168).
const ECN_CE: u8 = 0b11;

/// Packets one round sends at most: four GSO runs' worth.
const TX_BURST: usize = 4 * MAX_GSO_SEGMENTS;

/// The slot of `qpn` (QPNs index the table from [`FIRST_QPN`]).
fn qp_index_in(qps: &[Option<QpSlot>], lane: QpnLane, qpn: Qpn) -> Result<usize, VerbsError> {
    let i = lane.slot_of(qpn).ok_or(VerbsError::BadWr("no such QP"))?;
    match qps.get(i) {
        Some(Some(_)) => Ok(i),
        _ => Err(VerbsError::BadWr("no such QP")),
    }
}

/// [`qp_index_in`], borrowed mutably (leaves the device's other fields free).
fn slot_in(qps: &mut [Option<QpSlot>], lane: QpnLane, qpn: Qpn) -> Result<&mut QpSlot, VerbsError> {
    let i = qp_index_in(qps, lane, qpn)?;
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
        // What RXE shows in its hw_counters, once, for whoever asks
        // (BURST_LOG=info): how the device's traffic went.
        let c = self.counters();
        tracing::info!(
            target: "burst::counters",
            "device {} closing: sent {} packets ({} request payload bytes), received {}, \
             retransmitted {} in {} go-backs, ACK timeouts {}, sequence errors (NAKs, READ gaps) {}, \
             RETRY_EXC_ERR {}, CNPs sent {} received {}, CE seen {}, window cuts {}, rate cuts {}, \
             ICRC errors {}, congestion control {}; copies: {:?}; port: {:?}",
            self.port.local_addr().ip(),
            c.sent_pkts,
            c.qps.sent_bytes,
            c.rcvd_pkts,
            c.qps.retransmitted_pkts,
            c.qps.retransmits_started,
            c.qps.completer_retry_err,
            c.qps.rcvd_seq_err,
            c.qps.retry_exceeded_err,
            c.cc.cnp_sent,
            c.cc.cnp_rcvd,
            c.cc.ce_rcvd,
            c.cc.window_cuts,
            c.cc.rate_cuts,
            c.icrc_errors,
            self.cc.algorithm().name(),
            c.copy,
            c.port
        );
    }
}
