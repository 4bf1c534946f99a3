//! The dmadev copy backend on DPDK's `dma_skeleton` virtual device (a
//! software DMA engine copying on a thread of its own): random
//! scatter-gather jobs give the bytes of a plain copy, in submission order,
//! and a full ring hands the job back. Needs DPDK's EAL (root, no
//! hugepages); skipped, loudly, without it.
#![cfg(feature = "dpdk")]

use std::time::{Duration, Instant};

use burst_dsa::{AsyncCopy, CopyJob, Segment, SgCheck};
use burst_io::dpdk_dma::DmaCopy;

#[test]
fn dma_skeleton_copies_scatter_gather_jobs_in_order() {
    let prefix = format!("--file-prefix=burst-dmatest-{}", std::process::id());
    let mut dma = match DmaCopy::open(&["--vdev=dma_skeleton", &prefix], "dma_skeleton", 64) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("SKIPPED: no DPDK DMA device here: {e}");
            return;
        }
    };
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n) as usize
    };
    let mut out = Vec::new();
    for round in 0..40u64 {
        // 1-4 segments, 0-9000 bytes each, any offsets.
        let segs: Vec<(usize, usize, usize)> = (0..1 + rnd(4))
            .map(|_| (rnd(9000), rnd(64), rnd(64)))
            .collect();
        let mut check = SgCheck::new(&segs, round);
        // SAFETY: `check` holds the buffers past the completion below.
        unsafe { dma.submit(check.job(round)).expect("room for one job") };
        let deadline = Instant::now() + Duration::from_secs(10);
        while dma.in_flight() > 0 && Instant::now() < deadline {
            dma.poll(&mut out);
        }
        assert_eq!(dma.in_flight(), 0, "job {round} completed");
        check
            .verify()
            .unwrap_or_else(|e| panic!("job {round}: {e}"));
    }
    assert_eq!(
        out.iter().map(|c| c.tag).collect::<Vec<_>>(),
        (0..40).collect::<Vec<_>>()
    );
    assert!(out.iter().all(|c| c.status.is_ok()));

    // More copies than the ring holds: handed back, taken after a poll.
    let src = vec![7u8; 64];
    let mut dst = vec![vec![0u8; 64]; 200];
    let job = CopyJob {
        tag: 99,
        segments: dst.iter_mut().map(|d| Segment::between(d, &src)).collect(),
    };
    // SAFETY: as above (the job is refused, nothing is enqueued).
    let back = unsafe { dma.submit(job) }.expect_err("200 copies do not fit 64 descriptors");
    assert_eq!((back.tag, dma.counters().full), (99, 1));
    let c = dma.counters();
    assert_eq!((c.jobs, c.errors), (40, 0));
}
