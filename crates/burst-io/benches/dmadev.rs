//! A copy job through DPDK's `dma_skeleton` (the dmadev backend), submit to
//! completion, against `memcpy` of the same bytes. Honestly labelled: the
//! skeleton copies with a CPU thread of its own (another core), and the
//! caller spins on `rte_dma_completed` meanwhile; the numbers prove the
//! path and price its overhead, not a DMA engine's speed.
//!
//! `cargo bench -p burst-io --features dpdk --bench dmadev` (as root)

use std::hint::black_box;

use burst_dsa::{AsyncCopy, CopyJob, Segment};
use burst_io::dpdk_dma::DmaCopy;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

fn bench(c: &mut Criterion) {
    let prefix = format!("--file-prefix=burst-dmabench-{}", std::process::id());
    let mut dma = match DmaCopy::open(&["--vdev=dma_skeleton", &prefix], "dma_skeleton", 256) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("SKIPPED: no DPDK DMA device here: {e}");
            return;
        }
    };
    let mut g = c.benchmark_group("dmadev");
    let mut out = Vec::with_capacity(4);
    for len in [4096usize, 65536] {
        let src: Vec<u8> = (0..len).map(|i| i as u8).collect();
        let mut dst = vec![0u8; len];
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_function(format!("memcpy_{len}"), |b| {
            b.iter(|| black_box(&mut dst).copy_from_slice(black_box(&src)))
        });
        g.bench_function(format!("dma_skeleton_{len}"), |b| {
            b.iter(|| {
                let job = CopyJob {
                    tag: 1,
                    segments: vec![Segment::between(&mut dst, &src)],
                };
                // SAFETY: the buffers outlive the job, drained at once.
                unsafe { dma.submit(job).expect("room") };
                out.clear();
                dma.drain(&mut out);
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
