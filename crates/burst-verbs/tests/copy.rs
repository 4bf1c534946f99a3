//! Every copy backend (`BURST_COPY`) carries the data plane's payload end to
//! end: two devices on loopback addresses with loss, RC SEND, WRITE, READ
//! and atomics, a WRITE then a READ and an atomic of the same bytes (the
//! ordering rule: a copy lands before what it precedes), UD datagrams; the
//! counters show which path moved the bytes.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use burst_io::{LossyPort, UdpPort};
use burst_mem::{Access, CopierCounters, MrKeys};
use burst_transport::*;
use burst_verbs::config::{CopyBackend, CopyConfig};
use burst_verbs::engine::{Context, CqId, Engine, EngineOptions};
use burst_wire::{Mtu, Psn};

mod common;
use common::{connect_rc, poll_n};

const ALL: Access = Access(1 | 2 | 4 | 8);
const LEN: usize = 150_000;

fn engine(ip: Ipv4Addr, copy: CopyConfig, dpdk: &str, drop_every: u64) -> std::io::Result<Engine> {
    let udp = UdpPort::bind(IpAddr::V4(ip)).unwrap();
    let mut o = EngineOptions::new(Mtu::Mtu4096);
    o.copy = copy;
    o.dpdk = dpdk.into();
    Engine::with_port(LossyPort::new(udp, drop_every), o)
}

fn completions(c: &Context, cq: CqId, n: usize) -> Vec<WorkCompletion> {
    let got = poll_n(c, cq, n);
    assert!(got.iter().all(|w| w.status == WcStatus::Success), "{got:?}");
    got
}

fn sge(k: MrKeys, off: u64, len: usize) -> [Sge; 1] {
    [Sge {
        addr: k.addr + off,
        length: len as u32,
        lkey: k.lkey,
    }]
}

/// Asserts equal bytes, naming the first difference (not printing MBs).
fn same(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        panic!("{what}: byte {i} is {} not {}", got[i], want[i]);
    }
}

/// Runs the exchange between two devices with `copy` on 127.0.208.{n,n+1};
/// returns both devices' copy counters.
fn exchange(copy: CopyConfig, n: u8) -> (CopierCounters, CopierCounters) {
    exchange_with(copy, n, ["", ""]).unwrap()
}

