//! The QP of an id: what the CM moves through INIT, RTR and RTS, and the
//! attributes it moves it with (`rdma_init_qp_attr`).

use std::io;

use crate::engine::QueuePair;
use crate::{Psn, QpAccess, QpAttr, QpState, QpType, Qpn};

/// The address vector of a connected QP or a UD peer (RoCE: always with a
/// GRH).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AddressVector {
    /// The peer's GID.
    pub dgid: [u8; 16],
    /// Our GID's index in the device's table.
    pub sgid_index: u8,
    /// The GRH hop limit.
    pub hop_limit: u8,
}

/// One transition of an id's QP: the transport's attributes plus, for
/// RTR of a connected QP, the address vector (the QP's owner turns it into
/// an address handle of its context).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CmQpAttr {
    /// The attributes (`ah` left `None`: see `av`).
    pub attr: QpAttr,
    /// `IBV_QP_AV`.
    pub av: Option<AddressVector>,
}

/// A QP the CM drives: the Verbs API's [`QueuePair`], or the C drop-in's
/// `ibv_qp`.
pub trait CmQp: Send + Sync {
    /// Its number.
    fn qpn(&self) -> Qpn;
    /// Its type.
    fn qp_type(&self) -> QpType;
    /// Applies the transitions in order (`ibv_modify_qp` each), stopping
    /// at the first refused one with its errno.
    fn modify(&self, steps: &[CmQpAttr]) -> io::Result<()>;
}

impl CmQp for QueuePair {
    fn qpn(&self) -> Qpn {
        QueuePair::qpn(self)
    }

    fn qp_type(&self) -> QpType {
        self.config().qp_type
    }

    fn modify(&self, steps: &[CmQpAttr]) -> io::Result<()> {
        let ctx = self.context();
        let mut attrs = Vec::with_capacity(steps.len());
        for s in steps {
            let mut a = s.attr;
            if let Some(av) = s.av {
                let ah = ctx
                    .create_ah_from(av.dgid, Some(av.sgid_index))
                    .map_err(|e| super::errno(e.errno()))?;
                a.ah = Some(ah);
            }
            attrs.push(a);
        }
        match self.modify_steps(&attrs) {
            Ok(Ok(())) => Ok(()),
            Ok(Err((_, e))) => Err(super::errno(e.errno())),
            Err(e) => Err(super::errno(e.errno())),
        }
    }
}

/// What the two sides agreed on for the QP.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Negotiated {
    pub remote_qpn: u32,
    /// The PSN in the peer's REQ/REP: where our sends start.
    pub remote_psn: u32,
    /// The PSN in our REQ/REP: where the peer's sends start.
    pub my_psn: u32,
    /// `enum ibv_mtu`.
    pub mtu: u8,
    /// Our QP's max_dest_rd_atomic.
    pub responder_resources: u8,
    /// Our QP's max_rd_atomic.
    pub initiator_depth: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    /// Local ACK timeout (4.096 us * 2^t): ours in the REQ, the REQ's on
    /// the passive side, as the kernel's CM does.
    pub ack_timeout: u8,
    /// The ECE options both sides offered ([`crate::Ece::agree`]): the
    /// REQ's against ours on the passive side, the REP's on the active.
    pub ece: crate::Ece,
    /// The passive side of a connection set up in one round trip
    /// (`burst_cm::CmConfig::fast_setup`): its QP is ready at the REP and
    /// sends nothing until the active side is ([`crate::QpAttr::wait_for_peer`]).
    pub fast_setup: bool,
}

/// The ECE options a REQ or REP carried.
pub(super) fn ece_of(e: burst_cm::CmEce) -> crate::Ece {
    crate::Ece {
        vendor_id: e.vendor_id,
        options: e.options,
    }
}

/// The ECE options to carry in a REQ or REP.
pub(super) fn cm_ece(e: crate::Ece) -> burst_cm::CmEce {
    burst_cm::CmEce {
        vendor_id: e.vendor_id,
        options: e.options,
    }
}

/// The ACK timeout the kernel's RDMA CM gives RoCE QPs (packet life time
/// 18, about 1 s): short enough to recover a loss, long enough for a slow
/// peer (RXE on an emulated CPU).
pub(super) const DEFAULT_ACK_TIMEOUT: u8 = 18;

/// Where the id stands, as [`attr_for`] needs it.
pub(super) struct QpPlan {
    pub qp_type: QpType,
    /// REQ or REP exchanged (or being).
    pub connected: bool,
    pub neg: Negotiated,
    pub av: Option<AddressVector>,
}

