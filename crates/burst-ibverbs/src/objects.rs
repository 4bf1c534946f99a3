//! The C library's objects: the structs behind every pointer handed to
//! the application (the C struct first, so the pointer is the object) and
//! the way back from a pointer to the object. The lower module of the
//! library: `datapath`, `verbs` and `device` build on it, and it on none
//! of them (`device` assembles a context's function table from the other
//! two; `verbs` installs the data path's `ibv_wr_*` functions).

use std::collections::HashMap;
use std::ffi::c_int;
use std::mem::offset_of;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};

use burst_verbs::config::DeviceConfig;
use burst_verbs::engine::{
    CompChannel, CompletionQueue, Context, CqId, Engine, QueuePair, SharedReceiveQueue,
};
use burst_verbs::QpType;

use crate::abi::*;

/// Recovers our object from the pointer handed out (first field).
macro_rules! ours {
    ($t:ty, $p:expr) => {{
        let p = $p;
        if p.is_null() {
            None
        } else {
            // SAFETY: objects of this kind are only created by us, with the
            // C struct as first field (caller's contract: a live object).
            Some(unsafe { &*(p.cast::<$t>()) })
        }
    }};
}
pub(crate) use ours;

/// Largest CQ.
pub(crate) const MAX_CQE: c_int = burst_verbs::MAX_CQE as c_int;

/// A device of the list: the C struct first, so the pointer the app holds
/// is the pointer to this.
#[repr(C)]
pub(crate) struct Dev {
    pub raw: ibv_device,
    pub cfg: DeviceConfig,
    pub index: usize,
    /// Daemon mode: the process's one client context of burstd.
    pub daemon: Option<std::sync::Arc<DaemonLink>>,
}

/// The process's client context of burstd, and the process that made it.
/// A child of fork() connects on its own at its first open: the parent's
/// context is its socket and threads, which the child shares or lacks.
pub(crate) struct DaemonLink {
    path: std::path::PathBuf,
    ctx: std::sync::Mutex<(u32, Context)>,
}

impl DaemonLink {
    /// The link of this process to burstd at `path`, connected.
    pub fn new(path: std::path::PathBuf, ctx: Context) -> DaemonLink {
        DaemonLink {
            path,
            ctx: std::sync::Mutex::new((std::process::id(), ctx)),
        }
    }

    /// This process's context (connected again after a fork).
    pub fn context(&self) -> std::io::Result<Context> {
        let pid = std::process::id();
        let mut g = self.ctx.lock().unwrap_or_else(|e| e.into_inner());
        if g.0 != pid {
            tracing::info!("burst: first device open after fork(): a burstd client of its own");
            let fresh = Context::connect(&self.path)?;
            // The parent's context is not dropped here: its threads do
            // not exist in this process and its socket is the parent's.
            std::mem::forget(std::mem::replace(&mut *g, (pid, fresh)));
        }
        Ok(g.1.clone())
    }
}

/// An open context: `verbs_context` first (the app holds `&vctx.context`).
#[repr(C)]
pub(crate) struct Ctx {
    pub vctx: verbs_context,
    pub dev: *const Dev,
    /// The embedded engine (`None` in daemon mode).
    pub engine: Option<Arc<Engine>>,
    pub ctx: Context,
    /// Readable while async events are pending: a duplicate of the
    /// engine's event descriptor (see `Context::async_fd`).
    pub async_fd: std::os::fd::OwnedFd,
    /// What `ibv_context.cmd_fd` holds: there is no uverbs command file,
    /// so `/dev/null`, opened per context (an application may `dup`,
    /// `fcntl` or close-on-exec it; nothing else reads it).
    pub cmd_fd: Option<std::os::fd::OwnedFd>,
    /// SRQ handle → `ibv_srq` pointer, for async events.
    pub srqs: Mutex<HashMap<u32, usize>>,
    /// QPN → `ibv_qp` pointer, for async events.
    pub qps: Mutex<HashMap<u32, usize>>,
    /// CQ handle → `ibv_cq` pointer, for async events.
    pub cqs: Mutex<HashMap<u32, usize>>,
}