/// [`exchange`] with each device's DPDK text (the dmadev backend's).
fn exchange_with(
    copy: CopyConfig,
    n: u8,
    dpdk: [&str; 2],
) -> std::io::Result<(CopierCounters, CopierCounters)> {
    let ea = engine(Ipv4Addr::new(127, 0, 208, n), copy, dpdk[0], 11)?;
    let eb = engine(Ipv4Addr::new(127, 0, 208, n + 1), copy, dpdk[1], 13)?;
    let (a, b) = (ea.context(), eb.context());
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (cqa, cqb) = (a.create_cq(64), b.create_cq(64));
    let qa = a.create_qp(QpType::Rc, pa, cqa, cqa, 64).unwrap();
    let qb = b.create_qp(QpType::Rc, pb, cqb, cqb, 64).unwrap();
    connect_rc(&a, qa, b.gid(), qb, (100, 100), Mtu::Mtu4096);
    connect_rc(&b, qb, a.gid(), qa, (100, 100), Mtu::Mtu4096);

    let mut src: Vec<u8> = (0..2 * LEN as u32).map(|i| (i * 7 + 3) as u8).collect();
    let mut dst = vec![0u8; 2 * LEN];
    let mut back = vec![0u8; LEN];
    let mut word = [0u64; 2];
    let mut orig = [0u64; 2];
    let mut value = [1000u64; 1];
    // SAFETY: every buffer outlives both engines (dropped before them below).
    let (ks, kd, kb, kw, ko) = unsafe {
        (
            a.reg_mr(pa, src.as_mut_ptr(), src.len(), ALL).unwrap(),
            b.reg_mr(pb, dst.as_mut_ptr(), dst.len(), ALL).unwrap(),
            a.reg_mr(pa, back.as_mut_ptr(), back.len(), ALL).unwrap(),
            b.reg_mr(pb, word.as_mut_ptr().cast(), 16, ALL).unwrap(),
            a.reg_mr(pa, orig.as_mut_ptr().cast(), 16, ALL).unwrap(),
        )
    };
    // SAFETY: as above.
    let kv = unsafe { a.reg_mr(pa, value.as_mut_ptr().cast(), 8, ALL).unwrap() };
    let recv = RecvWr {
        wr_id: 50,
        sg_list: sge(kd, 0, LEN).into(),
    };
    b.post_recv(qb, &recv).unwrap();
    let write = |id, from: MrKeys, off, len, at| {
        let op = SendOp::Write {
            remote_addr: kd.addr + at,
            rkey: kd.rkey,
        };
        a.post_send(qa, &SendWr::new(id, op, sge(from, off, len)))
            .unwrap();
    };
    a.post_send(qa, &SendWr::new(1, SendOp::Send, sge(ks, 0, LEN)))
        .unwrap();
    write(2, ks, LEN as u64, LEN, LEN as u64);
    // READ back what the WRITE just placed: the responder must have
    // finished placing it.
    let read = SendOp::Read {
        remote_addr: kd.addr + LEN as u64,
        rkey: kd.rkey,
    };
    a.post_send(qa, &SendWr::new(3, read, sge(kb, 0, LEN)))
        .unwrap();
    // WRITE 8 bytes, then FETCH_ADD them: the atomic sees the write.
    let w8 = SendOp::Write {
        remote_addr: kw.addr,
        rkey: kw.rkey,
    };
    a.post_send(qa, &SendWr::new(4, w8, sge(kv, 0, 8))).unwrap();
    let add = SendOp::FetchAdd {
        remote_addr: kw.addr,
        rkey: kw.rkey,
        add: 42,
    };
    a.post_send(qa, &SendWr::new(5, add, sge(ko, 0, 8)))
        .unwrap();
    let wa = completions(&a, cqa, 5);
    assert_eq!(
        wa.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5]
    );
    let wb = completions(&b, cqb, 1);
    assert_eq!((wb[0].wr_id, wb[0].byte_len), (50, LEN as u32));

    // UD: datagrams (GRH area and payload placed) both ways.
    let (ua, ub) = (
        a.create_qp(QpType::Ud, pa, cqa, cqa, 64).unwrap(),
        b.create_qp(QpType::Ud, pb, cqb, cqb, 64).unwrap(),
    );
    for (c, q) in [(&a, ua), (&b, ub)] {
        for attr in burst_verbs::ud_transitions(0x1111, Psn::new(0)) {
            c.modify_qp(q, &attr).unwrap().unwrap();
        }
    }
    let mut ud_in = vec![0u8; 8 * (40 + 4000)];
    // SAFETY: outlives the engines, as above.
    let ki = unsafe { b.reg_mr(pb, ud_in.as_mut_ptr(), ud_in.len(), ALL).unwrap() };
    for i in 0..8u64 {
        let wr = RecvWr {
            wr_id: 100 + i,
            sg_list: sge(ki, i * 4040, 4040).into(),
        };
        b.post_recv(ub, &wr).unwrap();
    }
    let ah = a.create_ah(b.gid()).unwrap();
    for i in 0..8u64 {
        let mut wr = SendWr::new(200 + i, SendOp::Send, sge(ks, i * 4000, 4000));
        wr.ud = Some(UdDest {
            ah,
            remote_qpn: ub,
            remote_qkey: 0x1111,
        });
        wr.signaled = true;
        // UD may lose datagrams to the injected loss: count what arrives.
        a.post_send(ua, &wr).unwrap();
    }
    completions(&a, cqa, 8);
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut ud_got = Vec::new();
    while Instant::now() < deadline && ud_got.len() < 8 {
        if let Some(w) = b.poll_cq(cqb) {
            ud_got.push(w);
        }
    }
    assert!(!ud_got.is_empty(), "no datagram arrived");
    let counters = (a.counters().unwrap().copy, b.counters().unwrap().copy);
    drop((ea, eb));
    same(&dst[..LEN], &src[..LEN], "SEND");
    same(&dst[LEN..], &src[LEN..], "WRITE");
    same(&back, &src[LEN..], "READ after WRITE");
    assert_eq!((word[0], orig[0]), (1042, 1000), "FETCH_ADD after WRITE");
    for w in &ud_got {
        let i = (w.wr_id - 100) as usize;
        assert_eq!(w.byte_len, 4040);
        let got = &ud_in[i * 4040 + 40..(i + 1) * 4040];
        // Datagram i carried src[i*4000..]; which one landed where is
        // the order of arrival, so match by content.
        assert!(
            (0..8).any(|k| got == &src[k * 4000..(k + 1) * 4000]),
            "UD payload {i} corrupt"
        );
    }
    Ok(counters)
}

