//! Memory the engine shares with the application's front end, and the
//! rings in it.
//!
//! A [`Segment`] is a mapping: anonymous in embedded mode, a memfd in daemon
//! mode (the daemon creates it and passes the descriptor to the client with
//! `SCM_RIGHTS`, and both map the same pages). A [`ShmRing`] is a bounded
//! multi-producer, multi-consumer queue laid out in a segment (Vyukov's
//! sequence-numbered slots): the same code serves a QP's send ring, a CQ and
//! the doorbell queue in both modes.
//!
//! Entries cross the ring as bytes ([`Entry::encode`] / [`Entry::decode`]),
//! never as Rust values: in daemon mode the other side is another process
//! that may be buggy or hostile, and a byte pattern that is not a valid
//! `SendWr` must be refused, not transmuted. For the same reason a consumer
//! never trusts what the shared header says about the ring's size (it keeps
//! its own), and every retry loop is bounded: a peer that scribbles over the
//! indices can make its own rings look empty or full, nothing more.
//!
//! This module and `eventfd.rs` / `thread.rs` hold the `unsafe` of
//! burst-verbs.

use std::io;
use std::marker::PhantomData;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// A shared mapping (anonymous or memfd), unmapped on drop.
#[derive(Debug)]
pub struct Segment {
    ptr: *mut u8,
    len: usize,
    fd: Option<OwnedFd>,
}

// SAFETY: the mapping is plain memory; everything shared through it is
// accessed with atomics or byte copies ordered by them.
unsafe impl Send for Segment {}
// SAFETY: as above.
unsafe impl Sync for Segment {}

fn page_round(len: usize) -> usize {
    len.max(1).div_ceil(4096) * 4096
}

impl Segment {
    /// An anonymous shared mapping of at least `len` zeroed bytes
    /// (embedded mode).
    pub fn anonymous(len: usize) -> io::Result<Segment> {
        let len = page_round(len);
        Segment::map(None, len, true)
    }

