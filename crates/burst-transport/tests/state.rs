//! The QP state machine and the argument checks of post calls.

use burst_transport::sim::{Access, SimMemory};
use burst_transport::*;
use burst_wire::{Mtu, Psn, Qpn};

fn qp(t: QpType) -> Qp {
    Qp::new(QpConfig::new(Qpn::new(0x42).unwrap(), t, 1))
}

fn init(t: QpType) -> QpAttr {
    let mut a = QpAttr {
        state: Some(QpState::Init),
        pkey_index: Some(0),
        port: Some(1),
        ..Default::default()
    };
    if t == QpType::Ud {
        a.qkey = Some(0x11);
    } else {
        a.access = Some(QpAccess::default());
    }
    a
}

fn rtr() -> QpAttr {
    QpAttr {
        state: Some(QpState::Rtr),
        ah: Some(0),
        path_mtu: Some(Mtu::Mtu1024),
        dest_qpn: Some(Qpn::new(7).unwrap()),
        rq_psn: Some(Psn::new(0)),
        max_dest_rd_atomic: Some(4),
        min_rnr_timer: Some(12),
        ..Default::default()
    }
}

fn rts() -> QpAttr {
    QpAttr {
        state: Some(QpState::Rts),
        sq_psn: Some(Psn::new(0)),
        timeout: Some(14),
        retry_cnt: Some(7),
        rnr_retry: Some(7),
        max_rd_atomic: Some(4),
        ..Default::default()
    }
}