#[test]
fn the_fused_cpu_path_moves_and_checksums_every_gather() {
    let (a, b) = exchange(CopyConfig::default(), 1);
    for c in [a, b] {
        assert!(c.fused_bytes > 0, "{c:?}");
        assert_eq!(c.offloaded, 0, "{c:?}");
    }
    // A sent SEND, WRITE and UD payload (150 KB + 150 KB + 32 KB at least).
    assert!(a.fused_bytes >= 2 * LEN as u64, "{a:?}");
    // B gathered the READ response.
    assert!(b.fused_bytes >= LEN as u64, "{b:?}");
}

#[test]
fn the_plain_cpu_path_leaves_the_crc_to_the_seal() {
    let cfg = CopyConfig {
        backend: CopyBackend::CpuPlain,
        ..CopyConfig::default()
    };
    let (a, b) = exchange(cfg, 3);
    for c in [a, b] {
        assert_eq!((c.fused_bytes, c.offloaded), (0, 0), "{c:?}");
        assert!(c.cpu_bytes > 0, "{c:?}");
    }
}

#[test]
fn the_dsa_model_takes_every_copy_and_faults_are_finished_on_the_cpu() {
    let cfg = CopyConfig {
        backend: CopyBackend::DsaModel,
        min_offload: 0,
        model_fault_every: 5,
    };
    let (a, b) = exchange(cfg, 5);
    for c in [a, b] {
        assert!(c.offloaded > 0 && c.offloaded_bytes > 0, "{c:?}");
        assert!(c.backend_faults > 0, "every fifth descriptor faults: {c:?}");
        assert_eq!(c.fused_bytes, 0, "{c:?}");
        assert_eq!(c.backend_errors + c.redone, 0, "{c:?}");
    }
    // Placed on B: SEND, WRITE, UD payload; gathered on A for them.
    assert!(b.offloaded_bytes >= 2 * LEN as u64, "{b:?}");
    assert!(a.offloaded_bytes >= 2 * LEN as u64, "{a:?}");
}

#[test]
fn small_copies_stay_on_the_cpu_below_the_offload_threshold() {
    let cfg = CopyConfig {
        backend: CopyBackend::DsaModel,
        min_offload: 1 << 20,
        model_fault_every: 0,
    };
    let (a, b) = exchange(cfg, 7);
    for c in [a, b] {
        // Jobs go through the engine, which copies them on the CPU.
        assert_eq!(c.offloaded, c.backend_fallbacks, "{c:?}");
        assert_eq!(c.backend_faults, 0, "{c:?}");
    }
}

#[test]
fn a_missing_backend_is_refused_with_a_reason() {
    let mut o = EngineOptions::new(Mtu::Mtu1024);
    o.copy.backend = CopyBackend::Dsa;
    let udp = UdpPort::bind(IpAddr::V4(Ipv4Addr::new(127, 0, 208, 9))).unwrap();
    match Engine::with_port(udp, o) {
        Ok(_) => assert!(
            burst_dsa::dsa::discover().is_ok(),
            "dsa opened without a work queue"
        ),
        Err(e) => assert!(e.to_string().contains("DSA"), "{e}"),
    }
}

/// The dmadev backend on DPDK's `dma_skeleton` (feature `dpdk`; the EAL
/// needs root): two skeleton devices, one per engine (a DMA channel serves
/// one engine thread), every copy offloaded.
#[cfg(feature = "dpdk")]
#[test]
fn dmadev_on_dma_skeleton_takes_every_copy() {
    let eal = format!(
        "--vdev=dma_skeleton0 --vdev=dma_skeleton1 --file-prefix=burst-copytest-{}",
        std::process::id()
    );
    let dpdk = [
        format!("{eal} dma=dma_skeleton0"),
        format!("{eal} dma=dma_skeleton1"),
    ];
    let cfg = CopyConfig {
        backend: CopyBackend::Dmadev,
        min_offload: 0,
        model_fault_every: 0,
    };
    let (a, b) = match exchange_with(cfg, 11, [&dpdk[0], &dpdk[1]]) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("SKIPPED: no DPDK DMA device here: {e}");
            return;
        }
    };
    for c in [a, b] {
        assert!(c.offloaded > 0 && c.offloaded_bytes > 0, "{c:?}");
        assert_eq!(c.fused_bytes + c.redone + c.backend_errors, 0, "{c:?}");
    }
    assert!(b.offloaded_bytes >= 2 * LEN as u64, "{b:?}");
}
