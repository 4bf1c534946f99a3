//! The CPU backend: the fastest synchronous copy this machine has, and an
//! [`AsyncCopy`] over it that completes every job as it is submitted.
//!
//! Below [`NT_THRESHOLD`] a copy is `memcpy` (glibc picks vector loads and
//! stores by size); from it on, non-temporal stores, which write around the
//! caches: a copy larger than the last-level cache would otherwise evict
//! what the data plane is working on and read every destination line
//! before writing it. The threshold is measured (`cargo bench -p burst-dsa
//! --bench copy -- copy/`, docs/performance.md, Session 14): `memcpy` wins
//! up to 8 MiB (158 us against 239 us), non-temporal stores from 16 MiB
//! (530 us against 762 us). Packet payloads (an MTU at most) never get near
//! it.
//!
//! Either way the last [`ORDERED_TAIL`] bytes are stored last, once each,
//! in ascending order ([`copy_ordered_tail`]), as a NIC's DMA writes them:
//! applications poll on the last byte of an RDMA WRITE's target to learn
//! that the data arrived (riostream, perftest's `ib_write_lat`, MPIs' eager
//! protocols) and then reuse the buffer. `memcpy` does not promise that:
//! glibc copies exactly one vector's worth (64 bytes with AVX-512) by
//! storing the same vector twice, so an application that saw the first
//! store and wrote its own next value into the flag had it overwritten by
//! the second (riostream's 64-byte latency test hung both sides).

use std::collections::VecDeque;

use crate::job::{AsyncCopy, Completion, CopyJob, Counters};
use crate::CopyEngine;

/// Copies from this size on use non-temporal stores (measured: see the
/// module documentation).
pub const NT_THRESHOLD: usize = 16 << 20;

/// How many bytes at the end of a copy [`CpuCopy`] stores last, once
/// each, in ascending order (a cache line: flags applications poll on
/// are a byte to a word at the end of the data).
pub const ORDERED_TAIL: usize = 64;

/// Copies `len` bytes: all but the last [`ORDERED_TAIL`] with `body`, then
/// those with one store per byte or aligned word, ascending, each byte
/// written once (see the module documentation).
///
/// # Safety
/// `src` valid for reads and `dst` for writes of `len` bytes; the ranges do
/// not overlap; `body` copies as `memcpy` does.
pub unsafe fn copy_ordered_tail(
    dst: *mut u8,
    src: *const u8,
    len: usize,
    body: unsafe fn(*mut u8, *const u8, usize),
) {
    let start = len.saturating_sub(ORDERED_TAIL);
    if start > 0 {
        // SAFETY: the caller's contract, on the first `start` bytes.
        unsafe { body(dst, src, start) };
    }
    // Volatile stores: the compiler may neither merge them into a `memcpy`
    // call nor reorder them; x86's stores become visible in program order.
    let mut off = start;
    while off < len && !(dst as usize + off).is_multiple_of(8) {
        // SAFETY: `off < len`: inside both ranges.
        unsafe { std::ptr::write_volatile(dst.add(off), src.add(off).read()) };
        off += 1;
    }
    while off + 8 <= len {
        // SAFETY: `off + 8 <= len`: inside both ranges; `dst + off` is
        // 8-byte aligned (the loop above aligned it), the load unaligned.
        unsafe {
            let v = src.add(off).cast::<u64>().read_unaligned();
            std::ptr::write_volatile(dst.add(off).cast::<u64>(), v);
        }
        off += 8;
    }
    while off < len {
        // SAFETY: `off < len`: inside both ranges.
        unsafe { std::ptr::write_volatile(dst.add(off), src.add(off).read()) };
        off += 1;
    }
}

