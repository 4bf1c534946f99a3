//! [`DsaEngine`]: copy jobs as DSA descriptors on a work queue.

use std::collections::VecDeque;

use super::{flag, opcode, status, CompletionRecord, Descriptor};
use crate::job::{AsyncCopy, Completion, CopyError, CopyJob, Counters, Segment};
use crate::{CopyEngine, CpuCopy};

/// A work queue's portal: where descriptors are written (MOVDIR64B or
/// ENQCMD on hardware; [`super::model::ModelPortal`] in tests).
pub trait Portal {
    /// Submits `desc`; false when the queue has no room (ENQCMD's retry, a
    /// dedicated queue's occupancy).
    ///
    /// # Safety
    /// Every address in `desc` (its completion record, a batch's array and
    /// the buffers) must stay valid until its completion record is written.
    unsafe fn submit(&self, desc: &Descriptor) -> bool;
}

/// A job on the device: its descriptors and records stay put (boxed) until
/// the device has written every record.
struct Pending {
    tag: u64,
    segments: Vec<Segment>,
    /// A batch's descriptor array (empty for a single descriptor).
    batch: Box<[Descriptor]>,
    /// One record per segment, then the batch's.
    records: Box<[CompletionRecord]>,
    /// Completed at submission (the CPU did it).
    done: Option<Completion>,
}

// SAFETY: the raw pointers in `segments` name memory the submitter vouched
// for (AsyncCopy::submit's contract); the boxes are owned.
unsafe impl Send for Pending {}

/// [`AsyncCopy`] on a DSA work queue: a job of one segment is one MEMMOVE
/// descriptor, a job of several a BATCH of them; each asks for a completion
/// record, polled in submission order. Jobs smaller than `min_offload`
/// bytes are copied on the CPU at once (offloading them costs more than the
/// copy); a page fault the device reports is finished on the CPU from
/// where the device stopped.
pub struct DsaEngine<P: Portal> {
    portal: P,
    pending: VecDeque<Pending>,
    max_in_flight: usize,
    min_offload: u64,
    counters: Counters,
}

impl<P: Portal> std::fmt::Debug for DsaEngine<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DsaEngine")
            .field("in_flight", &self.pending.len())
            .field("min_offload", &self.min_offload)
            .field("counters", &self.counters)
            .finish()
    }
}

impl<P: Portal> DsaEngine<P> {
    /// An engine on `portal` with at most `max_in_flight` jobs, offloading
    /// jobs of `min_offload` bytes and more.
    pub fn new(portal: P, max_in_flight: usize, min_offload: u64) -> DsaEngine<P> {
        DsaEngine {
            portal,
            pending: VecDeque::new(),
            max_in_flight: max_in_flight.max(1),
            min_offload,
            counters: Counters::default(),
        }
    }

    /// The portal (tests drive the model through it).
    pub fn portal(&self) -> &P {
        &self.portal
    }

    /// The completion of `p` if the device is done with it.
    fn finished(&mut self, i: usize) -> Option<Completion> {
        let p = &self.pending[i];
        if let Some(c) = p.done {
            return Some(c);
        }
        let n = p.segments.len();
        let bytes = p.segments.iter().map(|s| s.len as u64).sum();
        if n > 1 {
            match p.records[n].status()? {
                status::SUCCESS | status::BATCH_FAIL => {}
                // The batch itself was refused: none of its descriptors ran.
                code => {
                    return Some(Completion {
                        tag: p.tag,
                        bytes,
                        status: Err(CopyError::Device(code)),
                    })
                }
            }
        }
        let mut result = Ok(());
        let mut faults = 0;
        for (s, r) in p.segments.iter().zip(p.records.iter()) {
            match r.status()? {
                status::SUCCESS => {}
                status::PAGE_FAULT_NOBOF => {
                    // The device stopped at a page it could not reach: the
                    // CPU (which faults the page in) does the rest.
                    let done = (r.bytes_completed() as usize).min(s.len);
                    // SAFETY: the submit contract covers the whole segment.
                    unsafe { CpuCopy.copy(s.dst.add(done), s.src.add(done), s.len - done) };
                    faults += 1;
                }
                code => result = Err(CopyError::Device(code)),
            }
        }
        self.counters.faults += faults;
        self.counters.fallbacks += faults;
        Some(Completion {
            tag: p.tag,
            bytes,
            status: result,
        })
    }
}

impl<P: Portal> AsyncCopy for DsaEngine<P> {
    unsafe fn submit(&mut self, job: CopyJob) -> Result<(), CopyJob> {
        if self.pending.len() >= self.max_in_flight {
            self.counters.full += 1;
            return Err(job);
        }
        let bytes = job.bytes();
        // The device refuses zero-length transfers: they move nothing.
        let segments: Vec<Segment> = job.segments.iter().copied().filter(|s| s.len > 0).collect();
        if bytes < self.min_offload || segments.is_empty() {
            for s in &segments {
                // SAFETY: the submit contract.
                unsafe { CpuCopy.copy(s.dst, s.src, s.len) };
            }
            self.counters.fallbacks += u64::from(!segments.is_empty());
            self.pending.push_back(Pending {
                tag: job.tag,
                segments,
                batch: Box::new([]),
                records: Box::new([]),
                done: Some(Completion {
                    tag: job.tag,
                    bytes,
                    status: Ok(()),
                }),
            });
            return Ok(());
        }
        let n = segments.len();
        let records: Box<[CompletionRecord]> = (0..n + usize::from(n > 1))
            .map(|_| CompletionRecord::default())
            .collect();
        let flags = flag::CRAV | flag::RCR | flag::CC;
        let descs: Box<[Descriptor]> = segments
            .iter()
            .zip(records.iter())
            .map(|(s, r)| Descriptor {
                completion_addr: std::ptr::from_ref(r) as u64,
                src: s.src as u64,
                dst: s.dst as u64,
                size: s.len as u32,
                ..Descriptor::new(opcode::MEMMOVE, flags)
            })
            .collect();
        let (batch, head) = if n == 1 {
            (Box::new([]) as Box<[Descriptor]>, descs[0])
        } else {
            let head = Descriptor {
                completion_addr: std::ptr::from_ref(&records[n]) as u64,
                src: descs.as_ptr() as u64,
                size: n as u32,
                ..Descriptor::new(opcode::BATCH, flag::CRAV | flag::RCR)
            };
            (descs, head)
        };
        // SAFETY: the records and the batch array are boxed in the Pending
        // kept until every record is written (poll); the buffers are the
        // caller's (submit contract).
        if !unsafe { self.portal.submit(&head) } {
            self.counters.full += 1;
            return Err(job);
        }
        self.pending.push_back(Pending {
            tag: job.tag,
            segments,
            batch,
            records,
            done: None,
        });
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> usize {
        let mut n = 0;
        while !self.pending.is_empty() {
            let Some(c) = self.finished(0) else { break };
            let p = self.pending.pop_front().expect("not empty");
            // The records and array may go now: the device is done with them.
            drop((p.batch, p.records));
            self.counters.jobs += 1;
            self.counters.bytes += c.bytes;
            self.counters.errors += u64::from(c.status.is_err());
            out.push(c);
            n += 1;
        }
        n
    }

    fn in_flight(&self) -> usize {
        self.pending.len()
    }

    fn counters(&self) -> Counters {
        self.counters
    }
}