// SAFETY: the raw pointers in the C structs are only read by the
// application and by calls it makes; the Rust state is Sync itself.
unsafe impl Send for Ctx {}
// SAFETY: as above.
unsafe impl Sync for Ctx {}

/// The context behind an `ibv_context *` we handed out.
///
/// # Safety
/// `ctx` must come from [`open_device`] and not be closed.
pub(crate) unsafe fn ctx_of<'a>(ctx: *mut ibv_context) -> Option<&'a Ctx> {
    if ctx.is_null() {
        return None;
    }
    let at = offset_of!(Ctx, vctx) + offset_of!(verbs_context, context);
    // SAFETY: `ctx` is the `context` field of a live Ctx (caller's contract).
    unsafe { Some(&*(ctx.cast::<u8>().sub(at).cast::<Ctx>())) }
}

#[repr(C)]
pub(crate) struct Pd {
    pub raw: ibv_pd,
    pub pd: burst_verbs::Pd,
}

#[repr(C)]
pub(crate) struct Mr {
    pub raw: ibv_mr,
    /// The address remote peers name it by (`ibv_reg_mr_iova`).
    pub iova: u64,
    /// The access flags it was registered with (for `ibv_rereg_mr`).
    pub access: u32,
}

#[repr(C)]
pub(crate) struct Mw {
    /// `handle` is the window's index (the upper 24 bits of its rkeys).
    pub raw: ibv_mw,
}

#[repr(C)]
pub(crate) struct Channel {
    pub raw: ibv_comp_channel,
    pub ch: Arc<CompChannel>,
    /// CQ handle → `ibv_cq` pointer, to answer `ibv_get_cq_event`.
    pub cqs: Mutex<HashMap<u32, usize>>,
}

#[repr(C)]
pub(crate) struct Cq {
    pub raw: ibv_cq,
    /// The rest of an `ibv_cq_ex` (every CQ has it; `ibv_create_cq_ex`
    /// fills its entry points).
    pub ex: ibv_cq_ex_tail,
    /// The completion `ibv_start_poll`/`ibv_next_poll` stepped to, for the
    /// `ibv_wc_read_*` calls.
    pub current: Mutex<ibv_wc>,
    pub handle: CompletionQueue,
    pub id: CqId,
    /// QPs completing into it.
    pub users: AtomicU32,
}

#[repr(C)]
pub(crate) struct Srq {
    pub raw: ibv_srq,
    pub srq: SharedReceiveQueue,
    /// Fixed at creation (`ibv_modify_srq` changes only max_wr and the limit).
    pub max_sge: u32,
    pub attr: Mutex<ibv_srq_attr>,
    pub users: AtomicU32,
}

#[repr(C)]
pub(crate) struct Qp {
    /// An `ibv_qp_ex` from the start, so `ibv_qp_to_qp_ex` can hand it out.
    pub raw: ibv_qp_ex,
    pub qp: QueuePair,
    pub qp_type: QpType,
    pub sq_sig_all: bool,
    pub cap: ibv_qp_cap,
    /// Created through `ibv_create_qp_ex` with send-ops flags.
    pub extended: bool,
    /// The attributes applied so far, for `ibv_query_qp`.
    pub shadow: Mutex<ibv_qp_attr>,
    /// The WR being built by the `ibv_wr_*` calls.
    pub wr: Mutex<WrBatch>,
    /// The ECE options `ibv_set_ece` agreed (`None`: never called, the
    /// QP offers [`burst_verbs::Ece::offered`] and uses none of it).
    pub ece: Mutex<Option<burst_verbs::Ece>>,
}

#[repr(C)]
pub(crate) struct Ah {
    pub raw: ibv_ah,
    pub index: u32,
}

/// The WRs an `ibv_wr_start` … `ibv_wr_complete` batch has built.
#[derive(Default)]
pub(crate) struct WrBatch {
    pub wrs: Vec<burst_verbs::SendWr>,
    /// The first error met while building (returned by wr_complete).
    pub error: c_int,
}
