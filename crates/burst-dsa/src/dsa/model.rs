//! A software DSA: consumes the 64-byte descriptors written to its portal
//! and writes the 32-byte completion records a device writes, so that the
//! engine's submission, batching, completion and fault paths run for real
//! where there is no hardware (these machines).
//!
//! What it does as the device does: MEMMOVE and BATCH (arrays of 2 up to
//! [`MAX_BATCH`] MEMMOVEs, the batch record counting the descriptors done
//! and saying BATCH_FAIL if one failed), NOOP; errors for an unknown
//! operation, a zero or oversized transfer, overlapping buffers, a bad batch
//! count; a queue of fixed size that refuses descriptors when full. Page
//! faults are injected ([`DsaModel::fault_next`]): the next MEMMOVE stops
//! after the given bytes with PAGE_FAULT_NOBOF, as a device without
//! Block-on-Fault does; [`DsaModel::fault_every`] makes every n-th MEMMOVE
//! fault halfway (a data plane's fault path under load). Descriptors run
//! when [`DsaModel::process`] is called (a test steps the device), or as
//! they arrive on the device's own thread ([`DsaModel::start`]), in queue
//! order.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};

use super::{opcode, status, CompletionRecord, Descriptor, Portal};

/// Most descriptors of one batch (the device's `max_batch_size` default).
pub const MAX_BATCH: u32 = 1024;

/// Largest transfer of one descriptor (the work queue's
/// `max_transfer_size` default, 2 MiB).
pub const MAX_TRANSFER: u32 = 2 << 20;

#[derive(Debug, Default)]
struct State {
    queue: VecDeque<Descriptor>,
    /// Bytes after which the next MEMMOVEs fault, in order.
    faults: VecDeque<u32>,
    /// Every n-th MEMMOVE faults halfway (0: never).
    fault_every: u64,
    memmoves: u64,
    processed: u64,
    /// The device thread ([`DsaModel::start`]) is to stop.
    stopped: bool,
}

/// The device: a work queue of `size` descriptors.
#[derive(Debug, Clone)]
pub struct DsaModel {
    state: Arc<Mutex<State>>,
    /// Signalled when a descriptor arrives (wakes the device thread).
    arrived: Arc<Condvar>,
    size: usize,
}

