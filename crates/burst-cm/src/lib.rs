#![doc = include_str!("../README.md")]

pub mod rdma;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::IpAddr;

use burst_wire::mad::{
    CmDreq, CmIds, CmMad, CmMessage, CmMra, CM_CLASS_VERSION, MAD_LEN, METHOD_SEND,
};

/// The messages [`Cm`]'s calls take and its events carry (burst-wire's
/// CM MADs), so a caller needs no other crate to fill them in.
pub use burst_wire::mad::{CmEce, CmPath, CmRej, CmRep, CmReq, CmSidrRep, CmSidrReq, CmTransport};
use burst_wire::{Psn, Qpn};

/// A connection (or SIDR exchange) of this CM: its local communication ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u32);

/// REJ reason codes (IBA table 109) that this CM sends or callers use.
pub mod reason {
    /// No QP available.
    pub const NO_QP: u16 = 1;
    /// Out of resources.
    pub const NO_RESOURCES: u16 = 3;
    /// The exchange timed out.
    pub const TIMEOUT: u16 = 4;
    /// Unsupported request.
    pub const UNSUPPORTED: u16 = 5;
    /// Unknown communication ID.
    pub const INVALID_COMM_ID: u16 = 6;
    /// Nothing listens on the service ID.
    pub const INVALID_SERVICE_ID: u16 = 8;
    /// The transport type is not served.
    pub const INVALID_TRANSPORT: u16 = 9;
    /// A REQ for a connection in time-wait.
    pub const STALE_CONN: u16 = 10;
    /// The REQ's vendor options (ECE) are not supported (`rdma_reject_ece`).
    pub const VENDOR_OPTION_NOT_SUPPORTED: u16 = 35;
    /// Rejected by the application.
    pub const CONSUMER: u16 = 28;
}

/// SIDR_REP status codes (IBA table 116).
pub mod sidr_status {
    /// The service answered.
    pub const OK: u8 = 0;
    /// Nothing serves the service ID.
    pub const UNSUPPORTED: u8 = 1;
    /// The service rejected the request.
    pub const REJECT: u8 = 2;
}

/// burst's ECE (Enhanced Connection Establishment) options: where the
/// kernel's CM carries `ibv_ece`, a vendor ID in the REQ and REP and the
/// options in the MAD header's attribute modifier. The kernel's CM and
/// RNICs hand another vendor's options to the application, which ignores
/// them, so everything here is agreed only between burst peers.
pub mod ece {
    /// burst's vendor ID.
    pub const VENDOR_ID: u32 = 0x00b0_57b0;
    /// The QPs repeat selectively (a transport option: the application's
    /// ECE, agreed by the rdma_cm layer).
    pub const SELECTIVE_REPEAT: u32 = 1;
    /// The CMs set the connection up in one round trip (a CM option, added
    /// and answered by [`Cm`](crate::Cm) itself, see
    /// [`CmConfig::fast_setup`](crate::CmConfig::fast_setup)).
    pub const FAST_SETUP: u32 = 1 << 1;

    /// Whether `e` is burst's and offers `option`.
    pub fn offers(e: &crate::CmEce, option: u32) -> bool {
        e.vendor_id == VENDOR_ID && e.options & option != 0
    }
}

/// Settings of a CM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmConfig {
    /// The CA GUID put in REQs and REPs (duplicate detection keys on it).
    pub ca_guid: u64,
    /// Seed of the communication IDs (pass a random one; fixed in tests).
    pub seed: u64,
    /// How long a sender waits for the answer to a REQ, REP, DREQ or
    /// SIDR_REQ before sending it again, as the IB exponent:
    /// 4.096 us * 2^t. Also put in REQs as both CM response timeouts.
    pub response_timeout: u8,
    /// Sends of one message after the first before giving up.
    pub max_retries: u8,
    /// How long a disconnected connection stays in time-wait (ns).
    pub time_wait_ns: u64,
    /// For this long after a service stops being listened on, a REQ for
    /// it is left unanswered (the requester sends it again) instead of
    /// rejected: an application that closes a listener and opens one on
    /// the same port (perftest's `-R`) is not refused in between.
    pub relisten_grace_ns: u64,
    /// REQs in flight to one peer at most (sent and not yet answered by a
    /// REP, REJ or give-up); more wait, unsent and with no timer running,
    /// until one is answered. A process opening thousands of connections
    /// to one peer at once would otherwise have most of its REQs outlive
    /// their timeout in the peer's queue and sent again (a storm that
    /// slows the peer further). The window a peer gets starts at 16 and
    /// adapts as TCP's does: one more per REQ answered within a quarter of
    /// its timeout, halved when a REQ has to be sent again; this is its
    /// ceiling. 0: no window.
    pub max_reqs_in_flight: u32,
    /// Offer and accept burst's one-round-trip setup ([`ece::FAST_SETUP`]
    /// in the REQ's and REP's ECE): the passive side is established when
    /// it sends its REP instead of at the RTU, so the whole setup takes
    /// one round trip where the IB CM takes one and a half. Its QP must
    /// not send before the active QP can receive (the RTU, or the first
    /// packet from the peer, says so: [`CmEvent::PeerReady`]). Against the
    /// kernel's CM and RNICs, which do not echo the option, nothing
    /// changes: the same REQ, REP and RTU, established at the RTU.
    pub fast_setup: bool,
}

impl CmConfig {
    /// Defaults: 268 ms response timeout (2^16), 15 retries (the kernel's
    /// rdma_cm count), 1 s time-wait, 256 REQs in flight per peer, fast
    /// setup offered.
    pub fn new(ca_guid: u64, seed: u64) -> CmConfig {
        CmConfig {
            ca_guid,
            seed,
            response_timeout: 16,
            max_retries: 15,
            time_wait_ns: 1_000_000_000,
            relisten_grace_ns: 2_000_000_000,
            max_reqs_in_flight: 256,
            fast_setup: true,
        }
    }
}

/// The IB timeout exponent `t` in nanoseconds (4.096 us * 2^t), capped at
/// 2^31 (about 2.4 hours).
pub fn timeout_ns(t: u8) -> u64 {
    4096u64 << t.min(31)
}

/// What went wrong with a request to the CM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CmError {
    /// No connection has this ID (never had, or it was released).
    #[error("no such connection")]
    NoSuchConn,
    /// The connection is not in a state that allows this.
    #[error("the connection is not in a state that allows this")]
    BadState,
    /// Something already listens on the service ID.
    #[error("the service ID is already listened on")]
    AddrInUse,
    /// A value does not fit its field.
    #[error("invalid value: {0}")]
    Invalid(&'static str),
}

