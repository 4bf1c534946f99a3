//! librdmacm's rsocket calls over burst-verbs' [`RSocket`]: descriptors,
//! C buffers and socket options in, errno out. A stream rsocket's
//! descriptor is a real one (its CM channel's), so `rpoll` and `rselect`
//! take rsockets and kernel descriptors in one set, as rdma-core's do.
//!
//! Not here: datagram rsockets (`SOCK_DGRAM`: ENOTSUP).

use std::collections::HashMap;
use std::ffi::{c_int, c_long, c_void};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use burst_verbs::rsocket::{RSocket, Shutdown};

use super::abi::sockaddr_storage;
use super::addr::{read_sockaddr, write_sockaddr};
use super::{fail, fail_io, rdma_cm};
use crate::{guard, set_errno};

/// An open rsocket and the descriptor flags `rfcntl` keeps for it.
struct Open {
    rs: Arc<RSocket>,
    fd_flags: AtomicI32,
    fs_flags: AtomicI32,
}

static SOCKETS: Mutex<Option<HashMap<c_int, Arc<Open>>>> = Mutex::new(None);

fn lookup(fd: c_int) -> Option<Arc<Open>> {
    let t = SOCKETS.lock().unwrap_or_else(|e| e.into_inner());
    t.as_ref()?.get(&fd).cloned()
}

fn any_open() -> bool {
    let t = SOCKETS.lock().unwrap_or_else(|e| e.into_inner());
    t.as_ref().is_some_and(|m| !m.is_empty())
}

fn insert(rs: RSocket, fs_flags: c_int, fd_flags: c_int) -> c_int {
    let fd = rs.fd();
    let open = Arc::new(Open {
        rs: Arc::new(rs),
        fd_flags: AtomicI32::new(fd_flags),
        fs_flags: AtomicI32::new(fs_flags),
    });
    let mut t = SOCKETS.lock().unwrap_or_else(|e| e.into_inner());
    t.get_or_insert_with(HashMap::new).insert(fd, open);
    fd
}

/// The rsocket behind `fd`, or -1 with EBADF (as rdma-core: a kernel
/// descriptor is not an rsocket).
macro_rules! rs_or_ebadf {
    ($fd:expr) => {
        match lookup($fd) {
            Some(o) => o,
            None => return fail(libc::EBADF) as _,
        }
    };
}

fn fail_ssize(e: &std::io::Error) -> isize {
    set_errno(e.raw_os_error().unwrap_or(libc::EIO));
    -1
}

/// The C buffer as a slice (`EFAULT` for NULL with a length).
///
/// # Safety
/// `p` names `len` bytes valid for the slice's use.
unsafe fn slice_mut<'a>(p: *mut c_void, len: usize) -> Option<&'a mut [u8]> {
    if len == 0 {
        return Some(&mut []);
    }
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller's contract.
    Some(unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), len) })
}

/// As [`slice_mut`], read-only.
///
/// # Safety
/// As [`slice_mut`].
unsafe fn slice<'a>(p: *const c_void, len: usize) -> Option<&'a [u8]> {
    if len == 0 {
        return Some(&[]);
    }
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller's contract.
    Some(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) })
}

/// Writes `a` to a caller's `addr`/`addrlen` (truncated to its room; the
/// full length back, as `getsockname` does).
fn put_addr(a: Option<std::net::SocketAddr>, addr: *mut libc::sockaddr, len: *mut libc::socklen_t) {
    if addr.is_null() || len.is_null() {
        return;
    }
    let a = a.unwrap_or_else(|| std::net::SocketAddr::from(([0, 0, 0, 0], 0)));
    let mut s = sockaddr_storage::default();
    write_sockaddr(&mut s, a);
    let full = if a.is_ipv4() {
        std::mem::size_of::<libc::sockaddr_in>()
    } else {
        std::mem::size_of::<libc::sockaddr_in6>()
    };
    // SAFETY: the caller's `len` is readable and writable; `addr` has room
    // for `*len` bytes (both the caller's contract, as for getsockname).
    unsafe {
        let room = (*len as usize).min(full);
        std::ptr::copy_nonoverlapping(s.0.as_ptr(), addr.cast::<u8>(), room);
        *len = full as libc::socklen_t;
    }
}

