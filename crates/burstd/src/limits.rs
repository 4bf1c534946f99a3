//! What clients may hold: limits on every kind of object and on the
//! memory and descriptors they cost the daemon, and the usage counted
//! against them. The limits apply to all the clients of one user together
//! (connecting again does not multiply them), and the daemon keeps a
//! budget of its own across users (half of `vm.max_map_count`, a share of
//! the address space). A request past a limit is refused with the errno
//! rdma-core's providers give when a device runs out (ENOMEM; EAGAIN for
//! connections) and a log line naming the limit; nothing else changes.
//!
//! ```
//! use burstd::limits::{Cost, Kind, Limits, Usage};
//! let lim = Limits { qps: 1, ..Limits::default() };
//! let mut u = Usage::default();
//! u.admit(&lim, Kind::Qp, Cost::wqes(256)).unwrap();
//! u.add(7, Kind::Qp, 0x12, Cost::wqes(256));
//! assert!(u.admit(&lim, Kind::Qp, Cost::wqes(256)).is_err());
//! u.remove(7, Kind::Qp, 0x12);
//! assert!(u.admit(&lim, Kind::Qp, Cost::wqes(256)).is_ok());
//! ```

use std::collections::HashMap;

use serde::Deserialize;

/// Limits per user, all its clients together (the `[burstd.limits]` table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Connections one user may hold open (said hello or not).
    pub connections_per_uid: u32,
    /// Protection domains.
    pub pds: u32,
    /// Memory regions.
    pub mrs: u32,
    /// Memory windows.
    pub mws: u32,
    /// Completion queues.
    pub cqs: u32,
    /// Queue pairs.
    pub qps: u32,
    /// Shared receive queues.
    pub srqs: u32,
    /// Address handles.
    pub ahs: u32,
    /// Completion channels (each a pipe: a descriptor in the daemon).
    pub channels: u32,
    /// rdma_cm service IDs listened on.
    pub listens: u32,
    /// Bytes of registered memory.
    pub registered_bytes: u64,
    /// Mappings the daemon makes for the client (rings, CQs, the runs of
    /// pages of zero-copy registrations): `vm.max_map_count` is shared.
    pub mappings: u64,
    /// CQ entries, all CQs together (shared memory the daemon creates).
    pub cq_entries: u64,
    /// Work-request slots, all QPs' send and receive queues and SRQs
    /// together (shared memory; what a full CQ may hold back).
    pub wqes: u64,
}

impl Default for Limits {
    /// Sized for MPI- and UCX-scale applications (thousands of QPs per
    /// user, large registration caches, KV-cache pools of hundreds of GiB)
    /// while one user can take at most a sixteenth of the device's QPs and
    /// CQs, and costs the daemon at most about 0.85 GiB of shared memory for
    /// rings and CQs (2 Mi WQE slots of at most 328 bytes, 4 Mi CQEs of 48)
    /// and half of its mapping budget. An administrator lowers them for
    /// untrusted users.
    fn default() -> Limits {
        Limits {
            connections_per_uid: 64,
            pds: 4096,
            mrs: 65536,
            mws: 16384,
            cqs: 4096,
            qps: 4096,
            srqs: 1024,
            ahs: 16384,
            channels: 4096,
            listens: 1024,
            registered_bytes: 1 << 40,
            mappings: 16384,
            cq_entries: 1 << 22,
            wqes: 1 << 21,
        }
    }
}

/// The daemon's own budget across users: half of `vm.max_map_count` for
/// mappings (the rest for its own allocations, which abort when none are
/// left), 16 TiB of registered memory (an eighth of the address space).
pub fn daemon_budget() -> Limits {
    let max_map = std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(65530);
    Limits {
        connections_per_uid: u32::MAX,
        pds: u32::MAX,
        mrs: u32::MAX,
        mws: u32::MAX,
        cqs: u32::MAX,
        qps: u32::MAX,
        srqs: u32::MAX,
        ahs: u32::MAX,
        channels: u32::MAX,
        listens: u32::MAX,
        registered_bytes: 16 << 40,
        mappings: max_map / 2,
        cq_entries: u64::MAX,
        wqes: u64::MAX,
    }
}

