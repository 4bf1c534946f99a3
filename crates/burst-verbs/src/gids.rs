//! The device's GID table, laid out as RXE's (the kernel's RoCE GID
//! management fills it so for every RoCE device): index 0 holds the
//! interface's default GID, the link-local IPv6 address made from its MAC
//! (EUI-64); then one GID per address of the interface, its IPv4 addresses
//! (`::ffff:a.b.c.d`) first and its IPv6 addresses after, each once. An
//! address that goes away leaves its slot empty and a new one takes the
//! first empty slot, so an index keeps naming the same address while it
//! lives: scripts that pass RXE's `-g 1` (the interface's IPv4 GID) pass the
//! same index to burst. Every entry is RoCE v2 (RXE 6.x lists no v1).
//!
//! The table is pure bookkeeping; the device scans the interface
//! ([`crate::netif`]) and has its port serve what the table gains.
//!
//! ```
//! use burst_verbs::gids::GidTable;
//! let mut t = GidTable::for_address("198.18.0.2".parse().unwrap());
//! let mac = [0x52, 0x54, 0x00, 0xc6, 0x12, 0x02];
//! let addrs = ["198.18.0.2".parse().unwrap(), "fd00:198:18::2".parse().unwrap()];
//! let change = t.update(Some(burst_verbs::gids::default_gid(mac)), &addrs);
//! assert_eq!(change.added.len(), 3);
//! assert_eq!(t.get(0), Some("fe80::5054:ff:fec6:1202".parse().unwrap()));
//! assert_eq!(t.get(1), Some("198.18.0.2".parse().unwrap()));
//! assert_eq!(t.get(2), Some("fd00:198:18::2".parse().unwrap()));
//! ```

use std::net::{IpAddr, Ipv6Addr};

/// Entries a port's GID table has room for (RXE's `gid_tbl_len`).
pub const GID_TABLE_LEN: usize = 1024;

/// The default GID of an interface with MAC `mac`: `fe80::` and the MAC's
/// modified EUI-64 (universal/local bit flipped, `ff:fe` in the middle).
pub fn default_gid(mac: [u8; 6]) -> Ipv6Addr {
    Ipv6Addr::from([
        0xfe,
        0x80,
        0,
        0,
        0,
        0,
        0,
        0,
        mac[0] ^ 2,
        mac[1],
        mac[2],
        0xff,
        0xfe,
        mac[3],
        mac[4],
        mac[5],
    ])
}

/// Addresses a table update added and removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GidChange {
    /// Newly listed (with their index).
    pub added: Vec<(usize, IpAddr)>,
    /// No longer listed.
    pub removed: Vec<IpAddr>,
}

/// A port's GID table (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidTable {
    slots: Vec<Option<IpAddr>>,
}

impl GidTable {
    /// The table of a device on an address of no interface (an unassigned
    /// loopback address, a DPDK port's own address): that address at 0.
    pub fn for_address(ip: IpAddr) -> GidTable {
        GidTable {
            slots: vec![Some(ip)],
        }
    }

    /// The address at `index`, if the slot holds one.
    pub fn get(&self, index: usize) -> Option<IpAddr> {
        self.slots.get(index).copied().flatten()
    }

    /// The index of `ip`, if listed.
    pub fn index_of(&self, ip: IpAddr) -> Option<usize> {
        self.slots.iter().position(|s| *s == Some(ip))
    }

    /// Every slot up to the last used one (empty slots as `None`).
    pub fn slots(&self) -> &[Option<IpAddr>] {
        let used = self
            .slots
            .iter()
            .rposition(Option::is_some)
            .map_or(0, |i| i + 1);
        &self.slots[..used]
    }

    /// Reads interface `iface` (its MAC and addresses, [`crate::netif`])
    /// and updates the table to it, when the device's address `own` is
    /// one of them; otherwise (an address of no interface, such as an
    /// unassigned loopback address) leaves the table and returns `None`.
    pub fn follow(&mut self, own: IpAddr, iface: &str) -> Option<GidChange> {
        let addrs: Vec<IpAddr> = crate::netif::addresses()
            .ok()?
            .into_iter()
            .filter(|a| a.name == iface)
            .map(|a| a.ip)
            .collect();
        if !addrs.contains(&own) {
            return None;
        }
        Some(self.update(crate::netif::mac(iface).map(default_gid), &addrs))
    }

