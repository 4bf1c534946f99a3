//! Intel Data Streaming Accelerator: what the idxd driver's user interface
//! (`include/uapi/linux/idxd.h`, work queues under `/dev/dsa/`) and Intel's
//! DSA architecture specification define, as burst uses it.
//!
//! A work queue is reached through a portal (a page mapped from
//! `/dev/dsa/wqX.Y`): a 64-byte [`Descriptor`] is written to it with
//! MOVDIR64B (dedicated queue) or ENQCMD (shared queue, which may answer
//! "retry": the queue is full). The device writes a 32-byte
//! [`CompletionRecord`] to the address the descriptor names and sets its
//! status byte last; the engine polls that byte.
//!
//! Descriptors go without Block-on-Fault: a page fault completes the
//! descriptor early with [`status::PAGE_FAULT_NOBOF`], the bytes done so far
//! and the faulting address, and [`DsaEngine`] finishes the rest on the CPU
//! (the data plane never waits on the kernel's fault handling).
//!
//! There is no DSA on these machines: [`model::DsaModel`] is a software
//! device that consumes the same descriptors from a portal and writes the
//! same records (batches, partial completions on a fault, errors for bad
//! descriptors, a full queue), so the engine's paths run for real in tests;
//! [`discover`] finds hardware work queues and says why there are none;
//! [`hardware`] maps their portals.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};

mod engine;
pub mod hardware;
pub mod model;

pub use engine::{DsaEngine, Portal};

/// Operation codes (the descriptor's byte 7).
pub mod opcode {
    /// No operation.
    pub const NOOP: u8 = 0x00;
    /// A batch: `src` is the address of an array of `size` descriptors.
    pub const BATCH: u8 = 0x01;
    /// Drain: completes once earlier descriptors have.
    pub const DRAIN: u8 = 0x02;
    /// Memory move (copy).
    pub const MEMMOVE: u8 = 0x03;
}

/// Descriptor flags (bytes 4..7).
pub mod flag {
    /// Fence: this descriptor starts after every earlier one of its batch.
    pub const FENCE: u32 = 0x0001;
    /// Block on fault (burst leaves it clear: a fault ends the descriptor).
    pub const BOF: u32 = 0x0002;
    /// The completion record address is valid.
    pub const CRAV: u32 = 0x0004;
    /// Request a completion record.
    pub const RCR: u32 = 0x0008;
    /// Cache control: the destination is written into the cache.
    pub const CC: u32 = 0x0100;
}

/// Completion record status codes (low 7 bits of byte 0).
pub mod status {
    /// Not completed yet (the record as the engine left it).
    pub const NONE: u8 = 0x00;
    /// Success.
    pub const SUCCESS: u8 = 0x01;
    /// A page fault ended the operation (Block-on-Fault clear): the record
    /// says how many bytes were done and where the fault was.
    pub const PAGE_FAULT_NOBOF: u8 = 0x03;
    /// A batch in which some descriptor failed.
    pub const BATCH_FAIL: u8 = 0x05;
    /// Unsupported operation code.
    pub const BAD_OPCODE: u8 = 0x10;
    /// Invalid flags.
    pub const INVALID_FLAGS: u8 = 0x11;
    /// Transfer size out of range (0, or over the work queue's maximum).
    pub const XFER_ERR: u8 = 0x13;
    /// A batch's descriptor count out of range.
    pub const DESC_CNT_ERR: u8 = 0x14;
    /// Source and destination overlap.
    pub const OVERLAP_BUFFERS: u8 = 0x16;
    /// Mask of the code in the status byte (bit 7: the fault was a write).
    pub const MASK: u8 = 0x7f;
}

