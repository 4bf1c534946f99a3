//! burstd's shared memory under a hostile client: one client of a live
//! daemon (an engine over the in-memory port, stepped by this target)
//! scribbles arbitrary words over every segment it shares with the
//! daemon (its doorbells and async-event ring, its QP's rings and words,
//! its CQ, the lanes' sleep words) and posts arbitrary send requests,
//! inline-flagged ones without their bytes included, naming the lkey of a
//! buffer another owner registered. After each input:
//!
//! - the engine is still stepping (no panic, no hang: every step returns);
//! - another owner's RC pair still completes a SEND round trip;
//! - no byte of the other owner's secret ever arrived anywhere (the sink
//!   UD QP the hostile client sends to holds none of it).
#![no_main]

use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, OnceLock};

use burst_verbs::engine::{Context, CqId, Drive, Engine, EngineOptions, QueuePair};
use burst_verbs::ports::{SimFaults, SimNet};
use burst_verbs::protocol::{self as p, Reply, Request};
use burst_verbs::shm::{Segment, ShmRing};
use burst_verbs::{
    Access, Mtu, Psn, QpInit, QpType, Qpn, RcParams, RcPeer, RecvWr, SendOp, SendWr, Sge, UdDest,
};
use burstd::{Client, Daemon};
use libfuzzer_sys::fuzz_target;

const SECRET: u8 = 0xa5;
const QKEY: u32 = 0x1111;

struct Evil {
    client: Arc<Client>,
    qp: Arc<Segment>,
    send: ShmRing<SendWr>,
    cq: Arc<Segment>,
    ah: u32,
    evil_lkey: u32,
    evil_addr: u64,
}

struct World {
    _daemon: Arc<Daemon>,
    ctx: Context,
    evil: Evil,
    /// The good owner's secret (registered LOCAL_WRITE | REMOTE_WRITE).
    secret: (u64, u32),
    good: (QueuePair, QueuePair, CqId, Sge, Sge),
    sink: (QueuePair, CqId, &'static mut [u8], u32),
    net: SimNet,
    /// Simulated time (ns).
    now: std::sync::atomic::AtomicU64,
    _engine: Engine,
}

fn leak(len: usize, fill: u8) -> &'static mut [u8] {
    Box::leak(vec![fill; len].into_boxed_slice())
}

fn ask(d: &Daemon, c: &Client, r: &Request, fds: Vec<OwnedFd>) -> (Reply, Vec<OwnedFd>) {
    d.handle_message(c, &p::encode(r), fds)
}

