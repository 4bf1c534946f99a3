//! Sessions over the system's libibverbs (feature `libibverbs`): two on
//! one Verbs device, a peer that goes away, and an `IbvSession` against a
//! burst-verbs `RdmaSession`.
//!
//! They need a device: `BURST_XFER_IBV_DEV` names it (and
//! `BURST_XFER_IBV_GID` its GID index, default 0). `cargo xtask test` runs
//! them on burst's drop-in libibverbs (LD_LIBRARY_PATH=target/dropin,
//! BURST_ADDR=127.0.145.1, device burst0); without the variable they say
//! so and pass, as there is nothing to run on.
#![cfg(feature = "libibverbs")]

use std::net::IpAddr;
use std::sync::{mpsc, Arc};
use std::time::Instant;

use burst_verbs::config::DeviceConfig;
use burst_verbs::engine::Engine;
use burst_verbs::Mtu;
use burst_xfer::{
    IbvDevice, IbvSession, Op, Pool, RdmaSession, Segment, SessionOptions, Transfer, XferError,
};

mod common;
use common::{request, verify, write_read_and_check, BLOCK, T};

fn device() -> Option<Arc<IbvDevice>> {
    let Ok(name) = std::env::var("BURST_XFER_IBV_DEV") else {
        eprintln!("BURST_XFER_IBV_DEV is not set: no Verbs device to test on");
        return None;
    };
    let gid = std::env::var("BURST_XFER_IBV_GID")
        .ok()
        .and_then(|g| g.parse().ok())
        .unwrap_or(0);
    Some(IbvDevice::open(Some(&name), gid).expect("the named Verbs device opens"))
}

/// Two sessions on `dev`, connected through channels.
fn pair(dev: &Arc<IbvDevice>, len: usize, o: SessionOptions) -> (IbvSession, IbvSession) {
    let (to_b, from_a) = mpsc::channel();
    let (to_a, from_b) = mpsc::channel();
    let (dev2, pb) = (Arc::clone(dev), Arc::new(Pool::new(len).unwrap()));
    let b = std::thread::spawn(move || {
        IbvSession::connect(&dev2, pb, &o, |mine| {
            to_a.send(mine.clone()).unwrap();
            Ok(from_a.recv().unwrap())
        })
    });
    let a = IbvSession::connect(dev, Arc::new(Pool::new(len).unwrap()), &o, |mine| {
        to_b.send(mine.clone()).unwrap();
        Ok(from_b.recv().unwrap())
    })
    .unwrap();
    (a, b.join().unwrap().unwrap())
}

#[test]
fn batches_larger_than_the_queues_land_and_read_back_through_libibverbs() {
    let Some(dev) = device() else { return };
    let o = SessionOptions {
        qps: 3,
        depth: 16,
        ..SessionOptions::default()
    };
    let (mut a, mut b) = pair(&dev, 4 << 20, o);
    let (pa, pb) = (Arc::clone(a.pool()), Arc::clone(b.pool()));
    write_read_and_check(&mut a, &mut b, &pa, &pb);
    // READ back into a zeroed area.
    let segs = request(&pa, 3, 300, pb.len() / BLOCK as usize);
    pa.write(0, &vec![0u8; 300 * BLOCK as usize]);
    let id = a.submit(Op::Read, &segs).unwrap();
    assert_eq!(a.wait(id, T).unwrap(), 300 * u64::from(BLOCK));
    verify(&pa, 3, &segs, false);
    // Out of the peer's pool: refused, naming the segment.
    let bad = [Segment {
        local: 0,
        remote: pb.len() as u64 - 8,
        len: 16,
    }];
    assert!(matches!(
        a.submit(Op::Write, &bad),
        Err(XferError::OutOfRange { segment: 0, .. })
    ));
}

#[test]
fn a_libibverbs_peer_that_goes_away_fails_the_batch_without_a_hang() {
    let Some(dev) = device() else { return };
    let o = SessionOptions {
        qps: 2,
        depth: 16,
        timeout: 8,
        retry_cnt: 2,
        ..SessionOptions::default()
    };
    let (mut a, b) = pair(&dev, 4 << 20, o);
    drop(b);
    let segs = request(a.pool(), 1, 200, 1000);
    let t = Instant::now();
    let r = a.submit(Op::Write, &segs).and_then(|id| a.wait(id, T));
    assert!(
        matches!(
            r,
            Err(XferError::Segment { batch: 1, .. } | XferError::Broken(_))
        ),
        "{r:?}"
    );
    assert!(t.elapsed() < T, "no hang: {:?}", t.elapsed());
}

#[test]
fn a_libibverbs_session_and_a_burst_verbs_session_talk() {
    let Some(dev) = device() else { return };
    // burst-verbs' own engine beside the device (another address).
    let ip: IpAddr = "127.0.145.2".parse().unwrap();
    let mut cfg = DeviceConfig::for_addr("burst1", ip).unwrap();
    cfg.mtu = Mtu::Mtu4096;
    let engine = Engine::start_config(&cfg).unwrap();
    let ctx = engine.context();
    let o = SessionOptions {
        qps: 2,
        depth: 32,
        ..SessionOptions::default()
    };
    let (to_b, from_a) = mpsc::channel();
    let (to_a, from_b) = mpsc::channel();
    let pb = Arc::new(Pool::registered(&ctx, 4 << 20).unwrap());
    let b = std::thread::spawn(move || {
        RdmaSession::connect(&ctx, pb, &o, |mine| {
            to_a.send(mine.clone()).unwrap();
            Ok(from_a.recv().unwrap())
        })
    });
    let mut a = IbvSession::connect(&dev, Arc::new(Pool::new(4 << 20).unwrap()), &o, |mine| {
        to_b.send(mine.clone()).unwrap();
        Ok(from_b.recv().unwrap())
    })
    .unwrap();
    let mut b = b.join().unwrap().unwrap();
    let (pa, pb) = (Arc::clone(a.pool()), Arc::clone(b.pool()));
    // Both directions.
    write_read_and_check(&mut a, &mut b, &pa, &pb);
    write_read_and_check(&mut b, &mut a, &pb, &pa);
}
