//! Data-plane cost per packet: the whole core, not only the transport. Two
//! engines (driven by the caller, on a manual clock) over the in-memory
//! port move an RDMA WRITE stream at path MTU
//! 4096 with real memory registration: the sender builds headers, gathers
//! the payload from registered memory and seals the ICRC; the receiver
//! checks the ICRC, demuxes, checks the rkey and places the payload; ACKs
//! flow back. `SimNet` adds its own copy per packet (the frame is queued
//! as bytes) and one more into the receive batch, so this is an upper
//! bound of what a zero-copy port would cost. Throughput is in packets.
//!
//! One case per CPU copy path: `cpu` (the gather computes the payload's CRC
//! as it copies, the seal reads only the headers) and `cpu-plain` (copy,
//! then the ICRC over the whole packet); `dsa-model` adds the offload
//! engine's bookkeeping and the model's thread hand-offs (not a device's
//! speed).
//!
//! `cargo bench -p burst-verbs --bench core` (next to it:
//! `cargo bench -p burst-transport --bench transport`, protocol only)

use burst_io::{SimFaults, SimNet};
use burst_verbs::clock::Clock;
use burst_verbs::config::CopyBackend;
use burst_verbs::engine::{Context, CqId, Drive, Engine, EngineOptions};
use burst_verbs::{
    Access, MrKeys, Mtu, Psn, QpAccess, QpType, RcParams, RcPeer, RecvWr, SendOp, SendWr, Sge,
    WcStatus,
};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

const PKTS: usize = 64;
const MTU: usize = 4096;

struct Pair {
    // Declared first: the engines hold registrations of `_bufs`.
    _engines: (Engine, Engine),
    a: Context,
    b: Context,
    net: SimNet,
    qa: burst_verbs::Qpn,
    qb: burst_verbs::Qpn,
    cqa: CqId,
    cqb: CqId,
    src: MrKeys,
    dst: MrKeys,
    now: u64,
    _bufs: (Vec<u8>, Vec<u8>),
}

fn pair(copy: CopyBackend) -> Pair {
    // No link rate or send-queue limit: the bench times the CPU work.
    let faults = SimFaults {
        link_gbps: 0,
        tx_queue_ns: 0,
        jitter_ns: 1,
        delay_ns: 1,
        ..SimFaults::default()
    };
    let net = SimNet::new(1, faults);
    let engine = |ip: &str| {
        let port = net.port(format!("{ip}:4791").parse().unwrap());
        let mut o = EngineOptions::new(Mtu::Mtu4096);
        o.drive = Drive::Caller;
        o.clock = Clock::manual();
        o.copy.backend = copy;
        o.copy.min_offload = 0;
        Engine::with_port(port, o).unwrap()
    };
    let (ea, eb) = (engine("198.18.0.1"), engine("198.18.0.2"));
    let (a, b) = (ea.context(), eb.context());
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (cqa, cqb) = (a.create_cq(16), b.create_cq(16));
    let qa = a.create_qp(QpType::Rc, pa, cqa, cqa, 16).unwrap();
    let qb = b.create_qp(QpType::Rc, pb, cqb, cqb, 16).unwrap();
    let mut p = RcParams::new(Psn::new(0), Mtu::Mtu4096);
    p.access = QpAccess {
        remote_write: true,
        remote_read: true,
        remote_atomic: true,
    };
    let (ga, gb) = (a.gid(), b.gid());
    a.connect_rc(
        qa,
        &RcPeer {
            gid: gb,
            qpn: qb,
            psn: Psn::new(0),
        },
        &p,
    )
    .unwrap();
    b.connect_rc(
        qb,
        &RcPeer {
            gid: ga,
            qpn: qa,
            psn: Psn::new(0),
        },
        &p,
    )
    .unwrap();
    let mut sbuf = vec![7u8; PKTS * MTU];
    let mut dbuf = vec![0u8; PKTS * MTU];
    let all = Access(1 | 2 | 4 | 8);
    // SAFETY: the buffers move into the Pair, which drops the engines first
    // (field order): the heap bytes stay put and outlive the registrations.
    let (src, dst) = unsafe {
        (
            a.reg_mr(pa, sbuf.as_mut_ptr(), sbuf.len(), all).unwrap(),
            b.reg_mr(pb, dbuf.as_mut_ptr(), dbuf.len(), all).unwrap(),
        )
    };
    Pair {
        _engines: (ea, eb),
        a,
        b,
        net,
        qa,
        qb,
        cqa,
        cqb,
        src,
        dst,
        now: 0,
        _bufs: (sbuf, dbuf),
    }
}

