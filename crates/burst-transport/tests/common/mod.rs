//! What the RC scenario tests share: two RC QPs connected over the
//! simulator's world, and registered buffers with a recognisable pattern.

#![allow(dead_code)] // each test crate uses its part

use burst_transport::sim::{connect_attrs, Access, Faults, World};
use burst_transport::{QpAttr, QpType};
use burst_wire::{Mtu, Psn};

/// Requester `a` on node 0, responder `b` on node 1.
pub struct Pair {
    pub w: World,
    pub a: usize,
    pub b: usize,
}

impl Pair {
    /// A world of seed `seed` with `faults`, and the pair connected at
    /// `mtu`; the requester's first PSN is `psn_a`, the responder's 100.
    pub fn connected(seed: u64, faults: Faults, mtu: Mtu, psn_a: u32) -> Pair {
        let mut w = World::new(seed, 2, faults);
        let a = w.add_qp(0, QpType::Rc, mtu);
        let b = w.add_qp(1, QpType::Rc, mtu);
        w.connect(a, Some(b), mtu, Psn::new(psn_a), Psn::new(100))
            .unwrap();
        Pair { w, a, b }
    }

    /// A fault-free world of seed 7 with the pair connected at MTU 1024,
    /// both first PSNs 5, the attributes of each side's INIT, RTR and RTS
    /// changed by `edit` first (its `bool`: the side is the responder `b`).
    pub fn connected_with(edit: impl Fn(bool, &mut [QpAttr; 3])) -> Pair {
        let mtu = Mtu::Mtu1024;
        let mut w = World::new(7, 2, Faults::default());
        let a = w.add_qp(0, QpType::Rc, mtu);
        let b = w.add_qp(1, QpType::Rc, mtu);
        let (qa, qb) = (w.qps[a].1.qpn(), w.qps[b].1.qpn());
        for (me, ah, peer) in [(a, 1, qb), (b, 0, qa)] {
            let mut attrs =
                connect_attrs(QpType::Rc, mtu, Psn::new(5), Some((ah, peer, Psn::new(5))));
            edit(me == b, &mut attrs);
            for attr in attrs {
                w.qps[me].1.modify(&attr).unwrap();
            }
        }
        Pair { w, a, b }
    }

    /// Registers `len` bytes on `node` filled with `seed`-derived bytes.
    pub fn buf(&mut self, node: usize, len: usize, seed: u8) -> (u32, u64) {
        let (k, a) = self.w.mems[node].register(1, len, Access::ALL);
        for (i, b) in self.w.mems[node].bytes_mut(k).iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(31).wrapping_add(seed);
        }
        (k, a)
    }
}
