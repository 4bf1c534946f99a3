//! # burst-dsa: the copy engine
//!
//! Every bulk payload copy of burst goes through here, so that a backend that
//! offloads copies (Intel DSA work queues, DPDK dmadev) can replace the CPU
//! without touching the rest of the stack.
//!
//! - [`job`]: the asynchronous interface ([`AsyncCopy`]): copy jobs of
//!   scatter-gather segments with a tag, completions polled in submission
//!   order, a full backend hands the job back.
//! - [`cpu`]: the CPU backend ([`CpuCopy`] synchronous, [`CpuEngine`]
//!   asynchronous), non-temporal stores for large copies.
//! - [`crc`]: copy and CRC-32 in one pass (the ICRC of a payload while it
//!   moves).
//! - [`dsa`]: Intel DSA: the 64-byte descriptors and 32-byte completion
//!   records of the idxd user interface, an engine that submits them to a
//!   work-queue portal (batches, page faults finished on the CPU), and a
//!   software model of the device that consumes the same descriptors.
//!
//! Copies take raw pointers because one side is application memory that the
//! application may touch concurrently (RDMA semantics: racing accesses give
//! unspecified bytes, never undefined behaviour in the stack); no Rust
//! reference to such memory is ever formed.

pub mod cpu;
pub mod crc;
pub mod dsa;
pub mod job;

pub use cpu::{CpuCopy, CpuEngine};
pub use job::{AsyncCopy, Completion, CopyError, CopyJob, Counters, Segment, SgCheck};

/// Moves bytes between memory areas, synchronously.
pub trait CopyEngine {
    /// Copies `len` bytes from `src` to `dst`.
    ///
    /// # Safety
    /// `src` must be valid for reads and `dst` for writes of `len` bytes for
    /// the duration of the call, and the two ranges must not overlap.
    unsafe fn copy(&self, dst: *mut u8, src: *const u8, len: usize);
}

/// Copies a slice into raw memory.
///
/// # Safety
/// `dst` must be valid for writes of `src.len()` bytes and not overlap `src`.
pub unsafe fn copy_to_raw(engine: &impl CopyEngine, dst: *mut u8, src: &[u8]) {
    // SAFETY: `src` is a live slice; the caller vouches for `dst`.
    unsafe { engine.copy(dst, src.as_ptr(), src.len()) }
}

/// Copies raw memory into a slice.
///
/// # Safety
/// `src` must be valid for reads of `dst.len()` bytes and not overlap `dst`.
pub unsafe fn copy_from_raw(engine: &impl CopyEngine, dst: &mut [u8], src: *const u8) {
    // SAFETY: `dst` is a live exclusive slice; the caller vouches for `src`.
    unsafe { engine.copy(dst.as_mut_ptr(), src, dst.len()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_copy_moves_bytes() {
        let src: Vec<u8> = (0..=255).collect();
        let mut dst = vec![0u8; 256];
        // SAFETY: both buffers are live, 256 bytes, distinct allocations.
        unsafe { copy_from_raw(&CpuCopy, &mut dst, src.as_ptr()) };
        assert_eq!(src, dst);
        let mut out = vec![0u8; 4];
        // SAFETY: `out` is live for 4 bytes and distinct from the source.
        unsafe { copy_to_raw(&CpuCopy, out.as_mut_ptr(), &[1, 2, 3, 4]) };
        assert_eq!(out, [1, 2, 3, 4]);
    }
}
