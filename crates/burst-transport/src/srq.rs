//! Shared receive queues.

use crate::recvq::RecvQueue;
use crate::{RecvWr, VerbsError};

/// A shared receive queue (`ibv_srq`): receive WQEs that any QP created
/// with it consumes, in posting order, as requests arrive.
///
/// Like a [`crate::Qp`] it is plain state: the caller owns it and lends it
/// to [`crate::Qp::handle_packet_srq`] for each packet of a QP attached to
/// it. QPs on an SRQ advertise no credits (AETH credit code 0x1F, as the
/// spec requires) and refuse `post_recv`.
///
/// ```
/// use burst_transport::{RecvWr, Sge, Srq, sim::{Access, SimMemory}};
/// let mut mem = SimMemory::default();
/// let pd = 1;
/// let (key, addr) = mem.register(pd, 4096, Access::ALL);
/// let mut srq = Srq::new(pd, 16, 1);
/// srq.set_limit(2).unwrap();
/// let sge = Sge { addr, length: 64, lkey: key };
/// srq.post_recv(RecvWr { wr_id: 7, sg_list: [sge].into() }).unwrap();
/// assert_eq!(srq.len(), 1);
/// // More SGEs than the SRQ was created with are refused at post time.
/// assert!(srq.post_recv(RecvWr { wr_id: 8, sg_list: [sge, sge].into() }).is_err());
/// ```
#[derive(Debug)]
pub struct Srq {
    pd: u32,
    max_wr: u32,
    max_sge: u32,
    pub(crate) queue: RecvQueue,
    /// `srq_limit`: when armed (non-zero) and the queue falls below it, one
    /// `IBV_EVENT_SRQ_LIMIT_REACHED` fires and the limit disarms.
    limit: u32,
    limit_event: bool,
}

impl Srq {
    /// An empty SRQ in protection domain `pd`.
    pub fn new(pd: u32, max_wr: u32, max_sge: u32) -> Srq {
        Srq {
            pd,
            max_wr,
            max_sge,
            queue: RecvQueue::default(),
            limit: 0,
            limit_event: false,
        }
    }

    /// The protection domain it was created in.
    pub fn pd(&self) -> u32 {
        self.pd
    }

    /// Receive WQEs waiting.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// No receive WQE waiting.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Depth.
    pub fn max_wr(&self) -> u32 {
        self.max_wr
    }

    /// SGEs per WQE.
    pub fn max_sge(&self) -> u32 {
        self.max_sge
    }

    /// The armed limit (0 = not armed).
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// `ibv_post_srq_recv`: only the depth and the SGE count are checked
    /// now. The SGEs' keys are checked when a message lands in them, as
    /// for a QP's own receive queue and as RXE does: a bad one completes
    /// that receive on the QP that took it with LOC_PROT_ERR (and, on RC,
    /// NAKs the sender with a remote operational error).
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), VerbsError> {
        if self.queue.len() >= self.max_wr as usize {
            return Err(VerbsError::QueueFull);
        }
        if wr.sg_list.len() > self.max_sge as usize {
            return Err(VerbsError::TooManySge);
        }
        self.queue.push_back(wr);
        Ok(())
    }

    /// `ibv_modify_srq` with `IBV_SRQ_LIMIT`: arms the limit event
    /// (`EINVAL` beyond the depth).
    pub fn set_limit(&mut self, limit: u32) -> Result<(), VerbsError> {
        if limit > self.max_wr {
            return Err(VerbsError::InvalidValue("srq_limit"));
        }
        self.limit = limit;
        Ok(())
    }

    /// `ibv_modify_srq` with `IBV_SRQ_MAX_WR`: resizes (never below what is queued).
    pub fn resize(&mut self, max_wr: u32) -> Result<(), VerbsError> {
        if (max_wr as usize) < self.queue.len() || max_wr == 0 {
            return Err(VerbsError::InvalidValue("max_wr"));
        }
        self.max_wr = max_wr;
        Ok(())
    }

    /// Takes the pending limit-reached event, if one fired.
    pub fn take_limit_event(&mut self) -> bool {
        std::mem::take(&mut self.limit_event)
    }

    /// After a QP consumed WQEs: fire the limit event once if armed and crossed.
    pub(crate) fn check_limit(&mut self) {
        if self.limit > 0 && (self.queue.len() as u32) < self.limit {
            self.limit = 0;
            self.limit_event = true;
        }
    }
}
