//! The connection manager of a device: burst-cm's state machine driven
//! over the engine's QP1 by a thread of its own (MADs in, timers), with
//! every event handed to one sink on that thread, in order.
//!
//! The application side (librdmacm's calls) reaches the state machine
//! through [`CmService::with`]; what a call makes the CM send leaves at
//! once, and the events it causes reach the sink from the service thread
//! (so a sink may itself call [`CmService::with`]).
//!
//! With an embedded engine the MADs go through the engine's QP1 directly;
//! a burstd client's go through a socket to burstd, which owns QP1 and
//! routes each MAD to the client whose connection or listen it is for.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use burst_cm::{Cm, CmConfig, CmEvent};

use crate::engine::Context;
use crate::eventfd::EventFd;
use crate::gsi::GsiMad;

/// What receives the CM's events (on the service thread).
pub type EventSink = Box<dyn FnMut(CmEvent) + Send>;

/// Where the MADs go: the engine's own QP1, or burstd's through a socket.
enum Port1 {
    Local(Context, Arc<crate::gsi::Gsi>),
    /// The socket, and whether burstd closed it.
    Daemon(Context, std::os::fd::OwnedFd, std::sync::atomic::AtomicBool),
}

impl Port1 {
    fn send(&self, m: GsiMad) -> bool {
        match self {
            Port1::Local(ctx, _) => ctx.gsi_send(m),
            Port1::Daemon(_, sock, _) => {
                crate::protocol::send_mad(std::os::fd::AsFd::as_fd(sock), &m)
            }
        }
    }

    fn recv(&self) -> Option<GsiMad> {
        match self {
            Port1::Local(_, gsi) => gsi.recv(),
            Port1::Daemon(_, sock, closed) => loop {
                match crate::protocol::recv_mad(std::os::fd::AsFd::as_fd(sock)) {
                    crate::protocol::MadRecv::Mad(m) => return Some(m),
                    crate::protocol::MadRecv::Bad => continue,
                    crate::protocol::MadRecv::Empty => return None,
                    crate::protocol::MadRecv::Closed => {
                        closed.store(true, Ordering::Relaxed);
                        return None;
                    }
                }
            },
        }
    }

    fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match self {
            Port1::Local(_, gsi) => gsi.fd(),
            Port1::Daemon(_, sock, _) => std::os::fd::AsFd::as_fd(sock),
        }
    }

    /// burstd hung up: nothing will ever arrive (the client's watcher
    /// reports the device fatal).
    fn closed(&self) -> bool {
        matches!(self, Port1::Daemon(_, _, c) if c.load(Ordering::Relaxed))
    }
}

struct Inner {
    cm: Mutex<Cm>,
    port: Port1,
    /// Signalled when a call changed the CM's deadlines or queued events.
    wake: EventFd,
    stop: AtomicBool,
    start: Instant,
}

impl Inner {
    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// Sends what the CM queued (under its lock, so MADs leave in order).
    fn flush(&self, cm: &mut Cm) {
        while let Some(t) = cm.poll_transmit() {
            if !self.port.send(GsiMad {
                peer: t.peer,
                mad: t.mad,
            }) {
                tracing::debug!(peer = %t.peer, "CM MAD dropped: QP1's queue is full");
            }
        }
    }
}

/// A device's connection manager (see the module documentation).
pub struct CmService {
    inner: Arc<Inner>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for CmService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmService").finish_non_exhaustive()
    }
}

impl CmService {
    /// Starts the CM of `ctx`'s device; `sink` gets every event.
    pub fn start(ctx: &Context, sink: EventSink) -> std::io::Result<CmService> {
        CmService::start_listening(ctx, sink, None)
    }

