#![doc = include_str!("../README.md")]

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
