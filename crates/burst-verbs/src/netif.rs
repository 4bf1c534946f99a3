//! The host's interfaces: which addresses they hold and their MTU
//! (`getifaddrs(3)` and `SIOCGIFMTU`). The only unsafe code of the config path.

use std::ffi::CStr;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// One address of one interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfAddr {
    /// Interface name (`eth0`).
    pub name: String,
    /// The address.
    pub ip: IpAddr,
}

/// Every IPv4/IPv6 address of every interface, in the kernel's order.
pub fn addresses() -> io::Result<Vec<IfAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, alive
        // until freeifaddrs; its name is a NUL-terminated string and its
        // address, when non-null, a sockaddr of the family it states.
        unsafe {
            let ifa = &*cur;
            if !ifa.ifa_addr.is_null() {
                let name = CStr::from_ptr(ifa.ifa_name).to_string_lossy().into_owned();
                match i32::from((*ifa.ifa_addr).sa_family) {
                    libc::AF_INET => {
                        let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                        let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                        out.push(IfAddr {
                            name,
                            ip: ip.into(),
                        });
                    }
                    libc::AF_INET6 => {
                        let sin6 = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                        let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                        out.push(IfAddr {
                            name,
                            ip: ip.into(),
                        });
                    }
                    _ => {}
                }
            }
            cur = ifa.ifa_next;
        }
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// The MTU of interface `name`.
pub fn mtu(name: &str) -> io::Result<usize> {
    let req = ifreq(name, libc::SIOCGIFMTU)?;
    // SAFETY: the ioctl succeeded, so the union holds the MTU.
    Ok(unsafe { req.ifr_ifru.ifru_mtu } as usize)
}

/// The hardware address of interface `name` (`None` for interfaces
/// without one, such as loopback, whose address reads all zero). Asked of
/// the kernel (not sysfs, which shows the namespace it was mounted in).
pub fn mac(name: &str) -> Option<[u8; 6]> {
    let req = ifreq(name, libc::SIOCGIFHWADDR).ok()?;
    // SAFETY: the ioctl succeeded, so the union holds a sockaddr whose
    // data starts with the hardware address.
    let data = unsafe { req.ifr_ifru.ifru_hwaddr.sa_data };
    let mac: [u8; 6] = std::array::from_fn(|i| data[i] as u8);
    (mac != [0; 6]).then_some(mac)
}

/// Whether interface `name` is up and running (administratively up, with
/// carrier); `None` if there is no such interface.
pub fn link_up(name: &str) -> Option<bool> {
    let req = ifreq(name, libc::SIOCGIFFLAGS).ok()?;
    // SAFETY: the ioctl succeeded, so the union holds the flags.
    let flags = i32::from(unsafe { req.ifr_ifru.ifru_flags });
    Some(flags & libc::IFF_UP != 0 && flags & libc::IFF_RUNNING != 0)
}

/// An `ifreq` for interface `name` after ioctl `request` filled it.
fn ifreq(name: &str, request: libc::c_ulong) -> io::Result<libc::ifreq> {
    let bytes = name.as_bytes();
    if bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad interface name {name:?}"),
        ));
    }
    // SAFETY: plain socket(2); the fd is closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: ifreq is plain data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: the SIOCGIF* ioctls read ifr_name and write ifr_ifru of the
    // ifreq we own; fd is a socket we opened.
    let r = unsafe { libc::ioctl(fd, request as _, &mut req) };
    let err = io::Error::last_os_error();
    // SAFETY: closing the fd we opened, once.
    unsafe { libc::close(fd) };
    if r < 0 {
        return Err(io::Error::new(
            err.kind(),
            format!("no interface {name:?}: {err}"),
        ));
    }
    Ok(req)
}

/// The index of interface `name` (0 if there is none).
pub fn ifindex(name: &str) -> u32 {
    let Ok(c) = std::ffi::CString::new(name) else {
        return 0;
    };
    // SAFETY: a NUL-terminated name; if_nametoindex only reads it.
    unsafe { libc::if_nametoindex(c.as_ptr()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_listed_with_its_mtu() {
        let all = addresses().unwrap();
        let lo = all
            .iter()
            .find(|a| a.ip == IpAddr::V4(Ipv4Addr::LOCALHOST))
            .expect("127.0.0.1 on some interface");
        assert!(mtu(&lo.name).unwrap() >= 1280);
        assert!(mtu("no-such-if0").is_err());
        assert!(mtu("a-name-that-is-far-too-long").is_err());
        assert_eq!(mac(&lo.name), None, "loopback has no MAC");
        assert!(ifindex(&lo.name) > 0);
        assert_eq!(ifindex("no-such-if0"), 0);
    }
}
