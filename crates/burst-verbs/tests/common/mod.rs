//! What the integration tests share: connecting an RC pair, waiting for
//! completions and for descriptors.
#![allow(dead_code)] // each test crate uses its part

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use burst_mem::{Access, MrKeys, Pd};
use burst_transport::{QpAccess, QpType, WorkCompletion};
use burst_verbs::engine::{CompChannel, Context, CqId, Engine};
use burst_verbs::{RcParams, RcPeer};
use burst_wire::{Mtu, Psn, Qpn};

/// Which engine of an [`RcPair`] has the completion channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    A,
    B,
}

/// Two engines on `127.0.{net}.{x}` and `.{x+1}`, one RC QP on each
/// connected to the other ([`connect_rc`], MTU 1024), each with a CQ of
/// its own for sends and receives; the CQ of `channel_on` has a
/// completion channel.
pub struct RcPair {
    pub a: Context,
    pub b: Context,
    pub qa: Qpn,
    pub qb: Qpn,
    pub pa: Pd,
    pub pb: Pd,
    pub cqa: CqId,
    pub cqb: CqId,
    pub ch: Arc<CompChannel>,
    _e: (Engine, Engine),
}

impl RcPair {
    /// Starts the pair: CQs of `cq_entries`, QPs `wr_depth` deep.
    pub fn start(net: u8, x: u8, cq_entries: usize, wr_depth: usize, channel_on: Side) -> RcPair {
        Self::start_with(net, x, cq_entries, wr_depth, channel_on, || ())
    }

    /// [`RcPair::start`], running `between` after B's engine starts and
    /// before A's (to give A's engine thread what the caller's thread has
    /// then, its CPU affinity).
    pub fn start_with(
        net: u8,
        x: u8,
        cq_entries: usize,
        wr_depth: usize,
        channel_on: Side,
        between: impl FnOnce(),
    ) -> RcPair {
        let addr = |h: u8| IpAddr::V4(Ipv4Addr::new(127, 0, net, h));
        let eb = Engine::start(addr(x + 1), Mtu::Mtu1024).unwrap();
        between();
        let ea = Engine::start(addr(x), Mtu::Mtu1024).unwrap();
        let (a, b) = (ea.context(), eb.context());
        let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
        let on = if channel_on == Side::A { &a } else { &b };
        let ch = on.create_comp_channel().unwrap();
        let cq = |c: &Context, side: Side| {
            let channel = (side == channel_on).then(|| Arc::clone(&ch));
            c.create_cq_with(cq_entries, channel)
        };
        let (cqa, cqb) = (cq(&a, Side::A), cq(&b, Side::B));
        let qa = a.create_qp(QpType::Rc, pa, cqa, cqa, wr_depth).unwrap();
        let qb = b.create_qp(QpType::Rc, pb, cqb, cqb, wr_depth).unwrap();
        connect_rc(&a, qa, b.gid(), qb, (5, 9), Mtu::Mtu1024);
        connect_rc(&b, qb, a.gid(), qa, (9, 5), Mtu::Mtu1024);
        RcPair {
            a,
            b,
            qa,
            qb,
            pa,
            pb,
            cqa,
            cqb,
            ch,
            _e: (ea, eb),
        }
    }

    /// Registers `on_a` on A with `a_access` and `on_b` on B with
    /// `b_access`.
    ///
    /// # Safety
    /// Both buffers must outlive the engines.
    pub unsafe fn register(
        &self,
        (on_a, a_access): (&mut [u8], Access),
        (on_b, b_access): (&mut [u8], Access),
    ) -> (MrKeys, MrKeys) {
        // SAFETY: the caller keeps both buffers alive past the engines.
        unsafe {
            (
                self.a
                    .reg_mr(self.pa, on_a.as_mut_ptr(), on_a.len(), a_access)
                    .unwrap(),
                self.b
                    .reg_mr(self.pb, on_b.as_mut_ptr(), on_b.len(), b_access)
                    .unwrap(),
            )
        }
    }
}

