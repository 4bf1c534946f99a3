//! The transfer engine end to end: two engines on loopback addresses (one
//! with a lossy port), batches larger than the QPs' depth written to
//! scattered slots and read back with every block checked, errors that
//! name their segment, a peer that goes away mid-batch, and the same
//! workload over TCP.

use std::net::{IpAddr, TcpListener};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use burst_verbs::config::DeviceConfig;
use burst_verbs::engine::{Context, Engine};
use burst_verbs::Mtu;
use burst_xfer::{Op, Pool, RdmaSession, Segment, SessionOptions, TcpSession, Transfer, XferError};

mod common;
use common::{request, verify, write_read_and_check, BLOCK, T};

fn engine(ip: &str, drop_every: u64) -> (Engine, Context) {
    let mut cfg = DeviceConfig::for_addr("burst0", ip.parse::<IpAddr>().unwrap()).unwrap();
    cfg.mtu = Mtu::Mtu4096;
    cfg.drop_every = drop_every;
    let e = Engine::start_config(&cfg).unwrap();
    let c = e.context();
    (e, c)
}

/// Both sides of a session, connected through channels.
fn pair(ca: &Context, cb: &Context, len: usize, o: SessionOptions) -> (RdmaSession, RdmaSession) {
    let pa = Arc::new(Pool::registered(ca, len).unwrap());
    let pb = Arc::new(Pool::registered(cb, len).unwrap());
    let (to_b, from_a) = mpsc::channel();
    let (to_a, from_b) = mpsc::channel();
    let cb = cb.clone();
    let b = std::thread::spawn(move || {
        RdmaSession::connect(&cb, pb, &o, |mine| {
            to_a.send(mine.clone()).unwrap();
            Ok(from_a.recv().unwrap())
        })
    });
    let a = RdmaSession::connect(ca, pa, &o, |mine| {
        to_b.send(mine.clone()).unwrap();
        Ok(from_b.recv().unwrap())
    })
    .unwrap();
    (a, b.join().unwrap().unwrap())
}

/// Four QPs of 16 sharing a send CQ of 4 entries (as 10,240 QPs of 128
/// must share one of the device's `max_cqe`): the session holds its
/// signalled WRs to what the CQ takes, waiting for completions between
/// posts without deadlocking, and every batch lands whole. (burst's own
/// CQs pause QPs whose CQ is full rather than overrun, so this checks the
/// waiting, not an overrun: RXE and RNICs would fail the QPs.)
#[test]
fn a_send_cq_smaller_than_the_queues_is_never_overrun() {
    let (_ea, ca) = engine("127.0.162.1", 0);
    let (_eb, cb) = engine("127.0.162.2", 0);
    let o = SessionOptions {
        qps: 4,
        depth: 16,
        cq_entries: 4,
        ..SessionOptions::default()
    };
    let (mut a, mut b) = pair(&ca, &cb, 4 << 20, o);
    let (pa, pb) = (Arc::clone(a.pool()), Arc::clone(b.pool()));
    write_read_and_check(&mut a, &mut b, &pa, &pb);
}

#[test]
fn batches_larger_than_the_queues_land_whole_and_read_back() {
    let (_ea, ca) = engine("127.0.142.1", 0);
    let (_eb, cb) = engine("127.0.142.2", 0);
    let o = SessionOptions {
        qps: 4,
        depth: 16,
        ..SessionOptions::default()
    };
    let (mut a, mut b) = pair(&ca, &cb, 4 << 20, o);
    let (pa, pb) = (Arc::clone(a.pool()), Arc::clone(b.pool()));
    write_read_and_check(&mut a, &mut b, &pa, &pb);

    // READ them back into a zeroed local pool area: every block again.
    let segs = request(&pa, 3, 300, pb.len() / BLOCK as usize);
    pa.write(0, &vec![0u8; 300 * BLOCK as usize]);
    let id = a.submit(Op::Read, &segs).unwrap();
    assert_eq!(a.wait(id, T).unwrap(), 300 * u64::from(BLOCK));
    verify(&pa, 3, &segs, false);

    // Out of the peer's pool: refused before anything is posted, naming
    // the segment.
    let bad = [
        Segment {
            local: 0,
            remote: 0,
            len: BLOCK,
        },
        Segment {
            local: 0,
            remote: pb.len() as u64,
            len: 1,
        },
    ];
    match a.submit(Op::Write, &bad) {
        Err(XferError::OutOfRange {
            segment: 1,
            what: "remote",
            ..
        }) => {}
        r => panic!("{r:?}"),
    }
    // Both sides can write: the other way too.
    let id = b
        .submit(
            Op::Write,
            &[Segment {
                local: 0,
                remote: 8192,
                len: 100,
            }],
        )
        .unwrap();
    assert_eq!(a.wait_landed(T).unwrap().batch, id);
}

