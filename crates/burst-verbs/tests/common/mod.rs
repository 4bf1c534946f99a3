//! What the integration tests share: connecting an RC pair, waiting for
//! completions and for descriptors.
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

/// Moves this thread into a network namespace of its own and joins two
/// veth interfaces there, `a` (address `ips.0`) and `b` (`ips.1`), each
/// with `queues` queues, MTU 9000, up. Both addresses are the namespace's
/// own, so the kernel would route between them through loopback and never
/// resolve them on the veths: each learns the other's MAC as a permanent
/// neighbour entry (as a port reads them from the kernel). False, with the
/// reason printed, where that cannot be done (not root, no `ip`).
pub fn veth_pair_in_own_namespace((a, b): (&str, &str), ips: (&str, &str), queues: u32) -> bool {
    // SAFETY: unshare(2) of this thread's network namespace only.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        eprintln!("SKIPPED: no network namespace of our own (root?)");
        return false;
    }
    let ip = |args: &str| {
        std::process::Command::new("ip")
            .args(args.split_whitespace())
            .status()
            .is_ok_and(|s| s.success())
    };
    let q = format!("numtxqueues {queues} numrxqueues {queues}");
    let set_up = ip("link set lo up")
        && ip(&format!("link add {a} {q} type veth peer name {b} {q}"))
        && ip(&format!("addr add {}/24 dev {a}", ips.0))
        && ip(&format!("addr add {}/24 dev {b}", ips.1))
        && ip(&format!("link set {a} mtu 9000 up"))
        && ip(&format!("link set {b} mtu 9000 up"));
    let mac = |i: &str| {
        burst_io::netdev::mac(i)
            .map(|m| m.map(|b| format!("{b:02x}")).join(":"))
            .unwrap_or_default()
    };
    let set_up = set_up
        && ip(&format!(
            "neigh replace {} lladdr {} dev {a} nud permanent",
            ips.1,
            mac(b)
        ))
        && ip(&format!(
            "neigh replace {} lladdr {} dev {b} nud permanent",
            ips.0,
            mac(a)
        ));
    if !set_up {
        eprintln!("SKIPPED: cannot set a veth pair up (no `ip`?)");
    }
    set_up
}

/// Whether `fd` is readable within `ms` milliseconds.
pub fn readable(fd: i32, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd, count 1.
    unsafe { libc::poll(&mut p, 1, ms) == 1 }
}
