//! The GID table follows the interface, as RXE's: in a network namespace
//! of the test's own (a veth pair, needs CAP_SYS_ADMIN and `ip`;
//! skipped without), a device lists its interface's addresses in RXE's
//! layout, gains and loses GIDs as addresses come and go, and every GID
//! it lists carries traffic from and to it.

use std::net::IpAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use burst_mem::Access;
use burst_transport::*;
use burst_verbs::config::DeviceConfig;
use burst_verbs::engine::{Context, CqId, Engine};
use burst_verbs::{gid_of, gids, netif, AsyncEvent};
use burst_wire::{Psn, Qpn};

fn ip(args: &str) -> bool {
    Command::new("ip")
        .args(args.split_whitespace())
        .status()
        .is_ok_and(|s| s.success())
}

fn addr(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A UD QP of `c` in RTS, with Q_Key 0x33.
fn ud_qp(c: &Context, pd: burst_mem::Pd, cq: CqId) -> Qpn {
    let q = c.create_qp(QpType::Ud, pd, cq, cq, 16).unwrap();
    for a in burst_verbs::ud_transitions(0x33, Psn::new(0)) {
        c.modify_qp(q, &a).unwrap().unwrap();
    }
    q
}

/// The table, after it had time to notice an address change.
fn table_after_change(c: &Context) -> Vec<Option<[u8; 16]>> {
    std::thread::sleep(Duration::from_millis(150));
    c.gid_table().unwrap()
}

struct Side {
    c: Context,
    qp: Qpn,
    cq: CqId,
    mr: burst_mem::MrKeys,
    buf: Vec<u8>,
}

impl Side {
    fn new(e: &Engine) -> Side {
        let c = e.context();
        let pd = c.alloc_pd();
        let cq = c.create_cq(16);
        let qp = ud_qp(&c, pd, cq);
        let mut buf = vec![0u8; 4096];
        // SAFETY: `buf` lives in the Side, dropped before the engine.
        let mr = unsafe { c.reg_mr(pd, buf.as_mut_ptr(), buf.len(), Access(1)) }.unwrap();
        Side { c, qp, cq, mr, buf }
    }

    /// Sends 100 bytes from GID `sgid_index` to `to`'s QP at GID `dgid`;
    /// returns the GRH source and destination `to` received it with.
    fn send(&mut self, sgid_index: u8, to: &mut Side, dgid: [u8; 16]) -> (IpAddr, IpAddr) {
        to.buf.fill(0);
        to.c.post_recv(
            to.qp,
            &RecvWr {
                wr_id: 1,
                sg_list: [Sge {
                    addr: to.mr.addr,
                    length: 2048,
                    lkey: to.mr.lkey,
                }]
                .into(),
            },
        )
        .unwrap();
        let ah = self.c.create_ah_from(dgid, Some(sgid_index)).unwrap();
        let mut wr = SendWr::new(
            2,
            SendOp::Send,
            [Sge {
                addr: self.mr.addr + 2048,
                length: 100,
                lkey: self.mr.lkey,
            }],
        );
        wr.ud = Some(UdDest {
            remote_qpn: to.qp,
            remote_qkey: 0x33,
            ah,
        });
        self.c.post_send(self.qp, &wr).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut r = None;
        while r.is_none() && Instant::now() < deadline {
            r = to.c.poll_cq(to.cq);
        }
        let r = r.expect("the datagram arrived");
        assert_eq!((r.status, r.byte_len), (WcStatus::Success, 140));
        while self.c.poll_cq(self.cq).is_none() {}
        let g = &to.buf[..40];
        match r.grh {
            Some(NetworkHeader::Ipv4) => (
                IpAddr::from([g[32], g[33], g[34], g[35]]),
                IpAddr::from([g[36], g[37], g[38], g[39]]),
            ),
            _ => (
                IpAddr::from(<[u8; 16]>::try_from(&g[8..24]).unwrap()),
                IpAddr::from(<[u8; 16]>::try_from(&g[24..40]).unwrap()),
            ),
        }
    }
}

#[test]
fn the_gid_table_follows_the_interface_and_every_gid_carries_traffic() {
    // Namespaces are per thread: this one's, and its children's.
    std::thread::spawn(in_own_network_namespace)
        .join()
        .expect("test thread");
}

fn in_own_network_namespace() {
    // SAFETY: unshare(2) of this thread's network namespace only.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        eprintln!(
            "skipped: no network namespace of our own: {}",
            std::io::Error::last_os_error()
        );
        return;
    }
    // No duplicate address detection: IPv6 addresses usable at once.
    let _ = std::fs::write("/proc/sys/net/ipv6/conf/default/accept_dad", "0");
    let set_up = ip("link set lo up")
        && ip("link add bgid0 type veth peer name bgid1")
        && ip("addr add 198.18.0.150/24 dev bgid0")
        && ip("addr add fd00:198:20::1/64 dev bgid0 nodad")
        && ip("addr add 198.18.1.152/24 dev bgid1")
        && ip("addr add fd00:198:21::2/64 dev bgid1 nodad")
        && ip("link set bgid0 up")
        && ip("link set bgid1 up");
    if !set_up {
        eprintln!("skipped: cannot set a veth pair up (no `ip`?)");
        return;
    }
    let open = |a: &str| {
        let cfg = DeviceConfig::for_addr("burst0", addr(a)).expect("an address of the namespace");
        Engine::start_config(&cfg).expect("the device opens")
    };
    let (ea, eb) = (open("198.18.0.150"), open("198.18.1.152"));
    let (mut a, mut b) = (Side::new(&ea), Side::new(&eb));

    // RXE's layout: the default GID (link-local, from the MAC), then the
    // IPv4 address, then the IPv6 one.
    let mac = netif::mac("bgid0").expect("a veth has a MAC");
    let ll = IpAddr::V6(gids::default_gid(mac));
    let want: Vec<Option<[u8; 16]>> = [ll, addr("198.18.0.150"), addr("fd00:198:20::1")]
        .map(|g| Some(gid_of(g)))
        .to_vec();
    let t = a.c.gid_table().unwrap();
    assert_eq!(t, want);
    assert_eq!(
        b.c.gid_table().unwrap()[2],
        Some(gid_of(addr("fd00:198:21::2")))
    );
    assert_eq!(a.c.query_port().gid_tbl_len, 1024);

    // An address added to the interface takes the first free index; the
    // port serves it (sent from and to).
    assert!(ip("addr add 198.18.0.151/24 dev bgid0"));
    let t = table_after_change(&a.c);
    assert_eq!(t.len(), 4);
    assert_eq!(t[3], Some(gid_of(addr("198.18.0.151"))));
    let got = a.send(3, &mut b, gid_of(addr("198.18.1.152")));
    assert_eq!(got, (addr("198.18.0.151"), addr("198.18.1.152")));
    let got = b.send(1, &mut a, gid_of(addr("198.18.0.151")));
    assert_eq!(got, (addr("198.18.1.152"), addr("198.18.0.151")));

    // IPv6 GIDs both ways; the device's own address as before.
    let got = b.send(2, &mut a, gid_of(addr("fd00:198:20::1")));
    assert_eq!(got, (addr("fd00:198:21::2"), addr("fd00:198:20::1")));
    let got = a.send(2, &mut b, gid_of(addr("fd00:198:21::2")));
    assert_eq!(got, (addr("fd00:198:20::1"), addr("fd00:198:21::2")));
    let got = a.send(1, &mut b, gid_of(addr("198.18.1.152")));
    assert_eq!(got, (addr("198.18.0.150"), addr("198.18.1.152")));

    // Refused: an empty index, and GIDs of two IP versions.
    assert!(a
        .c
        .create_ah_from(gid_of(addr("198.18.1.152")), Some(9))
        .is_err());
    assert!(a
        .c
        .create_ah_from(gid_of(addr("198.18.1.152")), Some(2))
        .is_err());

    // An address removed leaves its slot empty; the others keep theirs.
    assert!(ip("addr del 198.18.0.151/24 dev bgid0"));
    let t = table_after_change(&a.c);
    assert_eq!(t, want);
    assert!(a
        .c
        .create_ah_from(gid_of(addr("198.18.1.152")), Some(3))
        .is_err());

    // The port follows the link: PORT_ERR when it goes down, PORT_ACTIVE
    // when it is back (as RXE follows its network device).
    assert!(a.c.query_port().active);
    assert!(ip("link set bgid0 down"));
    assert_eq!(next_event(&a.c), Some(AsyncEvent::Port { active: false }));
    assert!(!a.c.query_port().active);
    assert!(ip("link set bgid0 up"));
    assert_eq!(next_event(&a.c), Some(AsyncEvent::Port { active: true }));
    assert!(a.c.query_port().active);
    drop((a, b));
}

/// The next asynchronous event within five seconds.
fn next_event(c: &Context) -> Option<AsyncEvent> {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Some(e) = c.take_async_event() {
            return Some(e);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}