#[test]
fn rc_goes_reset_init_rtr_rts() {
    let mut q = qp(QpType::Rc);
    q.modify(&init(QpType::Rc)).unwrap();
    q.modify(&rtr()).unwrap();
    q.modify(&rts()).unwrap();
    assert_eq!(q.state(), QpState::Rts);
    q.modify(&QpAttr {
        state: Some(QpState::Sqd),
        ..Default::default()
    })
    .unwrap();
    q.modify(&QpAttr {
        state: Some(QpState::Rts),
        ..Default::default()
    })
    .unwrap();
    q.modify(&QpAttr {
        state: Some(QpState::Err),
        ..Default::default()
    })
    .unwrap();
    q.modify(&QpAttr {
        state: Some(QpState::Reset),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(q.state(), QpState::Reset);
}

#[test]
fn transitions_check_their_attributes() {
    let mut q = qp(QpType::Rc);
    // skipping INIT
    assert_eq!(
        q.modify(&rtr()),
        Err(VerbsError::InvalidState(QpState::Reset))
    );
    // missing access flags
    let mut a = init(QpType::Rc);
    a.access = None;
    assert_eq!(q.modify(&a), Err(VerbsError::MissingAttr("access")));
    // a UD attribute on RC
    let mut a = init(QpType::Rc);
    a.qkey = Some(1);
    assert_eq!(q.modify(&a), Err(VerbsError::UnexpectedAttr("qkey")));
    q.modify(&init(QpType::Rc)).unwrap();
    // RTR without dest_qpn
    let mut r = rtr();
    r.dest_qpn = None;
    assert_eq!(q.modify(&r), Err(VerbsError::MissingAttr("dest_qpn")));
    // sq_psn belongs to RTR->RTS
    let mut r = rtr();
    r.sq_psn = Some(Psn::new(1));
    assert_eq!(q.modify(&r), Err(VerbsError::UnexpectedAttr("sq_psn")));
    q.modify(&rtr()).unwrap();
    let mut s = rts();
    s.retry_cnt = Some(8);
    assert_eq!(q.modify(&s), Err(VerbsError::InvalidValue("retry_cnt")));
    let mut s = rts();
    s.port = Some(2);
    assert!(q.modify(&s).is_err());
    q.modify(&rts()).unwrap();
    assert_eq!(VerbsError::MissingAttr("x").errno(), 22);
    assert_eq!(VerbsError::QueueFull.errno(), 12);
}

#[test]
fn ud_needs_qkey_and_no_path() {
    let mut q = qp(QpType::Ud);
    q.modify(&init(QpType::Ud)).unwrap();
    assert_eq!(q.modify(&rtr()), Err(VerbsError::UnexpectedAttr("ah")));
    q.modify(&QpAttr {
        state: Some(QpState::Rtr),
        ..Default::default()
    })
    .unwrap();
    q.modify(&QpAttr {
        state: Some(QpState::Rts),
        sq_psn: Some(Psn::new(0)),
        ..Default::default()
    })
    .unwrap();
}

#[test]
fn post_checks() {
    let mut mem = SimMemory::default();
    let (k, a) = mem.register(1, 64, Access::ALL);
    let mut q = qp(QpType::Rc);
    let wr = SendWr::new(
        1,
        SendOp::Send,
        [Sge {
            addr: a,
            length: 8,
            lkey: k,
        }],
    );
    assert_eq!(
        q.post_send(wr, &mut mem),
        Err(VerbsError::InvalidState(QpState::Reset))
    );
    q.modify(&init(QpType::Rc)).unwrap();
    assert!(q.post_send(wr, &mut mem).is_err(), "no sends before RTS");
    // receives may be posted from INIT on
    q.post_recv(RecvWr {
        wr_id: 1,
        sg_list: [Sge {
            addr: a,
            length: 64,
            lkey: k,
        }]
        .into(),
    })
    .unwrap();
    q.modify(&rtr()).unwrap();
    q.modify(&rts()).unwrap();
    q.post_send(wr, &mut mem).unwrap();
    let atomic = |addr| {
        SendWr::new(
            2,
            SendOp::FetchAdd {
                remote_addr: addr,
                rkey: 1,
                add: 1,
            },
            [Sge {
                addr: a,
                length: 8,
                lkey: k,
            }],
        )
    };
    assert!(matches!(
        q.post_send(atomic(0x1004), &mut mem),
        Err(VerbsError::BadWr(_))
    ));
    q.post_send(atomic(0x1008), &mut mem).unwrap();
    let mut inl = SendWr::new(
        3,
        SendOp::Send,
        [Sge {
            addr: a,
            length: 64,
            lkey: k,
        }],
    );
    inl.inline = true;
    q.post_send(inl, &mut mem).unwrap();
    let big = vec![
        Sge {
            addr: a,
            length: 1,
            lkey: k
        };
        33
    ];
    // A work request holds at most MAX_SGE entries: more cannot be built.
    assert_eq!(SgList::try_from(big), Err(VerbsError::TooManySge));
    // A bad lkey fails when the WR's turn comes: first in a fresh QP, it
    // completes with a local protection error and breaks the QP, flushing
    // what was posted behind it.
    let mut q = qp(QpType::Rc);
    q.modify(&init(QpType::Rc)).unwrap();
    q.modify(&rtr()).unwrap();
    q.modify(&rts()).unwrap();
    let bad = SendWr::new(
        5,
        SendOp::Send,
        [Sge {
            addr: a,
            length: 8,
            lkey: k ^ 0xff00,
        }],
    );
    q.post_send(bad, &mut mem).unwrap();
    q.post_send(wr, &mut mem).unwrap();
    let mut wcs = Vec::new();
    while let Some(w) = q.poll_completion() {
        wcs.push(w);
    }
    assert_eq!(q.state(), QpState::Err);
    assert_eq!(wcs[0].wr_id, 5);
    assert_eq!(wcs[0].status, WcStatus::LocProtErr);
    assert_eq!(wcs[1].status, WcStatus::WrFlushErr, "{wcs:?}");
}

#[test]
fn uc_rejects_reads_and_ud_rejects_writes() {
    let mut mem = SimMemory::default();
    let mut q = qp(QpType::Uc);
    q.modify(&init(QpType::Uc)).unwrap();
    let mut r = rtr();
    r.max_dest_rd_atomic = None;
    r.min_rnr_timer = None;
    q.modify(&r).unwrap();
    q.modify(&QpAttr {
        state: Some(QpState::Rts),
        sq_psn: Some(Psn::new(0)),
        ..Default::default()
    })
    .unwrap();
    let rd = SendWr::new(
        1,
        SendOp::Read {
            remote_addr: 0,
            rkey: 0,
        },
        SgList::new(),
    );
    assert!(matches!(
        q.post_send(rd, &mut mem),
        Err(VerbsError::BadWr(_))
    ));
    let mut u = qp(QpType::Ud);
    u.modify(&init(QpType::Ud)).unwrap();
    u.modify(&QpAttr {
        state: Some(QpState::Rtr),
        ..Default::default()
    })
    .unwrap();
    u.modify(&QpAttr {
        state: Some(QpState::Rts),
        sq_psn: Some(Psn::new(0)),
        ..Default::default()
    })
    .unwrap();
    let wr = SendWr::new(
        1,
        SendOp::Write {
            remote_addr: 0,
            rkey: 0,
        },
        SgList::new(),
    );
    assert!(matches!(
        u.post_send(wr, &mut mem),
        Err(VerbsError::BadWr(_))
    ));
    let no_ah = SendWr::new(1, SendOp::Send, SgList::new());
    assert!(matches!(
        u.post_send(no_ah, &mut mem),
        Err(VerbsError::BadWr(_))
    ));
}

#[test]
fn a_modify_without_a_state_changes_attributes_in_the_current_one() {
    // ibv_modify_qp with IBV_QP_MIN_RNR_TIMER alone on an RTS QP (qperf's
    // server does it): RTS to RTS, as the kernel takes a mask without
    // IBV_QP_STATE. In RTR no such transition exists.
    let only_rnr = QpAttr {
        min_rnr_timer: Some(14),
        ..QpAttr::default()
    };
    let mut q = qp(QpType::Rc);
    q.modify(&init(QpType::Rc)).unwrap();
    q.modify(&rtr()).unwrap();
    assert_eq!(
        q.modify(&only_rnr),
        Err(VerbsError::InvalidState(QpState::Rtr))
    );
    q.modify(&rts()).unwrap();
    q.modify(&only_rnr).unwrap();
    assert_eq!(q.state(), QpState::Rts);
    // Still only what the state allows: a path MTU is not changed in RTS.
    let mtu = QpAttr {
        path_mtu: Some(Mtu::Mtu1024),
        ..QpAttr::default()
    };
    assert!(q.modify(&mtu).is_err());
    assert_eq!(q.state(), QpState::Rts);
}
