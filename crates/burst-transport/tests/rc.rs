//! RC scenarios, one behaviour each, over the simulator's world.

use burst_transport::sim::{Access, Faults, World};
use burst_transport::*;
use burst_wire::{Mtu, Psn};

struct Pair {
    w: World,
    a: usize,
    b: usize,
}

fn pair(faults: Faults, mtu: Mtu, psn_a: u32) -> Pair {
    let mut w = World::new(7, 2, faults);
    let a = w.add_qp(0, QpType::Rc, mtu);
    let b = w.add_qp(1, QpType::Rc, mtu);
    w.connect(a, Some(b), mtu, Psn::new(psn_a), Psn::new(100))
        .unwrap();
    Pair { w, a, b }
}

impl Pair {
    /// Registers `len` bytes on `node` filled with `seed`-derived bytes.
    fn buf(&mut self, node: usize, len: usize, seed: u8) -> (u32, u64) {
        let (k, a) = self.w.mems[node].register(1, len, Access::ALL);
        for (i, b) in self.w.mems[node].bytes_mut(k).iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(31).wrapping_add(seed);
        }
        (k, a)
    }
    fn post_send(&mut self, wr: SendWr) {
        let (n, qp) = &mut self.w.qps[self.a];
        qp.post_send(wr, &self.w.mems[*n]).unwrap();
    }
    fn post_recv(&mut self, wr: RecvWr) {
        let (n, qp) = &mut self.w.qps[self.b];
        qp.post_recv(wr, &self.w.mems[*n]).unwrap();
    }
    fn run(
        &mut self,
        send_wcs: usize,
        recv_wcs: usize,
    ) -> (Vec<WorkCompletion>, Vec<WorkCompletion>) {
        let (a, b) = (self.a, self.b);
        let ok = self.w.run(10_000_000_000, |w| {
            w.completions[a].len() >= send_wcs && w.completions[b].len() >= recv_wcs
        });
        let sa: Vec<_> = self.w.completions[a].drain(..).collect();
        let sb: Vec<_> = self.w.completions[b].drain(..).collect();
        assert!(
            ok,
            "not done: a={sa:?} b={sb:?} a={:?} b={:?}",
            self.w.qps[a].1.counters(),
            self.w.qps[b].1.counters()
        );
        (sa, sb)
    }
}

#[test]
fn send_single_and_multi_packet() {
    for (len, mtu) in [
        (0usize, Mtu::Mtu256),
        (100, Mtu::Mtu1024),
        (3001, Mtu::Mtu1024),
        (10000, Mtu::Mtu4096),
    ] {
        let mut p = pair(Faults::default(), mtu, 0xfffffe);
        let (sk, sa) = p.buf(0, len.max(1), 1);
        let (rk, ra) = p.buf(1, len + 10, 0);
        p.post_recv(RecvWr {
            wr_id: 9,
            sg_list: vec![Sge {
                addr: ra,
                length: (len + 10) as u32,
                lkey: rk,
            }],
        });
        p.post_send(SendWr::new(
            1,
            SendOp::SendWithImm(0xabcd),
            vec![Sge {
                addr: sa,
                length: len as u32,
                lkey: sk,
            }],
        ));
        let (s, r) = p.run(1, 1);
        assert_eq!(s[0].status, WcStatus::Success, "{s:?}");
        assert_eq!(r[0].status, WcStatus::Success, "{r:?}");
        assert_eq!(r[0].byte_len as usize, len);
        assert_eq!(r[0].imm_data, Some(0xabcd));
        assert_eq!(&p.w.mems[1].bytes(rk)[..len], &p.w.mems[0].bytes(sk)[..len]);
    }
}

#[test]
fn write_read_atomics() {
    let mut p = pair(Faults::default(), Mtu::Mtu1024, 5);
    let (sk, sa) = p.buf(0, 5000, 1);
    let (rk, ra) = p.buf(1, 5000, 2);
    p.post_send(SendWr::new(
        1,
        SendOp::Write {
            remote_addr: ra,
            rkey: rk,
        },
        vec![Sge {
            addr: sa,
            length: 3000,
            lkey: sk,
        }],
    ));
    let (lk, la) = p.buf(0, 5000, 3);
    p.post_send(SendWr::new(
        2,
        SendOp::Read {
            remote_addr: ra,
            rkey: rk,
        },
        vec![Sge {
            addr: la,
            length: 4000,
            lkey: lk,
        }],
    ));
    let (ck, ca) = p.buf(1, 8, 0);
    p.w.mems[1]
        .bytes_mut(ck)
        .copy_from_slice(&5u64.to_ne_bytes());
    let (ok_, oa) = p.buf(0, 8, 0);
    p.post_send(SendWr::new(
        3,
        SendOp::FetchAdd {
            remote_addr: ca,
            rkey: ck,
            add: 10,
        },
        vec![Sge {
            addr: oa,
            length: 8,
            lkey: ok_,
        }],
    ));
    let (s, _) = p.run(3, 0);
    for wc in &s {
        assert_eq!(wc.status, WcStatus::Success, "{s:?}");
    }
    assert_eq!(
        &p.w.mems[1].bytes(rk)[..3000],
        &p.w.mems[0].bytes(sk)[..3000]
    );
    assert_eq!(
        &p.w.mems[0].bytes(lk)[..4000],
        &p.w.mems[1].bytes(rk)[..4000]
    );
    assert_eq!(p.w.mems[0].bytes(ok_), &5u64.to_ne_bytes());
    assert_eq!(p.w.mems[1].bytes(ck), &15u64.to_ne_bytes());
}
