//! The device's link and GID table: following an interface's addresses
//! and carrier.

use std::net::{IpAddr, SocketAddr, SocketAddrV6};
use std::time::Instant;

use burst_io::Port;

use crate::AsyncEvent;

/// Lowest QPN handed out (0 and 1 are QP0/QP1; RXE starts at 0x11).
use super::*;

impl<P: Port> Device<P> {
    /// Makes the GID table follow interface `iface` (every address of it,
    /// laid out as RXE's) when the port's address is one of its addresses.
    /// The port serves every listed address; a slot whose address it
    /// cannot serve (ports that serve one address) stays empty.
    pub fn set_interface(&mut self, iface: &str) {
        self.gid_source = Some(GidSource {
            iface: iface.to_string(),
            ifindex: crate::netif::ifindex(iface),
            scanned: None,
            refused: Vec::new(),
        });
        self.refresh_gids();
    }

    /// Follows interface `iface`'s link: port 1 goes down with it and up
    /// again, each change an [`AsyncEvent::Port`] (RXE's PORT_ERR and
    /// PORT_ACTIVE).
    pub fn watch_link(&mut self, iface: &str) {
        self.link = Some(LinkWatch {
            iface: iface.to_string(),
            up: crate::netif::link_up(iface).unwrap_or(true),
            next_ns: 0,
            events: None,
        });
    }

    /// Follows the link by the kernel's notifications instead of looking
    /// every [`LINK_CHECK_NS`] (after [`Device::watch_link`]): the caller
    /// waits on the returned socket with its other descriptors and calls
    /// [`burst_io::netdev::LinkEvents::drain`] when it is readable; the
    /// device's next step looks at the link then. An idle device then has
    /// no timer left. `None` (and the clock kept) when there is no link
    /// watched or no notifications to be had.
    pub fn follow_link_events(&mut self) -> Option<std::sync::Arc<burst_io::netdev::LinkEvents>> {
        let l = self.link.as_mut()?;
        match burst_io::netdev::LinkEvents::open() {
            Ok(e) => {
                let e = std::sync::Arc::new(e);
                l.events = Some(std::sync::Arc::clone(&e));
                // A change between the first look and the subscription.
                l.up = crate::netif::link_up(&l.iface).unwrap_or(l.up);
                Some(e)
            }
            Err(err) => {
                tracing::warn!(iface = %l.iface, "no link notifications ({err}): the link is looked at every 100 ms");
                None
            }
        }
    }

    pub(super) fn check_link(&mut self, now: u64) {
        let Some(l) = &mut self.link else {
            return;
        };
        if let Some(e) = &l.events {
            let mut changed = e.changed();
            if !changed && now >= l.next_ns {
                // Steps that never let the engine sleep never have it
                // drain the socket either: every LINK_CHECK_NS of them do
                // (one recv).
                l.next_ns = now + LINK_CHECK_NS;
                changed = e.drain() && e.changed();
            }
            if !changed {
                return;
            }
        } else if now < l.next_ns {
            return;
        }
        l.next_ns = now + LINK_CHECK_NS;
        let Some(up) = crate::netif::link_up(&l.iface) else {
            return;
        };
        if up != l.up {
            l.up = up;
            tracing::info!(iface = %l.iface, up, "port 1 {}", if up { "active" } else { "down" });
            self.events.push(AsyncEvent::Port { active: up });
        }
    }

    /// The GID table, read again from the interface if older than
    /// [`GID_RESCAN`]: slot `i` is GID index `i` (`None`: empty).
    pub fn gid_table(&mut self) -> Vec<Option<IpAddr>> {
        self.refresh_gids();
        self.gids.slots().to_vec()
    }

    /// Follows the interface's addresses: the port serves what the table
    /// gains and drops what it loses (RXE follows netdev events the same).
    pub(super) fn refresh_gids(&mut self) {
        let Some(src) = &mut self.gid_source else {
            return;
        };
        if src.scanned.is_some_and(|t| t.elapsed() < GID_RESCAN) {
            return;
        }
        src.scanned = Some(Instant::now());
        let primary = self.port.local_addr().ip();
        let Some(change) = self.gids.follow(primary, &src.iface) else {
            return;
        };
        for ip in change.removed {
            self.port.remove_address(ip);
        }
        for (index, ip) in change.added {
            if ip == primary {
                continue;
            }
            let at = match ip {
                IpAddr::V6(v6) if v6.is_unicast_link_local() => {
                    SocketAddr::V6(SocketAddrV6::new(v6, 0, 0, src.ifindex))
                }
                ip => SocketAddr::new(ip, 0),
            };
            if let Err(e) = self.port.add_address(at) {
                // Listed still, as RXE lists every address of its interface
                // (software that scans the table, UCX for one, stops at an
                // empty slot); nothing is sent from it or received on it.
                if !src.refused.contains(&ip) {
                    tracing::warn!(index, %ip, "GID not served: the port cannot use this address: {e}");
                    src.refused.push(ip);
                }
            }
        }
    }
}
