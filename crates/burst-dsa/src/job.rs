//! The asynchronous interface every backend offers: submit copy jobs (one
//! or many scatter-gather segments, with a tag), poll their completions.
//!
//! Two rules make it usable by a data plane that must not report a work
//! completion before its bytes have moved:
//!
//! - **Order.** Completions come out of [`AsyncCopy::poll`] in submission
//!   order, whatever order the backend finished them in.
//! - **Back-pressure.** [`AsyncCopy::submit`] hands a job back when the
//!   backend has no room (a full work queue); the caller polls and retries.
//!   Nothing is queued without bound.

use std::fmt;

/// One contiguous piece of a job: `len` bytes from `src` to `dst`.
///
/// Raw pointers: one side is usually application memory that the
/// application may touch concurrently (RDMA semantics), so no Rust
/// reference to it is formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Destination.
    pub dst: *mut u8,
    /// Source.
    pub src: *const u8,
    /// Bytes.
    pub len: usize,
}

// SAFETY: a Segment is two addresses and a length; whoever submits it
// vouches for the memory (AsyncCopy::submit's contract), from any thread.
unsafe impl Send for Segment {}

impl Segment {
    /// The segment copying `src` into `dst` (equal lengths).
    pub fn between(dst: &mut [u8], src: &[u8]) -> Segment {
        assert_eq!(dst.len(), src.len(), "segment lengths differ");
        Segment {
            dst: dst.as_mut_ptr(),
            src: src.as_ptr(),
            len: src.len(),
        }
    }
}

/// A copy job: its segments move as one unit, reported under `tag`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyJob {
    /// The caller's name for the job (a work request, a packet).
    pub tag: u64,
    /// What to copy, in order.
    pub segments: Vec<Segment>,
}

impl CopyJob {
    /// Bytes the job moves.
    pub fn bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.len as u64).sum()
    }
}

/// Why a job failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyError {
    /// The device refused a descriptor (its DSA completion status).
    Device(u8),
}

impl fmt::Display for CopyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CopyError::Device(s) => write!(f, "the device refused the descriptor (status {s:#x})"),
        }
    }
}

impl std::error::Error for CopyError {}

/// A finished job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The job's tag.
    pub tag: u64,
    /// Bytes it moved.
    pub bytes: u64,
    /// Whether every byte moved.
    pub status: Result<(), CopyError>,
}

/// What a backend counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Jobs completed.
    pub jobs: u64,
    /// Bytes moved.
    pub bytes: u64,
    /// Jobs (or their rest) the CPU finished for the backend (a page fault
    /// the device reported, a job too small to offload).
    pub fallbacks: u64,
    /// Page faults the device reported.
    pub faults: u64,
    /// Submissions handed back because the backend was full.
    pub full: u64,
    /// Jobs that failed.
    pub errors: u64,
}

/// A copy backend driven by submissions and polls.
pub trait AsyncCopy {
    /// Queues `job`, or hands it back when the backend has no room (poll,
    /// then submit again).
    ///
    /// # Safety
    /// Until the job's completion has been returned by [`AsyncCopy::poll`],
    /// every segment's `src` must stay valid for reads and `dst` for writes
    /// of `len` bytes, and no two ranges of the job may overlap.
    unsafe fn submit(&mut self, job: CopyJob) -> Result<(), CopyJob>;

    /// Moves the completions of finished jobs into `out`, in submission
    /// order; returns how many.
    fn poll(&mut self, out: &mut Vec<Completion>) -> usize;

    /// Jobs submitted whose completion has not been polled.
    fn in_flight(&self) -> usize;

    /// What the backend counted.
    fn counters(&self) -> Counters;

    /// Polls until every job submitted so far has completed.
    fn drain(&mut self, out: &mut Vec<Completion>) {
        while self.in_flight() > 0 {
            if self.poll(out) == 0 {
                std::hint::spin_loop();
            }
        }
    }
}

/// A scatter-gather job over buffers of its own, to check a backend against
/// a plain copy (every backend's tests use it): segment `i` copies `len`
/// bytes from offset `src_off` of its source to offset `dst_off` of its
/// destination, both at any alignment.
///
/// ```
/// use burst_dsa::{AsyncCopy, CpuEngine, SgCheck};
/// let mut check = SgCheck::new(&[(5000, 3, 17), (0, 0, 0), (100, 63, 1)], 9);
/// let mut engine = CpuEngine::new(4);
/// // SAFETY: `check` owns the buffers and outlives the job (drained below).
/// unsafe { engine.submit(check.job(1)).unwrap() };
/// let mut out = Vec::new();
/// engine.drain(&mut out);
/// check.verify().unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct SgCheck {
    segs: Vec<(usize, usize, usize)>,
    srcs: Vec<Vec<u8>>,
    dsts: Vec<Vec<u8>>,
}

impl SgCheck {
    /// Buffers for `segs` (`(len, src_off, dst_off)` each): sources filled
    /// with a pattern drawn from `seed`, destinations zeroed.
    pub fn new(segs: &[(usize, usize, usize)], seed: u64) -> SgCheck {
        let srcs = segs
            .iter()
            .enumerate()
            .map(|(i, &(len, so, _))| {
                (0..len + so)
                    .map(|k| (k as u64).wrapping_mul(31).wrapping_add(seed + i as u64) as u8)
                    .collect()
            })
            .collect();
        let dsts = segs.iter().map(|&(len, _, d)| vec![0u8; len + d]).collect();
        SgCheck {
            segs: segs.to_vec(),
            srcs,
            dsts,
        }
    }

    /// The job (its segments point into this value's buffers, which must
    /// outlive it: see [`AsyncCopy::submit`]).
    pub fn job(&mut self, tag: u64) -> CopyJob {
        let segments = self
            .segs
            .iter()
            .zip(&self.srcs)
            .zip(self.dsts.iter_mut())
            .map(|((&(len, so, d_off), s), d)| {
                Segment::between(&mut d[d_off..d_off + len], &s[so..so + len])
            })
            .collect();
        CopyJob { tag, segments }
    }

    /// Whether every destination holds its source's bytes where the job
    /// put them, and nothing anywhere else.
    pub fn verify(&self) -> Result<(), String> {
        for (i, ((&(len, so, d_off), s), d)) in
            self.segs.iter().zip(&self.srcs).zip(&self.dsts).enumerate()
        {
            if d[d_off..d_off + len] != s[so..so + len] {
                let at = (0..len).find(|&k| d[d_off + k] != s[so + k]).unwrap_or(0);
                return Err(format!("segment {i} ({len} B): byte {at} differs"));
            }
            if d[..d_off].iter().any(|&b| b != 0) {
                return Err(format!("segment {i}: bytes written before its start"));
            }
        }
        Ok(())
    }
}
