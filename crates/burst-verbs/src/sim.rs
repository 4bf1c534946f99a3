//! The real data-plane core under the transport simulator's workload.
//!
//! [`CoreFabric`] is engines ([`Engine`], driven by the caller on a manual
//! clock) over an in-memory [`SimNet`]: the same post-time checks, rings,
//! demux, ICRC sealing and checking (with the IP ID hidden on half the
//! seeds, as a UDP socket hides it), UD GRH, memory registration and
//! access checks (burst-mem), copies and completion delivery that burst
//! runs on a real network, driven on simulated time by
//! `burst_transport::sim::run_workload_on`. So the seed sweep checks what
//! ships, not a model of it.
//!
//! ```
//! use burst_transport::sim::{Faults, WorkloadOptions};
//! let o = WorkloadOptions {
//!     faults: Faults { loss: 0.02, ..Faults::default() },
//!     ops_per_pair: 8,
//!     max_size: 64 << 10,
//!     ..WorkloadOptions::default()
//! };
//! let s = burst_verbs::sim::run_workload(3, &o).unwrap();
//! assert!(s.ops > 0);
//! ```

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;

use burst_io::{SimFaults, SimNet, SimPort};
use burst_mem::{Access, MrTable, Pd};
use burst_transport::sim::stream::{StreamOptions, StreamSummary};
use burst_transport::sim::{
    connect_attrs, connection_ends, run_workload_on, Fabric, Faults, NetStats, Summary,
    WorkloadOptions, LINK_DELAY_NS, LINK_GBPS,
};
use burst_transport::{Nanos, QpAttr, QpState, QpType, RecvWr, SendWr, VerbsError, WorkCompletion};
use burst_wire::{Mtu, Psn, Qpn};

use crate::clock::Clock;
use crate::engine::{Context, CqId, Drive, Engine, EngineOptions, PostError};
use crate::QpInit;

/// Every access right (local write, remote write, read, atomic).
const ALL: Access = Access(1 | 2 | 4 | 8);

/// Engines over a [`SimNet`], as a [`Fabric`].
pub struct CoreFabric {
    // Declared first so the engines (which hold registrations of the
    // regions below) drop before the regions' memory is freed.
    /// Kept for ownership: dropping an engine stops it.
    _engines: Vec<Engine>,
    ctxs: Vec<Context>,
    net: SimNet,
    pds: Vec<Pd>,
    /// (node, QPN, CQ) of each QP index (one CQ per QP).
    qps: Vec<(usize, Qpn, CqId)>,
    completions: Vec<VecDeque<WorkCompletion>>,
    /// Registered memory per node, by key (lkey = rkey: every right).
    regions: Vec<HashMap<u32, Box<[u8]>>>,
    /// Each device's memory-region table (seeded keys).
    mrs: Vec<Arc<MrTable>>,
    ahs: HashMap<(usize, usize), u32>,
    now: Nanos,
    violation: Option<String>,
}

impl std::fmt::Debug for CoreFabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CoreFabric(t={} ns, {:?})", self.now, self.ctxs)
    }
}

/// The address of node `n`.
fn node_addr(n: usize) -> SocketAddr {
    SocketAddr::from(([198, 18, 0, 10 + n as u8], burst_wire::ROCEV2_PORT))
}

impl CoreFabric {
    /// `nodes` devices on a network with `faults`; `hide_ip_id` makes the
    /// ports hide IP IDs as UDP sockets do (the ICRC check then solves for
    /// them).
    pub fn new(seed: u64, nodes: usize, faults: SimFaults) -> CoreFabric {
        let net = SimNet::new(seed, faults);
        // Seeded keys and (in `register`) addresses chosen here rather than
        // by the allocator: a seed replays exactly.
        let mrs: Vec<Arc<MrTable>> = (0..nodes)
            .map(|n| Arc::new(MrTable::seeded(seed ^ (n as u64 + 1) << 40)))
            .collect();
        let engines: Vec<Engine> = mrs
            .iter()
            .enumerate()
            .map(|(n, m)| sim_engine(net.port(node_addr(n)), Mtu::Mtu4096, Arc::clone(m)))
            .collect();
        let ctxs: Vec<Context> = engines.iter().map(Engine::context).collect();
        CoreFabric {
            mrs,
            pds: ctxs.iter().map(|c| c.alloc_pd()).collect(),
            regions: (0..nodes).map(|_| HashMap::new()).collect(),
            _engines: engines,
            ctxs,
            net,
            qps: Vec::new(),
            completions: Vec::new(),
            ahs: HashMap::new(),
            now: 0,
            violation: None,
        }
    }