    /// [`CmService::start`], listening on `service_id` before it takes its
    /// first MAD: the device may have received a REQ for it since it
    /// opened (a peer that retried while this process started), which a
    /// CM without the listener would reject.
    pub fn start_listening(
        ctx: &Context,
        sink: EventSink,
        service_id: Option<u64>,
    ) -> std::io::Result<CmService> {
        let port = match ctx.gsi() {
            Some(gsi) => Port1::Local(ctx.clone(), Arc::clone(gsi)),
            None => {
                let (ours, theirs) = crate::protocol::mad_socketpair()?;
                let fd = std::os::fd::AsFd::as_fd(&theirs);
                match ctx.daemon_request(&crate::protocol::Request::CmAttach, &[fd]) {
                    Ok((crate::protocol::Reply::Done, _)) => {
                        Port1::Daemon(ctx.clone(), ours, AtomicBool::new(false))
                    }
                    Ok((crate::protocol::Reply::Error { message, .. }, _)) => {
                        return Err(std::io::Error::other(format!("burstd: {message}")))
                    }
                    _ => return Err(std::io::Error::other("burstd did not take the CM socket")),
                }
            }
        };
        let mut seed = [0u8; 8];
        // A random seed: communication IDs must not repeat across runs (a
        // failure leaves the time as the seed).
        if getrandom::fill(&mut seed).is_err() {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            seed = (u64::from(std::process::id()) ^ t).to_ne_bytes();
        }
        let guid = ctx.query_device().node_guid;
        let inner = Arc::new(Inner {
            cm: Mutex::new(Cm::new(CmConfig::new(guid, u64::from_ne_bytes(seed)))),
            port,
            wake: EventFd::new()?,
            stop: AtomicBool::new(false),
            start: Instant::now(),
        });
        let mut svc = CmService {
            inner,
            thread: None,
        };
        if let Some(id) = service_id {
            svc.listen(id)?;
        }
        let run = Arc::clone(&svc.inner);
        svc.thread = Some(
            std::thread::Builder::new()
                .name("burst-cm".into())
                .spawn(move || serve(&run, sink))?,
        );
        Ok(svc)
    }

    /// Runs `f` on the state machine with the current time; sends what it
    /// queued and lets the service thread deliver its events.
    pub fn with<R>(&self, f: impl FnOnce(&mut Cm, u64) -> R) -> R {
        let mut cm = self.inner.cm.lock().unwrap_or_else(|e| e.into_inner());
        let now = self.inner.now();
        // Keeps the CM's clock current for calls that take no time.
        cm.handle_timeout(now);
        let before = cm.poll_timeout();
        let r = f(&mut cm, now);
        self.inner.flush(&mut cm);
        // The service thread sleeps until the earliest deadline it saw:
        // wake it only for an earlier one or for events to deliver, not on
        // every call (a wake-up per connect was a context switch each).
        let after = cm.poll_timeout();
        let wake = cm.has_events() || after.is_some_and(|a| before.is_none_or(|b| a < b));
        drop(cm);
        if wake {
            self.inner.wake.signal();
        }
        r
    }

    /// Accepts REQs and SIDR_REQs for `service_id` (again: no error). A
    /// burstd client asks burstd to route them here first; EADDRINUSE when
    /// another application listens on it.
    pub fn listen(&self, service_id: u64) -> std::io::Result<()> {
        if let Port1::Daemon(ctx, _, _) = &self.inner.port {
            let req = crate::protocol::Request::CmListen {
                service_id,
                listen: true,
            };
            match ctx.daemon_request(&req, &[]) {
                Ok((crate::protocol::Reply::Done, _)) => {}
                Ok((crate::protocol::Reply::Error { errno, message, .. }, _)) => {
                    return Err(std::io::Error::new(
                        std::io::Error::from_raw_os_error(errno).kind(),
                        format!("burstd: {message}"),
                    ))
                }
                _ => return Err(std::io::Error::other("burstd did not answer the listen")),
            }
        }
        // Already listening (another address of this process): fine.
        let _ = self.with(|cm, _| cm.listen(service_id));
        Ok(())
    }

    /// Stops accepting requests for `service_id`.
    pub fn unlisten(&self, service_id: u64) {
        self.with(|cm, _| cm.unlisten(service_id));
        if let Port1::Daemon(ctx, _, _) = &self.inner.port {
            let req = crate::protocol::Request::CmListen {
                service_id,
                listen: false,
            };
            let _ = ctx.daemon_request(&req, &[]);
        }
    }

