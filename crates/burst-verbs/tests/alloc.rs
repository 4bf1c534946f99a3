//! No allocation per packet: a counting global allocator around two
//! engines driven by the test's own thread (`Drive::Caller`), over the
//! in-memory port, UDP sockets on loopback, and (features `dpdk`,
//! `af-xdp`, as root) DPDK memif and AF_XDP on a veth pair. After a warm-up (rings,
//! buffers, tables and the ports' pools reach their working size), a run of
//! RDMA WRITEs and of SEND/RECV messages — posting, segmenting, gathering,
//! sealing, sending, receiving, checking the ICRC, placing, ACKing and
//! completing — must allocate nothing on this thread.
//!
//! Its own test binary: the allocator counts for this file only.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use burst_io::{SimFaults, SimNet, UdpPort};
use burst_verbs::clock::Clock;
use burst_verbs::engine::{Context, CqId, Drive, Engine, EngineOptions};
use burst_verbs::{
    Access, MrKeys, Mtu, Psn, QpAccess, QpType, Qpn, RcParams, RcPeer, RecvWr, SendOp, SendWr, Sge,
    WcStatus,
};

struct Counting;

thread_local! {
    /// Allocations made by this thread while counting (`None`: not counting).
    static COUNT: Cell<Option<u64>> = const { Cell::new(None) };
}

fn note_alloc() {
    // `try_with`: the allocator also runs while thread locals are torn down.
    let _ = COUNT.try_with(|c| {
        if let Some(n) = c.get() {
            c.set(Some(n + 1));
        }
    });
}

