//! RDMA ATOMIC WRITE (IBA 1.5; RXE since Linux 6.2): 8 bytes stored as one
//! store after every earlier request, answered by a zero-length READ
//! RESPONSE ONLY, never executed twice, refused as RXE refuses it.

use burst_transport::sim::{Access, Faults};
use burst_transport::*;
use burst_wire::{Mtu, Opcode};

mod common;
use common::Pair;

fn atomic_write(id: u64, k: u32, a: u64, remote_addr: u64, rkey: u32) -> SendWr {
    SendWr::new(
        id,
        SendOp::AtomicWrite { remote_addr, rkey },
        [Sge {
            addr: a,
            length: 8,
            lkey: k,
        }],
    )
}

impl Pair {
    fn post(&mut self, wr: SendWr) {
        let (n, qp) = &mut self.w.qps[self.a];
        qp.post_send(wr, &mut self.w.mems[*n]).unwrap();
    }

    /// Runs until `n` send completions; returns them.
    fn sends(&mut self, n: usize) -> Vec<WorkCompletion> {
        let a = self.a;
        let ok = self.w.run(10_000_000_000, |w| w.completions[a].len() >= n);
        let s: Vec<_> = self.w.completions[a].drain(..).collect();
        assert!(ok, "not done: {s:?}");
        s
    }
}

#[test]
fn an_atomic_write_lands_after_the_write_before_it_and_completes_as_one() {
    let mut p = Pair::connected(7, Faults::default(), Mtu::Mtu1024, 3);
    let (sk, sa) = p.buf(0, 4096, 1);
    let (rk, ra) = p.buf(1, 4096 + 8, 0);
    let (vk, va) = p.buf(0, 8, 0);
    p.w.mems[0]
        .bytes_mut(vk)
        .copy_from_slice(&0x1122_3344_5566_7788u64.to_ne_bytes());
    // The data, then the flag that says it is there.
    p.post(SendWr::new(
        1,
        SendOp::Write {
            remote_addr: ra,
            rkey: rk,
        },
        [Sge {
            addr: sa,
            length: 4096,
            lkey: sk,
        }],
    ));
    p.post(atomic_write(2, vk, va, ra + 4096, rk));
    let s = p.sends(2);
    assert_eq!(s[1].status, WcStatus::Success, "{s:?}");
    assert_eq!(s[1].opcode, WcOpcode::AtomicWrite);
    assert_eq!(s[1].byte_len, 8);
    let mem = p.w.mems[1].bytes(rk);
    assert_eq!(&mem[..4096], p.w.mems[0].bytes(sk));
    assert_eq!(&mem[4096..], &0x1122_3344_5566_7788u64.to_ne_bytes());
}

#[test]
fn its_response_is_a_zero_length_read_response_and_a_lost_one_is_replayed_not_redone() {
    let mut p = Pair::connected(7, Faults::default(), Mtu::Mtu1024, 3);
    let (rk, ra) = p.buf(1, 8, 0);
    let (vk, va) = p.buf(0, 8, 0);
    p.w.mems[0]
        .bytes_mut(vk)
        .copy_from_slice(&7u64.to_ne_bytes());
    // The only response the requester needs is this one: dropped once.
    p.w.drop_next(Opcode::RC_RDMA_READ_RESPONSE_ONLY, 1);
    p.post(atomic_write(1, vk, va, ra, rk));
    let b = p.b;
    let stored = p.w.run(10_000_000_000, |w| {
        w.mems[1].bytes(rk) == 7u64.to_ne_bytes() && w.dropped_by_rule == 1
    });
    assert!(stored, "executed and answered once");
    // Changed by the application before the requester asks again: a
    // replay must not store the value a second time.
    p.w.mems[1]
        .bytes_mut(rk)
        .copy_from_slice(&9u64.to_ne_bytes());
    let s = p.sends(1);
    assert_eq!(s[0].status, WcStatus::Success, "{s:?}");
    assert_eq!(p.w.qps[b].1.counters().duplicate_request, 1);
    assert_eq!(p.w.mems[1].bytes(rk), &9u64.to_ne_bytes(), "not redone");
}

