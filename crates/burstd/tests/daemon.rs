//! burstd end to end: a real daemon process on a loopback address, clients
//! in this process and in child processes, over its real socket.
//!
//! Each test starts its own burstd on its own 127.0.9x.1 address and socket.

use std::io::{BufRead, BufReader};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use burst_verbs::client::MrMode;
use burst_verbs::engine::{Context, PostError};
use burst_verbs::protocol::{self as p, Reply, Request};
use burst_verbs::{
    Access, AsyncEvent, Mtu, Psn, QpInit, QpType, RcParams, RcPeer, SendOp, SendWr, WcStatus,
};
use common::*;

#[test]
fn two_applications_share_one_device_and_address() {
    let d = Daemon::start("127.0.91.1", &[]);
    let (ca, cb) = (d.connect(), d.connect());
    assert_eq!(ca.gid(), cb.gid(), "one device, one GID");
    assert!(ca.is_daemon_client());
    let (mut a, mut b) = (end(ca, 1), end(cb, 2));
    connect(&a, &b);
    write_and_send(&mut a, &mut b);
    // Both show in the daemon, each with its own objects.
    let clients = d.clients(&a.ctx);
    let ids: Vec<u32> = clients.iter().map(|c| c.id).collect();
    assert!(ids.contains(&a.ctx.client_id().unwrap()));
    assert!(ids.contains(&b.ctx.client_id().unwrap()));
    let mine = clients
        .iter()
        .find(|c| c.id == a.ctx.client_id().unwrap())
        .unwrap();
    assert_eq!(mine.qps.len(), 1);
    assert_eq!(mine.mrs.len(), 1);
    assert!(mine.mrs[0].2, "A's region is shared zero-copy");
}

#[test]
fn neighbouring_heap_buffers_are_all_zero_copy() {
    let d = Daemon::start("127.0.98.1", &[]);
    let ctx = d.connect();
    let pd = ctx.try_alloc_pd().unwrap();
    // Small heap buffers share pages: each later one spans pages of the
    // earlier ones.
    let mut bufs: Vec<Vec<u8>> = (0..6).map(|i| vec![i as u8; 1000 + i * 700]).collect();
    let mut keys = Vec::new();
    for b in &mut bufs {
        // SAFETY: `bufs` outlives the registrations (deregistered below).
        keys.push(unsafe { ctx.reg_mr(pd, b.as_mut_ptr(), b.len(), Access(1)) }.unwrap());
    }
    let me = ctx.client_id().unwrap();
    let clients = d.clients(&ctx);
    let c = clients.iter().find(|c| c.id == me).unwrap();
    assert_eq!(c.mrs.len(), 6);
    assert!(
        c.mrs.iter().all(|m| m.2),
        "every region zero-copy: {:?}",
        c.mrs
    );
    for k in keys {
        ctx.dereg_mr(k.lkey).unwrap();
    }
    assert!(bufs
        .iter()
        .enumerate()
        .all(|(i, b)| b.iter().all(|x| *x == i as u8)));
}

#[test]
fn the_single_copy_fallback_carries_data_too() {
    let d = Daemon::start("127.0.92.1", &[]);
    let ca = Context::connect_with(&d.socket, MrMode::Copy).unwrap();
    let cb = Context::connect_with(&d.socket, MrMode::Copy).unwrap();
    let (mut a, mut b) = (end(ca, 1), end(cb, 2));
    connect(&a, &b);
    write_and_send(&mut a, &mut b);
    let clients = d.clients(&a.ctx);
    assert!(clients.iter().all(|c| c.mrs.iter().all(|m| !m.2)));
}

