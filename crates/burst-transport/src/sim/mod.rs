//! A deterministic, seeded network simulator for the transport, and a
//! workload generator with a checker.
//!
//! [`World`] holds nodes (each with its own [`SimMemory`]) and QPs, moves the
//! packets they emit as real RoCEv2 bytes (built with burst-wire, ICRC
//! included) through a network that loses, reorders, duplicates, delays and
//! corrupts them (corruption is caught by the ICRC and acts as loss), and
//! drives every QP's timers. [`run_workload`] posts a mixed workload over QP
//! pairs and proves every message arrived once, intact, in order, with the
//! completions the spec demands, by a bounded simulated time.

pub mod stream;
#[cfg(feature = "sweep")]
pub mod sweep;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::Ipv4Addr;

use burst_wire::{FrameRepr, IpRepr, Mtu, Psn, Qpn, RoceFrame, UdpRepr};

use crate::memory::{
    check_invalidate, check_remote_access, walk_sges, AtomicOp, MemError, Memory, QpScope,
    RemoteAccess, RemoteRegion,
};
use crate::*;

/// The fault injector's random draws: the n-th draw is
/// `mix(mix(n) ^ seed)` with splitmix64's mixer, as burst-io's `SimNet`
/// draws. Plain splitmix64 (`mix(seed + n * gamma)`) let a retransmission
/// loop that makes the same number of draws per round sample correlated
/// states: a READ's replay lost its first response 7 rounds in a row at
/// 8.5% loss (model sweep seed 1514; the core sweep's seed 9603 before).
#[derive(Debug, Clone)]
pub struct Rng {
    seed: u64,
    draws: u64,
}

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Rng {
        Rng {
            seed: seed ^ 0x9e37_79b9_7f4a_7c15,
            draws: 0,
        }
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        fn mix(mut z: u64) -> u64 {
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        self.draws = self.draws.wrapping_add(1);
        mix(mix(self.draws) ^ self.seed)
    }
    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// Access rights of a simulated memory region.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Access {
    /// LOCAL_WRITE.
    pub local_write: bool,
    /// REMOTE_WRITE.
    pub remote_write: bool,
    /// REMOTE_READ.
    pub remote_read: bool,
    /// REMOTE_ATOMIC.
    pub remote_atomic: bool,
}

impl Access {
    /// Every right.
    pub const ALL: Access = Access {
        local_write: true,
        remote_write: true,
        remote_read: true,
        remote_atomic: true,
    };
}

#[derive(Debug)]
struct Region {
    pd: u32,
    addr: u64,
    data: Vec<u8>,
    access: Access,
    valid: bool,
    /// A fast-registered MR or memory window (SEND WITH INVALIDATE may
    /// invalidate it), not a plain MR.
    invalidatable: bool,
}

impl Region {
    /// What the shared remote-access check sees of it.
    fn remote(&self) -> RemoteRegion {
        RemoteRegion {
            pd: self.pd,
            iova: self.addr,
            len: self.data.len() as u64,
            remote_write: self.access.remote_write,
            remote_read: self.access.remote_read,
            remote_atomic: self.access.remote_atomic,
            invalidatable: self.invalidatable,
            qpn: None,
        }
    }
}

/// A node's memory: regions with one key serving as both lkey and rkey.
#[derive(Debug, Default)]
pub struct SimMemory {
    regions: HashMap<u32, Region>,
    next_key: u32,
}

impl SimMemory {
    /// Registers `len` bytes (zeroed) for `pd`; returns (key, address).
    pub fn register(&mut self, pd: u32, len: usize, access: Access) -> (u32, u64) {
        self.next_key += 1;
        let key = (self.next_key << 8) | 0x5a;
        let addr = 0x1000_0000_0000 + u64::from(self.next_key) * 0x1_0000_0000;
        self.regions.insert(
            key,
            Region {
                pd,
                addr,
                data: vec![0; len],
                access,
                valid: true,
                invalidatable: false,
            },
        );
        (key, addr)
    }

    /// [`SimMemory::register`] as a region SEND WITH INVALIDATE may
    /// invalidate (a fast-registered MR or memory window; a plain MR may
    /// not be, as in burst-mem and RXE).
    pub fn register_invalidatable(&mut self, pd: u32, len: usize, access: Access) -> (u32, u64) {
        let (key, addr) = self.register(pd, len, access);
        if let Some(r) = self.regions.get_mut(&key) {
            r.invalidatable = true;
        }
        (key, addr)
    }
    /// A region's bytes.
    ///
    /// # Panics
    /// If `key` was not returned by [`SimMemory::register`] (test support).
    pub fn bytes(&self, key: u32) -> &[u8] {
        &self.regions[&key].data
    }
    /// A region's bytes, mutable.
    ///
    /// # Panics
    /// If `key` was not returned by [`SimMemory::register`] (test support).
    pub fn bytes_mut(&mut self, key: u32) -> &mut [u8] {
        &mut self.regions.get_mut(&key).expect("registered").data
    }
    /// The live region `key` names.
    fn live(&self, key: u32) -> Result<&Region, MemError> {
        self.regions
            .get(&key)
            .filter(|r| r.valid)
            .ok_or(MemError::BadKey(key))
    }

    fn range(&self, key: u32, va: u64, len: u64) -> Result<(&Region, usize), MemError> {
        let r = self
            .regions
            .get(&key)
            .filter(|r| r.valid)
            .ok_or(MemError::BadKey(key))?;
        let off = va.checked_sub(r.addr).ok_or(MemError::OutOfBounds)?;
        if off.checked_add(len).is_none_or(|e| e > r.data.len() as u64) {
            return Err(MemError::OutOfBounds);
        }
        Ok((r, off as usize))
    }
}

