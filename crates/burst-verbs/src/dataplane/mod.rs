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

use burst_io::{PacketBuf, Port, RxBatch, BURST};
use burst_mem::{MrTable, Pd};
use burst_transport::{
    Qp, QpAttr, QpConfig, QpState, RecvWr, SendWr, Srq, VerbsError, WorkCompletion,
};
use burst_wire::icrc;
use burst_wire::{Mtu, Qpn, ROCEV2_PORT};

use crate::congestion::{Congestion, QpFlow};
use crate::{
    clock, gid_of, ip_of_gid, AnyPort, AsyncEvent, DeviceCounters, QpInit, SrqId, MAX_INLINE,
    MAX_QP, MAX_QP_WR, MAX_SGE,
};

mod io;
mod link;
mod ready;

use io::*;

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

impl QpSlot {
    /// Work requests the QP took so far (both queues): unchanged over a
    /// span, the QP was idle.
    fn work(&self) -> u64 {
        self.accepted.0.wrapping_add(self.accepted.1)
    }

    /// Whether an empty queue of the QP (the transport's, or its
    /// completions here) holds memory [`QpSlot::trim`] would give back.
    fn trimmable(&self) -> bool {
        self.qp.trimmable() || (self.completions.is_empty() && self.completions.capacity() > 0)
    }

    fn trim(&mut self) {
        self.qp.trim();
        if self.completions.is_empty() {
            self.completions = VecDeque::new();
        }
    }
}

/// How long a QP's queues stay empty before their memory is given back
/// (an idle QP costs its state, not its busiest moment's queues; a busy
/// one never waits this long between works, so it never reallocates).
const TRIM_AFTER_NS: u64 = 1_000_000_000;

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
    /// When to look again (device clock, ns), when no notifications come.
    next_ns: u64,
    /// The kernel's link notifications, which an engine thread waits on:
    /// then the link is looked at when one came, and no timer wakes an
    /// idle device for it.
    events: Option<std::sync::Arc<burst_io::netdev::LinkEvents>>,
}

