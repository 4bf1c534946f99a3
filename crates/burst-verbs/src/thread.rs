//! Settings of the engine thread (system calls; with `eventfd.rs`, the only
//! `unsafe` of burst-verbs).

/// Asks the kernel to wake this thread from short sleeps on time: the
/// default timer slack (50 us) would turn the engine thread's 10 us
/// back-off into 60 us, during which no thread receives.
pub(crate) fn fine_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes an integer argument and affects only
    // the calling thread; no memory is passed.
    let rc = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong) };
    if rc != 0 {
        tracing::debug!("PR_SET_TIMERSLACK: {}", std::io::Error::last_os_error());
    }
}