impl Memory for SimMemory {
    fn check_local(&self, pd: u32, sges: &[Sge], write: bool) -> Result<(), MemError> {
        for s in sges {
            let (r, _) = self.range(s.lkey, s.addr, u64::from(s.length))?;
            if r.pd != pd {
                return Err(MemError::PdMismatch);
            }
            if write && !r.access.local_write {
                return Err(MemError::NoAccess);
            }
        }
        Ok(())
    }
    fn read_local(
        &self,
        pd: u32,
        sges: &[Sge],
        offset: u64,
        out: &mut [u8],
    ) -> Result<(), MemError> {
        let n = out.len() as u64;
        walk_sges(sges, offset, n, |sge, va, at, len| {
            let k = sge.lkey;
            let (r, off) = self.range(k, va, len as u64)?;
            if r.pd != pd {
                return Err(MemError::PdMismatch);
            }
            out[at..at + len].copy_from_slice(&r.data[off..off + len]);
            Ok(())
        })
    }
    fn write_local(
        &mut self,
        pd: u32,
        sges: &[Sge],
        offset: u64,
        data: &[u8],
    ) -> Result<(), MemError> {
        let n = data.len() as u64;
        let mut plan = Vec::new();
        walk_sges(sges, offset, n, |sge, va, at, len| {
            let k = sge.lkey;
            let (r, off) = self.range(k, va, len as u64)?;
            if r.pd != pd {
                return Err(MemError::PdMismatch);
            }
            if !r.access.local_write {
                return Err(MemError::NoAccess);
            }
            plan.push((k, off, at, len));
            Ok(())
        })?;
        for (k, off, at, len) in plan {
            self.bytes_mut(k)[off..off + len].copy_from_slice(&data[at..at + len]);
        }
        Ok(())
    }
    fn check_remote(
        &self,
        qp: QpScope,
        rkey: u32,
        va: u64,
        len: u64,
        access: RemoteAccess,
    ) -> Result<(), MemError> {
        let r = self.live(rkey)?;
        check_remote_access(&r.remote(), qp, va, len, access).map(|_| ())
    }
    fn read_remote(&self, rkey: u32, va: u64, out: &mut [u8]) -> Result<(), MemError> {
        let (r, off) = self.range(rkey, va, out.len() as u64)?;
        out.copy_from_slice(&r.data[off..off + out.len()]);
        Ok(())
    }
    fn write_remote(&mut self, rkey: u32, va: u64, data: &[u8]) -> Result<(), MemError> {
        let (_, off) = self.range(rkey, va, data.len() as u64)?;
        self.bytes_mut(rkey)[off..off + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn atomic(&mut self, qp: QpScope, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, MemError> {
        self.check_remote(qp, rkey, va, 8, op.access())?;
        let (_, off) = self.range(rkey, va, 8)?;
        let cell = &mut self.bytes_mut(rkey)[off..off + 8];
        let orig = u64::from_ne_bytes(cell.try_into().map_err(|_| MemError::OutOfBounds)?);
        cell.copy_from_slice(&op.apply(orig).to_ne_bytes());
        Ok(orig)
    }
    fn invalidate(&mut self, qp: QpScope, rkey: u32) -> Result<(), MemError> {
        check_invalidate(&self.live(rkey)?.remote(), qp)?;
        if let Some(r) = self.regions.get_mut(&rkey) {
            r.valid = false;
        }
        Ok(())
    }
}

/// Fault probabilities per packet.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Faults {
    /// Drop.
    pub loss: f64,
    /// Delay by up to 20 extra link delays (overtaken by later packets).
    pub reorder: f64,
    /// Deliver twice.
    pub dup: f64,
    /// Flip one bit (the ICRC catches it).
    pub corrupt: f64,
    /// Packets a node's receive queue holds: a packet arriving while this
    /// many are on the wire toward the node is dropped, as by a full socket
    /// buffer (0: no limit).
    pub rx_queue: usize,
    /// The rate at which a node takes packets in, Gb/s (0: as fast as they
    /// come): a receiver slower than the link builds a queue.
    pub rx_gbps: u64,
}

/// Network statistics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Frames sent.
    pub sent: u64,
    /// Frames dropped by loss.
    pub lost: u64,
    /// Frames duplicated.
    pub duplicated: u64,
    /// Frames delayed out of order.
    pub reordered: u64,
    /// Frames corrupted (then refused by the ICRC check).
    pub corrupted: u64,
    /// Frames refused by the receiver's parser or ICRC check.
    pub bad_icrc: u64,
    /// Frames delivered to a QP.
    pub delivered: u64,
    /// Frames dropped by a full receive queue ([`Faults::rx_queue`]).
    pub overflowed: u64,
}

/// A frame on the wire: (arrival time, sequence, destination node, bytes).
type InFlight = (Nanos, u64, usize, Vec<u8>);

/// One end of a connection: (QP index, peer (QP index, my PSN, peer PSN)).
pub type End = (usize, Option<(usize, Psn, Psn)>);

/// The ends [`Fabric::connect`] sets up: both QPs of an RC/UC pair, each
/// with its peer and the two first PSNs, or a lone UD QP.
pub fn connection_ends(a: usize, b: Option<usize>, psn_a: Psn, psn_b: Psn) -> Vec<End> {
    match b {
        Some(b) => vec![(a, Some((b, psn_a, psn_b))), (b, Some((a, psn_b, psn_a)))],
        None => vec![(a, None)],
    }
}

/// Work planned on one QP pair: (requester, responder, transport, posted
/// sends, receives as (wr_id, buffer key)).
type Plan = (usize, usize, QpType, Vec<Posted>, Vec<(u64, u32)>);

/// Link rate of every node, in Gb/s (bits per nanosecond).
pub const LINK_GBPS: u64 = 100;

/// One link delay in simulated nanoseconds.
pub const LINK_DELAY_NS: Nanos = 2_000;

/// Nodes, QPs and the network between them.
#[derive(Debug)]
pub struct World {
    /// Simulated time.
    pub now: Nanos,
    /// Memory of each node.
    pub mems: Vec<SimMemory>,
    /// QPs and the node each lives on.
    pub qps: Vec<(usize, Qp)>,
    /// Completions polled from each QP (index as in `qps`).
    pub completions: Vec<VecDeque<WorkCompletion>>,
    /// Each QP's congestion window (index as in `qps`).
    cc: Vec<burst_cc::LossWindow>,
    /// Shared receive queues and the node each lives on.
    pub srqs: Vec<(usize, Srq)>,
    /// The SRQ (index in `srqs`) each QP receives from, if any.
    qp_srq: Vec<Option<usize>>,
    /// Network statistics.
    pub stats: NetStats,
    faults: Faults,
    rng: Rng,
    seq: u64,
    wire: BinaryHeap<Reverse<InFlight>>,
    /// Targeted drops: (opcode, how many more to drop).
    drops: Vec<(burst_wire::Opcode, u32)>,
    /// Packets dropped by [`World::drop_next`].
    pub dropped_by_rule: u64,
    /// When each node's link is free to start the next frame (100 Gb/s).
    link_free: Vec<Nanos>,
    /// Last in-order delivery time per destination: links are FIFO unless a
    /// packet is deliberately reordered.
    fifo: Vec<Nanos>,
    buf: Vec<u8>,
    /// The first broken QP invariant [`World::run`] saw ([`Qp::check_invariants`]).
    pub violation: Option<String>,
    /// Every frame sent, as (destination node, bytes), when `Some`: tests
    /// that replay a frame ([`World::inject`]) turn it on.
    pub sent_log: Option<Vec<(usize, Vec<u8>)>>,
}

fn node_ip(n: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 0, 10 + n as u8)
}

impl World {
    /// A world of `nodes` nodes.
    pub fn new(seed: u64, nodes: usize, faults: Faults) -> World {
        World {
            now: 0,
            mems: (0..nodes).map(|_| SimMemory::default()).collect(),
            qps: Vec::new(),
            completions: Vec::new(),
            cc: Vec::new(),
            srqs: Vec::new(),
            qp_srq: Vec::new(),
            stats: NetStats::default(),
            faults,
            rng: Rng::new(seed),
            seq: 0,
            wire: BinaryHeap::new(),
            drops: Vec::new(),
            dropped_by_rule: 0,
            fifo: vec![0; nodes],
            link_free: vec![0; nodes],
            buf: vec![0; 8192],
            violation: None,
            sent_log: None,
        }
    }

    /// QP `qp`'s congestion window (index as in `qps`): what its path
    /// events told congestion control.
    pub fn loss_window(&self, qp: usize) -> &burst_cc::LossWindow {
        &self.cc[qp]
    }

    /// Drops the next `count` packets with `opcode` (targeted fault injection).
    pub fn drop_next(&mut self, opcode: burst_wire::Opcode, count: u32) {
        self.drops.push((opcode, count));
    }

