//! The in-memory port and the lossy wrapper.

use std::net::SocketAddr;

use burst_io::{LossyPort, PacketBuf, Port, RxBatch, SimFaults, SimNet, SimPort};

fn addr(i: u8) -> SocketAddr {
    SocketAddr::from(([198, 18, 0, i], 4791))
}

fn bufs(n: usize, to: SocketAddr) -> Vec<PacketBuf> {
    (0..n)
        .map(|i| {
            let mut b = PacketBuf::new();
            b.data[..4].copy_from_slice(&(i as u32).to_be_bytes());
            b.len = 100;
            b.peer = to;
            b
        })
        .collect()
}

fn drain(p: &mut SimPort) -> Vec<(burst_io::RxMeta, Vec<u8>)> {
    let mut rx = RxBatch::default();
    let mut got = Vec::new();
    loop {
        let n = p.recv_batch(&mut rx).unwrap();
        if n == 0 {
            return got;
        }
        got.extend(rx.frames().map(|(m, b)| (m, b.to_vec())));
    }
}

fn seq(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().unwrap())
}

#[test]
fn a_clean_network_delivers_in_order_after_the_delay() {
    let net = SimNet::new(1, SimFaults::default());
    let mut a = net.port(addr(1));
    let mut b = net.port(addr(2));
    let mut out = bufs(100, b.local_addr());
    a.assign_ip_ids(&mut out);
    assert_eq!(a.send_burst(&out).unwrap(), 100);
    assert!(
        drain(&mut b).is_empty(),
        "nothing arrives before the link delay"
    );
    net.advance(1_000_000);
    let got = drain(&mut b);
    assert_eq!(got.len(), 100);
    for (i, (m, bytes)) in got.iter().enumerate() {
        assert_eq!(seq(bytes), i as u32);
        assert_eq!(m.peer, a.local_addr());
        assert_eq!(m.ip_id, Some(i as u16), "IDs count per packet");
    }
    assert_eq!(net.stats().delivered, 100);
}

#[test]
fn faults_are_applied_and_counted() {
    let f = SimFaults {
        loss: 0.1,
        reorder: 0.1,
        dup: 0.05,
        corrupt: 0.05,
        hide_ip_id: true,
        ..SimFaults::default()
    };
    let net = SimNet::new(7, f);
    let mut a = net.port(addr(1));
    let mut b = net.port(addr(2));
    let out = bufs(2000, b.local_addr());
    a.send_burst(&out).unwrap();
    net.advance(10_000_000_000);
    let got = drain(&mut b);
    let s = net.stats();
    assert!(
        s.lost > 100 && s.duplicated > 50 && s.reordered > 100 && s.corrupted > 50,
        "{s:?}"
    );
    assert_eq!(got.len() as u64, 2000 - s.lost + s.duplicated);
    assert!(
        got.iter().all(|(m, _)| m.ip_id.is_none()),
        "IDs hidden as by a socket"
    );
    assert!(
        got.windows(2).any(|w| seq(&w[1].1) < seq(&w[0].1)),
        "some reordering"
    );
}

#[test]
fn a_slow_receiver_overflows_and_marks_ecn() {
    let f = SimFaults {
        rx_gbps: 1,
        rx_queue: 64,
        ecn_threshold: 16,
        ..SimFaults::default()
    };
    let net = SimNet::new(3, f);
    let mut a = net.port(addr(1));
    let mut b = net.port(addr(2));
    a.send_burst(&bufs(200, b.local_addr())).unwrap();
    net.advance(1_000_000_000);
    let got = drain(&mut b);
    let s = net.stats();
    assert_eq!(s.overflowed, 200 - 64);
    assert_eq!(got.len(), 64);
    assert_eq!(got.iter().filter(|(m, _)| m.ecn == 3).count(), 64 - 16);
    assert_eq!(s.ecn_marked, 64 - 16);
}

#[test]
fn unknown_destinations_are_counted_not_delivered() {
    let net = SimNet::new(1, SimFaults::default());
    let mut a = net.port(addr(1));
    a.send_burst(&bufs(3, addr(9))).unwrap();
    assert_eq!(net.stats().unroutable, 3);
}