/// A kind of object a client holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// PD.
    Pd,
    /// MR.
    Mr,
    /// MW.
    Mw,
    /// CQ.
    Cq,
    /// QP.
    Qp,
    /// SRQ.
    Srq,
    /// AH.
    Ah,
    /// Completion channel.
    Channel,
    /// rdma_cm listen.
    Listen,
}

impl Kind {
    /// Every kind, in the order `burst clients` lists them.
    pub const ALL: [Kind; 9] = [
        Kind::Pd,
        Kind::Mr,
        Kind::Mw,
        Kind::Cq,
        Kind::Qp,
        Kind::Srq,
        Kind::Ah,
        Kind::Channel,
        Kind::Listen,
    ];

    /// Its name in the configuration and in `burst clients`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Pd => "pds",
            Kind::Mr => "mrs",
            Kind::Mw => "mws",
            Kind::Cq => "cqs",
            Kind::Qp => "qps",
            Kind::Srq => "srqs",
            Kind::Ah => "ahs",
            Kind::Channel => "channels",
            Kind::Listen => "listens",
        }
    }

    fn limit(self, l: &Limits) -> u64 {
        u64::from(match self {
            Kind::Pd => l.pds,
            Kind::Mr => l.mrs,
            Kind::Mw => l.mws,
            Kind::Cq => l.cqs,
            Kind::Qp => l.qps,
            Kind::Srq => l.srqs,
            Kind::Ah => l.ahs,
            Kind::Channel => l.channels,
            Kind::Listen => l.listens,
        })
    }
}

/// What one object costs besides its count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cost {
    /// Registered bytes.
    pub bytes: u64,
    /// Daemon mappings.
    pub mappings: u64,
    /// CQ entries.
    pub cq_entries: u64,
    /// Work-request slots.
    pub wqes: u64,
}

impl Cost {
    /// Nothing but the object.
    pub fn none() -> Cost {
        Cost::default()
    }
    /// A QP's or SRQ's: its slots and its ring segment's mapping.
    pub fn wqes(n: u64) -> Cost {
        Cost {
            wqes: n,
            mappings: 1,
            ..Cost::default()
        }
    }
    /// A CQ's: its entries and its segment's mapping.
    pub fn cq(entries: u64) -> Cost {
        Cost {
            cq_entries: entries,
            mappings: 1,
            ..Cost::default()
        }
    }
    /// A registration's: its bytes and the daemon's mappings of its pages.
    pub fn mr(bytes: u64, mappings: u64) -> Cost {
        Cost {
            bytes,
            mappings,
            ..Cost::default()
        }
    }
}

/// A request refused by a limit: the errno and the message to log and reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// ENOMEM (objects, memory) or EAGAIN (connections).
    pub errno: i32,
    /// Names the limit.
    pub message: String,
}

/// What a set of clients (one user's; or all, for the daemon's budget) holds.
#[derive(Debug, Default)]
pub struct Usage {
    counts: HashMap<Kind, u64>,
    total: Cost,
    /// Each object's cost, by client, kind and handle, to give back on
    /// destroy (handles of some kinds are numbered per client).
    held: HashMap<(u32, Kind, u64), Cost>,
}

fn over(what: &str, used: u64, asked: u64, limit: u64) -> Result<(), Refused> {
    if used.saturating_add(asked) > limit {
        return Err(Refused {
            errno: libc::ENOMEM,
            message: format!(
                "limit {what} = {limit} reached ({used} in use, {asked} more asked): raise it in \
                 [burstd.limits] of burstd's configuration"
            ),
        });
    }
    Ok(())
}

impl Usage {
    /// Whether one more object of `kind` costing `c` stays within `l`.
    pub fn admit(&self, l: &Limits, kind: Kind, c: Cost) -> Result<(), Refused> {
        let n = self.counts.get(&kind).copied().unwrap_or(0);
        over(kind.name(), n, 1, kind.limit(l))?;
        over(
            "registered_bytes",
            self.total.bytes,
            c.bytes,
            l.registered_bytes,
        )?;
        over("mappings", self.total.mappings, c.mappings, l.mappings)?;
        over(
            "cq_entries",
            self.total.cq_entries,
            c.cq_entries,
            l.cq_entries,
        )?;
        over("wqes", self.total.wqes, c.wqes, l.wqes)
    }

