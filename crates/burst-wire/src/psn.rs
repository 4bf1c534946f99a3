//! 24-bit identifiers of the IB transport: packet sequence numbers and queue
//! pair numbers.

use core::cmp::Ordering;
use core::fmt;

/// Mask of a 24-bit field.
pub const MASK_24: u32 = 0x00ff_ffff;

/// A packet sequence number: 24 bits that wrap around.
///
/// Comparison is *serial number arithmetic* (as in the IB spec's PSN window):
/// `a` is before `b` when `b - a (mod 2^24)` lies in `1..2^23`. That is not a
/// total order, so `Psn` deliberately implements no `Ord`; use
/// [`Psn::cmp_wrapping`] or [`Psn::is_before`].
///
/// ```
/// use burst_wire::Psn;
/// let last = Psn::new(0xff_ffff);
/// let next = last + 1;
/// assert_eq!(next, Psn::new(0));
/// assert!(last.is_before(next));
/// assert_eq!(last.distance_to(next), 1);
/// assert_eq!(next.distance_to(last), -1);
/// ```
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(try_from = "u32", into = "u32"))]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// Number of distinct PSNs.
    pub const MODULUS: u32 = 1 << 24;

    /// A PSN from the low 24 bits of `v` (higher bits are dropped, as on the wire).
    #[inline]
    pub const fn new(v: u32) -> Psn {
        Psn(v & MASK_24)
    }

    /// The 24-bit value.
    #[inline]
    pub const fn value(self) -> u32 {
        self.0
    }

    /// Signed distance from `self` to `other` in the circular space:
    /// positive when `other` is after `self`, in `-2^23..2^23`.
    #[inline]
    pub const fn distance_to(self, other: Psn) -> i32 {
        // Shift the 24-bit difference into the top of an i32 and back to
        // sign-extend it.
        ((other.0.wrapping_sub(self.0) << 8) as i32) >> 8
    }

    /// Circular comparison: `Less` when `self` is before `other`.
    #[inline]
    pub const fn cmp_wrapping(self, other: Psn) -> Ordering {
        let d = self.distance_to(other);
        if d > 0 {
            Ordering::Less
        } else if d < 0 {
            Ordering::Greater
        } else {
            Ordering::Equal
        }
    }

    /// True when `self` comes strictly before `other`.
    #[inline]
    pub const fn is_before(self, other: Psn) -> bool {
        self.distance_to(other) > 0
    }
}

impl core::ops::Add<u32> for Psn {
    type Output = Psn;
    #[inline]
    fn add(self, rhs: u32) -> Psn {
        Psn::new(self.0.wrapping_add(rhs))
    }
}

impl core::ops::AddAssign<u32> for Psn {
    #[inline]
    fn add_assign(&mut self, rhs: u32) {
        *self = *self + rhs;
    }
}

impl core::ops::Sub<u32> for Psn {
    type Output = Psn;
    #[inline]
    fn sub(self, rhs: u32) -> Psn {
        Psn::new(self.0.wrapping_sub(rhs))
    }
}

impl fmt::Debug for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Psn({:#08x})", self.0)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

/// A queue pair number (24 bits). QP1 is the general services QP that carries
/// CM MADs; `0xffffff` is the multicast QPN.
///
/// ```
/// use burst_wire::Qpn;
/// assert_eq!(Qpn::new(0x11).unwrap().value(), 0x11);
/// assert!(Qpn::new(1 << 24).is_none());
/// ```
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(try_from = "u32", into = "u32"))]
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Qpn(u32);

impl Qpn {
    /// The general services interface QP (CM MADs).
    pub const GSI: Qpn = Qpn(1);
    /// The multicast destination QPN.
    pub const MULTICAST: Qpn = Qpn(MASK_24);

    /// A QPN, or `None` when `v` does not fit in 24 bits.
    #[inline]
    pub const fn new(v: u32) -> Option<Qpn> {
        if v <= MASK_24 {
            Some(Qpn(v))
        } else {
            None
        }
    }

    /// A QPN from the low 24 bits of `v`, as read off the wire.
    #[inline]
    pub const fn from_wire(v: u32) -> Qpn {
        Qpn(v & MASK_24)
    }

    /// The 24-bit value.
    #[inline]
    pub const fn value(self) -> u32 {
        self.0
    }
}

impl fmt::Debug for Qpn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Qpn({:#08x})", self.0)
    }
}

impl fmt::Display for Qpn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

impl From<Qpn> for u32 {
    fn from(q: Qpn) -> u32 {
        q.0
    }
}

impl TryFrom<u32> for Qpn {
    type Error = &'static str;
    fn try_from(v: u32) -> Result<Qpn, &'static str> {
        Qpn::new(v).ok_or("QPN wider than 24 bits")
    }
}

impl From<Psn> for u32 {
    fn from(p: Psn) -> u32 {
        p.0
    }
}

impl TryFrom<u32> for Psn {
    type Error = &'static str;
    fn try_from(v: u32) -> Result<Psn, &'static str> {
        if v > MASK_24 {
            return Err("PSN wider than 24 bits");
        }
        Ok(Psn(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_at_2_pow_24() {
        assert_eq!(Psn::new(MASK_24) + 1, Psn::new(0));
        assert_eq!(Psn::new(0) - 1, Psn::new(MASK_24));
        assert_eq!(Psn::new(0x1ff_ffff).value(), MASK_24);
    }

    #[test]
    fn half_window_comparison() {
        let a = Psn::new(10);
        assert!(a.is_before(a + 1));
        assert!(a.is_before(a + (1 << 23) - 1));
        // exactly half the space away counts as "before" the other way round
        assert_eq!(a.distance_to(a + (1 << 23)), -(1 << 23));
        assert_eq!(a.cmp_wrapping(a), Ordering::Equal);
        assert_eq!((a + 5).cmp_wrapping(a), Ordering::Greater);
        assert_eq!(Psn::new(MASK_24 - 2).distance_to(Psn::new(3)), 6);
    }
}
