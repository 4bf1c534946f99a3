//! The libc calls of the UDP port: socket options and batched I/O
//! (`recvmmsg`/`sendmmsg` with GSO and GRO control messages), with the only
//! `unsafe` of this crate.

use std::io;
use std::mem::MaybeUninit;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};

use crate::{gso_run, PacketBuf, RxBatch, RxMsg, BURST, MAX_GSO_SEGMENTS};

/// `UDP_NO_CHECK6_RX`: accept IPv6 UDP datagrams with a zero checksum
/// (linux/udp.h; not in the libc crate).
pub(crate) const UDP_NO_CHECK6_RX: libc::c_int = 102;

/// `SO_ATTACH_REUSEPORT_CBPF` (not in the libc crate for this target).
const SO_ATTACH_REUSEPORT_CBPF: libc::c_int = 51;

/// A UDP socket bound to `addr` with `SO_REUSEPORT` (a lane of a group).
pub(crate) fn bind_reuseport(addr: SocketAddr) -> io::Result<UdpSocket> {
    bind_with(addr, libc::SOL_SOCKET, libc::SO_REUSEPORT)
}

/// A UDP socket bound to `addr` with `IP_FREEBIND` (IPv4 and IPv6): an
/// address still in duplicate address detection (a link-local one just
/// after the link came up) binds, and receives once the kernel takes it.
pub(crate) fn bind_freebind(addr: SocketAddr) -> io::Result<UdpSocket> {
    bind_with(addr, libc::SOL_IP, libc::IP_FREEBIND)
}

/// A UDP socket bound to multicast group `addr` with `SO_REUSEADDR`, so
/// that every burst device of the host that joins the group gets a copy.
pub(crate) fn bind_group(addr: SocketAddr) -> io::Result<UdpSocket> {
    let sock = bind_with(addr, libc::SOL_SOCKET, libc::SO_REUSEADDR)?;
    if addr.is_ipv4() {
        // Only the groups this socket joined (not every group of the host).
        set_int(&sock, libc::IPPROTO_IP, libc::IP_MULTICAST_ALL, 0);
    }
    Ok(sock)
}

/// Sends IPv4 multicast out of the interface holding `local` (without it
/// the kernel routes the group's address, and a namespace with only its
/// subnet's route has none). Best effort.
pub(crate) fn set_multicast_if(sock: &UdpSocket, local: Ipv4Addr) {
    let a = libc::in_addr {
        s_addr: u32::from_ne_bytes(local.octets()),
    };
    // SAFETY: a valid in_addr of the stated size.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_MULTICAST_IF,
            (&a as *const libc::in_addr).cast(),
            std::mem::size_of::<libc::in_addr>() as libc::socklen_t,
        );
    }
}

/// An epoll instance (close-on-exec).
pub(crate) fn epoll() -> io::Result<std::os::fd::OwnedFd> {
    // SAFETY: plain epoll_create1(2); checked.
    let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor we just opened and now own.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// The descriptors of epoll instance `ep` readable now (never waits),
/// into `out`; how many. `out.len()` of them means there may be more.
pub(crate) fn epoll_ready(ep: &impl AsRawFd, out: &mut [RawFd]) -> io::Result<usize> {
    let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 16];
    let max = out.len().min(evs.len());
    // SAFETY: `evs` is a live array of at least `max` events for the call.
    let n = unsafe { libc::epoll_wait(ep.as_raw_fd(), evs.as_mut_ptr(), max as libc::c_int, 0) };
    if n < 0 {
        let e = io::Error::last_os_error();
        // A signal: nothing known to be ready, the caller looks again.
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(0)
        } else {
            Err(e)
        };
    }
    let n = n as usize;
    for (o, e) in out.iter_mut().zip(&evs[..n]) {
        // The data is the descriptor number (`epoll_add`).
        *o = e.u64 as RawFd;
    }
    Ok(n)
}

/// Adds `fd` to epoll instance `ep` for readability (level-triggered).
pub(crate) fn epoll_add(ep: &impl AsRawFd, fd: &impl AsRawFd) -> io::Result<()> {
    epoll_add_events(ep, fd, libc::EPOLLIN as u32)
}

/// Adds `fd` to epoll instance `ep` for `events` (0: reports nothing until
/// [`epoll_mod`] asks for more).
pub(crate) fn epoll_add_events(
    ep: &impl AsRawFd,
    fd: &impl AsRawFd,
    events: u32,
) -> io::Result<()> {
    epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, events)
}

