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

impl CopierCounters {
    /// Adds `o` (another engine thread's).
    pub fn add(&mut self, o: &CopierCounters) {
        self.offloaded += o.offloaded;
        self.offloaded_bytes += o.offloaded_bytes;
        self.cpu_bytes += o.cpu_bytes;
        self.fused_bytes += o.fused_bytes;
        self.redone += o.redone;
        self.drains += o.drains;
        self.overlaps += o.overlaps;
        self.backend_fallbacks += o.backend_fallbacks;
        self.backend_faults += o.backend_faults;
        self.backend_errors += o.backend_errors;
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
        if let Some(p) = src {
            // A read of bytes a pending copy writes waits for it.
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
