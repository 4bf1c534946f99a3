//! Property tests: emit/parse round trips for every opcode and header
//! combination, no panic on arbitrary bytes, and ICRC coverage of every bit.

use std::net::{Ipv4Addr, Ipv6Addr};

use burst_wire::mad::*;
use burst_wire::*;
use proptest::prelude::*;

fn arb_syndrome() -> impl Strategy<Value = Syndrome> {
    any::<u8>().prop_map(Syndrome::from_byte)
}

fn arb_ib() -> impl Strategy<Value = IbRepr> {
    (
        proptest::sample::select(Opcode::ALL.to_vec()),
        any::<(bool, bool, u16, bool, bool, bool)>(),
        0u32..(1 << 24),
        any::<u32>(),
        any::<(u64, u32, u32, u64, u64)>(),
        (
            arb_syndrome(),
            0u32..(1 << 24),
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
        ),
        0usize..=4096,
    )
        .prop_map(
            |(
                op,
                (se, m, pkey, fecn, becn, ack),
                qpn,
                psn,
                (va, rkey, len, a, b),
                (syn, msn, orig, imm, qkey),
                plen,
            )| {
                let mut bth = BthRepr::new(op, Qpn::new(qpn).unwrap(), Psn::new(psn));
                bth.solicited = se;
                bth.mig_req = m;
                bth.pkey = pkey;
                bth.fecn = fecn;
                bth.becn = becn;
                bth.ack_req = ack;
                bth.resv7 = (msn >> 17) as u8 & 0x7f;
                let info = op.info().unwrap();
                let h = info.headers;
                let mut ib = IbRepr::new(bth);
                let has = |x| h.contains(x) && info.transport != Transport::Cnp;
                if has(HeaderSet::DETH) {
                    ib.deth = Some(DethRepr {
                        qkey,
                        src_qp: Qpn::from_wire(psn),
                    });
                }
                if has(HeaderSet::RETH) {
                    ib.reth = Some(RethRepr {
                        virtual_address: va,
                        rkey,
                        dma_length: len,
                    });
                }
                if has(HeaderSet::ATOMIC_ETH) {
                    ib.atomic_eth = Some(AtomicEthRepr {
                        virtual_address: va,
                        rkey,
                        swap_add: a,
                        compare: b,
                    });
                }
                if has(HeaderSet::AETH) {
                    ib.aeth = Some(AethRepr { syndrome: syn, msn });
                }
                if has(HeaderSet::ATOMIC_ACK_ETH) {
                    ib.atomic_ack = Some(orig);
                }
                if has(HeaderSet::IMM_DT) {
                    ib.imm = Some(imm);
                }
                if has(HeaderSet::IETH) {
                    ib.ieth = Some(rkey);
                }
                if info.has_payload {
                    ib.payload_len = plen;
                }
                ib.bth.pad_count = ib.pad_count();
                ib
            },
        )
}

fn arb_ip() -> impl Strategy<Value = IpRepr> {
    prop_oneof![
        (
            any::<[u8; 4]>(),
            any::<[u8; 4]>(),
            0u8..64,
            0u8..4,
            any::<u16>(),
            any::<bool>(),
            any::<u8>()
        )
            .prop_map(|(s, d, dscp, ecn, ident, df, ttl)| IpRepr::V4(Ipv4Repr {
                src: Ipv4Addr::from(s),
                dst: Ipv4Addr::from(d),
                dscp,
                ecn,
                ident,
                dont_frag: df,
                ttl,
            })),
        (
            any::<[u8; 16]>(),
            any::<[u8; 16]>(),
            any::<u8>(),
            0u32..(1 << 20),
            any::<u8>()
        )
            .prop_map(|(s, d, tc, fl, hl)| IpRepr::V6(Ipv6Repr {
                src: Ipv6Addr::from(s),
                dst: Ipv6Addr::from(d),
                traffic_class: tc,
                flow_label: fl,
                hop_limit: hl,
            })),
    ]
}

fn arb_frame() -> impl Strategy<Value = (FrameRepr, Vec<u8>)> {
    (
        arb_ib(),
        arb_ip(),
        any::<(u16, [u8; 6], [u8; 6])>(),
        proptest::option::of((0u8..8, any::<bool>(), 0u16..4096)),
        any::<u64>(),
    )
        .prop_map(|(ib, ip, (sport, src, dst), vlan, seed)| {
            let f = FrameRepr {
                eth: Some(EthRepr {
                    src,
                    dst,
                    vlan: vlan.map(|(pcp, dei, vid)| VlanTag { pcp, dei, vid }),
                }),
                ip,
                udp: UdpRepr::new(sport),
                ib,
            };
            let payload: Vec<u8> = (0..ib.payload_len)
                .map(|i| (seed.rotate_left(i as u32 % 64) as u8) ^ i as u8)
                .collect();
            (f, payload)
        })
}

