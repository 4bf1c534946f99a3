//! IP addresses: sockaddrs in and out, and `rdma_getaddrinfo` (which
//! device an address belongs to is burst-verbs' `rdma_cm`'s to say).

use std::ffi::{c_char, c_int};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::ptr;

use burst_verbs::rdma_cm::PortSpace;

use super::abi::*;
use crate::guard;

/// The address at `sa` (AF_INET or AF_INET6), if any.
pub(super) fn read_sockaddr(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: a readable sockaddr of the family it says (caller's
    // contract); the family is read first and decides the size read.
    unsafe {
        match c_int::from((*sa).sa_family) {
            libc::AF_INET => {
                let s = &*sa.cast::<libc::sockaddr_in>();
                Some(SocketAddr::V4(SocketAddrV4::new(
                    Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr)),
                    u16::from_be(s.sin_port),
                )))
            }
            libc::AF_INET6 => {
                let s = &*sa.cast::<libc::sockaddr_in6>();
                Some(SocketAddr::V6(SocketAddrV6::new(
                    Ipv6Addr::from(s.sin6_addr.s6_addr),
                    u16::from_be(s.sin6_port),
                    s.sin6_flowinfo,
                    s.sin6_scope_id,
                )))
            }
            _ => None,
        }
    }
}

/// Writes `a` as a sockaddr into `dst` (128 bytes, room for either).
pub(super) fn write_sockaddr(dst: &mut sockaddr_storage, a: SocketAddr) {
    dst.0.fill(0);
    let p = dst.0.as_mut_ptr();
    // SAFETY: `dst` is 128 bytes and 8-aligned, larger than and aligned
    // for either struct; all-zero is valid for both.
    unsafe {
        match a {
            SocketAddr::V4(v4) => {
                let s = &mut *p.cast::<libc::sockaddr_in>();
                s.sin_family = libc::AF_INET as libc::sa_family_t;
                s.sin_port = v4.port().to_be();
                s.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            }
            SocketAddr::V6(v6) => {
                let s = &mut *p.cast::<libc::sockaddr_in6>();
                s.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                s.sin6_port = v6.port().to_be();
                s.sin6_addr.s6_addr = v6.ip().octets();
                s.sin6_scope_id = v6.scope_id();
            }
        }
    }
}

// ------------------------------------------------------- rdma_getaddrinfo

fn copy_sockaddr(a: *const libc::sockaddr, len: u32) -> *mut libc::sockaddr {
    if a.is_null() || len == 0 {
        return ptr::null_mut();
    }
    // SAFETY: malloc of `len` bytes, filled from `len` readable bytes at
    // `a` (getaddrinfo's result or the caller's hints).
    unsafe {
        let p = libc::malloc(len as usize).cast::<libc::sockaddr>();
        if !p.is_null() {
            ptr::copy_nonoverlapping(a.cast::<u8>(), p.cast::<u8>(), len as usize);
        }
        p
    }
}

/// `len` bytes of a sockaddr the caller gave in hints, within what any
/// sockaddr takes (a larger length is the caller's error, not a size to
/// allocate).
fn hint_len(len: u32) -> u32 {
    len.min(std::mem::size_of::<sockaddr_storage>() as u32)
}