    /// The engines' contexts, one per node.
    pub fn contexts(&self) -> &[Context] {
        &self.ctxs
    }

    /// The network.
    pub fn net(&self) -> &SimNet {
        &self.net
    }
}

impl Fabric for CoreFabric {
    fn add_qp(&mut self, node: usize, qp_type: QpType, _mtu: Mtu) -> usize {
        let init = QpInit::new(qp_type, self.pds[node]);
        let c = &self.ctxs[node];
        // Room for every completion of the QP's work requests.
        let cq = c.create_cq(2 * init.caps.max_send_wr.max(init.caps.max_recv_wr) as usize);
        let qpn = c
            .create_qp_with(&init, cq, cq)
            .expect("default sizes are within the device limits")
            .qpn();
        self.qps.push((node, qpn, cq));
        self.completions.push(VecDeque::new());
        self.qps.len() - 1
    }

    fn connect(
        &mut self,
        a: usize,
        b: Option<usize>,
        mtu: Mtu,
        psn_a: Psn,
        psn_b: Psn,
    ) -> Result<(), VerbsError> {
        for (me, peer) in connection_ends(a, b, psn_a, psn_b) {
            let (node, qpn, _) = self.qps[me];
            let t = self.ctxs[node]
                .query_qp(qpn)
                .map(|(_, c)| c.qp_type)
                .map_err(|_| VerbsError::BadWr("no such QP"))?;
            let my_psn = peer.map_or(Psn::new(0), |p| p.1);
            let peer = match peer {
                Some((p, _, peer_psn)) => {
                    let (pnode, pqpn, _) = self.qps[p];
                    Some((self.ah(node, pnode), pqpn, peer_psn))
                }
                None => None,
            };
            for attr in connect_attrs(t, mtu, my_psn, peer) {
                self.ctxs[node]
                    .modify_qp(qpn, &attr)
                    .map_err(verbs_error)??;
            }
        }
        Ok(())
    }

    fn node_of(&self, qp: usize) -> usize {
        self.qps[qp].0
    }

    fn set_selective_repeat(&mut self, qp: usize, on: bool) -> Result<(), VerbsError> {
        let (node, qpn, _) = self.qps[qp];
        let state = self.qp_state(qp);
        let attr = QpAttr {
            state: Some(state),
            selective_repeat: Some(on),
            ..QpAttr::default()
        };
        self.ctxs[node].modify_qp(qpn, &attr).map_err(verbs_error)?
    }

    fn qpn(&self, qp: usize) -> Qpn {
        self.qps[qp].1
    }

    fn qp_state(&self, qp: usize) -> QpState {
        let (node, qpn, _) = self.qps[qp];
        self.ctxs[node]
            .query_qp(qpn)
            .map_or(QpState::Err, |(s, _)| s)
    }

    fn ah(&mut self, from: usize, to: usize) -> u32 {
        let gid = self.ctxs[to].gid();
        let c = &self.ctxs[from];
        *self
            .ahs
            .entry((from, to))
            .or_insert_with(|| c.create_ah(gid).expect("the engine runs"))
    }

    fn register(&mut self, node: usize, len: usize) -> (u32, u64) {
        let mut buf = vec![0u8; len.max(1)].into_boxed_slice();
        // Remote addresses as the transport model's: 4 GiB apart per region.
        let iova = 0x1000_0000_0000 + (self.regions[node].len() as u64 + 1) * 0x1_0000_0000;
        // SAFETY: the buffer is kept in `regions` (a boxed slice: moving the
        // box does not move the bytes) until the fabric drops, after the
        // devices that hold the registration (field order).
        let keys = unsafe {
            self.mrs[node]
                .register(self.pds[node], buf.as_mut_ptr(), len.max(1), iova, ALL)
                .expect("registration within the device's limits")
        };
        self.regions[node].insert(keys.lkey, buf);
        (keys.lkey, keys.addr)
    }

