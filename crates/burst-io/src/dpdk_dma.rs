//! A DPDK DMA device (`rte_dma_*`, dmadev) as a [`burst_dsa::AsyncCopy`]
//! backend (feature `dpdk`): a job's segments are enqueued as copies on one
//! virtual channel and submitted together; completions are read back with
//! `rte_dma_completed`, which reports finished copies in enqueue order, so
//! a job is complete once all of its copies are.
//!
//! Addresses go to the device as they are (IOVA as VA: what `--no-huge`
//! and DPDK's software devices use). Tested with DPDK's `dma_skeleton`
//! virtual device, which copies on a CPU thread of its own: it proves the
//! path, not a speed.

use std::collections::VecDeque;
use std::ffi::CString;
use std::io;

use burst_dsa::{AsyncCopy, Completion, CopyError, CopyJob, Counters};

use crate::dpdk::{start_eal, sys, DpdkConfig};

/// A started DMA device's virtual channel 0.
#[derive(Debug)]
pub struct DmaCopy {
    dev: i16,
    /// Jobs enqueued: (tag, copies, bytes), oldest first.
    pending: VecDeque<(u64, u16, u64)>,
    /// Copies the device finished that no polled job has claimed yet.
    finished: u32,
    /// A finished copy reported an error since the last job completed.
    failed: bool,
    counters: Counters,
}

impl DmaCopy {
    /// Starts the EAL with `eal` (once per process; e.g.
    /// `--vdev=dma_skeleton`) and the DMA device `name` with one
    /// memory-to-memory channel of `descriptors` entries (clamped to what
    /// the device takes).
    pub fn open(eal: &[&str], name: &str, descriptors: u16) -> io::Result<DmaCopy> {
        DmaCopy::open_config(&DpdkConfig::new(eal), name, descriptors)
    }

    /// [`DmaCopy::open`] with the EAL arguments of `cfg` (a device's
    /// `BURST_DPDK`; the EAL starts once per process, so a DPDK port and
    /// the DMA device share it).
    pub fn open_config(cfg: &DpdkConfig, name: &str, descriptors: u16) -> io::Result<DmaCopy> {
        start_eal(&cfg.eal_args())?;
        let cname = CString::new(name).map_err(io::Error::other)?;
        // SAFETY: a NUL-terminated name; the EAL is up.
        let id = unsafe { sys::rte_dma_get_dev_id_by_name(cname.as_ptr()) };
        let dev = i16::try_from(id).ok().filter(|d| *d >= 0).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("no DMA device {name:?} (give the EAL --vdev=dma_skeleton, or a device)"),
            )
        })?;
        let mut info = sys::rte_dma_info::default();
        // SAFETY: a valid device id and a struct to fill.
        let rc = unsafe { sys::rte_dma_info_get(dev, &mut info) };
        check(rc, "rte_dma_info_get")?;
        let conf = sys::rte_dma_conf {
            nb_vchans: 1,
            enable_silent: false,
        };
        // SAFETY: a valid device id and configuration.
        let rc = unsafe { sys::rte_dma_configure(dev, &conf) };
        check(rc, "rte_dma_configure")?;
        let vconf = sys::rte_dma_vchan_conf {
            direction: sys::rte_dma_direction_RTE_DMA_DIR_MEM_TO_MEM,
            nb_desc: descriptors.clamp(info.min_desc, info.max_desc),
            ..Default::default()
        };
        // SAFETY: as above, channel 0 of the one configured.
        let rc = unsafe { sys::rte_dma_vchan_setup(dev, 0, &vconf) };
        check(rc, "rte_dma_vchan_setup")?;
        // SAFETY: a configured device.
        let rc = unsafe { sys::rte_dma_start(dev) };
        check(rc, "rte_dma_start")?;
        Ok(DmaCopy {
            dev,
            pending: VecDeque::new(),
            finished: 0,
            failed: false,
            counters: Counters::default(),
        })
    }
}

fn check(rc: i32, what: &str) -> io::Result<()> {
    if rc < 0 {
        return Err(io::Error::from_raw_os_error(-rc).also_named(what));
    }
    Ok(())
}

trait Named {
    fn also_named(self, what: &str) -> io::Error;
}

impl Named for io::Error {
    fn also_named(self, what: &str) -> io::Error {
        io::Error::new(self.kind(), format!("{what}: {self}"))
    }
}

impl Drop for DmaCopy {
    fn drop(&mut self) {
        // SAFETY: the device this value started.
        unsafe { sys::rte_dma_stop(self.dev) };
    }
}

impl AsyncCopy for DmaCopy {
    unsafe fn submit(&mut self, job: CopyJob) -> Result<(), CopyJob> {
        let n = job.segments.iter().filter(|s| s.len > 0).count();
        // SAFETY: a started device's channel 0.
        let room = usize::from(unsafe { sys::rte_dma_burst_capacity(self.dev, 0) });
        if n > room || n > usize::from(u16::MAX) {
            self.counters.full += 1;
            return Err(job);
        }
        for s in job.segments.iter().filter(|s| s.len > 0) {
            // SAFETY: the submit contract keeps the buffers valid until
            // the job's completion; addresses are IOVAs as VAs.
            let rc = unsafe {
                sys::rte_dma_copy(self.dev, 0, s.src as u64, s.dst as u64, s.len as u32, 0)
            };
            // The capacity was checked: a refusal here is the device's.
            debug_assert!(rc >= 0, "rte_dma_copy refused after the capacity check");
        }
        // SAFETY: as above.
        unsafe { sys::rte_dma_submit(self.dev, 0) };
        self.pending.push_back((job.tag, n as u16, job.bytes()));
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> usize {
        let mut last = 0u16;
        let mut error = false;
        // SAFETY: a started device's channel 0; the out-parameters are ours.
        let n = unsafe { sys::rte_dma_completed(self.dev, 0, u16::MAX, &mut last, &mut error) };
        self.finished += u32::from(n);
        if error {
            // Copies that failed: counted as finished, their job failed.
            let mut status = [sys::rte_dma_status_code::default(); 32];
            // SAFETY: as above; `status` holds 32 entries.
            let k = unsafe {
                sys::rte_dma_completed_status(self.dev, 0, 32, &mut last, status.as_mut_ptr())
            };
            self.finished += u32::from(k);
            self.failed = true;
        }
        let mut done = 0;
        while let Some(&(tag, ops, bytes)) = self.pending.front() {
            if self.finished < u32::from(ops) {
                break;
            }
            self.finished -= u32::from(ops);
            self.pending.pop_front();
            let status = if std::mem::take(&mut self.failed) {
                self.counters.errors += 1;
                Err(CopyError::Device(0xff))
            } else {
                Ok(())
            };
            self.counters.jobs += 1;
            self.counters.bytes += bytes;
            out.push(Completion { tag, bytes, status });
            done += 1;
        }
        done
    }

    fn in_flight(&self) -> usize {
        self.pending.len()
    }

    fn counters(&self) -> Counters {
        self.counters
    }
}
