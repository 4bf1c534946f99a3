//! Descriptors that are readable while events are pending (so
//! `poll()`-based applications can wait on them): an eventfd inside one
//! process, a pipe between burstd and a client. With `thread.rs`, the only
//! `unsafe` of burst-verbs outside the shared-memory and client modules
//! (system calls).
//!
//! Why pipes across processes: an eventfd has one open file description,
//! shared by every process holding it, so a client could fill its counter
//! (a writer then blocks) or clear `O_NONBLOCK` behind the daemon's back.
//! A pipe's two ends are separate descriptions: the side that signals keeps
//! its end to itself, non-blocking, and the other side can neither block
//! it nor change how it behaves. A full pipe only means "already readable".

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// What a descriptor is and how one event is signalled or taken.
#[derive(Debug)]
enum Kind {
    /// An eventfd in semaphore mode (one process).
    Event,
    /// A pipe's read end: one byte per event; `local` is a write end of
    /// this process's own (opened anew, so its own description), through
    /// which this side can raise events too (a daemon's death).
    PipeReader { local: Option<OwnedFd> },
    /// A pipe's write end, non-blocking, held by the signalling side only.
    PipeWriter,
}

/// A descriptor that is readable exactly while events are pending: every
/// [`EventFd::signal`] adds one, every successful read takes one. Created
/// blocking for readers, as rdma-core's channel descriptors are: an
/// application may make it non-blocking with `fcntl`, and burst's own
/// reads never block.
#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
    kind: Kind,
}

fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

impl EventFd {
    /// A close-on-exec eventfd in semaphore mode, for one process.
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: plain syscall with constant flags; the result is checked.
        let fd = check(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) })?;
        Ok(EventFd {
            // SAFETY: `fd` is a fresh descriptor we own.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            kind: Kind::Event,
        })
    }

    /// A pipe for signalling another process: `(reader, writer)`. The
    /// writer is non-blocking (its signals never wait); the reader blocks
    /// unless `reader_nonblocking`.
    pub fn pipe(reader_nonblocking: bool) -> io::Result<(EventFd, EventFd)> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
        // SAFETY: two fresh descriptors we own.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        set_nonblocking(&w)?;
        if reader_nonblocking {
            set_nonblocking(&r)?;
        }
        Ok((
            EventFd {
                fd: r,
                kind: Kind::PipeReader { local: None },
            },
            EventFd {
                fd: w,
                kind: Kind::PipeWriter,
            },
        ))
    }

    /// The read end of a pipe another process signals (received by
    /// SCM_RIGHTS). It gets a write end of its own, opened anew through
    /// `/proc/self/fd`, so this process can raise events on it too.
    pub fn pipe_reader(fd: OwnedFd) -> EventFd {
        let path = format!("/proc/self/fd/{}\0", fd.as_raw_fd());
        // SAFETY: a NUL-terminated path; the result is checked.
        let w = unsafe {
            libc::open(
                path.as_ptr().cast(),
                libc::O_WRONLY | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        let local = if w >= 0 {
            // SAFETY: a fresh descriptor we own.
            Some(unsafe { OwnedFd::from_raw_fd(w) })
        } else {
            tracing::debug!(
                "burst: no local write end for a pipe: {}",
                io::Error::last_os_error()
            );
            None
        };
        EventFd {
            fd,
            kind: Kind::PipeReader { local },
        }
    }

    /// The write end of a pipe another process reads (received by
    /// SCM_RIGHTS); made non-blocking, so a reader that never reads only
    /// fills its own pipe.
    pub fn pipe_writer(fd: OwnedFd) -> io::Result<EventFd> {
        set_nonblocking(&fd)?;
        Ok(EventFd {
            fd,
            kind: Kind::PipeWriter,
        })
    }

    /// Adds one pending event (the descriptor becomes readable). Never
    /// blocks: a full counter or pipe is readable already.
    pub fn signal(&self) {
        let one = 1u64;
        let (fd, bytes) = match &self.kind {
            Kind::Event => (self.fd.as_raw_fd(), 8),
            Kind::PipeWriter => (self.fd.as_raw_fd(), 1),
            Kind::PipeReader { local: Some(w) } => (w.as_raw_fd(), 1),
            Kind::PipeReader { local: None } => return,
        };
        // SAFETY: writes `bytes` (<= 8) bytes from a live u64 to a
        // descriptor we hold; an error (overflow, a full pipe) leaves it
        // readable anyway. Our eventfds are our own (no other process can
        // make them block) and our pipe write ends are non-blocking.
        let _ = unsafe { libc::write(fd, (&one as *const u64).cast(), bytes) };
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

    /// Takes every pending event (a pipe's reader must be non-blocking; up to a bound:
    /// a writer that never stops cannot hold the caller); returns whether
    /// there was any.
    pub fn drain_all(&self) -> bool {
        if let Kind::Event = self.kind {
            // Ours and possibly blocking: one count per read, each looked at first.
            let mut any = false;
            for _ in 0..64 {
                if !self.drain() {
                    break;
                }
                any = true;
            }
            return any;
        }
        let mut buf = [0u8; 512];
        let n = buf.len();
        let mut any = false;
        for _ in 0..16 {
            // SAFETY: reads at most `n` bytes into a live buffer of ours.
            let got = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), n) };
            if got <= 0 {
                break;
            }
            any = true;
        }
        any
    }

    /// Takes one pending event, blocking unless the descriptor is
    /// non-blocking (then `false` when none is pending), exactly as
    /// `ibv_get_cq_event` reads its channel.
    pub fn read(&self) -> bool {
        let mut v = 0u64;
        let want = match self.kind {
            Kind::Event => 8,
            Kind::PipeReader { .. } => 1,
            Kind::PipeWriter => return false,
        };
        // SAFETY: reads `want` (<= 8) bytes into a live u64.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), want) };
        n == want as isize
    }

    /// Waits until readable or `timeout` passes; returns whether readable.
    pub fn wait(&self, timeout: Duration) -> bool {
        let mut p = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one live pollfd, count 1.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        n > 0 && p.revents & libc::POLLIN != 0
    }
}

fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: F_GETFL/F_SETFL on a descriptor we own; no memory passed.
    unsafe {
        let fl = check(libc::fcntl(fd.as_raw_fd(), libc::F_GETFL))?;
        check(libc::fcntl(
            fd.as_raw_fd(),
            libc::F_SETFL,
            fl | libc::O_NONBLOCK,
        ))?;
    }
    Ok(())
}

impl std::os::fd::AsFd for EventFd {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl From<EventFd> for OwnedFd {
    fn from(e: EventFd) -> OwnedFd {
        e.fd
    }
}

/// An epoll set an engine lane sleeps on: readable when any of its
/// members is. Members are registered under a token the caller chooses
/// (never a descriptor number, which may be reused once closed).
#[derive(Debug)]
pub struct WaitSet(OwnedFd);

impl WaitSet {
    /// An empty set.
    pub fn new() -> io::Result<WaitSet> {
        // SAFETY: plain syscall; the result is checked.
        let fd = check(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: a fresh descriptor we own.
        Ok(WaitSet(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Watches `fd` for readability under `token`.
    pub fn add(&self, fd: std::os::fd::BorrowedFd<'_>, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: token,
        };
        // SAFETY: a live epoll_event for the call; both descriptors open.
        check(unsafe {
            libc::epoll_ctl(
                self.0.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                fd.as_raw_fd(),
                &mut ev,
            )
        })?;
        Ok(())
    }

    /// Stops watching `fd` (before it is closed).
    pub fn remove(&self, fd: std::os::fd::BorrowedFd<'_>) {
        // SAFETY: EPOLL_CTL_DEL ignores the event argument; both open.
        let _ = unsafe {
            libc::epoll_ctl(
                self.0.as_raw_fd(),
                libc::EPOLL_CTL_DEL,
                fd.as_raw_fd(),
                std::ptr::null_mut(),
            )
        };
    }

    /// The tokens of members readable now (never waits), into `out`.
    pub fn ready(&self, out: &mut Vec<u64>) {
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 64];
        // SAFETY: `evs` is a live array of 64 events for the call.
        let n = unsafe { libc::epoll_wait(self.0.as_raw_fd(), evs.as_mut_ptr(), 64, 0) };
        for e in evs.iter().take(n.max(0) as usize) {
            out.push(e.u64);
        }
    }
}

impl std::os::fd::AsFd for WaitSet {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// A one-shot timer on the monotonic clock whose descriptor is readable
/// once it fired: an engine lane waits on it for the end of a polling
/// thread's claim, which that thread pushes forward while it polls (one
/// system call every few milliseconds, no wake-up of the engine).
#[derive(Debug)]
pub struct TimerFd(OwnedFd);

impl TimerFd {
    /// A disarmed, non-blocking, close-on-exec timer.
    pub fn new() -> io::Result<TimerFd> {
        // SAFETY: plain syscall with constant arguments; the result is checked.
        let fd = check(unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        })?;
        // SAFETY: a fresh descriptor we own.
        Ok(TimerFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Fires once, `after` from now (re-arming replaces the earlier time).
    pub fn arm(&self, after: Duration) {
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: after.as_secs() as libc::time_t,
                // A zero value would disarm: at least a nanosecond.
                tv_nsec: (after.subsec_nanos().max(u32::from(after.as_secs() == 0)))
                    as libc::c_long,
            },
        };
        // SAFETY: a live itimerspec for the call; no old value asked for.
        let _ =
            unsafe { libc::timerfd_settime(self.0.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
    }

    /// Takes the expirations counted so far (never blocks).
    pub fn drain(&self) {
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into a live u64; the descriptor is non-blocking.
        let _ = unsafe { libc::read(self.0.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }
}

impl std::os::fd::AsFd for TimerFd {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.0.as_fd()
    }
}