    fn bytes(&self, node: usize, key: u32) -> &[u8] {
        &self.regions[node][&key]
    }

    fn bytes_mut(&mut self, node: usize, key: u32) -> &mut [u8] {
        self.regions[node]
            .get_mut(&key)
            .expect("a key register returned")
    }

    fn post_send(&mut self, qp: usize, wr: SendWr) -> Result<(), VerbsError> {
        let (node, qpn, _) = self.qps[qp];
        self.ctxs[node].post_send(qpn, &wr).map_err(verbs_error)
    }

    fn post_recv(&mut self, qp: usize, wr: RecvWr) -> Result<(), VerbsError> {
        let (node, qpn, _) = self.qps[qp];
        self.ctxs[node].post_recv(qpn, &wr).map_err(verbs_error)
    }

    fn run(&mut self, deadline: Nanos, done: &mut dyn FnMut(&mut Self) -> bool) -> bool {
        loop {
            self.net.set_now(self.now);
            let mut moved = false;
            for c in &self.ctxs {
                c.advance_clock_to(self.now);
                moved |= c.progress();
            }
            for (i, &(node, _, cq)) in self.qps.iter().enumerate() {
                while let Some(wc) = self.ctxs[node].take_completion(cq) {
                    self.completions[i].push_back(wc);
                }
            }
            if let Some(e) = self.ctxs.iter().find_map(|c| c.check_invariants().err()) {
                self.violation = Some(format!("at {} ns: {e}", self.now));
                return false;
            }
            if done(self) {
                return true;
            }
            if moved {
                continue;
            }
            let next = self
                .ctxs
                .iter()
                .filter_map(Context::next_timeout)
                .chain(self.net.next_event())
                .min();
            let Some(next) = next else {
                return done(self);
            };
            self.now = next.max(self.now + 1);
            if self.now > deadline {
                return false;
            }
        }
    }

    fn completions(&mut self, qp: usize) -> &mut VecDeque<WorkCompletion> {
        &mut self.completions[qp]
    }

    fn send_queue_len(&self, qp: usize) -> usize {
        let (node, qpn, _) = self.qps[qp];
        self.ctxs[node].send_queue_len(qpn).unwrap_or(0)
    }

    fn now(&self) -> Nanos {
        self.now
    }

    fn net_stats(&self) -> NetStats {
        let s = self.net.stats();
        let refused: u64 = self
            .ctxs
            .iter()
            .filter_map(|c| c.counters().ok())
            .map(|c| c.icrc_errors + c.malformed)
            .sum();
        NetStats {
            sent: s.sent,
            lost: s.lost,
            duplicated: s.duplicated,
            reordered: s.reordered,
            corrupted: s.corrupted,
            bad_icrc: refused,
            delivered: s.delivered,
            overflowed: s.overflowed,
        }
    }

    fn qp_counters(&self) -> burst_transport::Counters {
        let mut sum = burst_transport::Counters::default();
        for c in self.ctxs.iter().filter_map(|c| c.counters().ok()) {
            sum.add(&c.qps);
        }
        sum
    }

    fn describe_qps(&self) -> Vec<String> {
        self.ctxs.iter().flat_map(Context::describe_qps).collect()
    }

    fn violation(&self) -> Option<String> {
        self.violation.clone()
    }
}

/// An engine over `port` that the caller drives on a manual clock.
fn sim_engine(port: SimPort, mtu: Mtu, mrs: Arc<MrTable>) -> Engine {
    let mut o = EngineOptions::new(mtu);
    o.mrs = mrs;
    o.drive = Drive::Caller;
    o.clock = Clock::manual();
    // The copy backend under test (`cargo xtask sweep --copy NAME`).
    o.copy = crate::config::CopyConfig::from_vars(|k| std::env::var(k).ok(), o.copy)
        .unwrap_or_else(|e| panic!("{e}"));
    Engine::with_port(port, o).expect("an engine over a simulated port needs no system resource")
}

/// A front-end error as the transport's (what the workload checks).
fn verbs_error(e: PostError) -> VerbsError {
    match e {
        PostError::Refused(v) => v,
        PostError::Full => VerbsError::QueueFull,
        _ => VerbsError::BadWr("the engine refused the call"),
    }
}