    /// A memfd of at least `len` zeroed bytes, mapped (daemon mode: the
    /// descriptor goes to the client).
    pub fn memfd(name: &str, len: usize) -> io::Result<Segment> {
        let len = page_round(len);
        let fd = memfd_create(name)?;
        // SAFETY: ftruncate on a descriptor we own.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } < 0 {
            return Err(io::Error::last_os_error());
        }
        seal_size(fd.as_fd())?;
        Segment::map(Some(fd), len, true)
    }

    /// Maps a segment received from the other side: `len` bytes of `fd`,
    /// refused unless the file holds at least that many (a short file
    /// would fault on access).
    pub fn from_fd(fd: OwnedFd, len: usize) -> io::Result<Segment> {
        let len = page_round(len);
        if file_len(fd.as_fd())? < len as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "shared segment shorter than announced",
            ));
        }
        Segment::map(Some(fd), len, true)
    }

    /// [`Segment::from_fd`], closing the descriptor once mapped: the
    /// mapping keeps the memory, and a process with thousands of QPs from
    /// burstd does not hold a descriptor for each (RLIMIT_NOFILE).
    pub fn map_fd(fd: OwnedFd, len: usize) -> io::Result<Segment> {
        let mut s = Segment::from_fd(fd, len)?;
        s.fd = None;
        Ok(s)
    }

    /// Maps runs of pages of several memfds back to back: `(fd, offset in
    /// it, bytes)` each, page-aligned, inside its file (a registration
    /// whose pages live on the memfds of several earlier ones). One range
    /// of addresses, unmapped as one.
    pub fn from_pieces(pieces: Vec<(OwnedFd, u64, u64)>) -> io::Result<Segment> {
        let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_owned());
        let mut total = 0usize;
        for (fd, off, len) in &pieces {
            if !size_sealed(fd.as_fd()) {
                return Err(bad("a memfd not sealed against shrinking"));
            }
            if off % 4096 != 0 || len % 4096 != 0 || *len == 0 {
                return Err(bad("a piece that is not whole pages"));
            }
            if off
                .checked_add(*len)
                .is_none_or(|e| e > file_len(fd.as_fd()).unwrap_or(0))
            {
                return Err(bad("a piece beyond its memfd"));
            }
            total = total
                .checked_add(*len as usize)
                .filter(|t| *t <= isize::MAX as usize)
                .ok_or_else(|| bad("pieces too large"))?;
        }
        if total == 0 {
            return Err(bad("no pages"));
        }
        // SAFETY: reserves `total` bytes of address space, no access.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // From here the segment owns the reservation (unmapped on drop).
        let seg = Segment {
            ptr: base.cast(),
            len: total,
            fd: None,
        };
        let mut at = 0usize;
        for (fd, off, len) in &pieces {
            // SAFETY: maps the piece over our own reservation, inside it.
            let p = unsafe {
                libc::mmap(
                    seg.ptr.add(at).cast(),
                    *len as usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    fd.as_raw_fd(),
                    *off as libc::off_t,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            at += *len as usize;
        }
        Ok(seg)
    }

    fn map(fd: Option<OwnedFd>, len: usize, write: bool) -> io::Result<Segment> {
        let prot = libc::PROT_READ | if write { libc::PROT_WRITE } else { 0 };
        let (flags, raw) = match &fd {
            Some(f) => (libc::MAP_SHARED, f.as_raw_fd()),
            None => (libc::MAP_SHARED | libc::MAP_ANONYMOUS, -1),
        };
        // SAFETY: a fresh mapping chosen by the kernel; checked below.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, raw, 0) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Segment {
            ptr: p.cast(),
            len,
            fd,
        })
    }

    /// The first byte of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never empty (at least a page); for clippy's sake.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The memfd behind a daemon-mode segment.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(|f| f.as_fd())
    }

    /// The 32-bit word at byte `off` (aligned, inside the segment).
    pub fn word(&self, off: usize) -> &AtomicU32 {
        assert!(
            off % 4 == 0 && off + 4 <= self.len,
            "word outside the segment"
        );
        // SAFETY: in bounds and aligned (checked); the mapping lives as long
        // as `self`, and the word is only ever accessed atomically.
        unsafe { AtomicU32::from_ptr(self.ptr.add(off).cast()) }
    }

    /// The 64-bit word at byte `off` (aligned, inside the segment).
    pub(crate) fn word64(&self, off: usize) -> &AtomicU64 {
        assert!(
            off % 8 == 0 && off + 8 <= self.len,
            "word outside the segment"
        );
        // SAFETY: as in `word`.
        unsafe { AtomicU64::from_ptr(self.ptr.add(off).cast()) }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once; no reference into it
        // outlives the segment (rings hold an `Arc<Segment>`).
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// `memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING)`.
pub fn memfd_create(name: &str) -> io::Result<OwnedFd> {
    let c = std::ffi::CString::new(name.replace('\0', "_")).unwrap_or_default();
    // SAFETY: a NUL-terminated name and constant flags; checked below.
    let fd = unsafe { libc::memfd_create(c.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Seals a memfd's size (and its seals): whoever holds it can no longer
/// shrink it under another process's mapping, which would make that
/// process's next access a SIGBUS.
pub fn seal_size(fd: BorrowedFd<'_>) -> io::Result<()> {
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: fcntl on a valid descriptor with integer arguments.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether `fd` is a memfd that cannot shrink (safe to map from another
/// process's hands).
pub fn size_sealed(fd: BorrowedFd<'_>) -> bool {
    // SAFETY: fcntl on a valid descriptor.
    let s = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    s >= 0 && s & libc::F_SEAL_SHRINK != 0
}

/// The size of the file behind `fd`.
pub fn file_len(fd: BorrowedFd<'_>) -> io::Result<u64> {
    // SAFETY: fstat into a zeroed stat we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a live stat buffer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.st_size as u64)
}

/// A pointer-free encoding of a ring entry. A ring's slots hold
/// [`Entry::SIZE`] bytes unless it was laid out for smaller entries
/// ([`ShmRing::create_sized`]: a QP's rings are sized by its capabilities,
/// as an RNIC sizes its WQEs).
pub trait Entry: Sized {
    /// The largest encoding in bytes (at most [`MAX_ENTRY`]).
    const SIZE: usize;
    /// Bytes this entry's encoding needs (at most [`Entry::SIZE`]).
    fn encoded_len(&self) -> usize {
        Self::SIZE
    }
    /// Writes the entry into `out` (at least [`Entry::encoded_len`] bytes).
    fn encode(&self, out: &mut [u8]);
    /// Reads an entry back from a slot's bytes (its ring's entry size);
    /// `None` for bytes no `encode` writes or that do not fit the slot.
    fn decode(b: &[u8]) -> Option<Self>;
}

/// The largest [`Entry::SIZE`].
pub const MAX_ENTRY: usize = 512;

/// Runs `f` on `len` zeroed bytes of the stack (`len` at most
/// [`MAX_ENTRY`], as every ring's entry size is: checked at attach): a
/// completion's 40 bytes are not paid for with a 512-byte clear on every
/// push and pop (callgrind, docs/performance.md: ~450 instructions per
/// polled round trip of ~31,000).
fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    if len <= 64 {
        f(&mut [0u8; 64][..len])
    } else if len <= 128 {
        f(&mut [0u8; 128][..len])
    } else {
        f(&mut [0u8; MAX_ENTRY][..len])
    }
}

/// Bytes before the slots: head and tail on cache lines of their own.
const HEADER: usize = 128;

/// A bounded MPMC ring of `T` in a [`Segment`] (Vyukov's algorithm: each
/// slot carries a sequence number that says whose turn it is).
///
/// A slot's word holds its sequence number minus the slot's index, so the
/// zeroed memory of a fresh segment is an empty ring: laying one out
/// writes nothing to its slots, and an idle QP's rings cost no resident
/// memory until work passes through them.
pub struct ShmRing<T> {
    seg: Arc<Segment>,
    off: usize,
    mask: u64,
    /// Bytes of an entry in this ring (at most `T::SIZE`).
    entry: usize,
    stride: usize,
    /// Entries dropped because they did not decode (a peer's bad input).
    undecodable: AtomicU64,
    _t: PhantomData<fn(T) -> T>,
}

impl<T> std::fmt::Debug for ShmRing<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ShmRing({} slots at {})", self.mask + 1, self.off)
    }
}

/// A producer or consumer gives up after this many lost races: only a peer
/// rewriting the indices makes them last.
const MAX_RACES: usize = 1 << 16;

impl<T: Entry> ShmRing<T> {
    /// Slots for a ring asked to hold `depth` entries (a power of two, at
    /// least 2: with one slot the sequence numbers cannot tell a full slot
    /// from a free one, and the ring would take nothing out).
    pub fn slots_for(depth: usize) -> usize {
        depth.max(2).next_power_of_two()
    }

    /// Bytes a ring of `slots` slots of [`Entry::SIZE`] takes in a segment.
    pub fn bytes(slots: usize) -> usize {
        Self::bytes_sized(slots, T::SIZE)
    }

    /// Bytes a ring of `slots` slots of `entry` bytes takes in a segment.
    pub fn bytes_sized(slots: usize, entry: usize) -> usize {
        HEADER + slots * Self::stride(entry)
    }

    fn stride(entry: usize) -> usize {
        8 + entry.div_ceil(8) * 8
    }

    /// Lays a new, empty ring of `slots` (a power of two) out at `off`.
    /// The ring's bytes must be zero, as a fresh segment's are.
    pub fn create(seg: Arc<Segment>, off: usize, slots: usize) -> io::Result<ShmRing<T>> {
        Self::create_sized(seg, off, slots, T::SIZE)
    }

    /// As [`ShmRing::create`], for entries of at most `entry` bytes.
    pub fn create_sized(
        seg: Arc<Segment>,
        off: usize,
        slots: usize,
        entry: usize,
    ) -> io::Result<ShmRing<T>> {
        let r = ShmRing::attach_sized(seg, off, slots, entry)?;
        // Zero words are an empty ring (see the type's note): nothing to
        // write per slot, and no page of the slots touched.
        r.head().store(0, Ordering::Relaxed);
        r.tail().store(0, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        Ok(r)
    }

    /// The ring the other side laid out at `off` (its size as agreed on
    /// the control socket, never as read from the segment).
    pub fn attach(seg: Arc<Segment>, off: usize, slots: usize) -> io::Result<ShmRing<T>> {
        Self::attach_sized(seg, off, slots, T::SIZE)
    }

    /// As [`ShmRing::attach`], for entries of at most `entry` bytes.
    pub fn attach_sized(
        seg: Arc<Segment>,
        off: usize,
        slots: usize,
        entry: usize,
    ) -> io::Result<ShmRing<T>> {
        assert!(T::SIZE <= MAX_ENTRY, "ring entry too large");
        if !slots.is_power_of_two()
            || slots < 2
            || entry > T::SIZE
            || off % 64 != 0
            || off
                .checked_add(Self::bytes_sized(slots, entry))
                .is_none_or(|e| e > seg.len())
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "ring of fewer than 2 slots, entries too large, or not fitting its segment",
            ));
        }
        Ok(ShmRing {
            seg,
            off,
            mask: slots as u64 - 1,
            entry,
            stride: Self::stride(entry),
            undecodable: AtomicU64::new(0),
            _t: PhantomData,
        })
    }

    /// Slots in the ring.
    pub fn capacity(&self) -> usize {
        self.mask as usize + 1
    }

    /// The segment the ring lives in.
    pub fn segment(&self) -> &Arc<Segment> {
        &self.seg
    }

    fn head(&self) -> &AtomicU64 {
        self.seg.word64(self.off)
    }

    fn tail(&self) -> &AtomicU64 {
        self.seg.word64(self.off + 64)
    }

    fn slot_off(&self, pos: u64) -> usize {
        self.off + HEADER + (pos & self.mask) as usize * self.stride
    }

    /// The sequence number of `pos`'s slot (stored less the slot's index).
    fn seq(&self, pos: u64) -> u64 {
        let w = self.seg.word64(self.slot_off(pos));
        w.load(Ordering::Acquire).wrapping_add(pos & self.mask)
    }

    fn set_seq(&self, pos: u64, seq: u64) {
        let w = self.seg.word64(self.slot_off(pos));
        w.store(seq.wrapping_sub(pos & self.mask), Ordering::Release);
    }

    /// Adds an entry; gives it back when the ring is full (or when the
    /// entry does not fit its slots: the caller checked it against the
    /// capabilities the ring was sized by, so that is a caller's bug).
    pub fn push(&self, v: T) -> Result<(), T> {
        if v.encoded_len() > self.entry {
            debug_assert!(false, "ring entry larger than its slots");
            return Err(v);
        }
        let tail = self.tail();
        let mut pos = tail.load(Ordering::Relaxed);
        for _ in 0..MAX_RACES {
            let seq = self.seq(pos);
            let diff = seq.wrapping_sub(pos) as i64;
            if diff == 0 {
                match tail.compare_exchange_weak(
                    pos,
                    pos.wrapping_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        let at = self.slot_off(pos) + 8;
                        with_scratch(self.entry, |buf| {
                            v.encode(buf);
                            // SAFETY: `at..at+entry` lies inside the slot (the
                            // ring fits its segment: checked at attach); this
                            // producer owns the slot until it publishes `seq`.
                            unsafe {
                                std::ptr::copy_nonoverlapping(
                                    buf.as_ptr(),
                                    self.seg.ptr.add(at),
                                    buf.len(),
                                )
                            };
                        });
                        self.set_seq(pos, pos.wrapping_add(1));
                        return Ok(());
                    }
                    Err(now) => pos = now,
                }
            } else if diff < 0 {
                return Err(v);
            } else {
                pos = tail.load(Ordering::Relaxed);
            }
        }
        Err(v)
    }

    /// Takes the oldest entry. An entry that does not decode (written by a
    /// misbehaving peer) is consumed and reported as `Some(None)`.
    pub fn pop_raw(&self) -> Option<Option<T>> {
        self.pop_slot().map(|(_, v)| v)
    }

    /// The position the next entry pushed will take: every entry pushed
    /// before now has a smaller one ([`ShmRing::pop_positioned`]).
    pub fn next_position(&self) -> u64 {
        self.tail().load(Ordering::Acquire)
    }

    /// [`ShmRing::pop`], with the position the entry had.
    pub fn pop_positioned(&self) -> Option<(u64, T)> {
        for _ in 0..=self.mask {
            match self.pop_slot()? {
                (pos, Some(v)) => return Some((pos, v)),
                (_, None) => {
                    let n = self.undecodable.fetch_add(1, Ordering::Relaxed) + 1;
                    if n.is_power_of_two() {
                        tracing::warn!(
                            dropped = n,
                            "shared ring: entries that do not decode were dropped"
                        );
                    }
                }
            }
        }
        None
    }

    fn pop_slot(&self) -> Option<(u64, Option<T>)> {
        let head = self.head();
        let mut pos = head.load(Ordering::Relaxed);
        for _ in 0..MAX_RACES {
            let seq = self.seq(pos);
            let diff = seq.wrapping_sub(pos.wrapping_add(1)) as i64;
            if diff == 0 {
                match head.compare_exchange_weak(
                    pos,
                    pos.wrapping_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        let at = self.slot_off(pos) + 8;
                        let v = with_scratch(self.entry, |buf| {
                            // SAFETY: in bounds as in `push`; this consumer
                            // owns the slot until it hands it back through
                            // `seq`. A hostile peer may write it concurrently:
                            // we copy bytes and validate them, never trust them.
                            unsafe {
                                std::ptr::copy_nonoverlapping(
                                    self.seg.ptr.add(at),
                                    buf.as_mut_ptr(),
                                    buf.len(),
                                )
                            };
                            T::decode(buf)
                        });
                        self.set_seq(pos, pos.wrapping_add(self.mask + 1));
                        return Some((pos, v));
                    }
                    Err(now) => pos = now,
                }
            } else if diff < 0 {
                return None;
            } else {
                pos = head.load(Ordering::Relaxed);
            }
        }
        None
    }

    /// Takes the oldest entry that decodes, looking at no more than a
    /// ring's worth (a peer that keeps writing bad entries cannot hold the
    /// consumer). Dropped entries are counted ([`ShmRing::undecodable`])
    /// and logged at the 1st, 2nd, 4th, 8th... so that a flood of them
    /// costs a log line per doubling, not one each.
    pub fn pop(&self) -> Option<T> {
        self.pop_positioned().map(|(_, v)| v)
    }

    /// Entries [`ShmRing::pop`] dropped because they did not decode.
    pub fn undecodable(&self) -> u64 {
        self.undecodable.load(Ordering::Relaxed)
    }

    /// Entries in the ring now (a snapshot).
    pub fn len(&self) -> usize {
        let t = self.tail().load(Ordering::Acquire);
        let h = self.head().load(Ordering::Acquire);
        (t.wrapping_sub(h) as usize).min(self.capacity())
    }

    /// True when [`ShmRing::len`] is 0.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Little-endian field access for [`Entry`] encodings.
