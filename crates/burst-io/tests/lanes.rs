//! The UDP port's lanes: a reuseport group whose classic BPF program sends
//! each datagram to the socket of its destination QPN's lane.

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use burst_io::{Port, RxBatch, UdpPort};

fn datagram(qpn: u32) -> Vec<u8> {
    let mut d = vec![0u8; 32];
    d[0] = 0x04; // RC SEND ONLY
    d[2..4].copy_from_slice(&[0xff, 0xff]);
    d[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
    d
}

#[test]
fn each_lane_receives_the_qps_of_its_lane() {
    let ip = "127.0.94.1".parse().unwrap();
    let mut lanes = UdpPort::bind_lanes_on(ip, 47910, 3, 0x11).unwrap();
    let tx = UdpSocket::bind("127.0.94.2:0").unwrap();
    let to = lanes[0].local_addr();
    // Lane of QPN q: (q - 0x11) % 3.
    let qpns = [0x11u32, 0x12, 0x13, 0x14, 0x15, 0x16, 0x1000, 0xfffff];
    for q in qpns {
        tx.send_to(&datagram(q), to).unwrap();
    }
    // A datagram too short for a BTH goes to lane 0.
    tx.send_to(&[1, 2, 3], to).unwrap();
    let mut got: Vec<Vec<u32>> = vec![Vec::new(); 3];
    let mut rx = RxBatch::default();
    let end = Instant::now() + Duration::from_secs(5);
    while got.iter().map(Vec::len).sum::<usize>() < qpns.len() + 1 && Instant::now() < end {
        for (k, lane) in lanes.iter_mut().enumerate() {
            lane.recv_batch(&mut rx).unwrap();
            for (_, p) in rx.packets() {
                let q = if p.len() >= 8 {
                    u32::from_be_bytes([0, p[5], p[6], p[7]])
                } else {
                    0
                };
                got[k].push(q);
            }
        }
    }
    let mut want0: Vec<u32> = qpns
        .iter()
        .copied()
        .filter(|&q| (q - 0x11) % 3 == 0)
        .collect();
    want0.push(0); // the short datagram
    assert_eq!(got[0], want0, "lane 0");
    for (k, lane) in got.iter().enumerate().skip(1) {
        let want: Vec<u32> = qpns
            .iter()
            .copied()
            .filter(|&q| (q - 0x11) % 3 == k as u32)
            .collect();
        assert_eq!(lane, &want, "lane {k}");
    }
}
