//! The engine's data-plane core over the in-memory port: faults the
//! kernel's loopback never shows (corruption, reordering, duplication,
//! hidden and counting IP IDs, IPv6), on simulated time.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use burst_io::{SimFaults, SimNet};
use burst_mem::Access;
use burst_transport::*;
use burst_verbs::clock::Clock;
use burst_verbs::engine::{Context, CqId, Drive, Engine, EngineOptions, QueuePair};
use burst_verbs::{QpInit, RcParams, RcPeer};
use burst_wire::{Mtu, Psn};

mod common;
use common::CorruptingPort;

const ALL: Access = Access(1 | 2 | 4 | 8);

/// An engine over `port` that the test steps on a manual clock.
fn sim_engine(port: impl burst_io::Port + Send + 'static) -> (Engine, Context) {
    let mut o = EngineOptions::new(Mtu::Mtu1024);
    o.drive = Drive::Caller;
    o.clock = Clock::manual();
    let e = Engine::with_port(port, o).unwrap();
    let c = e.context();
    (e, c)
}

struct Pair {
    net: SimNet,
    a: Context,
    b: Context,
    qa: QueuePair,
    qb: QueuePair,
    cqa: CqId,
    cqb: CqId,
    now: u64,
    _engines: (Engine, Engine),
}

fn pair(faults: SimFaults, a: &str, b: &str) -> Pair {
    let net = SimNet::new(11, faults);
    let (pa, pb) = (
        net.port(a.parse::<SocketAddr>().unwrap()),
        net.port(b.parse::<SocketAddr>().unwrap()),
    );
    pair_over(net, pa, pb)
}

/// Two engines over `a` and `b` (ports of `net`), one RC QP each,
/// connected.
fn pair_over(
    net: SimNet,
    a: impl burst_io::Port + Send + 'static,
    b: impl burst_io::Port + Send + 'static,
) -> Pair {
    let (ea, a) = sim_engine(a);
    let (eb, b) = sim_engine(b);
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (cqa, cqb) = (a.create_cq(64), b.create_cq(64));
    let qa = a
        .create_qp_with(&QpInit::new(QpType::Rc, pa), cqa, cqa)
        .unwrap();
    let qb = b
        .create_qp_with(&QpInit::new(QpType::Rc, pb), cqb, cqb)
        .unwrap();
    let params = |psn| {
        let mut p = RcParams::new(Psn::new(psn), Mtu::Mtu1024);
        p.access = QpAccess {
            remote_write: true,
            remote_read: true,
            remote_atomic: true,
        };
        p.timeout = 10;
        p.min_rnr_timer = 1;
        p.rd_atomic = 4;
        p
    };
    let peer = |c: &Context, q: &QueuePair, psn| RcPeer {
        gid: c.gid(),
        qpn: q.qpn(),
        psn: Psn::new(psn),
    };
    let (pa_, pb_) = (peer(&a, &qa, 0xfffff0), peer(&b, &qb, 77));
    qa.connect_rc(&pb_, &params(0xfffff0)).unwrap();
    qb.connect_rc(&pa_, &params(77)).unwrap();
    Pair {
        net,
        a,
        b,
        qa,
        qb,
        cqa,
        cqb,
        now: 0,
        _engines: (ea, eb),
    }
}

impl Pair {
    /// Runs both engines on simulated time until `na`/`nb` completions are
    /// in or 10 simulated seconds pass.
    fn run(&mut self, na: usize, nb: usize) -> (Vec<WorkCompletion>, Vec<WorkCompletion>) {
        let (mut ra, mut rb) = (Vec::new(), Vec::new());
        while self.now < 10_000_000_000 && (ra.len() < na || rb.len() < nb) {
            self.net.set_now(self.now);
            self.a.advance_clock_to(self.now);
            self.b.advance_clock_to(self.now);
            let moved = self.a.progress() | self.b.progress();
            while let Some(w) = self.a.take_completion(self.cqa) {
                ra.push(w);
            }
            while let Some(w) = self.b.take_completion(self.cqb) {
                rb.push(w);
            }
            if moved {
                continue;
            }
            // Idle: jump to the next packet arrival or timer.
            let next = [
                self.net.next_event(),
                self.a.next_timeout(),
                self.b.next_timeout(),
            ]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(self.now + 1_000_000);
            self.now = next.max(self.now + 1);
        }
        (ra, rb)
    }
}