    /// Puts `bytes` (a whole IP frame, as in [`World::sent_log`]) on the
    /// wire toward `node` now, as a duplicate the network made.
    pub fn inject(&mut self, node: usize, bytes: Vec<u8>) {
        self.seq += 1;
        self.wire
            .push(Reverse((self.now + LINK_DELAY_NS, self.seq, node, bytes)));
    }

    /// Adds a QP on `node`; returns its index.
    pub fn add_qp(&mut self, node: usize, qp_type: QpType, port_mtu: Mtu) -> usize {
        let qpn = Qpn::new(0x100 + self.qps.len() as u32).unwrap_or_default();
        let mut cfg = QpConfig::new(qpn, qp_type, 1);
        cfg.port_mtu = port_mtu;
        self.qps.push((node, Qp::new(cfg)));
        self.cc.push(burst_cc::LossWindow::new(
            burst_cc::LossWindowConfig::default(),
        ));
        self.completions.push(VecDeque::new());
        self.qp_srq.push(None);
        self.qps.len() - 1
    }

    /// Adds a shared receive queue on `node` (PD 1); returns its index.
    pub fn add_srq(&mut self, node: usize, max_wr: u32) -> usize {
        self.srqs.push((node, Srq::new(1, max_wr, 4)));
        self.srqs.len() - 1
    }

    /// Adds a QP on `node` that receives from SRQ `srq`; returns its index.
    pub fn add_qp_on_srq(
        &mut self,
        node: usize,
        qp_type: QpType,
        port_mtu: Mtu,
        srq: usize,
    ) -> usize {
        let qpn = Qpn::new(0x100 + self.qps.len() as u32).unwrap_or_default();
        let mut cfg = QpConfig::new(qpn, qp_type, 1);
        cfg.port_mtu = port_mtu;
        cfg.srq = true;
        self.qps.push((node, Qp::new(cfg)));
        self.cc.push(burst_cc::LossWindow::new(
            burst_cc::LossWindowConfig::default(),
        ));
        self.completions.push(VecDeque::new());
        self.qp_srq.push(Some(srq));
        self.qps.len() - 1
    }

    /// Connects two RC or UC QPs (RESET → INIT → RTR → RTS on both), or moves
    /// a UD QP to RTS when `b` is `None`.
    pub fn connect(
        &mut self,
        a: usize,
        b: Option<usize>,
        mtu: Mtu,
        psn_a: Psn,
        psn_b: Psn,
    ) -> Result<(), VerbsError> {
        for (me, peer) in connection_ends(a, b, psn_a, psn_b) {
            let t = self.qps[me].1.config().qp_type;
            let my_psn = peer.map_or(Psn::new(0), |p| p.1);
            let peer =
                peer.map(|(p, _, peer_psn)| (self.qps[p].0 as u32, self.qps[p].1.qpn(), peer_psn));
            for attr in connect_attrs(t, mtu, my_psn, peer) {
                self.qps[me].1.modify(&attr)?;
            }
        }
        Ok(())
    }

    fn transmit_all(&mut self) -> bool {
        let mut any = false;
        for i in 0..self.qps.len() {
            let node = self.qps[i].0;
            // Each QP is its own path here, under a loss window (the data
            // plane shares one per peer).
            let ev = self.qps[i].1.take_path_events();
            ev.feed(self.now, &mut self.cc[i]);
            let room = burst_cc::Controller::window(&self.cc[i])
                .map(|w| w.saturating_sub(u64::from(self.qps[i].1.packets_in_flight())) as u32);
            self.qps[i].1.set_request_credit(room);
            loop {
                // Each node's link serialises its frames at LINK_RATE: the
                // network holds a bandwidth-delay product, not a whole READ.
                if self.link_free[node] > self.now {
                    break;
                }
                let (_, qp) = &mut self.qps[i];
                let src_qpn = qp.qpn();
                let Some(tx) = qp.poll_transmit(self.now) else {
                    break;
                };
                any = true;
                let dst = tx.ah as usize;
                let f = FrameRepr {
                    eth: None,
                    ip: IpRepr::v4(node_ip(node), node_ip(dst)),
                    udp: UdpRepr::new(0xc000 | (src_qpn.value() as u16 & 0x3fff)),
                    ib: tx.ib,
                };
                let len = f.frame_len();
                if self.buf.len() < len {
                    self.buf.resize(len, 0);
                }
                let at = f.payload_offset();
                let ok = tx
                    .gather(&self.mems[node], &mut self.buf[at..at + tx.ib.payload_len])
                    .is_ok()
                    && f.emit_in_place(&mut self.buf[..len]).is_ok();
                if !ok {
                    continue;
                }
                if let Some(d) = self
                    .drops
                    .iter_mut()
                    .find(|d| d.0 == tx.ib.bth.opcode && d.1 > 0)
                {
                    d.1 -= 1;
                    self.dropped_by_rule += 1;
                    continue;
                }
                let bytes = self.buf[..len].to_vec();
                if let Some(log) = &mut self.sent_log {
                    log.push((dst, bytes.clone()));
                }
                self.link_free[node] = self.now + (len as u64 * 8).div_ceil(LINK_GBPS);
                self.send(dst, bytes);
            }
            self.qps[i].1.flush_unreliable();
        }
        any
    }

