//! Copy and CRC-32 in one pass over the bytes.
//!
//! RoCEv2 puts an ICRC (CRC-32) over every packet's payload, so on the CPU
//! path each payload byte is read twice: once to copy it between
//! application memory and the packet buffer, once to checksum it. Here one
//! loop loads a block, stores it to the destination and folds the same
//! registers into the CRC with carry-less multiplication (the folding of
//! Intel's "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ",
//! constants for the IEEE polynomial): 256 bytes in sixteen lanes with
//! AVX-512 VPCLMULQDQ, 64 bytes in four with PCLMULQDQ. The store rides
//! along with the CRC's own loads: measured, the fused pass of a 4 KiB
//! payload costs 1.04x the CRC alone (91.5 against 88.2 ns), where a copy
//! then the CRC costs 1.41x (124 ns; `cargo bench -p burst-dsa --bench copy
//! -- icrc`, docs/performance.md, Session 14). Own code because no
//! crate fuses the two; the folding is checked against crc32fast by
//! property tests. Without PCLMULQDQ and SSE4.1 (or under 64 bytes) it is a
//! copy then crc32fast.
//!
//! CRC values continue as crc32fast's do: pass 0 to start, or a finalized
//! value to continue it (`crc32fast::Hasher::new_with_initial`).
//! Application memory is only ever behind raw pointers; the tail (under 16
//! bytes) is checksummed from the side that is burst's own.

/// `crc` (a finished CRC-32, 0 to start) continued over `bytes`: the
/// small pieces around a fused pass (a payload's tail under 16 bytes, a
/// packet's pad).
///
/// ```
/// let head = crc32fast::hash(b"Ro");
/// assert_eq!(burst_dsa::crc::continued(head, b"CE"), crc32fast::hash(b"RoCE"));
/// ```
pub fn continued(crc: u32, bytes: &[u8]) -> u32 {
    if bytes.is_empty() {
        return crc;
    }
    let mut h = crc32fast::Hasher::new_with_initial(crc);
    h.update(bytes);
    h.finalize()
}

/// Copies `dst.len()` bytes from `src` into `dst` (burst's buffer: a packet
/// being built) and returns the CRC-32 of those bytes continued from `crc`.
///
/// # Safety
/// `src` must be valid for reads of `dst.len()` bytes and not overlap `dst`.
///
/// ```
/// let src: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
/// let mut dst = vec![0u8; 5000];
/// // SAFETY: `src` is live for 5000 bytes and distinct from `dst`.
/// let crc = unsafe { burst_dsa::crc::copy_into_crc(&mut dst, src.as_ptr(), 0) };
/// assert_eq!(dst, src);
/// assert_eq!(crc, crc32fast::hash(&src));
/// ```
pub unsafe fn copy_into_crc(dst: &mut [u8], src: *const u8, crc: u32) -> u32 {
    let len = dst.len();
    // SAFETY: the caller's source range; `dst` is ours.
    let (crc, done) = unsafe { fold(dst.as_mut_ptr(), src, len, crc) };
    let tail = &mut dst[done..];
    // SAFETY: the rest of the caller's source range.
    unsafe { std::ptr::copy_nonoverlapping(src.add(done), tail.as_mut_ptr(), tail.len()) };
    continued(crc, tail)
}

/// Copies `src` (burst's buffer: a received payload) to `dst` and returns
/// the CRC-32 of those bytes continued from `crc`.
///
/// # Safety
/// `dst` must be valid for writes of `src.len()` bytes and not overlap `src`.
pub unsafe fn copy_from_crc(dst: *mut u8, src: &[u8], crc: u32) -> u32 {
    // SAFETY: the caller's destination range; `src` is ours.
    let (crc, done) = unsafe { fold(dst, src.as_ptr(), src.len(), crc) };
    let tail = &src[done..];
    // SAFETY: the rest of the caller's destination range.
    unsafe { std::ptr::copy_nonoverlapping(tail.as_ptr(), dst.add(done), tail.len()) };
    continued(crc, tail)
}