#[test]
fn the_lossy_wrapper_drops_a_share_and_keeps_ids_consistent() {
    let net = SimNet::new(1, SimFaults::default());
    let mut a = LossyPort::new(net.port(addr(1)), 10);
    let mut b = net.port(addr(2));
    let mut out = bufs(1000, b.local_addr());
    a.assign_ip_ids(&mut out);
    assert_eq!(a.send_burst(&out).unwrap(), 1000);
    net.advance(1_000_000_000);
    let got = drain(&mut b);
    assert!(a.dropped() > 50 && a.dropped() < 200, "{}", a.dropped());
    assert_eq!(got.len() as u64, 1000 - a.dropped());
    for (m, bytes) in &got {
        // The ID each kept packet was sealed with is the one it carries.
        assert_eq!(m.ip_id, Some(out[seq(bytes) as usize].ip_id));
    }
    let mut none = LossyPort::new(net.port(addr(3)), 0);
    none.send_burst(&bufs(100, b.local_addr())).unwrap();
    assert_eq!(none.dropped(), 0);
}

#[test]
fn lent_frames_come_in_order_and_a_batch_takes_no_more_than_it_holds() {
    let net = SimNet::new(1, SimFaults::default());
    let (mut a, mut b) = (net.port(addr(1)), net.port(addr(2)));
    a.send_burst(&bufs(6, addr(2))).unwrap();
    net.advance(1_000_000);
    // At most `max` frames a call, lent in the order sent.
    let mut lent = Vec::new();
    let n = b
        .recv_frames(3, &mut |m, bytes| {
            lent.push((m.peer, seq(bytes), bytes.len()))
        })
        .unwrap();
    assert_eq!(n, 3);
    assert_eq!(
        lent,
        [(addr(1), 0, 100), (addr(1), 1, 100), (addr(1), 2, 100)]
    );
    // A copying batch of two takes two of the three left, then the last.
    let mut rx = RxBatch::new(2);
    assert_eq!(b.recv_batch(&mut rx).unwrap(), 2);
    let got: Vec<u32> = rx.frames().map(|(_, b)| seq(b)).collect();
    assert_eq!(got, [3, 4]);
    assert_eq!(b.recv_batch(&mut rx).unwrap(), 1);
    assert_eq!(rx.frames().map(|(_, b)| seq(b)).collect::<Vec<_>>(), [5]);
    assert_eq!(
        b.recv_frames(32, &mut |_, _| panic!("nothing left"))
            .unwrap(),
        0
    );
}

#[test]
fn frames_sent_by_taking_arrive_in_the_senders_own_buffers() {
    let net = SimNet::new(1, SimFaults::default());
    let (mut a, mut b) = (net.port(addr(1)), net.port(addr(2)));
    let mut out = bufs(4, addr(2));
    let storage: Vec<*const u8> = out.iter().map(|p| p.data.as_ptr()).collect();
    a.assign_ip_ids(&mut out);
    assert_eq!(a.send_frames(&mut out).unwrap(), 4);
    // The port took each buffer's storage and left another in its place.
    for (p, s) in out.iter().zip(&storage) {
        assert_ne!(p.data.as_ptr(), *s);
    }
    net.advance(1_000_000);
    let mut got = Vec::new();
    b.recv_frames(32, &mut |m, bytes| {
        got.push((m.ip_id, seq(bytes), bytes.len(), bytes.as_ptr()))
    })
    .unwrap();
    let want: Vec<_> = (0..4u32)
        .map(|i| (Some(i as u16), i, 100, storage[i as usize]))
        .collect();
    assert_eq!(
        got, want,
        "no copy between the sender's buffer and the receiver"
    );
}

#[test]
fn a_full_link_takes_no_buffer_it_does_not_send() {
    let faults = SimFaults {
        link_gbps: 1,
        tx_queue_ns: 1_000,
        ..SimFaults::default()
    };
    let net = SimNet::new(1, faults);
    let (mut a, mut b) = (net.port(addr(1)), net.port(addr(2)));
    let mut out = bufs(8, addr(2));
    let storage: Vec<*const u8> = out.iter().map(|p| p.data.as_ptr()).collect();
    let took = a.send_frames(&mut out).unwrap();
    assert!(took > 0 && took < 8, "took {took} of 8");
    for (i, p) in out.iter().enumerate().skip(took) {
        assert_eq!(p.data.as_ptr(), storage[i], "packet {i} kept its buffer");
        assert_eq!(seq(p.bytes()), i as u32, "and its bytes");
    }
    net.advance(10_000_000);
    assert_eq!(drain(&mut b).len(), took);
}