/// Changes the events `ep` reports for `fd`, which it holds; a change that
/// makes it report readiness already there wakes its waiters.
pub(crate) fn epoll_mod(ep: &impl AsRawFd, fd: &impl AsRawFd, events: u32) -> io::Result<()> {
    epoll_ctl(ep, libc::EPOLL_CTL_MOD, fd, events)
}

fn epoll_ctl(ep: &impl AsRawFd, op: libc::c_int, fd: &impl AsRawFd, events: u32) -> io::Result<()> {
    let mut ev = libc::epoll_event {
        events,
        u64: fd.as_raw_fd() as u64,
    };
    // SAFETY: both descriptors are live; `ev` is a valid event.
    let rc = unsafe { libc::epoll_ctl(ep.as_raw_fd(), op, fd.as_raw_fd(), &mut ev) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A UDP socket with option `name` of `level` set to 1, bound to `addr`.
fn bind_with(addr: SocketAddr, level: libc::c_int, name: libc::c_int) -> io::Result<UdpSocket> {
    let family = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain socket(2); checked.
    let fd = unsafe { libc::socket(family, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor we just opened and now own.
    let sock = unsafe { UdpSocket::from_raw_fd(fd) };
    if !set_int(&sock, level, name, 1) {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: all-zero is a valid sockaddr_in6.
    let mut sa: SockAddr = unsafe { std::mem::zeroed() };
    let len = to_sockaddr(&addr, &mut sa);
    // SAFETY: a valid address of the stated length.
    let rc = unsafe { libc::bind(sock.as_raw_fd(), (&sa as *const SockAddr).cast(), len) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(sock)
}

/// Steers a reuseport group's datagrams by RoCEv2 destination QPN (BTH
/// bytes 5..8 of the UDP payload): socket `(qpn - first_qpn) % lanes` in
/// bind order. A classic BPF program: no libbpf, no CAP_BPF. Datagrams too
/// short for a BTH go to socket 0.
pub(crate) fn attach_qpn_steering(sock: &UdpSocket, lanes: u32, first_qpn: u32) -> io::Result<()> {
    const LD_B_ABS: u16 = 0x30;
    const LSH_K: u16 = 0x64;
    const OR_X: u16 = 0x4c;
    const SUB_K: u16 = 0x14;
    const MOD_K: u16 = 0x94;
    const TAX: u16 = 0x07;
    const RET_A: u16 = 0x16;
    let ins = |code: u16, k: u32| libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    };
    // The reuseport hook runs the program with the data at the UDP payload.
    let mut prog = [
        ins(LD_B_ABS, 5),
        ins(LSH_K, 16),
        ins(TAX, 0),
        ins(LD_B_ABS, 6),
        ins(LSH_K, 8),
        ins(OR_X, 0),
        ins(TAX, 0),
        ins(LD_B_ABS, 7),
        ins(OR_X, 0),
        ins(SUB_K, first_qpn),
        ins(MOD_K, lanes.max(1)),
        ins(RET_A, 0),
    ];
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_mut_ptr(),
    };
    // SAFETY: a live program of the stated length, copied by the kernel.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_ATTACH_REUSEPORT_CBPF,
            (&fprog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

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

/// Sets a `SOL_UDP` option; returns whether the kernel took it.
pub(crate) fn set_udp_opt(sock: &UdpSocket, name: libc::c_int, val: libc::c_int) -> bool {
    set_int(sock, libc::SOL_UDP, name, val)
}

/// Whether the kernel knows `UDP_SEGMENT` (Linux 4.18+).
pub(crate) fn gso_supported(sock: &UdpSocket) -> bool {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: a valid fd, a pointer to a live c_int and its size.
    unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_UDP,
            libc::UDP_SEGMENT,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        ) == 0
    }
}

/// Datagrams the kernel dropped for `sock` so far (a full receive buffer,
/// mostly): `SO_MEMINFO`'s `SK_MEMINFO_DROPS`, 0 where the kernel does not
/// say (before 4.12).
pub(crate) fn socket_drops(sock: &UdpSocket) -> u64 {
    // asm-generic's and x86's value (libc has it only in its uapi tree).
    const SO_MEMINFO: libc::c_int = 55;
    let mut v = [0u32; 16];
    let mut len = std::mem::size_of_val(&v) as libc::socklen_t;
    // SAFETY: a valid fd, a live buffer and its size; the kernel writes at
    // most `len` bytes and says how many.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_MEMINFO,
            v.as_mut_ptr().cast(),
            &mut len,
        )
    };
    let i = libc::SK_MEMINFO_DROPS as usize;
    if rc == 0 && len as usize >= (i + 1) * std::mem::size_of::<u32>() {
        u64::from(v[i])
    } else {
        0
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

/// ECN for RoCEv2 (DCQCN): what leaves is ECN-capable, ECT(0) in the IP
/// TOS / traffic class (RFC 3168), so a switch or qdisc can mark CE instead
/// of dropping; and the TOS of each received datagram comes with it as a
/// control message, so the receiver sees CE. Returns whether both took.
pub(crate) fn set_ecn(sock: &UdpSocket, v4: bool) -> bool {
    const ECT0: libc::c_int = 0b10;
    if v4 {
        set_int(sock, libc::IPPROTO_IP, libc::IP_TOS, ECT0)
            & set_int(sock, libc::IPPROTO_IP, libc::IP_RECVTOS, 1)
    } else {
        set_int(sock, libc::IPPROTO_IPV6, libc::IPV6_TCLASS, ECT0)
            & set_int(sock, libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS, 1)
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

/// Room for an IPv4 or IPv6 socket address: a `sockaddr_in6` (28 bytes)
/// holds a `sockaddr_in` (16) too, with the family at the same offset; a
/// quarter of `sockaddr_storage`, so zeroing one per message costs little.
type SockAddr = libc::sockaddr_in6;

fn to_sockaddr(a: &SocketAddr, out: &mut SockAddr) -> libc::socklen_t {
    // SAFETY: a sockaddr_in6 is large and aligned enough for both families;
    // the writes stay within the struct.
    unsafe {
        match a {
            SocketAddr::V4(v) => {
                let p = (out as *mut SockAddr).cast::<libc::sockaddr_in>();
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
                (out as *mut SockAddr).write(libc::sockaddr_in6 {
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

fn from_sockaddr(s: &SockAddr) -> SocketAddr {
    match i32::from(s.sin6_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in, which
            // is smaller than the storage and needs no stricter alignment.
            let v = unsafe { &*(s as *const SockAddr).cast::<libc::sockaddr_in>() };
            SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(v.sin_addr.s_addr.to_ne_bytes()),
                u16::from_be(v.sin_port),
            ))
        }
        libc::AF_INET6 => {
            let v = s;
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

/// Blocks until one of `fds` (at most 64) is readable or `timeout` passes;
/// bit `i` of the result: `fds[i]` is readable. A signal is an error
/// ([`io::ErrorKind::Interrupted`]).
pub(crate) fn wait_which(
    fds: &[std::os::fd::RawFd],
    timeout: std::time::Duration,
) -> io::Result<u64> {
    let mut p = [libc::pollfd {
        fd: -1,
        events: libc::POLLIN,
        revents: 0,
    }; 64];
    let n = fds.len().min(64);
    for (q, &fd) in p.iter_mut().zip(&fds[..n]) {
        q.fd = fd;
    }
    if ppoll(&mut p[..n], timeout) < 0 {
        return Err(io::Error::last_os_error());
    }
    // Readable, or hung up / in error (a read then reports it).
    let mask = libc::POLLIN | libc::POLLHUP | libc::POLLERR;
    Ok(p[..n]
        .iter()
        .enumerate()
        .filter(|(_, q)| q.revents & mask != 0)
        .fold(0, |m, (i, _)| m | 1 << i))
}

/// `ppoll(2)` with `timeout` to the nanosecond (poll(2)'s milliseconds
/// would turn a transport timer 300 us away into a busy loop or a 1 ms
/// oversleep); [`std::time::Duration::MAX`] waits without a limit.
fn ppoll(p: &mut [libc::pollfd], timeout: std::time::Duration) -> libc::c_int {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(libc::time_t::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    let limit = if timeout == std::time::Duration::MAX {
        std::ptr::null()
    } else {
        &ts as *const libc::timespec
    };
    // SAFETY: live pollfds and their count; `limit` is null or points at a
    // timespec that outlives the call; no signal mask is passed.
    unsafe {
        libc::ppoll(
            p.as_mut_ptr(),
            p.len() as libc::nfds_t,
            limit,
            std::ptr::null(),
        )
    }
}

pub(crate) fn wait_readable(
    fd: std::os::fd::RawFd,
    timeout: std::time::Duration,
) -> io::Result<bool> {
    let mut p = [libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }];
    match ppoll(&mut p, timeout) {
        rc if rc < 0 => {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(e)
            }
        }
        0 => Ok(false),
        _ => Ok(p[0].revents & libc::POLLIN != 0),
    }
}

/// Room for one control message carrying an int (`CMSG_SPACE(4)` is 24 on
/// 64-bit Linux), aligned for `cmsghdr`.
type Control = [u64; 4];

/// Room for a received message's control data: a `UDP_GRO` segment size and
/// an `IP_TOS` / `IPV6_TCLASS` (24 bytes each with their headers).
type RxControl = [u64; 8];

/// The `recvmmsg` headers of an [`RxBatch`], built once: each message's
/// name, iovec and control pointers point into this boxed struct and at the
/// batch's boxed buffers, which never move. A call only resets the lengths
/// the kernel overwrites (building and zeroing 32 headers per call showed in
/// profiles of the polling loop).
pub(crate) struct RxHeaders {
    addrs: [SockAddr; BURST],
    iovs: [libc::iovec; BURST],
    ctrl: [RxControl; BURST],
    msgs: [libc::mmsghdr; BURST],
    /// Headers built (the batch's buffer count, at most BURST).
    n: usize,
}

// SAFETY: the raw pointers inside only point into this struct's own heap
// allocation and at the owning RxBatch's heap buffers; they are
// dereferenced only by the kernel during a call made by the owner, which
// holds `&mut` of both. Moving the owner to another thread moves neither.
unsafe impl Send for RxHeaders {}

impl RxHeaders {
    pub(crate) fn new(bufs: &mut [Box<[u8]>]) -> Box<RxHeaders> {
        // SAFETY: all-zero is a valid value of these plain C structs.
        let mut h: Box<RxHeaders> = Box::new(unsafe { std::mem::zeroed() });
        h.n = bufs.len().min(BURST);
        for (i, b) in bufs.iter_mut().take(BURST).enumerate() {
            h.iovs[i] = libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            };
        }
        for i in 0..h.n {
            let addr = (&mut h.addrs[i] as *mut SockAddr).cast();
            let iov = &mut h.iovs[i] as *mut libc::iovec;
            let ctrl = (&mut h.ctrl[i] as *mut RxControl).cast();
            let m = &mut h.msgs[i].msg_hdr;
            m.msg_name = addr;
            m.msg_iov = iov;
            m.msg_iovlen = 1;
            m.msg_control = ctrl;
        }
        h
    }
}

/// Receives up to `want` datagrams (at most the batch's buffers) into `rx`,
/// reading each one's GRO segment size from its control message.
/// Receives up to `want` datagrams from `sock` into `rx` after what it
/// holds already, marked as sent to `dest` (`None`: the port's own address).
pub(crate) fn recv_batch(
    sock: &UdpSocket,
    rx: &mut RxBatch,
    want: usize,
    dest: Option<IpAddr>,
) -> io::Result<()> {
    let start = rx.msgs.len();
    let h = &mut *rx.hdrs;
    let n = h.n.saturating_sub(start).min(want.max(1));
    if n == 0 {
        return Ok(());
    }
    for i in start..start + n {
        // The kernel overwrites these; an address of an unexpected family
        // leaves the previous bytes, so clear the family.
        h.addrs[i].sin6_family = 0;
        h.msgs[i].msg_hdr.msg_namelen = std::mem::size_of::<SockAddr>() as libc::socklen_t;
        h.msgs[i].msg_hdr.msg_controllen = std::mem::size_of::<RxControl>() as _;
        h.msgs[i].msg_hdr.msg_flags = 0;
    }
    // SAFETY: `msgs[start..start + n]` point at live iovecs over the
    // batch's live buffers of their stated length, and at live address
    // storage and control buffers (all in `h`, borrowed mutably for the
    // call); start + n <= h.n.
    let got = unsafe {
        libc::recvmmsg(
            sock.as_raw_fd(),
            h.msgs.as_mut_ptr().add(start),
            n as libc::c_uint,
            libc::MSG_DONTWAIT,
            std::ptr::null_mut(),
        )
    };
    if got < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::WouldBlock {
            Ok(())
        } else {
            Err(e)
        };
    }
    for i in start..start + got as usize {
        let m = &h.msgs[i];
        let len = m.msg_len as usize;
        let (seg, tos) = control(&m.msg_hdr);
        rx.msgs.push(RxMsg {
            len,
            seg: seg.unwrap_or(len),
            peer: from_sockaddr(&h.addrs[i]),
            ip_id: None,
            ecn: tos & 0b11,
            icrc_verified: false,
            pseudo_crc: None,
            dest,
        });
    }
    Ok(())
}

/// A received message's control data: the `UDP_GRO` segment size, and the
/// IP TOS or IPv6 traffic class (0 when absent).
fn control(h: &libc::msghdr) -> (Option<usize>, u8) {
    let (mut seg, mut tos) = (None, 0);
    // SAFETY: `h` is a msghdr the kernel filled, whose control pointer and
    // (updated) length describe live memory; the CMSG macros stay within it.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            let data = libc::CMSG_DATA(c);
            match ((*c).cmsg_level, (*c).cmsg_type) {
                (libc::SOL_UDP, libc::UDP_GRO) => {
                    let v = std::ptr::read_unaligned(data.cast::<libc::c_int>());
                    seg = usize::try_from(v).ok().filter(|&v| v > 0);
                }
                // IP_TOS comes as one byte, IPV6_TCLASS as an int.
                (libc::IPPROTO_IP, libc::IP_TOS) => tos = *data,
                (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => {
                    tos = std::ptr::read_unaligned(data.cast::<libc::c_int>()) as u8;
                }
                _ => {}
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    (seg, tos)
}

/// Sends `bufs`, each run of [`gso_run`] as one message (with a
/// `UDP_SEGMENT` control message when it has several packets). Returns the
/// packets of the messages the kernel took.
pub(crate) fn send_burst(sock: &UdpSocket, bufs: &[PacketBuf], gso: bool) -> io::Result<usize> {
    // Iovecs for one sendmmsg: BURST messages of up to MAX_GSO_SEGMENTS.
    const IOVS: usize = 4 * MAX_GSO_SEGMENTS;
    let mut sent = 0;
    while sent < bufs.len() {
        // SAFETY: all-zero is a valid socket address (family AF_UNSPEC).
        let mut addrs: [SockAddr; BURST] = unsafe { std::mem::zeroed() };
        let mut iovs = [MaybeUninit::<libc::iovec>::uninit(); IOVS];
        let mut ctrl = [MaybeUninit::<Control>::uninit(); BURST];
        let mut msgs = [MaybeUninit::<libc::mmsghdr>::uninit(); BURST];
        let mut runs = [0usize; BURST];
        let (mut nmsg, mut niov, mut at) = (0, 0, sent);
        while nmsg < BURST && at < bufs.len() {
            let run = gso_run(&bufs[at..], gso);
            if niov + run > IOVS {
                break;
            }
            let first = &bufs[at];
            let alen = to_sockaddr(&first.peer, &mut addrs[nmsg]);
            for (k, b) in bufs[at..at + run].iter().enumerate() {
                iovs[niov + k].write(libc::iovec {
                    iov_base: b.data.as_ptr() as *mut libc::c_void,
                    iov_len: b.len,
                });
            }
            // SAFETY: all-zero is a valid mmsghdr.
            let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
            m.msg_hdr.msg_name = (&mut addrs[nmsg] as *mut SockAddr).cast();
            m.msg_hdr.msg_namelen = alen;
            m.msg_hdr.msg_iov = iovs[niov].as_mut_ptr();
            m.msg_hdr.msg_iovlen = run;
            if run > 1 {
                let c = ctrl[nmsg].write([0; 4]);
                m.msg_hdr.msg_control = c.as_mut_ptr().cast();
                // SAFETY: CMSG_SPACE/LEN are pure arithmetic.
                m.msg_hdr.msg_controllen = unsafe { libc::CMSG_SPACE(2) } as _;
                // SAFETY: the control buffer is 32 bytes, more than
                // CMSG_SPACE(2) = 24; CMSG_FIRSTHDR returns its start.
                unsafe {
                    let h = libc::CMSG_FIRSTHDR(&m.msg_hdr);
                    (*h).cmsg_level = libc::SOL_UDP;
                    (*h).cmsg_type = libc::UDP_SEGMENT;
                    (*h).cmsg_len = libc::CMSG_LEN(2) as _;
                    std::ptr::write_unaligned(libc::CMSG_DATA(h).cast::<u16>(), first.len as u16);
                }
            }
            msgs[nmsg].write(m);
            runs[nmsg] = run;
            nmsg += 1;
            niov += run;
            at += run;
        }
        // SAFETY: `msgs[..nmsg]` are initialised and reference live buffers
        // (only read by the kernel), addresses and control data for the
        // duration of the call.
        let rc = unsafe {
            libc::sendmmsg(
                sock.as_raw_fd(),
                msgs.as_mut_ptr().cast(),
                nmsg as libc::c_uint,
                libc::MSG_DONTWAIT,
            )
        };
        if rc < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::WouldBlock || sent > 0 {
                Ok(sent)
            } else {
                Err(e)
            };
        }
        let took = rc as usize;
        sent += runs[..took].iter().sum::<usize>();
        if took < nmsg {
            break;
        }
    }
    Ok(sent)
}