fn world() -> &'static Mutex<World> {
    static W: OnceLock<Mutex<World>> = OnceLock::new();
    W.get_or_init(|| {
        let net = SimNet::new(1, SimFaults::default());
        let mut o = EngineOptions::new(Mtu::Mtu1024);
        o.drive = Drive::Caller;
        o.clock = burst_verbs::clock::Clock::manual();
        o.shared_rings = true;
        let engine = Engine::with_port(net.port("198.18.0.1:4791".parse().unwrap()), o).unwrap();
        let ctx = engine.context();
        let daemon = Daemon::new(ctx.clone(), burst_verbs::ports::Tap::new());

        // The good owner (the engine's own process): a secret, an RC pair
        // over the device's own address, and a UD sink.
        let pd = ctx.alloc_pd();
        let secret = leak(4096, SECRET);
        // SAFETY: leaked, lives for ever.
        let sk = unsafe { ctx.reg_mr(pd, secret.as_mut_ptr(), 4096, Access(1 | 2)) }.unwrap();
        let cq = ctx.create_cq(64);
        let qa = ctx
            .create_qp_with(&QpInit::new(QpType::Rc, pd), cq, cq)
            .unwrap();
        let qb = ctx
            .create_qp_with(&QpInit::new(QpType::Rc, pd), cq, cq)
            .unwrap();
        let params = RcParams::new(Psn::new(5), Mtu::Mtu1024);
        let peer = |q: &QueuePair| RcPeer {
            gid: ctx.gid(),
            qpn: q.qpn(),
            psn: Psn::new(5),
        };
        qa.connect_rc(&peer(&qb), &params).unwrap();
        qb.connect_rc(&peer(&qa), &params).unwrap();
        let bufs = leak(8192, 1);
        // SAFETY: leaked.
        let bk = unsafe { ctx.reg_mr(pd, bufs.as_mut_ptr(), 8192, Access(1)) }.unwrap();
        let src = Sge {
            addr: bk.addr,
            length: 64,
            lkey: bk.lkey,
        };
        let dst = Sge {
            addr: bk.addr + 4096,
            length: 64,
            lkey: bk.lkey,
        };
        let scq = ctx.create_cq(256);
        let sink = ctx
            .create_qp_with(&QpInit::new(QpType::Ud, pd), scq, scq)
            .unwrap();
        for a in burst_verbs::ud_transitions(QKEY, Psn::new(0)) {
            sink.modify(&a).unwrap();
        }
        let sbuf = leak(4096 * 16, 0);
        // SAFETY: leaked.
        let sbk = unsafe { ctx.reg_mr(pd, sbuf.as_mut_ptr(), sbuf.len(), Access(1)) }.unwrap();

        // The hostile client: a PD, a CQ, a UD QP in RTS, an AH to the sink,
        // and a region of its own (single copy through this process's mem).
        let client = daemon.local_client().unwrap();
        let Reply::Pd { pd: epd } = ask(&daemon, &client, &Request::AllocPd, vec![]).0 else {
            panic!("pd")
        };
        let (Reply::Cq { cq: ecq, len, .. }, fds) = ask(
            &daemon,
            &client,
            &Request::CreateCq {
                depth: 4,
                channel: None,
            },
            vec![],
        ) else {
            panic!("cq")
        };
        let cq_seg =
            Arc::new(Segment::from_fd(fds.into_iter().next().unwrap(), len as usize).unwrap());
        let mut init = QpInit::new(QpType::Ud, burst_verbs::Pd(epd));
        init.caps.max_send_wr = 16;
        init.caps.max_recv_wr = 16;
        let (Reply::Qp { qpn, cfg, len, .. }, fds) = ask(
            &daemon,
            &client,
            &Request::CreateQp {
                init,
                send_cq: ecq,
                recv_cq: ecq,
            },
            vec![],
        ) else {
            panic!("qp")
        };
        let qp_seg =
            Arc::new(Segment::from_fd(fds.into_iter().next().unwrap(), len as usize).unwrap());
        let send = ShmRing::attach(
            Arc::clone(&qp_seg),
            0,
            ShmRing::<SendWr>::slots_for(cfg.max_send_wr as usize),
        )
        .unwrap();
        for attr in burst_verbs::ud_transitions(QKEY, Psn::new(0)) {
            let r = ask(&daemon, &client, &Request::ModifyQp { qpn, attr }, vec![]).0;
            assert!(matches!(r, Reply::Done), "{r:?}");
        }
        let Reply::Ah { ah } = ask(
            &daemon,
            &client,
            &Request::CreateAh {
                gid: ctx.gid(),
                sgid_index: None,
            },
            vec![],
        )
        .0
        else {
            panic!("ah")
        };
        let own = leak(4096, 0x3c);
        let mem: OwnedFd = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/proc/self/mem")
            .unwrap()
            .into();
        let Reply::Mr { keys: ek } = ask(
            &daemon,
            &client,
            &Request::RegMrCopy {
                pd: epd,
                addr: own.as_ptr() as u64,
                len: 4096,
                iova: own.as_ptr() as u64,
                access: 1,
            },
            vec![mem],
        )
        .0
        else {
            panic!("mr")
        };
        let w = World {
            _daemon: daemon,
            ctx,
            evil: Evil {
                client,
                qp: qp_seg,
                send,
                cq: cq_seg,
                ah,
                evil_lkey: ek.lkey,
                evil_addr: ek.addr,
            },
            secret: (sk.addr, sk.lkey),
            good: (qa, qb, cq, src, dst),
            sink: (sink, scq, sbuf, sbk.lkey),
            net,
            now: Default::default(),
            _engine: engine,
        };
        post_sink(&w, 16);
        Mutex::new(w)
    })
}

