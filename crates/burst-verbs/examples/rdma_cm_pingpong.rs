//! rdma_cm_pingpong: an RC connection set up through burst's rdma_cm in
//! Rust (resolve, connect with private data, accept), then SEND
//! ping-pongs over it and a disconnect.
//!
//! ```text
//! rdma_cm_pingpong                         both sides here (127.0.141.1 -> 127.0.141.2)
//! rdma_cm_pingpong --local IP              server on IP (port 7471)
//! rdma_cm_pingpong --local IP SERVER_IP    client
//! ```
//!
//! `-n ITERS` sets the number of round trips (default 1000). Exits
//! non-zero on any error or data mismatch.

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use burst_verbs::config::DeviceConfig;
use burst_verbs::engine::{CompletionQueue, QueuePair};
use burst_verbs::rdma_cm::{
    CmEvent, CmEventKind, CmId, ConnParam, EventChannel, PortSpace, RdmaCm,
};
use burst_verbs::{Access, MrKeys, QpInit, QpType, RecvWr, SendOp, SendWr, Sge, WcStatus};

const PORT: u16 = 7471;
const SIZE: usize = 64;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// One side's QP, its CQ and a registered buffer (send half, receive half).
struct Conn {
    id: CmId,
    qp: QueuePair,
    cq: CompletionQueue,
    buf: Box<[u8; 2 * SIZE]>,
    lkey: u32,
}

impl Conn {
    fn new(id: CmId) -> Res<Conn> {
        let ctx = id.context().ok_or("the id is on no device")?;
        let pd = ctx.alloc_pd();
        let mut buf = Box::new([0u8; 2 * SIZE]);
        // SAFETY: the buffer is boxed and lives in `Conn`, which outlives
        // every work request posted on it (the QP is drained before drop).
        let mr: MrKeys =
            unsafe { ctx.reg_mr(pd, buf.as_mut_ptr(), buf.len(), Access::LOCAL_WRITE) }?;
        let cq = ctx.cq(ctx.create_cq(8)).ok_or("no CQ")?;
        let mut init = QpInit::new(QpType::Rc, pd);
        init.caps.max_send_wr = 4;
        init.caps.max_recv_wr = 4;
        let qp = id.create_qp(&init, &cq, &cq)?;
        let c = Conn {
            id,
            qp,
            cq,
            buf,
            lkey: mr.lkey,
        };
        c.post_recv()?;
        Ok(c)
    }

    fn sge(&self, half: usize) -> Sge {
        Sge {
            addr: self.buf.as_ptr() as u64 + (half * SIZE) as u64,
            length: SIZE as u32,
            lkey: self.lkey,
        }
    }

    fn post_recv(&self) -> Res<()> {
        let wr = RecvWr {
            wr_id: 1,
            sg_list: [self.sge(1)].into(),
        };
        Ok(self.qp.post_recv(&wr)?)
    }

    fn send(&mut self, round: u64) -> Res<()> {
        self.buf[..8].copy_from_slice(&round.to_le_bytes());
        Ok(self
            .qp
            .post_send(&SendWr::new(2, SendOp::Send, [self.sge(0)]))?)
    }

    /// Waits for the receive of `round` (send completions pass by).
    fn recv(&mut self, round: u64) -> Res<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let Some(wc) = self.cq.poll() else {
                if Instant::now() > deadline {
                    return Err("no completion within 10 s".into());
                }
                std::hint::spin_loop();
                continue;
            };
            if wc.status != WcStatus::Success {
                return Err(format!("completion failed: {wc:?}").into());
            }
            if wc.wr_id == 1 {
                let got = u64::from_le_bytes(self.buf[SIZE..SIZE + 8].try_into()?);
                if got != round {
                    return Err(format!("round {round}: received {got}").into());
                }
                return self.post_recv();
            }
        }
    }
}

fn event(ch: &EventChannel, want: CmEventKind) -> Res<CmEvent> {
    let e = ch.get_event()?;
    if e.kind != want {
        return Err(format!("expected {want:?}, got {:?} (status {})", e.kind, e.status).into());
    }
    Ok(e)
}