    /// Counts client `client`'s object `handle` of `kind`.
    pub fn add(&mut self, client: u32, kind: Kind, handle: u64, c: Cost) {
        if self.held.insert((client, kind, handle), c).is_some() {
            // The same handle twice (a listen repeated): counted once.
            return;
        }
        *self.counts.entry(kind).or_default() += 1;
        self.total.bytes += c.bytes;
        self.total.mappings += c.mappings;
        self.total.cq_entries += c.cq_entries;
        self.total.wqes += c.wqes;
    }

    /// Gives back client `client`'s object `handle` of `kind` (destroyed).
    pub fn remove(&mut self, client: u32, kind: Kind, handle: u64) {
        let Some(c) = self.held.remove(&(client, kind, handle)) else {
            return;
        };
        if let Some(n) = self.counts.get_mut(&kind) {
            *n = n.saturating_sub(1);
        }
        self.total.bytes = self.total.bytes.saturating_sub(c.bytes);
        self.total.mappings = self.total.mappings.saturating_sub(c.mappings);
        self.total.cq_entries = self.total.cq_entries.saturating_sub(c.cq_entries);
        self.total.wqes = self.total.wqes.saturating_sub(c.wqes);
    }

    /// Client `client`'s object `from` of `kind` becomes `to`, whose
    /// own count is given back (a re-registration keeps the old keys and
    /// the new registration's cost).
    pub fn rename(&mut self, client: u32, kind: Kind, from: u64, to: u64) {
        let Some(c) = self.held.get(&(client, kind, from)).copied() else {
            return;
        };
        self.remove(client, kind, to);
        self.remove(client, kind, from);
        self.add(client, kind, to, c);
    }

    /// Gives back everything client `client` held (it is gone).
    pub fn forget(&mut self, client: u32) {
        let mine: Vec<(u32, Kind, u64)> = self
            .held
            .keys()
            .filter(|k| k.0 == client)
            .copied()
            .collect();
        for (c, k, h) in mine {
            self.remove(c, k, h);
        }
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// `(name, used, limit)` of every limit, as `burst clients` shows them.
    pub fn report(&self, l: &Limits) -> Vec<(String, u64, u64)> {
        let mut v: Vec<(String, u64, u64)> = Kind::ALL
            .iter()
            .map(|k| {
                (
                    k.name().to_owned(),
                    self.counts.get(k).copied().unwrap_or(0),
                    k.limit(l),
                )
            })
            .collect();
        v.push((
            "registered_bytes".into(),
            self.total.bytes,
            l.registered_bytes,
        ));
        v.push(("mappings".into(), self.total.mappings, l.mappings));
        v.push(("cq_entries".into(), self.total.cq_entries, l.cq_entries));
        v.push(("wqes".into(), self.total.wqes, l.wqes));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_limit_refuses_with_enomem_and_its_name() {
        let l = Limits {
            cq_entries: 100,
            registered_bytes: 4096,
            ..Limits::default()
        };
        let mut u = Usage::default();
        u.add(1, Kind::Cq, 1, Cost::cq(64));
        let e = u.admit(&l, Kind::Cq, Cost::cq(64)).unwrap_err();
        assert_eq!(e.errno, libc::ENOMEM);
        assert!(e.message.contains("cq_entries"), "{}", e.message);
        let e = u.admit(&l, Kind::Mr, Cost::mr(8192, 1)).unwrap_err();
        assert!(e.message.contains("registered_bytes"), "{}", e.message);
        u.remove(1, Kind::Cq, 1);
        u.admit(&l, Kind::Cq, Cost::cq(100)).unwrap();
        // Removing what was never added, or twice, changes nothing.
        u.remove(1, Kind::Cq, 1);
        assert!(u.report(&l).iter().all(|(_, used, _)| *used == 0));
        // A client's handles are its own; forgetting it frees them all.
        u.add(1, Kind::Channel, 1, Cost::none());
        u.add(2, Kind::Channel, 1, Cost::none());
        u.forget(1);
        assert_eq!(
            u.report(&l)[7],
            ("channels".into(), 1, u64::from(l.channels))
        );
        u.forget(2);
        assert!(u.is_empty());
    }
}