/// Runs one seeded workload through two real engines over a [`SimNet`]
/// with the faults of `o` (the IP ID hidden from receivers on odd seeds)
/// and checks it, as `burst_transport::sim::run_workload` does over the
/// transport model.
pub fn run_workload(seed: u64, o: &WorkloadOptions) -> Result<Summary, String> {
    let mut fab = CoreFabric::new(seed, 2, sim_faults(seed, &o.faults));
    run_workload_on(&mut fab, seed, o)
}

/// Streams WRITEs through two real engines over a [`SimNet`] with the
/// faults of `o`, as `burst_transport::sim::run_stream` does over the
/// transport model (goodput under loss, both repeat modes).
pub fn run_stream(seed: u64, o: &StreamOptions) -> Result<StreamSummary, String> {
    let mut fab = CoreFabric::new(seed, 2, sim_faults(seed, &o.faults));
    burst_transport::sim::stream::run_stream(&mut fab, seed, o)
}

/// The in-memory network's faults for the simulator's `f` (the IP ID
/// hidden from receivers on odd seeds).
pub fn sim_faults(seed: u64, f: &Faults) -> SimFaults {
    SimFaults {
        loss: f.loss,
        reorder: f.reorder,
        dup: f.dup,
        corrupt: f.corrupt,
        delay_ns: LINK_DELAY_NS,
        jitter_ns: 200,
        link_gbps: LINK_GBPS,
        tx_queue_ns: 20_000,
        rx_gbps: f.rx_gbps,
        rx_queue: f.rx_queue,
        ecn_threshold: 0,
        ecn_max: 0,
        ecn_pmax: 0.0,
        hide_ip_id: seed % 2 == 1,
    }
}

/// Bytes of guard memory on each side of the harness's registered region.
const GUARD: usize = 4096;
/// The harness's registered region.
const REGION: usize = 64 << 10;
/// The canary byte the guard memory holds.
const CANARY: u8 = 0xa5;

/// The receive path under arbitrary input: an [`Engine`] with live RC, UC
/// and UD QPs (receives posted, memory registered inside guard memory)
/// takes frames from a peer on a [`SimNet`]. Used by the `rx` fuzz target
/// (`crates/burst-verbs/fuzz`) and by tests; [`RxHarness::check`] states
/// what must hold after any input.
pub struct RxHarness {
    // Declared first: the engine holds a registration of `mem`.
    engine: Engine,
    ctx: Context,
    peer: SimPort,
    net: SimNet,
    /// Guard, region, guard; only the middle is registered.
    mem: Box<[u8]>,
    rkey: u32,
    va: u64,
    qpns: [Qpn; 3],
    cq: CqId,
    now: Nanos,
    frames: u64,
    /// Contained faults (QP or device fatal events): bugs all the same.
    faults: Vec<crate::AsyncEvent>,
}

impl std::fmt::Debug for RxHarness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RxHarness({} frames, {:?})", self.frames, self.ctx)
    }
}

impl Default for RxHarness {
    fn default() -> Self {
        RxHarness::new()
    }
}