/// `memcpy` as a function [`copy_ordered_tail`] takes.
///
/// # Safety
/// As `std::ptr::copy_nonoverlapping`.
unsafe fn memcpy(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: forwarded contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

/// Copies `len` bytes with non-temporal stores (x86_64; elsewhere a plain
/// copy).
///
/// # Safety
/// `src` valid for reads and `dst` for writes of `len` bytes; the ranges do
/// not overlap.
pub unsafe fn copy_nt(dst: *mut u8, src: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: forwarded contract; SSE2 is part of x86_64.
        unsafe { nt::copy(dst, src, len) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        // SAFETY: forwarded contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
    }
}

#[cfg(target_arch = "x86_64")]
mod nt {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};

    /// Head to 16-byte alignment of `dst` by `memcpy`, 64-byte blocks by
    /// unaligned loads and streaming stores, a fence so the streamed lines
    /// are ordered before what follows, then the tail by `memcpy`.
    ///
    /// # Safety
    /// As [`super::copy_nt`].
    pub(super) unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) {
        let head = dst.align_offset(16).min(len);
        // SAFETY: within both ranges (head <= len).
        unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
        let mut off = head;
        while off + 64 <= len {
            // SAFETY: off + 64 <= len keeps every access inside the ranges;
            // dst + off is 16-byte aligned (head aligned it, blocks keep
            // it), as the streaming stores need; loads may be unaligned.
            unsafe {
                let s = src.add(off).cast::<__m128i>();
                let d = dst.add(off).cast::<__m128i>();
                let a = _mm_loadu_si128(s);
                let b = _mm_loadu_si128(s.add(1));
                let c = _mm_loadu_si128(s.add(2));
                let e = _mm_loadu_si128(s.add(3));
                _mm_stream_si128(d, a);
                _mm_stream_si128(d.add(1), b);
                _mm_stream_si128(d.add(2), c);
                _mm_stream_si128(d.add(3), e);
            }
            off += 64;
        }
        // SAFETY: the rest of both ranges; the fence orders the streamed
        // stores before it (SSE2, always present on x86_64).
        unsafe {
            _mm_sfence();
            std::ptr::copy_nonoverlapping(src.add(off), dst.add(off), len - off);
        }
    }
}

/// The synchronous CPU copy: `memcpy`, or non-temporal stores from
/// [`NT_THRESHOLD`] on.
#[derive(Debug, Default, Clone, Copy)]
pub struct CpuCopy;

impl CopyEngine for CpuCopy {
    unsafe fn copy(&self, dst: *mut u8, src: *const u8, len: usize) {
        let body = if len >= NT_THRESHOLD { copy_nt } else { memcpy };
        // SAFETY: the trait's contract: valid, non-overlapping ranges.
        unsafe { copy_ordered_tail(dst, src, len, body) }
    }
}

/// [`AsyncCopy`] on the CPU: a job is copied when it is submitted and its
/// completion waits for the next poll (at most `depth` of them).
#[derive(Debug)]
pub struct CpuEngine {
    done: VecDeque<Completion>,
    depth: usize,
    counters: Counters,
}

impl CpuEngine {
    /// An engine that holds up to `depth` unpolled completions.
    pub fn new(depth: usize) -> CpuEngine {
        CpuEngine {
            done: VecDeque::with_capacity(depth),
            depth: depth.max(1),
            counters: Counters::default(),
        }
    }
}

impl AsyncCopy for CpuEngine {
    unsafe fn submit(&mut self, job: CopyJob) -> Result<(), CopyJob> {
        if self.done.len() >= self.depth {
            self.counters.full += 1;
            return Err(job);
        }
        for s in &job.segments {
            // SAFETY: the submit contract: valid, non-overlapping segments.
            unsafe { CpuCopy.copy(s.dst, s.src, s.len) };
        }
        let bytes = job.bytes();
        self.counters.jobs += 1;
        self.counters.bytes += bytes;
        self.done.push_back(Completion {
            tag: job.tag,
            bytes,
            status: Ok(()),
        });
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> usize {
        let n = self.done.len();
        out.extend(self.done.drain(..));
        n
    }

    fn in_flight(&self) -> usize {
        self.done.len()
    }

    fn counters(&self) -> Counters {
        self.counters
    }
}
