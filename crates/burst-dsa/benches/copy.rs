//! The copy engine's costs, each against its baseline in the same run:
//!
//! - `copy/{memcpy,cpu,nt}_{size}`: `memcpy`, the CPU backend (`memcpy`
//!   below `NT_THRESHOLD`, non-temporal stores from it) and non-temporal
//!   stores alone, 64 B to 16 MiB: where the threshold belongs;
//! - `icrc/{crc,copy_then_crc,fused}_4096`: a 4 KiB payload's CRC-32 alone,
//!   a copy followed by it, and the fused pass (target: fused at most 1.1x
//!   the CRC alone), and joining a header CRC to a payload CRC afterwards;
//! - `engine/{cpu,dsa_model}_{size}`: a job through each asynchronous
//!   backend, submit to poll (the model copies on this CPU: it shows the
//!   engine's own overhead, not a device's speed).
//!
//! `cargo bench -p burst-dsa --bench copy`

use std::hint::black_box;

use burst_dsa::cpu::copy_nt;
use burst_dsa::crc::{combine, copy_from_crc, copy_into_crc};
use burst_dsa::dsa::model::DsaModel;
use burst_dsa::dsa::DsaEngine;
use burst_dsa::{AsyncCopy, CopyEngine, CopyJob, CpuCopy, CpuEngine, Segment};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

fn copies(c: &mut Criterion) {
    let mut g = c.benchmark_group("copy");
    for len in [
        64usize,
        1024,
        4096,
        65536,
        1 << 20,
        4 << 20,
        8 << 20,
        16 << 20,
    ] {
        let src: Vec<u8> = (0..len).map(|i| i as u8).collect();
        let mut dst = vec![0u8; len];
        g.throughput(Throughput::Bytes(len as u64));
        if len >= 1 << 20 {
            g.sample_size(20);
        }
        g.bench_function(format!("memcpy_{len}"), |b| {
            b.iter(|| black_box(&mut dst).copy_from_slice(black_box(&src)))
        });
        g.bench_function(format!("cpu_{len}"), |b| {
            // SAFETY: `src` and `dst` are live for `len` bytes, distinct.
            b.iter(|| unsafe { CpuCopy.copy(black_box(dst.as_mut_ptr()), src.as_ptr(), len) })
        });
        g.bench_function(format!("nt_{len}"), |b| {
            // SAFETY: as above.
            b.iter(|| unsafe { copy_nt(black_box(dst.as_mut_ptr()), src.as_ptr(), len) })
        });
    }
    g.finish();
}

fn icrc(c: &mut Criterion) {
    let mut g = c.benchmark_group("icrc");
    let len = 4096;
    let src: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
    let mut dst = vec![0u8; len];
    g.throughput(Throughput::Bytes(len as u64));
    g.bench_function(format!("crc_{len}"), |b| {
        b.iter(|| crc32fast::hash(black_box(&src)))
    });
    g.bench_function(format!("copy_then_crc_{len}"), |b| {
        b.iter(|| {
            black_box(&mut dst).copy_from_slice(black_box(&src));
            crc32fast::hash(&dst)
        })
    });
    g.bench_function(format!("fused_{len}"), |b| {
        // SAFETY: `src` is live for `len` bytes and distinct from `dst`.
        b.iter(|| unsafe { copy_into_crc(black_box(&mut dst), black_box(src.as_ptr()), 0) })
    });
    // The receive side: a frame's ICRC checked, then its payload placed
    // (the CPU placement, ordered tail), against one pass that does both.
    g.bench_function(format!("crc_then_place_{len}"), |b| {
        b.iter(|| {
            let c = crc32fast::hash(black_box(&src));
            // SAFETY: `dst` is live for `len` bytes and distinct from `src`.
            unsafe { CpuCopy.copy(black_box(dst.as_mut_ptr()), src.as_ptr(), len) };
            c
        })
    });
    g.bench_function(format!("fused_place_{len}"), |b| {
        // SAFETY: `dst` is live for `len` bytes and distinct from `src`.
        b.iter(|| unsafe { copy_from_crc(black_box(dst.as_mut_ptr()), black_box(&src), 0) })
    });
    g.bench_function(format!("combine_{len}"), |b| {
        b.iter(|| {
            combine(
                black_box(0x1234_5678),
                black_box(0x9abc_def0),
                black_box(len as u64),
            )
        })
    });
    let mut far = vec![0u8; len + 4096];
    g.bench_function(format!("fused_{len}_dst_off_1040"), |b| {
        // SAFETY: as above.
        b.iter(|| unsafe {
            copy_into_crc(
                black_box(&mut far[1040..1040 + len]),
                black_box(src.as_ptr()),
                0,
            )
        })
    });
    g.finish();
}

fn engines(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine");
    for len in [4096usize, 65536] {
        let src: Vec<u8> = (0..len).map(|i| i as u8).collect();
        let mut dst = vec![0u8; len];
        g.throughput(Throughput::Bytes(len as u64));
        let mut out = Vec::with_capacity(4);
        let mut cpu = CpuEngine::new(16);
        g.bench_function(format!("cpu_{len}"), |b| {
            b.iter(|| {
                let job = CopyJob {
                    tag: 1,
                    segments: vec![Segment::between(&mut dst, &src)],
                };
                // SAFETY: the buffers outlive the job, drained at once.
                unsafe { cpu.submit(job).unwrap() };
                out.clear();
                cpu.drain(&mut out);
            })
        });
        let m = DsaModel::new(64);
        let mut dsa = DsaEngine::new(m.portal(), 16, 0);
        g.bench_function(format!("dsa_model_{len}"), |b| {
            b.iter(|| {
                let job = CopyJob {
                    tag: 1,
                    segments: vec![Segment::between(&mut dst, &src)],
                };
                // SAFETY: as above.
                unsafe { dsa.submit(job).unwrap() };
                m.process();
                out.clear();
                dsa.drain(&mut out);
            })
        });
    }
    g.finish();
}

criterion_group!(benches, copies, icrc, engines);
criterion_main!(benches);
