//! What burstd's end-to-end test files share: a daemon child, clients
//! with an RC QP each, data-checked transfers, raw protocol clients.
#![allow(dead_code)] // each test file uses its own share

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use burst_verbs::engine::{Context, CqId};
use burst_verbs::protocol::{self as p, Reply, Request};
use burst_verbs::{
    Access, Mtu, Psn, QpAccess, QpInit, QpType, RcParams, RcPeer, RecvWr, SendOp, SendWr, Sge,
    WcStatus,
};

/// A burstd child, killed when dropped.
pub struct Daemon {
    pub child: Child,
    pub socket: PathBuf,
}

impl Daemon {
    pub fn start(addr: &str, extra: &[&str]) -> Daemon {
        let socket =
            std::env::temp_dir().join(format!("burstd-test-{}-{addr}.sock", std::process::id()));
        Daemon::start_at(addr, &socket, extra)
    }

    pub fn start_at(addr: &str, socket: &Path, extra: &[&str]) -> Daemon {
        Daemon::spawn(addr, socket, extra, None)
    }

    /// [`Daemon::start`] with burstd's log (warnings and up) in `log`.
    pub fn start_logged(addr: &str, extra: &[&str], log: &Path) -> Daemon {
        let socket =
            std::env::temp_dir().join(format!("burstd-test-{}-{addr}.sock", std::process::id()));
        let log = std::fs::File::create(log).expect("log file");
        Daemon::spawn(addr, &socket, extra, Some(log))
    }

