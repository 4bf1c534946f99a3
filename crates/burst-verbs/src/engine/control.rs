//! Control requests a lane's core runs (create, modify, destroy, query) and how it runs them.

use crossbeam::channel::Sender;

use burst_mem::Pd;
use burst_transport::{QpAttr, QpConfig, VerbsError, WcOpcode, WcStatus, WorkCompletion};
use burst_wire::Qpn;

use crate::{Device, DeviceCounters, QpInit, SrqId};

/// Control operations, answered on a reply channel (the slow path).
pub(crate) enum Control {
    CreateQp {
        init: QpInit,
        reply: Sender<Result<(Qpn, QpConfig), VerbsError>>,
    },
    DestroyQp {
        qpn: Qpn,
        reply: Sender<Result<(), VerbsError>>,
    },
    CreateSrq {
        pd: Pd,
        max_wr: u32,
        max_sge: u32,
        reply: Sender<Result<SrqId, VerbsError>>,
    },
    DestroySrq {
        srq: SrqId,
        reply: Sender<Result<(), VerbsError>>,
    },
    ModifySrq {
        srq: SrqId,
        max_wr: Option<u32>,
        limit: Option<u32>,
        reply: Sender<Result<(), VerbsError>>,
    },
    QueryQp {
        qpn: Qpn,
        reply: Sender<Option<(burst_transport::QpState, burst_transport::QpConfig)>>,
    },
    CreateAh {
        index: u32,
        owner: u32,
        gid: [u8; 16],
        sgid_index: Option<u8>,
        reply: Sender<Result<u32, VerbsError>>,
    },
    DestroyAh {
        index: u32,
        reply: Sender<()>,
    },
    /// The GID table (`ibv_query_gid`).
    Gids {
        reply: Sender<Vec<Option<std::net::IpAddr>>>,
    },
    /// `ibv_attach_mcast` (`attach`) or `ibv_detach_mcast`.
    Multicast {
        qpn: Qpn,
        mgid: [u8; 16],
        attach: bool,
        reply: Sender<Result<(), VerbsError>>,
    },
    ModifyQp {
        qpn: Qpn,
        attr: QpAttr,
        reply: Sender<Result<(), VerbsError>>,
    },
    /// Several transitions in one call; stops at the first refused
    /// (its index and error).
    ModifyQpSteps {
        qpn: Qpn,
        attrs: Vec<QpAttr>,
        reply: Sender<Result<(), (usize, VerbsError)>>,
    },
    Counters {
        reply: Sender<DeviceCounters>,
    },
    QpCounters {
        qpn: Qpn,
        reply: Sender<Option<burst_transport::Counters>>,
    },
    Congestion {
        reply: Sender<crate::CongestionReport>,
    },
    DebugPanicFor {
        qpn: Option<Qpn>,
        reply: Sender<()>,
    },
}

pub(super) fn refused(wr_id: u64, opcode: WcOpcode, qpn: Qpn) -> WorkCompletion {
    WorkCompletion::of(qpn, wr_id, WcStatus::LocQpOpErr, opcode)
}

/// Runs a control request; returns the QP a modify touched (its queues may
/// have been emptied without completions: RESET discards them).
pub(super) fn control(dev: &mut Device, c: Control) -> Option<Qpn> {
    let touched = match &c {
        Control::ModifyQp { qpn, .. } | Control::ModifyQpSteps { qpn, .. } => Some(*qpn),
        _ => None,
    };
    match c {
        Control::CreateQp { init, reply } => {
            let qp = dev.create_qp_with(&init).and_then(|qpn| {
                let (_, cfg) = dev.query_qp(qpn).ok_or(VerbsError::BadWr("no such QP"))?;
                Ok((qpn, cfg))
            });
            let _ = reply.send(qp);
        }
        Control::DestroyQp { qpn, reply } => {
            let _ = reply.send(dev.destroy_qp(qpn));
        }
        Control::CreateSrq {
            pd,
            max_wr,
            max_sge,
            reply,
        } => {
            let _ = reply.send(dev.create_srq(pd, max_wr, max_sge));
        }
        Control::DestroySrq { srq, reply } => {
            let _ = reply.send(dev.destroy_srq(srq));
        }
        Control::ModifySrq {
            srq,
            max_wr,
            limit,
            reply,
        } => {
            let _ = reply.send(dev.modify_srq(srq, max_wr, limit));
        }
        Control::QueryQp { qpn, reply } => {
            let _ = reply.send(dev.query_qp(qpn));
        }
        Control::CreateAh {
            index,
            owner,
            gid,
            sgid_index,
            reply,
        } => {
            let _ = reply.send(dev.create_ah(index, owner, gid, sgid_index));
        }
        Control::DestroyAh { index, reply } => {
            dev.destroy_ah(index);
            let _ = reply.send(());
        }
        Control::Gids { reply } => {
            let _ = reply.send(dev.gid_table());
        }
        Control::Multicast {
            qpn,
            mgid,
            attach,
            reply,
        } => {
            let _ = reply.send(if attach {
                dev.attach_mcast(qpn, mgid)
            } else {
                dev.detach_mcast(qpn, mgid)
            });
        }
        Control::ModifyQp { qpn, attr, reply } => {
            let _ = reply.send(dev.modify_qp(qpn, &attr));
        }
        Control::ModifyQpSteps { qpn, attrs, reply } => {
            let r = attrs
                .iter()
                .enumerate()
                .try_for_each(|(i, a)| dev.modify_qp(qpn, a).map_err(|e| (i, e)));
            let _ = reply.send(r);
        }
        Control::Counters { reply } => {
            let _ = reply.send(dev.counters());
        }
        Control::QpCounters { qpn, reply } => {
            let _ = reply.send(dev.qp_counters(qpn));
        }
        Control::Congestion { reply } => {
            let _ = reply.send(dev.congestion_state());
        }
        Control::DebugPanicFor { qpn, reply } => {
            dev.debug_panic_on_packet_for(qpn);
            let _ = reply.send(());
        }
    }
    touched
}
