//! Settings of the engine thread: timer slack, CPU affinity (system
//! calls; with `eventfd.rs`, the only `unsafe` of burst-verbs).

/// Asks the kernel to wake this thread from its waits on time: the
/// default timer slack (50 us) would make every transport timer and claim
/// deadline the engine waits for up to 50 us late.
pub(crate) fn fine_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes an integer argument and affects only
    // the calling thread; no memory is passed.
    let rc = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong) };
    if rc != 0 {
        tracing::debug!("PR_SET_TIMERSLACK: {}", std::io::Error::last_os_error());
    }
}

/// Waits until `a` or `b` is readable, or `timeout` passes (an
/// interrupted wait returns early; callers look at both anyway).
pub(crate) fn poll_two(
    a: std::os::fd::BorrowedFd<'_>,
    b: std::os::fd::BorrowedFd<'_>,
    timeout: std::time::Duration,
) {
    use std::os::fd::AsRawFd;
    let mut fds = [
        libc::pollfd {
            fd: a.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: b.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
    // Round up: a deadline under a millisecond away must not spin.
    let ms = if ms == 0 && !timeout.is_zero() { 1 } else { ms };
    // SAFETY: `fds` is a live array of two pollfds for the call; both
    // descriptors are borrowed, so open, for its duration.
    let _ = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
}

/// The CPUs this process may run on (its affinity mask).
pub(crate) fn allowed_cpus() -> Vec<usize> {
    // SAFETY: an all-zero cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a live cpu_set_t of the size passed; pid 0 is the
    // calling thread.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    if rc != 0 {
        return Vec::new();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: CPU_ISSET reads the set in bounds (below CPU_SETSIZE).
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// Pins the calling thread to `cpu`.
pub(crate) fn pin_to(cpu: usize) -> std::io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("CPU {cpu} is beyond the kernel's CPU set"),
        ));
    }
    // SAFETY: an all-zero cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is below CPU_SETSIZE (checked above).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a live cpu_set_t of the size passed; pid 0 is the
    // calling thread, the only one affected.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