impl Pair {
    /// One signaled WRITE of `PKTS` packets, driven to its completion.
    fn write(&mut self) {
        let wr = SendWr::new(
            1,
            SendOp::Write {
                remote_addr: self.dst.addr,
                rkey: self.dst.rkey,
            },
            [Sge {
                addr: self.src.addr,
                length: (PKTS * MTU) as u32,
                lkey: self.src.lkey,
            }],
        );
        self.a.post_send(self.qa, &wr).unwrap();
        loop {
            self.now += 1_000;
            self.net.set_now(self.now);
            self.a.advance_clock_to(self.now);
            self.b.advance_clock_to(self.now);
            self.a.progress();
            self.b.progress();
            if let Some(wc) = self.a.take_completion(self.cqa) {
                assert_eq!(wc.status, WcStatus::Success);
                return;
            }
        }
    }
}

impl Pair {
    /// One 64 B SEND each way, as a polled ping-pong does it: each side
    /// posts a receive, the sender posts, the receiver polls until the
    /// message lands and answers; ends when the answer lands.
    fn ping_pong(&mut self) {
        let sge = |k: &MrKeys| Sge {
            addr: k.addr,
            length: 64,
            lkey: k.lkey,
        };
        let recv = |k: &MrKeys| RecvWr {
            wr_id: 2,
            sg_list: [Sge {
                addr: k.addr + 4096,
                ..sge(k)
            }]
            .into(),
        };
        let (sa, sb) = (sge(&self.src), sge(&self.dst));
        self.a.post_recv(self.qa, &recv(&self.src)).unwrap();
        self.b.post_recv(self.qb, &recv(&self.dst)).unwrap();
        self.a
            .post_send(self.qa, &SendWr::new(1, SendOp::Send, [sa]))
            .unwrap();
        // Each side polls until its receive completes (its send's
        // completion comes with the ACK, taken on the way).
        let turn = |me: &Context, cq: CqId, now: &mut u64, net: &SimNet| loop {
            *now += 1_000;
            net.set_now(*now);
            me.advance_clock_to(*now);
            if let Some(wc) = me.poll_cq(cq) {
                assert_eq!(wc.status, WcStatus::Success);
                if wc.wr_id == 2 {
                    return;
                }
            }
        };
        turn(&self.b, self.cqb, &mut self.now, &self.net);
        self.b
            .post_send(self.qb, &SendWr::new(1, SendOp::Send, [sb]))
            .unwrap();
        turn(&self.a, self.cqa, &mut self.now, &self.net);
        // The other side's clock keeps up (ACK timers).
        self.b.advance_clock_to(self.now);
    }
}

impl Pair {
    /// Adds `n` idle RC QPs to the sending engine, connected (RTS) to
    /// made-up QPs of the receiver: nothing to send, no timer running.
    fn add_idle_qps(&mut self, n: usize) {
        let pd = self.a.alloc_pd();
        let cq = self.a.create_cq(16);
        let gb = self.b.gid();
        for i in 0..n {
            let q = self.a.create_qp(QpType::Rc, pd, cq, cq, 128).unwrap();
            let peer = RcPeer {
                gid: gb,
                qpn: burst_verbs::Qpn::new(0x10_0000 + i as u32).unwrap(),
                psn: Psn::new(0),
            };
            self.a
                .connect_rc(q, &peer, &RcParams::new(Psn::new(0), Mtu::Mtu4096))
                .unwrap();
        }
    }
}

/// What idle QPs cost a lane (issue 34: work proportional to active QPs):
/// one engine step with nothing to do, and the 64-packet WRITE above,
/// beside 64, 1,024 and 10,240 idle QPs.
fn idle_qps(c: &mut Criterion) {
    let mut g = c.benchmark_group("idle_qps");
    for n in [64usize, 1024, 10_240] {
        let mut p = pair(CopyBackend::Cpu);
        p.add_idle_qps(n);
        g.throughput(Throughput::Elements(1));
        g.bench_function(format!("step/{n}"), |b| b.iter(|| p.a.progress()));
        g.throughput(Throughput::Elements(PKTS as u64));
        g.bench_function(format!("rc_write_4k_per_packet/{n}"), |b| {
            b.iter(|| p.write())
        });
    }
    g.finish();
}

fn core(c: &mut Criterion) {
    let mut g = c.benchmark_group("core");
    g.throughput(Throughput::Elements(PKTS as u64));
    for copy in [
        CopyBackend::Cpu,
        CopyBackend::CpuPlain,
        CopyBackend::DsaModel,
    ] {
        let mut p = pair(copy);
        g.bench_function(format!("rc_write_4k_per_packet/{}", copy.name()), |b| {
            b.iter(|| p.write())
        });
    }
    g.finish();
    // Latency's share of the core: the user-space work of one polled
    // 64 B round trip (both sides' receive, completion, post, transmit).
    let mut g = c.benchmark_group("core_ping_pong");
    g.throughput(Throughput::Elements(1));
    let mut p = pair(CopyBackend::Cpu);
    g.bench_function("rc_send_64_round_trip", |b| b.iter(|| p.ping_pong()));
    g.finish();
}

criterion_group!(benches, core, idle_qps);
criterion_main!(benches);