#[test]
fn inline_bytes_are_what_is_stored() {
    let mut p = Pair::connected(7, Faults::default(), Mtu::Mtu1024, 3);
    let (rk, ra) = p.buf(1, 16, 0);
    let mut wr = SendWr::new(
        1,
        SendOp::AtomicWrite {
            remote_addr: ra + 8,
            rkey: rk,
        },
        [Sge {
            addr: 0,
            length: 8,
            lkey: 0,
        }],
    );
    wr.inline = true;
    wr.inline_data = Some(InlineData::try_from_slice(&42u64.to_ne_bytes()).unwrap());
    p.post(wr);
    let s = p.sends(1);
    assert_eq!(s[0].status, WcStatus::Success, "{s:?}");
    assert_eq!(&p.w.mems[1].bytes(rk)[8..], &42u64.to_ne_bytes());
}

#[test]
fn a_bad_atomic_write_is_refused_when_posted() {
    let mut p = Pair::connected(7, Faults::default(), Mtu::Mtu1024, 3);
    let (rk, ra) = p.buf(1, 16, 0);
    let (vk, va) = p.buf(0, 16, 0);
    let (n, qp) = &mut p.w.qps[p.a];
    let mem = &mut p.w.mems[*n];
    // Not 8-byte aligned remotely, or not 8 bytes.
    let mut wrs = vec![atomic_write(1, vk, va, ra + 4, rk)];
    let mut short = atomic_write(2, vk, va, ra, rk);
    short.sg_list = [Sge {
        addr: va,
        length: 4,
        lkey: vk,
    }]
    .into();
    wrs.push(short);
    for wr in wrs {
        assert!(
            matches!(qp.post_send(wr, mem), Err(VerbsError::BadWr(_))),
            "{wr:?}"
        );
    }
}

/// The responder's refusals, as RXE's: the MR must grant REMOTE_WRITE
/// (REMOTE_ATOMIC is not it: remote access error), the QP must take remote
/// writes and have responder resources (invalid request otherwise); memory
/// is untouched and both QPs end in error.
#[test]
fn the_responder_refuses_what_rxe_refuses() {
    for case in 0..3 {
        let mut p = Pair::connected_with(|is_b, attrs| {
            if is_b && case == 1 {
                attrs[0].access = Some(QpAccess {
                    remote_write: false,
                    remote_read: true,
                    remote_atomic: true,
                });
            }
            if is_b && case == 2 {
                attrs[1].max_dest_rd_atomic = Some(0);
            }
        });
        let (rk, ra) = if case == 0 {
            p.w.mems[1].register(
                1,
                8,
                Access {
                    local_write: true,
                    remote_read: true,
                    remote_atomic: true,
                    ..Access::default()
                },
            )
        } else {
            p.buf(1, 8, 0)
        };
        let before = p.w.mems[1].bytes(rk).to_vec();
        let (vk, va) = p.buf(0, 8, 5);
        p.post(atomic_write(1, vk, va, ra, rk));
        let s = p.sends(1);
        let want = if case == 0 {
            WcStatus::RemAccessErr
        } else {
            WcStatus::RemInvReqErr
        };
        assert_eq!(s[0].status, want, "case {case}: {s:?}");
        assert_eq!(p.w.mems[1].bytes(rk), &before[..], "case {case}");
        assert_eq!(p.w.qps[p.b].1.state(), QpState::Err, "case {case}");
    }
}

/// An atomic write takes a responder resource: with `max_rd_atomic` 1 a
/// READ posted behind it waits until its response is in.
#[test]
fn it_counts_against_the_initiator_depth() {
    let mut p = Pair::connected_with(|is_b, attrs| {
        if !is_b {
            attrs[2].max_rd_atomic = Some(1);
        }
    });
    let (rk, ra) = p.buf(1, 64, 0);
    let (vk, va) = p.buf(0, 64, 0);
    p.post(atomic_write(1, vk, va, ra, rk));
    p.post(SendWr::new(
        2,
        SendOp::Read {
            remote_addr: ra,
            rkey: rk,
        },
        [Sge {
            addr: va + 8,
            length: 8,
            lkey: vk,
        }],
    ));
    // One packet out until the atomic write's response is back.
    let qp = &mut p.w.qps[p.a].1;
    let mut sent = 0;
    while qp.poll_transmit(0).is_some() {
        sent += 1;
    }
    assert_eq!(sent, 1, "the READ waits for the atomic write's resource");
    let s = p.sends(2);
    assert!(s.iter().all(|c| c.status == WcStatus::Success), "{s:?}");
    assert_eq!(
        &p.w.mems[0].bytes(vk)[8..16],
        &p.w.mems[1].bytes(rk)[..8],
        "the READ saw the atomic write"
    );
}
