//! What the RC scenario tests share: two RC QPs connected over the
//! simulator's world, and registered buffers with a recognisable pattern.

use burst_transport::sim::{Access, Faults, World};
use burst_transport::QpType;
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

    /// Registers `len` bytes on `node` filled with `seed`-derived bytes.
    pub fn buf(&mut self, node: usize, len: usize, seed: u8) -> (u32, u64) {
        let (k, a) = self.w.mems[node].register(1, len, Access::ALL);
        for (i, b) in self.w.mems[node].bytes_mut(k).iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(31).wrapping_add(seed);
        }
        (k, a)
    }
}