impl CmError {
    /// The errno librdmacm returns for this error.
    pub fn errno(self) -> i32 {
        match self {
            CmError::NoSuchConn | CmError::Invalid(_) => 22, // EINVAL
            CmError::BadState => 22,
            CmError::AddrInUse => 98, // EADDRINUSE
        }
    }
}

/// A MAD to send to QP1 of `peer`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// The peer's address (its RoCEv2 GID).
    pub peer: IpAddr,
    /// The 256-byte MAD.
    pub mad: [u8; MAD_LEN],
}

/// What the application learns from the CM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEvent {
    /// A REQ for a listened service: answer with [`Cm::accept`] or
    /// [`Cm::reject`].
    Request {
        /// The new connection.
        conn: ConnId,
        /// Who asks.
        peer: IpAddr,
        /// The request as received.
        req: Box<CmReq>,
    },
    /// The REP to our REQ: ready the QP, then [`Cm::establish`].
    Reply {
        /// The connection.
        conn: ConnId,
        /// The reply as received.
        rep: Box<CmRep>,
    },
    /// The passive side's RTU arrived (or [`Cm::establish`] on it).
    Established {
        /// The connection.
        conn: ConnId,
    },
    /// A connection set up fast (established at [`Cm::accept`]): the RTU
    /// arrived, so the active side's QP receives; the passive QP may send
    /// from now on.
    PeerReady {
        /// The connection.
        conn: ConnId,
    },
    /// The peer rejected the REQ or REP.
    Rejected {
        /// The connection, now gone.
        conn: ConnId,
        /// The reject as received.
        rej: Box<CmRej>,
    },
    /// The peer never answered (every retry timed out); the connection
    /// is gone.
    Unreachable {
        /// The connection.
        conn: ConnId,
    },
    /// The connection is disconnected: the peer's DREQ (answered with a
    /// DREP), or the DREP (or its timeout) after our DREQ.
    Disconnected {
        /// The connection, now in time-wait.
        conn: ConnId,
    },
    /// Time-wait is over; the ID is free.
    TimeWaitExit {
        /// The connection.
        conn: ConnId,
    },
    /// A SIDR_REQ for a listened service: answer with [`Cm::sidr_reply`].
    SidrRequest {
        /// The exchange.
        conn: ConnId,
        /// Who asks.
        peer: IpAddr,
        /// The request as received.
        req: Box<CmSidrReq>,
    },
    /// The SIDR_REP to our SIDR_REQ.
    SidrReply {
        /// The exchange, now over.
        conn: ConnId,
        /// The reply as received.
        rep: Box<CmSidrRep>,
    },
}

/// Counts of what the CM received, sent and refused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CmCounters {
    /// MADs handled.
    pub rcvd: u64,
    /// MADs handed out to send (retransmissions included).
    pub sent: u64,
    /// Retransmissions.
    pub retransmits: u64,
    /// MADs that did not parse, or not a CM Send of class version 2.
    pub malformed: u64,
    /// Messages naming a communication ID we do not have (or in the wrong
    /// state), dropped or answered per the spec.
    pub unknown: u64,
    /// Duplicate REQs, REPs, DREQs and SIDR_REQs answered from the state.
    pub duplicates: u64,
    /// REJs sent.
    pub rejects_sent: u64,
    /// REJs received.
    pub rejects_rcvd: u64,
    /// Exchanges given up after the last retry.
    pub timeouts: u64,
    /// REQs left unanswered because their service was listened on a
    /// moment ago ([`CmConfig::relisten_grace_ns`]).
    pub deferred: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Active: REQ sent, waiting for REP (or MRA, REJ).
    ReqSent,
    /// Active: REP handed to the application, waiting for [`Cm::establish`].
    RepRcvd,
    /// Passive: REQ handed to the application.
    ReqRcvd,
    /// Passive: MRA sent for the REQ (the application is slow).
    MraSent,
    /// Passive: REP sent, waiting for RTU.
    RepSent,
    Established,
    DreqSent,
    TimeWait,
    /// Active SIDR: request sent.
    SidrReqSent,
    /// Passive SIDR: request handed to the application.
    SidrReqRcvd,
}

#[derive(Debug)]
struct Conn {
    state: State,
    peer: IpAddr,
    remote_id: u32,
    remote_guid: u64,
    remote_qpn: Qpn,
    /// Transaction ID of the exchange in progress.
    tid: u64,
    /// The last message we sent, for retransmission and for duplicates.
    last: Option<[u8; MAD_LEN]>,
    deadline: Option<u64>,
    retries_left: u8,
    /// The wait before the next retransmission.
    wait_ns: u64,
    /// The application gave the ID up: no more events.
    released: bool,
    /// A passive SIDR exchange's request ID (duplicates key on it).
    sidr_req_id: u32,
    /// A REQ counted in its peer's window (sent, not answered yet), and
    /// when it was first sent.
    paced: bool,
    sent_at: u64,
    /// A REQ waiting for room in its peer's window (built in `last`, not
    /// sent, no timer).
    queued: bool,
    /// Set up in one round trip ([`CmConfig::fast_setup`]): on the
    /// passive side, offered by the REQ (then established at the REP).
    fast: bool,
    /// Active: the transaction ID of a DREQ that came while the REP was
    /// with the application (the peer may end a connection it thinks up
    /// before our RTU: a fast setup is established at its REP), answered
    /// once the application establishes, so that ESTABLISHED comes before
    /// DISCONNECTED.
    dreq_held: Option<u64>,
}

/// A peer's REQ window: REQs in flight, how many may be, and those
/// waiting (by ID, oldest first; an ID no longer waiting is skipped when
/// reached).
#[derive(Debug)]
struct ReqWindow {
    in_flight: u32,
    limit: u32,
    waiting: VecDeque<u32>,
}

/// The window a peer starts with ([`CmConfig::max_reqs_in_flight`]).
const FIRST_REQ_WINDOW: u32 = 16;

impl ReqWindow {
    fn new(max: u32) -> ReqWindow {
        ReqWindow {
            in_flight: 0,
            limit: FIRST_REQ_WINDOW.min(max).max(1),
            waiting: VecDeque::new(),
        }
    }
}

/// The connection manager of one port (see the crate documentation).
#[derive(Debug)]
pub struct Cm {
    cfg: CmConfig,
    rng: u64,
    conns: HashMap<u32, Conn>,
    /// (peer's comm ID, peer's CA GUID) → ours: duplicate REQs.
    by_remote: HashMap<(u32, u64), u32>,
    /// (peer, SIDR request ID) → ours: duplicate SIDR_REQs.
    sidr_by_remote: HashMap<(IpAddr, u32), u32>,
    listeners: HashMap<u64, ()>,
    transmits: VecDeque<Transmit>,
    events: VecDeque<CmEvent>,
    counters: CmCounters,
    /// The latest time the CM was told (for calls that take none).
    now: u64,
    /// Services no longer listened on, and since when.
    unlistened: HashMap<u64, u64>,
    timers: Timers,
    /// Per peer: REQs in flight and waiting ([`CmConfig::max_reqs_in_flight`]).
    windows: HashMap<IpAddr, ReqWindow>,
}

