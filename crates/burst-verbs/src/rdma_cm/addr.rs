//! Which device an IP address belongs to or routes through.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};

pub(super) fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v| v.is_loopback()),
    }
}

pub(super) fn same(a: IpAddr, b: IpAddr) -> bool {
    a.to_canonical() == b.to_canonical()
}

/// The device whose own address is `ip`.
pub(super) fn own_device(addrs: &[IpAddr], ip: IpAddr) -> Option<usize> {
    addrs.iter().position(|&a| same(a, ip))
}

/// The device whose address is `ip`; loopback means the first device (a
/// process talks to itself through its own device).
pub(super) fn device_of_local(addrs: &[IpAddr], ip: IpAddr) -> Option<usize> {
    own_device(addrs, ip).or_else(|| (is_loopback(ip) && !addrs.is_empty()).then_some(0))
}

/// The devices a listen on `ip` covers: all for the wildcard.
pub(super) fn devices_for(addrs: &[IpAddr], ip: Option<IpAddr>) -> Vec<usize> {
    match ip {
        Some(ip) if !ip.is_unspecified() => device_of_local(addrs, ip).into_iter().collect(),
        _ => (0..addrs.len()).collect(),
    }
}

/// Where a connection to `dst` goes: (device, local address, peer). The
/// device is the source's if one is given, else the one the kernel's
/// routing picks as source for `dst` (a connected UDP socket tells), else
/// the first. A device's own address, or loopback when the device's
/// address is not, is the device itself.
pub(super) fn resolve(
    addrs: &[IpAddr],
    src: Option<IpAddr>,
    dst: IpAddr,
) -> Option<(usize, IpAddr, IpAddr)> {
    if addrs.is_empty() {
        return None;
    }
    let dev = match src {
        Some(s) => device_of_local(addrs, s)?,
        None => addrs
            .iter()
            .position(|&a| same(a, dst))
            .or_else(|| route_source(dst).and_then(|s| addrs.iter().position(|&a| same(a, s))))
            .unwrap_or(0),
    };
    let local = addrs[dev];
    // 127.0.0.1 towards a device on a real address means the device
    // itself; between devices on loopback addresses it is the peer's.
    let peer = if is_loopback(dst) && !is_loopback(local) {
        local
    } else {
        dst
    };
    Some((dev, local, peer))
}

/// The source address the kernel would use towards `dst`.
fn route_source(dst: IpAddr) -> Option<IpAddr> {
    let any: SocketAddr = if dst.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let s = UdpSocket::bind(any).ok()?;
    s.connect((dst, crate::ROCEV2_PORT)).ok()?;
    s.local_addr().ok().map(|a| a.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_and_own_addresses_are_the_device_itself() {
        let addrs: Vec<IpAddr> = vec!["198.18.0.1".parse().unwrap(), "198.18.0.2".parse().unwrap()];
        assert_eq!(
            device_of_local(&addrs, "198.18.0.2".parse().unwrap()),
            Some(1)
        );
        assert_eq!(
            device_of_local(&addrs, "127.0.0.1".parse().unwrap()),
            Some(0)
        );
        assert_eq!(device_of_local(&addrs, "198.18.0.9".parse().unwrap()), None);
        assert_eq!(
            devices_for(&addrs, Some("0.0.0.0".parse().unwrap())),
            vec![0, 1]
        );
        let (dev, local, peer) = resolve(&addrs, None, "127.0.0.1".parse().unwrap()).unwrap();
        assert_eq!((dev, local, peer), (0, addrs[0], addrs[0]));
        let on_lo: Vec<IpAddr> = vec!["127.0.94.1".parse().unwrap()];
        let peer = "127.0.94.2".parse().unwrap();
        assert_eq!(resolve(&on_lo, None, peer), Some((0, on_lo[0], peer)));
        let (dev, _, peer) = resolve(&addrs, None, "198.18.0.2".parse().unwrap()).unwrap();
        assert_eq!((dev, peer), (1, addrs[1]));
        assert!(resolve(&[], None, "198.18.0.2".parse().unwrap()).is_none());
    }
}
