//! The socket side: SOCK_SEQPACKET messages with descriptors, peer
//! credentials, and the MAD sockets of connection management.

use super::*;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// Sends one message with descriptors.
pub fn send(sock: BorrowedFd<'_>, msg: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many descriptors",
        ));
    }
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let mut iov = libc::iovec {
        iov_base: msg.as_ptr().cast_mut().cast(),
        iov_len: msg.len(),
    };
    let mut cbuf = [0u64; 32]; // CMSG_SPACE(16 fds) fits in 256 bytes, aligned
                               // SAFETY: a zeroed msghdr is valid; every pointer set below is live for
                               // the call.
    let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
    hdr.msg_iov = &mut iov;
    hdr.msg_iovlen = 1;
    if !raw.is_empty() {
        let bytes = std::mem::size_of_val(raw.as_slice());
        // SAFETY: CMSG_SPACE is arithmetic.
        let space = unsafe { libc::CMSG_SPACE(bytes as u32) } as usize;
        hdr.msg_control = cbuf.as_mut_ptr().cast();
        hdr.msg_controllen = space;
        // SAFETY: msg_control points at `space` bytes of our buffer (space
        // <= 256 for 16 fds), so the first header and its data fit.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&hdr);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(bytes as u32) as usize;
            std::ptr::copy_nonoverlapping(raw.as_ptr(), libc::CMSG_DATA(c).cast(), raw.len());
        }
    }
    loop {
        // SAFETY: `hdr` and everything it points at are live.
        let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &hdr, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Receives one message and its descriptors; `Ok(None)` when the peer
/// closed. Descriptors beyond [`MAX_FDS`] and truncated messages are refused.
pub fn recv(sock: BorrowedFd<'_>) -> io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    let mut buf = vec![0u8; MAX_MESSAGE + 1];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cbuf = [0u64; 40];
    // SAFETY: as in `send`.
    let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
    hdr.msg_iov = &mut iov;
    hdr.msg_iovlen = 1;
    hdr.msg_control = cbuf.as_mut_ptr().cast();
    hdr.msg_controllen = std::mem::size_of_val(&cbuf);
    let n = loop {
        // SAFETY: `hdr` points at live buffers of the sizes it states.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut hdr, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel wrote into `cbuf`,
    // with the libc macros that bound each step by msg_controllen.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&hdr);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                let len = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..len / std::mem::size_of::<RawFd>() {
                    // Each descriptor the kernel installed is ours now.
                    fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            c = libc::CMSG_NXTHDR(&hdr, c);
        }
    }
    if n == 0 && fds.is_empty() {
        return Ok(None);
    }
    if hdr.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 || fds.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "truncated message or too many descriptors",
        ));
    }
    buf.truncate(n);
    Ok(Some((buf, fds)))
}

/// The credentials of the peer of a Unix socket (`SO_PEERCRED`): pid, uid, gid.
pub fn peer_credentials(sock: BorrowedFd<'_>) -> io::Result<(u32, u32, u32)> {
    // SAFETY: a zeroed ucred is valid.
    let mut c: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt into a live ucred of the stated length.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut c as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((c.pid as u32, c.uid, c.gid))
}

