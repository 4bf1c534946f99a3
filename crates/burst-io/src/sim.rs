//! An in-memory network of ports: the simulator's and the tests' wire.
//!
//! A [`SimNet`] carries packets between [`SimPort`]s by address, on a clock
//! the caller advances, through seeded faults: loss, reordering,
//! duplication, bit corruption, link delay and jitter, a sender link rate, a
//! receiver rate and queue limit (drops when full, as a socket buffer does),
//! and ECN marking when a receiver's queue passes a threshold (the switch
//! behaviour DCQCN reacts to). Everything is a function of the seed and the
//! calls made, so a failing run replays exactly.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rustc_hash::FxHashMap as HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::{PacketBuf, Port, RxMeta, RxVisit, MAX_PACKET};

/// A frame's storage: a packet buffer's own, so that a port may queue the
/// buffer it is given ([`Port::send_frames`]) instead of copying it.
type Storage = Box<[u8; MAX_PACKET]>;

fn fresh() -> Storage {
    Box::new([0; MAX_PACKET])
}

/// `into` holding a copy of `bytes` (at most [`MAX_PACKET`]).
fn copied(mut into: Storage, bytes: &[u8]) -> Storage {
    into[..bytes.len()].copy_from_slice(bytes);
    into
}

/// What [`Inner::send`] is given: bytes to copy, or a packet buffer whose
/// storage the network takes (leaving a spare one in its place).
enum Bytes<'a> {
    Copy(&'a [u8]),
    Take(&'a mut PacketBuf),
}

/// Faults and limits of a [`SimNet`]. Probabilities are per packet.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimFaults {
    /// Drop.
    pub loss: f64,
    /// Delay by up to 20 extra link delays (overtaken by later packets).
    pub reorder: f64,
    /// Deliver twice.
    pub dup: f64,
    /// Flip one bit (the receiver's ICRC check catches it).
    pub corrupt: f64,
    /// One-way delay, ns.
    pub delay_ns: u64,
    /// Random extra delay in `0..jitter_ns` (FIFO order kept), ns.
    pub jitter_ns: u64,
    /// Each sender's link rate, Gb/s (0: unlimited).
    pub link_gbps: u64,
    /// The most a sender's link queues, ns of transmission: past it
    /// [`Port::send_burst`] takes no more (returns a short count, as a full
    /// socket buffer does), so the sender holds its packets (0: no limit).
    pub tx_queue_ns: u64,
    /// Each receiver's rate, Gb/s (0: as fast as packets come).
    pub rx_gbps: u64,
    /// Packets a receiver's queue holds; more are dropped (0: no limit).
    pub rx_queue: usize,
    /// Mark CE (ECN 3) on packets that find at least this many queued ahead
    /// of them at the receiver (0: never): `Kmin` of RED marking.
    pub ecn_threshold: usize,
    /// RED marking as DCQCN's switches do (Zhu et al. 2015, §4: `Kmin`,
    /// `Kmax`, `Pmax`): between [`SimFaults::ecn_threshold`] and this many
    /// queued, mark with a probability rising linearly to
    /// [`SimFaults::ecn_pmax`]; from here on, mark every packet. 0: step
    /// marking at the threshold.
    pub ecn_max: usize,
    /// See [`SimFaults::ecn_max`].
    pub ecn_pmax: f64,
    /// Hide the IP ID from receivers, as a UDP socket does (the receiver
    /// must solve for it); else [`crate::RxMeta::ip_id`] carries it.
    pub hide_ip_id: bool,
}

impl Default for SimFaults {
    fn default() -> Self {
        SimFaults {
            loss: 0.0,
            reorder: 0.0,
            dup: 0.0,
            corrupt: 0.0,
            delay_ns: 2_000,
            jitter_ns: 200,
            link_gbps: 100,
            tx_queue_ns: 20_000,
            rx_gbps: 0,
            rx_queue: 0,
            ecn_threshold: 0,
            ecn_max: 0,
            ecn_pmax: 0.0,
            hide_ip_id: false,
        }
    }
}