unsafe extern "C" fn rsocket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    guard("rsocket", -1, || {
        let kind = ty & !(libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK);
        if domain != libc::AF_INET && domain != libc::AF_INET6 {
            return fail(if domain == libc::AF_IB {
                libc::EAFNOSUPPORT
            } else {
                libc::ENOTSUP
            });
        }
        match kind {
            libc::SOCK_STREAM if protocol == 0 || protocol == libc::IPPROTO_TCP => {}
            libc::SOCK_DGRAM => {
                // librspreload asks for one per UDP socket an application
                // makes (and falls back to the kernel's): said once.
                static ONCE: std::sync::Once = std::sync::Once::new();
                ONCE.call_once(|| {
                    tracing::info!("rsocket: datagram rsockets (SOCK_DGRAM) are not implemented")
                });
                return fail(libc::ENOTSUP);
            }
            _ => return fail(libc::ENOTSUP),
        }
        let rs = match RSocket::new(rdma_cm()) {
            Ok(rs) => rs,
            Err(e) => return fail_io(&e),
        };
        let nonblock = ty & libc::SOCK_NONBLOCK != 0;
        rs.set_nonblocking(nonblock);
        insert(
            rs,
            if nonblock { libc::O_NONBLOCK } else { 0 },
            if ty & libc::SOCK_CLOEXEC != 0 {
                libc::FD_CLOEXEC
            } else {
                0
            },
        )
    })
}
export!("rsocket", "RDMACM_1.0", rsocket);

unsafe extern "C" fn rbind(fd: c_int, addr: *const libc::sockaddr, _len: libc::socklen_t) -> c_int {
    guard("rbind", -1, || {
        let o = rs_or_ebadf!(fd);
        let Some(a) = read_sockaddr(addr) else {
            return fail(libc::EINVAL);
        };
        o.rs.bind(a).map_or_else(|e| fail_io(&e), |()| 0)
    })
}
export!("rbind", "RDMACM_1.0", rbind);

unsafe extern "C" fn rlisten(fd: c_int, _backlog: c_int) -> c_int {
    guard("rlisten", -1, || {
        let o = rs_or_ebadf!(fd);
        o.rs.listen().map_or_else(|e| fail_io(&e), |()| 0)
    })
}
export!("rlisten", "RDMACM_1.0", rlisten);