/// A DSA work descriptor (`struct dsa_hw_desc`): 64 bytes, 64-aligned.
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Descriptor {
    /// PASID (20 bits), reserved, privilege (shared queues: set by ENQCMD).
    pub pasid_priv: u32,
    /// Flags (24 bits) and the operation code (top byte).
    pub flags_opcode: u32,
    /// Where the device writes the completion record (32-byte aligned).
    pub completion_addr: u64,
    /// Source address (a batch: the descriptor array's address).
    pub src: u64,
    /// Destination address.
    pub dst: u64,
    /// Transfer size in bytes (a batch: the descriptor count).
    pub size: u32,
    /// Interrupt handle (unused: completions are polled).
    pub int_handle: u16,
    /// Reserved.
    pub rsvd: u16,
    /// Operation-specific fields (unused by MEMMOVE and BATCH).
    pub op_specific: [u64; 3],
}

const _: () = assert!(std::mem::size_of::<Descriptor>() == 64);

impl Descriptor {
    /// A descriptor of `opcode` with `flags`.
    pub fn new(opcode: u8, flags: u32) -> Descriptor {
        Descriptor {
            flags_opcode: (u32::from(opcode) << 24) | (flags & 0x00ff_ffff),
            ..Default::default()
        }
    }
    /// The operation code.
    pub fn opcode(&self) -> u8 {
        (self.flags_opcode >> 24) as u8
    }
    /// The flags.
    pub fn flags(&self) -> u32 {
        self.flags_opcode & 0x00ff_ffff
    }
}

/// A completion record (`struct dsa_completion_record`): 32 bytes,
/// 32-aligned, written by the device (status byte last) while the engine
/// reads it: every field the device writes is an atomic of the C field's
/// size.
#[repr(C, align(32))]
#[derive(Debug, Default)]
pub struct CompletionRecord {
    /// Status (0 until the device writes it).
    pub status: AtomicU8,
    /// Result (operation-specific).
    pub result: AtomicU8,
    /// Reserved.
    pub rsvd: u16,
    /// Bytes completed (a batch: descriptors completed).
    pub bytes_completed: AtomicU32,
    /// The faulting address of a page fault.
    pub fault_addr: AtomicU64,
    /// Operation-specific.
    pub op_specific: [AtomicU64; 2],
}

const _: () = assert!(std::mem::size_of::<CompletionRecord>() == 32);

impl CompletionRecord {
    /// The status code once the device has written it (`None` before).
    pub fn status(&self) -> Option<u8> {
        match self.status.load(Ordering::Acquire) & status::MASK {
            status::NONE => None,
            s => Some(s),
        }
    }

    /// Bytes (a batch: descriptors) the device completed.
    pub fn bytes_completed(&self) -> u32 {
        self.bytes_completed.load(Ordering::Relaxed)
    }
}

/// A work queue the idxd driver exposes to user space.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkQueue {
    /// Its character device (`/dev/dsa/wq0.0`).
    pub path: std::path::PathBuf,
    /// `dedicated` or `shared` (sysfs `mode`).
    pub mode: String,
    /// Descriptors it holds (sysfs `size`).
    pub size: u32,
}

/// The user work queues of this host (`/dev/dsa/wq*`, with their mode and
/// size from `/sys/bus/dsa/devices/wq*`), or why there are none.
pub fn discover() -> Result<Vec<WorkQueue>, String> {
    let dir = std::path::Path::new("/dev/dsa");
    let entries = std::fs::read_dir(dir).map_err(|e| {
        format!(
            "no Intel DSA work queue: {} ({e}); the idxd driver exposes user \
             work queues there once a device is configured (accel-config)",
            dir.display()
        )
    })?;
    let mut wqs: Vec<WorkQueue> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with("wq").then(|| {
                let sys = std::path::Path::new("/sys/bus/dsa/devices").join(&name);
                let read = |f: &str| {
                    std::fs::read_to_string(sys.join(f))
                        .map(|s| s.trim().to_string())
                        .unwrap_or_default()
                };
                WorkQueue {
                    path: e.path(),
                    mode: read("mode"),
                    size: read("size").parse().unwrap_or(0),
                }
            })
        })
        .collect();
    wqs.sort_by(|a, b| a.path.cmp(&b.path));
    if wqs.is_empty() {
        return Err(
            "no Intel DSA work queue: /dev/dsa has none (configure one with accel-config)".into(),
        );
    }
    Ok(wqs)
}