/// Copies and checksums a prefix of the `len` bytes (all but fewer than 16,
/// or none where there is no PCLMULQDQ); returns the CRC so far and how
/// many bytes it covers.
///
/// # Safety
/// `src` valid for reads and `dst` for writes of `len` bytes, apart.
unsafe fn fold(dst: *mut u8, src: *const u8, len: usize, crc: u32) -> (u32, usize) {
    #[cfg(target_arch = "x86_64")]
    if len >= 64
        && std::arch::is_x86_feature_detected!("pclmulqdq")
        && std::arch::is_x86_feature_detected!("sse4.1")
    {
        if len >= 256
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("vpclmulqdq")
        {
            // SAFETY: the features are present; forwarded contract.
            return unsafe { simd::fold512(dst, src, len, crc) };
        }
        // SAFETY: the features are present; forwarded contract.
        return unsafe { simd::fold(dst, src, len, crc) };
    }
    let _ = (dst, src, len);
    (crc, 0)
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    // x^(4*128+32) mod P and x^(4*128-32) mod P: fold four lanes by 64 bytes.
    const K1: i64 = 0x1_5444_2bd4;
    const K2: i64 = 0x1_c6e4_1596;
    // x^(128+32) mod P and x^(128-32) mod P: fold one lane by 16 bytes.
    const K3: i64 = 0x1_7519_97d0;
    const K4: i64 = 0x0_ccaa_009e;
    // x^64 mod P: 64 bits to 32.
    const K5: i64 = 0x1_63cd_6124;
    // x^(2048+32) mod P and x^(2048-32) mod P: fold sixteen lanes by 256
    // bytes (AVX-512).
    const K2048_LOW: i64 = 0x1_1542_778a;
    const K2048_HIGH: i64 = 0x1_322d_1430;
    // The polynomial (bit-reflected, with x^32) and floor(x^64 / P), for
    // the Barrett reduction.
    const P_X: i64 = 0x1_db71_0641;
    const U_PRIME: i64 = 0x1_f701_1641;

    /// `a` folded forward by `keys`, plus `b`.
    #[inline]
    #[target_feature(enable = "pclmulqdq,sse2")]
    fn fold_in(a: __m128i, b: __m128i, keys: __m128i) -> __m128i {
        _mm_xor_si128(
            _mm_xor_si128(
                _mm_clmulepi64_si128(a, keys, 0x00),
                _mm_clmulepi64_si128(a, keys, 0x11),
            ),
            b,
        )
    }

    /// 16 bytes at `p + off`.
    ///
    /// # Safety
    /// `p + off .. + 16` readable.
    #[inline]
    #[target_feature(enable = "sse2")]
    unsafe fn ld16(p: *const u8, off: usize) -> __m128i {
        // SAFETY: the caller's range.
        unsafe { _mm_loadu_si128(p.add(off).cast::<__m128i>()) }
    }

    /// Stores `v` at `p + off`.
    ///
    /// # Safety
    /// `p + off .. + 16` writable.
    #[inline]
    #[target_feature(enable = "sse2")]
    unsafe fn st16(p: *mut u8, off: usize, v: __m128i) {
        // SAFETY: the caller's range.
        unsafe { _mm_storeu_si128(p.add(off).cast::<__m128i>(), v) }
    }

    /// See [`super::fold`] (`len >= 64`).
    ///
    /// # Safety
    /// As [`super::fold`], with PCLMULQDQ and SSE4.1 present.
    #[target_feature(enable = "pclmulqdq,sse2,sse4.1")]
    pub(super) unsafe fn fold(dst: *mut u8, src: *const u8, len: usize, crc: u32) -> (u32, usize) {
        // Every 16-byte access below is at an `off` with `off + 16 <= len`.
        let (mut x0, mut x1, mut x2, mut x3) =
            // SAFETY: inside the caller's source range (see above).
            unsafe { (ld16(src, 0), ld16(src, 16), ld16(src, 32), ld16(src, 48)) };
        // SAFETY: as above.
        unsafe {
            st16(dst, 0, x0);
            st16(dst, 16, x1);
            st16(dst, 32, x2);
            st16(dst, 48, x3);
        }
        x0 = _mm_xor_si128(x0, _mm_cvtsi32_si128(!crc as i32));
        let k1k2 = _mm_set_epi64x(K2, K1);
        let mut off = 64;
        while off + 64 <= len {
            // SAFETY: as above.
            unsafe {
                let (a, b, c, d) = (
                    ld16(src, off),
                    ld16(src, off + 16),
                    ld16(src, off + 32),
                    ld16(src, off + 48),
                );
                st16(dst, off, a);
                st16(dst, off + 16, b);
                st16(dst, off + 32, c);
                st16(dst, off + 48, d);
                x0 = fold_in(x0, a, k1k2);
                x1 = fold_in(x1, b, k1k2);
                x2 = fold_in(x2, c, k1k2);
                x3 = fold_in(x3, d, k1k2);
            }
            off += 64;
        }
        let k3k4 = _mm_set_epi64x(K4, K3);
        let x = fold_in(fold_in(fold_in(x0, x1, k3k4), x2, k3k4), x3, k3k4);
        // SAFETY: the callers' ranges (forwarded).
        unsafe { finish(dst, src, len, x, off) }
    }

    /// Copies and folds the 16-byte blocks left from `off` into `x`, then
    /// reduces it: the CRC so far and the bytes it covers.
    ///
    /// # Safety
    /// As [`super::fold`].
    #[target_feature(enable = "pclmulqdq,sse2,sse4.1")]
    unsafe fn finish(
        dst: *mut u8,
        src: *const u8,
        len: usize,
        mut x: __m128i,
        mut off: usize,
    ) -> (u32, usize) {
        let k3k4 = _mm_set_epi64x(K4, K3);
        while off + 16 <= len {
            // SAFETY: `off + 16 <= len`: inside the callers' ranges.
            let a = unsafe { ld16(src, off) };
            // SAFETY: as above.
            unsafe { st16(dst, off, a) };
            x = fold_in(x, a, k3k4);
            off += 16;
        }
        (reduce(x), off)
    }

    /// The CRC of 128 folded bits: to 64, to 32, then Barrett.
    #[inline]
    #[target_feature(enable = "pclmulqdq,sse2,sse4.1")]
    fn reduce(mut x: __m128i) -> u32 {
        let k3k4 = _mm_set_epi64x(K4, K3);
        let mask32 = _mm_set_epi32(0, 0, 0, !0);
        x = _mm_xor_si128(_mm_clmulepi64_si128(x, k3k4, 0x10), _mm_srli_si128(x, 8));
        x = _mm_xor_si128(
            _mm_clmulepi64_si128(_mm_and_si128(x, mask32), _mm_set_epi64x(0, K5), 0x00),
            _mm_srli_si128(x, 4),
        );
        let pu = _mm_set_epi64x(U_PRIME, P_X);
        let t1 = _mm_clmulepi64_si128(_mm_and_si128(x, mask32), pu, 0x10);
        let t2 = _mm_clmulepi64_si128(_mm_and_si128(t1, mask32), pu, 0x00);
        !(_mm_extract_epi32(_mm_xor_si128(x, t2), 1) as u32)
    }

    /// `a * b mod P`, reflected: the carry-less product shifted into the
    /// 64-bit reflected form, then the Barrett reduction.
    ///
    /// # Safety
    /// PCLMULQDQ and SSE4.1 present.
    #[target_feature(enable = "pclmulqdq,sse2,sse4.1")]
    pub(super) unsafe fn mul_mod_p(a: u32, b: u32) -> u32 {
        let q = _mm_clmulepi64_si128(
            _mm_cvtsi32_si128(a as i32),
            _mm_cvtsi32_si128(b as i32),
            0x00,
        );
        let q = _mm_slli_epi64(q, 1);
        let mask32 = _mm_set_epi32(0, 0, 0, !0);
        let pu = _mm_set_epi64x(U_PRIME, P_X);
        let t1 = _mm_clmulepi64_si128(_mm_and_si128(q, mask32), pu, 0x10);
        let t2 = _mm_clmulepi64_si128(_mm_and_si128(t1, mask32), pu, 0x00);
        _mm_extract_epi32(_mm_xor_si128(q, t2), 1) as u32
    }

    /// [`fold`] with sixteen lanes in four 512-bit registers (`len >= 256`):
    /// the carry-less multiplications of 256 bytes in flight at once, where
    /// four lanes wait on each multiplication's latency.
    ///
    /// # Safety
    /// As [`super::fold`], with AVX-512F and VPCLMULQDQ present.
    #[target_feature(enable = "avx512f,vpclmulqdq,pclmulqdq,sse2,sse4.1")]
    pub(super) unsafe fn fold512(
        dst: *mut u8,
        src: *const u8,
        len: usize,
        crc: u32,
    ) -> (u32, usize) {
        // Every 64-byte access below is at an `off` with `off + 64 <= len`.
        let ld = |off: usize| {
            // SAFETY: inside the caller's source range (see above).
            unsafe { _mm512_loadu_si512(src.add(off).cast()) }
        };
        let st = |off: usize, v: __m512i| {
            // SAFETY: inside the caller's destination range (see above).
            unsafe { _mm512_storeu_si512(dst.add(off).cast(), v) }
        };
        let (mut v0, mut v1, mut v2, mut v3) = (ld(0), ld(64), ld(128), ld(192));
        st(0, v0);
        st(64, v1);
        st(128, v2);
        st(192, v3);
        v0 = _mm512_xor_si512(v0, _mm512_castsi128_si512(_mm_cvtsi32_si128(!crc as i32)));
        let k = _mm512_set_epi64(
            K2048_HIGH, K2048_LOW, K2048_HIGH, K2048_LOW, K2048_HIGH, K2048_LOW, K2048_HIGH,
            K2048_LOW,
        );
        // a folded forward by 256 bytes, plus b (0x96: a ^ b ^ c).
        let fold = |a: __m512i, b: __m512i| {
            _mm512_ternarylogic_epi64(
                _mm512_clmulepi64_epi128(a, k, 0x00),
                _mm512_clmulepi64_epi128(a, k, 0x11),
                b,
                0x96,
            )
        };
        let mut off = 256;
        while off + 256 <= len {
            let (a, b, c, d) = (ld(off), ld(off + 64), ld(off + 128), ld(off + 192));
            st(off, a);
            st(off + 64, b);
            st(off + 128, c);
            st(off + 192, d);
            v0 = fold(v0, a);
            v1 = fold(v1, b);
            v2 = fold(v2, c);
            v3 = fold(v3, d);
            off += 256;
        }
        // The sixteen lanes in byte order, each folded into the next.
        let k3k4 = _mm_set_epi64x(K4, K3);
        let mut x = _mm512_castsi512_si128(v0);
        for (i, v) in [v0, v1, v2, v3].into_iter().enumerate() {
            if i > 0 {
                x = fold_in(x, _mm512_castsi512_si128(v), k3k4);
            }
            x = fold_in(x, _mm512_extracti32x4_epi32::<1>(v), k3k4);
            x = fold_in(x, _mm512_extracti32x4_epi32::<2>(v), k3k4);
            x = fold_in(x, _mm512_extracti32x4_epi32::<3>(v), k3k4);
        }
        // SAFETY: the callers' ranges (forwarded).
        unsafe { finish(dst, src, len, x, off) }
    }
}

