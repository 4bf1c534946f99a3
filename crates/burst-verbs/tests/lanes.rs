//! A device with several engine threads (lanes): QPs spread over the lanes,
//! each lane with its own UDP socket in a reuseport group that steers by
//! destination QPN, over real loopback sockets. Data verified.

#[cfg(feature = "af-xdp")]
mod common;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use burst_mem::Access;
use burst_transport::*;
use burst_verbs::config::DeviceConfig;
use burst_verbs::engine::{Context, Engine};
use burst_verbs::{QpInit, RcParams, RcPeer};
use burst_wire::{Mtu, Psn};

const ALL: Access = Access(1 | 2 | 4 | 8);

fn config(ip: &str, threads: u32) -> DeviceConfig {
    let mut cfg = DeviceConfig::for_addr("burst0", ip.parse::<IpAddr>().unwrap()).unwrap();
    cfg.mtu = Mtu::Mtu1024;
    cfg.threads = threads;
    cfg
}

fn engine(cfg: &DeviceConfig) -> (Engine, Context) {
    let e = Engine::start_config(cfg).unwrap();
    let c = e.context();
    (e, c)
}

fn params() -> RcParams {
    let mut p = RcParams::new(Psn::new(100), Mtu::Mtu1024);
    p.access = QpAccess {
        remote_write: true,
        remote_read: true,
        remote_atomic: true,
    };
    p.timeout = 14;
    p.rd_atomic = 4;
    p
}

/// `n` QP pairs between a device of `ta` lanes and one of `tb`: each pair
/// moves 200 KB by SEND and 200 KB by WRITE, then READs 200 KB back.
fn transfer(ta: u32, tb: u32, ips: (&str, &str), n: usize) {
    transfer_on(&config(ips.0, ta), &config(ips.1, tb), n, false);
}

/// [`transfer`] between devices `ca` and `cb`; with `skew`, the second
/// device makes an idle QP first, so that each QP's peer is on the other
/// lane (lanes 0 and 1 of two): every packet is handed between lanes on a
/// port whose queues do not steer by QPN. Returns both devices' counters.
fn transfer_on(
    ca: &DeviceConfig,
    cb: &DeviceConfig,
    n: usize,
    skew: bool,
) -> (burst_verbs::DeviceCounters, burst_verbs::DeviceCounters) {
    let ta = ca.threads;
    let (_ea, a) = engine(ca);
    let (_eb, b) = engine(cb);
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (cqa, cqb) = (a.create_cq(256), b.create_cq(256));
    let size = 200_000usize;
    let mut src: Vec<u8> = (0..n * 2 * size)
        .map(|i| (i * 7 + i / 4099) as u8)
        .collect();
    let mut dst = vec![0u8; n * 2 * size];
    let mut back = vec![0u8; n * size];
    // SAFETY: the buffers outlive both engines (dropped at the test's end).
    let (ks, kd, kb) = unsafe {
        (
            a.reg_mr(pa, src.as_mut_ptr(), src.len(), ALL).unwrap(),
            b.reg_mr(pb, dst.as_mut_ptr(), dst.len(), ALL).unwrap(),
            a.reg_mr(pa, back.as_mut_ptr(), back.len(), ALL).unwrap(),
        )
    };
    let sge = |k: burst_mem::MrKeys, off: usize, len: usize| {
        [Sge {
            addr: k.addr + off as u64,
            length: len as u32,
            lkey: k.lkey,
        }]
        .into()
    };
    let mut lanes_a = std::collections::BTreeSet::new();
    // The handles live to the end (dropping one does not destroy its QP),
    // and no longer: they hold the device (and its port's sockets) open.
    let mut handles = Vec::new();
    if skew {
        let idle = b
            .create_qp_with(&QpInit::new(QpType::Rc, pb), cqb, cqb)
            .unwrap();
        handles.push(idle);
    }
    for i in 0..n {
        let qa = a
            .create_qp_with(&QpInit::new(QpType::Rc, pa), cqa, cqa)
            .unwrap();
        let qb = b
            .create_qp_with(&QpInit::new(QpType::Rc, pb), cqb, cqb)
            .unwrap();
        lanes_a.insert((qa.qpn().value() - 0x11) % ta);
        let pp = |c: &Context, q: burst_wire::Qpn| RcPeer {
            gid: c.gid(),
            qpn: q,
            psn: Psn::new(100),
        };
        qa.connect_rc(&pp(&b, qb.qpn()), &params()).unwrap();
        qb.connect_rc(&pp(&a, qa.qpn()), &params()).unwrap();
        let base = i * 2 * size;
        qb.post_recv(&RecvWr {
            wr_id: i as u64,
            sg_list: sge(kd, base, size),
        })
        .unwrap();
        qa.post_send(&SendWr::new(1, SendOp::Send, sge(ks, base, size)))
            .unwrap();
        let w = SendOp::Write {
            remote_addr: kd.addr + (base + size) as u64,
            rkey: kd.rkey,
        };
        qa.post_send(&SendWr::new(2, w, sge(ks, base + size, size)))
            .unwrap();
        let r = SendOp::Read {
            remote_addr: kd.addr + base as u64,
            rkey: kd.rkey,
        };
        qa.post_send(&SendWr::new(3, r, sge(kb, i * size, size)))
            .unwrap();
        handles.extend([qa, qb]);
    }
    assert_eq!(
        lanes_a.len() as u32,
        ta.min(n as u32),
        "QPs on every lane: {lanes_a:?}"
    );
    let (mut wa, mut wb) = (Vec::new(), Vec::new());
    let end = Instant::now() + Duration::from_secs(30);
    while (wa.len() < 3 * n || wb.len() < n) && Instant::now() < end {
        if let Some(w) = a.poll_cq(cqa) {
            wa.push(w);
        }
        if let Some(w) = b.poll_cq(cqb) {
            wb.push(w);
        }
    }
    assert_eq!((wa.len(), wb.len()), (3 * n, n), "{wa:?} {wb:?}");
    assert!(
        wa.iter().chain(&wb).all(|w| w.status == WcStatus::Success),
        "{wa:?} {wb:?}"
    );
    assert!(dst == src, "SENDs and WRITEs placed every byte");
    for i in 0..n {
        assert!(
            back[i * size..(i + 1) * size] == src[i * 2 * size..i * 2 * size + size],
            "READ {i}"
        );
    }
    let (ca, cb) = (a.counters().unwrap(), b.counters().unwrap());
    // Every packet reached the lane of its QP: none arrived at a lane
    // without the QP (mis-steered packets count as no_qp and are dropped).
    assert_eq!((ca.no_qp, cb.no_qp), (0, 0), "{ca:?} {cb:?}");
    assert!(ca.rcvd_pkts > 0 && cb.rcvd_pkts > 0);
    (ca, cb)
}