/// What a [`SimNet`] did with the packets it was given.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Packets handed to the network.
    pub sent: u64,
    /// Dropped by loss.
    pub lost: u64,
    /// Duplicated.
    pub duplicated: u64,
    /// Delayed out of order.
    pub reordered: u64,
    /// Corrupted (one bit flipped).
    pub corrupted: u64,
    /// Dropped by a full receive queue.
    pub overflowed: u64,
    /// Marked CE.
    pub ecn_marked: u64,
    /// The most packets a receiver's queue held (in flight to it and
    /// waiting), seen as packets arrived: the bottleneck queue's peak.
    pub max_rx_queue: u64,
    /// Sent to an address no port has.
    pub unroutable: u64,
    /// Handed to a receiving port.
    pub delivered: u64,
}

#[derive(Debug)]
struct Frame {
    at: u64,
    seq: u64,
    src: SocketAddr,
    bytes: Storage,
    len: usize,
    ip_id: u16,
    ecn: u8,
}

impl PartialEq for Frame {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Frame {}
impl PartialOrd for Frame {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Frame {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

#[derive(Default)]
struct Receiver {
    queue: BinaryHeap<Reverse<Frame>>,
    /// Last in-order arrival: links are FIFO unless a packet is reordered.
    fifo: u64,
}

struct Inner {
    now: u64,
    /// The seed's key for [`Inner::next`].
    rng: u64,
    /// Decisions drawn so far.
    draws: u64,
    seq: u64,
    faults: SimFaults,
    stats: SimStats,
    rx: HashMap<SocketAddr, Receiver>,
    link_free: HashMap<SocketAddr, u64>,
    /// Buffers of delivered frames, for the next frames sent (a
    /// simulation's packets cost no allocation once it runs).
    spare: Vec<Storage>,
}

/// Most buffers [`Inner::spare`] keeps.
const MAX_SPARE: usize = 1024;

impl Inner {
    /// A counter hashed twice with the seed: the draw for the n-th decision
    /// is `mix(mix(n) ^ seed)`. Plain splitmix64 (`mix(seed + n * gamma)`)
    /// let a retransmission loop that makes the same number of draws per
    /// round sample an arithmetic progression of states with a poor
    /// effective gamma: its draws correlated, and one ACK was lost eight
    /// rounds in a row at 9% loss (core-sim sweep seed 9603).
    fn next(&mut self) -> u64 {
        fn mix(mut z: u64) -> u64 {
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        self.draws = self.draws.wrapping_add(1);
        mix(mix(self.draws) ^ self.rng)
    }
    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// Whether `src`'s link queue is full ([`SimFaults::tx_queue_ns`]).
    fn tx_full(&self, src: SocketAddr) -> bool {
        let f = self.faults;
        f.link_gbps > 0
            && f.tx_queue_ns > 0
            && self
                .link_free
                .get(&src)
                .is_some_and(|&t| t > self.now + f.tx_queue_ns)
    }

    fn send(&mut self, src: SocketAddr, dst: SocketAddr, given: Bytes<'_>, ip_id: u16) {
        self.stats.sent += 1;
        let len = match &given {
            Bytes::Copy(b) => b.len(),
            Bytes::Take(p) => p.len,
        };
        if len > MAX_PACKET {
            // No link carries it (a caller's bad length): gone.
            self.stats.lost += 1;
            return;
        }
        let f = self.faults;
        // Serialisation on the sender's link.
        let depart = match f.link_gbps {
            0 => self.now,
            g => {
                let free = self.link_free.entry(src).or_insert(0);
                let d = (*free).max(self.now);
                *free = d + (len as u64 * 8).div_ceil(g);
                d
            }
        };
        if self.chance(f.loss) {
            self.stats.lost += 1;
            return;
        }
        let Some(queued) = self.rx.get(&dst).map(|r| r.queue.len()) else {
            self.stats.unroutable += 1;
            return;
        };
        self.stats.max_rx_queue = self.stats.max_rx_queue.max(queued as u64 + 1);
        if f.rx_queue > 0 && queued >= f.rx_queue {
            self.stats.overflowed += 1;
            return;
        }
        let spare = self.spare.pop().unwrap_or_else(fresh);
        let mut bytes = match given {
            // The buffer's own storage is queued; a spare takes its place.
            Bytes::Take(p) if p.data.lent().is_none() => std::mem::replace(p.data.own_mut(), spare),
            // Bytes to copy, or a frame another port lent (it stays with
            // its buffer).
            Bytes::Copy(b) => copied(spare, b),
            Bytes::Take(p) => copied(spare, &p.data[..len]),
        };
        if self.chance(f.corrupt) && len > 0 {
            self.stats.corrupted += 1;
            let i = self.below(len as u64) as usize;
            bytes[i] ^= 1 << self.below(8);
        }
        let mark = f.ecn_threshold > 0
            && queued >= f.ecn_threshold
            && (f.ecn_max <= f.ecn_threshold
                || queued >= f.ecn_max
                || self.chance(
                    f.ecn_pmax * (queued - f.ecn_threshold) as f64
                        / (f.ecn_max - f.ecn_threshold) as f64,
                ));
        let ecn = if mark {
            self.stats.ecn_marked += 1;
            3
        } else {
            0
        };
        let mut bytes = Some(bytes);
        let copies = if self.chance(f.dup) {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        for c in 0..copies {
            let mut at = depart + f.delay_ns + self.below(f.jitter_ns.max(1));
            let reorder = c > 0 || self.chance(f.reorder);
            if reorder {
                self.stats.reordered += u64::from(c == 0);
                at += f.delay_ns.max(1) * (1 + self.below(20));
            }
            self.seq += 1;
            let seq = self.seq;
            let r = self.rx.get_mut(&dst).expect("checked above");
            if !reorder {
                let service = match f.rx_gbps {
                    0 => 1,
                    g => (len as u64 * 8).div_ceil(g),
                };
                at = at.max(r.fifo + service);
                r.fifo = at;
            }
            // The last copy takes the bytes; a duplicate gets a copy.
            let bytes = match bytes.take() {
                Some(b) if c + 1 == copies => b,
                Some(b) => {
                    let d = copied(self.spare.pop().unwrap_or_else(fresh), &b[..len]);
                    bytes = Some(b);
                    d
                }
                None => return,
            };
            r.queue.push(Reverse(Frame {
                at,
                seq,
                src,
                bytes,
                len,
                ip_id,
                ecn,
            }));
        }
    }
}

/// An in-memory network shared by its [`SimPort`]s (cheap to clone: all
/// clones are the same network).
#[derive(Clone)]
pub struct SimNet(Arc<Mutex<Inner>>);

impl std::fmt::Debug for SimNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let g = self.lock();
        write!(f, "SimNet(t={} ns, {:?})", g.now, g.stats)
    }
}

impl SimNet {
    /// A network with faults drawn from `seed`, at time 0.
    pub fn new(seed: u64, faults: SimFaults) -> SimNet {
        SimNet(Arc::new(Mutex::new(Inner {
            now: 0,
            rng: seed ^ 0x5851_f42d_4c95_7f2d,
            draws: 0,
            seq: 0,
            faults,
            stats: SimStats::default(),
            rx: HashMap::default(),
            link_free: HashMap::default(),
            spare: Vec::new(),
        })))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data behind: keep going.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A port on `addr` (replacing any port that had it).
    pub fn port(&self, addr: SocketAddr) -> SimPort {
        self.lock().rx.insert(addr, Receiver::default());
        SimPort {
            net: self.clone(),
            addr,
            next_id: AtomicU16::new(0),
            lent: Vec::new(),
        }
    }

    /// The network's time, ns.
    pub fn now(&self) -> u64 {
        self.lock().now
    }

    /// Moves the clock to `t` (never backwards).
    pub fn set_now(&self, t: u64) {
        let mut g = self.lock();
        g.now = g.now.max(t);
    }

    /// Moves the clock forward by `ns`.
    pub fn advance(&self, ns: u64) {
        let mut g = self.lock();
        g.now += ns;
    }

    /// When the next packet arrives anywhere, if one is on the way.
    pub fn next_arrival(&self) -> Option<u64> {
        let g = self.lock();
        g.rx.values()
            .filter_map(|r| r.queue.peek().map(|Reverse(f)| f.at))
            .min()
    }

    /// The next time something changes: a packet arrives, or a full send
    /// queue ([`SimFaults::tx_queue_ns`]) takes packets again.
    pub fn next_event(&self) -> Option<u64> {
        let arrival = self.next_arrival();
        let g = self.lock();
        let limit = g.faults.tx_queue_ns;
        let unblock = g
            .link_free
            .values()
            .filter(|&&t| limit > 0 && t > g.now + limit)
            .map(|&t| t - limit)
            .min();
        arrival.into_iter().chain(unblock).min()
    }

    /// Changes the faults from now on.
    pub fn set_faults(&self, faults: SimFaults) {
        self.lock().faults = faults;
    }

    /// What the network did so far.
    pub fn stats(&self) -> SimStats {
        self.lock().stats
    }

    /// Packets on their way to or waiting at `addr`'s receive queue now.
    pub fn queue_len(&self, addr: SocketAddr) -> usize {
        self.lock().rx.get(&addr).map_or(0, |r| r.queue.len())
    }
}

/// A [`Port`] on a [`SimNet`]. Its IP IDs count up per packet (as RXE's and
/// RNICs' do), which a receiver that hides them must solve for.
#[derive(Debug)]
pub struct SimPort {
    net: SimNet,
    addr: SocketAddr,
    next_id: AtomicU16,
    /// The frames the last [`Port::recv_frames`] lent (their buffers go
    /// back to the network at the next call).
    lent: Vec<Frame>,
}

impl SimPort {
    /// The network this port is on.
    pub fn net(&self) -> &SimNet {
        &self.net
    }
}

impl Port for SimPort {
    fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    fn recv_frames(&mut self, max: usize, visit: &mut RxVisit<'_>) -> io::Result<usize> {
        let mut lent = std::mem::take(&mut self.lent);
        let hide = {
            let mut g = self.net.lock();
            let room = MAX_SPARE.saturating_sub(g.spare.len());
            // Past the room, the rest of the drain is dropped (freed).
            g.spare.extend(lent.drain(..).map(|f| f.bytes).take(room));
            let now = g.now;
            while lent.len() < max {
                let r = g.rx.get_mut(&self.addr).ok_or_else(|| {
                    io::Error::new(io::ErrorKind::NotConnected, "port removed from its SimNet")
                })?;
                if r.queue.peek().is_none_or(|Reverse(f)| f.at > now) {
                    break;
                }
                let Some(Reverse(f)) = r.queue.pop() else {
                    break;
                };
                lent.push(f);
            }
            g.stats.delivered += lent.len() as u64;
            g.faults.hide_ip_id
        };
        // Lent outside the lock: the visitor may send on this network.
        for f in &lent {
            let meta = RxMeta {
                peer: f.src,
                ip_id: (!hide).then_some(f.ip_id),
                ecn: f.ecn,
                icrc_verified: false,
                pseudo_crc: None,
                dest: None,
            };
            visit(meta, &f.bytes[..f.len]);
        }
        let n = lent.len();
        self.lent = lent;
        Ok(n)
    }

    fn assign_ip_ids(&self, bufs: &mut [PacketBuf]) {
        for b in bufs {
            b.ip_id = self.next_id.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn send_burst(&mut self, bufs: &[PacketBuf]) -> io::Result<usize> {
        let mut g = self.net.lock();
        for (i, b) in bufs.iter().enumerate() {
            if g.tx_full(self.addr) {
                return Ok(i);
            }
            g.send(self.addr, b.peer, Bytes::Copy(b.bytes()), b.ip_id);
        }
        Ok(bufs.len())
    }

    fn send_frames(&mut self, bufs: &mut [PacketBuf]) -> io::Result<usize> {
        let mut g = self.net.lock();
        for (i, b) in bufs.iter_mut().enumerate() {
            if g.tx_full(self.addr) {
                return Ok(i);
            }
            let (peer, id) = (b.peer, b.ip_id);
            g.send(self.addr, peer, Bytes::Take(b), id);
        }
        Ok(bufs.len())
    }
}