#[test]
fn batches_land_whole_through_a_lossy_port() {
    let (_ea, ca) = engine("127.0.142.3", 97);
    let (_eb, cb) = engine("127.0.142.4", 0);
    let o = SessionOptions {
        qps: 3,
        depth: 16,
        timeout: 8,
        ..SessionOptions::default()
    };
    let (mut a, mut b) = pair(&ca, &cb, 4 << 20, o);
    let (pa, pb) = (Arc::clone(a.pool()), Arc::clone(b.pool()));
    write_read_and_check(&mut a, &mut b, &pa, &pb);
    let c = ca.counters().unwrap();
    assert!(
        c.qps.retransmitted_pkts > 0,
        "the port dropped packets: {c:?}"
    );
}

#[test]
fn a_peer_that_goes_away_fails_the_batch_without_a_hang() {
    let (_ea, ca) = engine("127.0.142.5", 0);
    let (eb, cb) = engine("127.0.142.6", 0);
    let o = SessionOptions {
        qps: 2,
        depth: 16,
        timeout: 8,
        retry_cnt: 2,
        ..SessionOptions::default()
    };
    let (mut a, b) = pair(&ca, &cb, 4 << 20, o);
    drop(b);
    drop(cb);
    drop(eb);
    let segs = request(a.pool(), 1, 200, 1000);
    let t = Instant::now();
    let r = a.submit(Op::Write, &segs).and_then(|id| a.wait(id, T));
    match r {
        Err(XferError::Segment { batch: 1, .. } | XferError::Broken(_)) => {}
        r => panic!("{r:?}"),
    }
    assert!(t.elapsed() < T, "no hang: {:?}", t.elapsed());
    // The session stays failed.
    assert!(matches!(
        a.submit(Op::Write, &segs[..1]),
        Err(XferError::Broken(_))
    ));
}

#[test]
fn the_same_batches_over_tcp() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let pb = Arc::new(Pool::new(4 << 20).unwrap());
    let pb2 = Arc::clone(&pb);
    let b = std::thread::spawn(move || TcpSession::accept(pb2, &l, 3).unwrap());
    let pa = Arc::new(Pool::new(4 << 20).unwrap());
    let mut a = TcpSession::dial(Arc::clone(&pa), addr, 3).unwrap();
    let mut b = b.join().unwrap();
    write_read_and_check(&mut a, &mut b, &pa, &pb);
    assert_eq!(
        a.submit(Op::Read, &[]).unwrap_err(),
        XferError::Unsupported("READ over TCP")
    );
    // The peer goes away: the other side learns it.
    drop(a);
    assert!(matches!(b.wait_landed(T), Err(XferError::Broken(_))));
}

#[test]
fn a_session_set_up_through_rdma_cm_moves_batches() {
    use burst_verbs::rdma_cm::RdmaCm;
    let (ea, ca) = engine("127.0.142.7", 0);
    let (eb, cb) = engine("127.0.142.8", 0);
    let cm_of = |ip: &str, ctx: &Context| {
        let ctx = ctx.clone();
        RdmaCm::new(
            vec![ip.parse().unwrap()],
            Box::new(move |_| Ok(ctx.clone())),
        )
    };
    let (cma, cmb) = (cm_of("127.0.142.7", &ca), cm_of("127.0.142.8", &cb));
    let o = SessionOptions {
        qps: 3,
        depth: 16,
        ..SessionOptions::default()
    };
    let pa = Arc::new(Pool::registered(&cma.context(0).unwrap(), 4 << 20).unwrap());
    let pb = Arc::new(Pool::registered(&cmb.context(0).unwrap(), 4 << 20).unwrap());
    let listen = "127.0.142.8:7480".parse().unwrap();
    let pb2 = Arc::clone(&pb);
    let server = std::thread::spawn(move || RdmaSession::accept_cm(&cmb, pb2, &o, listen, T));
    // The listener may not be up yet: a rejected attempt is tried again.
    let mut a = None;
    for _ in 0..50 {
        match RdmaSession::connect_cm(&cma, Arc::clone(&pa), &o, listen, T) {
            Ok(s) => {
                a = Some(s);
                break;
            }
            Err(XferError::Setup(e)) if e.contains("Rejected") => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => panic!("{e}"),
        }
    }
    let mut a = a.expect("connected within 50 attempts");
    let mut b = server.join().unwrap().unwrap();
    write_read_and_check(&mut a, &mut b, &pa, &pb);
    drop((a, b));
    drop((ea, eb));
}