#[test]
fn qps_on_two_engine_threads_each_side_move_data_intact() {
    transfer(2, 2, ("127.0.93.1", "127.0.93.2"), 4);
}

#[test]
fn a_two_thread_device_talks_to_a_one_thread_device() {
    transfer(2, 1, ("127.0.93.3", "127.0.93.4"), 3);
}

#[test]
fn three_lanes() {
    transfer(3, 2, ("127.0.93.5", "127.0.93.6"), 6);
}

/// A port that records the steering calls the engine makes.
struct Recording {
    inner: burst_io::SimPort,
    log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl burst_io::Port for Recording {
    fn local_addr(&self) -> std::net::SocketAddr {
        self.inner.local_addr()
    }
    fn recv_frames(
        &mut self,
        max: usize,
        visit: &mut burst_io::RxVisit<'_>,
    ) -> std::io::Result<usize> {
        self.inner.recv_frames(max, visit)
    }
    fn assign_ip_ids(&self, bufs: &mut [burst_io::PacketBuf]) {
        self.inner.assign_ip_ids(bufs)
    }
    fn send_burst(&mut self, bufs: &[burst_io::PacketBuf]) -> std::io::Result<usize> {
        self.inner.send_burst(bufs)
    }
    fn steer_qp(&mut self, qpn: u32, lane: u32) {
        self.log
            .lock()
            .unwrap()
            .push(format!("steer {qpn:#x} {lane}"));
    }
    fn unsteer_qp(&mut self, qpn: u32) {
        self.log.lock().unwrap().push(format!("unsteer {qpn:#x}"));
    }
}

#[test]
fn each_lane_tells_its_port_which_qps_it_owns() {
    use burst_verbs::engine::{Drive, EngineOptions};
    let net = burst_io::SimNet::new(1, burst_io::SimFaults::default());
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let ports: Vec<burst_verbs::AnyPort> = ["198.18.0.1:4791", "198.18.0.9:4791"]
        .iter()
        .map(|a| {
            Box::new(Recording {
                inner: net.port(a.parse().unwrap()),
                log: std::sync::Arc::clone(&log),
            }) as burst_verbs::AnyPort
        })
        .collect();
    let mut o = EngineOptions::new(Mtu::Mtu1024);
    o.drive = Drive::Caller;
    let e = Engine::with_ports(ports, o).unwrap();
    let c = e.context();
    let pd = c.alloc_pd();
    let cq = c.create_cq(8);
    let q0 = c
        .create_qp_with(&QpInit::new(QpType::Rc, pd), cq, cq)
        .unwrap();
    let q1 = c
        .create_qp_with(&QpInit::new(QpType::Rc, pd), cq, cq)
        .unwrap();
    let q2 = c
        .create_qp_with(&QpInit::new(QpType::Rc, pd), cq, cq)
        .unwrap();
    assert_eq!(
        (q0.qpn().value(), q1.qpn().value(), q2.qpn().value()),
        (0x11, 0x12, 0x13),
        "lanes interleave QPNs"
    );
    c.destroy_qp(q1.qpn()).unwrap();
    assert_eq!(
        *log.lock().unwrap(),
        [
            "steer 0x11 0",
            "steer 0x12 1",
            "steer 0x13 0",
            "unsteer 0x12"
        ]
    );
}

/// AF_XDP lanes (feature `af-xdp`; needs root): the two ends of a veth
/// pair with two queues each, in a network namespace of the test's own, two
/// engine threads a side, each with the socket of one queue. With `skew`
/// every QP's peer is on the other lane, so each frame lands on the queue
/// of a lane that does not own its QP and is handed over.
#[cfg(feature = "af-xdp")]
#[test]
fn af_xdp_lanes_one_socket_per_queue_move_data_intact() {
    // Namespaces are per thread: the engines are created on this one.
    std::thread::spawn(af_xdp_lanes_in_own_namespace)
        .join()
        .expect("test thread");
}

#[cfg(feature = "af-xdp")]
fn af_xdp_lanes_in_own_namespace() {
    if !common::veth_pair_in_own_namespace(
        ("blane0", "blane1"),
        ("198.18.0.155", "198.18.0.156"),
        2,
    ) {
        return;
    }
    let cfg = |addr: &str| {
        let mut c = config(addr, 2);
        c.port = burst_verbs::config::PortKind::AfXdp { generic: false };
        c
    };
    let (ca, cb) = (cfg("198.18.0.155"), cfg("198.18.0.156"));
    // Each QP's peer on the same lane: frames arrive on their lane's queue.
    let (a, b) = transfer_on(&ca, &cb, 4, false);
    assert_eq!(
        (a.port.rx_handed_off, b.port.rx_handed_off),
        (0, 0),
        "{a:?} {b:?}"
    );
    // Each QP's peer on the other lane: every frame is handed over.
    let (a, b) = transfer_on(&ca, &cb, 4, true);
    assert!(
        a.port.rx_handed_off > 0 && b.port.rx_handed_off > 0,
        "{a:?} {b:?}"
    );
    // Two QPs of one device, one per lane: the port loops their packets
    // back (the link would carry them to the peer, which drops them).
    let c = to_itself(&ca);
    assert!(c.port.looped_back > 0, "{c:?}");
    assert_eq!(c.port.tx_held, 0, "never resolved as a neighbour: {c:?}");
}

/// Two RC QPs of one device connected to each other: 200 KB by SEND, data
/// checked; returns the device's counters.
#[cfg(feature = "af-xdp")]
fn to_itself(cfg: &DeviceConfig) -> burst_verbs::DeviceCounters {
    let (_e, c) = engine(cfg);
    let pd = c.alloc_pd();
    let cq = c.create_cq(64);
    let size = 200_000usize;
    let mut src: Vec<u8> = (0..size).map(|i| (i * 13 + i / 511) as u8).collect();
    let mut dst = vec![0u8; size];
    // SAFETY: the buffers outlive the engine (dropped at the end).
    let (ks, kd) = unsafe {
        (
            c.reg_mr(pd, src.as_mut_ptr(), size, ALL).unwrap(),
            c.reg_mr(pd, dst.as_mut_ptr(), size, ALL).unwrap(),
        )
    };
    let qa = c
        .create_qp_with(&QpInit::new(QpType::Rc, pd), cq, cq)
        .unwrap();
    let qb = c
        .create_qp_with(&QpInit::new(QpType::Rc, pd), cq, cq)
        .unwrap();
    let me = |q: burst_wire::Qpn| RcPeer {
        gid: c.gid(),
        qpn: q,
        psn: Psn::new(100),
    };
    qa.connect_rc(&me(qb.qpn()), &params()).unwrap();
    qb.connect_rc(&me(qa.qpn()), &params()).unwrap();
    let sge = |k: burst_mem::MrKeys| {
        [Sge {
            addr: k.addr,
            length: size as u32,
            lkey: k.lkey,
        }]
        .into()
    };
    qb.post_recv(&RecvWr {
        wr_id: 7,
        sg_list: sge(kd),
    })
    .unwrap();
    qa.post_send(&SendWr::new(1, SendOp::Send, sge(ks)))
        .unwrap();
    let mut done = Vec::new();
    let end = Instant::now() + Duration::from_secs(30);
    while done.len() < 2 && Instant::now() < end {
        if let Some(w) = c.poll_cq(cq) {
            done.push(w);
        }
    }
    assert_eq!(done.len(), 2, "{done:?}");
    assert!(
        done.iter().all(|w| w.status == WcStatus::Success),
        "{done:?}"
    );
    assert!(dst == src, "the SEND placed every byte");
    c.counters().unwrap()
}
