//! Buffers a peer writes into: registered for remote write, so the engine
//! thread (or burstd) writes them while this side reads. They are held by
//! raw pointer only and read with copies, never borrowed as Rust slices,
//! since a slice would promise that nobody else writes them.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::io;
use std::ptr::NonNull;

/// Page-aligned zeroed memory of a fixed length, freed on drop. Every access
/// is bounds-checked: an offset a peer chose cannot reach outside it.
pub(super) struct RawBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the memory is owned by this value; concurrent writers are the
// engine's placements, which the protocol orders before the completion this
// side reads them after (the CQ ring's release/acquire).
unsafe impl Send for RawBuf {}
// SAFETY: as above; `&RawBuf` only copies in and out through raw pointers.
unsafe impl Sync for RawBuf {}

impl RawBuf {
    /// `len` zeroed bytes (at least one), page-aligned so a daemon client's
    /// registration moves only these pages.
    pub(super) fn new(len: usize) -> io::Result<RawBuf> {
        let layout = Layout::from_size_align(len.max(1), 4096)
            .map_err(|_| io::Error::from_raw_os_error(libc::ENOMEM))?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(p).ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
        Ok(RawBuf { ptr, layout })
    }

    pub(super) fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub(super) fn len(&self) -> usize {
        self.layout.size()
    }

    /// The address peers and work requests name.
    pub(super) fn addr(&self, at: usize) -> u64 {
        self.ptr.as_ptr() as u64 + at as u64
    }

    /// Copies `out.len()` bytes from `at` (clipped to the buffer: returns how
    /// many were copied).
    pub(super) fn read(&self, at: usize, out: &mut [u8]) -> usize {
        let n = out.len().min(self.len().saturating_sub(at));
        // SAFETY: `at + n` is within the allocation; `out` is a distinct
        // Rust buffer of at least `n` bytes.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(at), out.as_mut_ptr(), n) };
        n
    }

    /// Copies `data` to `at` (clipped as [`RawBuf::read`]).
    pub(super) fn write(&self, at: usize, data: &[u8]) -> usize {
        let n = data.len().min(self.len().saturating_sub(at));
        // SAFETY: as in `read`, the other way.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(at), n) };
        n
    }

    /// A `u64` the peer may be writing (0 out of bounds).
    pub(super) fn load_u64(&self, at: usize) -> u64 {
        if at % 8 != 0 || at + 8 > self.len() {
            return 0;
        }
        // SAFETY: aligned and in bounds (checked above); volatile because
        // the peer's WRITE may change it at any time.
        unsafe { std::ptr::read_volatile(self.ptr.as_ptr().add(at).cast::<u64>()) }
    }

    /// A `u32` the peer may be writing (0 out of bounds).
    pub(super) fn load_u32(&self, at: usize) -> u32 {
        if at % 4 != 0 || at + 4 > self.len() {
            return 0;
        }
        // SAFETY: as in `load_u64`.
        unsafe { std::ptr::read_volatile(self.ptr.as_ptr().add(at).cast::<u32>()) }
    }

    pub(super) fn store_u64(&self, at: usize, v: u64) {
        if at % 8 == 0 && at + 8 <= self.len() {
            // SAFETY: as in `load_u64`.
            unsafe { std::ptr::write_volatile(self.ptr.as_ptr().add(at).cast::<u64>(), v) }
        }
    }

    pub(super) fn store_u32(&self, at: usize, v: u32) {
        if at % 4 == 0 && at + 4 <= self.len() {
            // SAFETY: as in `load_u64`.
            unsafe { std::ptr::write_volatile(self.ptr.as_ptr().add(at).cast::<u32>(), v) }
        }
    }
}

impl Drop for RawBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accesses_are_clipped_to_the_buffer() {
        let b = RawBuf::new(16).unwrap();
        assert_eq!(b.len(), 16);
        assert_eq!(b.write(10, &[7; 10]), 6);
        let mut out = [0u8; 10];
        assert_eq!(b.read(12, &mut out), 4);
        assert_eq!(&out[..4], &[7; 4]);
        assert_eq!(b.read(100, &mut out), 0);
        b.store_u64(8, 0x0102_0304_0506_0708);
        assert_eq!(b.load_u64(8), 0x0102_0304_0506_0708);
        assert_eq!(b.load_u64(12), 0, "misaligned");
        assert_eq!(b.load_u32(16), 0, "past the end");
        b.store_u32(14, 1);
        let high = 0x0102_0304_0506_0708u64.to_ne_bytes();
        assert_eq!(
            b.load_u32(12),
            u32::from_ne_bytes([high[4], high[5], high[6], high[7]]),
            "a misaligned store is dropped"
        );
    }
}