/// The CRC-32 of `A || B` from the CRC of `A`, the CRC of `B` and the
/// length of `B` (zlib's `crc32_combine`): what lets the payload's CRC be
/// taken while it moves, before the headers it follows are final (an IPv4
/// identification is assigned per burst, after the payloads are in).
///
/// ```
/// use burst_dsa::crc::combine;
/// let (a, b) = (b"headers", b"and a payload");
/// let whole = [&a[..], &b[..]].concat();
/// assert_eq!(combine(crc32fast::hash(a), crc32fast::hash(b), b.len() as u64), crc32fast::hash(&whole));
/// ```
pub fn combine(crc_a: u32, crc_b: u32, len_b: u64) -> u32 {
    mul_mod_p(x8n_mod_p(len_b), crc_a) ^ crc_b
}

/// The IEEE polynomial, bit-reflected (bit 31 is x^0).
const POLY: u32 = 0xedb8_8320;

/// `a * b mod P` in the reflected representation (bit 31 is x^0): one
/// carry-less multiplication and the Barrett reduction of the folding
/// where PCLMULQDQ is present (checked against the bit loop by a test).
fn mul_mod_p(a: u32, b: u32) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("pclmulqdq")
        && std::arch::is_x86_feature_detected!("sse4.1")
    {
        // SAFETY: the features are present.
        return unsafe { simd::mul_mod_p(a, b) };
    }
    mul_mod_p_bits(a, b)
}

