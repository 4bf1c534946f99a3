//! What the transfer tests share: a pattern per request and block, a
//! scattered request, its check, and three verified write batches.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use burst_xfer::{Op, Pool, Segment, Transfer};

pub const T: Duration = Duration::from_secs(20);
pub const BLOCK: u32 = 4096;

/// Block `i` of request `req`: a pattern no other block has.
pub fn pattern(req: u64, i: usize) -> Vec<u8> {
    let mut x = req.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ (i as u64 + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    (0..BLOCK as usize)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// `n` blocks from consecutive local slots to scattered remote slots
/// (a permutation of the pool's), the local ones filled with the pattern.
pub fn request(pool: &Pool, req: u64, n: usize, slots: usize) -> Vec<Segment> {
    (0..n)
        .map(|i| {
            pool.write(i as u64 * u64::from(BLOCK), &pattern(req, i));
            // A stride coprime with the slot count scatters without repeats.
            let remote = (i * 7919 + req as usize * 31) % slots;
            Segment {
                local: i as u64 * u64::from(BLOCK),
                remote: remote as u64 * u64::from(BLOCK),
                len: BLOCK,
            }
        })
        .collect()
}

pub fn verify(pool: &Pool, req: u64, segs: &[Segment], remote: bool) {
    let mut got = vec![0u8; BLOCK as usize];
    for (i, s) in segs.iter().enumerate() {
        let at = if remote { s.remote } else { s.local };
        assert!(pool.read(at, &mut got));
        assert!(got == pattern(req, i), "request {req} block {i} at {at}");
    }
}

pub fn write_read_and_check(a: &mut impl Transfer, b: &mut impl Transfer, pa: &Pool, pb: &Pool) {
    let slots = pb.len() / BLOCK as usize;
    for req in 1..=3u64 {
        // 300 blocks: more than the QPs' depth (16) times their number.
        let segs = request(pa, req, 300, slots);
        let t = Instant::now();
        let id = a.submit(Op::Write, &segs).unwrap();
        let landed = b.wait_landed(T).unwrap();
        assert_eq!(landed.batch, id);
        assert_eq!(landed.bytes, 300 * u64::from(BLOCK));
        assert_eq!(a.wait(id, T).unwrap(), 300 * u64::from(BLOCK));
        verify(pb, req, &segs, true);
        assert!(t.elapsed() < T);
    }
}
