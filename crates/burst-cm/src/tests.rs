//! Two CMs over a simulated network that loses, repeats and delays MADs.

use super::*;
use crate::rdma::PortSpace;
use burst_wire::mad::{CmAttr, MAD_HEADER_LEN};
use proptest::prelude::*;

const A: &str = "198.18.0.1";
const B: &str = "198.18.0.2";
const MS: u64 = 1_000_000;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn attr_of(mad: &[u8; MAD_LEN]) -> u16 {
    u16::from_be_bytes([mad[16], mad[17]])
}

/// A and B, and a rule that decides which MAD in flight is lost.
struct Net {
    a: Cm,
    b: Cm,
    now: u64,
    /// (sender is A, attribute, how many more of them to drop).
    drops: Vec<(bool, u16, u32)>,
    /// Every MAD delivered, by sender and attribute.
    log: Vec<(bool, u16)>,
    events_a: Vec<CmEvent>,
    events_b: Vec<CmEvent>,
}

impl Net {
    fn new() -> Net {
        Net::with_fast(true, true)
    }

    /// A and B offering (or not) the one-round-trip setup.
    fn with_fast(fast_a: bool, fast_b: bool) -> Net {
        let cfg = |guid, seed, fast_setup| CmConfig {
            fast_setup,
            ..CmConfig::new(guid, seed)
        };
        let mut b = Cm::new(cfg(0xb, 2, fast_b));
        b.listen(svc()).unwrap();
        Net {
            a: Cm::new(cfg(0xa, 1, fast_a)),
            b,
            now: 0,
            drops: Vec::new(),
            log: Vec::new(),
            events_a: Vec::new(),
            events_b: Vec::new(),
        }
    }

    fn drop_first(&mut self, from_a: bool, attr: CmAttr, n: u32) {
        self.drops.push((from_a, attr as u16, n));
    }

    /// Delivers everything in flight (dropping per the rules) until both
    /// are quiet; collects events.
    fn settle(&mut self) {
        loop {
            let mut moved = false;
            for from_a in [true, false] {
                let (src, dst, src_ip) = if from_a {
                    (&mut self.a, &mut self.b, ip(A))
                } else {
                    (&mut self.b, &mut self.a, ip(B))
                };
                while let Some(t) = src.poll_transmit() {
                    moved = true;
                    let attr = attr_of(&t.mad);
                    let drop = self
                        .drops
                        .iter_mut()
                        .find(|(fa, at, n)| *fa == from_a && *at == attr && *n > 0);
                    if let Some(d) = drop {
                        d.2 -= 1;
                        continue;
                    }
                    self.log.push((from_a, attr));
                    dst.handle_mad(self.now, src_ip, &t.mad);
                }
            }
            while let Some(e) = self.a.poll_event() {
                moved = true;
                self.events_a.push(e);
            }
            while let Some(e) = self.b.poll_event() {
                moved = true;
                self.events_b.push(e);
            }
            self.a.assert_timers_consistent();
            self.b.assert_timers_consistent();
            if !moved {
                return;
            }
        }
    }

