//! Protocol work per packet: an RDMA WRITE stream at path MTU 4096 between two
//! in-memory RC QPs: requester, responder and ACK handling, including header
//! emit and packet validation, with no payload copy and no ICRC.
//!
//! `cargo bench -p burst-transport --bench transport`

use std::hint::black_box;

use burst_transport::*;
use burst_wire::{IbPacket, Mtu, Psn, Qpn};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

/// Memory that checks nothing and moves no bytes: the bench measures the
/// protocol, not copies.
struct NullMemory;

impl Memory for NullMemory {
    fn check_local(&self, _: u32, _: &[Sge], _: bool) -> Result<(), MemError> {
        Ok(())
    }
    fn read_local(&self, _: u32, _: &[Sge], _: u64, _: &mut [u8]) -> Result<(), MemError> {
        Ok(())
    }
    fn write_local(&mut self, _: u32, _: &[Sge], _: u64, _: &[u8]) -> Result<(), MemError> {
        Ok(())
    }
    fn check_remote(
        &self,
        _: QpScope,
        _: u32,
        _: u64,
        _: u64,
        _: RemoteAccess,
    ) -> Result<(), MemError> {
        Ok(())
    }
    fn read_remote(&self, _: u32, _: u64, _: &mut [u8]) -> Result<(), MemError> {
        Ok(())
    }
    fn write_remote(&mut self, _: u32, _: u64, _: &[u8]) -> Result<(), MemError> {
        Ok(())
    }
    fn atomic(&mut self, _: QpScope, _: u32, _: u64, _: AtomicOp) -> Result<u64, MemError> {
        Ok(0)
    }
    fn invalidate(&mut self, _: QpScope, _: u32) -> Result<(), MemError> {
        Ok(())
    }
}

fn connected(me: u32, peer: u32) -> Qp {
    let mut q = Qp::new(QpConfig::new(Qpn::new(me).unwrap(), QpType::Rc, 1));
    q.modify(&QpAttr {
        state: Some(QpState::Init),
        pkey_index: Some(0),
        port: Some(1),
        access: Some(QpAccess {
            remote_write: true,
            remote_read: true,
            remote_atomic: true,
        }),
        ..Default::default()
    })
    .unwrap();
    q.modify(&QpAttr {
        state: Some(QpState::Rtr),
        ah: Some(0),
        path_mtu: Some(Mtu::Mtu4096),
        dest_qpn: Some(Qpn::new(peer).unwrap()),
        rq_psn: Some(Psn::new(0)),
        max_dest_rd_atomic: Some(16),
        min_rnr_timer: Some(1),
        ..Default::default()
    })
    .unwrap();
    q.modify(&QpAttr {
        state: Some(QpState::Rts),
        sq_psn: Some(Psn::new(0)),
        timeout: Some(14),
        retry_cnt: Some(7),
        rnr_retry: Some(7),
        max_rd_atomic: Some(16),
        ..Default::default()
    })
    .unwrap();
    q
}

const MSG: u32 = 1 << 20; // 256 packets of 4096 bytes

fn bench(c: &mut Criterion) {
    eprintln!(
        "size_of::<Qp>() = {} bytes (an idle QP holds no heap allocation until work is posted)",
        std::mem::size_of::<Qp>()
    );
    let mut a = connected(0x11, 0x12);
    let mut b = connected(0x12, 0x11);
    let mut mem = NullMemory;
    // One packet buffer: headers are emitted in front of a payload area that
    // is never written (no copy), then validated as the receiver would.
    let mut pkt = vec![0u8; 8192];
    let mut g = c.benchmark_group("rc_write_stream_mtu4096");
    g.throughput(Throughput::Elements(u64::from(MSG / 4096)));
    g.bench_function("per_message_of_256_packets", |bch| {
        bch.iter(|| {
            let wr = SendWr::new(
                1,
                SendOp::Write {
                    remote_addr: 0x1000,
                    rkey: 7,
                },
                [Sge {
                    addr: 0,
                    length: MSG,
                    lkey: 1,
                }],
            );
            a.post_send(wr, &mut mem).unwrap();
            let mut now = 0;
            loop {
                let mut moved = false;
                while let Some(t) = a.poll_transmit(now) {
                    let n = t.ib.buffer_len();
                    t.ib.emit(&mut pkt[..n]).unwrap();
                    let p = IbPacket::new_checked(&pkt[..n]).unwrap();
                    b.handle_packet(now, &p, None, &mut mem);
                    moved = true;
                }
                while let Some(t) = b.poll_transmit(now) {
                    let n = t.ib.buffer_len();
                    t.ib.emit(&mut pkt[..n]).unwrap();
                    let p = IbPacket::new_checked(&pkt[..n]).unwrap();
                    a.handle_packet(now, &p, None, &mut mem);
                    moved = true;
                }
                now += 1;
                if !moved {
                    break;
                }
            }
            let wc = a.poll_completion().unwrap();
            assert_eq!(wc.status, WcStatus::Success);
            black_box(wc)
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
