//! The hardware path: a work queue's portal mapped from its character
//! device (`/dev/dsa/wqX.Y`), descriptors written with MOVDIR64B (a
//! dedicated queue) or ENQCMD (a shared queue, which answers "retry" when
//! it is full).
//!
//! Not run on these machines (no DSA): the store instructions are checked
//! here on ordinary memory ([`movdir64b`] where the CPU has it), the portal
//! mapping is what the idxd driver documents (one 4 KiB page, write-only,
//! `MAP_SHARED`), and [`super::discover`] selects this path when queues
//! exist.

use std::io;
use std::os::fd::AsRawFd;

use super::{Descriptor, DsaEngine, Portal, WorkQueue};

/// Bytes of a portal mapping (the idxd driver's `PORTAL_SIZE`).
const PORTAL_SIZE: usize = 4096;

/// Whether the CPU has MOVDIR64B and ENQCMD (CPUID leaf 7, ECX bits 28, 29).
pub fn cpu_support() -> (bool, bool) {
    #[cfg(target_arch = "x86_64")]
    {
        // CPUID leaf 7 on a CPU without it returns zeros (no support).
        let r = std::arch::x86_64::__cpuid_count(7, 0);
        (r.ecx & (1 << 28) != 0, r.ecx & (1 << 29) != 0)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        (false, false)
    }
}

/// Writes `desc` to `dst` as one 64-byte direct store.
///
/// # Safety
/// `dst` must be 64-byte aligned and valid for a 64-byte write (a portal,
/// or memory), and the CPU must have MOVDIR64B ([`cpu_support`]).
#[cfg(target_arch = "x86_64")]
pub unsafe fn movdir64b(dst: *mut u8, desc: &Descriptor) {
    // SAFETY: the caller's contract; the source is a live 64-byte value.
    unsafe {
        std::arch::asm!(
            "movdir64b {dst}, [{src}]",
            dst = in(reg) dst,
            src = in(reg) std::ptr::from_ref(desc),
            options(nostack, preserves_flags)
        );
    }
}

/// Enqueues `desc` at a shared queue's portal; false when the device
/// answers "retry" (the queue is full).
///
/// # Safety
/// `portal` must be a shared work queue's mapped portal and the CPU must
/// have ENQCMD, with the process's PASID set up by the driver.
#[cfg(target_arch = "x86_64")]
unsafe fn enqcmd(portal: *mut u8, desc: &Descriptor) -> bool {
    let retry: u8;
    // SAFETY: the caller's contract.
    unsafe {
        std::arch::asm!(
            "enqcmd {dst}, [{src}]",
            "setz {retry}",
            dst = in(reg) portal,
            src = in(reg) std::ptr::from_ref(desc),
            retry = out(reg_byte) retry,
            options(nostack)
        );
    }
    retry == 0
}

/// A mapped work-queue portal.
#[derive(Debug)]
pub struct WqPortal {
    portal: *mut u8,
    shared: bool,
    /// Kept open for as long as the mapping is used.
    _file: std::fs::File,
}

// SAFETY: the portal is a device page written with single atomic 64-byte
// stores; the engine owning it submits from one thread at a time.
unsafe impl Send for WqPortal {}

impl WqPortal {
    /// Maps `wq`'s portal; refuses a queue the CPU cannot submit to.
    pub fn open(wq: &WorkQueue) -> io::Result<WqPortal> {
        let shared = wq.mode == "shared";
        let (movdir, enq) = cpu_support();
        if (shared && !enq) || (!shared && !movdir) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "{}: a {} work queue needs {}, which this CPU lacks",
                    wq.path.display(),
                    wq.mode,
                    if shared { "ENQCMD" } else { "MOVDIR64B" }
                ),
            ));
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&wq.path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", wq.path.display())))?;
        // SAFETY: mapping the driver's portal page of an open work queue.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                PORTAL_SIZE,
                libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(WqPortal {
            portal: p.cast(),
            shared,
            _file: file,
        })
    }
}

impl Drop for WqPortal {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `open`, no longer used.
        unsafe { libc::munmap(self.portal.cast(), PORTAL_SIZE) };
    }
}

impl Portal for WqPortal {
    unsafe fn submit(&self, desc: &Descriptor) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            // The descriptor's buffers and records were written with plain
            // stores: order them before the device can see the descriptor.
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
            if self.shared {
                // SAFETY: a shared queue's portal; `open` checked ENQCMD.
                unsafe { enqcmd(self.portal, desc) }
            } else {
                // SAFETY: a dedicated queue's 64-aligned portal; `open`
                // checked MOVDIR64B. The engine keeps no more descriptors
                // in flight than the queue holds (`open` below).
                unsafe { movdir64b(self.portal, desc) };
                true
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = desc;
            false
        }
    }
}

/// A [`DsaEngine`] on the first work queue of `wqs` this process can use,
/// with at most `in_flight` jobs (no more than a dedicated queue holds).
pub fn open(
    wqs: &[WorkQueue],
    in_flight: usize,
    min_offload: u64,
) -> io::Result<DsaEngine<WqPortal>> {
    let mut why = Vec::new();
    for wq in wqs {
        match WqPortal::open(wq) {
            Ok(p) => {
                // A batch is one descriptor in the queue: jobs bound it.
                let cap = if p.shared {
                    in_flight
                } else {
                    in_flight.min(wq.size.max(1) as usize)
                };
                return Ok(DsaEngine::new(p, cap, min_offload));
            }
            Err(e) => why.push(e.to_string()),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!("no usable DSA work queue: {}", why.join("; ")),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dsa::{flag, opcode};

    #[test]
    fn movdir64b_stores_the_whole_descriptor() {
        if !cpu_support().0 {
            eprintln!("skipped: this CPU has no MOVDIR64B");
            return;
        }
        let d = Descriptor {
            completion_addr: 0x1234_5678_9abc_def0,
            src: 0x1111,
            dst: 0x2222,
            size: 4096,
            ..Descriptor::new(opcode::MEMMOVE, flag::CRAV | flag::RCR)
        };
        let mut slot = [Descriptor::default(); 2];
        // SAFETY: a 64-aligned, 64-byte slot of ours; the CPU has it.
        unsafe { movdir64b(std::ptr::from_mut(&mut slot[1]).cast(), &d) };
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(slot[1], d);
        assert_eq!(slot[0], Descriptor::default(), "nothing else written");
    }

    #[test]
    fn a_missing_queue_says_so() {
        let wq = WorkQueue {
            path: "/nonexistent/wq9.9".into(),
            mode: "dedicated".into(),
            size: 16,
        };
        let e = open(&[wq], 8, 0).unwrap_err();
        assert!(e.to_string().contains("wq9.9"), "{e}");
    }
}