unsafe extern "C" fn raccept(
    fd: c_int,
    addr: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> c_int {
    guard("raccept", -1, || {
        let o = rs_or_ebadf!(fd);
        match o.rs.accept() {
            Ok(rs) => {
                put_addr(rs.peer_addr(), addr, len);
                insert(
                    rs,
                    o.fs_flags.load(Ordering::Relaxed),
                    o.fd_flags.load(Ordering::Relaxed),
                )
            }
            Err(e) => fail_io(&e),
        }
    })
}
export!("raccept", "RDMACM_1.0", raccept);

unsafe extern "C" fn rconnect(
    fd: c_int,
    addr: *const libc::sockaddr,
    _len: libc::socklen_t,
) -> c_int {
    guard("rconnect", -1, || {
        let o = rs_or_ebadf!(fd);
        let Some(a) = read_sockaddr(addr) else {
            return fail(libc::EINVAL);
        };
        o.rs.connect(a).map_or_else(|e| fail_io(&e), |()| 0)
    })
}
export!("rconnect", "RDMACM_1.0", rconnect);

unsafe extern "C" fn rshutdown(fd: c_int, how: c_int) -> c_int {
    guard("rshutdown", -1, || {
        let o = rs_or_ebadf!(fd);
        let how = match how {
            libc::SHUT_RD => Shutdown::Read,
            libc::SHUT_WR => Shutdown::Write,
            libc::SHUT_RDWR => Shutdown::Both,
            _ => return fail(libc::EINVAL),
        };
        o.rs.shutdown(how).map_or_else(|e| fail_io(&e), |()| 0)
    })
}
export!("rshutdown", "RDMACM_1.0", rshutdown);

unsafe extern "C" fn rclose(fd: c_int) -> c_int {
    guard("rclose", -1, || {
        let gone = {
            let mut t = SOCKETS.lock().unwrap_or_else(|e| e.into_inner());
            t.as_mut().and_then(|m| m.remove(&fd))
        };
        // Shut down and freed here, or by the last call still using it.
        match gone {
            Some(o) => {
                drop(o);
                0
            }
            None => fail(libc::EBADF),
        }
    })
}
export!("rclose", "RDMACM_1.0", rclose);

// ------------------------------------------------------------ data

fn recv_into(o: &Open, buf: &mut [u8], flags: c_int) -> isize {
    match o.rs.recv(buf, flags) {
        Ok(n) => n as isize,
        Err(e) => fail_ssize(&e),
    }
}

fn send_from(o: &Open, buf: &[u8], flags: c_int) -> isize {
    match o.rs.send(buf, flags) {
        Ok(n) => n as isize,
        Err(e) => fail_ssize(&e),
    }
}

unsafe extern "C" fn rrecv(fd: c_int, buf: *mut c_void, len: usize, flags: c_int) -> isize {
    guard("rrecv", -1, || {
        let o = rs_or_ebadf!(fd);
        // SAFETY: the caller's buffer of `len` bytes.
        let Some(b) = (unsafe { slice_mut(buf, len) }) else {
            return fail(libc::EFAULT) as isize;
        };
        recv_into(&o, b, flags)
    })
}
export!("rrecv", "RDMACM_1.0", rrecv);

unsafe extern "C" fn rread(fd: c_int, buf: *mut c_void, len: usize) -> isize {
    // SAFETY: forwarded contract.
    unsafe { rrecv(fd, buf, len, 0) }
}
export!("rread", "RDMACM_1.0", rread);

unsafe extern "C" fn rrecvfrom(
    fd: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
    src: *mut libc::sockaddr,
    srclen: *mut libc::socklen_t,
) -> isize {
    // SAFETY: forwarded contract.
    let n = unsafe { rrecv(fd, buf, len, flags) };
    if n > 0 {
        if let Some(o) = lookup(fd) {
            put_addr(o.rs.peer_addr(), src, srclen);
        }
    }
    n
}
export!("rrecvfrom", "RDMACM_1.0", rrecvfrom);

/// Runs `one` over each non-empty buffer of an iovec array in turn
/// (`first`: nothing was moved yet), stopping at the first that does not
/// go whole; the bytes moved, or the first failure's -1 when none were.
///
/// # Safety
/// `iov` names `cnt` iovecs of buffers valid for `one`'s use.
unsafe fn each_iov(
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    mut one: impl FnMut(&Open, *mut c_void, usize, bool) -> isize,
) -> isize {
    let o = rs_or_ebadf!(fd);
    if cnt < 0 || (cnt > 0 && iov.is_null()) {
        return fail(libc::EINVAL) as isize;
    }
    // SAFETY: the caller's contract.
    let iovs = unsafe { std::slice::from_raw_parts(iov, cnt as usize) };
    let mut total = 0isize;
    for v in iovs.iter().filter(|v| v.iov_len > 0) {
        if v.iov_base.is_null() {
            return if total > 0 {
                total
            } else {
                fail(libc::EFAULT) as isize
            };
        }
        let n = one(&o, v.iov_base, v.iov_len, total == 0);
        if n < 0 {
            return if total > 0 { total } else { n };
        }
        total += n;
        if (n as usize) < v.iov_len {
            break;
        }
    }
    total
}

/// Reads into each buffer in turn: the first as `flags` say, the rest only
/// with what is there already (a stream read returns what it has).
///
/// # Safety
/// `iov` names `cnt` iovecs of writable buffers.
unsafe fn recv_iov(fd: c_int, iov: *const libc::iovec, cnt: c_int, flags: c_int) -> isize {
    // SAFETY: forwarded contract; each buffer is writable for its length.
    unsafe {
        each_iov(fd, iov, cnt, |o, p, len, first| {
            let f = if first {
                flags
            } else {
                flags | libc::MSG_DONTWAIT
            };
            recv_into(o, std::slice::from_raw_parts_mut(p.cast::<u8>(), len), f)
        })
    }
}

unsafe extern "C" fn rreadv(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> isize {
    // SAFETY: forwarded contract.
    guard("rreadv", -1, || unsafe { recv_iov(fd, iov, cnt, 0) })
}
export!("rreadv", "RDMACM_1.0", rreadv);

unsafe extern "C" fn rrecvmsg(fd: c_int, msg: *mut libc::msghdr, flags: c_int) -> isize {
    guard("rrecvmsg", -1, || {
        if msg.is_null() {
            return fail(libc::EFAULT) as isize;
        }
        // SAFETY: the caller's msghdr.
        let m = unsafe { &mut *msg };
        if !m.msg_control.is_null() && m.msg_controllen > 0 {
            return fail(libc::ENOTSUP) as isize;
        }
        // SAFETY: forwarded contract.
        unsafe { recv_iov(fd, m.msg_iov, m.msg_iovlen as c_int, flags) }
    })
}
export!("rrecvmsg", "RDMACM_1.0", rrecvmsg);

unsafe extern "C" fn rsend(fd: c_int, buf: *const c_void, len: usize, flags: c_int) -> isize {
    guard("rsend", -1, || {
        let o = rs_or_ebadf!(fd);
        // SAFETY: the caller's buffer of `len` bytes.
        let Some(b) = (unsafe { slice(buf, len) }) else {
            return fail(libc::EFAULT) as isize;
        };
        send_from(&o, b, flags)
    })
}
export!("rsend", "RDMACM_1.0", rsend);

unsafe extern "C" fn rwrite(fd: c_int, buf: *const c_void, len: usize) -> isize {
    // SAFETY: forwarded contract.
    unsafe { rsend(fd, buf, len, 0) }
}
export!("rwrite", "RDMACM_1.0", rwrite);

unsafe extern "C" fn rsendto(
    fd: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
    dst: *const libc::sockaddr,
    dstlen: libc::socklen_t,
) -> isize {
    if !dst.is_null() || dstlen != 0 {
        // A stream is connected already.
        return fail(libc::EISCONN) as isize;
    }
    // SAFETY: forwarded contract.
    unsafe { rsend(fd, buf, len, flags) }
}
export!("rsendto", "RDMACM_1.0", rsendto);

/// Sends each buffer in turn; stops at the first that does not go whole
/// (a non-blocking socket out of room).
///
/// # Safety
/// `iov` names `cnt` iovecs of readable buffers.
unsafe fn send_iov(fd: c_int, iov: *const libc::iovec, cnt: c_int, flags: c_int) -> isize {
    // SAFETY: forwarded contract; each buffer is readable for its length.
    unsafe {
        each_iov(fd, iov, cnt, |o, p, len, _| {
            send_from(o, std::slice::from_raw_parts(p.cast::<u8>(), len), flags)
        })
    }
}

unsafe extern "C" fn rwritev(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> isize {
    // SAFETY: forwarded contract.
    guard("rwritev", -1, || unsafe { send_iov(fd, iov, cnt, 0) })
}
export!("rwritev", "RDMACM_1.0", rwritev);

unsafe extern "C" fn rsendmsg(fd: c_int, msg: *const libc::msghdr, flags: c_int) -> isize {
    guard("rsendmsg", -1, || {
        if msg.is_null() {
            return fail(libc::EFAULT) as isize;
        }
        // SAFETY: the caller's msghdr.
        let m = unsafe { &*msg };
        if !m.msg_control.is_null() && m.msg_controllen > 0 {
            return fail(libc::ENOTSUP) as isize;
        }
        // SAFETY: forwarded contract.
        unsafe { send_iov(fd, m.msg_iov, m.msg_iovlen as c_int, flags) }
    })
}
export!("rsendmsg", "RDMACM_1.0", rsendmsg);

// ------------------------------------------------------------ polling

/// One look at every entry, never blocking: rsockets by their state,
/// kernel descriptors by `plain` (their revents from a `poll` just made)
/// or a `poll` of their own. How many have events.
fn look(
    fds: &mut [libc::pollfd],
    socks: &[Option<Arc<Open>>],
    woken: bool,
    plain: Option<&[libc::pollfd]>,
) -> c_int {
    let mut n = 0;
    let mut k = 0;
    for (p, s) in fds.iter_mut().zip(socks) {
        p.revents = match s {
            Some(o) => o.rs.poll_ready(p.events, woken),
            None => match plain {
                Some(kp) => {
                    let r = kp.get(k).map_or(0, |q| q.revents);
                    k += 1;
                    r
                }
                None => {
                    let mut q = *p;
                    // SAFETY: one pollfd on the stack.
                    unsafe { libc::poll(&mut q, 1, 0) };
                    q.revents
                }
            },
        };
        if p.revents != 0 {
            n += 1;
        }
    }
    n
}

unsafe extern "C" fn rpoll(fds: *mut libc::pollfd, nfds: libc::nfds_t, timeout: c_int) -> c_int {
    if nfds == 0 || fds.is_null() || !any_open() {
        // SAFETY: forwarded unchanged; the caller's contract is poll(2)'s.
        return unsafe { libc::poll(fds, nfds, timeout) };
    }
    guard("rpoll", -1, || {
        // SAFETY: the caller's `nfds` pollfds.
        let fds = unsafe { std::slice::from_raw_parts_mut(fds, nfds as usize) };
        let socks: Vec<Option<Arc<Open>>> = fds.iter().map(|p| lookup(p.fd)).collect();
        if socks.iter().all(Option::is_none) {
            // SAFETY: as above.
            return unsafe { libc::poll(fds.as_mut_ptr(), nfds, timeout) };
        }
        let start = Instant::now();
        let deadline = (timeout >= 0).then(|| start + Duration::from_millis(timeout as u64));
        // A short spin first, as rdma-core's (completions come quickly).
        loop {
            let n = look(fds, &socks, false, None);
            if n > 0 || timeout == 0 {
                return n;
            }
            if start.elapsed() >= Duration::from_micros(10) {
                break;
            }
        }
        loop {
            // Arm every rsocket and look once more; then sleep on their
            // descriptors and the kernel ones.
            let mut kfds: Vec<libc::pollfd> = Vec::with_capacity(fds.len() + 2);
            let mut plain_at: Vec<usize> = Vec::new();
            for (p, s) in fds.iter().zip(&socks) {
                match s {
                    Some(o) => {
                        let (r, wfds, k) = o.rs.arm(p.events);
                        if r != 0 {
                            return look(fds, &socks, false, None);
                        }
                        kfds.extend(wfds[..k].iter().map(|&fd| libc::pollfd {
                            fd,
                            events: libc::POLLIN,
                            revents: 0,
                        }));
                    }
                    None => {
                        plain_at.push(kfds.len());
                        kfds.push(libc::pollfd { revents: 0, ..*p });
                    }
                }
            }
            let ms = deadline.map_or(-1, |d| {
                let left = d.saturating_duration_since(Instant::now());
                left.as_millis().min(i32::MAX as u128) as c_int
            });
            // SAFETY: `kfds` is a live vector of pollfds.
            let r = unsafe { libc::poll(kfds.as_mut_ptr(), kfds.len() as libc::nfds_t, ms) };
            if r < 0 {
                // errno is poll's (EINTR on a signal).
                return -1;
            }
            let plain: Vec<libc::pollfd> = plain_at.iter().map(|&i| kfds[i]).collect();
            let n = look(fds, &socks, true, Some(&plain));
            if n > 0 || deadline.is_some_and(|d| Instant::now() >= d) {
                return n;
            }
        }
    })
}
export!("rpoll", "RDMACM_1.0", rpoll);

unsafe extern "C" fn rselect(
    nfds: c_int,
    rd: *mut libc::fd_set,
    wr: *mut libc::fd_set,
    ex: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> c_int {
    guard("rselect", -1, || {
        if !(0..=libc::FD_SETSIZE as c_int).contains(&nfds) {
            return fail(libc::EINVAL);
        }
        let isset = |set: *mut libc::fd_set, fd: c_int| {
            // SAFETY: a caller's fd_set (or NULL, never read).
            !set.is_null() && unsafe { libc::FD_ISSET(fd, set) }
        };
        let mut fds = Vec::new();
        for fd in 0..nfds {
            let mut events = 0;
            if isset(rd, fd) {
                events |= libc::POLLIN;
            }
            if isset(wr, fd) {
                events |= libc::POLLOUT;
            }
            if isset(ex, fd) {
                events |= libc::POLLPRI;
            }
            if events != 0 {
                fds.push(libc::pollfd {
                    fd,
                    events,
                    revents: 0,
                });
            }
        }
        let ms = if timeout.is_null() {
            -1
        } else {
            // SAFETY: the caller's timeval.
            let t = unsafe { &*timeout };
            if t.tv_sec < 0 || t.tv_usec < 0 {
                return fail(libc::EINVAL);
            }
            (t.tv_sec.saturating_mul(1000) + (t.tv_usec + 999) / 1000).min(i64::from(i32::MAX))
                as c_int
        };
        // SAFETY: our own vector of pollfds.
        let r = unsafe { rpoll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if r < 0 {
            return -1;
        }
        for set in [rd, wr, ex] {
            if !set.is_null() {
                // SAFETY: a caller's fd_set.
                unsafe { libc::FD_ZERO(set) };
            }
        }
        let mut count = 0;
        for p in &fds {
            let mut mark = |set: *mut libc::fd_set, hit: bool| {
                if hit && !set.is_null() {
                    // SAFETY: a caller's fd_set; `p.fd` < nfds <= FD_SETSIZE.
                    unsafe { libc::FD_SET(p.fd, set) };
                    count += 1;
                }
            };
            let err = p.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0;
            mark(
                rd,
                p.events & libc::POLLIN != 0 && (p.revents & libc::POLLIN != 0 || err),
            );
            mark(
                wr,
                p.events & libc::POLLOUT != 0 && (p.revents & libc::POLLOUT != 0 || err),
            );
            mark(
                ex,
                p.events & libc::POLLPRI != 0 && p.revents & libc::POLLPRI != 0,
            );
        }
        count
    })
}
export!("rselect", "RDMACM_1.0", rselect);

// ------------------------------------------------------------ names, options

unsafe extern "C" fn rgetpeername(
    fd: c_int,
    addr: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> c_int {
    guard("rgetpeername", -1, || {
        let o = rs_or_ebadf!(fd);
        let Some(a) = o.rs.peer_addr() else {
            return fail(libc::ENOTCONN);
        };
        if addr.is_null() || len.is_null() {
            return fail(libc::EFAULT);
        }
        put_addr(Some(a), addr, len);
        0
    })
}
export!("rgetpeername", "RDMACM_1.0", rgetpeername);

unsafe extern "C" fn rgetsockname(
    fd: c_int,
    addr: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> c_int {
    guard("rgetsockname", -1, || {
        let o = rs_or_ebadf!(fd);
        if addr.is_null() || len.is_null() {
            return fail(libc::EFAULT);
        }
        put_addr(o.rs.local_addr(), addr, len);
        0
    })
}
export!("rgetsockname", "RDMACM_1.0", rgetsockname);

const RDMA_ROUTE: c_int = 4;

unsafe extern "C" fn rsetsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: libc::socklen_t,
) -> c_int {
    guard("rsetsockopt", -1, || {
        let o = rs_or_ebadf!(fd);
        if level == burst_verbs::rsocket::SOL_RDMA && name == RDMA_ROUTE {
            // An InfiniBand path record: RoCE routes by IP, nothing to keep.
            return 0;
        }
        if val.is_null() || (len as usize) < std::mem::size_of::<c_int>() {
            return fail(if val.is_null() {
                libc::EFAULT
            } else {
                libc::EINVAL
            });
        }
        // SAFETY: at least an int is readable at `val` (checked above);
        // `struct linger` starts with its int l_onoff.
        let v = unsafe { val.cast::<c_int>().read_unaligned() };
        o.rs.set_option(level, name, v)
            .map_or_else(|e| fail_io(&e), |()| 0)
    })
}
export!("rsetsockopt", "RDMACM_1.0", rsetsockopt);

unsafe extern "C" fn rgetsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut libc::socklen_t,
) -> c_int {
    guard("rgetsockopt", -1, || {
        let o = rs_or_ebadf!(fd);
        if val.is_null() || len.is_null() {
            return fail(libc::EFAULT);
        }
        // SAFETY: the caller's length.
        let room = unsafe { *len } as usize;
        if level == libc::IPPROTO_TCP && name == libc::TCP_INFO {
            let info = libc::tcp_info {
                tcpi_state: if o.rs.is_connected() { 1 } else { 7 },
                tcpi_snd_cwnd: o.rs.option(burst_verbs::rsocket::SOL_RDMA, 0).unwrap_or(0) as u32,
                // SAFETY: tcp_info is plain integers; all-zero is valid.
                ..unsafe { std::mem::zeroed() }
            };
            let n = room.min(std::mem::size_of::<libc::tcp_info>());
            // SAFETY: `n` bytes fit the caller's buffer and our struct.
            unsafe {
                std::ptr::copy_nonoverlapping((&raw const info).cast::<u8>(), val.cast::<u8>(), n);
                *len = n as libc::socklen_t;
            }
            return 0;
        }
        let v = match o.rs.option(level, name) {
            Ok(v) => v,
            Err(e) => return fail_io(&e),
        };
        if level == libc::SOL_SOCKET && name == libc::SO_LINGER {
            let l = libc::linger {
                l_onoff: v,
                l_linger: 0,
            };
            if room < std::mem::size_of::<libc::linger>() {
                return fail(libc::EINVAL);
            }
            // SAFETY: room for a linger (checked above).
            unsafe {
                val.cast::<libc::linger>().write_unaligned(l);
                *len = std::mem::size_of::<libc::linger>() as libc::socklen_t;
            }
            return 0;
        }
        if room < std::mem::size_of::<c_int>() {
            return fail(libc::EINVAL);
        }
        // SAFETY: room for an int (checked above).
        unsafe {
            val.cast::<c_int>().write_unaligned(v);
            *len = std::mem::size_of::<c_int>() as libc::socklen_t;
        }
        0
    })
}
export!("rgetsockopt", "RDMACM_1.0", rgetsockopt);

/// `rfcntl(fd, cmd, ...)`: the one variadic argument, an int when there is
/// one, arrives where a third integer argument would on the C ABIs burst
/// builds for (x86-64 and AArch64 Linux).
unsafe extern "C" fn rfcntl(fd: c_int, cmd: c_int, arg: c_long) -> c_int {
    guard("rfcntl", -1, || {
        let o = rs_or_ebadf!(fd);
        match cmd {
            libc::F_GETFL => o.fs_flags.load(Ordering::Relaxed),
            libc::F_SETFL => {
                let v = arg as c_int;
                o.rs.set_nonblocking(v & libc::O_NONBLOCK != 0);
                o.fs_flags.store(v, Ordering::Relaxed);
                0
            }
            libc::F_GETFD => o.fd_flags.load(Ordering::Relaxed),
            libc::F_SETFD => {
                o.fd_flags.store(arg as c_int, Ordering::Relaxed);
                0
            }
            _ => fail(libc::ENOTSUP),
        }
    })
}
export!("rfcntl", "RDMACM_1.0", rfcntl);

// ------------------------------------------------------------ direct placement

unsafe extern "C" fn riomap(
    fd: c_int,
    buf: *mut c_void,
    len: usize,
    prot: c_int,
    _flags: c_int,
    offset: libc::off_t,
) -> libc::off_t {
    guard("riomap", -1, || {
        let o = rs_or_ebadf!(fd);
        if prot & !(libc::PROT_WRITE | libc::PROT_NONE) != 0 || buf.is_null() || len == 0 {
            return fail(libc::EINVAL) as libc::off_t;
        }
        let at = (offset != -1).then_some(offset as u64);
        // SAFETY: the caller's buffer, which rsocket(7) has it keep until
        // riounmap or the close.
        match unsafe {
            o.rs.iomap(buf.cast(), len, prot & libc::PROT_WRITE != 0, at)
        } {
            Ok(off) => off as libc::off_t,
            Err(e) => fail_io(&e) as libc::off_t,
        }
    })
}
export!("riomap", "RDMACM_1.0", riomap);

unsafe extern "C" fn riounmap(fd: c_int, buf: *mut c_void, len: usize) -> c_int {
    guard("riounmap", -1, || {
        let o = rs_or_ebadf!(fd);
        o.rs.iounmap(buf.cast(), len)
            .map_or_else(|e| fail_io(&e), |()| 0)
    })
}
export!("riounmap", "RDMACM_1.0", riounmap);

/// `riowrite` returns `size_t`: -1 (all bits) with errno on failure, as
/// rdma-core's.
unsafe extern "C" fn riowrite(
    fd: c_int,
    buf: *const c_void,
    len: usize,
    offset: libc::off_t,
    flags: c_int,
) -> usize {
    guard("riowrite", usize::MAX, || {
        let Some(o) = lookup(fd) else {
            set_errno(libc::EBADF);
            return usize::MAX;
        };
        // SAFETY: the caller's buffer of `len` bytes.
        let Some(b) = (unsafe { slice(buf, len) }) else {
            set_errno(libc::EFAULT);
            return usize::MAX;
        };
        match o.rs.iowrite(b, offset as u64, flags) {
            Ok(n) => n,
            Err(e) => {
                set_errno(e.raw_os_error().unwrap_or(libc::EIO));
                usize::MAX
            }
        }
    })
}
export!("riowrite", "RDMACM_1.0", riowrite);