/// A connected `SOCK_SEQPACKET` socket to `path`.
pub fn connect(path: &std::path::Path) -> io::Result<OwnedFd> {
    let fd = seqpacket()?;
    let (addr, len) = sockaddr(path)?;
    // SAFETY: connect with a sockaddr_un of the stated length.
    let rc = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// A `SOCK_SEQPACKET` socket listening on `path` (an old socket file there
/// is replaced).
pub fn listen(path: &std::path::Path) -> io::Result<OwnedFd> {
    let fd = seqpacket()?;
    let (addr, len) = sockaddr(path)?;
    let _ = std::fs::remove_file(path);
    // SAFETY: bind and listen with a sockaddr_un of the stated length.
    unsafe {
        if libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            len,
        ) < 0
            || libc::listen(fd.as_raw_fd(), 128) < 0
        {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(fd)
}

/// Accepts a connection.
pub fn accept(listener: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    loop {
        // SAFETY: accept4 without an address; the result is checked.
        let fd = unsafe {
            libc::accept4(
                listener.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        };
        if fd >= 0 {
            // SAFETY: a fresh descriptor we own.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

fn seqpacket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket call; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn sockaddr(path: &std::path::Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: a zeroed sockaddr_un is valid.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let p = path.as_os_str().as_bytes();
    if p.len() >= a.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "socket path too long",
        ));
    }
    for (d, s) in a.sun_path.iter_mut().zip(p) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + p.len() + 1;
    Ok((a, len as libc::socklen_t))
}
/// Size of a datagram on a MAD socket: the peer's address as 16 bytes
/// (IPv4-mapped for IPv4), then the 256-byte MAD.
pub const MAD_DATAGRAM: usize = 16 + burst_wire::mad::MAD_LEN;

/// A pair of connected SOCK_SEQPACKET sockets for CM MADs between a client
/// and the daemon (non-blocking both).
pub fn mad_socketpair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut sv = [0 as libc::c_int; 2];
    // SAFETY: `sv` is a live array of two ints the call fills.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
            sv.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: two fresh descriptors we own.
    Ok(unsafe { (OwnedFd::from_raw_fd(sv[0]), OwnedFd::from_raw_fd(sv[1])) })
}

/// Sends one MAD on a MAD socket without blocking; `false` when the
/// socket is full or gone (the CM retransmits).
pub fn send_mad(sock: BorrowedFd<'_>, m: &crate::gsi::GsiMad) -> bool {
    let mut b = [0u8; MAD_DATAGRAM];
    let ip = match m.peer {
        std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        std::net::IpAddr::V6(v6) => v6,
    };
    b[..16].copy_from_slice(&ip.octets());
    b[16..].copy_from_slice(&m.mad);
    // SAFETY: sends `b`, live for the call, on a descriptor we borrow.
    let n = unsafe {
        libc::send(
            sock.as_raw_fd(),
            b.as_ptr().cast(),
            b.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    n == b.len() as isize
}

/// Sends `msg` (no descriptors) without waiting: `false` if the socket's
/// buffer is full or it is gone (a refusal to a peer that may never read).
pub fn send_nowait(sock: BorrowedFd<'_>, msg: &[u8]) -> bool {
    // SAFETY: sends `msg`, live for the call, on a descriptor we borrow.
    let n = unsafe {
        libc::send(
            sock.as_raw_fd(),
            msg.as_ptr().cast(),
            msg.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    n == msg.len() as isize
}

/// What reading a MAD socket gave.
#[derive(Debug, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)] // read once per MAD, on the stack
pub enum MadRecv {
    /// A MAD.
    Mad(crate::gsi::GsiMad),
    /// Nothing waits.
    Empty,
    /// A datagram of the wrong size (dropped).
    Bad,
    /// The other end is gone.
    Closed,
}

/// Takes one MAD from a MAD socket without blocking.
pub fn recv_mad(sock: BorrowedFd<'_>) -> MadRecv {
    let mut b = [0u8; MAD_DATAGRAM + 1];
    // SAFETY: receives into `b`, live for the call, on a descriptor we borrow.
    let n = unsafe {
        libc::recv(
            sock.as_raw_fd(),
            b.as_mut_ptr().cast(),
            b.len(),
            libc::MSG_DONTWAIT,
        )
    };
    match n {
        0 => MadRecv::Closed,
        n if n < 0 => match io::Error::last_os_error().kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => MadRecv::Empty,
            _ => MadRecv::Closed,
        },
        n if n as usize != MAD_DATAGRAM => MadRecv::Bad,
        _ => {
            let mut ip = [0u8; 16];
            ip.copy_from_slice(&b[..16]);
            let v6 = std::net::Ipv6Addr::from(ip);
            let peer = v6
                .to_ipv4_mapped()
                .map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4);
            let mut mad = [0u8; burst_wire::mad::MAD_LEN];
            mad.copy_from_slice(&b[16..MAD_DATAGRAM]);
            MadRecv::Mad(crate::gsi::GsiMad { peer, mad })
        }
    }
}
