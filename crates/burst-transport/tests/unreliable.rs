//! UC and UD behaviour.

use burst_transport::sim::{run_workload, Access, Faults, WorkloadOptions, World};
use burst_transport::*;
use burst_wire::{Mtu, Opcode, Psn};

fn sge(k: u32, a: u64, len: usize) -> SgList {
    [Sge {
        addr: a,
        length: len as u32,
        lkey: k,
    }]
    .into()
}

#[test]
fn uc_loss_drops_the_message_and_the_next_one_starts_cleanly() {
    let mut w = World::new(1, 2, Faults::default());
    let a = w.add_qp(0, QpType::Uc, Mtu::Mtu1024);
    let b = w.add_qp(1, QpType::Uc, Mtu::Mtu1024);
    w.connect(a, Some(b), Mtu::Mtu1024, Psn::new(0xffffff), Psn::new(3))
        .unwrap();
    let (k1, a1) = w.mems[0].register(1, 3000, Access::ALL);
    w.mems[0].bytes_mut(k1).fill(1);
    let (k2, a2) = w.mems[0].register(1, 2500, Access::ALL);
    w.mems[0].bytes_mut(k2).fill(2);
    let (rk, ra) = w.mems[1].register(1, 4096, Access::ALL);
    {
        let (_, q) = &mut w.qps[b];
        q.post_recv(RecvWr {
            wr_id: 77,
            sg_list: sge(rk, ra, 4096),
        })
        .unwrap();
    }
    w.drop_next(Opcode::UC_SEND_MIDDLE, 1);
    for (id, k, ad, len) in [(1u64, k1, a1, 3000usize), (2, k2, a2, 2500)] {
        let (n, q) = &mut w.qps[a];
        q.post_send(
            SendWr::new(id, SendOp::SendWithImm(id as u32), sge(k, ad, len)),
            &mut w.mems[*n],
        )
        .unwrap();
    }
    assert!(w.run(1_000_000_000, |w| w.completions[a].len() == 2
        && !w.completions[b].is_empty()));
    // the sender saw both complete (UC has no ACKs)
    assert!(w.completions[a]
        .iter()
        .all(|c| c.status == WcStatus::Success));
    // the receiver got the second message, in the receive the first one left
    let r = w.completions[b].pop_front().unwrap();
    assert_eq!((r.wr_id, r.byte_len, r.imm_data), (77, 2500, Some(2)));
    assert!(w.mems[1].bytes(rk)[..2500].iter().all(|&x| x == 2));
    assert!(w.completions[b].is_empty());
}

#[test]
fn ud_delivers_grh_and_checks_qkey() {
    let mut w = World::new(1, 2, Faults::default());
    let a = w.add_qp(0, QpType::Ud, Mtu::Mtu1024);
    let b = w.add_qp(1, QpType::Ud, Mtu::Mtu1024);
    w.connect(a, None, Mtu::Mtu1024, Psn::new(0), Psn::new(0))
        .unwrap();
    w.connect(b, None, Mtu::Mtu1024, Psn::new(0), Psn::new(0))
        .unwrap();
    let bq = w.qps[b].1.qpn();
    let (k, ad) = w.mems[0].register(1, 1024, Access::ALL);
    w.mems[0].bytes_mut(k).fill(9);
    let (rk, ra) = w.mems[1].register(1, 2048, Access::ALL);
    for id in 0..2 {
        let (_, q) = &mut w.qps[b];
        q.post_recv(RecvWr {
            wr_id: id,
            sg_list: sge(rk, ra + id * 1024, 1024),
        })
        .unwrap();
    }
    for (id, qkey) in [(1u64, 0xdead), (2, 0x1111_1111)] {
        let mut wr = SendWr::new(id, SendOp::Send, sge(k, ad, 900));
        wr.ud = Some(UdDest {
            remote_qpn: bq,
            remote_qkey: qkey,
            ah: 1,
        });
        let (n, q) = &mut w.qps[a];
        q.post_send(wr, &mut w.mems[*n]).unwrap();
    }
    assert!(w.run(1_000_000_000, |w| w.completions[a].len() == 2
        && !w.completions[b].is_empty()));
    let r = w.completions[b].pop_front().unwrap();
    // the wrong Q_Key was dropped; the right one landed after a 40-byte GRH
    assert_eq!(
        (r.wr_id, r.byte_len, r.grh, r.src_qp),
        (0, 940, Some(NetworkHeader::Ipv4), w.qps[a].1.qpn())
    );
    let buf = w.mems[1].bytes(rk);
    assert_eq!(
        buf[20] >> 4,
        4,
        "IPv4 header in the last 20 bytes of the GRH"
    );
    assert!(buf[40..940].iter().all(|&x| x == 9));
    assert_eq!(w.qps[b].1.counters().dropped_pkts, 1);
    // larger than the MTU is refused at post time
    let mut big = SendWr::new(3, SendOp::Send, sge(k, ad, 1024));
    big.sg_list
        .push(Sge {
            addr: ad,
            length: 1,
            lkey: k,
        })
        .unwrap();
    big.ud = Some(UdDest {
        remote_qpn: bq,
        remote_qkey: 0x1111_1111,
        ah: 1,
    });
    let (n, q) = &mut w.qps[a];
    assert!(q.post_send(big, &mut w.mems[*n]).is_err());
}

