//! The kernel's neighbour table over rtnetlink: a peer's MAC for ports that
//! build whole frames while the kernel owns the interface (AF_XDP).
//!
//! Two messages are all burst needs (a dump of `RTM_GETNEIGH`, and
//! `RTM_NEWNEIGH` with `NTF_USE`, which makes the kernel resolve an
//! address as if it had a packet for it: `ip neigh add ADDR dev IF use`),
//! so they are built here on a plain netlink socket rather than through an
//! rtnetlink crate and its async runtime.

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const NLMSG_HDR: usize = 16;
const NDMSG: usize = 12;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const RTM_NEWNEIGH: u16 = 28;
const RTM_GETNEIGH: u16 = 30;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const NLM_F_CREATE: u16 = 0x400;
const NDA_DST: u16 = 1;
const NDA_LLADDR: u16 = 2;
const NTF_USE: u8 = 0x01;
/// States whose link-layer address may be used (not INCOMPLETE, FAILED or NONE).
const NUD_USABLE: u16 = 0x02 | 0x04 | 0x08 | 0x10 | 0x40 | 0x80;

/// A route netlink socket.
pub(crate) struct Netlink {
    fd: OwnedFd,
    seq: u32,
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

fn family(ip: IpAddr) -> u8 {
    match ip {
        IpAddr::V4(_) => libc::AF_INET as u8,
        IpAddr::V6(_) => libc::AF_INET6 as u8,
    }
}

fn ip_bytes(ip: &IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

impl Netlink {
    pub(crate) fn open() -> io::Result<Netlink> {
        // SAFETY: plain socket(2) call; the result is checked.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a descriptor we just opened and own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // Replies are read with a timeout so a lost one cannot hang a port.
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 200_000,
        };
        // SAFETY: a valid timeval and its size, on our socket.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        Ok(Netlink { fd, seq: 1 })
    }

    fn request(&mut self, ty: u16, flags: u16, nd: [u8; NDMSG], attrs: &[(u16, &[u8])]) -> Vec<u8> {
        self.seq = self.seq.wrapping_add(1);
        let mut m = vec![0u8; NLMSG_HDR];
        m.extend_from_slice(&nd);
        for (t, v) in attrs {
            let len = 4 + v.len();
            m.extend_from_slice(&(len as u16).to_ne_bytes());
            m.extend_from_slice(&t.to_ne_bytes());
            m.extend_from_slice(v);
            m.resize(align4(m.len()), 0);
        }
        let total = m.len() as u32;
        m[0..4].copy_from_slice(&total.to_ne_bytes());
        m[4..6].copy_from_slice(&ty.to_ne_bytes());
        m[6..8].copy_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
        m[8..12].copy_from_slice(&self.seq.to_ne_bytes());
        m
    }

    fn send(&self, m: &[u8]) -> io::Result<()> {
        // SAFETY: `m` is a live buffer of its length; the kernel is the
        // destination (a zeroed sockaddr_nl with nl_family set).
        let rc = unsafe {
            let mut sa: libc::sockaddr_nl = std::mem::zeroed();
            sa.nl_family = libc::AF_NETLINK as libc::sa_family_t;
            libc::sendto(
                self.fd.as_raw_fd(),
                m.as_ptr().cast(),
                m.len(),
                0,
                (&sa as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: `buf` is live and writable for its length.
        let rc = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(rc as usize)
    }

    /// The usable MAC the kernel holds for `ip` on interface `ifindex`.
    pub(crate) fn lookup(&mut self, ifindex: u32, ip: IpAddr) -> io::Result<Option<[u8; 6]>> {
        let mut nd = [0u8; NDMSG];
        nd[0] = family(ip);
        let m = self.request(RTM_GETNEIGH, NLM_F_DUMP, nd, &[]);
        let seq = self.seq;
        self.send(&m)?;
        let want = ip_bytes(&ip);
        let mut found = None;
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            let n = self.recv(&mut buf)?;
            let mut at = 0;
            while at + NLMSG_HDR <= n {
                let len = u32::from_ne_bytes(buf[at..at + 4].try_into().expect("4")) as usize;
                let ty = u16::from_ne_bytes(buf[at + 4..at + 6].try_into().expect("2"));
                let mseq = u32::from_ne_bytes(buf[at + 8..at + 12].try_into().expect("4"));
                if len < NLMSG_HDR || at + len > n {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "bad netlink message",
                    ));
                }
                if mseq == seq {
                    match ty {
                        NLMSG_DONE => return Ok(found),
                        NLMSG_ERROR => return Err(io::Error::other("netlink dump error")),
                        RTM_NEWNEIGH => {
                            if let Some(mac) =
                                parse_neigh(&buf[at + NLMSG_HDR..at + len], ifindex, &want)
                            {
                                found = Some(mac);
                            }
                        }
                        _ => {}
                    }
                }
                at += align4(len);
            }
        }
    }

    /// Asks the kernel to resolve `ip` on `ifindex` (`NTF_USE`).
    pub(crate) fn solicit(&mut self, ifindex: u32, ip: IpAddr) -> io::Result<()> {
        let mut nd = [0u8; NDMSG];
        nd[0] = family(ip);
        nd[4..8].copy_from_slice(&(ifindex as i32).to_ne_bytes());
        nd[10] = NTF_USE;
        let dst = ip_bytes(&ip);
        let m = self.request(
            RTM_NEWNEIGH,
            NLM_F_CREATE | NLM_F_ACK,
            nd,
            &[(NDA_DST, &dst)],
        );
        let seq = self.seq;
        self.send(&m)?;
        let mut buf = vec![0u8; 4096];
        loop {
            let n = self.recv(&mut buf)?;
            if n >= NLMSG_HDR + 4 {
                let ty = u16::from_ne_bytes(buf[4..6].try_into().expect("2"));
                let mseq = u32::from_ne_bytes(buf[8..12].try_into().expect("4"));
                if ty == NLMSG_ERROR && mseq == seq {
                    let err = i32::from_ne_bytes(buf[16..20].try_into().expect("4"));
                    return if err == 0 {
                        Ok(())
                    } else {
                        Err(io::Error::from_raw_os_error(-err))
                    };
                }
            }
        }
    }
}

/// The MAC of an `RTM_NEWNEIGH` body (ndmsg and attributes) if it is for
/// `want` on `ifindex` and usable.
fn parse_neigh(body: &[u8], ifindex: u32, want: &[u8]) -> Option<[u8; 6]> {
    if body.len() < NDMSG {
        return None;
    }
    let idx = i32::from_ne_bytes(body[4..8].try_into().ok()?);
    let state = u16::from_ne_bytes(body[8..10].try_into().ok()?);
    if idx as u32 != ifindex || state & NUD_USABLE == 0 {
        return None;
    }
    let (mut dst, mut mac) = (None, None);
    let mut at = NDMSG;
    while at + 4 <= body.len() {
        let len = usize::from(u16::from_ne_bytes(body[at..at + 2].try_into().ok()?));
        let ty = u16::from_ne_bytes(body[at + 2..at + 4].try_into().ok()?);
        if len < 4 || at + len > body.len() {
            break;
        }
        let v = &body[at + 4..at + len];
        match ty {
            NDA_DST => dst = Some(v),
            NDA_LLADDR if v.len() == 6 => mac = v.try_into().ok(),
            _ => {}
        }
        at += align4(len);
    }
    (dst == Some(want)).then_some(mac).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_neighbour_message_gives_its_mac_only_for_the_asked_address_and_interface() {
        let mut body = vec![0u8; NDMSG];
        body[0] = libc::AF_INET as u8;
        body[4..8].copy_from_slice(&3i32.to_ne_bytes());
        body[8..10].copy_from_slice(&0x02u16.to_ne_bytes()); // REACHABLE
        for (t, v) in [
            (NDA_DST, &[198u8, 18, 0, 2][..]),
            (NDA_LLADDR, &[2, 0, 0, 0, 0, 9][..]),
        ] {
            body.extend_from_slice(&((4 + v.len()) as u16).to_ne_bytes());
            body.extend_from_slice(&t.to_ne_bytes());
            body.extend_from_slice(v);
            body.resize(align4(body.len()), 0);
        }
        let ip = [198, 18, 0, 2];
        assert_eq!(parse_neigh(&body, 3, &ip), Some([2, 0, 0, 0, 0, 9]));
        assert_eq!(parse_neigh(&body, 4, &ip), None);
        assert_eq!(parse_neigh(&body, 3, &[198, 18, 0, 3]), None);
        body[8..10].copy_from_slice(&0x20u16.to_ne_bytes()); // FAILED
        assert_eq!(parse_neigh(&body, 3, &ip), None);
        // Truncated attributes are ignored, not read past.
        assert_eq!(parse_neigh(&body[..NDMSG + 6], 3, &ip), None);
    }

    #[test]
    fn the_loopback_table_can_be_read() {
        // Interface 1 is `lo`; its table is empty or holds nothing for this
        // address, but the dump must complete.
        let mut nl = Netlink::open().unwrap();
        assert_eq!(nl.lookup(1, "198.18.0.250".parse().unwrap()).unwrap(), None);
    }
}
