//! How payload moves between packets and registered memory: the one path
//! every placement and gather of the data plane takes ([`crate::MrTable::memory_through`]).
//!
//! - **CPU, fused** (the default): a gather copies the payload into the
//!   packet and computes its CRC-32 in the same pass
//!   ([`burst_dsa::crc::copy_into_crc`]), so sealing the packet reads only
//!   its headers.
//! - **CPU, plain**: `memcpy`, the ICRC read separately (the path before
//!   the fused one; kept to measure against and as the simplest).
//! - **Offload**: an [`AsyncCopy`] backend (a DSA work queue, its model,
//!   DPDK dmadev) takes the copies whose far side the caller declared
//!   stable ([`Copier::defer_from`], [`Copier::defer_into`]): received
//!   payload placed into memory, gathered payload into send buffers. The
//!   caller drains ([`Copier::drain`]) before anything those copies precede
//!   becomes visible (a work completion, an ACK, a packet's ICRC), which is
//!   the architecture's ordering rule. Everything else (bytes on the stack,
//!   another process's memory) is copied at once.
//!
//! Order between copies: a copy whose destination overlaps a pending one's
//! waits for it (drain), and an atomic drains first ([`Copier::fence`]), so
//! the memory ends as if every copy had run at once, in order.

use std::collections::VecDeque;
use std::sync::Arc;

use burst_dsa::{AsyncCopy, Completion, CopyEngine, CopyJob, CpuCopy, Segment};

use crate::Region;

/// Where gathers compute the payload CRC: see the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuMode {
    /// Copy and CRC in one pass.
    Fused,
    /// `memcpy`; the CRC is left to the packet's seal.
    Plain,
}

burst_wire::counters! {
    /// What a [`Copier`] did.
    #[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct CopierCounters {
        /// Copies handed to the offload backend (jobs).
        pub offloaded: u64,
        /// Bytes of those jobs.
        pub offloaded_bytes: u64,
        /// Bytes copied by the CPU at once.
        pub cpu_bytes: u64,
        /// Bytes gathered with their CRC computed in the same pass.
        pub fused_bytes: u64,
        /// Received payload bytes placed with their ICRC's CRC computed in
        /// the same pass ([`crate::TableMemory::place_received_crc`]).
        #[cfg_attr(feature = "serde", serde(default))]
        pub placed_fused_bytes: u64,
        /// Jobs the backend failed that the CPU copied again.
        pub redone: u64,
        /// Drains that had copies to wait for.
        pub drains: u64,
        /// Drains forced by a copy onto a pending copy's destination.
        pub overlaps: u64,
        /// The backend's jobs it finished on the CPU (too small to offload,
        /// or the rest after a page fault).
        pub backend_fallbacks: u64,
        /// Page faults the backend reported.
        pub backend_faults: u64,
        /// Jobs the backend failed.
        pub backend_errors: u64,
    }
}

struct Pending {
    tag: u64,
    segments: Vec<Segment>,
    /// Held until the job completes: a region cannot be deregistered (and
    /// its memory freed) under a copy in flight.
    _regions: Vec<Arc<Region>>,
}

/// The copy path of one engine thread (see the module documentation).
pub struct Copier {
    cpu: CpuMode,
    engine: Option<Box<dyn AsyncCopy + Send>>,
    sources: Vec<(usize, usize)>,
    destinations: Vec<(usize, usize)>,
    pending: VecDeque<Pending>,
    /// The span of every pending copy's destination (`lo..hi`; empty when
    /// none): most copies miss it, and skip the scan of the pending ones.
    span: (usize, usize),
    /// Placements (copies into memory the transport reads) are pending;
    /// otherwise only gathers into send buffers, which no read touches.
    placing: bool,
    next_tag: u64,
    done: Vec<Completion>,
    counters: CopierCounters,
}

