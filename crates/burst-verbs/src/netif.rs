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

pub use burst_io::netdev::{link_up, mac, mtu};

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
