//! rdma_cm in Rust between two engines on loopback addresses, each with
//! its own [`RdmaCm`]: resolve, connect with private data, accept, a SEND
//! over the connected QPs, disconnect on both sides; a REQ for a port
//! nobody listens on, a consumer reject with private data; UD through
//! SIDR; and the errors of calls made out of turn.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

use burst_verbs::engine::{CompletionQueue, Context, Engine, QueuePair};
use burst_verbs::rdma_cm::{
    CmEvent, CmEventKind, CmId, ConnParam, EventChannel, EventParam, PortSpace, RdmaCm,
};
use burst_verbs::{
    Access, Ece, Mtu, QpInit, QpState, QpType, RecvWr, SendOp, SendWr, Sge, WcStatus,
};

struct Side {
    _engine: Engine,
    ctx: Context,
    cm: RdmaCm,
    ch: EventChannel,
    ip: IpAddr,
}

fn side(ip: &str) -> Side {
    let ip: IpAddr = ip.parse().unwrap();
    let engine = Engine::start(ip, Mtu::Mtu1024).unwrap();
    let ctx = engine.context();
    let opened = ctx.clone();
    let cm = RdmaCm::new(vec![ip], Box::new(move |_| Ok(opened.clone())));
    Side {
        _engine: engine,
        ctx,
        cm,
        ch: EventChannel::new().unwrap(),
        ip,
    }
}

/// The channel's next event, within 10 s.
fn next(ch: &EventChannel) -> CmEvent {
    let mut p = libc::pollfd {
        fd: ch.as_fd().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd.
    let n = unsafe { libc::poll(&mut p, 1, 10_000) };
    assert_eq!(n, 1, "a CM event within 10 s");
    ch.get_event().unwrap()
}

fn expect(ch: &EventChannel, kind: CmEventKind) -> CmEvent {
    let e = next(ch);
    assert_eq!(e.kind, kind, "{e:?}");
    e
}

fn conn_data(e: &CmEvent) -> Vec<u8> {
    match &e.param {
        EventParam::Conn(p) => p.private_data.clone(),
        p => panic!("no connection parameters: {p:?}"),
    }
}

/// A QP of `qp_type` on `id`'s device with one CQ and a receive posted
/// into `buf`.
fn qp_on(id: &CmId, qp_type: QpType, buf: &mut [u8]) -> (QueuePair, CompletionQueue, u32) {
    let ctx = id.context().expect("the id is on a device");
    let pd = ctx.alloc_pd();
    // SAFETY: `buf` outlives the QP (the test keeps it to the end).
    let mr = unsafe { ctx.reg_mr(pd, buf.as_mut_ptr(), buf.len(), Access::LOCAL_WRITE) }.unwrap();
    let cq = ctx.cq(ctx.create_cq(16)).unwrap();
    let mut init = QpInit::new(qp_type, pd);
    init.caps.max_send_wr = 8;
    init.caps.max_recv_wr = 8;
    let qp = id.create_qp(&init, &cq, &cq).unwrap();
    let sge = Sge {
        addr: mr.addr,
        length: buf.len() as u32,
        lkey: mr.lkey,
    };
    qp.post_recv(&RecvWr {
        wr_id: 1,
        sg_list: [sge].into(),
    })
    .unwrap();
    (qp, cq, mr.lkey)
}

/// A listener on `b`'s port 7000.
fn listen_on(b: &Side) -> CmId {
    let listener = b.cm.create_id(&b.ch, PortSpace::Tcp);
    listener.bind_addr(SocketAddr::new(b.ip, 7000)).unwrap();
    listener.listen().unwrap();
    listener
}

/// An RC id of `a` resolved towards `b`'s listener, with a QP
/// ([`qp_on`] into `buf`), its REQ sent.
fn connecting(a: &Side, b: &Side, buf: &mut [u8]) -> (CmId, (QueuePair, CompletionQueue, u32)) {
    let id = a.cm.create_id(&a.ch, PortSpace::Tcp);
    id.resolve_addr(None, SocketAddr::new(b.ip, 7000)).unwrap();
    expect(&a.ch, CmEventKind::AddrResolved);
    id.resolve_route().unwrap();
    expect(&a.ch, CmEventKind::RouteResolved);
    let qp = qp_on(&id, QpType::Rc, buf);
    id.connect(None).unwrap();
    (id, qp)
}

fn poll(cq: &CompletionQueue) -> burst_verbs::WorkCompletion {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(wc) = cq.poll() {
            return wc;
        }
        assert!(Instant::now() < deadline, "a completion within 10 s");
        std::thread::yield_now();
    }
}