// SAFETY: the raw pointers held (segments) name memory whose owners
// promised it stays valid until the copy is drained (`defer_from`,
// `defer_into`, the regions held); the Copier is used by one thread at a
// time.
unsafe impl Send for Copier {}

impl std::fmt::Debug for Copier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Copier")
            .field("cpu", &self.cpu)
            .field("offload", &self.engine.is_some())
            .field("pending", &self.pending.len())
            .field("counters", &self.counters)
            .finish()
    }
}

impl Default for Copier {
    fn default() -> Self {
        Copier::cpu(CpuMode::Fused)
    }
}

impl Copier {
    /// Copies on the CPU only.
    pub fn cpu(mode: CpuMode) -> Copier {
        Copier {
            cpu: mode,
            engine: None,
            sources: Vec::new(),
            destinations: Vec::new(),
            pending: VecDeque::new(),
            span: (0, 0),
            placing: false,
            next_tag: 0,
            done: Vec::new(),
            counters: CopierCounters::default(),
        }
    }

    /// Offloads deferrable copies to `engine` (the CPU copies the rest,
    /// plainly: the payload's CRC is read at sealing).
    pub fn offload(engine: Box<dyn AsyncCopy + Send>) -> Copier {
        let mut c = Copier::cpu(CpuMode::Plain);
        c.engine = Some(engine);
        c
    }

    /// Whether an offload backend is in use.
    pub fn offloads(&self) -> bool {
        self.engine.is_some()
    }

    /// Declares `ranges` (address, length) stable sources: copies from
    /// inside them may complete later, until [`Copier::drain`].
    ///
    /// # Safety
    /// Each range must stay valid for reads, and unchanged, until the next
    /// [`Copier::drain`] returns.
    pub unsafe fn defer_from(&mut self, ranges: impl IntoIterator<Item = (*const u8, usize)>) {
        self.sources.clear();
        if self.engine.is_some() {
            self.sources
                .extend(ranges.into_iter().map(|(p, n)| (p as usize, n)));
        }
    }

    /// Declares `ranges` stable destinations (send buffers): copies into
    /// them may complete later, until [`Copier::drain`].
    ///
    /// # Safety
    /// Each range must stay valid for writes, and untouched by anyone
    /// else, until the next [`Copier::drain`] returns.
    pub unsafe fn defer_into(&mut self, ranges: impl IntoIterator<Item = (*mut u8, usize)>) {
        self.destinations.clear();
        if self.engine.is_some() {
            self.destinations
                .extend(ranges.into_iter().map(|(p, n)| (p as usize, n)));
        }
    }

    /// Copies not yet known to have finished.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Waits for every pending copy (a failed one is copied again by the
    /// CPU), then forgets the declared ranges.
    pub fn drain(&mut self) {
        self.wait_all();
        self.sources.clear();
        self.destinations.clear();
    }

    /// Waits for every pending copy, keeping the declared ranges: before
    /// an access that must see them (an atomic, a read of placed bytes).
    pub fn fence(&mut self) {
        self.wait_all();
    }

    /// What the copier counted, with its backend's faults and fallbacks.
    pub fn counters(&self) -> CopierCounters {
        let mut c = self.counters;
        if let Some(b) = self.engine.as_ref().map(|e| e.counters()) {
            c.backend_fallbacks = b.fallbacks;
            c.backend_faults = b.faults;
            c.backend_errors = b.errors;
        }
        c
    }

    fn wait_all(&mut self) {
        let Some(engine) = self.engine.as_mut() else {
            return;
        };
        if self.pending.is_empty() {
            return;
        }
        self.counters.drains += 1;
        engine.drain(&mut self.done);
        self.retire();
        self.span = (0, 0);
        self.placing = false;
    }