fn transfer(p: &mut Pair) {
    let size = 300_000usize;
    let src: Vec<u8> = (0..size as u32).map(|i| (i * 13) as u8).collect();
    let mut src = src;
    let mut dst = vec![0u8; size];
    let mut back = vec![0u8; size];
    // SAFETY: the buffers outlive the engines' use of them (deregistered
    // when the engines drop at the end of the test, after the last poll).
    let (ks, kb) = unsafe {
        (
            p.a.reg_mr(burst_mem::Pd(1), src.as_mut_ptr(), size, ALL)
                .unwrap(),
            p.a.reg_mr(burst_mem::Pd(1), back.as_mut_ptr(), size, ALL)
                .unwrap(),
        )
    };
    // SAFETY: as above.
    let kd = unsafe {
        p.b.reg_mr(burst_mem::Pd(1), dst.as_mut_ptr(), size, ALL)
            .unwrap()
    };
    let sge = |k: burst_mem::MrKeys, len: usize| {
        [Sge {
            addr: k.addr,
            length: len as u32,
            lkey: k.lkey,
        }]
        .into()
    };
    p.qb.post_recv(&RecvWr {
        wr_id: 9,
        sg_list: sge(kd, 100_000),
    })
    .unwrap();
    let w = |rkey| SendOp::Write {
        remote_addr: kd.addr + 100_000,
        rkey,
    };
    let read = SendOp::Read {
        remote_addr: kd.addr,
        rkey: kd.rkey,
    };
    p.qa.post_send(&SendWr::new(1, SendOp::Send, sge(ks, 100_000)))
        .unwrap();
    let mut wr = SendWr::new(2, w(kd.rkey), sge(ks, 200_000));
    wr.sg_list[0].addr += 100_000;
    p.qa.post_send(&wr).unwrap();
    p.qa.post_send(&SendWr::new(3, read, sge(kb, size)))
        .unwrap();
    let (wa, wb) = p.run(3, 1);
    assert_eq!(wa.len(), 3, "requester completions {wa:?} by {} ns", p.now);
    assert!(wa.iter().all(|w| w.status == WcStatus::Success), "{wa:?}");
    assert_eq!(
        (wb[0].wr_id, wb[0].status, wb[0].byte_len),
        (9, WcStatus::Success, 100_000)
    );
    assert!(dst == src, "SEND and WRITE placed every byte");
    assert!(back == src, "READ brought every byte back");
}

#[test]
fn rc_over_a_faulty_network_with_hidden_ip_ids() {
    let f = SimFaults {
        loss: 0.03,
        reorder: 0.03,
        dup: 0.01,
        corrupt: 0.01,
        hide_ip_id: true,
        ..SimFaults::default()
    };
    let mut p = pair(f, "198.18.0.1:4791", "198.18.0.2:4791");
    transfer(&mut p);
    let s = p.net.stats();
    assert!(s.lost > 0 && s.corrupted > 0 && s.duplicated > 0, "{s:?}");
    let (ca, cb) = (p.a.counters().unwrap(), p.b.counters().unwrap());
    // SimPort's IDs count per packet and the receiver cannot see them: only
    // ID 0 verifies directly, the rest are solved for.
    assert!(cb.icrc_id_solved > 100, "{cb:?}");
    assert_eq!(ca.icrc_unverified + cb.icrc_unverified, 0);
    // Every corrupted packet is refused: as malformed, or by the ICRC.
    let refused = ca.icrc_errors + cb.icrc_errors + ca.malformed + cb.malformed;
    assert!(
        refused > 0 && refused <= s.corrupted,
        "{refused} of {}",
        s.corrupted
    );
    assert!(ca.qps.retransmitted_pkts > 0);
}

