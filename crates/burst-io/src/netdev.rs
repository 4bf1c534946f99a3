//! Interface facts asked of the kernel with `SIOCGIF*` ioctls (MTU,
//! hardware address, link state): not sysfs, which shows the network
//! namespace it was mounted in, not the caller's.

use std::io;

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