    /// Makes the table list `default` (at index 0) and `addrs` (an
    /// interface's addresses in the kernel's order), keeping the index of
    /// every address still listed.
    pub fn update(&mut self, default: Option<Ipv6Addr>, addrs: &[IpAddr]) -> GidChange {
        let default = default.map(IpAddr::V6);
        let mut want: Vec<IpAddr> = Vec::new();
        let v4 = addrs.iter().filter(|a| a.is_ipv4());
        let v6 = addrs.iter().filter(|a| a.is_ipv6());
        for &a in v4.chain(v6) {
            if Some(a) != default && !want.contains(&a) {
                want.push(a);
            }
        }
        let mut change = GidChange::default();
        if self.slots.is_empty() {
            self.slots.push(None);
        }
        if self.slots[0] != default {
            if let Some(old) = self.slots[0].take() {
                if !want.contains(&old) {
                    change.removed.push(old);
                }
            }
            if let Some(d) = default {
                self.slots[0] = Some(d);
                change.added.push((0, d));
            }
        }
        for slot in self.slots.iter_mut().skip(1) {
            if let Some(a) = *slot {
                if !want.contains(&a) {
                    *slot = None;
                    change.removed.push(a);
                }
            }
        }
        for a in want {
            if self.slots.contains(&Some(a)) {
                continue;
            }
            let free = self.slots.iter().skip(1).position(Option::is_none);
            let i = match free {
                Some(i) => i + 1,
                None if self.slots.len() < GID_TABLE_LEN => {
                    self.slots.push(None);
                    self.slots.len() - 1
                }
                None => break,
            };
            self.slots[i] = Some(a);
            change.added.push((i, a));
        }
        change
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// RXE in the lab lists fe80::5054:ff:fec6:1202 then ::ffff:198.18.0.2
    /// for MAC 52:54:00:c6:12:02 (the interface's own link-local address is
    /// the default GID, listed once).
    #[test]
    fn layout_follows_rxe() {
        let mac = [0x52, 0x54, 0x00, 0xc6, 0x12, 0x02];
        let d = default_gid(mac);
        assert_eq!(d, "fe80::5054:ff:fec6:1202".parse::<Ipv6Addr>().unwrap());
        let mut t = GidTable::for_address(ip("198.18.0.2"));
        // getifaddrs lists IPv6 before IPv4 on some interfaces: the table
        // still puts IPv4 first.
        let addrs = [
            ip("fd00:198:18::2"),
            IpAddr::V6(d),
            ip("198.18.0.2"),
            ip("198.18.0.9"),
        ];
        t.update(Some(d), &addrs);
        assert_eq!(
            t.slots(),
            &[
                Some(IpAddr::V6(d)),
                Some(ip("198.18.0.2")),
                Some(ip("198.18.0.9")),
                Some(ip("fd00:198:18::2"))
            ]
        );
        assert_eq!(t.index_of(ip("198.18.0.9")), Some(2));
    }

    #[test]
    fn indices_survive_changes_and_freed_slots_are_reused() {
        let mut t = GidTable::for_address(ip("198.18.0.2"));
        let c = t.update(None, &[ip("198.18.0.2"), ip("fd00::2")]);
        assert_eq!(
            c.added,
            vec![(1, ip("198.18.0.2")), (2, ip("fd00::2"))],
            "the fixed address moves to its interface slot"
        );
        assert!(c.removed.is_empty(), "still listed");
        assert_eq!(t.get(0), None, "no MAC: no default GID");
        let c = t.update(None, &[ip("fd00::2")]);
        assert_eq!(c.removed, vec![ip("198.18.0.2")]);
        assert_eq!((t.get(1), t.get(2)), (None, Some(ip("fd00::2"))));
        let c = t.update(None, &[ip("fd00::2"), ip("fd00::3")]);
        assert_eq!(c.added, vec![(1, ip("fd00::3"))], "first empty slot");
        assert_eq!(
            t.update(None, &[ip("fd00::2"), ip("fd00::3")]),
            GidChange::default()
        );
        let c = t.update(None, &[ip("fd00::3")]);
        assert_eq!(c.removed, vec![ip("fd00::2")]);
        assert_eq!(t.slots().len(), 2, "trailing empty slots are not listed");
    }

    #[test]
    fn the_table_holds_at_most_rxe_s_length() {
        let mut t = GidTable::for_address(ip("10.0.0.1"));
        let many: Vec<IpAddr> = (0..1100u32)
            .map(|i| IpAddr::V4((0x0a00_0000 + i).into()))
            .collect();
        let c = t.update(None, &many);
        assert_eq!(c.added.len(), GID_TABLE_LEN - 1);
        assert_eq!(t.slots().len(), GID_TABLE_LEN);
    }
}