#[test]
fn rc_connection_set_up_used_and_torn_down_through_rdma_cm() {
    let a = side("127.0.140.1");
    let b = side("127.0.140.2");
    let listener = listen_on(&b);
    assert_eq!(
        listener.listen().unwrap_err().raw_os_error(),
        Some(libc::EINVAL),
        "listening twice"
    );

    let id = a.cm.create_id(&a.ch, PortSpace::Tcp);
    assert_eq!(
        id.connect(None).unwrap_err().raw_os_error(),
        Some(libc::EINVAL),
        "connect before the route is resolved"
    );
    id.resolve_addr(None, SocketAddr::new(b.ip, 7000)).unwrap();
    expect(&a.ch, CmEventKind::AddrResolved);
    let route = id.route();
    assert_eq!(route.src.map(|s| s.ip()), Some(a.ip));
    assert_eq!(route.dgid, burst_verbs::gid_of(b.ip));
    assert_eq!(route.sgid, a.ctx.gid());
    id.resolve_route().unwrap();
    expect(&a.ch, CmEventKind::RouteResolved);
    let mut abuf = vec![0u8; 64];
    let (aqp, acq, alkey) = qp_on(&id, QpType::Rc, &mut abuf);
    let ask = ConnParam {
        private_data: b"hello".to_vec(),
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        ..ConnParam::default()
    };
    id.connect(Some(&ask)).unwrap();

    let req = expect(&b.ch, CmEventKind::ConnectRequest);
    assert_eq!(req.listen_id.as_ref(), Some(&listener));
    assert_ne!(req.id, listener, "a request comes on a new id");
    assert_eq!(&conn_data(&req)[..5], b"hello");
    let child = req.id;
    assert_eq!(child.route().dst.map(|d| d.ip()), Some(a.ip));
    let mut bbuf = vec![0u8; 64];
    let (_bqp, bcq, _) = qp_on(&child, QpType::Rc, &mut bbuf);
    let rtr = child.qp_attr(QpState::Rtr).unwrap();
    assert_eq!(rtr.attr.dest_qpn, Some(aqp.qpn()), "the REQ's QPN");
    child
        .accept(Some(&ConnParam {
            private_data: b"welcome".to_vec(),
            responder_resources: 1,
            initiator_depth: 1,
            rnr_retry_count: 7,
            ..ConnParam::default()
        }))
        .unwrap();
    let est = expect(&a.ch, CmEventKind::Established);
    assert_eq!(&conn_data(&est)[..7], b"welcome");
    expect(&b.ch, CmEventKind::Established);

    // The QPs are connected: a SEND arrives.
    abuf[..4].copy_from_slice(b"ping");
    let sge = Sge {
        addr: abuf.as_ptr() as u64,
        length: 4,
        lkey: alkey,
    };
    aqp.post_send(&SendWr::new(9, SendOp::Send, [sge])).unwrap();
    let wc = poll(&bcq);
    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    assert_eq!(wc.byte_len, 4);
    assert_eq!(&bbuf[..4], b"ping");
    assert_eq!(poll(&acq).status, WcStatus::Success);

    assert!(id.disconnect().unwrap(), "a DREQ left");
    expect(&a.ch, CmEventKind::Disconnected);
    expect(&b.ch, CmEventKind::Disconnected);
    child.destroy();
    id.destroy();
    assert_eq!(
        id.resolve_route().unwrap_err().raw_os_error(),
        Some(libc::EINVAL),
        "a destroyed id"
    );
    listener.destroy();
}

#[test]
fn rejections_reach_the_active_side_with_reason_and_private_data() {
    let a = side("127.0.140.3");
    let b = side("127.0.140.4");
    let _listener = listen_on(&b);
    let mut abuf = vec![0u8; 64];
    let connect = |port: u16, buf: &mut [u8]| {
        let id = a.cm.create_id(&a.ch, PortSpace::Tcp);
        id.resolve_addr(None, SocketAddr::new(b.ip, port)).unwrap();
        expect(&a.ch, CmEventKind::AddrResolved);
        id.resolve_route().unwrap();
        expect(&a.ch, CmEventKind::RouteResolved);
        let _ = qp_on(&id, QpType::Rc, buf);
        id.connect(None).unwrap();
        id
    };

    // Nobody listens on 7001: rejected by the CM (invalid service ID, 8).
    let lost = connect(7001, &mut abuf);
    let rej = expect(&a.ch, CmEventKind::Rejected);
    assert_eq!((rej.id, rej.status), (lost, 8));

    // The listener's application says no, with a reason of its own.
    let _id = connect(7000, &mut abuf);
    let req = expect(&b.ch, CmEventKind::ConnectRequest);
    req.id.reject(b"full").unwrap();
    assert_eq!(
        req.id.accept(None).unwrap_err().raw_os_error(),
        Some(libc::EINVAL),
        "accepting a rejected request"
    );
    let rej = expect(&a.ch, CmEventKind::Rejected);
    assert_eq!(rej.status, 28, "consumer reject");
    assert_eq!(&conn_data(&rej)[..4], b"full");
    assert!(
        req.id.reject(&[0; 149]).is_err(),
        "more private data than a REJ carries"
    );
}