#[test]
fn ipv6_icrc_is_verified_and_a_mismatch_is_dropped() {
    let f = SimFaults {
        corrupt: 0.02,
        hide_ip_id: true,
        ..SimFaults::default()
    };
    let mut p = pair(f, "[fd00::1]:4791", "[fd00::2]:4791");
    transfer(&mut p);
    let (ca, cb) = (p.a.counters().unwrap(), p.b.counters().unwrap());
    // IPv6 masks every field a host varies: every good packet verifies at
    // full strength, every corrupted one that still parses is a drop.
    assert_eq!(ca.icrc_unverified + cb.icrc_unverified, 0, "{ca:?} {cb:?}");
    assert_eq!(ca.icrc_id_solved + cb.icrc_id_solved, 0);
    assert!(ca.icrc_verified > 0 && cb.icrc_verified > 0);
    assert!(ca.icrc_errors + cb.icrc_errors > 0, "{ca:?} {cb:?}");
    let s = p.net.stats();
    let refused = ca.icrc_errors + cb.icrc_errors + ca.malformed + cb.malformed;
    assert!(refused <= s.corrupted);
}

#[test]
fn a_payload_placed_while_checked_is_dropped_when_corrupt_and_resent() {
    use burst_wire::Opcode;
    let net = SimNet::new(11, SimFaults::default());
    let a = net.port("198.18.0.1:4791".parse().unwrap());
    let b = CorruptingPort::new(
        net.port("198.18.0.2:4791".parse().unwrap()),
        vec![
            (Opcode::RC_SEND_MIDDLE, 20),
            (Opcode::RC_RDMA_WRITE_MIDDLE, 50),
        ],
    );
    let mut p = pair_over(net, a, b);
    transfer(&mut p);
    let (ca, cb) = (p.a.counters().unwrap(), p.b.counters().unwrap());
    assert_eq!(cb.icrc_errors, 2, "{cb:?}");
    assert!(ca.qps.retransmitted_pkts >= 2, "{ca:?}");
    // The SEND's and the WRITE's payloads but their first and last
    // packets (300,000 bytes, 1 KiB MTU), and the two resent.
    assert!(cb.copy.placed_fused_bytes > 290_000, "{:?}", cb.copy);
    // ... and not copied again by the transport's write: only the first
    // and last packets were (two first packets, the WRITE's 320-byte last).
    assert_eq!(cb.copy.cpu_bytes, 2 * 1024 + 320, "{:?}", cb.copy);
    // The READ's responses are the requester's: placed as copies.
    assert_eq!(ca.copy.placed_fused_bytes, 0, "{:?}", ca.copy);
}

/// A port that panics on receive once armed: a fault outside any QP.
struct FaultyPort {
    inner: burst_io::SimPort,
    armed: Arc<AtomicBool>,
}

impl burst_io::Port for FaultyPort {
    fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr()
    }
    fn recv_frames(
        &mut self,
        max: usize,
        visit: &mut burst_io::RxVisit<'_>,
    ) -> std::io::Result<usize> {
        assert!(
            !self.armed.load(Ordering::Relaxed),
            "fault injected in the port"
        );
        self.inner.recv_frames(max, visit)
    }
    fn assign_ip_ids(&self, bufs: &mut [burst_io::PacketBuf]) {
        self.inner.assign_ip_ids(bufs)
    }
    fn send_burst(&mut self, bufs: &[burst_io::PacketBuf]) -> std::io::Result<usize> {
        self.inner.send_burst(bufs)
    }
}