/// Every connection's deadline, earliest first, so that arming a timer and
/// finding the next one cost O(log n) (with thousands of connections in
/// flight a scan of them all on each call was the CM's main cost).
#[derive(Debug, Default)]
struct Timers(BTreeSet<(u64, u32)>);

impl Timers {
    /// Moves connection `id`'s deadline from `*slot` to `at`.
    fn set(&mut self, id: u32, slot: &mut Option<u64>, at: Option<u64>) {
        if let Some(old) = slot.take() {
            self.0.remove(&(old, id));
        }
        if let Some(at) = at {
            self.0.insert((at, id));
        }
        *slot = at;
    }

    fn first(&self) -> Option<(u64, u32)> {
        self.0.first().copied()
    }
}

/// A REQ with the rdma_cm's usual values for an RC QP: fill in the rest
/// (path GIDs, MTU, resources, private data) before [`Cm::connect`].
pub fn req_template(service_id: u64, qpn: Qpn, starting_psn: Psn) -> CmReq {
    CmReq {
        local_comm_id: 0,
        service_id,
        local_ca_guid: 0,
        local_qkey: 0,
        local_qpn: qpn,
        responder_resources: 0,
        local_eecn: 0,
        initiator_depth: 0,
        remote_eecn: 0,
        remote_cm_response_timeout: 0,
        transport: CmTransport::Rc,
        end_to_end_flow_control: true,
        starting_psn,
        local_cm_response_timeout: 0,
        retry_count: 7,
        pkey: 0xffff,
        path_mtu: 3,
        rdc_exists: false,
        rnr_retry_count: 7,
        max_cm_retries: 0,
        srq: false,
        extended_transport_type: 0,
        primary_path: CmPath {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            hop_limit: 64,
            subnet_local: true,
            local_ack_timeout: 18,
            ..CmPath::default()
        },
        alternate_path: CmPath::default(),
        sap_supported: false,
        private_data: [0; 92],
        ece: CmEce::default(),
    }
}

/// A REP for an RC QP: fill in resources and private data before
/// [`Cm::accept`].
pub fn rep_template(qpn: Qpn, starting_psn: Psn) -> CmRep {
    CmRep {
        local_comm_id: 0,
        remote_comm_id: 0,
        local_qkey: 0,
        local_qpn: qpn,
        local_eecn: 0,
        starting_psn,
        responder_resources: 0,
        initiator_depth: 0,
        target_ack_delay: 0,
        failover_accepted: 0,
        end_to_end_flow_control: true,
        rnr_retry_count: 7,
        srq: false,
        local_ca_guid: 0,
        private_data: [0; 196],
        ece: CmEce::default(),
    }
}

/// A SIDR_REP with `status` naming QP `qpn` (0 when refusing) and its
/// Q_Key: set the service ID and private data before [`Cm::sidr_reply`].
pub fn sidr_rep_template(status: u8, qpn: Qpn, qkey: u32) -> CmSidrRep {
    CmSidrRep {
        request_id: 0,
        status,
        add_info_length: 0,
        qpn,
        service_id: 0,
        qkey,
        class_port_info: [0; 72],
        private_data: [0; 136],
    }
}

impl Cm {
    /// A CM with no connections.
    pub fn new(cfg: CmConfig) -> Cm {
        Cm {
            cfg,
            rng: cfg.seed ^ 0x9e37_79b9_7f4a_7c15,
            conns: HashMap::new(),
            by_remote: HashMap::new(),
            sidr_by_remote: HashMap::new(),
            listeners: HashMap::new(),
            now: 0,
            unlistened: HashMap::new(),
            timers: Timers::default(),
            windows: HashMap::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            counters: CmCounters::default(),
        }
    }

    /// The settings.
    pub fn config(&self) -> &CmConfig {
        &self.cfg
    }

    /// What the CM received, sent and refused.
    pub fn counters(&self) -> CmCounters {
        self.counters
    }

    /// Disconnect requests still waiting for their DREP (released IDs
    /// included). An embedded CM ends with its process: whoever ends it
    /// waits for these first (see [`Cm::resend_disconnects`]), or a lost
    /// DREQ leaves the peer connected to nobody.
    pub fn disconnects_pending(&self) -> usize {
        self.conns
            .values()
            .filter(|c| c.state == State::DreqSent)
            .count()
    }