#[test]
fn ud_peers_find_each_other_through_sidr() {
    let a = side("127.0.140.5");
    let b = side("127.0.140.6");
    let listener = b.cm.create_id(&b.ch, PortSpace::Udp);
    assert_eq!(listener.qp_type(), QpType::Ud);
    listener.bind_addr(SocketAddr::new(b.ip, 7002)).unwrap();
    listener.listen().unwrap();

    let id = a.cm.create_id(&a.ch, PortSpace::Udp);
    id.resolve_addr(None, SocketAddr::new(b.ip, 7002)).unwrap();
    expect(&a.ch, CmEventKind::AddrResolved);
    id.resolve_route().unwrap();
    expect(&a.ch, CmEventKind::RouteResolved);
    let mut abuf = vec![0u8; 64];
    let _ = qp_on(&id, QpType::Ud, &mut abuf);
    id.connect(Some(&ConnParam {
        private_data: b"udp?".to_vec(),
        ..ConnParam::default()
    }))
    .unwrap();

    let req = expect(&b.ch, CmEventKind::ConnectRequest);
    match &req.param {
        EventParam::Ud(u) => assert_eq!(&u.private_data[..4], b"udp?"),
        p => panic!("{p:?}"),
    }
    let mut bbuf = vec![0u8; 64];
    let (bqp, _, _) = qp_on(&req.id, QpType::Ud, &mut bbuf);
    req.id.accept(None).unwrap();

    let est = expect(&a.ch, CmEventKind::Established);
    match &est.param {
        EventParam::Ud(u) => {
            assert_eq!(u.qp_num, bqp.qpn().value());
            assert_eq!(u.av.dgid, burst_verbs::gid_of(b.ip));
            assert_ne!(u.qkey, 0);
        }
        p => panic!("{p:?}"),
    }
}

/// `rdma_bind_addr` as the kernel's CM (checked on RXE): a device's own
/// address attaches the device; a loopback address that is no device's
/// own binds (with a port) to no device yet; any other address is not
/// ours (EADDRNOTAVAIL). libfabric's verbs provider tells a device's
/// addresses from loopback by exactly this.
#[test]
fn bind_attaches_a_device_only_for_its_own_address() {
    let a = side("127.0.140.5");
    let own = a.cm.create_id(&a.ch, PortSpace::Tcp);
    own.bind_addr(SocketAddr::new(a.ip, 0)).unwrap();
    assert_eq!(own.route().device, Some(0));
    let lo = a.cm.create_id(&a.ch, PortSpace::Tcp);
    lo.bind_addr("127.0.0.1:0".parse().unwrap()).unwrap();
    let r = lo.route();
    assert_eq!(r.device, None, "loopback binds to no device");
    let src = r.src.expect("bound");
    assert_eq!(src.ip(), "127.0.0.1".parse::<IpAddr>().unwrap());
    assert_ne!(src.port(), 0, "an ephemeral port is taken");
    let far = a.cm.create_id(&a.ch, PortSpace::Tcp);
    let e = far
        .bind_addr("198.18.0.250:0".parse().unwrap())
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EADDRNOTAVAIL));
}

