//! The connection manager over real QP1s: two engines on loopback
//! addresses, each with its CM service; a REQ/REP/RTU exchange, a REJ for
//! a service nobody listens on, a disconnect, and stray MADs to QP1
//! counted, not crashing anything.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::mpsc;
use std::time::Duration;

use burst_cm::rdma::PortSpace;
use burst_cm::{reason, CmEvent};
use burst_verbs::cm::CmService;
use burst_verbs::engine::Engine;
use burst_verbs::{Mtu, Psn, Qpn};

fn next(rx: &mpsc::Receiver<CmEvent>) -> CmEvent {
    rx.recv_timeout(Duration::from_secs(10))
        .expect("a CM event within 10 s")
}

#[test]
fn two_cms_connect_reject_and_disconnect_over_qp1() {
    let (ia, ib) = (
        IpAddr::V4(Ipv4Addr::new(127, 0, 91, 1)),
        IpAddr::V4(Ipv4Addr::new(127, 0, 91, 2)),
    );
    let ea = Engine::start(ia, Mtu::Mtu1024).unwrap();
    let eb = Engine::start(ib, Mtu::Mtu1024).unwrap();
    let (ta, ra) = mpsc::channel();
    let (tb, rb) = mpsc::channel();
    let a = CmService::start(&ea.context(), Box::new(move |e| drop(ta.send(e)))).unwrap();
    let b = CmService::start(&eb.context(), Box::new(move |e| drop(tb.send(e)))).unwrap();
    let svc = PortSpace::Tcp.service_id(4000);
    b.with(|cm, _| cm.listen(svc)).unwrap();

    // Nobody listens on another port: REJ, reason 8.
    let other = burst_cm::req_template(
        PortSpace::Tcp.service_id(4001),
        Qpn::new(0x11).unwrap(),
        Psn::new(1),
    );
    let c0 = a.with(|cm, now| cm.connect(now, ib, other)).unwrap();
    match next(&ra) {
        CmEvent::Rejected { conn, rej } => {
            assert_eq!(conn, c0);
            assert_eq!(rej.reason, reason::INVALID_SERVICE_ID);
        }
        e => panic!("{e:?}"),
    }

    // REQ, REP, RTU.
    let req = burst_cm::req_template(svc, Qpn::new(0x11).unwrap(), Psn::new(7));
    let ca = a.with(|cm, now| cm.connect(now, ib, req)).unwrap();
    let cb = match next(&rb) {
        CmEvent::Request { conn, peer, req } => {
            assert_eq!(peer, ia);
            assert_eq!(req.starting_psn.value(), 7);
            conn
        }
        e => panic!("{e:?}"),
    };
    let rep = burst_cm::rep_template(Qpn::new(0x12).unwrap(), Psn::new(9));
    // Two burst CMs: set up in one round trip, B established at its REP.
    assert!(b.with(|cm, now| cm.accept(now, cb, rep)).unwrap());
    match next(&ra) {
        CmEvent::Reply { conn, rep } => {
            assert_eq!(conn, ca);
            assert_eq!(rep.local_qpn.value(), 0x12);
        }
        e => panic!("{e:?}"),
    }
    a.with(|cm, now| cm.establish(now, ca)).unwrap();
    assert_eq!(next(&rb), CmEvent::PeerReady { conn: cb });

    // Garbage to QP1 (not a MAD, wrong Q_Key): counted by QP1 or the CM,
    // and the connection still disconnects cleanly.
    let s = UdpSocket::bind(SocketAddr::new(ia, 0)).unwrap();
    let gsi_before = eb.context().gsi().unwrap().counters();
    let dev_before = eb.context().counters().unwrap();
    s.send_to(&[0xff; 40], SocketAddr::new(ib, 4791)).unwrap();
    s.send_to(&[0u8; 300], SocketAddr::new(ib, 4791)).unwrap();

    a.with(|cm, now| cm.disconnect(now, ca, b"bye")).unwrap();
    assert_eq!(next(&rb), CmEvent::Disconnected { conn: cb });
    assert_eq!(next(&ra), CmEvent::Disconnected { conn: ca });
    let gsi = eb.context().gsi().unwrap().counters();
    assert_eq!(gsi.rcvd, gsi_before.rcvd + 1, "the DREQ: {gsi:?}");
    assert_eq!(gsi.malformed, 0);
    let dev = eb.context().counters().unwrap();
    let refused = |c: &burst_verbs::DeviceCounters| c.malformed + c.icrc_errors + c.no_qp;
    assert_eq!(refused(&dev), refused(&dev_before) + 2, "{dev:?}");
    assert!(a.counters().sent >= 4 && b.counters().rcvd >= 4);
    assert_eq!(b.counters().malformed, 0);
}

/// A REQ that reached a device before its CM started (a peer that
/// retried while the listening process was starting up) finds the
/// listener: a CM started for a service listens before it takes its first
/// MAD (qperf's server children, each a new process on one address, had a
/// connection in ten rejected).
#[test]
fn a_req_queued_before_the_cm_started_finds_its_listener() {
    let (ia, ib) = (
        IpAddr::V4(Ipv4Addr::new(127, 0, 91, 5)),
        IpAddr::V4(Ipv4Addr::new(127, 0, 91, 6)),
    );
    let ea = Engine::start(ia, Mtu::Mtu1024).unwrap();
    let eb = Engine::start(ib, Mtu::Mtu1024).unwrap();
    let (ta, ra) = mpsc::channel();
    let a = CmService::start(&ea.context(), Box::new(move |e| drop(ta.send(e)))).unwrap();
    let svc = PortSpace::Tcp.service_id(4100);
    let req = burst_cm::req_template(svc, Qpn::new(0x11).unwrap(), Psn::new(3));
    a.with(|cm, now| cm.connect(now, ib, req)).unwrap();
    // The REQ waits in B's QP1 queue: B has no CM yet.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while eb.context().gsi().is_none_or(|g| g.counters().rcvd == 0) {
        assert!(
            std::time::Instant::now() < deadline,
            "the REQ never arrived"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let (tb, rb) = mpsc::channel();
    let _b = CmService::start_listening(
        &eb.context(),
        Box::new(move |e| drop(tb.send(e))),
        Some(svc),
    )
    .unwrap();
    match next(&rb) {
        CmEvent::Request { peer, req, .. } => {
            assert_eq!(peer, ia);
            assert_eq!(req.starting_psn.value(), 3);
        }
        e => panic!("{e:?}"),
    }
    assert!(ra.try_recv().is_err(), "no REJ reached A");
}