    /// Waits, at most `within`, for the DREPs of this CM's unanswered
    /// DREQs, sending those again at growing intervals (10 ms, then
    /// doubling); returns how many were still unanswered. The kernel's CM
    /// outlives the process that disconnected; an embedded one does not,
    /// and a process that exits right after `rdma_disconnect` (rping's
    /// client) would leave a peer whose DREQ was lost waiting forever.
    /// Not on any data path: a process's (or the service's) end.
    pub fn finish_disconnects(&self, within: Duration) -> usize {
        let deadline = Instant::now() + within;
        let mut gap = Duration::from_millis(10);
        let mut resend_at = Instant::now() + gap;
        loop {
            let pending = self.with(|cm, _| cm.disconnects_pending());
            let now = Instant::now();
            if pending == 0 || now >= deadline || self.inner.port.closed() {
                return pending;
            }
            if now >= resend_at {
                self.with(|cm, _| cm.resend_disconnects());
                gap *= 2;
                resend_at = now + gap;
            }
            // The DREP arrives on the service thread; look again shortly.
            std::thread::sleep(Duration::from_millis(1).min(deadline - now));
        }
    }

    /// Releases every connection this CM holds (DREQs for established
    /// ones, REJs for half-made ones), as the kernel does when a process's
    /// RDMA CM file closes; [`CmService::finish_disconnects`] then waits
    /// for the DREPs. What a process that ends, or a service dropped with
    /// connections still up, does before its CM goes.
    pub fn release_all(&self) {
        self.with(|cm, now| cm.release_all(now));
    }

    /// What the CM counted.
    pub fn counters(&self) -> burst_cm::CmCounters {
        self.with(|cm, _| cm.counters())
    }
}

/// How long a CM that ends waits for the answers to its DREQs
/// ([`CmService::finish_disconnects`]): a DREQ and four repeats, a few
/// of a loaded host's round trips each.
pub const DISCONNECT_LINGER: Duration = Duration::from_millis(500);

impl Drop for CmService {
    fn drop(&mut self) {
        self.release_all();
        self.finish_disconnects(DISCONNECT_LINGER);
        self.inner.stop.store(true, Ordering::Release);
        self.inner.wake.signal();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.log_counters("closing");
    }
}

impl CmService {
    /// Logs what the CM counted (target `burst::counters`, info), if it
    /// handled anything: what connection setup cost beside the device's
    /// own line (REQs and replies sent again are what a storm of
    /// connects shows).
    pub fn log_counters(&self, when: &str) {
        if let Some(line) = self.counters_line(when) {
            tracing::info!(target: "burst::counters", "{line}");
        }
    }

    /// [`CmService::log_counters`]'s line, `None` when the CM handled
    /// nothing.
    pub fn counters_line(&self, when: &str) -> Option<String> {
        let c = self.counters();
        (c.sent > 0 || c.rcvd > 0).then(|| {
            format!(
                "CM {when}: {} MADs sent ({} retransmissions), {} received ({} duplicates, {} unknown, {} malformed), {} REJs sent, {} received, {} exchanges timed out, {} REQs deferred",
                c.sent, c.retransmits, c.rcvd, c.duplicates, c.unknown, c.malformed,
                c.rejects_sent, c.rejects_rcvd, c.timeouts, c.deferred
            )
        })
    }
}

/// The service thread: MADs from QP1, timers, events to the sink.
fn serve(inner: &Inner, mut sink: EventSink) {
    let mut events = Vec::new();
    while !inner.stop.load(Ordering::Acquire) {
        let wait = {
            let mut cm = inner.cm.lock().unwrap_or_else(|e| e.into_inner());
            let now = inner.now();
            while let Some(m) = inner.port.recv() {
                cm.handle_mad(now, m.peer, &m.mad);
            }
            cm.handle_timeout(now);
            inner.flush(&mut cm);
            while let Some(e) = cm.poll_event() {
                events.push(e);
            }
            cm.poll_timeout()
                .map(|t| Duration::from_nanos(t.saturating_sub(now)))
        };
        if !events.is_empty() {
            for e in events.drain(..) {
                sink(e);
            }
            // The sink may have called the CM: look again before waiting.
            continue;
        }
        // Waits for a MAD, a call, or the next deadline (at most 1 s, so a
        // stop is seen).
        let wait = wait
            .unwrap_or(Duration::from_secs(1))
            .min(Duration::from_secs(1));
        if inner.port.closed() {
            // A hung-up socket is always readable: wait on the calls alone.
            let _ = inner.wake.wait(wait);
        } else {
            crate::thread::poll_two(inner.port.fd(), std::os::fd::AsFd::as_fd(&inner.wake), wait);
        }
        while inner.wake.drain() {}
    }
}
