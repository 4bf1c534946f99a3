//! Asynchronous events (`ibv_get_async_event`): the device's queue and a daemon client's ring.

use std::sync::atomic::{AtomicBool, Ordering};

use crossbeam::queue::SegQueue;

use crate::shm::ShmRing;

use crate::AsyncEvent;

/// The asynchronous events of an engine and the descriptor that is readable
/// while some are pending (one count per event, as a completion channel's).
/// A daemon client's events come through `remote`, which the daemon fills
/// before it signals the client's descriptor.
#[derive(Debug)]
pub(super) struct AsyncEvents {
    pub(super) fd: crate::eventfd::EventFd,
    pub(super) queue: SegQueue<AsyncEvent>,
    pub(super) remote: Option<ShmRing<AsyncEvent>>,
    /// Port 1 is down: set by the last [`AsyncEvent::Port`] raised (a
    /// daemon client's, by the last one it read).
    pub(super) port_down: AtomicBool,
}

impl AsyncEvents {
    pub(super) fn new() -> std::io::Result<AsyncEvents> {
        Ok(AsyncEvents {
            fd: crate::eventfd::EventFd::new()?,
            queue: SegQueue::new(),
            remote: None,
            port_down: AtomicBool::new(false),
        })
    }

    pub(super) fn push(&self, ev: AsyncEvent) {
        self.note_port(ev);
        // Queued before the signal, so a reader woken by it finds it.
        self.queue.push(ev);
        self.fd.signal();
    }

    pub(super) fn try_take(&self) -> Option<AsyncEvent> {
        if self.fd.drain() {
            return self.take();
        }
        None
    }

    pub(super) fn read(&self) -> Option<AsyncEvent> {
        if self.fd.read() {
            return self.take();
        }
        None
    }

    pub(super) fn take(&self) -> Option<AsyncEvent> {
        let ev = self
            .queue
            .pop()
            .or_else(|| self.remote.as_ref().and_then(|r| r.pop()));
        if let Some(e) = ev {
            self.note_port(e);
        }
        ev
    }

    pub(super) fn note_port(&self, ev: AsyncEvent) {
        if let AsyncEvent::Port { active } = ev {
            self.port_down.store(!active, Ordering::Relaxed);
        }
    }
}