/// `rdma_join_multicast` on RoCE: a UDP id with a device joins at once;
/// the event carries the group's GID (IPv4-mapped), QPN 0xFFFFFF and
/// `RDMA_UDP_QKEY`, as the kernel's CM reports them. An id without a
/// device, a unicast address (EINVAL) and a connected port space (ENOSYS)
/// are refused.
#[test]
fn multicast_joins_report_the_group_as_the_kernel_does() {
    let a = side("127.0.140.6");
    let group: SocketAddr = "239.1.2.3:0".parse().unwrap();
    let unbound = a.cm.create_id(&a.ch, PortSpace::Udp);
    let e = unbound.join_multicast(group).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    let id = a.cm.create_id(&a.ch, PortSpace::Udp);
    id.bind_addr(SocketAddr::new(a.ip, 0)).unwrap();
    let e = id.join_multicast(SocketAddr::new(a.ip, 0)).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "a unicast group");
    let mgid = id.join_multicast(group).unwrap();
    let mut want = [0u8; 16];
    want[10] = 0xff;
    want[11] = 0xff;
    want[12..].copy_from_slice(&[239, 1, 2, 3]);
    assert_eq!(mgid, want);
    let ev = expect(&a.ch, CmEventKind::MulticastJoin);
    assert_eq!((ev.id, ev.status), (id, 0));
    match ev.param {
        EventParam::Ud(u) => {
            assert_eq!((u.qp_num, u.qkey), (0xff_ffff, 0x0123_4567));
            assert_eq!(u.av.dgid, want);
        }
        p => panic!("{p:?}"),
    }
    let rc = a.cm.create_id(&a.ch, PortSpace::Tcp);
    rc.bind_addr(SocketAddr::new(a.ip, 0)).unwrap();
    let e = rc.join_multicast(group).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSYS));
}

/// Between two burst CMs the connection is set up in one round trip: the
/// passive side is established as `rdma_accept` returns (its event is
/// already queued, before the active side has even seen the REP), and the
/// SEND it posts at once waits for the active side's QP to be ready
/// instead of being dropped there and resent after the ACK timeout.
#[test]
fn the_passive_side_is_established_at_its_rep_and_sends_at_once() {
    let a = side("127.0.140.7");
    let b = side("127.0.140.8");
    let _listener = listen_on(&b);
    for round in 0..5 {
        let mut abuf = vec![0u8; 64];
        let (id, (aqp, acq, _)) = connecting(&a, &b, &mut abuf);
        let child = expect(&b.ch, CmEventKind::ConnectRequest).id;
        let mut bbuf = vec![0u8; 64];
        let (bqp, bcq, blkey) = qp_on(&child, QpType::Rc, &mut bbuf);
        child.accept(None).unwrap();
        // Queued by rdma_accept itself: no wait.
        let mut p = libc::pollfd {
            fd: b.ch.as_fd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd.
        assert_eq!(unsafe { libc::poll(&mut p, 1, 0) }, 1, "round {round}");
        expect(&b.ch, CmEventKind::Established);
        bbuf[..4].copy_from_slice(b"pong");
        let sge = Sge {
            addr: bbuf.as_ptr() as u64,
            length: 4,
            lkey: blkey,
        };
        bqp.post_send(&SendWr::new(9, SendOp::Send, [sge])).unwrap();
        expect(&a.ch, CmEventKind::Established);
        let wc = poll(&acq);
        assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 4), "{wc:?}");
        assert_eq!(&abuf[..4], b"pong");
        assert_eq!(poll(&bcq).status, WcStatus::Success);
        let (ca, cb) = (
            a.ctx.qp_counters(aqp.qpn()).unwrap(),
            b.ctx.qp_counters(bqp.qpn()).unwrap(),
        );
        // The SEND found the active QP ready (nothing dropped there) and
        // was not resent after a timeout. A probe may resend it when the
        // peer is slow to answer (the host loaded: two `yes` loops made it
        // 2 resends in 1 run of 4), a duplicate the peer answers again.
        assert_eq!(
            (ca.dropped_pkts, cb.retransmits_started),
            (0, 0),
            "round {round}: the first SEND waited for the peer"
        );
        assert!(
            cb.retransmitted_pkts <= cb.sr_probes,
            "round {round}: resent only by probes: {cb:?}"
        );
        assert!(id.disconnect().unwrap());
        expect(&a.ch, CmEventKind::Disconnected);
        expect(&b.ch, CmEventKind::Disconnected);
        child.destroy();
        id.destroy();
    }
}

