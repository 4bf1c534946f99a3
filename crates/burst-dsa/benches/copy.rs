//! Cost of one payload copy through the copy engine: a 4 KiB packet (the
//! placement of one MTU-4096 RDMA WRITE packet) and a 64 KiB message.
//!
//! `cargo bench -p burst-dsa --bench copy`

use std::hint::black_box;

use burst_dsa::{copy_from_raw, CpuCopy};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("copy");
    for len in [4096usize, 65536] {
        let src: Vec<u8> = (0..len).map(|i| i as u8).collect();
        let mut dst = vec![0u8; len];
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_function(format!("cpu_{len}"), |b| {
            b.iter(|| {
                // SAFETY: `src` is live for `len` bytes and distinct from `dst`.
                unsafe { copy_from_raw(&CpuCopy, black_box(&mut dst), black_box(src.as_ptr())) }
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
