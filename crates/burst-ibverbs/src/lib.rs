//! # burst-ibverbs: a drop-in `libibverbs.so.1`
//!
//! Unmodified, already-compiled Verbs applications (rdma-core's `ibv_*`
//! tools, perftest, …) run on burst when this library is found first by the
//! dynamic loader:
//!
//! ```text
//! cargo build --release -p burst-ibverbs
//! mkdir -p lib && cp target/release/libburst_ibverbs.so lib/
//! ln -sf libburst_ibverbs.so lib/libibverbs.so.1
//! ln -sf libburst_ibverbs.so lib/librdmacm.so.1
//! BURST_ADDR=198.18.0.1 LD_LIBRARY_PATH=lib ibv_rc_pingpong -g 0 <server>
//! ```
//!
//! (`cargo xtask dropin` does the first four lines.) Every public symbol of
//! rdma-core 44's libibverbs and librdmacm is exported with its version;
//! what burst implements is backed by burst-verbs' engine (and, for
//! librdmacm, burst-verbs' `rdma_cm`: see `docs/cm.md`), the rest fails cleanly
//! with EOPNOTSUPP (verbs) or ENOSYS (librdmacm's ECE calls, extended SRQs). Devices
//! come from `burst_verbs::config` (`BURST_ADDR`, `BURST_IFACE`, a config
//! file); `BURST_LOG` sets the log level.
//!
//! Layout facts (struct offsets, the inline fast paths through the
//! context's ops table, the extended `verbs_context`) are in
//! `design/ibverbs-abi.md`; [`abi`] mirrors them with compile-time checks.

#[macro_use]
mod export;
pub mod abi;
mod datapath;
mod device;
mod objects;
mod rdmacm;
mod strings;
mod stubs;
mod verbs;

use std::ffi::c_int;
use std::sync::Once;

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// Starts logging once: `BURST_LOG` (default `warn`) to stderr.
pub(crate) fn init_logging() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let filter = std::env::var("BURST_LOG").unwrap_or_else(|_| "warn".into());
        let _ = tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .try_init();
    });
}

/// A message the user must see (configuration problems, unsupported calls).
pub(crate) fn log_line(msg: &str) {
    init_logging();
    tracing::warn!("{msg}");
}

/// Runs `f`, turning a panic into `fallback` so that no unwinding crosses
/// into C (a bug of ours becomes an error return, not an abort).
pub(crate) fn guard<T>(name: &str, fallback: T, f: impl FnOnce() -> T) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            log_line(&format!("internal error in {name}; returning an error"));
            set_errno(libc::EIO);
            fallback
        }
    }
}