/// Connects RC QP `qpn` of `c` to `peer_qpn` at `peer_gid` with every
/// remote right, RNR timer 1, ACK timeout 12 (16 ms), 8 reads or atomics
/// in flight, path MTU `mtu`; `psns` is (this side's, the peer's).
pub fn connect_rc(
    c: &Context,
    qpn: Qpn,
    peer_gid: [u8; 16],
    peer_qpn: Qpn,
    psns: (u32, u32),
    mtu: Mtu,
) {
    let mut p = RcParams::new(Psn::new(psns.0), mtu);
    p.access = QpAccess {
        remote_write: true,
        remote_read: true,
        remote_atomic: true,
    };
    p.min_rnr_timer = 1;
    p.timeout = 12;
    p.rd_atomic = 8;
    let peer = RcPeer {
        gid: peer_gid,
        qpn: peer_qpn,
        psn: Psn::new(psns.1),
    };
    c.connect_rc(qpn, &peer, &p).unwrap();
}

/// The next `n` completions of `cq`; fails the test after 20 s without them.
pub fn poll_n(c: &Context, cq: CqId, n: usize) -> Vec<WorkCompletion> {
    let mut v = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while v.len() < n && Instant::now() < deadline {
        match c.poll_cq(cq) {
            Some(w) => v.push(w),
            None => std::thread::yield_now(),
        }
    }
    assert_eq!(v.len(), n, "timed out: {v:?}");
    v
}

/// Moves this thread into a network namespace of its own and joins two
/// veth interfaces there, `a` (address `ips.0`) and `b` (`ips.1`), each
/// with `queues` queues, MTU 9000, up. Both addresses are the namespace's
/// own, so the kernel would route between them through loopback and never
/// resolve them on the veths: each learns the other's MAC as a permanent
/// neighbour entry (as a port reads them from the kernel). False, with the
/// reason printed, where that cannot be done (not root, no `ip`).
pub fn veth_pair_in_own_namespace((a, b): (&str, &str), ips: (&str, &str), queues: u32) -> bool {
    // SAFETY: unshare(2) of this thread's network namespace only.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        eprintln!("SKIPPED: no network namespace of our own (root?)");
        return false;
    }
    let ip = |args: &str| {
        std::process::Command::new("ip")
            .args(args.split_whitespace())
            .status()
            .is_ok_and(|s| s.success())
    };
    let q = format!("numtxqueues {queues} numrxqueues {queues}");
    let set_up = ip("link set lo up")
        && ip(&format!("link add {a} {q} type veth peer name {b} {q}"))
        && ip(&format!("addr add {}/24 dev {a}", ips.0))
        && ip(&format!("addr add {}/24 dev {b}", ips.1))
        && ip(&format!("link set {a} mtu 9000 up"))
        && ip(&format!("link set {b} mtu 9000 up"));
    let mac = |i: &str| {
        burst_io::netdev::mac(i)
            .map(|m| m.map(|b| format!("{b:02x}")).join(":"))
            .unwrap_or_default()
    };
    let set_up = set_up
        && ip(&format!(
            "neigh replace {} lladdr {} dev {a} nud permanent",
            ips.1,
            mac(b)
        ))
        && ip(&format!(
            "neigh replace {} lladdr {} dev {b} nud permanent",
            ips.0,
            mac(a)
        ));
    if !set_up {
        eprintln!("SKIPPED: cannot set a veth pair up (no `ip`?)");
    }
    set_up
}

/// Whether `fd` is readable within `ms` milliseconds.
pub fn readable(fd: i32, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd, count 1.
    unsafe { libc::poll(&mut p, 1, ms) == 1 }
}