/// Bytes of the frame the ICRC deliberately does not cover (or that are
/// covered by the IPv4 header checksum instead).
fn icrc_masked(f: &FrameRepr, at: usize, bit: u8) -> bool {
    let ip = f.ip_offset();
    let udp = ip + f.ip.header_len();
    let bth = f.ib_offset();
    if at < ip {
        return true; // L2 is outside the ICRC
    }
    if at == udp + 6 || at == udp + 7 || at == bth + 4 {
        return true; // UDP checksum; FECN/BECN/reserved
    }
    match f.ip {
        IpRepr::V4(_) => false, // TOS/TTL/checksum are masked, but the header checksum catches them
        IpRepr::V6(_) => {
            let o = at - ip;
            (o == 0 && bit < 4) || o == 1 || o == 2 || o == 3 || o == 7
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn emit_parse_round_trip((f, payload) in arb_frame()) {
        let mut buf = vec![0u8; f.frame_len()];
        let n = f.emit(&mut buf, &payload).unwrap();
        prop_assert_eq!(n, buf.len());
        let rx = parse_verified(&buf).unwrap();
        prop_assert_eq!(rx.repr().unwrap(), f);
        prop_assert_eq!(rx.ib.payload(), &payload[..]);
        // and from the IP header on
        let ip = RoceFrame::parse_ip(&buf[f.ip_offset()..]).unwrap();
        ip.verify_icrc().unwrap();
        prop_assert_eq!(ip.repr().unwrap(), FrameRepr { eth: None, ..f });
    }

    #[test]
    fn any_single_bit_flip_under_the_icrc_is_caught((f, payload) in arb_frame(), pick in any::<proptest::sample::Index>(), bit in 0u8..8) {
        let mut buf = vec![0u8; f.frame_len()];
        f.emit(&mut buf, &payload).unwrap();
        let at = f.ip_offset() + pick.index(buf.len() - f.ip_offset());
        prop_assume!(!icrc_masked(&f, at, bit));
        buf[at] ^= 1 << bit;
        prop_assert!(parse_verified(&buf).is_err(), "flip of byte {} bit {} went unnoticed", at, bit);
    }

    #[test]
    fn masked_fields_do_not_change_the_icrc((f, payload) in arb_frame(), ecn in 0u8..4, becn: bool) {
        let mut buf = vec![0u8; f.frame_len()];
        f.emit(&mut buf, &payload).unwrap();
        let mut g = f;
        g.ib.bth.becn = becn;
        g.ib.bth.fecn = !becn;
        match &mut g.ip {
            IpRepr::V4(v) => { v.ecn = ecn; v.ttl = v.ttl.wrapping_sub(1); }
            IpRepr::V6(v) => { v.traffic_class ^= ecn; v.hop_limit = v.hop_limit.wrapping_sub(1); }
        }
        let mut buf2 = vec![0u8; g.frame_len()];
        g.emit(&mut buf2, &payload).unwrap();
        let icrc = |b: &[u8]| u32::from_le_bytes(b[b.len() - 4..].try_into().unwrap());
        prop_assert_eq!(icrc(&buf), icrc(&buf2));
    }

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..600)) {
        if let Ok(f) = RoceFrame::parse_ethernet(&data) {
            let _ = f.verify_icrc();
            let _ = f.ud_grh();
            let _ = f.repr();
            let _ = f.ib.payload();
        }
        if let Ok(f) = RoceFrame::parse_ip(&data) {
            let _ = f.verify_icrc();
            let _ = f.repr();
        }
        if let Ok(p) = IbPacket::new_checked(&data[..]) {
            let _ = IbRepr::parse(&p);
            let _ = (p.payload(), p.icrc(), p.reth(), p.aeth(), p.deth(), p.atomic_eth(), p.atomic_ack_eth(), p.imm_dt(), p.ieth());
        }
        let _ = CmMad::parse(&data);
    }

    #[test]
    fn mutated_valid_frames_never_panic((f, payload) in arb_frame(), edits in proptest::collection::vec((any::<proptest::sample::Index>(), any::<u8>()), 1..8), cut in any::<proptest::sample::Index>()) {
        let mut buf = vec![0u8; f.frame_len()];
        f.emit(&mut buf, &payload).unwrap();
        for (i, v) in edits {
            let at = i.index(buf.len());
            buf[at] = v;
        }
        let len = cut.index(buf.len() + 1);
        if let Ok(rx) = RoceFrame::parse_ethernet(&buf[..len]) {
            let _ = rx.verify_icrc();
            if let Ok(r) = rx.repr() {
                let mut out = vec![0u8; r.frame_len()];
                prop_assert!(r.emit(&mut out, rx.ib.payload()).is_ok());
            }
        }
    }

    #[test]
    fn cm_mads_round_trip(tid: u64, ids in any::<(u32, u32, u32)>(), psn in 0u32..(1 << 24), qpn in 0u32..(1 << 24), bytes in proptest::collection::vec(any::<u8>(), 232), kind in 0u8..9) {
        let (a, b, qkey) = ids;
        let pd = |n: usize| bytes[..n].to_vec();
        let msg = match kind {
            0 => {
                let path = CmPath {
                    local_lid: a as u16, remote_lid: b as u16,
                    local_gid: bytes[0..16].try_into().unwrap(),
                    remote_gid: bytes[16..32].try_into().unwrap(),
                    flow_label: psn & 0xf_ffff, packet_rate: bytes[0] & 0x3f,
                    traffic_class: bytes[1], hop_limit: bytes[2], sl: bytes[3] & 0xf,
                    subnet_local: bytes[4] & 1 == 1, local_ack_timeout: bytes[5] & 0x1f,
                };
                CmMessage::Req(CmReq {
                    local_comm_id: a, service_id: tid, local_ca_guid: !tid, local_qkey: qkey,
                    local_qpn: Qpn::from_wire(qpn), responder_resources: bytes[6], local_eecn: psn,
                    initiator_depth: bytes[7], remote_eecn: qpn, remote_cm_response_timeout: bytes[8] & 0x1f,
                    transport: CmTransport::Uc, end_to_end_flow_control: bytes[9] & 1 == 1,
                    starting_psn: Psn::new(psn), local_cm_response_timeout: bytes[10] & 0x1f,
                    retry_count: bytes[11] & 7, pkey: b as u16, path_mtu: bytes[12] & 0xf,
                    rdc_exists: bytes[13] & 1 == 1, rnr_retry_count: bytes[14] & 7,
                    max_cm_retries: bytes[15] & 0xf, srq: bytes[16] & 1 == 1,
                    extended_transport_type: bytes[17] & 7, primary_path: path,
                    alternate_path: CmPath { sl: 3, ..path }, sap_supported: bytes[18] & 1 == 1,
                    private_data: pd(92).try_into().unwrap(),
                    ece: CmEce { vendor_id: qkey & 0xff_ffff, options: b },
                })
            }
            1 => CmMessage::Rep(CmRep {
                local_comm_id: a, remote_comm_id: b, local_qkey: qkey, local_qpn: Qpn::from_wire(qpn),
                local_eecn: psn, starting_psn: Psn::new(psn), responder_resources: bytes[0],
                initiator_depth: bytes[1], target_ack_delay: bytes[2] & 0x1f, failover_accepted: bytes[3] & 3,
                end_to_end_flow_control: bytes[4] & 1 == 1, rnr_retry_count: bytes[5] & 7,
                srq: bytes[6] & 1 == 1, local_ca_guid: tid, private_data: pd(196).try_into().unwrap(),
                ece: CmEce { vendor_id: a & 0xff_ffff, options: qkey },
            }),
            2 => CmMessage::Rej(CmRej {
                local_comm_id: a, remote_comm_id: b, message_rejected: bytes[0] & 3,
                reject_info_length: bytes[1] & 0x7f, reason: qkey as u16,
                ari: pd(72).try_into().unwrap(), private_data: pd(148).try_into().unwrap(),
            }),
            3 => CmMessage::Mra(CmMra {
                local_comm_id: a, remote_comm_id: b, message_mraed: bytes[0] & 3,
                service_timeout: bytes[1] & 0x1f, private_data: pd(222).try_into().unwrap(),
            }),
            4 => CmMessage::Rtu(CmIds { local_comm_id: a, remote_comm_id: b, private_data: pd(224).try_into().unwrap() }),
            5 => CmMessage::Dreq(CmDreq { local_comm_id: a, remote_comm_id: b, remote_qpn: Qpn::from_wire(qpn), private_data: pd(220).try_into().unwrap() }),
            6 => CmMessage::Drep(CmIds { local_comm_id: a, remote_comm_id: b, private_data: pd(224).try_into().unwrap() }),
            7 => CmMessage::SidrReq(CmSidrReq { request_id: a, pkey: b as u16, service_id: tid ^ 0x0106_0000, private_data: pd(216).try_into().unwrap() }),
            _ => CmMessage::SidrRep(CmSidrRep {
                request_id: a, status: (b & 7) as u8, add_info_length: bytes[0] & 0x7f, qpn: Qpn::from_wire(qpn),
                service_id: tid, qkey, class_port_info: pd(72).try_into().unwrap(), private_data: pd(136).try_into().unwrap(),
            }),
        };
        let mad = CmMad::new(tid, msg);
        let mut buf = [0u8; MAD_LEN];
        mad.emit(&mut buf).unwrap();
        prop_assert_eq!(CmMad::parse(&buf).unwrap(), mad);
    }

    #[test]
    fn psn_distance_is_antisymmetric(a in 0u32..(1 << 24), d in -(1i32 << 23) + 1..(1i32 << 23)) {
        let p = Psn::new(a);
        let q = p + d as u32;
        prop_assert_eq!(p.distance_to(q), d);
        prop_assert_eq!(q.distance_to(p), -d);
        prop_assert_eq!(p.is_before(q), d > 0);
    }
}
