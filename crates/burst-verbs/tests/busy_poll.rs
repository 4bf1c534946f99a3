//! Busy polling (`BURST_BUSY_POLL`, `BURST_ENGINE_CPUS`): an engine thread
//! pinned where the configuration says, owning its lane: application
//! threads never step or claim it, and a thread that posts and then spins
//! on memory (MPIs, qperf's `rc_rdma_write_poll_lat`) never leaves the
//! peer's WRITE waiting.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use burst_mem::{Access, MrKeys};
use burst_transport::*;
use burst_verbs::config::DeviceConfig;
use burst_verbs::engine::{Context, Engine};
use burst_wire::Mtu;

mod common;
use common::{connect_rc, write_and_spin};

/// The CPU affinity of every thread of this process named `name`.
fn affinities_of(name: &str) -> Vec<String> {
    let mut out = Vec::new();
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim() != name {
            continue;
        }
        let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
        if let Some(l) = status.lines().find(|l| l.starts_with("Cpus_allowed_list:")) {
            out.push(l["Cpus_allowed_list:".len()..].trim().to_string());
        }
    }
    out
}

fn start(ip: &str, busy: Option<usize>) -> (Engine, Context) {
    let mut cfg = DeviceConfig::for_addr("burst0", ip.parse::<IpAddr>().unwrap()).unwrap();
    cfg.mtu = Mtu::Mtu1024;
    if let Some(cpu) = busy {
        cfg.engine.cpus = vec![cpu];
        cfg.engine.busy_poll = true;
    }
    let e = Engine::start_config(&cfg).unwrap();
    let c = e.context();
    (e, c)
}

/// 64 bytes at `off` in the region `k` names.
fn sge(k: &MrKeys, off: u64) -> Sge {
    Sge {
        addr: k.addr + off,
        length: 64,
        lkey: k.lkey,
    }
}

#[test]
fn a_busy_polling_engine_is_pinned_and_leaves_no_packet_to_the_application() {
    let cpu = *std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Cpus_allowed_list:"))
                .map(|l| {
                    l[18..]
                        .trim()
                        .split([',', '-'])
                        .next()
                        .unwrap_or("0")
                        .to_string()
                })
        })
        .and_then(|c| c.parse::<usize>().ok())
        .as_ref()
        .unwrap_or(&0);
    let (ea, a) = start("127.0.154.1", Some(cpu));
    let (eb, b) = start("127.0.154.2", None);
    // A's engine thread runs on `cpu` alone (once it has started).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pinned = affinities_of("burst-engine-0");
        if pinned.iter().any(|l| *l == cpu.to_string()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no engine thread pinned to CPU {cpu}: {pinned:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(a.config().engine.busy_poll && a.config().engine.cpus == [cpu]);

    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let ch = a.create_comp_channel().unwrap();
    let cqa = a.create_cq_with(64, Some(Arc::clone(&ch)));
    let cqb = b.create_cq(64);
    let qa = a.create_qp(QpType::Rc, pa, cqa, cqa, 64).unwrap();
    let qb = b.create_qp(QpType::Rc, pb, cqb, cqb, 64).unwrap();
    connect_rc(&a, qa, b.gid(), qb, (3, 7), Mtu::Mtu1024);
    connect_rc(&b, qb, a.gid(), qa, (7, 3), Mtu::Mtu1024);
    let mut abuf = vec![0u8; 256];
    let mut bbuf = vec![0u8; 256];
    let access = Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0);
    // SAFETY: both buffers outlive the engines (dropped below, after them).
    let (ka, kb) = unsafe {
        (
            a.reg_mr(pa, abuf.as_mut_ptr(), abuf.len(), access).unwrap(),
            b.reg_mr(pb, bbuf.as_mut_ptr(), bbuf.len(), access).unwrap(),
        )
    };
    let (abase, bbase) = (abuf.as_mut_ptr() as usize, bbuf.as_mut_ptr() as usize);

    // The write-and-spin ping-pong: post a WRITE, poll once, spin on memory.
    const ROUNDS: u8 = 100;
    let (b2, qb2) = (b.clone(), qb);
    let echo =
        std::thread::spawn(move || write_and_spin(&b2, qb2, cqb, bbase, &kb, &ka, false, ROUNDS));
    let (claimed, mut done) = write_and_spin(&a, qa, cqa, abase, &ka, &kb, true, ROUNDS);
    echo.join().unwrap();
    // A's polls and posts never stepped or claimed its lane, and no claim
    // ever lapsed there.
    assert!(!claimed, "a post or poll claimed a busy-polled lane");
    assert_eq!(a.claim_lapses(), 0);
    // The busy engine completes A's WRITEs with nobody polling.
    let deadline = Instant::now() + Duration::from_secs(10);
    while done < usize::from(ROUNDS) {
        if a.poll_cq(cqa).is_some() {
            done += 1;
        }
        assert!(Instant::now() < deadline, "{done} WRITEs completed");
    }

    // Event mode: the busy engine makes the completion and signals the
    // channel; the waiting thread waits on the channel alone.
    a.post_recv(
        qa,
        &RecvWr {
            wr_id: 500,
            sg_list: [sge(&ka, 128)].into(),
        },
    )
    .unwrap();
    a.req_notify_cq(cqa).unwrap();
    b.post_send(qb, &SendWr::new(9, SendOp::Send, [sge(&kb, 64)]))
        .unwrap();
    assert_eq!(
        a.wait_cq_event(&ch, Duration::from_secs(10)).unwrap(),
        Some(cqa)
    );
    let w = a.poll_cq(cqa).expect("the event's completion");
    assert_eq!((w.wr_id, w.status), (500, WcStatus::Success));
    drop((ea, eb));
    assert_eq!(abuf[0], ROUNDS);
    assert_eq!(bbuf[0], ROUNDS);
    assert_eq!(abuf[128], ROUNDS, "the SEND carried B's last marker");
}

#[test]
fn engine_cpus_this_process_may_not_use_are_refused() {
    let mut cfg =
        DeviceConfig::for_addr("burst0", "127.0.154.3".parse::<IpAddr>().unwrap()).unwrap();
    cfg.engine.cpus = vec![100_000];
    let e = Engine::start_config(&cfg).expect_err("CPU 100000");
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    let env = |k: &str| match k {
        "BURST_ADDR" => Some("127.0.154.3".to_string()),
        "BURST_ENGINE_CPUS" => Some("100000".to_string()),
        _ => None,
    };
    let err = burst_verbs::config::Config::from_sources(env, None).unwrap_err();
    assert!(err.to_string().contains("BURST_ENGINE_CPUS"), "{err}");
    let env = |k: &str| match k {
        "BURST_ADDR" => Some("127.0.154.3".to_string()),
        "BURST_BUSY_POLL" => Some("maybe".to_string()),
        _ => None,
    };
    assert!(burst_verbs::config::Config::from_sources(env, None).is_err());
}