/// `rdma_init_qp_attr`'s answer for `state`.
pub(super) fn attr_for(p: &QpPlan, state: QpState) -> io::Result<CmQpAttr> {
    let n = p.neg;
    let ud = p.qp_type == QpType::Ud;
    let rc = p.qp_type == QpType::Rc;
    let mut a = QpAttr {
        state: Some(state),
        ..QpAttr::default()
    };
    let mut av = None;
    match state {
        QpState::Init => {
            a.pkey_index = Some(0);
            a.port = Some(1);
            if ud {
                a.qkey = Some(burst_cm::rdma::RDMA_UDP_QKEY);
            } else {
                // As the kernel's CM: remote writes once connected, reads
                // and atomics when the peer may issue them.
                let reads = p.connected && n.responder_resources > 0;
                a.access = Some(QpAccess {
                    remote_write: p.connected,
                    remote_read: reads,
                    remote_atomic: reads,
                });
            }
        }
        QpState::Rtr if ud => {}
        QpState::Rtr => {
            if !p.connected {
                return Err(super::errno(libc::EINVAL));
            }
            av = Some(p.av.ok_or_else(|| super::errno(libc::EINVAL))?);
            a.path_mtu = Some(super::mtu_of(n.mtu));
            a.dest_qpn = Some(Qpn::new(n.remote_qpn).ok_or_else(|| super::errno(libc::EINVAL))?);
            // A CM message's starting PSN is the one its sender's receive
            // queue expects (the kernel's reading, which RXE and RNICs
            // follow): ours in our REQ/REP, the peer's sends start at it.
            a.rq_psn = Some(Psn::new(n.my_psn));
            if rc {
                a.max_dest_rd_atomic = Some(n.responder_resources);
                a.min_rnr_timer = Some(12);
                a.selective_repeat = n.ece.selective_repeat().then_some(true);
            }
        }
        QpState::Rts => {
            a.sq_psn = Some(Psn::new(if ud { 0 } else { n.remote_psn }));
            if n.fast_setup && !ud {
                a.wait_for_peer = Some(true);
            }
            if rc {
                a.timeout = Some(n.ack_timeout);
                a.retry_cnt = Some(n.retry_count.min(7));
                a.rnr_retry = Some(n.rnr_retry_count.min(7));
                a.max_rd_atomic = Some(n.initiator_depth);
            }
        }
        _ => return Err(super::errno(libc::EINVAL)),
    }
    Ok(CmQpAttr { attr: a, av })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(qp_type: QpType, connected: bool) -> QpPlan {
        QpPlan {
            qp_type,
            connected,
            neg: Negotiated {
                remote_qpn: 0x12,
                remote_psn: 100,
                my_psn: 200,
                mtu: 3,
                responder_resources: 4,
                initiator_depth: 2,
                retry_count: 9,
                rnr_retry_count: 7,
                ack_timeout: 14,
                ece: crate::Ece::default(),
                fast_setup: false,
            },
            av: Some(AddressVector::default()),
        }
    }

    #[test]
    fn selective_repeat_only_when_both_offered_it() {
        let mut p = plan(QpType::Rc, true);
        assert_eq!(
            attr_for(&p, QpState::Rtr).unwrap().attr.selective_repeat,
            None
        );
        p.neg.ece = crate::Ece::offered().agree(&crate::Ece::offered());
        assert_eq!(
            attr_for(&p, QpState::Rtr).unwrap().attr.selective_repeat,
            Some(true)
        );
        // The kernel's CM with RXE carries no ECE.
        p.neg.ece = crate::Ece::offered().agree(&ece_of(burst_cm::CmEce::default()));
        assert_eq!(
            attr_for(&p, QpState::Rtr).unwrap().attr.selective_repeat,
            None
        );
    }

    #[test]
    fn a_connected_rc_qp_gets_the_agreed_values_in_each_state() {
        let p = plan(QpType::Rc, true);
        let init = attr_for(&p, QpState::Init).unwrap().attr;
        assert_eq!(
            init.access,
            Some(QpAccess {
                remote_write: true,
                remote_read: true,
                remote_atomic: true
            })
        );
        let rtr = attr_for(&p, QpState::Rtr).unwrap();
        assert_eq!(rtr.attr.rq_psn, Some(Psn::new(200)));
        assert_eq!(rtr.attr.dest_qpn, Qpn::new(0x12));
        assert_eq!(rtr.attr.path_mtu, Some(crate::Mtu::Mtu1024));
        assert_eq!(rtr.attr.max_dest_rd_atomic, Some(4));
        assert!(rtr.av.is_some());
        let rts = attr_for(&p, QpState::Rts).unwrap().attr;
        assert_eq!(rts.sq_psn, Some(Psn::new(100)));
        assert_eq!(rts.retry_cnt, Some(7), "clamped to the 3-bit field");
        assert_eq!(rts.max_rd_atomic, Some(2));
        assert_eq!(rts.timeout, Some(14));
    }

    #[test]
    fn unconnected_and_ud_ids_get_what_rdma_cm_gives_them() {
        let idle = plan(QpType::Rc, false);
        assert_eq!(
            attr_for(&idle, QpState::Init).unwrap().attr.access,
            Some(QpAccess::default())
        );
        assert!(attr_for(&idle, QpState::Rtr).is_err());
        assert!(attr_for(&idle, QpState::Sqd).is_err());
        let ud = plan(QpType::Ud, false);
        let init = attr_for(&ud, QpState::Init).unwrap().attr;
        assert_eq!(init.qkey, Some(burst_cm::rdma::RDMA_UDP_QKEY));
        assert_eq!(init.access, None);
        assert_eq!(attr_for(&ud, QpState::Rtr).unwrap().attr.dest_qpn, None);
        assert_eq!(
            attr_for(&ud, QpState::Rts).unwrap().attr.sq_psn,
            Some(Psn::new(0))
        );
        let uc = plan(QpType::Uc, true);
        let rts = attr_for(&uc, QpState::Rts).unwrap().attr;
        assert_eq!((rts.timeout, rts.max_rd_atomic), (None, None));
    }
}