    /// Matches polled completions to pending jobs (both in submission
    /// order); a failed job is copied again by the CPU.
    fn retire(&mut self) {
        for c in self.done.drain(..) {
            let Some(p) = self.pending.pop_front() else {
                break;
            };
            debug_assert_eq!(p.tag, c.tag, "completions come in submission order");
            if let Err(e) = c.status {
                tracing::warn!("copy backend failed a job ({e}): copied again on the CPU");
                for s in &p.segments {
                    // SAFETY: the declared ranges and held regions keep both
                    // sides valid until the drain that is running now.
                    unsafe { CpuCopy.copy(s.dst, s.src, s.len) };
                }
                self.counters.redone += 1;
            }
        }
    }

    fn within(ranges: &[(usize, usize)], p: usize, len: usize) -> bool {
        ranges
            .iter()
            .any(|&(a, n)| p >= a && p.checked_add(len).is_some_and(|e| e <= a + n))
    }

    /// Drains first when `[dst, dst+len)` overlaps a pending copy's
    /// destination (the later copy must land last).
    fn order_after_pending(&mut self, dst: usize, len: usize) {
        let (lo, hi) = self.span;
        if len == 0 || dst >= hi || dst + len <= lo {
            return;
        }
        let hit = self.pending.iter().any(|p| {
            p.segments
                .iter()
                .any(|s| (s.dst as usize) < dst + len && dst < s.dst as usize + s.len)
        });
        if hit {
            self.counters.overlaps += 1;
            self.wait_all();
        }
    }

    /// Submits a job, polling while the backend is full.
    fn submit(&mut self, segments: Vec<Segment>, regions: Vec<Arc<Region>>) {
        if self.engine.is_none() {
            return;
        }
        let tag = self.next_tag;
        self.next_tag += 1;
        let bytes: u64 = segments.iter().map(|s| s.len as u64).sum();
        let mut job = CopyJob {
            tag,
            segments: segments.clone(),
        };
        while let Some(engine) = self.engine.as_mut() {
            // SAFETY: every segment lies in a declared stable range and a
            // held region (the callers check), valid until the drain.
            match unsafe { engine.submit(job) } {
                Ok(()) => break,
                Err(back) => {
                    job = back;
                    if engine.poll(&mut self.done) == 0 {
                        std::hint::spin_loop();
                    }
                    self.retire_polled();
                }
            }
        }
        for seg in &segments {
            let (a, b) = (seg.dst as usize, seg.dst as usize + seg.len);
            self.span = if self.span.0 == self.span.1 {
                (a, b)
            } else {
                (self.span.0.min(a), self.span.1.max(b))
            };
        }
        self.counters.offloaded += 1;
        self.counters.offloaded_bytes += bytes;
        self.pending.push_back(Pending {
            tag,
            segments,
            _regions: regions,
        });
    }

    /// [`Copier::retire`] without the borrow of the engine.
    fn retire_polled(&mut self) {
        if !self.done.is_empty() {
            self.retire();
        }
    }

    /// Places `data` at `off` of `region`: deferred when `data` lies in a
    /// declared source range and the region is this process's memory.
    pub(crate) fn place(&mut self, region: &Arc<Region>, off: u64, data: &[u8]) {
        self.place_all(&[(region, off, data)]);
    }

    /// Places several pieces (one work request's SGEs) as one job.
    pub(crate) fn place_all(&mut self, pieces: &[(&Arc<Region>, u64, &[u8])]) {
        let mut segments = Vec::new();
        let mut regions = Vec::new();
        for &(r, off, data) in pieces {
            let ptr = r.local_ptr(off, data.len());
            if let Some(dst) = ptr {
                self.order_after_pending(dst as usize, data.len());
            }
            match ptr {
                Some(dst)
                    if self.engine.is_some()
                        && Self::within(&self.sources, data.as_ptr() as usize, data.len()) =>
                {
                    segments.push(Segment {
                        dst,
                        src: data.as_ptr(),
                        len: data.len(),
                    });
                    regions.push(Arc::clone(r));
                }
                _ => {
                    r.write(&CpuCopy, off, data);
                    self.counters.cpu_bytes += data.len() as u64;
                }
            }
        }
        if !segments.is_empty() {
            self.submit(segments, regions);
            self.placing = true;
        }
    }

