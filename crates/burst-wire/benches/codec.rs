//! Per-packet cost of the codec: parse + ICRC verify, and header build, for a
//! 4096-byte RDMA WRITE and a 64-byte SEND, next to plain crc32fast over the
//! same bytes (the ICRC should cost close to the raw CRC).
//!
//! `cargo bench -p burst-wire --bench codec`

use std::hint::black_box;
use std::net::Ipv4Addr;

use burst_wire::*;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

fn frame(op: Opcode, len: usize) -> (FrameRepr, Vec<u8>) {
    let mut ib = IbRepr::new(BthRepr::new(
        op,
        Qpn::new(0x11).unwrap(),
        Psn::new(0x123456),
    ));
    if op.info().unwrap().headers.contains(HeaderSet::RETH) {
        ib.reth = Some(RethRepr {
            virtual_address: 0x7f00_0000_0000,
            rkey: 0x1234,
            dma_length: len as u32,
        });
    }
    ib.payload_len = len;
    let f = FrameRepr {
        eth: Some(EthRepr::default()),
        ip: IpRepr::v4(Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2)),
        udp: UdpRepr::new(49152),
        ib,
    };
    let payload: Vec<u8> = (0..len).map(|i| i as u8).collect();
    let mut buf = vec![0u8; f.frame_len()];
    f.emit(&mut buf, &payload).unwrap();
    (f, buf)
}

fn bench(c: &mut Criterion) {
    for (name, op, len) in [
        ("write4096", Opcode::RC_RDMA_WRITE_ONLY, 4096),
        ("send64", Opcode::RC_SEND_ONLY, 64),
    ] {
        let (f, buf) = frame(op, len);
        let mut g = c.benchmark_group(name);
        g.throughput(Throughput::Bytes(buf.len() as u64));
        g.bench_function("parse+verify_icrc", |b| {
            b.iter(|| {
                let rx = parse_verified(black_box(&buf)).unwrap();
                black_box(rx.ib.payload_len())
            })
        });
        g.bench_function("parse_only", |b| {
            b.iter(|| {
                let rx = RoceFrame::parse_ethernet(black_box(&buf)).unwrap();
                black_box(rx.ib.payload_len())
            })
        });
        // Same bytes the ICRC covers, through crc32fast directly.
        let covered = &buf[f.ip_offset()..buf.len() - ICRC_LEN];
        g.bench_function("raw_crc32fast", |b| {
            b.iter(|| black_box(crc32fast::hash(black_box(covered))))
        });
        let ip = &buf[f.ip_offset()..f.ip_offset() + f.ip.header_len()];
        let udp = &buf[f.ip_offset() + f.ip.header_len()..f.ib_offset()];
        let ib = &buf[f.ib_offset()..buf.len() - ICRC_LEN];
        g.bench_function("icrc_only", |b| {
            b.iter(|| {
                black_box(icrc::compute(black_box(ip), black_box(udp), black_box(ib)).unwrap())
            })
        });
        let mut out = buf.clone();
        g.bench_function("build_headers", |b| {
            b.iter(|| black_box(f.emit_headers(black_box(&mut out)).unwrap()))
        });
        g.bench_function("build_headers+icrc", |b| {
            b.iter(|| black_box(f.emit_in_place(black_box(&mut out)).unwrap()))
        });
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
