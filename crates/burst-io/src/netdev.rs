//! Interface facts asked of the kernel with `SIOCGIF*` ioctls (MTU,
//! hardware address, link state): not sysfs, which shows the network
//! namespace it was mounted in, not the caller's; and the link's changes
//! as the kernel announces them ([`LinkEvents`]).

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

/// The kernel's link notifications for the caller's network namespace
/// (rtnetlink's `RTMGRP_LINK` group) on a non-blocking socket: readable
/// when an interface goes up or down or changes carrier, so a device can
/// follow its link by waiting on this (with its other descriptors) instead
/// of asking the kernel every so often. What changed is not parsed: a
/// notification says "look again" ([`link_up`]), which [`LinkEvents::changed`]
/// reports once per batch.
#[derive(Debug)]
pub struct LinkEvents {
    fd: std::os::fd::OwnedFd,
    changed: std::sync::atomic::AtomicBool,
}

impl LinkEvents {
    /// Subscribes to the link notifications.
    pub fn open() -> io::Result<LinkEvents> {
        use std::os::fd::FromRawFd;
        // SAFETY: plain socket(2); the result is checked before use.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor socket(2) just returned, owned by nobody else.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        // SAFETY: sockaddr_nl is plain data; all-zero is a valid value.
        let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        sa.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        sa.nl_groups = libc::RTMGRP_LINK as u32;
        // SAFETY: binds the socket we own to a live sockaddr_nl of the
        // length given.
        let r = unsafe {
            libc::bind(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                (&sa as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(LinkEvents {
            fd,
            changed: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Reads every pending notification (bounded: a namespace whose links
    /// flap without end cannot hold the caller); when there was any (or
    /// the socket overflowed and lost some), [`LinkEvents::changed`] says
    /// so next. Returns whether there was any.
    pub fn drain(&self) -> bool {
        let mut buf = [0u8; 8192];
        let mut any = false;
        for _ in 0..64 {
            // SAFETY: receives at most `buf.len()` bytes into a live buffer
            // from the non-blocking socket we own.
            let n = unsafe {
                libc::recv(
                    std::os::fd::AsRawFd::as_raw_fd(&self.fd),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n > 0 {
                any = true;
                continue;
            }
            // ENOBUFS: notifications were lost; the link may have changed.
            any |= n < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENOBUFS);
            break;
        }
        if any {
            self.changed
                .store(true, std::sync::atomic::Ordering::Release);
        }
        any
    }

    /// Whether a notification came since the last call (taken: the next
    /// call says false until another comes).
    pub fn changed(&self) -> bool {
        self.changed
            .swap(false, std::sync::atomic::Ordering::AcqRel)
    }
}

impl std::os::fd::AsFd for LinkEvents {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.fd)
    }
}
