//! What the integration tests share: connecting an RC pair, waiting for
//! completions.
#![allow(dead_code)] // each test crate uses its part

use std::time::{Duration, Instant};

use burst_transport::{QpAccess, WorkCompletion};
use burst_verbs::engine::{Context, CqId};
use burst_verbs::{RcParams, RcPeer};
use burst_wire::{Mtu, Psn, Qpn};

/// Connects RC QP `qpn` of `c` to `peer_qpn` at `peer_gid` with every
/// remote right, RNR timer 1, ACK timeout 12 (16 ms), 8 reads or atomics
/// in flight, path MTU `mtu`; `psns` is (this side's, the peer's).
pub fn connect_rc(
    c: &Context,
    qpn: Qpn,
    peer_gid: [u8; 16],
    peer_qpn: Qpn,
    psns: (u32, u32),
    mtu: Mtu,
) {
    let mut p = RcParams::new(Psn::new(psns.0), mtu);
    p.access = QpAccess {
        remote_write: true,
        remote_read: true,
        remote_atomic: true,
    };
    p.min_rnr_timer = 1;
    p.timeout = 12;
    p.rd_atomic = 8;
    let peer = RcPeer {
        gid: peer_gid,
        qpn: peer_qpn,
        psn: Psn::new(psns.1),
    };
    c.connect_rc(qpn, &peer, &p).unwrap();
}

/// The next `n` completions of `cq`; fails the test after 20 s without them.
pub fn poll_n(c: &Context, cq: CqId, n: usize) -> Vec<WorkCompletion> {
    let mut v = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while v.len() < n && Instant::now() < deadline {
        match c.poll_cq(cq) {
            Some(w) => v.push(w),
            None => std::thread::yield_now(),
        }
    }
    assert_eq!(v.len(), n, "timed out: {v:?}");
    v
}
