//! An eventfd: the file descriptor behind a completion channel, readable
//! when events are pending (so `poll()`-based applications can wait on it).
//! With `thread.rs`, the only `unsafe` of burst-verbs (system calls).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// A close-on-exec eventfd in semaphore mode: every [`EventFd::signal`]
/// adds one, every successful read takes one, so the descriptor stays
/// readable exactly while events are pending. Created blocking, as
/// rdma-core's channel descriptors are: an application may make it
/// non-blocking with `fcntl`, and burst's own reads never block.
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    /// Creates one.
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: plain syscall with constant flags; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor we own.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// An eventfd another process sent (SCM_RIGHTS).
    pub fn from_owned(fd: OwnedFd) -> EventFd {
        EventFd(fd)
    }

    /// Adds one pending event (the descriptor becomes readable).
    pub fn signal(&self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a live u64 to our own descriptor; an
        // error (counter overflow) leaves it readable anyway.
        let _ = unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Takes one pending event without blocking; returns whether there was
    /// one. (Two threads racing for the last event: the loser may wait in
    /// `read` for the next one, as with rdma-core's blocking read.)
    pub fn drain(&self) -> bool {
        if !self.wait(Duration::ZERO) {
            return false;
        }
        self.read()
    }

    /// Takes one pending event, blocking unless the application made the
    /// descriptor non-blocking (then `false` when none is pending), exactly
    /// as `ibv_get_cq_event` reads its channel.
    pub fn read(&self) -> bool {
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into a live u64 from our own non-blocking fd.
        let n = unsafe { libc::read(self.0.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        n == 8
    }

    /// Waits until readable or `timeout` passes; returns whether readable.
    pub fn wait(&self, timeout: Duration) -> bool {
        let mut p = libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one live pollfd, count 1.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        n > 0 && p.revents & libc::POLLIN != 0
    }
}

impl std::os::fd::AsFd for EventFd {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl From<EventFd> for OwnedFd {
    fn from(e: EventFd) -> OwnedFd {
        e.0
    }
}