/// librdmacm's ECE calls for applications that ready their own QPs: the
/// REQ carries what `set_local_ece` set (burst's CM adds its fast-setup
/// option only under burst's vendor ID), the passive side reads it with
/// `remote_ece` and may refuse it (`reject_ece`: REJECTED, reason 35);
/// another vendor's options cross untouched and the connection is made
/// the standard way.
#[test]
fn ece_set_by_the_application_crosses_in_the_req_and_can_be_refused() {
    let a = side("127.0.140.11");
    let b = side("127.0.140.12");
    let _listener = listen_on(&b);
    let connect = |ece: Ece, buf: &mut [u8]| {
        let id = a.cm.create_id(&a.ch, PortSpace::Tcp);
        assert_eq!(
            id.set_local_ece(Ece {
                vendor_id: 0,
                options: 1
            })
            .unwrap_err()
            .raw_os_error(),
            Some(libc::EINVAL),
            "vendor ID 0"
        );
        id.set_local_ece(ece).unwrap();
        id.resolve_addr(None, SocketAddr::new(b.ip, 7000)).unwrap();
        expect(&a.ch, CmEventKind::AddrResolved);
        id.resolve_route().unwrap();
        expect(&a.ch, CmEventKind::RouteResolved);
        let _ = qp_on(&id, QpType::Rc, buf);
        assert_eq!(
            id.remote_ece().unwrap_err().raw_os_error(),
            Some(libc::EINVAL),
            "an id with a QP"
        );
        id.connect(None).unwrap();
        id
    };

    // burst's options: the REQ also offers the one-round-trip setup.
    let mut abuf = vec![0u8; 64];
    let burst = Ece {
        vendor_id: burst_verbs::VENDOR_ID,
        options: burst_verbs::ECE_SELECTIVE_REPEAT,
    };
    let _id = connect(burst, &mut abuf);
    let req = expect(&b.ch, CmEventKind::ConnectRequest);
    let seen = req.id.remote_ece().unwrap();
    assert_eq!(seen.vendor_id, burst_verbs::VENDOR_ID);
    assert_eq!(
        seen.options & burst_verbs::ECE_SELECTIVE_REPEAT,
        burst_verbs::ECE_SELECTIVE_REPEAT
    );
    assert_ne!(
        seen.options,
        burst_verbs::ECE_SELECTIVE_REPEAT,
        "and the CM's own"
    );
    req.id.reject_ece(b"no").unwrap();
    let rej = expect(&a.ch, CmEventKind::Rejected);
    assert_eq!(rej.status, 35, "vendor option not supported");
    assert_eq!(&conn_data(&rej)[..2], b"no");

    // Another vendor's options: carried as they are, standard setup.
    let mut abuf2 = vec![0u8; 64];
    let other = Ece {
        vendor_id: 0x02c9,
        options: 5,
    };
    let _id2 = connect(other, &mut abuf2);
    let req = expect(&b.ch, CmEventKind::ConnectRequest);
    assert_eq!(req.id.remote_ece().unwrap(), other);
    let mut bbuf = vec![0u8; 64];
    let (_bqp, _bcq, _) = qp_on(&req.id, QpType::Rc, &mut bbuf);
    req.id.accept(None).unwrap();
    expect(&a.ch, CmEventKind::Established);
    expect(&b.ch, CmEventKind::Established);
}

/// A process that ends with its connections up (Valkey's RDMA test client
/// exits without `rdma_disconnect`): as the kernel's CM when the
/// process's file closes, `close_all` sends a DREQ for each, so the peer
/// is told at once instead of finding out when its retries run out, and
/// waits for the DREPs. The server's id was never disconnected or
/// destroyed either; its side stays usable for the next connection.
#[test]
fn connections_left_up_at_exit_are_disconnected() {
    let a = side("127.0.140.21");
    let b = side("127.0.140.22");
    let _listener = listen_on(&b);
    let mut kept = Vec::new();
    for _ in 0..3 {
        let mut abuf = vec![0u8; 64];
        let (id, aqp) = connecting(&a, &b, &mut abuf);
        let child = expect(&b.ch, CmEventKind::ConnectRequest).id;
        let mut bbuf = vec![0u8; 64];
        let bqp = qp_on(&child, QpType::Rc, &mut bbuf);
        child.accept(None).unwrap();
        expect(&b.ch, CmEventKind::Established);
        expect(&a.ch, CmEventKind::Established);
        kept.push((id, aqp, abuf, child, bqp, bbuf));
    }
    assert_eq!(
        a.cm.close_all(Duration::from_secs(5)),
        0,
        "every DREQ answered"
    );
    let mut gone = Vec::new();
    for _ in 0..3 {
        let e = expect(&b.ch, CmEventKind::Disconnected);
        gone.push(e.id);
    }
    for (_, _, _, child, _, _) in &kept {
        assert!(gone.contains(child), "{child:?} told of its peer's end");
    }
    // Nothing more for the process that closed: its ids were not torn down
    // by it, and a second close finds nothing to do.
    assert_eq!(a.cm.close_all(Duration::from_secs(1)), 0);
    let mut p = libc::pollfd {
        fd: b.ch.as_fd().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd.
    let more = unsafe { libc::poll(&mut p, 1, 200) };
    assert_eq!(more, 0, "one DISCONNECTED each");
}
