//! Typed handles: a QP, SRQ or CQ bound to its context, without lookups.

use std::sync::Arc;

use burst_transport::{QpAttr, QpConfig, RecvWr, SendWr, VerbsError, WorkCompletion};
use burst_wire::Qpn;

use super::*;
use crate::SrqId;

/// A queue pair (typed handle): posts go straight into its rings.
#[derive(Clone)]
pub struct QueuePair {
    pub(super) rings: Arc<QpRings>,
    pub(super) ctx: Context,
}

impl std::fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QueuePair({:#x})", self.rings.qpn.value())
    }
}

impl QueuePair {
    /// Its QP number.
    pub fn qpn(&self) -> Qpn {
        self.rings.qpn
    }

    /// `ibv_post_send` ([`Context::post_send`]).
    pub fn post_send(&self, wr: &SendWr) -> Result<(), PostError> {
        self.ctx.post_send_to(&self.rings, wr)
    }

    /// One WR of an `ibv_post_send` list with more to follow: taken now
    /// (checked as [`QueuePair::post_send`] checks it) and sent with the
    /// list's last, which is posted with [`QueuePair::post_send`], as an
    /// RNIC takes a whole list at one doorbell. A list refused part-way
    /// ends with [`QueuePair::send_posted`].
    ///
    /// ```no_run
    /// # fn f(qp: &burst_verbs::engine::QueuePair, list: &[burst_verbs::SendWr]) {
    /// let Some((last, first)) = list.split_last() else { return };
    /// for wr in first {
    ///     if qp.post_send_more(wr).is_err() {
    ///         qp.send_posted();
    ///         return;
    ///     }
    /// }
    /// qp.post_send(last).unwrap();
    /// # }
    /// ```
    pub fn post_send_more(&self, wr: &SendWr) -> Result<(), PostError> {
        self.ctx.post_send_in_list(&self.rings, wr, true)
    }

    /// Sends what [`QueuePair::post_send_more`] left waiting for a list's
    /// last WR (the list stopped short: a WR refused).
    pub fn send_posted(&self) {
        self.ctx.send_posted(self.rings.lane);
    }

    /// `ibv_post_recv` ([`Context::post_recv`]).
    pub fn post_recv(&self, wr: &RecvWr) -> Result<(), PostError> {
        self.ctx.post_recv_to(&self.rings, wr)
    }

    /// The context it belongs to.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// What the QP was created with (sizes the posts are checked against).
    pub fn config(&self) -> &QpConfig {
        &self.rings.cfg
    }

    /// `ibv_modify_qp`.
    pub fn modify(&self, attr: &QpAttr) -> Result<(), CreateError> {
        self.ctx
            .modify_qp(self.rings.qpn, attr)?
            .map_err(CreateError::Verbs)
    }

    /// Several transitions in one trip ([`Context::modify_qp_steps`]).
    pub fn modify_steps(
        &self,
        attrs: &[QpAttr],
    ) -> Result<Result<(), (usize, VerbsError)>, PostError> {
        self.ctx.modify_qp_steps(self.rings.qpn, attrs)
    }

    /// Takes this RC QP from RESET to RTS towards `peer`
    /// ([`Context::connect_rc`]).
    pub fn connect_rc(&self, peer: &crate::RcPeer, p: &crate::RcParams) -> Result<(), CreateError> {
        self.ctx.connect_rc(self.rings.qpn, peer, p)
    }
}

/// A shared receive queue (typed handle).
#[derive(Clone)]
pub struct SharedReceiveQueue {
    pub(super) id: SrqId,
    pub(super) ring: Arc<SrqRing>,
    pub(super) ctx: Context,
}

impl std::fmt::Debug for SharedReceiveQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedReceiveQueue({})", self.id.0)
    }
}

impl SharedReceiveQueue {
    /// Its handle, for [`crate::QpInit::srq`].
    pub fn id(&self) -> SrqId {
        self.id
    }

    /// `ibv_post_srq_recv`: checked now (SGE count), then into the ring.
    pub fn post_recv(&self, wr: &RecvWr) -> Result<(), PostError> {
        if wr.sg_list.len() > self.ring.max_sge as usize {
            return Err(PostError::Refused(VerbsError::TooManySge));
        }
        self.ring.ring.push(*wr).map_err(|_| PostError::Full)?;
        // SRQs live on lane 0.
        self.ctx.shared.doorbells[0].ring(SRQ_DOORBELL | self.id.0);
        // No step: see `Context::post_recv`.
        Ok(())
    }
}

/// A completion queue (typed handle): polls its ring directly.
#[derive(Clone)]
pub struct CompletionQueue {
    pub(super) id: CqId,
    pub(super) cq: Arc<Cq>,
    pub(super) ctx: Context,
}

impl std::fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CompletionQueue({})", self.id.0)
    }
}

impl CompletionQueue {
    /// Its handle.
    pub fn id(&self) -> CqId {
        self.id
    }

    /// `ibv_poll_cq` for one completion (never blocks; steps the data
    /// plane once when the ring is empty, unless this is the first empty
    /// poll since the CQ was armed: see `Cq::poll_may_skip_step`).
    pub fn poll(&self) -> Option<WorkCompletion> {
        self.ctx.poll_one(&self.cq)
    }

    /// The next completion the ring already holds, never stepping the data
    /// plane: the rest of a batch once a [`CompletionQueue::poll`] found
    /// some. (Polling an emptied ring steps the lane, and that step would
    /// send the ACK of the message just taken alone, a system call before
    /// the reply the application is about to post and could carry it.)
    pub fn poll_held(&self) -> Option<WorkCompletion> {
        if self.is_empty() {
            return None;
        }
        self.poll()
    }

    /// Completions waiting.
    pub fn len(&self) -> usize {
        self.cq.ring.len()
    }

    /// Completions waiting once the data plane has run (what a resize must
    /// leave room for: `ibv_resize_cq` below it fails, as on RXE).
    pub fn settled_len(&self) -> usize {
        self.ctx.plane.settle(&self.ctx);
        self.cq.ring.len()
    }

    /// The device failed for good (a daemon client whose burstd died).
    pub fn device_failed(&self) -> bool {
        self.ctx.device_failed()
    }

    /// No completion waiting.
    pub fn is_empty(&self) -> bool {
        self.cq.ring.is_empty()
    }
}