/// `rdma_getaddrinfo`, with librdmacm's rules (checked against it on
/// kernel RXE): with a node or service, `getaddrinfo` on the hints
/// converted (socket type from the QP type, protocol from the port
/// space) and its first result as the destination, or the source when
/// passive; with neither, the hints themselves (a caller that already
/// holds a destination, as libfabric's verbs provider does). The hints'
/// source is kept when the answer has none. Flags of the answer are
/// `RAI_PASSIVE` or none, as librdmacm's. Errors: `getaddrinfo`'s code,
/// or -1 with errno (EINVAL with nothing to resolve, EOPNOTSUPP for
/// `RAI_SA`, which needs an IB subnet administrator).
unsafe extern "C" fn getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    guard("rdma_getaddrinfo", libc::EAI_FAIL, || {
        crate::init_logging();
        if res.is_null() || (node.is_null() && service.is_null() && hints.is_null()) {
            crate::set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: NULL or readable hints (caller's contract).
        let h = unsafe { hints.as_ref() };
        let flags = h.map_or(0, |h| h.ai_flags);
        if flags & RAI_SA != 0 {
            crate::set_errno(libc::EOPNOTSUPP);
            return -1;
        }
        // SAFETY: allocation of one zeroed rdma_addrinfo, freed by
        // rdma_freeaddrinfo (every pointer in it malloc'd or NULL).
        let r = unsafe { libc::calloc(1, std::mem::size_of::<rdma_addrinfo>()) }
            .cast::<rdma_addrinfo>();
        if r.is_null() {
            crate::set_errno(libc::ENOMEM);
            return -1;
        }
        // SAFETY: `r` was just allocated and is ours until returned.
        let ri = unsafe { &mut *r };
        if !node.is_null() || !service.is_null() {
            let passive = flags & RAI_PASSIVE != 0;
            let ps = h.map_or(0, |h| h.ai_port_space);
            let qp_type = h.map_or(0, |h| h.ai_qp_type);
            // SAFETY: addrinfo is plain data; all-zero is valid.
            let mut gh: libc::addrinfo = unsafe { std::mem::zeroed() };
            let family = h.map_or(0, |h| h.ai_family);
            // AF_IB has no getaddrinfo: ask for any family (as librdmacm).
            gh.ai_family = if family == AF_IB { 0 } else { family };
            if passive {
                gh.ai_flags |= libc::AI_PASSIVE;
            }
            if flags & RAI_NUMERICHOST != 0 {
                gh.ai_flags |= libc::AI_NUMERICHOST;
            }
            let datagram = qp_type as u32 == IBV_QPT_UD
                || ps as u32 == PortSpace::Udp.value()
                || ps as u32 == PortSpace::Ipoib.value();
            if qp_type != 0 || ps != 0 {
                gh.ai_socktype = if datagram {
                    libc::SOCK_DGRAM
                } else {
                    libc::SOCK_STREAM
                };
                gh.ai_protocol = if datagram {
                    libc::IPPROTO_UDP
                } else {
                    libc::IPPROTO_TCP
                };
            }
            let mut out: *mut libc::addrinfo = ptr::null_mut();
            // SAFETY: the caller's C strings (or NULL) and our hints.
            let rc = unsafe { libc::getaddrinfo(node, service, &gh, &mut out) };
            if rc != 0 {
                // SAFETY: ours, nothing in it yet.
                unsafe { libc::free(r.cast()) };
                return rc;
            }
            // SAFETY: getaddrinfo succeeded: `out` is its first result.
            let first = unsafe { &*out };
            let dgram = first.ai_socktype == libc::SOCK_DGRAM;
            ri.ai_qp_type = if qp_type != 0 {
                qp_type
            } else if dgram {
                IBV_QPT_UD as c_int
            } else {
                IBV_QPT_RC as c_int
            };
            ri.ai_port_space = if ps != 0 {
                ps
            } else if first.ai_protocol == libc::IPPROTO_UDP || dgram {
                PortSpace::Udp.value() as c_int
            } else {
                PortSpace::Tcp.value() as c_int
            };
            ri.ai_family = first.ai_family;
            let addr = copy_sockaddr(first.ai_addr, first.ai_addrlen);
            let canon = if first.ai_canonname.is_null() {
                ptr::null_mut()
            } else {
                // SAFETY: getaddrinfo's NUL-terminated canonical name.
                unsafe { libc::strdup(first.ai_canonname) }
            };
            if passive {
                ri.ai_flags = RAI_PASSIVE;
                ri.ai_src_addr = addr;
                ri.ai_src_len = first.ai_addrlen;
                ri.ai_src_canonname = canon;
            } else {
                ri.ai_dst_addr = addr;
                ri.ai_dst_len = first.ai_addrlen;
                ri.ai_dst_canonname = canon;
            }
            // SAFETY: `out` from getaddrinfo, no longer referenced.
            unsafe { libc::freeaddrinfo(out) };
        } else if let Some(h) = h {
            ri.ai_flags = h.ai_flags;
            ri.ai_family = h.ai_family;
            ri.ai_qp_type = h.ai_qp_type;
            ri.ai_port_space = h.ai_port_space;
            if h.ai_dst_len > 0 {
                let len = hint_len(h.ai_dst_len);
                ri.ai_dst_addr = copy_sockaddr(h.ai_dst_addr, len);
                ri.ai_dst_len = if ri.ai_dst_addr.is_null() { 0 } else { len };
            }
        }
        if let Some(h) = h {
            if ri.ai_src_len == 0 && h.ai_src_len > 0 {
                let len = hint_len(h.ai_src_len);
                ri.ai_src_addr = copy_sockaddr(h.ai_src_addr, len);
                ri.ai_src_len = if ri.ai_src_addr.is_null() { 0 } else { len };
            }
        }
        // SAFETY: the caller's result pointer (checked non-NULL).
        unsafe { *res = r };
        0
    })
}
export!("rdma_getaddrinfo", "RDMACM_1.0", getaddrinfo);

unsafe extern "C" fn freeaddrinfo(res: *mut rdma_addrinfo) {
    let mut p = res;
    while !p.is_null() {
        // SAFETY: a chain made by getaddrinfo above: every pointer is
        // malloc'd or NULL.
        unsafe {
            let next = (*p).ai_next;
            libc::free((*p).ai_src_addr.cast());
            libc::free((*p).ai_dst_addr.cast());
            libc::free((*p).ai_src_canonname.cast());
            libc::free((*p).ai_dst_canonname.cast());
            libc::free((*p).ai_route);
            libc::free((*p).ai_connect);
            libc::free(p.cast());
            p = next;
        }
    }
}
export!("rdma_freeaddrinfo", "RDMACM_1.0", freeaddrinfo);