impl RxHarness {
    /// A device at 198.18.0.2 with an RC and a UC QP connected to QPN
    /// 0x100 at 198.18.0.1 (first PSN 0) and a UD QP (Q_Key 0x11111111),
    /// eight receives posted on each, and 64 KiB registered with every right.
    pub fn new() -> RxHarness {
        let net = SimNet::new(1, SimFaults::default());
        let peer = net.port(node_addr(0));
        let mrs = Arc::new(MrTable::seeded(1));
        let engine = sim_engine(net.port(node_addr(1)), Mtu::Mtu1024, Arc::clone(&mrs));
        let ctx = engine.context();
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(256);
        let mut mem = vec![CANARY; GUARD + REGION + GUARD].into_boxed_slice();
        mem[GUARD..GUARD + REGION].fill(0);
        // SAFETY: `mem` is kept (boxed: its bytes never move) until the
        // harness drops, after the device (field order).
        let keys = unsafe {
            mrs.register(pd, mem.as_mut_ptr().add(GUARD), REGION, 0x10_0000, ALL)
                .expect("a fresh table registers")
        };
        let peer_gid = crate::gid_of(node_addr(0).ip());
        let ah = ctx.create_ah(peer_gid).expect("the engine runs");
        let mut qpns = [Qpn::default(); 3];
        for (i, t) in [QpType::Rc, QpType::Uc, QpType::Ud].into_iter().enumerate() {
            // Small queues: the fuzz target builds a harness per input.
            let mut init = QpInit::new(t, pd);
            init.caps.max_send_wr = 16;
            init.caps.max_recv_wr = 16;
            let qpn = ctx
                .create_qp_with(&init, cq, cq)
                .expect("default sizes are within the device limits")
                .qpn();
            let peer =
                (t != QpType::Ud).then(|| (ah, Qpn::new(0x100).unwrap_or_default(), Psn::new(0)));
            for attr in connect_attrs(t, Mtu::Mtu1024, Psn::new(0), peer) {
                ctx.modify_qp(qpn, &attr)
                    .expect("the engine runs")
                    .expect("a valid connection sequence");
            }
            for r in 0..8u64 {
                let wr = RecvWr {
                    wr_id: r,
                    sg_list: [burst_transport::Sge {
                        addr: keys.addr + r * 4096,
                        length: 4096,
                        lkey: keys.lkey,
                    }]
                    .into(),
                };
                ctx.post_recv(qpn, &wr).expect("room for eight receives");
            }
            qpns[i] = qpn;
        }
        RxHarness {
            engine,
            ctx,
            cq,
            peer,
            net,
            mem,
            rkey: keys.rkey,
            va: keys.addr,
            qpns,
            now: 0,
            frames: 0,
            faults: Vec::new(),
        }
    }

    /// Feeds `data`, read as records `[kind, len_lo, len_hi, bytes...]`:
    /// an even `kind` sends `bytes` as a frame as they are; an odd one
    /// builds a valid packet of opcode `Opcode::ALL[kind / 2 % n]` for the
    /// QP of its transport (addresses and keys inside the registered
    /// region), XORs `bytes` over it and seals its ICRC, so mutations reach
    /// the transport past the ICRC check. The device steps after each.
    pub fn feed(&mut self, data: &[u8]) {
        let mut rest = data;
        while rest.len() >= 3 {
            let kind = rest[0];
            let len = (usize::from(rest[1]) | usize::from(rest[2]) << 8).min(rest.len() - 3);
            let bytes = &rest[3..3 + len];
            rest = &rest[3 + len..];
            let frame = if kind % 2 == 0 {
                bytes.to_vec()
            } else {
                self.mutated(kind / 2, bytes)
            };
            self.send(&frame);
        }
        // Let timers and responses run out.
        for _ in 0..4 {
            self.step(1_000_000);
        }
    }

    fn mutated(&self, pick: u8, mask: &[u8]) -> Vec<u8> {
        let all = burst_wire::Opcode::ALL;
        let op = all[usize::from(pick) % all.len()];
        let Some(info) = op.info() else {
            return mask.to_vec();
        };
        let qpn = match info.transport {
            burst_wire::Transport::Rc => self.qpns[0],
            burst_wire::Transport::Uc => self.qpns[1],
            _ => self.qpns[2],
        };
        let mut ib = burst_wire::IbRepr::new(burst_wire::BthRepr::new(op, qpn, Psn::new(0)));
        let h = info.headers;
        use burst_wire::HeaderSet;
        if h.contains(HeaderSet::DETH) {
            ib.deth = Some(burst_wire::DethRepr {
                qkey: 0x1111_1111,
                src_qp: Qpn::new(0x100).unwrap_or_default(),
            });
        }
        if h.contains(HeaderSet::RETH) {
            ib.reth = Some(burst_wire::RethRepr {
                virtual_address: self.va + 512,
                rkey: self.rkey,
                dma_length: 256,
            });
        }
        if h.contains(HeaderSet::ATOMIC_ETH) {
            ib.atomic_eth = Some(burst_wire::AtomicEthRepr {
                virtual_address: self.va + 4096,
                rkey: self.rkey,
                swap_add: 1,
                compare: 0,
            });
        }
        if h.contains(HeaderSet::AETH) {
            ib.aeth = Some(burst_wire::AethRepr {
                syndrome: burst_wire::Syndrome::from_byte(0x1f),
                msn: 0,
            });
        }
        if h.contains(HeaderSet::ATOMIC_ACK_ETH) {
            ib.atomic_ack = Some(7);
        }
        if h.contains(HeaderSet::IMM_DT) {
            ib.imm = Some(0x1234);
        }
        if h.contains(HeaderSet::IETH) {
            ib.ieth = Some(self.rkey);
        }
        ib.payload_len = if info.has_payload { 256 } else { 0 };
        let mut buf = vec![0u8; ib.buffer_len()];
        if ib.emit(&mut buf).is_err() {
            return mask.to_vec();
        }
        let covered = buf.len().saturating_sub(burst_wire::ICRC_LEN);
        for (b, m) in buf[..covered].iter_mut().zip(mask) {
            *b ^= m;
        }
        buf
    }