    /// Copies `out.len()` bytes at `off` of `region` into `out`, continuing
    /// `crc` (`Some`: the CRC-32 of what was gathered so far) when the copy
    /// computes it; sets `crc` to `None` when it does not.
    pub(crate) fn gather(
        &mut self,
        region: &Arc<Region>,
        off: u64,
        out: &mut [u8],
        crc: &mut Option<u32>,
    ) {
        let src = region.local_ptr(off, out.len());
        if let (Some(p), true) = (src, self.placing) {
            // A read of bytes a pending placement writes waits for it.
            self.order_after_pending(p as usize, out.len());
        }
        match src {
            Some(src)
                if self.engine.is_some()
                    && Self::within(&self.destinations, out.as_ptr() as usize, out.len()) =>
            {
                *crc = None;
                let seg = Segment {
                    dst: out.as_mut_ptr(),
                    src,
                    len: out.len(),
                };
                self.submit(vec![seg], vec![Arc::clone(region)]);
            }
            Some(src) if self.cpu == CpuMode::Fused && crc.is_some() => {
                // SAFETY: `src` is in bounds of a region held by the caller
                // (local_ptr checked it); `out` is burst's own buffer.
                let c = unsafe { burst_dsa::crc::copy_into_crc(out, src, crc.unwrap_or(0)) };
                *crc = Some(c);
                self.counters.fused_bytes += out.len() as u64;
            }
            _ => {
                *crc = None;
                region.read(&CpuCopy, off, out);
                self.counters.cpu_bytes += out.len() as u64;
            }
        }
    }

    /// Places `data` at `off` of `region` on the CPU and returns its
    /// CRC-32 continued from `crc`, in one pass (a received payload checked
    /// while placed); `None`, placing nothing, where that cannot be done
    /// (an offloading copier, plain copies, a region not in this process).
    pub(crate) fn place_crc(
        &mut self,
        region: &Arc<Region>,
        off: u64,
        data: &[u8],
        crc: u32,
    ) -> Option<u32> {
        if !self.fuses() {
            return None;
        }
        let dst = region.local_ptr(off, data.len())?;
        // SAFETY: `dst` is in bounds of a region the caller holds (local_ptr
        // checked it); `data` is a received frame, never application memory.
        let c = unsafe { burst_dsa::crc::copy_from_crc(dst, data, crc) };
        self.counters.placed_fused_bytes += data.len() as u64;
        Some(c)
    }

    /// Whether gathers compute the payload's CRC.
    pub(crate) fn fuses(&self) -> bool {
        self.engine.is_none() && self.cpu == CpuMode::Fused
    }
}

impl Drop for Copier {
    fn drop(&mut self) {
        // Never leave a device writing into memory about to be freed.
        self.wait_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Access, MrTable};
    use burst_dsa::dsa::model::DsaModel;
    use burst_dsa::dsa::DsaEngine;
    use burst_transport::Memory;

    /// An offload copier on the DSA model (its own thread), every job
    /// offloaded; the thread handle must outlive the copier.
    fn offload() -> (Copier, burst_dsa::dsa::model::ModelThread) {
        let model = DsaModel::new(64);
        let thread = model.start().unwrap();
        let engine = DsaEngine::new(model.portal(), 64, 0);
        (Copier::offload(Box::new(engine)), thread)
    }

