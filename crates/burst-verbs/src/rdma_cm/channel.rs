//! Event channels and the events on them.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, Mutex};

use super::CmId;
use crate::eventfd::EventFd;

/// What happened to an id (`enum rdma_cm_event_type`; [`value`](Self::value)
/// is rdma-core's number).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CmEventKind {
    /// `resolve_addr` found the device and the peer.
    AddrResolved,
    /// `resolve_addr` failed (status: the negative errno).
    AddrError,
    /// `resolve_route` is done.
    RouteResolved,
    /// A connection request on a listener: [`CmEvent::id`] is the new id.
    ConnectRequest,
    /// The peer accepted and the id has no QP: `establish` is next.
    ConnectResponse,
    /// The connection could not be set up (status: the negative errno).
    ConnectError,
    /// The peer did not answer, or SIDR refused (status says which).
    Unreachable,
    /// The peer rejected (status: the CM's reason).
    Rejected,
    /// The connection (or the UD peer's address) is ready.
    Established,
    /// The peer or this side disconnected.
    Disconnected,
    /// `join_multicast` is done: the group's address vector, QPN
    /// 0xFFFFFF and Q_Key in the UD parameters.
    MulticastJoin,
    /// A join failed (status: the negative errno).
    MulticastError,
}

impl CmEventKind {
    /// rdma-core's `enum rdma_cm_event_type` value.
    pub fn value(self) -> u32 {
        match self {
            CmEventKind::AddrResolved => 0,
            CmEventKind::AddrError => 1,
            CmEventKind::RouteResolved => 2,
            CmEventKind::ConnectRequest => 4,
            CmEventKind::ConnectResponse => 5,
            CmEventKind::ConnectError => 6,
            CmEventKind::Unreachable => 7,
            CmEventKind::Rejected => 8,
            CmEventKind::Established => 9,
            CmEventKind::Disconnected => 10,
            CmEventKind::MulticastJoin => 12,
            CmEventKind::MulticastError => 13,
        }
    }
}

/// `struct rdma_conn_param`: what a connected id asks for or was given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnParam {
    /// Private data (at most what the CM message carries after rdma_cm's
    /// header: 56 bytes in a REQ, 196 in a REP, 148 in a REJ).
    pub private_data: Vec<u8>,
    /// READs and atomics the peer may have outstanding at us (0xff: the
    /// device's maximum).
    pub responder_resources: u8,
    /// READs and atomics we may have outstanding at the peer (0xff: the
    /// device's maximum).
    pub initiator_depth: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// Transport retries (0..=7).
    pub retry_count: u8,
    /// RNR retries (0..=7, 7 = forever).
    pub rnr_retry_count: u8,
    /// The QP uses a shared receive queue.
    pub srq: bool,
    /// The QP number when no QP is attached to the id (0: none); in an
    /// event, the peer's.
    pub qp_num: u32,
}

/// `struct rdma_ud_param`: how to reach a UD peer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UdParam {
    /// The peer's private data.
    pub private_data: Vec<u8>,
    /// The address vector towards the peer.
    pub av: super::AddressVector,
    /// The peer's QP number.
    pub qp_num: u32,
    /// The Q_Key its QP takes.
    pub qkey: u32,
}

/// An event's parameters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum EventParam {
    /// None.
    #[default]
    None,
    /// A connected id's (requests, replies, rejections).
    Conn(ConnParam),
    /// A UD id's (SIDR requests and replies).
    Ud(UdParam),
}

/// An event on an id (`struct rdma_cm_event`).
#[derive(Debug, Clone)]
pub struct CmEvent {
    /// What happened.
    pub kind: CmEventKind,
    /// 0, a negative errno, or the CM's reason or SIDR status.
    pub status: i32,
    /// The id it happened to (a new one for [`CmEventKind::ConnectRequest`]).
    pub id: CmId,
    /// The listener a request arrived on.
    pub listen_id: Option<CmId>,
    /// The event's parameters.
    pub param: EventParam,
}

/// Where ids' events queue (`struct rdma_event_channel`): its descriptor
/// is readable while events wait, one count per event. Cheap to clone.
#[derive(Clone)]
pub struct EventChannel {
    inner: Arc<Inner>,
}

struct Inner {
    efd: EventFd,
    q: Mutex<VecDeque<CmEvent>>,
}

impl std::fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventChannel")
            .field("fd", &self.inner.efd.as_fd())
            .finish_non_exhaustive()
    }
}

impl PartialEq for EventChannel {
    fn eq(&self, o: &EventChannel) -> bool {
        Arc::ptr_eq(&self.inner, &o.inner)
    }
}

impl Eq for EventChannel {}

impl EventChannel {
    /// `rdma_create_event_channel`.
    pub fn new() -> io::Result<EventChannel> {
        Ok(EventChannel {
            inner: Arc::new(Inner {
                efd: EventFd::new()?,
                q: Mutex::new(VecDeque::new()),
            }),
        })
    }

    /// `rdma_get_cm_event`: the next event, waiting for one unless the
    /// descriptor was made non-blocking (then `WouldBlock`); a signal
    /// interrupts the wait with `Interrupted`, as librdmacm's read does.
    pub fn get_event(&self) -> io::Result<CmEvent> {
        loop {
            if !self.inner.efd.read() {
                let e = io::Error::last_os_error();
                return Err(match e.raw_os_error() {
                    Some(0) | None => super::errno(libc::EAGAIN),
                    _ => e,
                });
            }
            // One count per queued event; a count without an event (one
            // discarded with its id) is skipped.
            if let Some(ev) = self.queue().pop_front() {
                return Ok(ev);
            }
        }
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, VecDeque<CmEvent>> {
        self.inner.q.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn post(&self, ev: CmEvent) {
        self.queue().push_back(ev);
        self.inner.efd.signal();
    }

    /// Drops the queued events of `id` (it is destroyed).
    pub(super) fn discard(&self, id: &CmId) {
        let mut q = self.queue();
        let before = q.len();
        q.retain(|e| e.id != *id);
        for _ in q.len()..before {
            self.inner.efd.drain();
        }
    }

    /// Moves the queued events of `id` to `to`.
    pub(super) fn move_events(&self, id: &CmId, to: &EventChannel) {
        if self == to {
            return;
        }
        let moved: Vec<CmEvent> = {
            let mut q = self.queue();
            let (m, keep): (Vec<_>, Vec<_>) = q.drain(..).partition(|e| e.id == *id);
            q.extend(keep);
            m
        };
        for e in moved {
            self.inner.efd.drain();
            to.post(e);
        }
    }
}

impl AsFd for EventChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.efd.as_fd()
    }
}