fn post_sink(w: &World, n: usize) {
    let (q, _, buf, lkey) = &w.sink;
    for i in 0..n {
        let _ = q.post_recv(&RecvWr {
            wr_id: i as u64,
            sg_list: [Sge {
                addr: buf.as_ptr() as u64 + (i % 16) as u64 * 4096,
                length: 4096,
                lkey: *lkey,
            }]
            .into(),
        });
    }
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// `n` steps of the engine, 10 us of simulated time each.
fn step(w: &World, n: usize) {
    for _ in 0..n {
        let now = w
            .now
            .fetch_add(10_000, std::sync::atomic::Ordering::Relaxed)
            + 10_000;
        w.net.set_now(now);
        w.ctx.advance_clock_to(now);
        w.ctx.progress();
    }
}

fuzz_target!(|data: &[u8]| {
    let w = world().lock().unwrap_or_else(|e| e.into_inner());
    let e = &w.evil;
    let cseg = e.client.segment();
    let bells = e.client.layout().bells_offset as usize;
    for (n, c) in data.chunks_exact(12).take(64).enumerate() {
        let (kind, sel, flags, len) = (c[0], c[1], c[2], c[3]);
        let (off, val) = (u32_at(c, 4), u32_at(c, 8));
        match kind % 5 {
            0 => {
                let (addr, lkey) = match sel % 3 {
                    0 => (w.secret.0 + u64::from(off % 4096), w.secret.1),
                    1 => (e.evil_addr + u64::from(off % 4096), e.evil_lkey),
                    _ => (u64::from(off), val),
                };
                let mut wr = SendWr::new(
                    n as u64,
                    SendOp::Send,
                    [Sge {
                        addr,
                        length: u32::from(len),
                        lkey,
                    }],
                );
                wr.inline = flags & 1 != 0;
                wr.signaled = flags & 2 != 0;
                wr.ud = Some(UdDest {
                    remote_qpn: if flags & 4 != 0 {
                        w.sink.0.qpn()
                    } else {
                        Qpn::new(val | 1).unwrap_or(w.sink.0.qpn())
                    },
                    remote_qkey: QKEY,
                    ah: if flags & 8 != 0 { val } else { e.ah },
                });
                let _ = e.send.push(wr);
                // The overflow flag of lane 0's doorbells: visit every ring.
                cseg.word(bells)
                    .store(1, std::sync::atomic::Ordering::Release);
            }
            1 => cseg
                .word((off as usize % cseg.len()) & !3)
                .store(val, std::sync::atomic::Ordering::Relaxed),
            2 => {
                e.qp.word((off as usize % e.qp.len()) & !3)
                    .store(val, std::sync::atomic::Ordering::Relaxed)
            }
            3 => {
                e.cq.word((off as usize % e.cq.len()) & !3)
                    .store(val, std::sync::atomic::Ordering::Relaxed)
            }
            _ => {
                let ws = w.ctx.wake_segment();
                ws.word((off as usize % ws.len()) & !3)
                    .store(val, std::sync::atomic::Ordering::Relaxed);
            }
        }
        step(&w, 2);
    }
    // The other owner still gets a SEND through, data checked.
    let (qa, qb, cq, src, dst) = &w.good;
    qb.post_recv(&RecvWr {
        wr_id: 77,
        sg_list: [*dst].into(),
    })
    .unwrap();
    qa.post_send(&SendWr::new(78, SendOp::Send, [*src]))
        .unwrap();
    let mut got = 0;
    for _ in 0..100_000 {
        step(&w, 1);
        while let Some(wc) = w.ctx.poll_cq(*cq) {
            assert_eq!(wc.status, burst_verbs::WcStatus::Success, "{wc:?}");
            got += 1;
        }
        if got == 2 {
            break;
        }
    }
    assert_eq!(got, 2, "the other owner's round trip did not complete");
    // Nothing of the secret reached the sink.
    let (_, scq, buf, _) = &w.sink;
    let mut taken = 0;
    while w.ctx.poll_cq(*scq).is_some() {
        taken += 1;
    }
    assert!(
        !buf.windows(8).any(|b| b.iter().all(|x| *x == SECRET)),
        "another owner's secret was gathered"
    );
    post_sink(&w, taken);
});
