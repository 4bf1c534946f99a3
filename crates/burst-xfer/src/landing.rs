//! The receiver's side of a batch: each connection (QP or TCP stream) a
//! batch used sends one notification after its share of the writes,
//! carrying the batch number, its share's bytes and how many shares there
//! are; the batch has landed when every share has arrived.

use std::collections::{HashMap, VecDeque};

use crate::{BatchId, Landed};

/// A notification's bytes on the wire (little-endian).
pub(crate) const NOTIFY_LEN: usize = 24;
const MAGIC: u32 = 0x6b76_7866; // "kvxf"

/// One share's notification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Notify {
    pub batch: u64,
    pub bytes: u64,
    pub shares: u32,
}

impl Notify {
    pub fn encode(&self) -> [u8; NOTIFY_LEN] {
        let mut b = [0u8; NOTIFY_LEN];
        b[..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&self.shares.to_le_bytes());
        b[8..16].copy_from_slice(&self.batch.to_le_bytes());
        b[16..24].copy_from_slice(&self.bytes.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Option<Notify> {
        let u32_at = |o: usize| Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?));
        let u64_at = |o: usize| Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?));
        if u32_at(0)? != MAGIC {
            return None;
        }
        let shares = u32_at(4)?;
        (shares > 0).then_some(Notify {
            shares,
            batch: u64_at(8)?,
            bytes: u64_at(16)?,
        })
    }
}

/// Batches a peer may have partly landed at once, and landed batches not
/// yet taken: the peer's notifications cannot grow memory beyond these
/// (what exceeds them is counted in [`Landings::bad`] and dropped).
const MAX_PARTIAL: usize = 4096;
const MAX_READY: usize = 65_536;

/// Shares seen of batches not landed yet, and batches landed.
#[derive(Debug, Default)]
pub(crate) struct Landings {
    partial: HashMap<u64, (u32, u64)>,
    ready: VecDeque<Landed>,
    /// Notifications that made no sense (counted, dropped).
    pub bad: u64,
}

impl Landings {
    pub fn share(&mut self, n: Notify) {
        let known = self.partial.contains_key(&n.batch);
        if (!known && self.partial.len() >= MAX_PARTIAL) || self.ready.len() >= MAX_READY {
            self.bad += 1;
            return;
        }
        let e = self.partial.entry(n.batch).or_insert((0, 0));
        e.0 += 1;
        e.1 += n.bytes;
        if e.0 >= n.shares {
            let (_, bytes) = self.partial.remove(&n.batch).unwrap_or_default();
            self.ready.push_back(Landed {
                batch: BatchId(n.batch),
                bytes,
            });
        }
    }

    pub fn bytes(&mut self, b: &[u8]) {
        match Notify::decode(b) {
            Some(n) => self.share(n),
            None => self.bad += 1,
        }
    }

    pub fn next(&mut self) -> Option<Landed> {
        self.ready.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_lands_when_every_share_has_arrived() {
        let mut l = Landings::default();
        let n = |bytes| Notify {
            batch: 7,
            bytes,
            shares: 3,
        };
        l.bytes(&n(10).encode());
        l.share(n(20));
        assert_eq!(l.next(), None);
        l.bytes(&[0u8; 24]);
        assert_eq!(l.bad, 1);
        l.share(n(30));
        assert_eq!(
            l.next(),
            Some(Landed {
                batch: BatchId(7),
                bytes: 60
            })
        );
        assert_eq!(Notify::decode(&n(5).encode()), Some(n(5)));
    }

    #[test]
    fn a_peer_cannot_grow_the_partial_batches_without_bound() {
        let mut l = Landings::default();
        for batch in 0..(MAX_PARTIAL as u64 + 10) {
            l.share(Notify {
                batch,
                bytes: 1,
                shares: 2,
            });
        }
        assert_eq!(l.partial.len(), MAX_PARTIAL);
        assert_eq!(l.bad, 10);
        // A batch already begun still completes.
        l.share(Notify {
            batch: 0,
            bytes: 1,
            shares: 2,
        });
        assert_eq!(l.next().map(|x| x.bytes), Some(2));
        assert_eq!(Notify::decode(&[1, 2, 3]), None);
    }
}