/// One side of the write-and-spin ping-pong of MPIs and of qperf's
/// `rc_rdma_write_poll_lat`, for `rounds` rounds: post a WRITE of the
/// round's number (from `base + 64` of this side's buffer, registered as
/// `mine`) to the start of the peer's buffer (`peer`), poll the CQ once,
/// then spin on memory at `base` until the peer's WRITE of the same number
/// lands (`first` sends first). Returns whether a poll or post of this side
/// was seen to claim its lane, and how many completions its polls took.
///
/// `base` must be the address of this side's registered buffer, of at
/// least 65 bytes, alive until this returns.
#[allow(clippy::too_many_arguments)]
pub fn write_and_spin(
    ctx: &Context,
    qp: Qpn,
    cq: CqId,
    base: usize,
    mine: &burst_mem::MrKeys,
    peer: &burst_mem::MrKeys,
    first: bool,
    rounds: u8,
) -> (bool, usize) {
    use burst_transport::{SendOp, SendWr, Sge, WcStatus};
    let deadline = Instant::now() + Duration::from_secs(60);
    let (flag, src) = (base as *const u8, (base + 64) as *mut u8);
    let (mut claimed, mut completed) = (false, 0);
    let mut send = |marker: u8| {
        // SAFETY: `src` is in this side's registered buffer, alive until
        // this returns (the caller's promise).
        unsafe { std::ptr::write_volatile(src, marker) };
        let op = SendOp::Write {
            remote_addr: peer.addr,
            rkey: peer.rkey,
        };
        let sge = Sge {
            addr: mine.addr + 64,
            length: 64,
            lkey: mine.lkey,
        };
        ctx.post_send(qp, &SendWr::new(u64::from(marker), op, [sge]))
            .unwrap();
        // One poll, as qperf: it rarely finds the completion.
        while let Some(w) = ctx.poll_cq(cq) {
            assert_eq!(w.status, WcStatus::Success);
            completed += 1;
        }
        claimed |= ctx.claimed_by_application();
    };
    for round in 1..=rounds {
        if first {
            send(round);
        }
        // SAFETY: `flag` is in this side's registered buffer; the peer's
        // WRITE lands there through the engine.
        while unsafe { std::ptr::read_volatile(flag) } != round {
            assert!(Instant::now() < deadline, "round {round} never came");
            std::hint::spin_loop();
        }
        if !first {
            send(round);
        }
    }
    (claimed, completed)
}

/// A port that corrupts one received packet of each listed opcode (the
/// `n`th of it: one payload byte 300 bytes before the ICRC, past every
/// header) and hands on everything else as `inner` does.
pub struct CorruptingPort<P> {
    inner: P,
    hit: Vec<(burst_wire::Opcode, usize)>,
    seen: Vec<usize>,
    frame: Vec<u8>,
}

impl<P> CorruptingPort<P> {
    /// Corrupts the `n`th received packet of each `(opcode, n)` of `hit`.
    pub fn new(inner: P, hit: Vec<(burst_wire::Opcode, usize)>) -> CorruptingPort<P> {
        let seen = vec![0; hit.len()];
        CorruptingPort {
            inner,
            hit,
            seen,
            frame: Vec::new(),
        }
    }
}

impl<P: burst_io::Port> burst_io::Port for CorruptingPort<P> {
    fn recv_frames(
        &mut self,
        max: usize,
        visit: &mut burst_io::RxVisit<'_>,
    ) -> std::io::Result<usize> {
        let (hit, seen, frame) = (&self.hit, &mut self.seen, &mut self.frame);
        self.inner.recv_frames(max, &mut |meta, bytes| {
            let op = burst_wire::IbPacket::new_checked(bytes).map(|p| p.opcode());
            let k = hit.iter().position(|&(o, _)| Ok(o) == op);
            let Some(k) = k else {
                return visit(meta, bytes);
            };
            seen[k] += 1;
            if seen[k] != hit[k].1 {
                return visit(meta, bytes);
            }
            frame.clear();
            frame.extend_from_slice(bytes);
            let at = frame.len() - 4 - 300;
            frame[at] ^= 0x5a;
            visit(meta, frame)
        })
    }
    fn assign_ip_ids(&self, bufs: &mut [burst_io::PacketBuf]) {
        self.inner.assign_ip_ids(bufs)
    }
    fn send_burst(&mut self, bufs: &[burst_io::PacketBuf]) -> std::io::Result<usize> {
        self.inner.send_burst(bufs)
    }
    burst_io::forward_port_control!(self => self.inner);
}