/// A few seeds of the full workload in the ordinary test run; the thousand
/// seed sweep is `cargo xtask test`'s sim step.
#[test]
fn workload_seeds_pass_under_faults() {
    let o = WorkloadOptions {
        faults: Faults {
            loss: 0.05,
            reorder: 0.05,
            dup: 0.01,
            corrupt: 0.01,
            ..Faults::default()
        },
        max_size: 256 * 1024,
        ops_per_pair: 24,
        ..WorkloadOptions::default()
    };
    for seed in 1..=8 {
        let s = run_workload(seed, &o).unwrap_or_else(|e| panic!("{e}"));
        assert!(s.ops > 0 && s.net.lost > 0);
    }
}

/// UC WRITE WITH IMMEDIATE needs a receive WQE, as RC's does: without one
/// the message is dropped (class D) before its last packet lands, and the
/// next one, with a receive posted, completes (the placement code RC and
/// UC share).
#[test]
fn uc_write_with_imm_without_a_receive_is_dropped() {
    let mut w = World::new(2, 2, Faults::default());
    let a = w.add_qp(0, QpType::Uc, Mtu::Mtu1024);
    let b = w.add_qp(1, QpType::Uc, Mtu::Mtu1024);
    w.connect(a, Some(b), Mtu::Mtu1024, Psn::new(1), Psn::new(9))
        .unwrap();
    let (k, ad) = w.mems[0].register(1, 512, Access::ALL);
    w.mems[0].bytes_mut(k).fill(5);
    let (rk, ra) = w.mems[1].register(1, 1024, Access::ALL);
    let write = |id: u64, off: u64| {
        SendWr::new(
            id,
            SendOp::WriteWithImm {
                remote_addr: ra + off,
                rkey: rk,
                imm: id as u32,
            },
            sge(k, ad, 512),
        )
    };
    {
        let (n, q) = &mut w.qps[a];
        q.post_send(write(1, 0), &mut w.mems[*n]).unwrap();
    }
    assert!(w.run(1_000_000_000, |w| w.completions[a].len() == 1));
    w.run(10_000_000, |_| false);
    assert!(w.completions[b].is_empty(), "no receive, no completion");
    assert!(
        w.mems[1].bytes(rk)[..512].iter().all(|&x| x == 0),
        "dropped before its (only) packet landed"
    );
    assert_eq!(w.qps[b].1.counters().dropped_pkts, 1);
    {
        let (_, q) = &mut w.qps[b];
        q.post_recv(RecvWr {
            wr_id: 8,
            sg_list: SgList::new(),
        })
        .unwrap();
    }
    {
        let (n, q) = &mut w.qps[a];
        q.post_send(write(2, 512), &mut w.mems[*n]).unwrap();
    }
    assert!(w.run(1_000_000_000, |w| !w.completions[b].is_empty()));
    let r = w.completions[b].pop_front().unwrap();
    assert_eq!(
        (r.wr_id, r.status, r.opcode, r.byte_len, r.imm_data),
        (
            8,
            WcStatus::Success,
            WcOpcode::RecvRdmaWithImm,
            512,
            Some(2)
        )
    );
    assert!(w.mems[1].bytes(rk)[512..].iter().all(|&x| x == 5));
}