#[test]
fn a_client_cannot_reach_another_clients_objects() {
    let d = Daemon::start("127.0.93.1", &[]);
    let (ca, cb) = (d.connect(), d.connect());
    let (mut a, mut b) = (end(ca, 1), end(cb, 2));
    connect(&a, &b);
    let evil = raw_client(&d.socket);
    let qpn = a.qp.qpn().value();
    let forged = [
        Request::ModifyQp {
            qpn,
            attr: Default::default(),
        },
        Request::QueryQp { qpn },
        Request::DestroyQp { qpn },
        Request::DeregMr { lkey: a.keys.lkey },
        Request::DestroyCq { cq: a.cq.0 },
        Request::DeallocPd { pd: a.pd.0 },
        Request::CreateQp {
            init: QpInit::new(QpType::Rc, a.pd),
            send_cq: a.cq.0,
            recv_cq: a.cq.0,
        },
        Request::CreateSrq {
            pd: a.pd.0,
            max_wr: 4,
            max_sge: 1,
        },
        Request::RegMrCopy {
            pd: a.pd.0,
            addr: 4096,
            len: 4096,
            iova: 0,
            access: 1,
        },
    ];
    for r in &forged {
        assert!(
            matches!(ask(&evil, &p::encode(r)), Reply::Error { .. }),
            "{r:?} with another client's handle must fail"
        );
    }
    // The evil client's own QP cannot use A's lkey: the engine refuses the
    // gather (PD mismatch), with an error completion, not A's bytes.
    let pd = b.ctx.try_alloc_pd().unwrap();
    let cq = b.ctx.try_create_cq(8, None).unwrap();
    let q = b
        .ctx
        .create_qp_with(&QpInit::new(QpType::Rc, pd), cq, cq)
        .unwrap();
    let mut params = RcParams::new(Psn::new(7), Mtu::Mtu1024);
    params.access.remote_write = true;
    q.connect_rc(
        &RcPeer {
            gid: a.ctx.gid(),
            qpn: a.qp.qpn(),
            psn: Psn::new(7),
        },
        &params,
    )
    .unwrap();
    q.post_send(&SendWr::new(5, SendOp::Send, [sge(&a, 0, 16)]))
        .unwrap();
    let wc = wait_wc(&b.ctx, cq);
    assert_ne!(wc.status, WcStatus::Success, "another client's lkey");
    // A still works after all that.
    write_and_send(&mut a, &mut b);
}