    /// Sends every unanswered DREQ again now, ahead of its timer: a CM
    /// about to end cannot wait the peer's response timeout (hundreds of
    /// milliseconds to seconds) for a retransmission. The DREQ's own
    /// timer and retry count are unchanged (a peer answers a repeat with
    /// its DREP again).
    pub fn resend_disconnects(&mut self) {
        let ids: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| c.state == State::DreqSent)
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            self.counters.retransmits += 1;
            self.resend_last(id);
        }
    }

    /// Releases every connection as [`Cm::release`] does one: what the
    /// kernel's CM does for a process whose RDMA CM file closes (it
    /// exited or crashed without `rdma_destroy_id`). Established ones
    /// send a DREQ, half-made ones a REJ, so no peer is left connected
    /// to a QP that no longer exists (it would learn only when its
    /// retries ran out). Follow with [`Cm::disconnects_pending`] to wait
    /// for the DREPs.
    pub fn release_all(&mut self, now: u64) {
        let mut ids: Vec<u32> = self.conns.keys().copied().collect();
        // A fixed order (the map's is not): deterministic for the simulator.
        ids.sort_unstable();
        for id in ids {
            self.release(now, ConnId(id));
        }
    }

    /// Connections (and SIDR exchanges) alive, time-wait included.
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    /// Whether no connection is alive.
    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    fn next_random(&mut self) -> u64 {
        // splitmix64: deterministic from the seed, well spread.
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A fresh communication ID (never 0, never one in use).
    fn new_id(&mut self) -> u32 {
        loop {
            let id = self.next_random() as u32;
            if id != 0 && !self.conns.contains_key(&id) {
                return id;
            }
        }
    }

    /// Accept REQs and SIDR_REQs for `service_id`.
    pub fn listen(&mut self, service_id: u64) -> Result<(), CmError> {
        if self.listeners.insert(service_id, ()).is_some() {
            return Err(CmError::AddrInUse);
        }
        Ok(())
    }

    /// Stop accepting requests for `service_id` (connections already
    /// made from it stay).
    pub fn unlisten(&mut self, service_id: u64) {
        self.listeners.remove(&service_id);
        let now = self.now;
        let grace = self.cfg.relisten_grace_ns;
        self.unlistened
            .retain(|_, t| now.saturating_sub(*t) < grace);
        self.unlistened.insert(service_id, now);
    }

    fn wait_for(&self, peer_timeout: u8) -> u64 {
        // What the peer says it needs, plus our own response time as the
        // packet's round trip.
        timeout_ns(peer_timeout) + timeout_ns(self.cfg.response_timeout)
    }

    fn send(&mut self, peer: IpAddr, mad: &CmMad) -> [u8; MAD_LEN] {
        let mut buf = [0u8; MAD_LEN];
        // Every message this CM builds fits its fields (checked before).
        if mad.emit(&mut buf).is_ok() {
            self.counters.sent += 1;
            self.transmits.push_back(Transmit { peer, mad: buf });
        }
        buf
    }

    /// Sends `mad` on `conn` and arms its retransmission.
    fn send_reliably(&mut self, now: u64, id: u32, mad: &CmMad, wait_ns: u64) {
        let Some(peer) = self.conns.get(&id).map(|c| c.peer) else {
            return;
        };
        let bytes = self.send(peer, mad);
        let retries = self.cfg.max_retries;
        if let Some(c) = self.conns.get_mut(&id) {
            c.last = Some(bytes);
            c.wait_ns = wait_ns;
            let at = Some(now.saturating_add(wait_ns));
            self.timers.set(id, &mut c.deadline, at);
            c.retries_left = retries;
        }
    }

    /// Sends `mad` on `conn` once (answered later from `last` if the peer
    /// repeats itself).
    fn send_once(&mut self, id: u32, mad: &CmMad) {
        let Some(peer) = self.conns.get(&id).map(|c| c.peer) else {
            return;
        };
        let bytes = self.send(peer, mad);
        if let Some(c) = self.conns.get_mut(&id) {
            c.last = Some(bytes);
            self.timers.set(id, &mut c.deadline, None);
        }
    }

    fn resend_last(&mut self, id: u32) {
        if let Some(c) = self.conns.get(&id) {
            if let Some(mad) = c.last {
                let peer = c.peer;
                self.counters.sent += 1;
                self.transmits.push_back(Transmit { peer, mad });
            }
        }
    }

    fn conn(&mut self, id: ConnId) -> Result<&mut Conn, CmError> {
        match self.conns.get_mut(&id.0) {
            Some(c) if !c.released => Ok(c),
            _ => Err(CmError::NoSuchConn),
        }
    }

    fn event(&mut self, id: u32, ev: CmEvent) {
        if self.conns.get(&id).is_some_and(|c| !c.released) {
            self.events.push_back(ev);
        }
    }

    fn new_conn(&mut self, state: State, peer: IpAddr, tid: u64) -> u32 {
        let id = self.new_id();
        self.conns.insert(
            id,
            Conn {
                state,
                peer,
                remote_id: 0,
                remote_guid: 0,
                remote_qpn: Qpn::from_wire(0),
                tid,
                last: None,
                deadline: None,
                retries_left: 0,
                wait_ns: 0,
                released: false,
                sidr_req_id: 0,
                paced: false,
                sent_at: 0,
                queued: false,
                fast: false,
                dreq_held: None,
            },
        );
        id
    }

    /// Sends a REQ to `peer` (the CM fills in the communication ID, its CA
    /// GUID, the response timeouts and the retry count) and returns the
    /// new connection. Events: [`CmEvent::Reply`], [`CmEvent::Rejected`]
    /// or [`CmEvent::Unreachable`].
    pub fn connect(&mut self, now: u64, peer: IpAddr, mut req: CmReq) -> Result<ConnId, CmError> {
        if !matches!(req.transport, CmTransport::Rc | CmTransport::Uc) {
            return Err(CmError::Invalid("transport: only RC and UC connect"));
        }
        self.now = self.now.max(now);
        let tid = self.next_random();
        let id = self.new_conn(State::ReqSent, peer, tid);
        req.local_comm_id = id;
        req.local_ca_guid = self.cfg.ca_guid;
        req.remote_cm_response_timeout = self.cfg.response_timeout;
        req.local_cm_response_timeout = self.cfg.response_timeout;
        req.max_cm_retries = self.cfg.max_retries.min(15);
        if self.cfg.fast_setup {
            // Beside the application's own burst options, or alone.
            if req.ece.vendor_id == 0 {
                req.ece.vendor_id = ece::VENDOR_ID;
            }
            if req.ece.vendor_id == ece::VENDOR_ID {
                req.ece.options |= ece::FAST_SETUP;
            }
        }
        let wait = self.wait_for(self.cfg.response_timeout);
        let mad = CmMad::new(tid, CmMessage::Req(req));
        let max = self.cfg.max_reqs_in_flight;
        let w = self
            .windows
            .entry(peer)
            .or_insert_with(|| ReqWindow::new(max));
        if max > 0 && w.in_flight >= w.limit {
            // No room: built now, sent when an answer frees a place.
            let mut buf = [0u8; MAD_LEN];
            if mad.emit(&mut buf).is_err() {
                self.forget(id);
                return Err(CmError::Invalid("REQ fields"));
            }
            w.waiting.push_back(id);
            if let Some(c) = self.conns.get_mut(&id) {
                c.last = Some(buf);
                c.wait_ns = wait;
                c.queued = true;
            }
            return Ok(ConnId(id));
        }
        w.in_flight += 1;
        if let Some(c) = self.conns.get_mut(&id) {
            c.paced = true;
            c.sent_at = now;
        }
        self.send_reliably(now, id, &mad, wait);
        Ok(ConnId(id))
    }

    /// A REQ of the window was answered (REP, REJ), given up or released:
    /// its place goes to the next waiting REQ to the same peer.
    fn req_answered(&mut self, id: u32) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if !std::mem::take(&mut c.paced) {
            return;
        }
        let peer = c.peer;
        // Answered well within its timeout (and not sent again): the peer
        // keeps up, one more may be in flight.
        let quick = self.now.saturating_sub(c.sent_at) < c.wait_ns / 4
            && c.retries_left == self.cfg.max_retries;
        let max = self.cfg.max_reqs_in_flight;
        if let Some(w) = self.windows.get_mut(&peer) {
            w.in_flight = w.in_flight.saturating_sub(1);
            if quick {
                w.limit = (w.limit + 1).min(max.max(1));
            }
        }
        self.send_waiting(peer);
    }

    /// A REQ of `peer`'s window had to be sent again: the peer is slower
    /// than the window assumed, half as many in flight from now.
    fn req_resent(&mut self, peer: IpAddr) {
        if let Some(w) = self.windows.get_mut(&peer) {
            w.limit = (w.limit / 2).max(1);
        }
    }

    /// Sends waiting REQs to `peer` while its window has room.
    fn send_waiting(&mut self, peer: IpAddr) {
        let max = self.cfg.max_reqs_in_flight;
        let now = self.now;
        loop {
            let Some(w) = self.windows.get_mut(&peer) else {
                return;
            };
            if max > 0 && w.in_flight >= w.limit {
                return;
            }
            let Some(id) = w.waiting.pop_front() else {
                // Nothing in flight or waiting: the peer's entry goes.
                if w.in_flight == 0 {
                    self.windows.remove(&peer);
                }
                return;
            };
            let retries = self.cfg.max_retries;
            let Some(c) = self.conns.get_mut(&id) else {
                continue;
            };
            if !std::mem::take(&mut c.queued) {
                continue;
            }
            let Some(mad) = c.last else {
                continue;
            };
            c.paced = true;
            c.sent_at = now;
            c.retries_left = retries;
            let at = Some(now.saturating_add(c.wait_ns));
            self.timers.set(id, &mut c.deadline, at);
            w.in_flight += 1;
            self.counters.sent += 1;
            self.transmits.push_back(Transmit { peer, mad });
        }
    }

    /// Whether `conn`, a request received, is set up in one round trip
    /// (its REQ offered [`ece::FAST_SETUP`] and this CM accepts it): then
    /// [`Cm::accept`] establishes it at once, and its QP must wait for
    /// the peer before it sends (see [`CmConfig::fast_setup`]).
    pub fn is_fast(&self, conn: ConnId) -> bool {
        self.conns.get(&conn.0).is_some_and(|c| c.fast)
    }

    /// Sets `conn`, a request received, up the standard way even though
    /// its REQ offered the fast setup (the application cannot hold its
    /// QP back until the peer is ready).
    pub fn decline_fast(&mut self, conn: ConnId) {
        if let Some(c) = self.conns.get_mut(&conn.0) {
            c.fast = false;
        }
    }

    /// Answers the REQ of `conn` (a [`CmEvent::Request`]) with `rep`; the
    /// caller's QP must be ready first. Returns whether the connection is
    /// established now ([`Cm::is_fast`]: the REP confirms the fast setup,
    /// [`CmEvent::PeerReady`] follows the RTU); otherwise
    /// [`CmEvent::Established`] follows the RTU.
    pub fn accept(&mut self, now: u64, conn: ConnId, mut rep: CmRep) -> Result<bool, CmError> {
        let guid = self.cfg.ca_guid;
        let c = self.conn(conn)?;
        if !matches!(c.state, State::ReqRcvd | State::MraSent) {
            return Err(CmError::BadState);
        }
        c.state = State::RepSent;
        rep.local_comm_id = conn.0;
        rep.remote_comm_id = c.remote_id;
        rep.local_ca_guid = guid;
        if c.fast {
            if rep.ece.vendor_id == 0 {
                rep.ece.vendor_id = ece::VENDOR_ID;
            }
            if rep.ece.vendor_id == ece::VENDOR_ID {
                rep.ece.options |= ece::FAST_SETUP;
            } else {
                // The application answers with another vendor's options:
                // no room for ours, the standard exchange.
                c.fast = false;
            }
        }
        let fast = c.fast;
        let tid = c.tid;
        let wait = self.wait_for(self.cfg.response_timeout);
        self.send_reliably(now, conn.0, &CmMad::new(tid, CmMessage::Rep(rep)), wait);
        Ok(fast)
    }

    /// Rejects the REQ of `conn` (or, on the active side, the REP) with
    /// `reason` and up to 148 bytes of private data; the connection is
    /// gone.
    pub fn reject(
        &mut self,
        conn: ConnId,
        reason: u16,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        if private_data.len() > rdma::REJ_PRIVATE_DATA {
            return Err(CmError::Invalid("REJ private data longer than 148 bytes"));
        }
        let c = self.conn(conn)?;
        let rejected = match c.state {
            State::ReqRcvd | State::MraSent => 0,
            State::RepRcvd => 1,
            _ => return Err(CmError::BadState),
        };
        let (remote, tid) = (c.remote_id, c.tid);
        let mut rej = rej(conn.0, remote, rejected, reason);
        rej.private_data[..private_data.len()].copy_from_slice(private_data);
        self.send_once(conn.0, &CmMad::new(tid, CmMessage::Rej(rej)));
        self.counters.rejects_sent += 1;
        self.forget(conn.0);
        Ok(())
    }

    /// Active side, after [`CmEvent::Reply`] and the QP's move to RTS:
    /// sends the RTU with up to 224 bytes of private data. On the passive
    /// side (a REP sent, the RTU lost but data arriving), moves the
    /// connection to established as the spec's "communication
    /// established" event does.
    pub fn establish(&mut self, now: u64, conn: ConnId) -> Result<(), CmError> {
        let c = self.conn(conn)?;
        match c.state {
            State::RepRcvd => {
                c.state = State::Established;
                let (remote, tid, held) = (c.remote_id, c.tid, c.dreq_held.take());
                let rtu = CmIds {
                    local_comm_id: conn.0,
                    remote_comm_id: remote,
                    private_data: [0; 224],
                };
                self.send_once(conn.0, &CmMad::new(tid, CmMessage::Rtu(rtu)));
                if let Some(dreq_tid) = held {
                    self.answer_dreq(now, conn.0, dreq_tid, remote);
                }
                Ok(())
            }
            State::RepSent => {
                c.state = State::Established;
                let ev = rtu_event(c.fast, conn);
                let mut at = c.deadline.take();
                self.timers.set(conn.0, &mut at, None);
                self.event(conn.0, ev);
                Ok(())
            }
            State::Established => Ok(()),
            _ => Err(CmError::BadState),
        }
    }

    /// Sends a DREQ (up to 220 bytes of private data);
    /// [`CmEvent::Disconnected`] follows the DREP or the last timeout.
    /// Disconnecting what is already disconnecting is a no-op.
    pub fn disconnect(
        &mut self,
        now: u64,
        conn: ConnId,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        if private_data.len() > rdma::DREQ_PRIVATE_DATA {
            return Err(CmError::Invalid("DREQ private data longer than 220 bytes"));
        }
        let c = self.conn(conn)?;
        match c.state {
            State::Established | State::RepSent | State::RepRcvd => {}
            State::DreqSent | State::TimeWait => return Ok(()),
            _ => return Err(CmError::BadState),
        }
        c.state = State::DreqSent;
        let (remote, qpn) = (c.remote_id, c.remote_qpn);
        let tid = self.next_random();
        if let Some(c) = self.conns.get_mut(&conn.0) {
            c.tid = tid;
        }
        let mut dreq = CmDreq {
            local_comm_id: conn.0,
            remote_comm_id: remote,
            remote_qpn: qpn,
            private_data: [0; 220],
        };
        dreq.private_data[..private_data.len()].copy_from_slice(private_data);
        let wait = self.wait_for(self.cfg.response_timeout);
        self.send_reliably(now, conn.0, &CmMad::new(tid, CmMessage::Dreq(dreq)), wait);
        Ok(())
    }

    /// The application gave up `conn`: no more events for it. A REQ or
    /// REP in flight is rejected, an established connection disconnected
    /// (as the kernel's CM does when its ID is destroyed); the ID stays in
    /// time-wait long enough to answer the peer's repeats.
    pub fn release(&mut self, now: u64, conn: ConnId) {
        self.now = self.now.max(now);
        let Some(c) = self.conns.get(&conn.0) else {
            return;
        };
        match c.state {
            State::ReqSent => {
                // A REQ never sent (waiting for room) needs no REJ.
                if !c.queued {
                    self.reject_timeout(conn.0, 2);
                }
                self.forget(conn.0);
            }
            State::ReqRcvd | State::MraSent | State::RepRcvd => {
                let _ = self.reject(conn, reason::CONSUMER, &[]);
            }
            State::RepSent | State::Established => {
                let _ = self.disconnect(now, conn, &[]);
                if let Some(c) = self.conns.get_mut(&conn.0) {
                    c.released = true;
                }
            }
            State::SidrReqSent | State::SidrReqRcvd => self.forget(conn.0),
            State::DreqSent | State::TimeWait => {
                if let Some(c) = self.conns.get_mut(&conn.0) {
                    c.released = true;
                }
            }
        }
    }

    /// Sends a SIDR_REQ for `service_id` to `peer` (the CM fills in the
    /// request ID). Events: [`CmEvent::SidrReply`] or
    /// [`CmEvent::Unreachable`].
    pub fn sidr_request(
        &mut self,
        now: u64,
        peer: IpAddr,
        mut req: CmSidrReq,
    ) -> Result<ConnId, CmError> {
        let tid = self.next_random();
        let id = self.new_conn(State::SidrReqSent, peer, tid);
        req.request_id = id;
        let wait = self.wait_for(self.cfg.response_timeout);
        self.send_reliably(now, id, &CmMad::new(tid, CmMessage::SidrReq(req)), wait);
        Ok(ConnId(id))
    }

    /// Answers the SIDR_REQ of `conn` (a [`CmEvent::SidrRequest`]); the
    /// exchange is over (a repeated request gets the same answer for a
    /// time-wait).
    pub fn sidr_reply(
        &mut self,
        now: u64,
        conn: ConnId,
        mut rep: CmSidrRep,
    ) -> Result<(), CmError> {
        let c = self.conn(conn)?;
        if c.state != State::SidrReqRcvd {
            return Err(CmError::BadState);
        }
        rep.request_id = c.sidr_req_id;
        let tid = c.tid;
        self.send_once(conn.0, &CmMad::new(tid, CmMessage::SidrRep(rep)));
        self.enter_time_wait(now, conn.0);
        if let Some(c) = self.conns.get_mut(&conn.0) {
            c.released = true;
        }
        Ok(())
    }

    /// Sends REJ "timeout" for the message `rejected` names (1 REP, 2 other).
    fn reject_timeout(&mut self, id: u32, rejected: u8) {
        let Some((remote, tid)) = self.conns.get(&id).map(|c| (c.remote_id, c.tid)) else {
            return;
        };
        let mad = CmMad::new(
            tid,
            CmMessage::Rej(rej(id, remote, rejected, reason::TIMEOUT)),
        );
        self.send_once(id, &mad);
        self.counters.rejects_sent += 1;
    }

    fn enter_time_wait(&mut self, now: u64, id: u32) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = State::TimeWait;
            let at = Some(now.saturating_add(self.cfg.time_wait_ns));
            self.timers.set(id, &mut c.deadline, at);
        }
    }

    fn forget(&mut self, id: u32) {
        self.req_answered(id);
        if let Some(mut c) = self.conns.remove(&id) {
            self.timers.set(id, &mut c.deadline, None);
            if self.by_remote.get(&(c.remote_id, c.remote_guid)) == Some(&id) {
                self.by_remote.remove(&(c.remote_id, c.remote_guid));
            }
            if self.sidr_by_remote.get(&(c.peer, c.sidr_req_id)) == Some(&id) {
                self.sidr_by_remote.remove(&(c.peer, c.sidr_req_id));
            }
        }
    }

    /// The earliest deadline (a retransmission or the end of a
    /// time-wait), if any.
    #[must_use = "the deadline to call handle_timeout at"]
    pub fn poll_timeout(&self) -> Option<u64> {
        self.timers.first().map(|(at, _)| at)
    }

    /// Retransmits what waited too long, gives up what ran out of retries,
    /// ends time-waits.
    pub fn handle_timeout(&mut self, now: u64) {
        self.now = self.now.max(now);
        // Only what was due on entry: a retransmission armed here waits
        // for the next call, as with a scan.
        let due: Vec<u32> = self
            .timers
            .0
            .range(..=(now, u32::MAX))
            .map(|&(_, id)| id)
            .collect();
        for id in due {
            let Some(c) = self.conns.get_mut(&id) else {
                continue;
            };
            if c.state == State::TimeWait {
                let released = c.released;
                self.forget(id);
                if !released {
                    self.events
                        .push_back(CmEvent::TimeWaitExit { conn: ConnId(id) });
                }
                continue;
            }
            if c.retries_left > 0 {
                c.retries_left -= 1;
                let at = Some(now.saturating_add(c.wait_ns));
                self.timers.set(id, &mut c.deadline, at);
                self.counters.retransmits += 1;
                if c.paced {
                    let peer = c.peer;
                    self.req_resent(peer);
                }
                self.resend_last(id);
                continue;
            }
            // Out of retries.
            self.counters.timeouts += 1;
            let conn = ConnId(id);
            match c.state {
                State::DreqSent => {
                    // The peer is gone: disconnected all the same.
                    self.event(id, CmEvent::Disconnected { conn });
                    self.enter_time_wait(now, id);
                }
                // Set up fast and so already established, but the RTU
                // never came: the peer is gone, the connection with it.
                State::RepSent if c.fast => {
                    self.reject_timeout(id, 1);
                    self.event(id, CmEvent::Disconnected { conn });
                    self.enter_time_wait(now, id);
                }
                // No REP, or no RTU: tell the peer why (IBA 12.9.8.2:
                // REJ "timeout" naming the message) and give up.
                State::RepSent | State::ReqSent => {
                    let rejected = if c.state == State::RepSent { 1 } else { 2 };
                    self.reject_timeout(id, rejected);
                    self.event(id, CmEvent::Unreachable { conn });
                    self.forget(id);
                }
                _ => {
                    self.event(id, CmEvent::Unreachable { conn });
                    self.forget(id);
                }
            }
        }
    }

    /// The timer set holds exactly the connections' deadlines.
    #[cfg(test)]
    pub(crate) fn assert_timers_consistent(&self) {
        let from_conns: BTreeSet<(u64, u32)> = self
            .conns
            .iter()
            .filter_map(|(&id, c)| c.deadline.map(|d| (d, id)))
            .collect();
        assert_eq!(from_conns, self.timers.0);
    }

    /// The next MAD to send.
    #[must_use = "a packet not taken is never sent"]
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// Whether events wait for [`Cm::poll_event`].
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// The next event for the application.
    #[must_use = "an event not taken is lost"]
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// A MAD received on QP1 from `peer`. Anything malformed, unknown or
    /// out of place is counted and dropped, or answered as the spec says
    /// (a REJ for a REQ nobody listens for, a DREP for a DREQ we do not
    /// know); nothing a peer sends can fail the CM.
    pub fn handle_mad(&mut self, now: u64, peer: IpAddr, bytes: &[u8]) {
        self.now = self.now.max(now);
        self.counters.rcvd += 1;
        let mad = match CmMad::parse(bytes) {
            Ok(m)
                if m.header.class_version == CM_CLASS_VERSION && m.header.method == METHOD_SEND =>
            {
                m
            }
            _ => {
                self.counters.malformed += 1;
                return;
            }
        };
        let tid = mad.header.transaction_id;
        match mad.message {
            CmMessage::Req(req) => self.on_req(peer, tid, req),
            CmMessage::Mra(m) => self.on_mra(now, m),
            CmMessage::Rej(r) => self.on_rej(now, r),
            CmMessage::Rep(r) => self.on_rep(peer, tid, r),
            CmMessage::Rtu(r) => self.on_rtu(r),
            CmMessage::Dreq(d) => self.on_dreq(now, peer, tid, d),
            CmMessage::Drep(d) => self.on_drep(now, d),
            CmMessage::SidrReq(r) => self.on_sidr_req(peer, tid, r),
            CmMessage::SidrRep(r) => self.on_sidr_rep(r),
        }
    }

    fn reply_rej(&mut self, peer: IpAddr, tid: u64, remote: u32, rejected: u8, why: u16) {
        self.counters.rejects_sent += 1;
        self.send(
            peer,
            &CmMad::new(tid, CmMessage::Rej(rej(0, remote, rejected, why))),
        );
    }

    fn on_req(&mut self, peer: IpAddr, tid: u64, req: CmReq) {
        let key = (req.local_comm_id, req.local_ca_guid);
        if let Some(&id) = self.by_remote.get(&key) {
            self.counters.duplicates += 1;
            let Some(c) = self.conns.get_mut(&id) else {
                return;
            };
            match c.state {
                // The application is still deciding: ask the peer to wait.
                State::ReqRcvd => {
                    c.state = State::MraSent;
                    let mra = CmMra {
                        local_comm_id: id,
                        remote_comm_id: c.remote_id,
                        message_mraed: 0,
                        service_timeout: self.cfg.response_timeout.saturating_add(4).min(31),
                        private_data: [0; 222],
                    };
                    self.send_once(id, &CmMad::new(tid, CmMessage::Mra(mra)));
                }
                State::MraSent | State::RepSent => self.resend_last(id),
                State::TimeWait => {
                    let remote = c.remote_id;
                    self.reply_rej(peer, tid, remote, 0, reason::STALE_CONN);
                }
                _ => {}
            }
            return;
        }
        if !self.listeners.contains_key(&req.service_id) {
            let recent = self
                .unlistened
                .get(&req.service_id)
                .is_some_and(|&t| self.now.saturating_sub(t) < self.cfg.relisten_grace_ns);
            if recent {
                self.counters.deferred += 1;
                return;
            }
            self.reply_rej(peer, tid, req.local_comm_id, 0, reason::INVALID_SERVICE_ID);
            return;
        }
        if !matches!(req.transport, CmTransport::Rc | CmTransport::Uc) {
            self.reply_rej(peer, tid, req.local_comm_id, 0, reason::INVALID_TRANSPORT);
            return;
        }
        let id = self.new_conn(State::ReqRcvd, peer, tid);
        let fast = self.cfg.fast_setup && ece::offers(&req.ece, ece::FAST_SETUP);
        if let Some(c) = self.conns.get_mut(&id) {
            c.remote_id = req.local_comm_id;
            c.remote_guid = req.local_ca_guid;
            c.remote_qpn = req.local_qpn;
            c.fast = fast;
        }
        self.by_remote.insert(key, id);
        self.events.push_back(CmEvent::Request {
            conn: ConnId(id),
            peer,
            req: Box::new(req),
        });
    }

    fn on_mra(&mut self, now: u64, m: CmMra) {
        let Some(c) = self.conns.get_mut(&m.remote_comm_id) else {
            self.counters.unknown += 1;
            return;
        };
        let expected = match c.state {
            // An MRA for a REQ not sent yet is a stray.
            State::ReqSent if c.queued => {
                self.counters.unknown += 1;
                return;
            }
            State::ReqSent => 0,
            State::RepSent => 1,
            _ => {
                self.counters.unknown += 1;
                return;
            }
        };
        if m.message_mraed != expected {
            self.counters.unknown += 1;
            return;
        }
        // The peer needs longer: wait what it says, and start the retries
        // over from there.
        let wait = timeout_ns(m.service_timeout) + timeout_ns(self.cfg.response_timeout);
        c.wait_ns = wait;
        let at = Some(now.saturating_add(wait));
        self.timers.set(m.remote_comm_id, &mut c.deadline, at);
        c.retries_left = self.cfg.max_retries;
    }

    fn on_rej(&mut self, now: u64, r: CmRej) {
        let _ = now;
        self.counters.rejects_rcvd += 1;
        let Some(c) = self.conns.get(&r.remote_comm_id) else {
            self.counters.unknown += 1;
            return;
        };
        let id = r.remote_comm_id;
        match c.state {
            State::ReqSent | State::RepRcvd | State::RepSent | State::MraSent | State::ReqRcvd => {
                self.event(
                    id,
                    CmEvent::Rejected {
                        conn: ConnId(id),
                        rej: Box::new(r),
                    },
                );
                self.forget(id);
            }
            State::Established => {
                // A REJ after the RTU (the peer timed out waiting for it):
                // the connection is not usable any more.
                self.event(
                    id,
                    CmEvent::Rejected {
                        conn: ConnId(id),
                        rej: Box::new(r),
                    },
                );
                self.forget(id);
            }
            _ => self.counters.unknown += 1,
        }
    }

    fn on_rep(&mut self, peer: IpAddr, tid: u64, r: CmRep) {
        let Some(c) = self.conns.get_mut(&r.remote_comm_id) else {
            // IBA 12.6.9: a REP for no known request is rejected.
            self.counters.unknown += 1;
            self.reply_rej(peer, tid, r.local_comm_id, 1, reason::INVALID_COMM_ID);
            return;
        };
        match c.state {
            State::ReqSent if !c.queued => {
                c.state = State::RepRcvd;
                c.remote_id = r.local_comm_id;
                c.remote_guid = r.local_ca_guid;
                c.remote_qpn = r.local_qpn;
                self.timers.set(r.remote_comm_id, &mut c.deadline, None);
                let id = r.remote_comm_id;
                self.req_answered(id);
                self.event(
                    id,
                    CmEvent::Reply {
                        conn: ConnId(id),
                        rep: Box::new(r),
                    },
                );
            }
            // Our RTU was lost: send it again.
            State::Established if c.remote_id == r.local_comm_id => {
                self.counters.duplicates += 1;
                self.resend_last(r.remote_comm_id);
            }
            // A REP for a REQ still waiting for room was never asked for.
            State::ReqSent => self.counters.unknown += 1,
            _ => self.counters.duplicates += 1,
        }
    }

    fn on_rtu(&mut self, r: CmIds) {
        match self.conns.get_mut(&r.remote_comm_id) {
            Some(c) if c.state == State::RepSent && c.remote_id == r.local_comm_id => {
                c.state = State::Established;
                self.timers.set(r.remote_comm_id, &mut c.deadline, None);
                let id = r.remote_comm_id;
                let ev = rtu_event(c.fast, ConnId(id));
                self.event(id, ev);
            }
            _ => self.counters.unknown += 1,
        }
    }

    fn on_dreq(&mut self, now: u64, peer: IpAddr, tid: u64, d: CmDreq) {
        let known = self
            .conns
            .get(&d.remote_comm_id)
            .filter(|c| c.remote_id == d.local_comm_id)
            .map(|c| c.state);
        let id = d.remote_comm_id;
        match known {
            Some(State::RepRcvd) => {
                // The REP is with the application, which has not seen the
                // connection up yet: answered when it establishes (the
                // kernel's CM drops it and waits for the peer to send it
                // again).
                if let Some(c) = self.conns.get_mut(&id) {
                    c.dreq_held = Some(tid);
                }
            }
            Some(State::Established | State::RepSent | State::DreqSent) => {
                // Answered at once (the rdma_cm's applications may never
                // call rdma_disconnect on the passive side).
                self.answer_dreq(now, id, tid, d.local_comm_id);
            }
            Some(State::TimeWait) => {
                self.counters.duplicates += 1;
                self.send(peer, &drep(tid, id, d.local_comm_id));
            }
            _ => {
                // IBA 12.9.8.6: a DREQ for no connection still gets a DREP.
                self.counters.unknown += 1;
                self.send(peer, &drep(tid, 0, d.local_comm_id));
            }
        }
    }

    /// Answers a DREQ for connection `id` from the peer's `remote` ID:
    /// DREP, DISCONNECTED, time-wait.
    fn answer_dreq(&mut self, now: u64, id: u32, tid: u64, remote: u32) {
        self.send_once(id, &drep(tid, id, remote));
        self.event(id, CmEvent::Disconnected { conn: ConnId(id) });
        self.enter_time_wait(now, id);
    }

    fn on_drep(&mut self, now: u64, d: CmIds) {
        match self.conns.get(&d.remote_comm_id) {
            Some(c) if c.state == State::DreqSent => {
                let id = d.remote_comm_id;
                self.event(id, CmEvent::Disconnected { conn: ConnId(id) });
                self.enter_time_wait(now, id);
            }
            _ => self.counters.unknown += 1,
        }
    }

    fn on_sidr_req(&mut self, peer: IpAddr, tid: u64, r: CmSidrReq) {
        if let Some(&id) = self.sidr_by_remote.get(&(peer, r.request_id)) {
            self.counters.duplicates += 1;
            if self
                .conns
                .get(&id)
                .is_some_and(|c| c.state == State::TimeWait)
            {
                self.resend_last(id);
            }
            return;
        }
        if !self.listeners.contains_key(&r.service_id) {
            let rep = CmSidrRep {
                request_id: r.request_id,
                service_id: r.service_id,
                ..sidr_rep_template(sidr_status::UNSUPPORTED, Qpn::from_wire(0), 0)
            };
            self.send(peer, &CmMad::new(tid, CmMessage::SidrRep(rep)));
            return;
        }
        let id = self.new_conn(State::SidrReqRcvd, peer, tid);
        if let Some(c) = self.conns.get_mut(&id) {
            c.sidr_req_id = r.request_id;
        }
        self.sidr_by_remote.insert((peer, r.request_id), id);
        self.events.push_back(CmEvent::SidrRequest {
            conn: ConnId(id),
            peer,
            req: Box::new(r),
        });
    }

    fn on_sidr_rep(&mut self, r: CmSidrRep) {
        match self.conns.get(&r.request_id) {
            Some(c) if c.state == State::SidrReqSent => {
                let id = r.request_id;
                self.event(
                    id,
                    CmEvent::SidrReply {
                        conn: ConnId(id),
                        rep: Box::new(r),
                    },
                );
                self.forget(id);
            }
            _ => self.counters.unknown += 1,
        }
    }
}

/// A DREP answering transaction `tid`, from our ID `local` to the peer's
/// `remote`.
fn drep(tid: u64, local: u32, remote: u32) -> CmMad {
    CmMad::new(
        tid,
        CmMessage::Drep(CmIds {
            local_comm_id: local,
            remote_comm_id: remote,
            private_data: [0; 224],
        }),
    )
}

/// What the passive side learns when its RTU arrives (or the connection
/// is established without it): a fast connection was established at its
/// REP already, so only that the peer's QP is ready.
fn rtu_event(fast: bool, conn: ConnId) -> CmEvent {
    if fast {
        CmEvent::PeerReady { conn }
    } else {
        CmEvent::Established { conn }
    }
}

fn rej(local: u32, remote: u32, rejected: u8, why: u16) -> CmRej {
    CmRej {
        local_comm_id: local,
        remote_comm_id: remote,
        message_rejected: rejected,
        reject_info_length: 0,
        reason: why,
        ari: [0; 72],
        private_data: [0; 148],
    }
}

#[cfg(test)]
mod tests;
