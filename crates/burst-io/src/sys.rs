//! The libc calls of the UDP port: socket options and batched I/O
//! (`recvmmsg`/`sendmmsg`), with the only `unsafe` of this crate.

use std::io;
use std::mem::MaybeUninit;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::AsRawFd;

use crate::{PacketBuf, BURST, MAX_PACKET};

/// Sets "don't fragment" (PMTU discovery "do"): DF set, so Linux sends IP ID 0
/// from an unconnected socket, which the ICRC needs to know.
pub(crate) fn set_df(sock: &UdpSocket, v4: bool) -> io::Result<()> {
    let (level, name, val) = if v4 {
        (
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        )
    } else {
        (
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IPV6_PMTUDISC_DO,
        )
    };
    // SAFETY: a valid fd, a pointer to a live c_int and its exact size.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (&val as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn set_int(sock: &UdpSocket, level: libc::c_int, name: libc::c_int, val: libc::c_int) -> bool {
    // SAFETY: a valid fd, a pointer to a live c_int and its exact size.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (&val as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        ) == 0
    }
}

/// Asks for `bytes` of receive and send buffer: RoCE senders burst a whole
/// window at once and a drop costs a go-back-N (or a 67 ms timeout), so the
/// receive queue must hold a window. The FORCE options (root) pass
/// `net.core.rmem_max`; without them the kernel caps the value there.
pub(crate) fn set_buffers(sock: &UdpSocket, bytes: usize) {
    let v = bytes.min(i32::MAX as usize) as libc::c_int;
    if !set_int(sock, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, v) {
        set_int(sock, libc::SOL_SOCKET, libc::SO_RCVBUF, v);
    }
    if !set_int(sock, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, v) {
        set_int(sock, libc::SOL_SOCKET, libc::SO_SNDBUF, v);
    }
}

fn to_sockaddr(a: &SocketAddr, out: &mut libc::sockaddr_storage) -> libc::socklen_t {
    // SAFETY: sockaddr_storage is large and aligned enough for both families;
    // the writes stay within the struct.
    unsafe {
        match a {
            SocketAddr::V4(v) => {
                let p = (out as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>();
                p.write(libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: v.port().to_be(),
                    sin_addr: libc::in_addr {
                        s_addr: u32::from_ne_bytes(v.ip().octets()),
                    },
                    sin_zero: [0; 8],
                });
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t
            }
            SocketAddr::V6(v) => {
                let p = (out as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>();
                p.write(libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: v.port().to_be(),
                    sin6_flowinfo: 0,
                    sin6_addr: libc::in6_addr {
                        s6_addr: v.ip().octets(),
                    },
                    sin6_scope_id: v.scope_id(),
                });
                std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t
            }
        }
    }
}

fn from_sockaddr(s: &libc::sockaddr_storage) -> SocketAddr {
    match i32::from(s.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let v = unsafe { &*(s as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(v.sin_addr.s_addr.to_ne_bytes()),
                u16::from_be(v.sin_port),
            ))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let v = unsafe { &*(s as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(v.sin6_addr.s6_addr),
                u16::from_be(v.sin6_port),
                0,
                v.sin6_scope_id,
            ))
        }
        _ => SocketAddr::from(([0, 0, 0, 0], 0)),
    }
}

pub(crate) fn recv_burst(sock: &UdpSocket, bufs: &mut [PacketBuf]) -> io::Result<usize> {
    let n = bufs.len().min(BURST);
    if n == 0 {
        return Ok(0);
    }
    // SAFETY: all-zero is a valid value for these plain C structs.
    let mut addrs: [libc::sockaddr_storage; BURST] = unsafe { MaybeUninit::zeroed().assume_init() };
    // SAFETY: as above.
    let mut iovs: [libc::iovec; BURST] = unsafe { MaybeUninit::zeroed().assume_init() };
    // SAFETY: as above.
    let mut msgs: [libc::mmsghdr; BURST] = unsafe { MaybeUninit::zeroed().assume_init() };
    for i in 0..n {
        iovs[i] = libc::iovec {
            iov_base: bufs[i].data.as_mut_ptr().cast(),
            iov_len: MAX_PACKET,
        };
        msgs[i].msg_hdr.msg_name = (&mut addrs[i] as *mut libc::sockaddr_storage).cast();
        msgs[i].msg_hdr.msg_namelen =
            std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        msgs[i].msg_hdr.msg_iov = &mut iovs[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
    }
    // SAFETY: `msgs[..n]` point at live iovecs over live buffers of
    // MAX_PACKET bytes and at live address storage, all outliving the call.
    let got = unsafe {
        libc::recvmmsg(
            sock.as_raw_fd(),
            msgs.as_mut_ptr(),
            n as libc::c_uint,
            libc::MSG_DONTWAIT,
            std::ptr::null_mut(),
        )
    };
    if got < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::WouldBlock {
            Ok(0)
        } else {
            Err(e)
        };
    }
    let got = got as usize;
    for i in 0..got {
        bufs[i].len = msgs[i].msg_len as usize;
        bufs[i].peer = from_sockaddr(&addrs[i]);
    }
    Ok(got)
}

pub(crate) fn send_burst(sock: &UdpSocket, bufs: &[PacketBuf]) -> io::Result<usize> {
    let mut sent = 0;
    while sent < bufs.len() {
        let chunk = &bufs[sent..(sent + BURST).min(bufs.len())];
        // SAFETY: all-zero is a valid value for these plain C structs.
        let mut addrs: [libc::sockaddr_storage; BURST] =
            unsafe { MaybeUninit::zeroed().assume_init() };
        // SAFETY: as above.
        let mut iovs: [libc::iovec; BURST] = unsafe { MaybeUninit::zeroed().assume_init() };
        // SAFETY: as above.
        let mut msgs: [libc::mmsghdr; BURST] = unsafe { MaybeUninit::zeroed().assume_init() };
        for (i, b) in chunk.iter().enumerate() {
            let alen = to_sockaddr(&b.peer, &mut addrs[i]);
            iovs[i] = libc::iovec {
                iov_base: b.data.as_ptr() as *mut libc::c_void,
                iov_len: b.len,
            };
            msgs[i].msg_hdr.msg_name = (&mut addrs[i] as *mut libc::sockaddr_storage).cast();
            msgs[i].msg_hdr.msg_namelen = alen;
            msgs[i].msg_hdr.msg_iov = &mut iovs[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: `msgs[..chunk.len()]` reference live buffers (only read by
        // the kernel) and live addresses for the duration of the call.
        let rc = unsafe {
            libc::sendmmsg(
                sock.as_raw_fd(),
                msgs.as_mut_ptr(),
                chunk.len() as libc::c_uint,
                libc::MSG_DONTWAIT,
            )
        };
        if rc < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::WouldBlock && sent > 0 {
                Ok(sent)
            } else if e.kind() == io::ErrorKind::WouldBlock {
                Ok(0)
            } else {
                Err(e)
            };
        }
        sent += rc as usize;
        if (rc as usize) < chunk.len() {
            break;
        }
    }
    Ok(sent)
}
