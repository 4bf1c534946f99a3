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

    /// A thread that polls on the last byte of a copy's destination (as
    /// an application polls on the end of an RDMA WRITE) and answers by
    /// writing its own value there keeps it: the copy stores that byte
    /// once, after the rest. `memcpy` of exactly one vector (64 bytes with
    /// AVX-512) stores the vector twice and lost the answer about once in
    /// a few thousand rounds on this machine.
    #[test]
    fn a_flag_polled_at_the_end_of_a_copy_is_stored_once() {
        use std::sync::atomic::{AtomicU32, Ordering};
        use std::time::{Duration, Instant};
        #[repr(align(64))]
        struct Line([u8; 64]);
        const ROUNDS: u32 = 100_000;
        let mut line = Box::new(Line([0; 64]));
        let dst = line.0.as_mut_ptr() as usize;
        let answered = std::sync::Arc::new(AtomicU32::new(0));
        let a = answered.clone();
        let poller = std::thread::spawn(move || {
            let flag = (dst + 63) as *mut u8;
            for round in 1..=ROUNDS {
                let want = (round % 127 + 1) as u8;
                let deadline = Instant::now() + Duration::from_secs(5);
                // SAFETY: the box outlives both threads (joined below);
                // racing on the byte is what the test is about, volatile
                // as a C application's `volatile char *`.
                while unsafe { flag.read_volatile() } != want {
                    if Instant::now() > deadline {
                        return;
                    }
                    std::hint::spin_loop();
                }
                // SAFETY: as above.
                unsafe { flag.write_volatile(want | 0x80) };
                a.store(round, Ordering::Release);
            }
        });
        let mut lost = 0;
        for round in 1..=ROUNDS {
            let want = (round % 127 + 1) as u8;
            let src = [want; 64];
            // SAFETY: the line is 64 live bytes apart from `src`.
            unsafe { copy_to_raw(&CpuCopy, dst as *mut u8, std::hint::black_box(&src[..])) };
            let deadline = Instant::now() + Duration::from_secs(5);
            while answered.load(Ordering::Acquire) != round {
                assert!(
                    Instant::now() < deadline,
                    "the poller never saw round {round}"
                );
                std::hint::spin_loop();
            }
            // SAFETY: as in the poller.
            if unsafe { ((dst + 63) as *const u8).read_volatile() } != want | 0x80 {
                lost += 1;
            }
        }
        poller.join().unwrap();
        drop(line);
        assert_eq!(lost, 0, "answers overwritten by the copy");
    }

    /// Every length and alignment around the ordered tail and the vector
    /// sizes copies exactly, and touches nothing past the range.
    #[test]
    fn cpu_copy_is_exact_at_every_length_and_alignment() {
        let src: Vec<u8> = (0..300u32).map(|i| (i * 7 + 1) as u8).collect();
        for len in 0..200 {
            for at in 0..9 {
                let mut dst = vec![0xeeu8; 220];
                // SAFETY: `at + len` <= 208 < 220 and `len` <= 300.
                unsafe { copy_to_raw(&CpuCopy, dst.as_mut_ptr().add(at), &src[..len]) };
                assert_eq!(&dst[at..at + len], &src[..len], "len {len} at {at}");
                assert!(dst[..at].iter().all(|&b| b == 0xee), "before, len {len}");
                assert!(
                    dst[at + len..].iter().all(|&b| b == 0xee),
                    "after, len {len}"
                );
            }
        }
    }
}