fn server(cm: &RdmaCm, local: IpAddr, iters: u64) -> Res<()> {
    let ch = EventChannel::new()?;
    let listener = cm.create_id(&ch, PortSpace::Tcp);
    listener.bind_addr(SocketAddr::new(local, PORT))?;
    listener.listen()?;
    let req = event(&ch, CmEventKind::ConnectRequest)?;
    let mut c = Conn::new(req.id)?;
    let welcome = ConnParam {
        private_data: b"burst".to_vec(),
        rnr_retry_count: 7,
        ..Default::default()
    };
    c.id.accept(Some(&welcome))?;
    event(&ch, CmEventKind::Established)?;
    for round in 0..iters {
        c.recv(round)?;
        c.send(round)?;
    }
    event(&ch, CmEventKind::Disconnected)?;
    c.id.disconnect()?;
    c.id.destroy();
    listener.destroy();
    Ok(())
}

fn client(cm: &RdmaCm, server: IpAddr, iters: u64) -> Res<()> {
    let ch = EventChannel::new()?;
    let id = cm.create_id(&ch, PortSpace::Tcp);
    id.resolve_addr(None, SocketAddr::new(server, PORT))?;
    event(&ch, CmEventKind::AddrResolved)?;
    id.resolve_route()?;
    event(&ch, CmEventKind::RouteResolved)?;
    let mut c = Conn::new(id)?;
    let ask = ConnParam {
        retry_count: 7,
        rnr_retry_count: 7,
        ..Default::default()
    };
    // The server may not listen yet (both sides here): try a few times.
    for attempt in 0.. {
        c.id.connect(Some(&ask))?;
        match ch.get_event()? {
            e if e.kind == CmEventKind::Established => break,
            e if e.kind == CmEventKind::Rejected && attempt < 50 => {
                std::thread::sleep(Duration::from_millis(100));
                let id = cm.create_id(&ch, PortSpace::Tcp);
                id.resolve_addr(None, SocketAddr::new(server, PORT))?;
                event(&ch, CmEventKind::AddrResolved)?;
                id.resolve_route()?;
                event(&ch, CmEventKind::RouteResolved)?;
                c.id.destroy();
                c = Conn::new(id)?;
                let _ = e;
            }
            e => return Err(format!("connect: {:?} (status {})", e.kind, e.status).into()),
        }
    }
    let start = Instant::now();
    for round in 0..iters {
        c.send(round)?;
        c.recv(round)?;
    }
    let rtt = start.elapsed() / iters.max(1) as u32;
    println!(
        "{iters} round trips of {SIZE} B: {:.2} us each",
        rtt.as_secs_f64() * 1e6
    );
    c.id.disconnect()?;
    event(&ch, CmEventKind::Disconnected)?;
    c.id.destroy();
    Ok(())
}

fn device(ip: IpAddr) -> Res<RdmaCm> {
    Ok(RdmaCm::with_devices(vec![DeviceConfig::for_addr(
        "burst0", ip,
    )?]))
}

fn run() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut local = None;
    let mut peer = None;
    let mut iters = 1000u64;
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--local" => {
                local = Some(args.get(i + 1).ok_or("--local IP")?.parse()?);
                i += 1;
            }
            "-n" => {
                iters = args.get(i + 1).ok_or("-n ITERS")?.parse()?;
                i += 1;
            }
            a => peer = Some(a.parse()?),
        }
        i += 1;
    }
    match (local, peer) {
        (None, _) => {
            let (a, b): (IpAddr, IpAddr) = ("127.0.141.1".parse()?, "127.0.141.2".parse()?);
            let s = std::thread::spawn(move || {
                let run = || server(&device(b)?, b, iters);
                run().map_err(|e| e.to_string())
            });
            client(&device(a)?, b, iters)?;
            s.join().map_err(|_| "server panicked")??;
            Ok(())
        }
        (Some(l), None) => server(&device(l)?, l, iters),
        (Some(l), Some(p)) => client(&device(l)?, p, iters),
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rdma_cm_pingpong: {e}");
            ExitCode::FAILURE
        }
    }
}
