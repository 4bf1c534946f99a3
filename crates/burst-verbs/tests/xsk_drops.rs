//! An AF_XDP port counts the frames the kernel dropped before burst read
//! them (`PortCounters::rx_dropped`): a receiver whose rings are full loses
//! frames, and every frame sent is either received or counted. Needs root
//! (a network namespace, BPF); skipped, loudly, without it.
#![cfg(feature = "af-xdp")]

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use burst_io::xsk::{open_port, XskConfig};
use burst_io::{PacketBuf, Port, RxBatch};
use burst_wire::{BthRepr, IbRepr, Opcode, Psn, Qpn};

#[test]
fn a_full_receive_ring_counts_its_drops() {
    // Namespaces are per thread.
    std::thread::spawn(in_own_namespace)
        .join()
        .expect("test thread");
}

fn in_own_namespace() {
    let (a_ip, b_ip) = ("198.18.0.157", "198.18.0.158");
    if !common::veth_pair_in_own_namespace(("bdrop0", "bdrop1"), (a_ip, b_ip), 1) {
        return;
    }
    // The receiver's rings are small, and it does not read while 1,024
    // frames come.
    let small = XskConfig {
        frames: 256,
        ring: 64,
        ..XskConfig::new("bdrop0")
    };
    let mut a = match open_port(&small, a_ip.parse().unwrap()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("SKIPPED: no AF_XDP socket here: {e}");
            return;
        }
    };
    let mut b = open_port(&XskConfig::new("bdrop1"), b_ip.parse().unwrap()).unwrap();
    assert_eq!(a.counters().rx_dropped, 0, "nothing dropped yet");
    let mut ib = IbRepr::new(BthRepr::new(
        Opcode::RC_SEND_ONLY,
        Qpn::new(0x11).unwrap(),
        Psn::new(1),
    ));
    ib.payload_len = 256;
    let mut bytes = vec![0u8; ib.buffer_len()];
    ib.emit(&mut bytes).unwrap();
    let to: SocketAddr = format!("{a_ip}:4791").parse().unwrap();
    let mut burst: Vec<PacketBuf> = (0..32)
        .map(|_| {
            let mut p = PacketBuf::new();
            p.data[..bytes.len()].copy_from_slice(&bytes);
            p.len = bytes.len();
            p.peer = to;
            p
        })
        .collect();
    b.assign_ip_ids(&mut burst);
    assert_eq!(burst_io::seal_all(b.local_addr(), &mut burst), burst.len());
    let mut sent = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    while sent < 1024 && Instant::now() < deadline {
        sent += b.send_burst(&burst).unwrap();
        while b.flush_tx() && Instant::now() < deadline {}
    }
    assert!(sent >= 1024, "sent {sent}");
    // Everything sent is either read now or was counted as dropped.
    let mut rx = RxBatch::default();
    let mut got = 0;
    let quiet = Instant::now() + Duration::from_secs(5);
    loop {
        let n = a.recv_batch(&mut rx).unwrap();
        got += n;
        let dropped = a.counters().rx_dropped as usize;
        if got + dropped >= sent || Instant::now() > quiet {
            assert!(
                dropped > 0,
                "a full ring dropped frames: got {got} of {sent}"
            );
            assert!(
                got >= 1,
                "the ring's frames are still read: {:?}",
                a.counters()
            );
            assert_eq!(got + dropped, sent, "every frame read or counted");
            break;
        }
        if n == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