    fn send(&mut self, frame: &[u8]) {
        let mut b = burst_io::PacketBuf::new();
        let n = frame.len().min(b.data.len());
        b.data[..n].copy_from_slice(&frame[..n]);
        b.len = n;
        b.peer = node_addr(1);
        use burst_io::Port;
        self.peer.assign_ip_ids(std::slice::from_mut(&mut b));
        // Seal what can be sealed: too short a frame goes as it is.
        let _ = burst_io::seal(self.peer.local_addr(), b.peer, &mut b.data[..n], b.ip_id);
        if self.peer.send_burst(std::slice::from_ref(&b)).unwrap_or(0) == 1 {
            self.frames += 1;
        }
        self.step(10_000);
    }

    fn step(&mut self, dt: Nanos) {
        use burst_io::Port;
        self.now += dt;
        self.net.set_now(self.now);
        self.ctx.advance_clock_to(self.now);
        self.ctx.progress();
        while let Some(e) = self.ctx.take_async_event() {
            // A fault inside burst is a bug; the transport's own events
            // (an access error a hostile packet caused, COMM_EST...) are not.
            if matches!(
                e,
                crate::AsyncEvent::Qp(_, crate::QpEvent::Fatal) | crate::AsyncEvent::DeviceFatal
            ) {
                self.faults.push(e);
            }
        }
        // Completions are read and dropped.
        while self.ctx.take_completion(self.cq).is_some() {}
        // Whatever the device answers is read and dropped.
        let mut rx = burst_io::RxBatch::new(4);
        while self.peer.recv_batch(&mut rx).is_ok_and(|n| n > 0) {}
    }

    /// What must hold after any input: no fault inside the data plane (a
    /// contained panic still fails the check), no byte outside the
    /// registered region changed, and the counters account for every frame (each one
    /// was malformed, refused by its ICRC, for no QP, or handled by a QP).
    pub fn check(&self) -> Result<(), String> {
        if !self.faults.is_empty() {
            return Err(format!(
                "faults contained (bugs all the same): {:?}",
                self.faults
            ));
        }
        let (lo, hi) = (&self.mem[..GUARD], &self.mem[GUARD + REGION..]);
        if let Some(i) = lo.iter().chain(hi).position(|&b| b != CANARY) {
            return Err(format!(
                "guard byte {i} outside the registered region was written"
            ));
        }
        let c = self.counters();
        if c.rcvd_pkts != self.frames {
            return Err(format!(
                "{} frames sent, {} received",
                self.frames, c.rcvd_pkts
            ));
        }
        // QP1's MADs go to the connection manager's queue, counted there
        // (nothing is sent on QP1 here, so its drops are receive drops).
        let gsi = self.ctx.gsi().map(|g| g.counters()).unwrap_or_default();
        let accounted = c.malformed
            + c.icrc_errors
            + c.no_qp
            + c.qps.rcvd_pkts
            + c.cc.cnp_rcvd
            + gsi.rcvd
            + gsi.malformed
            + gsi.dropped;
        if accounted != c.rcvd_pkts {
            return Err(format!(
                "{} frames received, {accounted} accounted for: {c:?}",
                c.rcvd_pkts
            ));
        }
        Ok(())
    }

    /// Frames fed so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// The device's counters.
    pub fn counters(&self) -> crate::DeviceCounters {
        self.ctx.counters().expect("the engine runs")
    }

    /// The engine under test.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }
}