/// The model running on its own thread, as a device runs beside the CPU:
/// descriptors are processed as they are written to the portal. Dropping
/// it stops the thread (after the queue is empty).
#[derive(Debug)]
pub struct ModelThread {
    model: DsaModel,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ModelThread {
    /// The running device.
    pub fn model(&self) -> &DsaModel {
        &self.model
    }
}

impl Drop for ModelThread {
    fn drop(&mut self) {
        self.model.state().stopped = true;
        self.model.arrived.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The model's portal (what [`super::DsaEngine`] submits to).
#[derive(Debug, Clone)]
pub struct ModelPortal(DsaModel);

impl DsaModel {
    /// A device whose work queue holds `size` descriptors.
    pub fn new(size: usize) -> DsaModel {
        DsaModel {
            state: Arc::default(),
            arrived: Arc::default(),
            size: size.max(1),
        }
    }

    /// Runs the device on a thread of its own (named `dsa-model`): what the
    /// portal receives is processed without the submitter stepping it.
    pub fn start(&self) -> std::io::Result<ModelThread> {
        let model = self.clone();
        let thread = std::thread::Builder::new()
            .name("dsa-model".into())
            .spawn(move || loop {
                {
                    let mut st = model.state();
                    while st.queue.is_empty() && !st.stopped {
                        st = model.arrived.wait(st).unwrap_or_else(|e| e.into_inner());
                    }
                    if st.queue.is_empty() && st.stopped {
                        return;
                    }
                }
                model.process();
            })?;
        Ok(ModelThread {
            model: self.clone(),
            thread: Some(thread),
        })
    }

    /// Every `n`-th MEMMOVE from now on stops halfway with a page fault
    /// (0 turns it off).
    pub fn fault_every(&self, n: u64) {
        let mut st = self.state();
        st.fault_every = n;
        st.memmoves = 0;
    }

    /// Its portal.
    pub fn portal(&self) -> ModelPortal {
        ModelPortal(self.clone())
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next MEMMOVE faults after `bytes` bytes (a page it cannot reach).
    pub fn fault_next(&self, bytes: u32) {
        self.state().faults.push_back(bytes);
    }

    /// Descriptors waiting in the queue.
    pub fn queued(&self) -> usize {
        self.state().queue.len()
    }

    /// Descriptors run so far (a batch counts once, its entries too).
    pub fn processed(&self) -> u64 {
        self.state().processed
    }

    /// Runs every queued descriptor; returns how many.
    pub fn process(&self) -> usize {
        let mut n = 0;
        loop {
            let d = {
                let mut st = self.state();
                match st.queue.pop_front() {
                    Some(d) => d,
                    None => return n,
                }
            };
            self.run(&d);
            n += 1;
        }
    }

    /// Runs one descriptor and writes its record; returns its status.
    fn run(&self, d: &Descriptor) -> u8 {
        self.state().processed += 1;
        let (code, done) = match d.opcode() {
            opcode::NOOP => (status::SUCCESS, 0),
            opcode::MEMMOVE => self.memmove(d),
            opcode::BATCH => self.batch(d),
            _ => (status::BAD_OPCODE, 0),
        };
        // SAFETY: a descriptor's completion address names a live,
        // 32-aligned record (the Portal::submit contract), whose fields the
        // device writes as atomics, the status last.
        if let Some(r) = unsafe { (d.completion_addr as *const CompletionRecord).as_ref() } {
            r.bytes_completed.store(done, Ordering::Relaxed);
            r.status.store(code, Ordering::Release);
        }
        code
    }

    fn memmove(&self, d: &Descriptor) -> (u8, u32) {
        let len = d.size;
        if len == 0 || len > MAX_TRANSFER {
            return (status::XFER_ERR, 0);
        }
        let (s, t, l) = (d.src, d.dst, u64::from(len));
        if s < t + l && t < s + l {
            return (status::OVERLAP_BUFFERS, 0);
        }
        let fault = {
            let mut st = self.state();
            st.memmoves += 1;
            let periodic = st.fault_every > 0 && st.memmoves.is_multiple_of(st.fault_every);
            st.faults.pop_front().or(periodic.then_some(len / 2))
        };
        let n = fault.map_or(len, |f| f.min(len));
        // SAFETY: the descriptor's buffers are valid for `size` bytes and
        // do not overlap (checked above; the Portal::submit contract).
        unsafe { std::ptr::copy_nonoverlapping(s as *const u8, t as *mut u8, n as usize) };
        match fault {
            Some(_) => {
                if let Some(r) =
                    // SAFETY: as in `run`.
                    unsafe { (d.completion_addr as *const CompletionRecord).as_ref() }
                {
                    r.fault_addr.store(s + u64::from(n), Ordering::Relaxed);
                }
                (status::PAGE_FAULT_NOBOF, n)
            }
            None => (status::SUCCESS, len),
        }
    }

    fn batch(&self, d: &Descriptor) -> (u8, u32) {
        let count = d.size;
        if !(2..=MAX_BATCH).contains(&count) || !d.src.is_multiple_of(64) {
            return (status::DESC_CNT_ERR, 0);
        }
        let mut failed = false;
        for i in 0..count as usize {
            // SAFETY: a batch names an array of `count` descriptors that
            // lives until the batch's record is written (the contract).
            let e = unsafe { *(d.src as *const Descriptor).add(i) };
            // No batches inside batches.
            let code = if e.opcode() == opcode::BATCH {
                status::BAD_OPCODE
            } else {
                self.run(&e)
            };
            failed |= code != status::SUCCESS;
        }
        (
            if failed {
                status::BATCH_FAIL
            } else {
                status::SUCCESS
            },
            count,
        )
    }
}

impl Portal for ModelPortal {
    unsafe fn submit(&self, desc: &Descriptor) -> bool {
        let mut st = self.0.state();
        if st.queue.len() >= self.0.size {
            return false;
        }
        st.queue.push_back(*desc);
        self.0.arrived.notify_one();
        true
    }
}