    fn send(&mut self, dst: usize, mut bytes: Vec<u8>) {
        self.stats.sent += 1;
        let f = self.faults;
        if self.rng.chance(f.loss) {
            self.stats.lost += 1;
            return;
        }
        if f.rx_queue > 0
            && self
                .wire
                .iter()
                .filter(|Reverse((_, _, d, _))| *d == dst)
                .count()
                >= f.rx_queue
        {
            self.stats.overflowed += 1;
            return;
        }
        if self.rng.chance(f.corrupt) {
            self.stats.corrupted += 1;
            let i = self.rng.below(bytes.len() as u64) as usize;
            bytes[i] ^= 1 << self.rng.below(8);
        }
        let copies = if self.rng.chance(f.dup) {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        for c in 0..copies {
            let mut at = self.now + LINK_DELAY_NS + self.rng.below(200);
            if c > 0 || self.rng.chance(f.reorder) {
                self.stats.reordered += u64::from(c == 0);
                at += LINK_DELAY_NS * (1 + self.rng.below(20));
            } else {
                let service = match f.rx_gbps {
                    0 => 1,
                    g => (bytes.len() as u64 * 8).div_ceil(g),
                };
                at = at.max(self.fifo[dst] + service);
                self.fifo[dst] = at;
            }
            self.seq += 1;
            self.wire.push(Reverse((at, self.seq, dst, bytes.clone())));
        }
    }

    fn deliver_due(&mut self) -> bool {
        let mut any = false;
        while self
            .wire
            .peek()
            .is_some_and(|Reverse((t, ..))| *t <= self.now)
        {
            let Some(Reverse((_, _, dst, bytes))) = self.wire.pop() else {
                break;
            };
            any = true;
            let frame = match RoceFrame::parse_ip(&bytes) {
                Ok(f) if f.verify_icrc().is_ok() => f,
                _ => {
                    self.stats.bad_icrc += 1;
                    continue;
                }
            };
            let qpn = frame.ib.bth().dest_qp();
            let grh = frame.ud_grh();
            let Some(i) = self
                .qps
                .iter()
                .position(|(n, q)| *n == dst && q.qpn() == qpn)
            else {
                continue;
            };
            self.stats.delivered += 1;
            let now = self.now;
            let (node, qp) = &mut self.qps[i];
            let mem = &mut self.mems[*node];
            match self.qp_srq[i] {
                Some(s) => {
                    qp.handle_packet_srq(now, &frame.ib, Some(&grh), mem, &mut self.srqs[s].1)
                }
                None => qp.handle_packet(now, &frame.ib, Some(&grh), mem),
            }
        }
        any
    }

    fn drain_completions(&mut self) {
        for (i, (_, qp)) in self.qps.iter_mut().enumerate() {
            while let Some(wc) = qp.poll_completion() {
                self.completions[i].push_back(wc);
            }
        }
    }

    /// Runs the world until `done` holds or simulated time passes `deadline`;
    /// `done` is called after every step (it may post more work). Returns
    /// whether `done` held.
    pub fn run(&mut self, deadline: Nanos, mut done: impl FnMut(&mut World) -> bool) -> bool {
        loop {
            let sent = self.transmit_all();
            let delivered = self.deliver_due();
            let mut fired = false;
            for (_, qp) in self.qps.iter_mut() {
                if qp.poll_timeout().is_some_and(|t| t <= self.now) {
                    qp.handle_timeout(self.now);
                    fired = true;
                }
            }
            self.drain_completions();
            if let Some(broken) = self
                .qps
                .iter()
                .find_map(|(_, q)| q.check_invariants().err())
            {
                self.violation = Some(format!("at {} ns: {broken}", self.now));
                return false;
            }
            if done(self) {
                return true;
            }
            if sent || delivered || fired {
                continue;
            }
            // Idle: jump to the next event.
            let next_pkt = self.wire.peek().map(|Reverse((t, ..))| *t);
            let next_timer = self.qps.iter().filter_map(|(_, q)| q.poll_timeout()).min();
            let next_link = self
                .link_free
                .iter()
                .copied()
                .filter(|&t| t > self.now)
                .min();
            let next_timer = match (next_timer, next_link) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let next = match (next_pkt, next_timer) {
                (Some(a), Some(b)) => a.min(b),
                (a, b) => match a.or(b) {
                    Some(t) => t,
                    None => return done(self),
                },
            };
            self.now = next.max(self.now + 1);
            if self.now > deadline {
                return false;
            }
        }
    }
}

/// Largest message of the UC and UD pairs.
const UNRELIABLE_MAX: usize = 64 * 1024;

/// Options of a workload run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WorkloadOptions {
    /// Network faults.
    pub faults: Faults,
    /// RC QP pairs.
    pub rc_pairs: usize,
    /// Operations posted per RC pair.
    pub ops_per_pair: usize,
    /// Largest message (a few operations per run use sizes near it).
    pub max_size: usize,
    /// Run UC and UD pairs too.
    pub unreliable: bool,
    /// Which ends of the RC pairs repeat selectively.
    pub repeat: Repeat,
    /// Simulated time limit.
    pub deadline: Nanos,
}

impl Default for WorkloadOptions {
    fn default() -> Self {
        WorkloadOptions {
            faults: Faults::default(),
            rc_pairs: 2,
            ops_per_pair: 40,
            max_size: 3 << 20,
            unreliable: true,
            repeat: Repeat::BySeed,
            deadline: 60_000_000_000,
        }
    }
}

/// Which ends of a workload's RC pairs repeat selectively
/// ([`QpAttr::selective_repeat`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repeat {
    /// Each pair by the seed and its index: go-back-N at both ends,
    /// selective at both, or at the requester or the responder only (a
    /// burst end facing an RNIC that never negotiated it).
    BySeed,
    /// Go-back-N at both ends (what RXE and RNICs do).
    GoBackN,
    /// Selective at both ends (two burst peers that negotiated it).
    Selective,
    /// Selective at the requester only.
    RequesterOnly,
    /// Selective at the responder only.
    ResponderOnly,
}

impl Repeat {
    /// (requester, responder) of pair `i` of seed `seed`.
    fn ends(self, seed: u64, i: usize) -> (bool, bool) {
        match self {
            Repeat::GoBackN => (false, false),
            Repeat::Selective => (true, true),
            Repeat::RequesterOnly => (true, false),
            Repeat::ResponderOnly => (false, true),
            Repeat::BySeed => match (seed.wrapping_add(i as u64)) % 4 {
                0 => (false, false),
                1 => (true, true),
                2 => (true, false),
                _ => (false, true),
            },
        }
    }

    /// The command-line word ([`Repeat::parse`]).
    pub fn name(self) -> &'static str {
        match self {
            Repeat::BySeed => "by-seed",
            Repeat::GoBackN => "go-back-n",
            Repeat::Selective => "selective",
            Repeat::RequesterOnly => "requester-only",
            Repeat::ResponderOnly => "responder-only",
        }
    }

    /// Parses [`Repeat::name`].
    pub fn parse(s: &str) -> Option<Repeat> {
        [
            Repeat::BySeed,
            Repeat::GoBackN,
            Repeat::Selective,
            Repeat::RequesterOnly,
            Repeat::ResponderOnly,
        ]
        .into_iter()
        .find(|r| r.name() == s)
    }
}

/// Outcome of a workload run.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Summary {
    /// Operations completed and checked.
    pub ops: u64,
    /// Bytes moved by checked operations.
    pub bytes: u64,
    /// Simulated nanoseconds the run took.
    pub sim_ns: Nanos,
    /// Network statistics.
    pub net: NetStats,
    /// Retransmitted packets over all QPs.
    pub retransmitted: u64,
    /// A requester spent its retry count ([`SIM_RETRY_CNT`]) and failed
    /// with `RetryExcErr`: what go-back-N, the spec and an RNIC do when
    /// every round of a retry chain is lost. The run ended there (its peer
    /// cannot know and keeps its receives); the data was not checked.
    pub retry_exhausted: bool,
    /// How many retry chains of this run were expected to spend the whole
    /// count: chains x p^[`SIM_RETRY_CNT`], with p the run's share of
    /// retry rounds that repeated one without progress
    /// ([`crate::Counters::retry_rounds_repeated`]). A sweep compares the
    /// runs that did with the sum of these.
    pub retry_exhaust_expected: f64,
}

/// The transport retry count of the simulator's RC QPs (the Verbs maximum
/// and perftest's default).
pub const SIM_RETRY_CNT: u8 = 7;

impl Summary {
    fn count_retries(&mut self, c: &Counters) {
        let rounds = c.retry_rounds as f64;
        if rounds > 0.0 {
            let p = c.retry_rounds_repeated as f64 / rounds;
            let chains = rounds - c.retry_rounds_repeated as f64;
            self.retry_exhaust_expected = chains * p.powi(i32::from(SIM_RETRY_CNT));
        }
    }
}

fn fill(rng: &mut Rng, buf: &mut [u8]) {
    for c in buf.chunks_mut(8) {
        let v = rng.next_u64().to_le_bytes();
        c.copy_from_slice(&v[..c.len()]);
    }
}

