//! An eventfd: the file descriptor behind a completion channel, readable
//! when events are pending (so `poll()`-based applications can wait on it).
//! The only `unsafe` of burst-verbs.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// A non-blocking, close-on-exec eventfd.
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    /// Creates one.
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: plain syscall with constant flags; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor we own.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Makes the descriptor readable.
    pub fn signal(&self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a live u64 to our own descriptor; an
        // error (counter overflow) leaves it readable anyway.
        let _ = unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Clears the readable state; returns whether it was set.
    pub fn drain(&self) -> bool {
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

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}
