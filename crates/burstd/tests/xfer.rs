//! burst-xfer through burstd: two daemons, a client of each, a session
//! of three QPs between them; batches larger than the QPs' depth written
//! to scattered slots, landed, checked, and read back.

mod common;

use std::sync::{mpsc, Arc};
use std::time::Duration;

use burst_xfer::{Op, Pool, RdmaSession, Segment, SessionOptions, Transfer};
use common::Daemon;

const BLOCK: u32 = 4096;

fn byte(req: u64, i: usize, o: usize) -> u8 {
    ((req as usize * 131) ^ (i * 31) ^ (o * 7) ^ (o >> 8)) as u8
}

#[test]
fn kv_batches_through_burstd_land_whole() {
    let (da, db) = (
        Daemon::start("127.0.143.1", &[]),
        Daemon::start("127.0.143.2", &[]),
    );
    let (ca, cb) = (da.connect(), db.connect());
    let pa = Arc::new(Pool::registered(&ca, 2 << 20).unwrap());
    let pb = Arc::new(Pool::registered(&cb, 2 << 20).unwrap());
    let o = SessionOptions {
        qps: 3,
        depth: 16,
        ..SessionOptions::default()
    };
    let (to_b, from_a) = mpsc::channel();
    let (to_a, from_b) = mpsc::channel();
    let pb2 = Arc::clone(&pb);
    let side_b = std::thread::spawn(move || {
        RdmaSession::connect(&cb, pb2, &o, |mine| {
            to_a.send(mine.clone()).unwrap();
            Ok(from_a.recv().unwrap())
        })
    });
    let mut a = RdmaSession::connect(&ca, Arc::clone(&pa), &o, |mine| {
        to_b.send(mine.clone()).unwrap();
        Ok(from_b.recv().unwrap())
    })
    .unwrap();
    let mut b = side_b.join().unwrap().unwrap();
    let t = Duration::from_secs(20);
    let slots = pb.len() / BLOCK as usize;
    for req in 1..=2u64 {
        let segs: Vec<Segment> = (0..200)
            .map(|i| {
                let data: Vec<u8> = (0..BLOCK as usize).map(|o| byte(req, i, o)).collect();
                pa.write(u64::from(BLOCK) * i as u64, &data);
                Segment {
                    local: u64::from(BLOCK) * i as u64,
                    remote: u64::from(BLOCK) * ((i * 97 + req as usize) % slots) as u64,
                    len: BLOCK,
                }
            })
            .collect();
        let id = a.submit(Op::Write, &segs).unwrap();
        let landed = b.wait_landed(t).unwrap();
        assert_eq!((landed.batch, landed.bytes), (id, 200 * u64::from(BLOCK)));
        a.wait(id, t).unwrap();
        let mut got = vec![0u8; BLOCK as usize];
        for (i, s) in segs.iter().enumerate() {
            pb.read(s.remote, &mut got);
            assert!(
                got.iter().enumerate().all(|(o, &v)| v == byte(req, i, o)),
                "request {req} block {i}"
            );
        }
        // And back: READ into a zeroed local area.
        pa.write(0, &vec![0u8; 200 * BLOCK as usize]);
        let id = a.submit(Op::Read, &segs).unwrap();
        a.wait(id, t).unwrap();
        for (i, s) in segs.iter().enumerate() {
            pa.read(s.local, &mut got);
            assert!(got.iter().enumerate().all(|(o, &v)| v == byte(req, i, o)));
        }
    }
}