/// How often the link is looked at without notifications (a device no
/// engine thread waits for), and how often busy steps that never sleep
/// look at the notification socket themselves.
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
    /// Receive buffers for an offloading copier only ([`Device::receive`]).
    rx: Option<RxBatch>,
    tx: Vec<PacketBuf>,
    /// How payload moves between packets and memory (fused CPU gathers,
    /// or an offload backend drained before what the copies precede).
    copier: burst_mem::Copier,
    /// Sealed packets at the front of `tx` that the port had no room for
    /// (a full socket buffer): sent before anything new is taken from the
    /// QPs, so a slow port holds the transport back instead of losing what
    /// it already handed out.
    tx_held: usize,
    /// Packets of sends corked since the last transmit round
    /// ([`Device::cork_post`]).
    corked: usize,
    /// Posts are never corked on this lane any more: a cork outlived the
    /// claim of the thread that made it ([`Device::stop_corking`]).
    cork_off: bool,
    /// Peers newly timed this round (kept between rounds: no allocation
    /// per round).
    timed: Vec<std::net::IpAddr>,
    /// QPs whose timers expired this round (kept between rounds: no
    /// allocation per round).
    due: Vec<usize>,
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
    /// The QPs a round looks at (touched, sending, with completions,
    /// timers): idle QPs cost nothing per round.
    ready: ready::Ready,
    /// Reused list of slots (settling, delivering completions).
    slots: Vec<usize>,
    /// QPs a round's [`Congestion::release`] gave back (kept for its
    /// capacity).
    released: Vec<(usize, u64)>,
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
    /// [`crate::engine::Engine::with_port`]).
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
            rx: None,
            // A round sends up to a full GSO run per QP burst.
            tx: (0..TX_BURST).map(|_| PacketBuf::new()).collect(),
            copier: burst_mem::Copier::default(),
            tx_held: 0,
            corked: 0,
            cork_off: false,
            timed: Vec::new(),
            due: Vec::new(),
            clock: clock::Clock::wall(),
            last_rx: 0,
            port_mtu,
            counters: DeviceCounters::default(),
            linger: true,
            events: Vec::new(),
            gsi: None,
            panic_for: None,
            cc: Congestion::new(burst_cc::Algorithm::default()),
            ready: ready::Ready::default(),
            slots: Vec::new(),
            released: Vec::new(),
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
            c.qps.add(s.qp.counters());
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
            self.destroyed.add(s.qp.counters());
        }
        self.port.unsteer_qp(qpn.value());
        self.ready.forget(i);
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
        srq_in(&mut self.srqs, id)?.post_recv(wr)
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

    fn qp_index(&self, qpn: Qpn) -> Result<usize, VerbsError> {
        qp_index_in(&self.qps, self.lane, qpn)
    }

    fn slot(&mut self, qpn: Qpn) -> Result<&mut QpSlot, VerbsError> {
        slot_in(&mut self.qps, self.lane, qpn)
    }

    /// The lane this device is (its index among the engine's lanes).
    pub fn lane(&self) -> usize {
        self.lane.index as usize
    }

    /// Whether a transmit round has packets to send now: QPs queued to
    /// transmit, or frames the port did not take yet.
    pub fn wants_transmit(&self) -> bool {
        self.ready.transmit_len() > 0 || self.tx_held > 0
    }

    /// Whether `qpn` has packets it may send now (a transition can let
    /// out work posted before it: SQD back to RTS, a QP no longer
    /// waiting for its peer).
    pub fn transmit_pending(&self, qpn: Qpn) -> bool {
        self.qp_index(qpn)
            .ok()
            .and_then(|i| self.qps[i].as_ref())
            .is_some_and(|s| s.qp.has_transmit_pending())
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
        let i = qp_index_in(&self.qps, self.lane, qpn)?;
        self.ready.touch(i);
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
        let i = qp_index_in(&self.qps, self.lane, qpn)?;
        self.ready.touch(i);
        let s = self.qps[i].as_mut().expect("qp_index_in checked");
        s.qp.post_recv_checked(wr)?;
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
        let i = qp_index_in(&self.qps, self.lane, qpn)?;
        self.ready.touch(i);
        let s = self.qps[i].as_mut().expect("qp_index_in checked");
        s.qp.post_send_checked(wr, &mut mem)?;
        s.accepted.0 += 1;
        Ok(())
    }

    /// Whether the send just posted to `qpn` (`op`, `len` bytes) may wait
    /// for the lane's next transmit round instead of going out on its own
    /// system call; counted in the cork if so. `more`: more WRs of the
    /// same `ibv_post_send` list follow, and the list's last post (or the
    /// poster's flush, [`crate::engine::QueuePair::send_posted`]) sends
    /// them all, as an RNIC takes a list with one doorbell.
    ///
    /// Nagle's rule for posts (TCP's autocork is the same idea): an RC QP
    /// with request packets in flight will hear an ACK, a NAK or its
    /// retransmission timer, and whoever steps the lane then sends what is
    /// corked, together. So will one parked behind its peer's full window
    /// (other QPs' packets to that peer are in flight): with a thousand QPs
    /// posting in turn, each post to a parked QP ran a transmit round that
    /// found the window full again. A post to a QP with nothing in flight (a
    /// ping-pong, the first post of a burst) never waits, and neither do
    /// UC and UD sends (nothing comes back). The cork holds one GSO run
    /// at most ([`burst_io::MAX_GSO_SEGMENTS`] packets): a bandwidth loop that posts
    /// faster than a system call per message pays one per run. A local
    /// operation (a memory-window bind, a local invalidate) sends nothing
    /// and completes when its round takes it: never corked.
    pub fn cork_post(
        &mut self,
        qpn: Qpn,
        op: &burst_transport::SendOp,
        len: u64,
        more: bool,
    ) -> bool {
        let Some(s) = self.qp_index(qpn).ok().and_then(|i| self.qps[i].as_ref()) else {
            return false;
        };
        // A QP parked behind its peer's full window sends nothing before
        // an ACK (of another QP's packets to that peer) opens it: a post
        // to it waits as one behind its own packets does.
        let rc = s.qp.config().qp_type == burst_transport::QpType::Rc;
        let waits = s.qp.packets_in_flight() > 0 || (rc && s.flow.parked);
        if !more && (self.cork_off || op.is_local() || !waits) {
            return false;
        }
        // A READ or an atomic is one request packet, whatever it asks for.
        let bytes = if op.is_read_or_atomic() { 0 } else { len };
        let pkts = bytes.div_ceil(s.qp.mtu().bytes() as u64).max(1);
        let Some(corked) = usize::try_from(pkts)
            .ok()
            .and_then(|p| self.corked.checked_add(p))
            .filter(|&c| c <= burst_io::MAX_GSO_SEGMENTS)
        else {
            return false;
        };
        self.corked = corked;
        self.counters.corked_posts += 1;
        true
    }

    /// Whether sends wait in the cork for the next transmit round
    /// ([`Device::cork_post`]).
    pub fn corked(&self) -> bool {
        self.corked > 0
    }

    /// Posts on this lane are no longer corked (an `ibv_post_send` list
    /// still leaves at its last WR). The engine calls it when a thread's
    /// claim lapsed with sends still corked: the thread posted behind
    /// packets in flight and went to spin on memory (a client that
    /// pipelines requests and waits for the peer's WRITE of each answer),
    /// so its sends waited for the lapse, milliseconds where an RNIC takes
    /// microseconds. Such a thread pays that once; a bandwidth loop, which
    /// polls, never lets a cork lapse.
    pub fn stop_corking(&mut self) {
        if !self.cork_off {
            self.cork_off = true;
            self.counters.cork_lapses += 1;
        }
    }

    /// Takes a completion of `qpn` gathered by earlier progress.
    #[must_use = "a completion not taken is lost"]
    pub fn take_completion(&mut self, qpn: Qpn) -> Option<WorkCompletion> {
        self.slot(qpn).ok()?.completions.pop_front()
    }

    /// The QPs with completions gathered since the last call, into `out`
    /// (cleared first): what the engine drains with
    /// [`Device::take_completion`]. A QP whose completions it leaves is
    /// given back with [`Device::keep_completed`].
    pub fn take_completed(&mut self, out: &mut Vec<Qpn>) {
        out.clear();
        self.ready.take_completed(&mut self.slots);
        out.extend(self.slots.iter().map(|&i| self.lane.qpn_of(i)));
    }

    /// Lists `qpn` again among the QPs with completions (the engine could
    /// not deliver them this round).
    pub fn keep_completed(&mut self, qpn: Qpn) {
        if let Ok(i) = self.qp_index(qpn) {
            if self.qps[i]
                .as_ref()
                .is_some_and(|s| !s.completions.is_empty())
            {
                self.ready.mark_completed(i);
            }
        }
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

    /// The earliest timer of the device (device-clock ns): a QP's
    /// transport timer, the pacer's next release, or the next look at the
    /// link it follows; when [`Device::progress_at`] must next run if no
    /// packet comes first.
    pub fn next_timeout(&self) -> Option<u64> {
        self.ready
            .next_deadline()
            .into_iter()
            .chain(self.cc.pace_wakeup())
            .chain(
                self.link
                    .as_ref()
                    .filter(|l| l.events.is_none())
                    .map(|l| l.next_ns),
            )
            .min()
    }

    /// Runs the device on `clock` (a manual one for simulations); the
    /// linger on close ([`LINGER`]) is for the wall clock only.
    pub fn set_clock(&mut self, clock: clock::Clock) {
        self.linger &= clock.is_wall();
        self.clock = clock;
    }
}

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
        // The port's frames the send buffers still hold go back to it.
        self.port.reclaim_frames(&mut self.tx);
        // What RXE shows in its hw_counters, once, for whoever asks
        // (BURST_LOG=info): how the device's traffic went.
        let c = self.counters();
        tracing::info!(
            target: "burst::counters",
            "device {} closing: sent {} packets ({} request payload bytes), received {}, \
             retransmitted {} in {} go-backs, ACK timeouts {}, sequence errors (NAKs, READ gaps) {}, \
             selective repeat: {} packets held past a hole, {} probes, {} go-backs; RETRY_EXC_ERR {}, CNPs sent {} received {}, CE seen {}, window cuts {}, rate cuts {}, \
             ICRC errors {}, congestion control {}; copies: {:?}; port: {:?}",
            self.port.local_addr().ip(),
            c.sent_pkts,
            c.qps.sent_bytes,
            c.rcvd_pkts,
            c.qps.retransmitted_pkts,
            c.qps.retransmits_started,
            c.qps.completer_retry_err,
            c.qps.rcvd_seq_err,
            c.qps.sr_held_pkts,
            c.qps.sr_probes,
            c.qps.sr_go_backs,
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