    fn spawn(addr: &str, socket: &Path, extra: &[&str], log: Option<std::fs::File>) -> Daemon {
        let _ = std::fs::remove_file(socket);
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_burstd"));
        cmd.args(["--addr", addr, "--socket"])
            .arg(socket)
            .args(extra)
            .env_remove("BURST_CONFIG")
            .env("BURST_LOG", "warn")
            .env("NO_COLOR", "1")
            .env("HOME", "/nonexistent");
        if let Some(f) = log {
            cmd.stderr(f);
        }
        let child = cmd.spawn().expect("burstd starts");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            assert!(
                Instant::now() < deadline,
                "burstd did not create its socket"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        Daemon {
            child,
            socket: socket.to_path_buf(),
        }
    }

    /// A client, retried for up to 10 s: burstd takes back a departed
    /// client's connection slot when it handles the hang-up, a moment
    /// after the client goes (a test that just dropped clients at its
    /// user's `connections_per_uid` was refused now and then).
    pub fn connect(&self) -> Context {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match Context::connect(&self.socket) {
                Ok(c) => return c,
                Err(e) if Instant::now() >= deadline => panic!("client connects: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    pub fn clients(&self, ctx: &Context) -> Vec<burst_verbs::protocol::ClientInfo> {
        match ctx.daemon_request(&Request::Clients, &[]) {
            Ok((Reply::Clients(c), _)) => c,
            other => panic!("clients: {other:?}"),
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// `len` bytes of `fill` starting on a page of their own (leaked: a
/// region may outlive its test's last use by the daemon).
pub fn aligned(len: usize, fill: u8) -> &'static mut [u8] {
    let layout = std::alloc::Layout::from_size_align(len.div_ceil(4096) * 4096, 4096).unwrap();
    // SAFETY: a non-zero size; the memory is initialized before use.
    let p = unsafe { std::alloc::alloc(layout) };
    assert!(!p.is_null());
    // SAFETY: `len` bytes of the fresh allocation, leaked for 'static.
    let s = unsafe { std::slice::from_raw_parts_mut(p, len) };
    s.fill(fill);
    s
}

/// An RC QP with its CQ, PD and a registered buffer.
pub struct End {
    pub ctx: Context,
    pub pd: burst_verbs::Pd,
    pub cq: CqId,
    pub qp: burst_verbs::engine::QueuePair,
    pub buf: &'static mut [u8],
    pub keys: burst_verbs::MrKeys,
}

pub fn end(ctx: Context, fill: u8) -> End {
    let pd = ctx.try_alloc_pd().unwrap();
    let cq = ctx.try_create_cq(64, None).unwrap();
    let qp = ctx
        .create_qp_with(&QpInit::new(QpType::Rc, pd), cq, cq)
        .unwrap();
    // Page-aligned, as perftest's buffers: small heap buffers of several
    // tests share pages, and a range that straddles another registration's
    // pages falls back to the single-copy path.
    let buf = aligned(3 * 4096 + 123, fill);
    // SAFETY: `buf` is never freed.
    let keys = unsafe {
        ctx.reg_mr(
            pd,
            buf.as_mut_ptr().add(5),
            buf.len() - 5,
            Access(1 | 2 | 4),
        )
    }
    .unwrap();
    End {
        ctx,
        pd,
        cq,
        qp,
        buf,
        keys,
    }
}

pub fn connect(a: &End, b: &End) {
    let mut p = RcParams::new(Psn::new(7), Mtu::Mtu1024);
    p.access = QpAccess {
        remote_write: true,
        remote_read: true,
        remote_atomic: true,
    };
    let peer = |e: &End| RcPeer {
        gid: e.ctx.gid(),
        qpn: e.qp.qpn(),
        psn: Psn::new(7),
    };
    a.qp.connect_rc(&peer(b), &p).unwrap();
    b.qp.connect_rc(&peer(a), &p).unwrap();
}

pub fn wait_wc(ctx: &Context, cq: CqId) -> burst_verbs::WorkCompletion {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(wc) = ctx.poll_cq(cq) {
            return wc;
        }
        assert!(Instant::now() < deadline, "no completion");
    }
}

pub fn sge(e: &End, off: u64, len: u32) -> Sge {
    Sge {
        addr: e.keys.addr + off,
        length: len,
        lkey: e.keys.lkey,
    }
}

pub fn write_and_send(a: &mut End, b: &mut End) {
    // A pattern across the partial first and last pages of A's region.
    let n = a.buf.len() - 5;
    for (i, x) in a.buf[5..].iter_mut().enumerate() {
        *x = (i * 7 + 1) as u8;
    }
    let wr = SendWr::new(
        1,
        SendOp::Write {
            remote_addr: b.keys.addr,
            rkey: b.keys.rkey,
        },
        [sge(a, 0, n as u32)],
    );
    a.qp.post_send(&wr).unwrap();
    let wc = wait_wc(&a.ctx, a.cq);
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(&b.buf[5..], &a.buf[5..], "the WRITE landed in B's memory");
    // A SEND into a posted receive.
    b.qp.post_recv(&RecvWr {
        wr_id: 9,
        sg_list: [sge(b, 100, 64)].into(),
    })
    .unwrap();
    a.qp.post_send(&SendWr::new(2, SendOp::Send, [sge(a, 1000, 64)]))
        .unwrap();
    assert_eq!(wait_wc(&a.ctx, a.cq).status, WcStatus::Success);
    let wc = wait_wc(&b.ctx, b.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (9, WcStatus::Success, 64)
    );
    assert_eq!(&b.buf[105..169], &a.buf[1005..1069]);
}

/// A raw protocol client: hello done, the socket for forged requests.
pub fn raw_client(socket: &Path) -> OwnedFd {
    let s = p::connect(socket).unwrap();
    let hello = Request::Hello {
        version: p::VERSION,
        layout: p::layout(),
    };
    p::send(s.as_fd(), &p::encode(&hello), &[]).unwrap();
    let (m, _) = p::recv(s.as_fd()).unwrap().unwrap();
    assert!(matches!(
        p::decode::<Reply>(&m).unwrap(),
        Reply::Hello { .. }
    ));
    s
}

pub fn ask(s: &OwnedFd, msg: &[u8]) -> Reply {
    p::send(s.as_fd(), msg, &[]).unwrap();
    let (m, _) = p::recv(s.as_fd()).unwrap().expect("a reply, not a hang-up");
    p::decode::<Reply>(&m).unwrap()
}

pub fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}