/// [`mul_mod_p`] a bit at a time (zlib's `multmodp`).
fn mul_mod_p_bits(mut a: u32, mut b: u32) -> u32 {
    let mut p = 0;
    while a != 0 {
        if a & (1 << 31) != 0 {
            p ^= b;
        }
        a <<= 1;
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
    }
    p
}

/// `x^(8 n) mod P`: the product of `x^(8 * 2^k)` over the bits of `n`
/// (one multiplication for a power-of-two payload such as an MTU's).
fn x8n_mod_p(n: u64) -> u32 {
    static POWERS: std::sync::OnceLock<[u32; 64]> = std::sync::OnceLock::new();
    let powers = POWERS.get_or_init(|| {
        // x^8, reflected; each next power the square of the last.
        let mut t = [0u32; 64];
        t[0] = 1 << (31 - 8);
        for k in 1..64 {
            t[k] = mul_mod_p_bits(t[k - 1], t[k - 1]);
        }
        t
    });
    let mut p = 1u32 << 31;
    let mut n = n;
    while n != 0 {
        p = mul_mod_p(powers[n.trailing_zeros() as usize], p);
        n &= n - 1;
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The carry-less multiplication modulo P agrees with the bit loop.
        #[test]
        fn multiplication_mod_p_agrees_with_the_bit_loop(a in any::<u32>(), b in any::<u32>()) {
            prop_assert_eq!(mul_mod_p(a, b), mul_mod_p_bits(a, b));
        }

        /// Any length, any alignment of either side: the bytes of a plain
        /// copy and the CRC of a separate pass, also continued from a
        /// prefix's state.
        #[test]
        fn fused_pass_equals_copy_then_crc(
            data in proptest::collection::vec(any::<u8>(), 0..20_000),
            src_off in 0usize..64,
            dst_off in 0usize..64,
            prefix in proptest::collection::vec(any::<u8>(), 0..80),
        ) {
            let mut src = vec![0u8; src_off + data.len()];
            src[src_off..].copy_from_slice(&data);
            let mut dst = vec![0u8; dst_off + data.len()];
            let pre = crc32fast::hash(&prefix);
            // SAFETY: `src[src_off..]` is live for data.len() bytes and is
            // another allocation than `dst`.
            let crc = unsafe { copy_into_crc(&mut dst[dst_off..], src[src_off..].as_ptr(), pre) };
            prop_assert_eq!(&dst[dst_off..], &data[..]);
            let whole: Vec<u8> = prefix.iter().chain(&data).copied().collect();
            prop_assert_eq!(crc, crc32fast::hash(&whole), "continued from the prefix");

            let mut back = vec![0u8; dst_off + data.len()];
            // SAFETY: `back[dst_off..]` is live for data.len() bytes and is
            // another allocation than `src`.
            let crc = unsafe { copy_from_crc(back[dst_off..].as_mut_ptr(), &src[src_off..], 0) };
            prop_assert_eq!(&back[dst_off..], &data[..]);
            prop_assert_eq!(crc, crc32fast::hash(&data));
            // Combined after the fact: the headers' CRC need not come first.
            prop_assert_eq!(combine(pre, crc, data.len() as u64), crc32fast::hash(&whole));
        }
    }
}