#[test]
fn a_fault_outside_any_qp_fails_the_device_not_the_caller() {
    use burst_verbs::AsyncEvent;
    let net = SimNet::new(1, SimFaults::default());
    let armed = Arc::new(AtomicBool::new(false));
    let port = FaultyPort {
        inner: net.port("198.18.0.1:4791".parse().unwrap()),
        armed: Arc::clone(&armed),
    };
    let (_e, d) = sim_engine(port);
    let pd = d.alloc_pd();
    let cq = d.create_cq(16);
    let q1 = d
        .create_qp_with(&QpInit::new(QpType::Rc, pd), cq, cq)
        .unwrap();
    let q2 = d
        .create_qp_with(&QpInit::new(QpType::Ud, pd), cq, cq)
        .unwrap();
    for (q, ud) in [(&q1, false), (&q2, true)] {
        q.modify(&QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            port: Some(1),
            qkey: ud.then_some(1),
            access: (!ud).then_some(QpAccess::default()),
            ..Default::default()
        })
        .unwrap();
    }
    let mut buf = vec![0u8; 64];
    // SAFETY: `buf` outlives the engine (dropped at the end of the test).
    let k = unsafe { d.reg_mr(pd, buf.as_mut_ptr(), 64, ALL).unwrap() };
    let sge = [Sge {
        addr: k.addr,
        length: 64,
        lkey: k.lkey,
    }]
    .into();
    q1.post_recv(&RecvWr {
        wr_id: 5,
        sg_list: sge,
    })
    .unwrap();
    d.advance_clock_to(1);
    d.progress();
    assert!(!d.progress(), "idle");
    armed.store(true, Ordering::Relaxed);
    // The caller does not unwind; every QP fails, with its WRs flushed.
    d.advance_clock_to(2);
    d.progress();
    let events: Vec<_> = std::iter::from_fn(|| d.take_async_event()).collect();
    assert_eq!(
        events,
        [
            AsyncEvent::Qp(q1.qpn(), QpEvent::Fatal),
            AsyncEvent::Qp(q2.qpn(), QpEvent::Fatal),
            AsyncEvent::DeviceFatal
        ]
    );
    for q in [&q1, &q2] {
        assert_eq!(d.query_qp(q.qpn()).unwrap().0, QpState::Err);
    }
    let wc = d.take_completion(cq).expect("the receive is flushed");
    assert_eq!((wc.wr_id, wc.status), (5, WcStatus::WrFlushErr));
    // The engine still answers (no poisoned state): disarmed, it steps again.
    armed.store(false, Ordering::Relaxed);
    d.advance_clock_to(3);
    d.progress();
    assert_eq!(d.take_async_event(), None);
}

#[test]
fn an_ack_waiting_in_the_port_stops_its_timer_before_it_fires() {
    // A thread posts, then does not step the lane for longer than the ACK
    // timeout (it posts to a thousand QPs, or is descheduled); the ACK came
    // meanwhile and waits in the port. An RNIC takes ACKs as they come: the
    // lane's next step reads the port before it runs an expired timer, so
    // nothing is resent and no retry is spent.
    let mut p = pair(SimFaults::default(), "10.0.0.1:4791", "10.0.0.2:4791");
    let mut src = vec![7u8; 64];
    let mut dst = vec![0u8; 64];
    // SAFETY: both buffers outlive the engines (dropped with `p` first).
    let (ks, kd) = unsafe {
        (
            p.a.reg_mr(burst_mem::Pd(1), src.as_mut_ptr(), 64, ALL)
                .unwrap(),
            p.b.reg_mr(burst_mem::Pd(1), dst.as_mut_ptr(), 64, ALL)
                .unwrap(),
        )
    };
    let wr = SendWr::new(
        1,
        SendOp::Write {
            remote_addr: kd.addr,
            rkey: kd.rkey,
        },
        SgList::from([Sge {
            addr: ks.addr,
            length: 64,
            lkey: ks.lkey,
        }]),
    );
    p.qa.post_send(&wr).unwrap();
    // Only B steps: it takes the WRITE and sends its ACK.
    for _ in 0..100 {
        p.now += 10_000;
        p.net.set_now(p.now);
        p.b.advance_clock_to(p.now);
        p.b.progress();
    }
    assert_eq!(dst, src, "B placed the WRITE");
    // A steps again long after its ACK timeout (4.2 ms at timeout 10).
    p.now += 100_000_000;
    p.net.set_now(p.now);
    p.a.advance_clock_to(p.now);
    p.a.progress();
    let w = p.a.take_completion(p.cqa).expect("the WRITE completed");
    assert_eq!(w.status, WcStatus::Success);
    let c = p.a.counters().unwrap().qps;
    assert_eq!(
        (c.retransmitted_pkts, c.completer_retry_err),
        (0, 0),
        "the ACK in the port was not taken before the timer: {c:?}"
    );
}