pub(crate) mod le {
    pub fn put_u64(b: &mut [u8], at: usize, v: u64) {
        b[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }
    pub fn put_u32(b: &mut [u8], at: usize, v: u32) {
        b[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }
    pub fn put_u16(b: &mut [u8], at: usize, v: u16) {
        b[at..at + 2].copy_from_slice(&v.to_le_bytes());
    }
    pub fn u64(b: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default())
    }
    pub fn u32(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or_default())
    }
    pub fn u16(b: &[u8], at: usize) -> u16 {
        u16::from_le_bytes(b[at..at + 2].try_into().unwrap_or_default())
    }
}

impl Entry for u32 {
    const SIZE: usize = 4;
    fn encode(&self, out: &mut [u8]) {
        le::put_u32(out, 0, *self);
    }
    fn decode(b: &[u8]) -> Option<u32> {
        Some(le::u32(b, 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_keeps_order_and_bounds() {
        let seg = Arc::new(Segment::anonymous(ShmRing::<u32>::bytes(8)).unwrap());
        let r = ShmRing::<u32>::create(seg, 0, 8).unwrap();
        for i in 0..8 {
            r.push(i).unwrap();
        }
        assert_eq!(r.push(99), Err(99), "full at 8");
        assert_eq!(r.len(), 8);
        for i in 0..8 {
            assert_eq!(r.pop(), Some(i));
        }
        assert_eq!(r.pop(), None);
        // wraps
        for round in 0..100u32 {
            r.push(round).unwrap();
            assert_eq!(r.pop(), Some(round));
        }
    }

    /// A queue of depth 1 (`ibv_create_cq(ctx, 1, ...)`, `max_send_wr` 1)
    /// gets a ring that works: one slot cannot (a full slot reads as free).
    #[test]
    fn a_ring_for_one_entry_has_two_slots_and_works() {
        assert_eq!(ShmRing::<u32>::slots_for(1), 2);
        assert_eq!(ShmRing::<u32>::slots_for(0), 2);
        let seg = Arc::new(Segment::anonymous(ShmRing::<u32>::bytes(2)).unwrap());
        assert!(ShmRing::<u32>::create(Arc::clone(&seg), 0, 1).is_err());
        let r = ShmRing::<u32>::create(seg, 0, ShmRing::<u32>::slots_for(1)).unwrap();
        for round in 0..10u32 {
            r.push(round).unwrap();
            assert_eq!(r.pop(), Some(round));
            assert_eq!(r.pop(), None);
        }
    }

    #[test]
    fn two_mappings_of_one_memfd_share_a_ring() {
        let slots = 64;
        let a = Arc::new(Segment::memfd("test", ShmRing::<u32>::bytes(slots)).unwrap());
        let fd = a.fd().unwrap().try_clone_to_owned().unwrap();
        let b = Arc::new(Segment::from_fd(fd, a.len()).unwrap());
        let prod = ShmRing::<u32>::create(a, 0, slots).unwrap();
        let cons = ShmRing::<u32>::attach(b, 0, slots).unwrap();
        let t = std::thread::spawn(move || {
            for i in 0..10_000u32 {
                while prod.push(i).is_err() {
                    std::thread::yield_now();
                }
            }
        });
        let mut next = 0;
        while next < 10_000 {
            if let Some(v) = cons.pop() {
                assert_eq!(v, next);
                next += 1;
            }
        }
        t.join().unwrap();
    }

    #[test]
    fn producers_in_other_processes_and_consumer_threads_lose_and_repeat_nothing() {
        const PER: u32 = 20_000;
        let slots = 64;
        let seg = Arc::new(Segment::memfd("stress", ShmRing::<u32>::bytes(slots)).unwrap());
        let ring = Arc::new(ShmRing::<u32>::create(Arc::clone(&seg), 0, slots).unwrap());
        let mut kids = Vec::new();
        for p in 0..2u32 {
            // SAFETY: fork; the child only pushes into the shared ring
            // (atomics and byte copies on the mapping) and exits.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                // Bounded: a child whose consumers gave up (the parent
                // failed or was killed) must not spin on a full ring.
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
                for i in 0..PER {
                    while ring.push(p << 24 | i).is_err() {
                        if std::time::Instant::now() > deadline {
                            // SAFETY: as below.
                            unsafe { libc::_exit(1) };
                        }
                        std::hint::spin_loop();
                    }
                }
                // SAFETY: leave the child without running the parent's
                // destructors or test harness.
                unsafe { libc::_exit(0) };
            }
            kids.push(pid);
        }
        let seen = Arc::new(std::sync::Mutex::new(vec![0u8; 2 * PER as usize]));
        let consumers: Vec<_> = (0..2)
            .map(|_| {
                let (ring, seen) = (Arc::clone(&ring), Arc::clone(&seen));
                std::thread::spawn(move || {
                    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
                    loop {
                        if let Some(v) = ring.pop() {
                            let i = (v >> 24) * PER + (v & 0xff_ffff);
                            seen.lock().unwrap()[i as usize] += 1;
                        } else if seen.lock().unwrap().iter().all(|n| *n > 0)
                            || std::time::Instant::now() > deadline
                        {
                            return;
                        }
                    }
                })
            })
            .collect();
        for c in consumers {
            c.join().unwrap();
        }
        for pid in kids {
            let mut st = 0;
            // SAFETY: our own children.
            unsafe { libc::waitpid(pid, &mut st, 0) };
        }
        let seen = seen.lock().unwrap();
        assert!(seen.iter().all(|n| *n == 1), "every value exactly once");
    }

    #[test]
    fn scribbled_indices_never_hang_or_overflow() {
        let seg = Arc::new(Segment::anonymous(ShmRing::<u32>::bytes(4)).unwrap());
        let r = ShmRing::<u32>::create(Arc::clone(&seg), 0, 4).unwrap();
        r.push(1).unwrap();
        // A hostile peer writes garbage over the header and the slots.
        for off in (0..ShmRing::<u32>::bytes(4)).step_by(4) {
            seg.word(off)
                .store(0xdead_beef ^ off as u32, Ordering::Relaxed);
        }
        for _ in 0..10 {
            let _ = r.pop();
            let _ = r.push(7);
        }
        assert!(r.len() <= 4);
    }

    #[test]
    fn shared_segments_cannot_shrink_under_a_mapping() {
        let m = Segment::memfd("sealed", 8192).unwrap();
        let fd = m.fd().unwrap();
        assert!(size_sealed(fd));
        // SAFETY: ftruncate on our descriptor; it must be refused.
        assert!(unsafe { libc::ftruncate(fd.as_raw_fd(), 0) } < 0);
        m.word(8188).store(1, Ordering::Relaxed);
        // An unsealed memfd is refused as a piece of client memory.
        let plain = memfd_create("plain").unwrap();
        // SAFETY: ftruncate on our fresh memfd.
        assert_eq!(unsafe { libc::ftruncate(plain.as_raw_fd(), 4096) }, 0);
        assert!(Segment::from_pieces(vec![(plain, 0, 4096)]).is_err());
    }

    #[test]
    fn short_segments_are_refused() {
        let seg = Arc::new(Segment::anonymous(4096).unwrap());
        assert!(ShmRing::<u32>::attach(Arc::clone(&seg), 0, 1024).is_err());
        assert!(ShmRing::<u32>::attach(seg, 3, 4).is_err());
        let m = Segment::memfd("short", 4096).unwrap();
        let fd = m.fd().unwrap().try_clone_to_owned().unwrap();
        assert!(Segment::from_fd(fd, 8192).is_err());
    }
}