    #[test]
    fn a_copy_onto_a_pending_one_lands_after_it() {
        let table = MrTable::new();
        let pd = table.alloc_pd();
        let mut mem = vec![0u8; 8192];
        // SAFETY: `mem` outlives the registration (the table drops first).
        let k = unsafe { table.register(pd, mem.as_mut_ptr(), mem.len(), 0x1000, Access(1 | 2)) }
            .unwrap();
        let (mut copier, _device) = offload();
        let stable = vec![0xaau8; 4096];
        // SAFETY: `stable` outlives the drain below and is not changed.
        unsafe { copier.defer_from([(stable.as_ptr(), stable.len())]) };
        let mut m = table.memory_through(&mut copier);
        m.write_remote(k.rkey, 0x1000, &stable).unwrap();
        // From the stack (not a stable source): at once, but after the
        // pending copy of the same bytes.
        m.write_remote(k.rkey, 0x1000 + 100, &[0x55; 8]).unwrap();
        // A copy elsewhere does not wait.
        m.write_remote(k.rkey, 0x1000 + 5000, &[0x66; 8]).unwrap();
        copier.drain();
        let c = copier.counters();
        assert_eq!((c.offloaded, c.overlaps, c.drains), (1, 1, 1), "{c:?}");
        drop(copier);
        drop(table);
        assert!(mem[..100].iter().all(|&b| b == 0xaa));
        assert_eq!(mem[100..108], [0x55; 8]);
        assert!(mem[108..4096].iter().all(|&b| b == 0xaa));
        assert_eq!(mem[5000..5008], [0x66; 8]);
    }

    #[test]
    fn an_atomic_sees_a_pending_placement() {
        let table = MrTable::new();
        let pd = table.alloc_pd();
        let mut word = vec![0u64; 1];
        // SAFETY: as above.
        let k =
            unsafe { table.register(pd, word.as_mut_ptr().cast(), 8, 0x2000, Access(1 | 2 | 8)) }
                .unwrap();
        let (mut copier, _device) = offload();
        let stable = 40u64.to_ne_bytes();
        let qp = burst_transport::QpScope {
            pd: pd.0,
            qpn: burst_wire::Qpn::from_wire(1),
        };
        // SAFETY: `stable` outlives the drain and is not changed.
        unsafe { copier.defer_from([(stable.as_ptr(), 8)]) };
        let mut m = table.memory_through(&mut copier);
        m.write_remote(k.rkey, 0x2000, &stable).unwrap();
        let old = m
            .atomic(
                qp,
                k.rkey,
                0x2000,
                burst_transport::AtomicOp::FetchAdd { add: 2 },
            )
            .unwrap();
        assert_eq!(old, 40, "the atomic ran before the placement landed");
        copier.drain();
        drop(copier);
        drop(table);
        assert_eq!(word[0], 42);
    }

    #[test]
    fn the_fused_gather_gives_the_crc_of_what_it_copied() {
        let table = MrTable::new();
        let pd = table.alloc_pd();
        let mut src: Vec<u8> = (0..9000u32).map(|i| (i * 13) as u8).collect();
        // SAFETY: as above.
        let k =
            unsafe { table.register(pd, src.as_mut_ptr(), src.len(), 0x10000, Access(1)) }.unwrap();
        let sges = [
            burst_transport::Sge {
                addr: 0x10000 + 10,
                length: 3000,
                lkey: k.lkey,
            },
            burst_transport::Sge {
                addr: 0x10000 + 5000,
                length: 3000,
                lkey: k.lkey,
            },
        ];
        let mut out = vec![0u8; 4000];
        let mut fused = Copier::cpu(CpuMode::Fused);
        let crc = table
            .memory_through(&mut fused)
            .read_local_crc(pd.0, &sges, 1000, &mut out)
            .unwrap();
        let want: Vec<u8> = src[1010..3010]
            .iter()
            .chain(&src[5000..7000])
            .copied()
            .collect();
        assert_eq!(out, want);
        assert_eq!(crc, Some(crc32fast::hash(&want)));
        let mut plain = Copier::cpu(CpuMode::Plain);
        let crc = table
            .memory_through(&mut plain)
            .read_local_crc(pd.0, &sges, 1000, &mut out)
            .unwrap();
        assert_eq!(crc, None);
        drop(table);
        drop(src);
    }
}