// SAFETY: every call is passed to the system allocator unchanged; the
// counting touches only a thread-local `Cell` (no allocation, no lock).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note_alloc();
        // SAFETY: the caller's layout, as GlobalAlloc::alloc requires.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        note_alloc();
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` came from this allocator (the system's) with `l`.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        note_alloc();
        // SAFETY: `p` came from this allocator with `l`.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Allocations `f` makes on this thread.
fn allocations(f: impl FnOnce()) -> u64 {
    COUNT.with(|c| c.set(Some(0)));
    f();
    COUNT.with(|c| c.replace(None)).unwrap_or(0)
}

const MSG: usize = 16 * 4096;

struct Side {
    ctx: Context,
    qp: Qpn,
    cq: CqId,
    mr: MrKeys,
}

struct Pair {
    // Declared first: the engines hold registrations of `_bufs`.
    _engines: (Engine, Engine),
    a: Side,
    b: Side,
    /// The in-memory network's clock to move (`None`: real sockets).
    net: Option<SimNet>,
    now: u64,
    _bufs: (Vec<u8>, Vec<u8>),
}

fn pair(ports: (burst_verbs::AnyPort, burst_verbs::AnyPort), net: Option<SimNet>) -> Pair {
    let engine = |port| {
        let mut o = EngineOptions::new(Mtu::Mtu4096);
        o.drive = Drive::Caller;
        if net.is_some() {
            o.clock = Clock::manual();
        }
        Engine::with_ports(vec![port], o).unwrap()
    };
    let (ea, eb) = (engine(ports.0), engine(ports.1));
    let (a, b) = (ea.context(), eb.context());
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (cqa, cqb) = (a.create_cq(64), b.create_cq(64));
    let qa = a.create_qp(QpType::Rc, pa, cqa, cqa, 32).unwrap();
    let qb = b.create_qp(QpType::Rc, pb, cqb, cqb, 32).unwrap();
    let mut p = RcParams::new(Psn::new(0), Mtu::Mtu4096);
    p.access = QpAccess {
        remote_write: true,
        remote_read: true,
        remote_atomic: true,
    };
    let peer = |ctx: &Context, qpn| RcPeer {
        gid: ctx.gid(),
        qpn,
        psn: Psn::new(0),
    };
    a.connect_rc(qa, &peer(&b, qb), &p).unwrap();
    b.connect_rc(qb, &peer(&a, qa), &p).unwrap();
    let mut sbuf = vec![7u8; MSG];
    let mut dbuf = vec![0u8; MSG];
    let all = Access(1 | 2 | 4 | 8);
    // SAFETY: the buffers move into the Pair, which drops the engines first
    // (field order): the heap bytes stay put and outlive the registrations.
    let (ma, mb) = unsafe {
        (
            a.reg_mr(pa, sbuf.as_mut_ptr(), sbuf.len(), all).unwrap(),
            b.reg_mr(pb, dbuf.as_mut_ptr(), dbuf.len(), all).unwrap(),
        )
    };
    Pair {
        _engines: (ea, eb),
        a: Side {
            ctx: a,
            qp: qa,
            cq: cqa,
            mr: ma,
        },
        b: Side {
            ctx: b,
            qp: qb,
            cq: cqb,
            mr: mb,
        },
        net,
        now: 0,
        _bufs: (sbuf, dbuf),
    }
}

/// A [`Pair`] over two real ports that need a privilege or a device this
/// machine may lack; `None` (the test says SKIPPED) when either did not open.
#[cfg(any(feature = "dpdk", feature = "af-xdp"))]
fn pair_or_skip<P: burst_io::Port + Send + 'static>(
    what: &str,
    opened: (std::io::Result<P>, std::io::Result<P>),
) -> Option<Pair> {
    match opened {
        (Ok(a), Ok(b)) => Some(pair((Box::new(a), Box::new(b)), None)),
        (a, b) => {
            eprintln!("SKIPPED: no {what} here: {:?} {:?}", a.err(), b.err());
            None
        }
    }
}

impl Pair {
    /// Steps both engines until `a` completes a work request (and `b`
    /// too, when `both`); panics past 200,000 steps (on real ports, not
    /// before 20 s either: a link coming up, ARP, a loaded machine).
    fn until_complete(&mut self, both: bool) {
        let (mut done_a, mut done_b) = (false, !both);
        let patience = std::time::Instant::now() + std::time::Duration::from_secs(20);
        for step in 0.. {
            if step >= 200_000 && (self.net.is_some() || std::time::Instant::now() > patience) {
                break;
            }
            if let Some(net) = &self.net {
                self.now += 1_000;
                net.set_now(self.now);
                self.a.ctx.advance_clock_to(self.now);
                self.b.ctx.advance_clock_to(self.now);
            }
            self.a.ctx.progress();
            self.b.ctx.progress();
            if let Some(wc) = self.a.ctx.take_completion(self.a.cq) {
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                done_a = true;
            }
            if let Some(wc) = self.b.ctx.take_completion(self.b.cq) {
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                done_b = true;
            }
            if done_a && done_b {
                return;
            }
        }
        panic!("no completion (a: {done_a}, b: {done_b})");
    }

    /// One signaled 64 KiB WRITE (16 packets and their ACKs).
    fn write(&mut self, wr: &SendWr) {
        self.a.ctx.post_send(self.a.qp, wr).unwrap();
        self.until_complete(false);
    }

    /// One 64 KiB SEND into a posted receive.
    fn send(&mut self, wr: &SendWr, recv: &RecvWr) {
        self.b.ctx.post_recv(self.b.qp, recv).unwrap();
        self.a.ctx.post_send(self.a.qp, wr).unwrap();
        self.until_complete(true);
    }

    fn check(&mut self, what: &str) {
        self.check_at_most(what, 0);
    }

    /// [`Pair::check`], allowing `most` allocations per run of 64 messages
    /// (1,024 packets) for a port that does some work on a timer.
    fn check_at_most(&mut self, what: &str, most: u64) {
        let write = SendWr::new(
            1,
            SendOp::Write {
                remote_addr: self.b.mr.addr,
                rkey: self.b.mr.rkey,
            },
            [Sge {
                addr: self.a.mr.addr,
                length: MSG as u32,
                lkey: self.a.mr.lkey,
            }],
        );
        let send = SendWr::new(
            2,
            SendOp::Send,
            [Sge {
                addr: self.a.mr.addr,
                length: MSG as u32,
                lkey: self.a.mr.lkey,
            }],
        );
        let recv = RecvWr {
            wr_id: 3,
            sg_list: [Sge {
                addr: self.b.mr.addr,
                length: MSG as u32,
                lkey: self.b.mr.lkey,
            }]
            .into(),
        };
        // Warm-up: queues, pools and tables grow to their working size.
        for _ in 0..64 {
            self.write(&write);
            self.send(&send, &recv);
        }
        let n = allocations(|| {
            for _ in 0..64 {
                self.write(&write);
            }
        });
        eprintln!("{what}: 64 WRITEs of 16 packets: {n} allocations");
        assert!(
            n <= most,
            "{what}: 64 WRITEs of 16 packets allocated {n} times"
        );
        let n = allocations(|| {
            for _ in 0..64 {
                self.send(&send, &recv);
            }
        });
        eprintln!("{what}: 64 SENDs of 16 packets: {n} allocations");
        assert!(
            n <= most,
            "{what}: 64 SENDs of 16 packets allocated {n} times"
        );
    }
}

#[test]
fn the_data_path_allocates_nothing_per_packet_over_the_in_memory_port() {
    let faults = SimFaults {
        jitter_ns: 1,
        delay_ns: 1,
        ..SimFaults::default()
    };
    let net = SimNet::new(1, faults);
    let port = |ip: &str| Box::new(net.port(format!("{ip}:4791").parse().unwrap())) as _;
    let mut p = pair((port("198.18.0.1"), port("198.18.0.2")), Some(net.clone()));
    p.check("SimPort");
}

#[test]
fn the_data_path_allocates_nothing_per_packet_over_udp_sockets() {
    let port = |ip: &str| Box::new(UdpPort::bind(ip.parse().unwrap()).unwrap()) as _;
    let mut p = pair((port("127.0.152.1"), port("127.0.152.2")), None);
    p.check("UdpPort");
}

/// DPDK (feature `dpdk`; the EAL needs root): two memif devices of one
/// process joined through one socket, server and client, burst building
/// its packets in the mbufs the port lends. Skipped where the EAL or memif
/// cannot start.
#[cfg(feature = "dpdk")]
#[test]
fn the_data_path_allocates_nothing_per_packet_over_dpdk_memif() {
    use burst_io::dpdk::{open_port, DpdkConfig};
    let pid = std::process::id();
    let sock = format!("/tmp/burst-alloctest-{pid}.sock");
    let memif = |n: u8, role: &str| {
        format!("--vdev=net_memif{n},role={role},socket={sock},socket-abstract=no,bsize=9216")
    };
    let eal = format!(
        "--file-prefix=burst-alloctest-{pid} {} {}",
        memif(0, "server"),
        memif(1, "client")
    );
    let open = |dev: &str, ip: &str| {
        open_port(
            &DpdkConfig::parse(&format!("{eal} device={dev}")),
            ip.parse().unwrap(),
        )
    };
    let opened = (
        open("net_memif0", "198.18.0.1"),
        open("net_memif1", "198.18.0.2"),
    );
    let Some(mut p) = pair_or_skip("DPDK memif", opened) else {
        return;
    };
    p.check("DPDK memif");
    drop(p);
    let _ = std::fs::remove_file(sock);
}

/// AF_XDP (feature `af-xdp`; needs root): the two ends of a veth pair in a
/// network namespace of the test's own, an XSK on each. The port asks the
/// kernel's neighbour table again every 10 s (netlink, which allocates):
/// a handful of allocations in a run of 2,048 packets may be that, so the
/// bound is "fewer than one per 64 packets", not 0.
#[cfg(feature = "af-xdp")]
#[test]
fn the_data_path_allocates_nothing_per_packet_over_af_xdp() {
    // Namespaces are per thread: the engines are driven by this one.
    std::thread::spawn(af_xdp_in_own_namespace)
        .join()
        .expect("test thread");
}

#[cfg(feature = "af-xdp")]
fn af_xdp_in_own_namespace() {
    use burst_io::xsk::{open_port, XskConfig};
    if !common::veth_pair_in_own_namespace(
        ("balloc0", "balloc1"),
        ("198.18.0.153", "198.18.0.154"),
        1,
    ) {
        return;
    }
    let open = |iface: &str, a: &str| open_port(&XskConfig::new(iface), a.parse().unwrap());
    let opened = (
        open("balloc0", "198.18.0.153"),
        open("balloc1", "198.18.0.154"),
    );
    let Some(mut p) = pair_or_skip("AF_XDP", opened) else {
        return;
    };
    p.check_at_most("AF_XDP", 32);
}