fn hash(b: &[u8]) -> u64 {
    // FNV-1a: a content fingerprint, not a security hash.
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[derive(Debug)]
enum Expect {
    /// A SEND: the receiver must get these bytes (and immediate) next.
    Send {
        hash: u64,
        len: usize,
        imm: Option<u32>,
    },
    /// A WRITE: the remote region must hold these bytes; WRITE WITH IMM also
    /// consumes a receive.
    Write {
        region: u32,
        hash: u64,
        imm: Option<u32>,
        len: usize,
    },
    /// A READ: the local region must hold the remote bytes.
    Read { local: u32, hash: u64, len: usize },
    /// An atomic: the original value returned.
    Atomic { local: u32, orig: u64 },
}

struct Posted {
    wr_id: u64,
    signaled: bool,
    expect: Expect,
    opcode: WcOpcode,
}

/// Two nodes, their QPs and memory, and a network between them: what
/// [`run_workload_on`] drives. [`World`] is the transport model; the real
/// data plane over an in-memory port implements it too (burst-verbs), so
/// one workload and one checker exercise both. QPs and nodes are indices;
/// memory keys serve as both lkey and rkey.
pub trait Fabric {
    /// Adds a QP in RESET on `node`; returns its index.
    fn add_qp(&mut self, node: usize, qp_type: QpType, mtu: Mtu) -> usize;
    /// Connects QPs `a` and `b` (RC/UC) with [`connect_attrs`], or moves a
    /// UD QP to RTS when `b` is `None`.
    fn connect(
        &mut self,
        a: usize,
        b: Option<usize>,
        mtu: Mtu,
        psn_a: Psn,
        psn_b: Psn,
    ) -> Result<(), VerbsError>;
    /// The node QP `qp` lives on.
    fn node_of(&self, qp: usize) -> usize;
    /// QP `qp`'s number.
    fn qpn(&self, qp: usize) -> Qpn;
    /// QP `qp`'s state.
    fn qp_state(&self, qp: usize) -> QpState;
    /// The address handle on node `from` that reaches node `to`.
    fn ah(&mut self, from: usize, to: usize) -> u32;
    /// Registers `len` zeroed bytes with every right on `node`; returns
    /// (key, address).
    fn register(&mut self, node: usize, len: usize) -> (u32, u64);
    /// A registered region's bytes.
    fn bytes(&self, node: usize, key: u32) -> &[u8];
    /// A registered region's bytes, mutable.
    fn bytes_mut(&mut self, node: usize, key: u32) -> &mut [u8];
    /// Posts a send work request to QP `qp`.
    fn post_send(&mut self, qp: usize, wr: SendWr) -> Result<(), VerbsError>;
    /// Posts a receive work request to QP `qp`.
    fn post_recv(&mut self, qp: usize, wr: RecvWr) -> Result<(), VerbsError>;
    /// Runs until `done` holds (checked after every step; it may post more
    /// work) or simulated time passes `deadline`, or a QP invariant breaks;
    /// returns whether `done` held.
    fn run(&mut self, deadline: Nanos, done: &mut dyn FnMut(&mut Self) -> bool) -> bool;
    /// Completions polled from QP `qp` so far (the caller drains them).
    fn completions(&mut self, qp: usize) -> &mut VecDeque<WorkCompletion>;
    /// Send WRs of QP `qp` not yet completed.
    fn send_queue_len(&self, qp: usize) -> usize;
    /// Simulated time.
    fn now(&self) -> Nanos;
    /// Network statistics.
    fn net_stats(&self) -> NetStats;
    /// The counters of all QPs, summed.
    fn qp_counters(&self) -> Counters;
    /// One line per QP with its state, for a stuck run's report.
    fn describe_qps(&self) -> Vec<String>;
    /// The first broken QP invariant [`Fabric::run`] saw.
    fn violation(&self) -> Option<String>;
    /// Turns selective repeat on or off on connected QP `qp` (an RTS to
    /// RTS modify carrying [`QpAttr::selective_repeat`]).
    fn set_selective_repeat(&mut self, qp: usize, on: bool) -> Result<(), VerbsError>;
}

/// The INIT, RTR and RTS attributes [`Fabric::connect`] uses: for RC/UC
/// `peer` is (address handle, peer QPN, peer's first PSN) and `my_psn` the
/// local one; UD QPs (`peer` `None`) get Q_Key 0x11111111.
pub fn connect_attrs(
    qp_type: QpType,
    mtu: Mtu,
    my_psn: Psn,
    peer: Option<(u32, Qpn, Psn)>,
) -> [QpAttr; 3] {
    let mut init = QpAttr {
        state: Some(QpState::Init),
        pkey_index: Some(0),
        port: Some(1),
        ..Default::default()
    };
    if qp_type == QpType::Ud {
        init.qkey = Some(0x1111_1111);
    } else {
        init.access = Some(QpAccess {
            remote_write: true,
            remote_read: true,
            remote_atomic: true,
        });
    }
    let mut rtr = QpAttr {
        state: Some(QpState::Rtr),
        ..Default::default()
    };
    let mut rts = QpAttr {
        state: Some(QpState::Rts),
        sq_psn: Some(peer.map_or(Psn::new(0), |_| my_psn)),
        ..Default::default()
    };
    if let Some((ah, dest_qpn, peer_psn)) = peer {
        rtr.ah = Some(ah);
        rtr.path_mtu = Some(mtu);
        rtr.dest_qpn = Some(dest_qpn);
        rtr.rq_psn = Some(peer_psn);
        if qp_type == QpType::Rc {
            rtr.max_dest_rd_atomic = Some(8);
            rtr.min_rnr_timer = Some(1);
            rts.timeout = Some(9);
            rts.retry_cnt = Some(SIM_RETRY_CNT);
            rts.rnr_retry = Some(7);
            rts.max_rd_atomic = Some(8);
        }
    }
    [init, rtr, rts]
}

impl Fabric for World {
    fn add_qp(&mut self, node: usize, qp_type: QpType, mtu: Mtu) -> usize {
        World::add_qp(self, node, qp_type, mtu)
    }
    fn connect(
        &mut self,
        a: usize,
        b: Option<usize>,
        mtu: Mtu,
        psn_a: Psn,
        psn_b: Psn,
    ) -> Result<(), VerbsError> {
        World::connect(self, a, b, mtu, psn_a, psn_b)
    }
    fn node_of(&self, qp: usize) -> usize {
        self.qps[qp].0
    }
    fn qpn(&self, qp: usize) -> Qpn {
        self.qps[qp].1.qpn()
    }
    fn qp_state(&self, qp: usize) -> QpState {
        self.qps[qp].1.state()
    }
    fn ah(&mut self, _from: usize, to: usize) -> u32 {
        to as u32
    }
    fn register(&mut self, node: usize, len: usize) -> (u32, u64) {
        self.mems[node].register(1, len, Access::ALL)
    }
    fn bytes(&self, node: usize, key: u32) -> &[u8] {
        self.mems[node].bytes(key)
    }
    fn bytes_mut(&mut self, node: usize, key: u32) -> &mut [u8] {
        self.mems[node].bytes_mut(key)
    }
    fn post_send(&mut self, qp: usize, wr: SendWr) -> Result<(), VerbsError> {
        let (node, q) = &mut self.qps[qp];
        q.post_send(wr, &mut self.mems[*node])
    }
    fn post_recv(&mut self, qp: usize, wr: RecvWr) -> Result<(), VerbsError> {
        let (_, q) = &mut self.qps[qp];
        q.post_recv(wr)
    }
    fn run(&mut self, deadline: Nanos, done: &mut dyn FnMut(&mut Self) -> bool) -> bool {
        World::run(self, deadline, |w| done(w))
    }
    fn completions(&mut self, qp: usize) -> &mut VecDeque<WorkCompletion> {
        &mut self.completions[qp]
    }
    fn send_queue_len(&self, qp: usize) -> usize {
        self.qps[qp].1.send_queue_len()
    }
    fn now(&self) -> Nanos {
        self.now
    }
    fn net_stats(&self) -> NetStats {
        self.stats
    }
    fn qp_counters(&self) -> Counters {
        let mut c = Counters::default();
        for (_, q) in &self.qps {
            c.add(q.counters());
        }
        c
    }
    fn describe_qps(&self) -> Vec<String> {
        self.qps.iter().map(|(_, q)| q.describe()).collect()
    }
    fn violation(&self) -> Option<String> {
        self.violation.clone()
    }
    fn set_selective_repeat(&mut self, qp: usize, on: bool) -> Result<(), VerbsError> {
        let q = &mut self.qps[qp].1;
        q.modify(&QpAttr {
            state: Some(q.state()),
            selective_repeat: Some(on),
            ..QpAttr::default()
        })
    }
}

/// Streams WRITEs over the transport model [`World`] with the faults of
/// `o` ([`stream::run_stream`]).
pub fn run_stream(seed: u64, o: &stream::StreamOptions) -> Result<stream::StreamSummary, String> {
    let mut w = World::new(seed, 2, o.faults);
    stream::run_stream(&mut w, seed, o)
}

/// Runs one seeded workload over the transport model [`World`] and checks
/// it; `Err` says what went wrong.
pub fn run_workload(seed: u64, o: &WorkloadOptions) -> Result<Summary, String> {
    let mut w = World::new(seed, 2, o.faults);
    run_workload_on(&mut w, seed, o)
}

/// Runs one seeded workload over two-node fabric `w` (the transport model
/// [`World`], or the real data plane over an in-memory port) and checks
/// that every message arrived once, intact, in order, with the completions
/// the spec demands; `Err` says what went wrong.
pub fn run_workload_on<F: Fabric>(
    w: &mut F,
    seed: u64,
    o: &WorkloadOptions,
) -> Result<Summary, String> {
    let mut rng = Rng::new(seed.wrapping_mul(0x2545_f491_4f6c_dd1d));
    let mtu = Mtu::ALL[rng.below(5) as usize];
    let pairs = connect_pairs(w, &mut rng, mtu, o)?;
    for (i, &(a, b, t)) in pairs.iter().enumerate() {
        if t == QpType::Rc {
            let (req, resp) = o.repeat.ends(seed, i);
            w.set_selective_repeat(a, req).map_err(|e| e.to_string())?;
            w.set_selective_repeat(b, resp).map_err(|e| e.to_string())?;
        }
    }
    let mut summary = Summary::default();
    let mut plans: Vec<Plan> = Vec::new();
    // Receives held back until the requesters are under way, to exercise RNR.
    let mut held: VecDeque<(usize, RecvWr)> = VecDeque::new();
    let mut wr_id = 0u64;
    for &pair in &pairs {
        plans.push(plan_pair(w, &mut rng, pair, mtu, o, &mut wr_id, &mut held)?);
    }
    let finished = w.run(o.deadline, &mut |w: &mut F| {
        if w.now() > 50_000 {
            while let Some((b, r)) = held.pop_front() {
                let _ = w.post_recv(b, r);
            }
        }
        // A requester that spent its retry count ends the run: its peer
        // cannot know and keeps its receives (the sweep weighs how often).
        retry_spent(w, &plans)
            || plans.iter().all(|(a, b, t, posted, recvs)| {
                let sends = posted.iter().filter(|p| p.signaled).count();
                let got_send = w.completions(*a).len() >= sends && w.send_queue_len(*a) == 0;
                let got_recv = match t {
                    QpType::Rc => w.completions(*b).len() >= recvs.len(),
                    _ => true,
                };
                got_send && got_recv
            })
    });
    summary.sim_ns = w.now();
    summary.net = w.net_stats();
    let counters = w.qp_counters();
    summary.retransmitted = counters.retransmitted_pkts;
    summary.count_retries(&counters);
    if let Some(v) = w.violation() {
        return Err(format!("seed {seed}: invariant broken {v}"));
    }
    summary.retry_exhausted = retry_spent(w, &plans);
    if summary.retry_exhausted {
        return Ok(summary);
    }
    if !finished {
        let stuck = w.describe_qps();
        return Err(format!(
            "seed {seed}: not finished by {} ns (stuck QPs: {})",
            o.deadline,
            stuck.join("; ")
        ));
    }

    for plan in &plans {
        check_receives(w, seed, plan)?;
        check_data(w, seed, plan, &mut summary)?;
    }
    Ok(summary)
}

/// Whether a requester of `plans` failed a WR with `RetryExcErr`.
fn retry_spent<F: Fabric>(w: &mut F, plans: &[Plan]) -> bool {
    plans.iter().any(|(a, ..)| {
        w.completions(*a)
            .iter()
            .any(|c| c.status == WcStatus::RetryExcErr)
    })
}

/// The QP pairs of a workload, connected: `o.rc_pairs` RC pairs (PSNs
/// near the wrap point half of the time), and a UC and a UD pair.
fn connect_pairs<F: Fabric>(
    w: &mut F,
    rng: &mut Rng,
    mtu: Mtu,
    o: &WorkloadOptions,
) -> Result<Vec<(usize, usize, QpType)>, String> {
    let mut pairs = Vec::new();
    for _ in 0..o.rc_pairs {
        let a = w.add_qp(0, QpType::Rc, mtu);
        let b = w.add_qp(1, QpType::Rc, mtu);
        // PSNs near the wrap point half of the time.
        let pa = Psn::new(if rng.chance(0.5) {
            0xff_ffff - rng.below(64) as u32
        } else {
            rng.below(1 << 24) as u32
        });
        let pb = Psn::new(rng.below(1 << 24) as u32);
        w.connect(a, Some(b), mtu, pa, pb)
            .map_err(|e| e.to_string())?;
        pairs.push((a, b, QpType::Rc));
    }
    if o.unreliable {
        let a = w.add_qp(0, QpType::Uc, mtu);
        let b = w.add_qp(1, QpType::Uc, mtu);
        w.connect(a, Some(b), mtu, Psn::new(5), Psn::new(9))
            .map_err(|e| e.to_string())?;
        pairs.push((a, b, QpType::Uc));
        let a = w.add_qp(0, QpType::Ud, mtu);
        let b = w.add_qp(1, QpType::Ud, mtu);
        w.connect(a, None, mtu, Psn::new(0), Psn::new(0))
            .map_err(|e| e.to_string())?;
        w.connect(b, None, mtu, Psn::new(0), Psn::new(0))
            .map_err(|e| e.to_string())?;
        pairs.push((a, b, QpType::Ud));
    }
    Ok(pairs)
}

/// Posts the operations of one pair (receives first, a tail of them held
/// back on some pairs) and returns what each must produce.
fn plan_pair<F: Fabric>(
    w: &mut F,
    rng: &mut Rng,
    (a, b, t): (usize, usize, QpType),
    mtu: Mtu,
    o: &WorkloadOptions,
    next_wr_id: &mut u64,
    held: &mut VecDeque<(usize, RecvWr)>,
) -> Result<Plan, String> {
    let b_node = w.node_of(b);
    let b_qpn = w.qpn(b);
    let b_ah = w.ah(w.node_of(a), b_node);
    let mut posted = Vec::new();
    let mut recvs = Vec::new();
    // One atomic counter per pair on the responder.
    let (ctr, ctr_va) = w.register(1, 8);
    let mut model = 0u64;
    let n = if t == QpType::Rc {
        o.ops_per_pair
    } else {
        o.ops_per_pair / 2
    };
    let hold_tail = rng.chance(0.3);
    for i in 0..n {
        let size = match rng.below(20) {
            0 if i % 7 == 3 => o.max_size / 2 + rng.below(o.max_size as u64 / 2 + 1) as usize,
            1..=3 => rng.below(64 * 1024) as usize,
            4 => 0,
            _ => rng.below(mtu.bytes() as u64 * 2 + 1) as usize,
        };
        let size = match t {
            QpType::Rc => size,
            QpType::Uc => size.min(UNRELIABLE_MAX),
            QpType::Ud => size.min(mtu.bytes()),
        };
        let kind = match t {
            QpType::Rc => rng.below(9),
            QpType::Uc => rng.below(4),
            QpType::Ud => rng.below(2),
        };
        *next_wr_id += 1;
        let wr_id = *next_wr_id;
        let signaled = rng.below(4) != 0 || t != QpType::Rc;
        let inline = size <= 64 && kind < 4 && rng.chance(0.5);
        // Source/destination buffer on the requester, split into up to 3 SGEs.
        let (lkey, laddr) = w.register(0, size.max(8));
        fill(rng, &mut w.bytes_mut(0, lkey)[..size]);
        let mut sges = Vec::new();
        let mut off = 0usize;
        let parts = 1 + rng.below(3) as usize;
        for p in 0..parts {
            let len = if p + 1 == parts {
                size - off
            } else {
                (size - off) / 2
            };
            sges.push(Sge {
                addr: laddr + off as u64,
                length: len as u32,
                lkey,
            });
            off += len;
        }
        let imm = rng.next_u64() as u32;
        let (op, expect, atomic_sges) = choose_op(
            w,
            rng,
            kind,
            size,
            imm,
            b_node,
            (lkey, laddr),
            (ctr, ctr_va),
            &mut model,
        );
        if let Some(one) = atomic_sges {
            sges = one;
        }
        let sges = SgList::try_from(sges).map_err(|e| format!("workload: {e}"))?;
        let mut wr = SendWr::new(wr_id, op, sges);
        wr.signaled = signaled;
        wr.inline = inline;
        wr.fence = rng.chance(0.05);
        if t == QpType::Ud {
            wr.ud = Some(UdDest {
                remote_qpn: b_qpn,
                remote_qkey: 0x1111_1111,
                ah: b_ah,
            });
        }
        let consumes_recv = matches!(
            expect,
            Expect::Send { .. } | Expect::Write { imm: Some(_), .. }
        );
        if consumes_recv {
            // Post the receives up front, except (on some pairs) a tail
            // posted later, in order, to exercise RNR NAKs.
            let later = hold_tail && i >= n / 2;
            let rk = post_recv_for(w, rng, (b, t), wr_id, size, later.then_some(&mut *held))?;
            recvs.push((wr_id, rk));
        }
        let opcode = wr.op.wc_opcode();
        w.post_send(a, wr).map_err(|e| format!("post_send: {e}"))?;
        posted.push(Posted {
            wr_id,
            signaled,
            expect,
            opcode,
        });
    }
    Ok((a, b, t, posted, recvs))
}

/// Registers and posts (or, with `held`, holds back) the receive of
/// message `wr_id` of `size` bytes on QP `b` of type `t`; its key.
fn post_recv_for<F: Fabric>(
    w: &mut F,
    rng: &mut Rng,
    (b, t): (usize, QpType),
    wr_id: u64,
    size: usize,
    held: Option<&mut VecDeque<(usize, RecvWr)>>,
) -> Result<u32, String> {
    // UC/UD reuse a receive when a message is lost: size them all for the largest.
    let cap = if t == QpType::Rc {
        size + rng.below(16) as usize
    } else {
        UNRELIABLE_MAX + 40
    };
    let (rk, ra) = w.register(1, cap);
    let rwr = RecvWr {
        wr_id,
        sg_list: [Sge {
            addr: ra,
            length: cap as u32,
            lkey: rk,
        }]
        .into(),
    };
    match held {
        Some(h) => h.push_back((b, rwr)),
        None => w.post_recv(b, rwr).map_err(|e| format!("post_recv: {e}"))?,
    }
    Ok(rk)
}

/// Operation `kind` of a workload (0-1 SEND, 2-3 WRITE, 4-5 READ, 6
/// FETCH_ADD, 7 ATOMIC WRITE, 8 COMPARE_SWAP) over the requester's buffer
/// `local`, what it
/// must produce, and the single SGE an atomic uses instead of the split
/// ones. `model` is the responder's counter as the atomics leave it.
#[allow(clippy::too_many_arguments)]
fn choose_op<F: Fabric>(
    w: &mut F,
    rng: &mut Rng,
    kind: u64,
    size: usize,
    imm: u32,
    b_node: usize,
    (lkey, laddr): (u32, u64),
    (ctr, ctr_va): (u32, u64),
    model: &mut u64,
) -> (SendOp, Expect, Option<Vec<Sge>>) {
    let data_hash = hash(&w.bytes(0, lkey)[..size]);
    let mut sges = None;
    let (op, expect) = match kind {
        0 | 1 => {
            let imm = (kind == 1).then_some(imm);
            (
                imm.map_or(SendOp::Send, SendOp::SendWithImm),
                Expect::Send {
                    hash: data_hash,
                    len: size,
                    imm,
                },
            )
        }
        2 | 3 => {
            let (rk, rva) = w.register(b_node, size.max(1));
            let imm = (kind == 3).then_some(imm);
            let op = match imm {
                Some(imm) => SendOp::WriteWithImm {
                    remote_addr: rva,
                    rkey: rk,
                    imm,
                },
                None => SendOp::Write {
                    remote_addr: rva,
                    rkey: rk,
                },
            };
            (
                op,
                Expect::Write {
                    region: rk,
                    hash: data_hash,
                    imm,
                    len: size,
                },
            )
        }
        4 | 5 => {
            let (rk, rva) = w.register(1, size.max(1));
            fill(rng, &mut w.bytes_mut(1, rk)[..size]);
            let h = hash(&w.bytes(1, rk)[..size]);
            (
                SendOp::Read {
                    remote_addr: rva,
                    rkey: rk,
                },
                Expect::Read {
                    local: lkey,
                    hash: h,
                    len: size,
                },
            )
        }
        7 => {
            // The buffer's first 8 bytes (zeros past a shorter payload),
            // stored in a region of their own.
            sges = Some(vec![Sge {
                addr: laddr,
                length: 8,
                lkey,
            }]);
            let (rk, rva) = w.register(b_node, 8);
            (
                SendOp::AtomicWrite {
                    remote_addr: rva,
                    rkey: rk,
                },
                Expect::Write {
                    region: rk,
                    hash: hash(&w.bytes(0, lkey)[..8]),
                    imm: None,
                    len: 8,
                },
            )
        }
        6 => {
            sges = Some(vec![Sge {
                addr: laddr,
                length: 8,
                lkey,
            }]);
            let add = rng.below(1000);
            let orig = *model;
            *model = model.wrapping_add(add);
            (
                SendOp::FetchAdd {
                    remote_addr: ctr_va,
                    rkey: ctr,
                    add,
                },
                Expect::Atomic { local: lkey, orig },
            )
        }
        _ => {
            sges = Some(vec![Sge {
                addr: laddr,
                length: 8,
                lkey,
            }]);
            let hit = rng.chance(0.5);
            let compare = if hit { *model } else { *model ^ 1 };
            let swap = rng.next_u64();
            let orig = *model;
            if hit {
                *model = swap;
            }
            (
                SendOp::CompareSwap {
                    remote_addr: ctr_va,
                    rkey: ctr,
                    compare,
                    swap,
                },
                Expect::Atomic { local: lkey, orig },
            )
        }
    };
    (op, expect, sges)
}

/// The completions of a pair: the requester's signaled ones in posting
/// order, all successful; the responder's receives in order (on UC/UD a
/// subsequence of the messages sent, UD in any order).
fn check_receives<F: Fabric>(w: &mut F, seed: u64, plan: &Plan) -> Result<(), String> {
    let (a, b, t, posted, recvs) = plan;
    let reliable = *t == QpType::Rc;
    // Requester completions: signaled ones, in posting order, all successful.
    let want: Vec<&Posted> = posted.iter().filter(|p| p.signaled).collect();
    let got: Vec<WorkCompletion> = w.completions(*a).drain(..).collect();
    if got.len() != want.len() {
        return Err(format!(
            "seed {seed}: {t:?} requester got {} completions, want {}",
            got.len(),
            want.len()
        ));
    }
    for (p, wc) in want.iter().zip(&got) {
        if wc.wr_id != p.wr_id || wc.status != WcStatus::Success || wc.opcode != p.opcode {
            return Err(format!(
                "seed {seed}: {t:?} requester completion {wc:?}, want wr_id {} {:?} success",
                p.wr_id, p.opcode
            ));
        }
    }
    // Responder completions: the receives in order; on UC/UD the
    // messages delivered are a subsequence of those sent (lost messages
    // leave their receive WQE to the next one).
    let rwcs: Vec<WorkCompletion> = w.completions(*b).drain(..).collect();
    let expected_recv: Vec<&Posted> = posted
        .iter()
        .filter(|p| {
            matches!(
                p.expect,
                Expect::Send { .. } | Expect::Write { imm: Some(_), .. }
            )
        })
        .collect();
    let mut next = 0usize;
    let mut ud_seen: Vec<usize> = Vec::new();
    for wc in &rwcs {
        if wc.status != WcStatus::Success {
            return Err(format!("seed {seed}: {t:?} receive completion {wc:?}"));
        }
        let Some(&(_, rkey)) = recvs.iter().find(|r| r.0 == wc.wr_id) else {
            return Err(format!(
                "seed {seed}: {t:?} completion of unknown receive {wc:?}"
            ));
        };
        if reliable && recvs.get(next).map(|r| r.0) != Some(wc.wr_id) {
            // RC consumes receive WQEs strictly in order.
            return Err(format!(
                "seed {seed}: RC receive WQEs consumed out of order at {wc:?}"
            ));
        }
        let off = if *t == QpType::Ud { 40 } else { 0 };
        let matches = |p: &Posted| match p.expect {
            Expect::Send { hash: h, len, imm } => {
                wc.opcode == WcOpcode::Recv
                    && wc.byte_len as usize == len + off
                    && wc.imm_data == imm
                    && hash(&w.bytes(1, rkey)[off..off + len]) == h
            }
            Expect::Write { imm, len, .. } => {
                wc.opcode == WcOpcode::RecvRdmaWithImm
                    && wc.imm_data == imm
                    && wc.byte_len as usize == len
            }
            _ => false,
        };
        if *t == QpType::Ud {
            // Datagrams may be reordered, and a duplicated one is
            // delivered twice (UD has no sequence check): any sent one.
            let unseen = (0..expected_recv.len())
                .find(|&i| !ud_seen.contains(&i) && matches(expected_recv[i]));
            let Some(i) =
                unseen.or_else(|| (0..expected_recv.len()).find(|&i| matches(expected_recv[i])))
            else {
                return Err(format!(
                    "seed {seed}: UD receive {wc:?} matches no datagram sent"
                ));
            };
            ud_seen.push(i);
            if wc.grh.is_none() || wc.src_qp != w.qpn(*a) {
                return Err(format!(
                    "seed {seed}: UD receive without GRH/src_qp: {wc:?}"
                ));
            }
            continue;
        }
        loop {
            let Some(p) = expected_recv.get(next) else {
                return Err(format!(
                    "seed {seed}: {t:?} receive {wc:?} matches no message sent (in order)"
                ));
            };
            next += 1;
            if matches(p) {
                break;
            }
            if reliable {
                return Err(format!(
                    "seed {seed}: RC receive {wc:?} does not match wr {} ({:?})",
                    p.wr_id, p.expect
                ));
            }
        }
        if *t == QpType::Ud && (wc.grh.is_none() || wc.src_qp != w.qpn(*a)) {
            return Err(format!(
                "seed {seed}: UD receive without GRH/src_qp: {wc:?}"
            ));
        }
    }
    if reliable && next != expected_recv.len() {
        return Err(format!(
            "seed {seed}: RC responder got {next} receives, want {}",
            expected_recv.len()
        ));
    }
    Ok(())
}

/// The data of a pair's WRITEs, READs and atomics, counted in `summary`,
/// and both QPs still in RTS.
fn check_data<F: Fabric>(
    w: &mut F,
    seed: u64,
    plan: &Plan,
    summary: &mut Summary,
) -> Result<(), String> {
    let (a, b, t, posted, _) = plan;
    let reliable = *t == QpType::Rc;
    // Data of WRITE, READ and atomics.
    for p in posted {
        match p.expect {
            Expect::Write {
                region,
                hash: h,
                len,
                ..
            } if reliable => {
                if hash(&w.bytes(1, region)[..len]) != h {
                    return Err(format!("seed {seed}: WRITE wr {} data differs", p.wr_id));
                }
                summary.bytes += len as u64;
            }
            Expect::Read {
                local,
                hash: h,
                len,
            } => {
                if hash(&w.bytes(0, local)[..len]) != h {
                    return Err(format!("seed {seed}: READ wr {} data differs", p.wr_id));
                }
                summary.bytes += len as u64;
            }
            Expect::Atomic { local, orig } => {
                let v = u64::from_ne_bytes(w.bytes(0, local)[..8].try_into().unwrap_or_default());
                if v != orig {
                    return Err(format!(
                        "seed {seed}: atomic wr {} returned {v:#x}, want {orig:#x}",
                        p.wr_id
                    ));
                }
            }
            Expect::Send { len, .. } if reliable => summary.bytes += len as u64,
            _ => {}
        }
        summary.ops += 1;
    }
    for q in [*a, *b] {
        if w.qp_state(q) != QpState::Rts {
            return Err(format!(
                "seed {seed}: QP {} ended in {:?}",
                w.qpn(q),
                w.qp_state(q)
            ));
        }
    }
    Ok(())
}