    /// Moves time to the next deadline of either side and runs it.
    fn tick(&mut self) -> bool {
        let next = [self.a.poll_timeout(), self.b.poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        let Some(t) = next else { return false };
        self.now = self.now.max(t);
        self.a.handle_timeout(self.now);
        self.b.handle_timeout(self.now);
        self.settle();
        true
    }

    fn sent(&self, from_a: bool, attr: CmAttr) -> usize {
        self.log
            .iter()
            .filter(|(f, a)| *f == from_a && *a == attr as u16)
            .count()
    }
}

fn svc() -> u64 {
    PortSpace::Tcp.service_id(7471)
}

fn req() -> CmReq {
    req_template(svc(), Qpn::new(0x11).unwrap(), Psn::new(100))
}

fn rep() -> CmRep {
    rep_template(Qpn::new(0x22).unwrap(), Psn::new(200))
}

/// Runs a whole connection and disconnection, answering events as an
/// rdma_cm application would, through whatever the rules drop.
fn connect_and_disconnect(net: &mut Net) -> (ConnId, ConnId) {
    let ca = net.a.connect(net.now, ip(B), req()).unwrap();
    let mut cb = None;
    let mut established = (false, false);
    let mut peer_ready = false;
    for _ in 0..200 {
        net.settle();
        let busy = !net.events_a.is_empty() || !net.events_b.is_empty();
        for e in std::mem::take(&mut net.events_b) {
            match e {
                CmEvent::Request { conn, peer, req } => {
                    assert_eq!(peer, ip(A));
                    assert_eq!(req.local_qpn.value(), 0x11);
                    assert_eq!(req.starting_psn.value(), 100);
                    assert_eq!(cb, None, "one request per connection");
                    cb = Some(conn);
                    // Established at once when set up fast (its QP waits
                    // for PeerReady to send: so does this test).
                    if net.b.accept(net.now, conn, rep()).unwrap() {
                        established.1 = true;
                    } else {
                        peer_ready = true;
                    }
                }
                CmEvent::Established { conn } => {
                    assert_eq!(Some(conn), cb);
                    assert!(
                        !net.b.is_fast(conn),
                        "a fast connection is established once"
                    );
                    established.1 = true;
                }
                CmEvent::PeerReady { conn } => {
                    assert_eq!(Some(conn), cb);
                    assert!(established.1 && net.b.is_fast(conn));
                    peer_ready = true;
                }
                e => panic!("B: {e:?}"),
            }
        }
        for e in std::mem::take(&mut net.events_a) {
            match e {
                CmEvent::Reply { conn, rep } => {
                    assert_eq!(conn, ca);
                    assert_eq!(rep.local_qpn.value(), 0x22);
                    net.a.establish(net.now, conn).unwrap();
                    established.0 = true;
                }
                e => panic!("A: {e:?}"),
            }
        }
        if established == (true, true) && peer_ready {
            break;
        }
        if !busy {
            assert!(net.tick(), "stuck before established");
        }
    }
    assert_eq!(established, (true, true));
    assert!(peer_ready);
    let cb = cb.unwrap();
    net.a.disconnect(net.now, ca, b"bye").unwrap();
    let mut disconnected = (false, false);
    for _ in 0..200 {
        net.settle();
        for e in std::mem::take(&mut net.events_a) {
            match e {
                CmEvent::Disconnected { conn } if conn == ca => disconnected.0 = true,
                CmEvent::TimeWaitExit { .. } => {}
                e => panic!("A: {e:?}"),
            }
        }
        for e in std::mem::take(&mut net.events_b) {
            match e {
                CmEvent::Disconnected { conn } if conn == cb => disconnected.1 = true,
                CmEvent::TimeWaitExit { .. } => {}
                e => panic!("B: {e:?}"),
            }
        }
        if disconnected == (true, true) {
            break;
        }
        assert!(net.tick(), "stuck before disconnected");
    }
    assert_eq!(disconnected, (true, true));
    (ca, cb)
}

#[test]
fn connects_and_disconnects_without_loss() {
    let mut net = Net::new();
    connect_and_disconnect(&mut net);
    assert_eq!(net.a.counters().retransmits, 0);
    assert_eq!(net.sent(true, CmAttr::Req), 1);
    assert_eq!(net.sent(false, CmAttr::Rep), 1);
    assert_eq!(net.sent(true, CmAttr::Rtu), 1);
    assert_eq!(net.sent(true, CmAttr::Dreq), 1);
    assert_eq!(net.sent(false, CmAttr::Drep), 1);
    // Time-wait, then both forget.
    while net.tick() {}
    assert!(net.a.is_empty() && net.b.is_empty());
}

#[test]
fn each_lost_message_is_recovered() {
    for (from_a, attr) in [
        (true, CmAttr::Req),
        (false, CmAttr::Rep),
        (true, CmAttr::Rtu),
        (true, CmAttr::Dreq),
        (false, CmAttr::Drep),
    ] {
        for (n, fast) in [(1, true), (3, true), (1, false), (3, false)] {
            let mut net = Net::with_fast(fast, fast);
            net.drop_first(from_a, attr, n);
            connect_and_disconnect(&mut net);
            // The lost one was sent again (an RTU by the passive side's REP
            // retransmission making the active side repeat it; a REP may
            // arrive twice: its own timer and A's repeated REQ).
            assert!(net.sent(from_a, attr) >= 1, "{attr:?} x{n}");
            assert!(net.a.counters().retransmits + net.b.counters().retransmits >= u64::from(n));
            // B never saw a second REQ as new: one connection request.
            assert!(net.b.counters().duplicates <= u64::from(n));
        }
    }
}

#[test]
fn unknown_service_is_rejected_with_reason_8() {
    let mut net = Net::new();
    let mut r = req();
    r.service_id = PortSpace::Tcp.service_id(1);
    let ca = net.a.connect(0, ip(B), r).unwrap();
    net.settle();
    match &net.events_a[..] {
        [CmEvent::Rejected { conn, rej }] => {
            assert_eq!(*conn, ca);
            assert_eq!(rej.reason, reason::INVALID_SERVICE_ID);
            assert_eq!(rej.message_rejected, 0);
        }
        e => panic!("{e:?}"),
    }
    assert!(net.b.is_empty());
    assert!(net.a.is_empty());
    assert_eq!(net.a.poll_timeout(), None);
}

#[test]
fn a_req_just_after_a_listener_closed_waits_for_the_next_listener() {
    let mut net = Net::new();
    net.b.handle_timeout(10 * MS);
    net.b.unlisten(svc());
    let ca = net.a.connect(10 * MS, ip(B), req()).unwrap();
    net.now = 10 * MS;
    net.settle();
    // Not rejected: left for the requester to repeat.
    assert!(net.events_a.is_empty());
    assert_eq!(net.b.counters().deferred, 1);
    net.b.listen(svc()).unwrap();
    net.tick();
    assert!(matches!(net.events_b[..], [CmEvent::Request { .. }]));
    // Long after, an unlistened service is refused at once.
    let mut late = Net::new();
    late.b.unlisten(svc());
    late.b.handle_timeout(3_000 * MS);
    let c = late.a.connect(3_000 * MS, ip(B), req()).unwrap();
    late.settle();
    assert!(matches!(&late.events_a[..], [CmEvent::Rejected { conn, .. }] if *conn == c));
    let _ = ca;
}

#[test]
fn duplicate_req_gets_an_mra_then_the_rep() {
    let mut net = Net::new();
    net.a.connect(0, ip(B), req()).unwrap();
    net.settle();
    let [CmEvent::Request { conn: cb, .. }] = net.events_b[..] else {
        panic!("{:?}", net.events_b)
    };
    net.events_b.clear();
    // B's application is slow: A retransmits; B answers with an MRA.
    let t = net.a.poll_timeout().unwrap();
    net.now = t;
    net.a.handle_timeout(t);
    net.settle();
    assert_eq!(net.sent(false, CmAttr::Mra), 1);
    assert!(net.events_b.is_empty(), "no second request");
    // A now waits longer than its own timeout.
    assert!(net.a.poll_timeout().unwrap() > t + timeout_ns(16));
    net.b.accept(net.now, cb, rep()).unwrap();
    // The REP is lost; B's timer sends it again (before A's REQ, which
    // now waits for the MRA's service timeout).
    net.drop_first(false, CmAttr::Rep, 1);
    net.settle();
    net.tick();
    assert_eq!(net.sent(false, CmAttr::Rep), 1);
    assert!(matches!(net.events_a[..], [CmEvent::Reply { .. }]));
    assert_eq!(net.b.counters().duplicates, 1);
    assert_eq!(net.b.counters().retransmits, 1);
}

#[test]
fn time_wait_answers_repeats_then_ends() {
    let mut net = Net::new();
    let (ca, cb) = connect_and_disconnect(&mut net);
    // A repeated DREQ in time-wait gets a DREP, no second event.
    let mut dreq = [0u8; MAD_LEN];
    CmMad::new(
        7,
        CmMessage::Dreq(CmDreq {
            local_comm_id: ca.0,
            remote_comm_id: cb.0,
            remote_qpn: Qpn::new(0x22).unwrap(),
            private_data: [0; 220],
        }),
    )
    .emit(&mut dreq)
    .unwrap();
    net.b.handle_mad(net.now, ip(A), &dreq);
    let t = net.b.poll_transmit().unwrap();
    assert_eq!(attr_of(&t.mad), CmAttr::Drep as u16);
    assert_eq!(net.b.poll_event(), None);
    // Disconnecting again is a no-op.
    net.a.disconnect(net.now, ca, &[]).unwrap();
    assert_eq!(net.a.poll_transmit(), None);
    // A repeated REQ of the old connection is stale.
    let mut r = req();
    r.local_comm_id = ca.0;
    r.local_ca_guid = 0xa;
    let mut buf = [0u8; MAD_LEN];
    CmMad::new(1, CmMessage::Req(r)).emit(&mut buf).unwrap();
    net.b.handle_mad(net.now, ip(A), &buf);
    let t = net.b.poll_transmit().unwrap();
    let CmMessage::Rej(rej) = CmMad::parse(&t.mad).unwrap().message else {
        panic!()
    };
    assert_eq!(rej.reason, reason::STALE_CONN);
    // After time-wait: exit events, nothing left.
    let end = net.now + net.b.config().time_wait_ns;
    while net.tick() {}
    assert!(net.now >= end);
    assert!(net.events_a.contains(&CmEvent::TimeWaitExit { conn: ca }));
    assert!(net.events_b.contains(&CmEvent::TimeWaitExit { conn: cb }));
    assert!(net.a.is_empty() && net.b.is_empty());
}

#[test]
fn a_silent_peer_is_unreachable_after_the_retries() {
    let mut net = Net::new();
    net.drop_first(true, CmAttr::Req, u32::MAX);
    net.drop_first(true, CmAttr::Rej, u32::MAX);
    let ca = net.a.connect(0, ip(B), req()).unwrap();
    while net.tick() {}
    assert_eq!(net.events_a, vec![CmEvent::Unreachable { conn: ca }]);
    assert_eq!(net.a.counters().retransmits, 15);
    assert_eq!(net.a.counters().timeouts, 1);
    assert!(net.a.is_empty());
    // 16 waits of 2 x 268 ms.
    assert!(net.now >= 16 * 2 * timeout_ns(16));
}

/// A connects to B at time 0 and both are established (B answers the
/// REQ at once); returns (A's connection, B's).
fn established(net: &mut Net) -> (ConnId, ConnId) {
    let ca = net.a.connect(0, ip(B), req()).unwrap();
    net.settle();
    let [CmEvent::Request { conn: cb, .. }] = net.events_b[..] else {
        panic!("B: {:?}", net.events_b)
    };
    net.b.accept(0, cb, rep()).unwrap();
    net.settle();
    net.a.establish(0, ca).unwrap();
    net.settle();
    (ca, cb)
}

#[test]
fn the_peer_gone_during_disconnect_still_disconnects() {
    let mut net = Net::new();
    net.drop_first(false, CmAttr::Drep, u32::MAX);
    net.drop_first(true, CmAttr::Dreq, u32::MAX);
    let (ca, _) = established(&mut net);
    net.events_a.clear();
    net.a.disconnect(0, ca, &[]).unwrap();
    while net.events_a.is_empty() {
        assert!(net.tick());
    }
    assert_eq!(net.events_a[0], CmEvent::Disconnected { conn: ca });
}

/// A process ending right after `rdma_disconnect` and `rdma_destroy_id`
/// (rping's client): its lost DREQ is sent again at once on request, and
/// the peer, told, answers; nothing is pending once the DREP is in.
#[test]
fn an_unanswered_dreq_is_counted_and_sent_again_on_request() {
    let mut net = Net::new();
    net.drop_first(true, CmAttr::Dreq, 1);
    let (ca, cb) = established(&mut net);
    net.events_b.clear();
    assert_eq!(net.a.disconnects_pending(), 0);
    net.a.disconnect(0, ca, &[]).unwrap();
    net.a.release(0, ca);
    net.settle();
    // The DREQ was lost: B knows nothing, A still waits.
    assert!(net.events_b.is_empty());
    assert_eq!(net.a.disconnects_pending(), 1);
    let before = net.a.counters().retransmits;
    net.a.resend_disconnects();
    net.settle();
    assert_eq!(net.a.counters().retransmits, before + 1);
    assert_eq!(net.events_b, [CmEvent::Disconnected { conn: cb }]);
    assert_eq!(net.a.disconnects_pending(), 0);
    assert_eq!(net.sent(true, CmAttr::Dreq), 1);
    assert_eq!(net.sent(false, CmAttr::Drep), 1);
}

#[test]
fn reject_reaches_the_requester_with_private_data() {
    let mut net = Net::new();
    let ca = net.a.connect(0, ip(B), req()).unwrap();
    net.settle();
    let [CmEvent::Request { conn: cb, .. }] = net.events_b[..] else {
        panic!()
    };
    assert_eq!(
        net.b.reject(cb, reason::CONSUMER, &[0u8; 149]),
        Err(CmError::Invalid("REJ private data longer than 148 bytes"))
    );
    net.b.reject(cb, reason::CONSUMER, b"no").unwrap();
    net.settle();
    let [CmEvent::Rejected { conn, ref rej }] = net.events_a[..] else {
        panic!("{:?}", net.events_a)
    };
    assert_eq!(conn, ca);
    assert_eq!(rej.reason, reason::CONSUMER);
    assert_eq!(&rej.private_data[..2], b"no");
    assert!(net.a.is_empty() && net.b.is_empty());
    assert_eq!(net.b.accept(0, cb, rep()), Err(CmError::NoSuchConn));
}

#[test]
fn sidr_resolves_a_ud_service_and_answers_repeats() {
    let mut net = Net::new();
    let udp = PortSpace::Udp.service_id(7174);
    net.b.listen(udp).unwrap();
    let sreq = CmSidrReq {
        request_id: 0,
        pkey: 0xffff,
        service_id: udp,
        private_data: [0; 216],
    };
    net.drop_first(false, CmAttr::SidrRep, 1);
    let ca = net.a.sidr_request(0, ip(B), sreq).unwrap();
    net.settle();
    let [CmEvent::SidrRequest { conn: cb, .. }] = net.events_b[..] else {
        panic!()
    };
    let rep = CmSidrRep {
        service_id: udp,
        ..sidr_rep_template(
            sidr_status::OK,
            Qpn::new(0x33).unwrap(),
            rdma::RDMA_UDP_QKEY,
        )
    };
    net.b.sidr_reply(0, cb, rep).unwrap();
    net.settle();
    assert!(net.events_a.is_empty(), "the reply was lost");
    net.tick();
    let [CmEvent::SidrReply { conn, rep: ref got }] = net.events_a[..] else {
        panic!("{:?}", net.events_a)
    };
    assert_eq!(conn, ca);
    assert_eq!(got.qpn.value(), 0x33);
    assert_eq!(got.qkey, rdma::RDMA_UDP_QKEY);
    assert_eq!(
        net.events_b.len(),
        1,
        "the repeat was answered from the state"
    );
    // Unknown UD service: status 1.
    net.events_a.clear();
    let other = CmSidrReq {
        service_id: PortSpace::Udp.service_id(9),
        ..sreq
    };
    net.a.sidr_request(0, ip(B), other).unwrap();
    net.settle();
    let [CmEvent::SidrReply { rep: ref got, .. }] = net.events_a[..] else {
        panic!()
    };
    assert_eq!(got.status, sidr_status::UNSUPPORTED);
}

#[test]
fn strays_are_counted_and_answered_per_the_spec() {
    let mut cm = Cm::new(CmConfig::new(1, 1));
    let peer = ip(A);
    let mut buf = [0u8; MAD_LEN];
    // A DREQ for nothing: DREP all the same.
    CmMad::new(
        1,
        CmMessage::Dreq(CmDreq {
            local_comm_id: 5,
            remote_comm_id: 6,
            remote_qpn: Qpn::from_wire(0),
            private_data: [0; 220],
        }),
    )
    .emit(&mut buf)
    .unwrap();
    cm.handle_mad(0, peer, &buf);
    assert_eq!(
        attr_of(&cm.poll_transmit().unwrap().mad),
        CmAttr::Drep as u16
    );
    // A REP for nothing: REJ invalid comm ID.
    CmMad::new(2, CmMessage::Rep(rep())).emit(&mut buf).unwrap();
    cm.handle_mad(0, peer, &buf);
    let CmMessage::Rej(r) = CmMad::parse(&cm.poll_transmit().unwrap().mad)
        .unwrap()
        .message
    else {
        panic!()
    };
    assert_eq!(r.reason, reason::INVALID_COMM_ID);
    // RTU, MRA, REJ, DREP, SIDR_REP for nothing: dropped.
    for m in [
        CmMessage::Rtu(CmIds {
            local_comm_id: 1,
            remote_comm_id: 2,
            private_data: [0; 224],
        }),
        CmMessage::Drep(CmIds {
            local_comm_id: 1,
            remote_comm_id: 2,
            private_data: [0; 224],
        }),
    ] {
        CmMad::new(3, m).emit(&mut buf).unwrap();
        cm.handle_mad(0, peer, &buf);
    }
    assert_eq!(cm.poll_transmit(), None);
    // Wrong class version, wrong method, short, not CM.
    CmMad::new(4, CmMessage::Rep(rep())).emit(&mut buf).unwrap();
    let mut bad = buf;
    bad[2] = 1;
    cm.handle_mad(0, peer, &bad);
    let mut bad = buf;
    bad[3] = 0x81;
    cm.handle_mad(0, peer, &bad);
    cm.handle_mad(0, peer, &buf[..100]);
    let mut bad = buf;
    bad[1] = 0x81;
    cm.handle_mad(0, peer, &bad);
    let c = cm.counters();
    assert_eq!(c.malformed, 4);
    assert_eq!(c.unknown, 4);
    assert_eq!(cm.poll_event(), None);
    assert!(cm.is_empty());
    assert_eq!(MAD_HEADER_LEN, 24);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Any bytes, in any order, in any state: the CM never panics and
    /// never grows without a listener.
    #[test]
    fn arbitrary_mads_never_panic(mads in proptest::collection::vec((proptest::collection::vec(any::<u8>(), 0..300), 0u16..0x20), 1..40)) {
        let mut cm = Cm::new(CmConfig::new(1, 1));
        let mut now = 0;
        for (mut m, attr) in mads {
            if m.len() >= 24 {
                // Mostly well-formed headers, so the bodies get parsed.
                m[0] = 1; m[1] = 7; m[2] = 2; m[3] = 3;
                m[16..18].copy_from_slice(&attr.to_be_bytes());
            }
            cm.handle_mad(now, ip(A), &m);
            now += 100 * MS;
            cm.handle_timeout(now);
            while cm.poll_transmit().is_some() {}
        }
        prop_assert!(cm.poll_event().is_none());
        prop_assert!(cm.is_empty());
    }

    /// Any loss pattern of the first few of each message (short of all of
    /// them): the connection is made and torn down, once, on both sides.
    #[test]
    fn any_bounded_loss_is_recovered(drops in proptest::collection::vec((any::<bool>(), 0x10u16..0x17, 0u32..4), 0..6), fast in any::<(bool, bool)>()) {
        let mut net = Net::with_fast(fast.0, fast.1);
        for (a, attr, n) in drops {
            net.drops.push((a, attr, n));
        }
        connect_and_disconnect(&mut net);
        while net.tick() {}
        prop_assert!(net.a.is_empty() && net.b.is_empty());
    }
}

/// The ECE a burst application offers (selective repeat).
fn burst_offer() -> CmEce {
    CmEce {
        vendor_id: ece::VENDOR_ID,
        options: ece::SELECTIVE_REPEAT,
    }
}

/// A connects offering `offer`; its REQ, not delivered.
fn req_offering(net: &mut Net, offer: CmEce) -> (ConnId, [u8; MAD_LEN]) {
    let ca = net
        .a
        .connect(
            net.now,
            ip(B),
            CmReq {
                ece: offer,
                ..req()
            },
        )
        .unwrap();
    (ca, net.a.poll_transmit().expect("the REQ").mad)
}

/// ECE options ride the REQ and the REP where the kernel's CM puts them
/// (vendor ID in the message, options in the attribute modifier), and
/// come out of the events as they went in; the MAD header says so too.
#[test]
fn ece_options_cross_in_the_req_and_the_rep() {
    // Without the CM's own option, which the next tests cover.
    let mut net = Net::with_fast(false, false);
    let offer = burst_offer();
    let (ca, mad) = req_offering(&mut net, offer);
    assert_eq!(
        &mad[20..24],
        &1u32.to_be_bytes(),
        "options in the attribute modifier"
    );
    assert_eq!(
        &mad[24 + 5..24 + 8],
        &[0xb0, 0x57, 0xb0],
        "vendor ID in REQ bytes 5-7"
    );
    net.b.handle_mad(net.now, ip(A), &mad);
    let Some(CmEvent::Request { conn, req, .. }) = net.b.poll_event() else {
        panic!("no request")
    };
    assert_eq!(req.ece, offer);
    net.b
        .accept(
            net.now,
            conn,
            CmRep {
                ece: offer,
                ..rep()
            },
        )
        .unwrap();
    let mad = net.b.poll_transmit().expect("the REP").mad;
    assert_eq!(
        [mad[24 + 15], mad[24 + 19], mad[24 + 23]],
        [0xb0, 0x57, 0xb0]
    );
    net.a.handle_mad(net.now, ip(B), &mad);
    match net.a.poll_event() {
        Some(CmEvent::Reply { conn, rep }) => {
            assert_eq!(conn, ca);
            assert_eq!(rep.ece, offer);
        }
        e => panic!("A: {e:?}"),
    }
}

/// 1,000 connections opened at once to one peer whose CM handles one MAD
/// a millisecond (a queue in front of it, as a busy host's): with the REQ
/// window, at most 256 REQs are in flight and hardly any is sent again
/// (the window adapts to the peer); without it, the REQs at the back
/// outlive their timeout in the peer's queue and are sent again (the
/// storm the window prevents).
#[test]
fn connects_to_one_busy_peer_are_paced_without_retransmissions() {
    fn run(window: u32) -> (u64, usize, u64) {
        let mut cfg = CmConfig::new(0xa, 1);
        cfg.max_reqs_in_flight = window;
        let mut a = Cm::new(cfg);
        let mut b = Cm::new(CmConfig::new(0xb, 2));
        b.listen(svc()).unwrap();
        let n = 1000;
        for _ in 0..n {
            a.connect(0, ip(B), req()).unwrap();
        }
        let (mut to_b, mut to_a) = (VecDeque::new(), VecDeque::new());
        let (mut now, mut established, mut most_reqs) = (0u64, 0usize, 0usize);
        while established < n && now < 60_000 * MS {
            while let Some(t) = a.poll_transmit() {
                to_b.push_back(t.mad);
            }
            let reqs = to_b
                .iter()
                .filter(|m| attr_of(m) == CmAttr::Req as u16)
                .count();
            most_reqs = most_reqs.max(reqs);
            if let Some(m) = to_b.pop_front() {
                b.handle_mad(now, ip(A), &m);
            }
            while let Some(e) = b.poll_event() {
                match e {
                    CmEvent::Request { conn, .. } => {
                        b.accept(now, conn, rep()).unwrap();
                    }
                    // The RTU arrived (the standard or the fast setup).
                    CmEvent::Established { .. } | CmEvent::PeerReady { .. } => established += 1,
                    e => panic!("B: {e:?}"),
                }
            }
            while let Some(t) = b.poll_transmit() {
                to_a.push_back(t.mad);
            }
            while let Some(m) = to_a.pop_front() {
                a.handle_mad(now, ip(B), &m);
            }
            while let Some(e) = a.poll_event() {
                match e {
                    CmEvent::Reply { conn, .. } => a.establish(now, conn).unwrap(),
                    e => panic!("A: {e:?}"),
                }
            }
            now += MS;
            a.handle_timeout(now);
            b.handle_timeout(now);
        }
        assert_eq!(
            established, n,
            "window {window}: every connection established"
        );
        (a.counters().retransmits, most_reqs, now)
    }
    let (resent, most, took) = run(256);
    let (storm, most_unpaced, took_unpaced) = run(0);
    println!("paced: {resent} resent, {most} REQs queued at most, {took} ns; unpaced: {storm}, {most_unpaced}, {took_unpaced} ns");
    assert!(most <= 256, "{most} REQs waiting at the peer at once");
    assert!(
        storm >= 100 && most_unpaced > 256,
        "unpaced: {storm} resent, {most_unpaced} queued"
    );
    assert!(
        resent * 10 <= storm,
        "paced: {resent} resent against {storm}"
    );
    // Pacing costs no time: the peer's queue was the bound either way.
    assert!(
        took <= took_unpaced,
        "{took} ns paced, {took_unpaced} unpaced"
    );
}

/// Both CMs burst's: the REQ offers the fast setup beside the
/// application's ECE options, the passive side is established when it
/// sends its REP (one round trip for the whole setup: REQ, REP), its REP
/// confirms the option, and the RTU that follows only says the active QP
/// receives (PeerReady). The wire is the IB CM's: the same three messages.
#[test]
fn burst_peers_set_up_in_one_round_trip() {
    let mut net = Net::new();
    let offer = burst_offer();
    let (ca, mad) = req_offering(&mut net, offer);
    assert_eq!(
        &mad[20..24],
        &(ece::SELECTIVE_REPEAT | ece::FAST_SETUP).to_be_bytes(),
        "the application's option and the CM's"
    );
    net.b.handle_mad(net.now, ip(A), &mad);
    let Some(CmEvent::Request { conn: cb, req, .. }) = net.b.poll_event() else {
        panic!("no request")
    };
    assert!(ece::offers(&req.ece, ece::SELECTIVE_REPEAT));
    assert!(net.b.is_fast(cb));
    let agreed = CmRep {
        ece: offer,
        ..rep()
    };
    assert_eq!(
        net.b.accept(net.now, cb, agreed),
        Ok(true),
        "established at the REP"
    );
    assert!(net.b.poll_event().is_none(), "no event: the caller knows");
    let mad = net.b.poll_transmit().expect("the REP").mad;
    net.a.handle_mad(net.now, ip(B), &mad);
    let Some(CmEvent::Reply { conn, rep }) = net.a.poll_event() else {
        panic!("no reply")
    };
    assert_eq!(conn, ca);
    assert!(ece::offers(&rep.ece, ece::FAST_SETUP) && ece::offers(&rep.ece, ece::SELECTIVE_REPEAT));
    net.a.establish(net.now, ca).unwrap();
    net.settle();
    assert_eq!(net.events_b, [CmEvent::PeerReady { conn: cb }]);
    assert_eq!(net.sent(true, CmAttr::Rtu), 1);
    assert_eq!(net.b.poll_timeout(), None, "the REP's timer stopped");
}

/// A fast REQ meeting a standard peer (a burst CM with the option off, as
/// the kernel's CM which never echoes it), or a standard REQ meeting a
/// fast CM, or a fast REQ whose application cannot hold its QP back
/// (`decline_fast`): the standard exchange, established at the RTU.
#[test]
fn the_fast_setup_falls_back_to_the_standard_exchange() {
    for (fast_a, fast_b, decline) in [
        (true, false, false),
        (false, true, false),
        (true, true, true),
    ] {
        let mut net = Net::with_fast(fast_a, fast_b);
        let ca = net.a.connect(net.now, ip(B), req()).unwrap();
        net.settle();
        let [CmEvent::Request {
            conn: cb, ref req, ..
        }] = net.events_b[..]
        else {
            panic!("{:?}", net.events_b)
        };
        assert_eq!(ece::offers(&req.ece, ece::FAST_SETUP), fast_a);
        net.events_b.clear();
        if decline {
            net.b.decline_fast(cb);
        }
        assert!(!net.b.is_fast(cb));
        assert_eq!(net.b.accept(net.now, cb, rep()), Ok(false));
        net.settle();
        let [CmEvent::Reply { ref rep, .. }] = net.events_a[..] else {
            panic!("{:?}", net.events_a)
        };
        assert!(
            !ece::offers(&rep.ece, ece::FAST_SETUP),
            "the REP does not confirm"
        );
        assert!(net.events_b.is_empty(), "not established before the RTU");
        net.a.establish(net.now, ca).unwrap();
        net.settle();
        assert_eq!(net.events_b, [CmEvent::Established { conn: cb }]);
    }
}

/// Set up fast, and the active side goes away before its RTU: the REP is
/// sent again until the retries run out, then the passive side, which was
/// already established, is disconnected (not "unreachable") and told the
/// peer why (REJ timeout).
#[test]
fn a_fast_connection_whose_rtu_never_comes_is_disconnected() {
    let mut net = Net::new();
    net.a.connect(net.now, ip(B), req()).unwrap();
    net.settle();
    let [CmEvent::Request { conn: cb, .. }] = net.events_b[..] else {
        panic!("{:?}", net.events_b)
    };
    net.events_b.clear();
    assert_eq!(net.b.accept(net.now, cb, rep()), Ok(true));
    // A is gone: nothing B sends arrives.
    net.drop_first(false, CmAttr::Rep, u32::MAX);
    net.drop_first(false, CmAttr::Rej, u32::MAX);
    while net.tick() {
        if !net.events_b.is_empty() {
            break;
        }
    }
    assert_eq!(net.events_b, [CmEvent::Disconnected { conn: cb }]);
    assert_eq!(
        net.b.counters().retransmits,
        u64::from(net.b.config().max_retries)
    );
    while net.tick() {}
    assert!(net.b.is_empty());
}

/// Set up fast, the passive side is established at its REP and may end
/// the connection at once (an application that exits after accepting):
/// its DREQ can reach the active side together with the REP, before the
/// application took the reply. The active side is still told ESTABLISHED
/// first (its RTU goes out), then DISCONNECTED, and the DREQ is answered.
#[test]
fn a_dreq_right_behind_the_rep_disconnects_after_the_establishment() {
    let mut net = Net::new();
    let ca = net.a.connect(net.now, ip(B), req()).unwrap();
    net.settle();
    let [CmEvent::Request { conn: cb, .. }] = net.events_b[..] else {
        panic!("{:?}", net.events_b)
    };
    net.events_b.clear();
    assert_eq!(net.b.accept(net.now, cb, rep()), Ok(true));
    net.b.disconnect(net.now, cb, &[]).unwrap();
    // The REP and the DREQ reach A before A's application looks.
    while let Some(t) = net.b.poll_transmit() {
        net.a.handle_mad(net.now, ip(B), &t.mad);
    }
    let Some(CmEvent::Reply { conn, .. }) = net.a.poll_event() else {
        panic!("no reply")
    };
    assert_eq!(conn, ca);
    assert!(net.a.poll_event().is_none(), "not disconnected before up");
    net.a.establish(net.now, ca).unwrap();
    assert_eq!(net.a.poll_event(), Some(CmEvent::Disconnected { conn: ca }));
    net.settle();
    assert_eq!(net.sent(true, CmAttr::Rtu), 1);
    assert_eq!(net.sent(true, CmAttr::Drep), 1, "the DREQ answered");
    assert!(
        net.events_b.contains(&CmEvent::Disconnected { conn: cb }),
        "{:?}",
        net.events_b
    );
    while net.tick() {}
    assert!(net.a.is_empty() && net.b.is_empty());
}