#[test]
fn bad_messages_get_error_replies_and_never_kill_the_daemon() {
    let d = Daemon::start("127.0.94.1", &[]);
    let s = raw_client(&d.socket);
    let good = p::encode(&Request::AllocPd);
    let mut wrong_version = good.clone();
    wrong_version[4] = 99;
    let mut unknown = good[..8].to_vec();
    unknown.extend_from_slice(br#"{"FormatDisk":{}}"#);
    let mut truncated = good.clone();
    truncated.truncate(good.len() - 2);
    for bad in [
        vec![],
        vec![1, 2, 3],
        b"GET / HTTP/1.1\r\n\r\n".to_vec(),
        wrong_version,
        unknown,
        truncated,
        p::encode(&Request::Hello {
            version: p::VERSION,
            layout: p::layout(),
        }),
        p::encode(&Request::RegMr {
            pd: 1,
            offset: 0,
            len: 1 << 40,
            iova: 0,
            access: 1,
            pieces: vec![(0, 1 << 40)],
        }),
        p::encode(&Request::CreateCq {
            depth: u32::MAX,
            channel: Some(77),
        }),
        p::encode(&Request::CreateQp {
            init: QpInit::new(QpType::Rc, burst_verbs::Pd(12345)),
            send_cq: 999,
            recv_cq: 999,
        }),
    ] {
        if bad.is_empty() {
            // An empty datagram is EOF-like for SEQPACKET readers: skip.
            continue;
        }
        assert!(
            matches!(ask(&s, &bad), Reply::Error { .. }),
            "{:?} must get an error reply",
            String::from_utf8_lossy(&bad)
        );
    }
    // A memfd that could shrink under the daemon's mapping (a SIGBUS in
    // burstd) is refused.
    let pd = match ask(&s, &p::encode(&Request::AllocPd)) {
        Reply::Pd { pd } => pd,
        r => panic!("{r:?}"),
    };
    // SAFETY: plain memfd_create and ftruncate on our own descriptor.
    let plain = unsafe {
        let fd = libc::memfd_create(c"plain".as_ptr(), libc::MFD_CLOEXEC);
        assert!(fd >= 0);
        assert_eq!(libc::ftruncate(fd, 4096), 0);
        OwnedFd::from_raw_fd(fd)
    };
    let reg = p::encode(&Request::RegMr {
        pd,
        offset: 0,
        len: 4096,
        iova: 0,
        access: 1,
        pieces: vec![(0, 4096)],
    });
    p::send(s.as_fd(), &reg, &[plain.as_fd()]).unwrap();
    let (m, _) = p::recv(s.as_fd()).unwrap().unwrap();
    assert!(
        matches!(p::decode::<Reply>(&m).unwrap(), Reply::Error { .. }),
        "an unsealed memfd must be refused"
    );
    // Too long for the protocol.
    let huge = vec![b'x'; p::MAX_MESSAGE + 10];
    assert!(matches!(ask(&s, &huge), Reply::Error { .. }));
    // A hello of another version is refused, the socket closed.
    let other = p::connect(&d.socket).unwrap();
    let hello = p::encode(&Request::Hello {
        version: p::VERSION + 1,
        layout: 0,
    });
    let mut m = hello.clone();
    m[4..6].copy_from_slice(&(p::VERSION + 1).to_le_bytes());
    p::send(other.as_fd(), &m, &[]).unwrap();
    let _ = p::recv(other.as_fd());
    // A client that never says hello is dropped (after 5 s), not served
    // for ever.
    let silent = p::connect(&d.socket).unwrap();
    let t = Instant::now();
    if let Ok(Some((m, _))) = p::recv(silent.as_fd()) {
        assert!(matches!(p::decode::<Reply>(&m), Ok(Reply::Error { .. })));
    }
    assert!(
        matches!(p::recv(silent.as_fd()), Ok(None) | Err(_)),
        "closed"
    );
    assert!(t.elapsed() < Duration::from_secs(30));
    // Still serving.
    let mut a = end(d.connect(), 1);
    let mut b = end(d.connect(), 2);
    connect(&a, &b);
    write_and_send(&mut a, &mut b);
}

/// The child half of `a_killed_client_is_cleaned_up`: a client that sets
/// up a QP and a region, says "ready", and waits to be killed.
#[test]
fn child_client() {
    let Ok(sock) = std::env::var("BURSTD_TEST_CHILD") else {
        return;
    };
    let ctx = Context::connect(Path::new(&sock)).unwrap();
    let e = end(ctx, 3);
    println!("ready {}", e.ctx.client_id().unwrap());
    std::thread::sleep(Duration::from_secs(60));
}

#[allow(clippy::zombie_processes)] // the caller kills and waits for it
fn spawn_child(socket: &Path) -> (Child, u32) {
    let mut c = Command::new(std::env::current_exe().unwrap())
        .args(["child_client", "--exact", "--nocapture", "--test-threads=1"])
        .env("BURSTD_TEST_CHILD", socket)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(c.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the child died");
        // libtest prints "test child_client ... " before the child's line.
        if let Some(id) = line.split("ready ").nth(1) {
            return (c, id.trim().parse().unwrap());
        }
    }
}

#[test]
fn a_killed_client_is_cleaned_up_and_others_go_on() {
    let d = Daemon::start("127.0.95.1", &[]);
    let (mut a, mut b) = (end(d.connect(), 1), end(d.connect(), 2));
    connect(&a, &b);
    write_and_send(&mut a, &mut b);
    let baseline = fd_count(d.child.id());
    let (mut child, id) = spawn_child(&d.socket);
    assert!(d
        .clients(&a.ctx)
        .iter()
        .any(|c| c.id == id && c.qps.len() == 1));
    assert!(
        fd_count(d.child.id()) > baseline,
        "the child's objects hold descriptors"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while d.clients(&a.ctx).iter().any(|c| c.id == id) {
        assert!(
            Instant::now() < deadline,
            "the killed client's objects remain"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // Its descriptors (socket, memfds, eventfds) are gone too.
    let deadline = Instant::now() + Duration::from_secs(5);
    while fd_count(d.child.id()) != baseline {
        assert!(
            Instant::now() < deadline,
            "descriptors did not return to the baseline"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // The others never noticed.
    write_and_send(&mut a, &mut b);
}

#[test]
fn when_burstd_dies_every_verb_fails_and_a_new_one_serves() {
    let socket =
        std::env::temp_dir().join(format!("burstd-test-{}-death.sock", std::process::id()));
    let mut d = Daemon::start_at("127.0.96.1", &socket, &[]);
    let e = end(d.connect(), 1);
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    // DEVICE_FATAL on the async fd within a second.
    let mut pfd = libc::pollfd {
        fd: e.ctx.async_fd().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd.
    let n = unsafe { libc::poll(&mut pfd, 1, 1000) };
    assert_eq!(n, 1, "the async fd became readable");
    assert_eq!(e.ctx.take_async_event(), Some(AsyncEvent::DeviceFatal));
    assert!(e.ctx.device_failed());
    let wr = SendWr::new(1, SendOp::Send, [sge(&e, 0, 8)]);
    assert_eq!(e.qp.post_send(&wr), Err(PostError::Stopped));
    assert!(e.ctx.try_alloc_pd().is_err());
    assert!(e.ctx.cq(e.cq).unwrap().device_failed());
    // A restarted daemon serves new applications.
    drop(d);
    let d = Daemon::start_at("127.0.96.1", &socket, &[]);
    let (mut a, mut b) = (end(d.connect(), 1), end(d.connect(), 2));
    connect(&a, &b);
    write_and_send(&mut a, &mut b);
}

#[test]
fn the_sockets_permissions_decide_who_may_connect() {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        eprintln!("skipped: needs root to try another user");
        return;
    }
    let d = Daemon::start("127.0.97.1", &["--socket-mode", "0600"]);
    let path = std::ffi::CString::new(d.socket.to_str().unwrap()).unwrap();
    // SAFETY: fork; the child only makes system calls and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: in the child: drop to nobody, try to connect, report in
        // the exit status (0: refused as it must be).
        unsafe {
            if libc::setgid(65534) != 0 || libc::setuid(65534) != 0 {
                libc::_exit(2);
            }
            let s = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0);
            let mut a: libc::sockaddr_un = std::mem::zeroed();
            a.sun_family = libc::AF_UNIX as libc::sa_family_t;
            for (d, s) in a.sun_path.iter_mut().zip(path.as_bytes()) {
                *d = *s as libc::c_char;
            }
            let rc = libc::connect(
                s,
                (&a as *const libc::sockaddr_un).cast(),
                std::mem::size_of::<libc::sockaddr_un>() as u32,
            );
            let refused = rc < 0 && *libc::__errno_location() == libc::EACCES;
            libc::_exit(if refused { 0 } else { 1 });
        }
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFEXITED(status));
    assert_eq!(libc::WEXITSTATUS(status), 0, "nobody must get EACCES");
    // Root (the owner) still may.
    let _ = d.connect();
}

/// The control plane's errors cross the socket typed: a daemon client gets
/// the same error values as an embedded context for the same mistakes.
#[test]
fn a_daemon_client_gets_the_errors_an_embedded_context_gets() {
    let d = Daemon::start("127.0.96.1", &[]);
    let remote = d.connect();
    let engine = burst_verbs::engine::Engine::start(
        "127.0.96.2".parse().unwrap(),
        burst_verbs::Mtu::Mtu1024,
    )
    .unwrap();
    let local = engine.context();
    for ctx in [&remote, &local] {
        let home = if ctx.is_daemon_client() {
            "daemon"
        } else {
            "embedded"
        };
        let pd = ctx.try_alloc_pd().unwrap();
        let buf = aligned(8192, 0);
        // REMOTE_WRITE without LOCAL_WRITE: the Verbs rule.
        // SAFETY: `buf` lives for the process.
        let r = unsafe { ctx.reg_mr(pd, buf.as_mut_ptr(), 4096, Access::REMOTE_WRITE) };
        assert_eq!(
            r.unwrap_err(),
            burst_verbs::RegError::InvalidAccess,
            "{home}"
        );
        // A PD that is not the client's (an embedded context takes PDs of
        // its memory table it did not allocate: simulations use them).
        if ctx.is_daemon_client() {
            // SAFETY: as above.
            let r = unsafe {
                ctx.reg_mr(
                    burst_verbs::Pd(0xdead),
                    buf.as_mut_ptr(),
                    4096,
                    Access::LOCAL_WRITE,
                )
            };
            assert_eq!(r.unwrap_err(), burst_verbs::RegError::NoSuchPd, "{home}");
        }
        assert_eq!(
            ctx.dereg_mr(0x1234_5678).unwrap_err(),
            burst_verbs::RegError::NoSuchRegion,
            "{home}"
        );
        // Memory that is not mapped, or is read-only where the access lets
        // the device write: refused as RXE refuses it (EFAULT), not met by
        // the engine's first write.
        // An unmapped page: a low one no allocator hands out. A page this
        // test unmapped itself could be taken again by another test's
        // thread before the registration (CI saw it registered).
        let gone = 0x10000 as *mut u8;
        let mut resident = 0u8;
        // SAFETY: mincore only reports on the range; ENOMEM means unmapped.
        let rc = unsafe { libc::mincore(gone.cast(), 4096, &mut resident) };
        assert_eq!(
            (rc, std::io::Error::last_os_error().raw_os_error()),
            (-1, Some(libc::ENOMEM)),
            "page {gone:?} must be unmapped for this test"
        );
        // SAFETY: a plain anonymous mapping of this test, unmapped below.
        let ro = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
            .cast::<u8>()
        };
        assert_ne!(ro, libc::MAP_FAILED.cast());
        for (what, ptr, access) in [
            ("unmapped", gone, Access::LOCAL_WRITE),
            ("unmapped, read only", gone, Access::default()),
            ("read-only for writing", ro, Access::LOCAL_WRITE),
        ] {
            // SAFETY: refused, so never accessed.
            let r = unsafe { ctx.reg_mr(pd, ptr, 4096, access) };
            assert_eq!(
                r.map(|_| ()),
                Err(burst_verbs::RegError::BadAddress),
                "{home}: {what}"
            );
        }
        // SAFETY: `ro` stays mapped until after the deregistration.
        let mr = unsafe { ctx.reg_mr(pd, ro, 4096, Access::default()) }.unwrap();
        ctx.dereg_mr(mr.lkey).unwrap();
        // SAFETY: this test's mapping, no longer registered.
        unsafe { libc::munmap(ro.cast(), 4096) };
        // A PD still in use.
        // SAFETY: as above.
        let mr = unsafe { ctx.reg_mr(pd, buf.as_mut_ptr(), 4096, Access::LOCAL_WRITE) }.unwrap();
        assert_eq!(
            ctx.dealloc_pd(pd).unwrap_err(),
            burst_verbs::engine::PostError::Busy,
            "{home}"
        );
        ctx.dereg_mr(mr.lkey).unwrap();
        // A QP deeper than the device allows: the transport's refusal.
        let cq = ctx.try_create_cq(8, None).unwrap();
        let mut init = QpInit::new(QpType::Rc, pd);
        init.caps.max_send_wr = burst_verbs::MAX_QP_WR + 1;
        match ctx.create_qp_with(&init, cq, cq) {
            Err(burst_verbs::engine::CreateError::Verbs(
                burst_verbs::VerbsError::InvalidValue(w),
            )) => {
                assert_eq!(w, "max_send_wr/max_recv_wr", "{home}")
            }
            other => panic!("{home}: {other:?}"),
        }
        // An AH between address families.
        let v6 = std::net::Ipv6Addr::LOCALHOST.octets();
        assert!(
            matches!(
                ctx.create_ah_from(v6, None),
                Err(burst_verbs::engine::PostError::Refused(_))
            ),
            "{home}"
        );
        ctx.destroy_cq(cq).unwrap();
        ctx.dealloc_pd(pd).unwrap();
    }
}
