//! `burst-bench kv`: the KV-cache transfer of disaggregated inference
//! through burst-xfer, burst against kernel TCP in the same run.
//!
//! A request of N tokens moves a model's KV cache for them: `layers x 2`
//! (K and V) `x N/16` blocks (16-token blocks; Llama-3-8B's block of one
//! layer's K or V is 16 x 8 heads x 128 dims x 2 bytes = 32 KiB) into
//! random free slots of the peer's pool, then the landing notification.
//! Latency runs from the request's first post to the receiver learning it
//! landed; `concurrency` requests are in flight at once.
//!
//! By default both ends run in this process (engines on 127.0.90.1 and
//! .2; TCP over the same addresses), so CPU time is the process's: both
//! sides and the engines together. `--role server` / `--role client`
//! split them over two processes or hosts, with a TCP control connection
//! that carries the endpoints and echoes each landing to the sender
//! (latency then includes that one-way echo); each side reports its own
//! CPU. `--transport verbs` runs the same sessions through the system's
//! libibverbs (burst's drop-in, kernel RXE, an RNIC).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use burst_verbs::engine::Engine;
use burst_verbs::Mtu;
use burst_xfer::{
    BatchId, Endpoint, Landed, Op, Pool, RdmaSession, Segment, SessionOptions, TcpSession,
    Transfer, XferError,
};
use clap::Parser;
use serde::Serialize;

use crate::report::{cpu_now, Samples};
use crate::{LOOP_A, LOOP_B};

/// The KV-cache transfer benchmark.
#[derive(Parser, Debug, Clone)]
#[command(name = "burst-bench kv")]
pub struct KvCli {
    /// Request sizes in tokens.
    #[arg(long, value_delimiter = ',', default_values_t = [128, 1024, 4096])]
    tokens: Vec<usize>,
    /// Block sizes in KiB (32: Llama-3-8B; 144 and 576: DeepSeek-R1's
    /// layer and block layouts).
    #[arg(long, value_delimiter = ',', default_values_t = [32])]
    block_kib: Vec<usize>,
    /// Requests in flight at once.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 8])]
    concurrency: Vec<usize>,
    /// QPs (TCP: connections) per session.
    #[arg(long, value_delimiter = ',', default_values_t = [4])]
    qps: Vec<usize>,
    /// Layers of the model.
    #[arg(long, default_value_t = 32)]
    layers: usize,
    /// The receiver's pool in GiB.
    #[arg(long, default_value_t = 2.0)]
    pool_gib: f64,
    /// Requests per point (at least the concurrency).
    #[arg(long, default_value_t = 16)]
    requests: usize,
    /// Work requests outstanding per QP.
    #[arg(long, default_value_t = 256)]
    depth: u32,
    /// Transports, alternated point by point: burst (burst-verbs' API),
    /// tcp (kernel TCP), verbs (the system's libibverbs: burst's drop-in,
    /// kernel RXE or an RNIC; built with feature `libibverbs`); `both` is
    /// burst,tcp.
    #[arg(long, value_delimiter = ',', default_values_t = ["both".to_string()])]
    transport: Vec<String>,
    /// This process's part: `both` (the two ends in this process),
    /// `server` (the receiver: serves one client's points, then exits) or
    /// `client` (the sender, which runs the sweep against `--control`).
    #[arg(long, default_value = "both")]
    role: String,
    /// server: the control address to listen on; client: the server's.
    #[arg(long, default_value = "0.0.0.0:18517")]
    control: SocketAddr,
    /// This side's address (the burst engine's and TCP's; two-process
    /// roles).
    #[arg(long)]
    addr: Option<IpAddr>,
    /// The Verbs device (verbs transport; default: the first listed).
    #[arg(long)]
    ibv_dev: Option<String>,
    /// The GID index the Verbs device is addressed with (1: the IPv4 RoCE
    /// v2 GID on RXE and burst's drop-in).
    #[arg(long, default_value_t = 1)]
    gid_index: u8,
    /// Path MTU in bytes (verbs: capped at the port's active MTU).
    #[arg(long, default_value_t = 4096)]
    mtu: usize,
    /// Check every block of every request at the receiver.
    #[arg(long)]
    verify: bool,
    /// One JSON object per point.
    #[arg(long)]
    json: bool,
}

/// One point's result.
#[derive(Debug, Clone, Serialize)]
pub struct KvPoint {
    pub transport: &'static str,
    pub tokens: usize,
    pub block_kib: usize,
    pub blocks: usize,
    pub concurrency: usize,
    pub qps: usize,
    pub requests: usize,
    pub p50_us: f64,
    pub p99_us: f64,
    pub gbps: f64,
    /// Work requests (segments) per second inside `submit` (waits for
    /// room included: bounded by the bandwidth).
    pub wr_per_sec: f64,
    /// Work requests per second the posts alone take (RDMA: the engine
    /// API's cost, one thread).
    pub post_per_sec: Option<f64>,
    /// Process CPU seconds per GB moved (in process: both sides and the
    /// engines; two processes: the sender's).
    pub cpu_s_per_gb: f64,
    /// The receiver's CPU seconds per GB (two processes).
    pub peer_cpu_s_per_gb: Option<f64>,
    pub verified: bool,
}

/// Block `i` of request `r`'s pattern byte at `off` (cheap, position
/// dependent, different per request and block).
fn pattern(r: usize, i: usize, off: usize) -> u8 {
    (r.wrapping_mul(131) ^ i.wrapping_mul(31) ^ off.wrapping_mul(7) ^ (off >> 8)) as u8
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Free slots of the receiver's pool, handed out at random.
struct Slots {
    free: Vec<u64>,
    rng: Rng,
}

impl Slots {
    fn take(&mut self, n: usize) -> Option<Vec<u64>> {
        if self.free.len() < n {
            return None;
        }
        Some(
            (0..n)
                .map(|_| {
                    let i = (self.rng.next() % self.free.len() as u64) as usize;
                    self.free.swap_remove(i)
                })
                .collect(),
        )
    }
}

#[derive(Debug, Clone, Copy)]
struct Point {
    tokens: usize,
    block: usize,
    concurrency: usize,
    qps: usize,
}

fn err<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> String {
    move |e| format!("{what}: {e}")
}

/// Landings as the sender learns them: the batch and when.
type LandingRx = mpsc::Receiver<Result<(Landed, Instant), String>>;

/// The receiving side of a point: a session in this process (and its pool,
/// for `--verify`) or a server process that echoes landings.
struct Receiver {
    landings: LandingRx,
    /// The receiver's pool, when it is in this process.
    dst: Option<Arc<Pool>>,
    dst_len: usize,
    /// Ends the receiver; returns its CPU seconds when it measured them.
    finish: Box<dyn FnOnce() -> Option<f64>>,
}

/// A receiver on its own thread in this process.
fn local_receiver<B: Transfer + Send + 'static>(mut b: B, dst: Arc<Pool>) -> Receiver {
    let (tx, rx) = mpsc::channel();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = Arc::clone(&stop);
    let thread = std::thread::spawn(move || {
        while !stop2.load(Ordering::Relaxed) {
            match b.wait_landed(Duration::from_millis(200)) {
                Ok(l) => {
                    if tx.send(Ok((l, Instant::now()))).is_err() {
                        break;
                    }
                }
                Err(XferError::Timeout(_)) => {}
                Err(e) => {
                    let _ = tx.send(Err(e.to_string()));
                    break;
                }
            }
        }
        b
    });
    Receiver {
        landings: rx,
        dst_len: dst.len(),
        dst: Some(dst),
        finish: Box::new(move || {
            stop.store(true, Ordering::Relaxed);
            let _ = thread.join();
            None
        }),
    }
}

/// Runs `point`: `a` sends, `recv` reports landings.
fn drive<A: Transfer>(
    name: &'static str,
    cli: &KvCli,
    p: &Point,
    mut a: A,
    src: &Pool,
    recv: Receiver,
) -> Result<KvPoint, String> {
    let blocks = cli.layers * 2 * p.tokens.div_ceil(16);
    let mut slots = Slots {
        free: (0..(recv.dst_len / p.block) as u64).collect(),
        rng: Rng(0x2545_f491_4f6c_dd1d ^ blocks as u64),
    };
    let requests = cli.requests.max(p.concurrency);
    let mut lat = Samples::new();
    let mut in_flight: HashMap<u64, (usize, Instant, Vec<Segment>)> = HashMap::new();
    let (mut submitted, mut done, mut submit_time, mut wrs) = (0usize, 0usize, 0f64, 0u64);
    let verify = recv.dst.as_ref().filter(|_| cli.verify);
    let sources = if verify.is_some() { p.concurrency } else { 1 };
    let (t0, cpu0) = (Instant::now(), cpu_now());
    let mut bytes = 0u64;
    while done < requests {
        while submitted < requests && in_flight.len() < p.concurrency {
            let Some(remote) = slots.take(blocks) else {
                break;
            };
            let area = submitted % sources;
            if verify.is_some() {
                for i in 0..blocks {
                    let at = (area * blocks + i) * p.block;
                    let data: Vec<u8> = (0..p.block).map(|o| pattern(submitted, i, o)).collect();
                    src.write(at as u64, &data);
                }
            }
            let segs: Vec<Segment> = remote
                .iter()
                .enumerate()
                .map(|(i, &slot)| Segment {
                    local: ((area * blocks + i) * p.block) as u64,
                    remote: slot * p.block as u64,
                    len: p.block as u32,
                })
                .collect();
            let t = Instant::now();
            let id = a.submit(Op::Write, &segs).map_err(err("submit"))?;
            submit_time += t.elapsed().as_secs_f64();
            wrs += segs.len() as u64;
            in_flight.insert(id.0, (submitted, t, segs));
            submitted += 1;
        }
        let (landed, at) = recv
            .landings
            .recv_timeout(Duration::from_secs(60))
            .map_err(|_| "no landing within 60 s".to_string())??;
        let Some((r, t, segs)) = in_flight.remove(&landed.batch.0) else {
            return Err(format!("landing of unknown batch {}", landed.batch.0));
        };
        a.wait(landed.batch, Duration::from_secs(60))
            .map_err(err("wait"))?;
        lat.record(at.duration_since(t).as_nanos() as u64);
        bytes += landed.bytes;
        if let Some(dst) = verify {
            let mut got = vec![0u8; p.block];
            for (i, s) in segs.iter().enumerate() {
                dst.read(s.remote, &mut got);
                if got.iter().enumerate().any(|(o, &v)| v != pattern(r, i, o)) {
                    return Err(format!("{name}: request {r} block {i} arrived wrong"));
                }
            }
        }
        slots
            .free
            .extend(segs.iter().map(|s| s.remote / p.block as u64));
        done += 1;
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu_now() - cpu0;
    let post_per_sec = a
        .post_stats()
        .map(|(n, t)| n as f64 / t.as_secs_f64().max(1e-9));
    let peer_cpu = (recv.finish)();
    let l = lat.lat("kv", name, blocks * p.block, false, false);
    let gb = bytes as f64 / 1e9;
    Ok(KvPoint {
        transport: name,
        tokens: p.tokens,
        block_kib: p.block / 1024,
        blocks,
        concurrency: p.concurrency,
        qps: p.qps,
        requests,
        p50_us: l.p50,
        p99_us: l.p99,
        gbps: gb * 8.0 / secs,
        wr_per_sec: wrs as f64 / submit_time.max(1e-9),
        post_per_sec,
        cpu_s_per_gb: cpu / gb.max(1e-12),
        peer_cpu_s_per_gb: peer_cpu.map(|c| c / gb.max(1e-12)),
        verified: verify.is_some(),
    })
}

/// The transports a point can run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Burst,
    Tcp,
    Verbs,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Burst => "burst",
            Kind::Tcp => "tcp",
            Kind::Verbs => "verbs",
        }
    }

    fn parse(list: &[String]) -> Result<Vec<Kind>, String> {
        let mut out = Vec::new();
        for t in list {
            match t.as_str() {
                "both" => out.extend([Kind::Burst, Kind::Tcp]),
                "burst" => out.push(Kind::Burst),
                "tcp" => out.push(Kind::Tcp),
                "verbs" if cfg!(feature = "libibverbs") => out.push(Kind::Verbs),
                "verbs" => return Err("--transport verbs: built without feature libibverbs".into()),
                t => return Err(format!("--transport {t}: burst, tcp, verbs or both")),
            }
        }
        out.dedup();
        Ok(out)
    }
}

/// What a process keeps across points: its engine and Verbs device,
/// opened when first needed.
struct Stacks {
    addr: IpAddr,
    peer_addr: IpAddr,
    mtu: Mtu,
    engine: Option<Engine>,
    peer_engine: Option<Engine>,
    /// The Verbs device's name and GID index.
    #[cfg(feature = "libibverbs")]
    ibv_dev: Option<String>,
    #[cfg(feature = "libibverbs")]
    gid_index: u8,
    #[cfg(feature = "libibverbs")]
    ibv: Option<Arc<burst_xfer::IbvDevice>>,
}

impl Stacks {
    fn engine(&mut self, peer: bool) -> Result<burst_verbs::engine::Context, String> {
        let (slot, addr) = if peer {
            (&mut self.peer_engine, self.peer_addr)
        } else {
            (&mut self.engine, self.addr)
        };
        if slot.is_none() {
            let cfg = crate::rdma::device_config(addr, self.mtu)?;
            *slot = Some(Engine::start_config(&cfg).map_err(err("engine"))?);
        }
        Ok(slot.as_ref().map(Engine::context).ok_or("engine")?)
    }

    #[cfg(feature = "libibverbs")]
    fn ibv(&mut self) -> Result<Arc<burst_xfer::IbvDevice>, String> {
        if self.ibv.is_none() {
            let dev = burst_xfer::IbvDevice::open(self.ibv_dev.as_deref(), self.gid_index)
                .map_err(err("verbs device"))?;
            self.ibv = Some(dev);
        }
        Ok(self.ibv.clone().ok_or("verbs device")?)
    }
}

fn options(cli: &KvCli, p: &Point, mtu: Mtu) -> SessionOptions {
    SessionOptions {
        qps: p.qps,
        depth: cli.depth,
        mtu,
        ..SessionOptions::default()
    }
}

fn pool_bytes(cli: &KvCli) -> usize {
    (cli.pool_gib * (1u64 << 30) as f64) as usize
}

/// One side's stack for a point: its engine's context, its Verbs device,
/// or kernel TCP.
#[derive(Clone)]
enum Side {
    Burst(burst_verbs::engine::Context),
    Tcp,
    #[cfg(feature = "libibverbs")]
    Verbs(Arc<burst_xfer::IbvDevice>),
}

impl Stacks {
    /// This process's side of `kind` (`peer`: the receiver's, in process).
    fn side(&mut self, kind: Kind, peer: bool) -> Result<Side, String> {
        Ok(match kind {
            Kind::Burst => Side::Burst(self.engine(peer)?),
            Kind::Tcp => Side::Tcp,
            #[cfg(feature = "libibverbs")]
            Kind::Verbs => Side::Verbs(self.ibv()?),
            #[cfg(not(feature = "libibverbs"))]
            Kind::Verbs => return Err("verbs: built without feature libibverbs".into()),
        })
    }
}

impl Side {
    /// A session over `pool`, its endpoint exchanged by `exchange` (TCP:
    /// `tcp` makes the connections).
    fn session(
        &self,
        pool: Arc<Pool>,
        o: &SessionOptions,
        exchange: impl FnOnce(&Endpoint) -> std::io::Result<Endpoint>,
        tcp: impl FnOnce(Arc<Pool>) -> Result<TcpSession, XferError>,
    ) -> Result<Box<dyn Transfer + Send>, String> {
        let s: Box<dyn Transfer + Send> = match self {
            Side::Burst(ctx) => {
                Box::new(RdmaSession::connect(ctx, pool, o, exchange).map_err(err("session"))?)
            }
            Side::Tcp => Box::new(tcp(pool).map_err(err("session"))?),
            #[cfg(feature = "libibverbs")]
            Side::Verbs(dev) => Box::new(
                burst_xfer::IbvSession::connect(dev, pool, o, exchange).map_err(err("session"))?,
            ),
        };
        Ok(s)
    }

    /// A pool of `len` bytes (burst: registered on the engine's context).
    fn pool(&self, len: usize) -> Result<Arc<Pool>, String> {
        let p = match self {
            Side::Burst(ctx) => Pool::registered(ctx, len),
            _ => Pool::new(len),
        };
        Ok(Arc::new(p.map_err(err("pool"))?))
    }
}

/// TCP has no endpoint exchange: its connections are made apart.
fn no_tcp(_: Arc<Pool>) -> Result<TcpSession, XferError> {
    Err(XferError::Unsupported("tcp"))
}

/// Both ends of `kind` in this process.
fn local_point(cli: &KvCli, p: &Point, kind: Kind, stacks: &mut Stacks) -> Result<KvPoint, String> {
    let blocks = cli.layers * 2 * p.tokens.div_ceil(16);
    let sources = if cli.verify { p.concurrency } else { 1 };
    let (sa, sb) = (stacks.side(kind, false)?, stacks.side(kind, true)?);
    let src = sa.pool(sources * blocks * p.block)?;
    let dst = sb.pool(pool_bytes(cli))?;
    let o = options(cli, p, stacks.mtu);
    let (a, b) = if kind == Kind::Tcp {
        let l = TcpListener::bind(SocketAddr::new(stacks.peer_addr, 0)).map_err(err("listen"))?;
        let at = l.local_addr().map_err(err("listen"))?;
        let (dst2, n) = (Arc::clone(&dst), p.qps);
        let side_b = std::thread::spawn(move || TcpSession::accept(dst2, &l, n));
        let a = TcpSession::dial(Arc::clone(&src), at, p.qps).map_err(err("session"))?;
        let b = side_b
            .join()
            .map_err(|_| "session thread panicked".to_string())?
            .map_err(err("session"))?;
        (
            Box::new(a) as Box<dyn Transfer + Send>,
            Box::new(b) as Box<dyn Transfer + Send>,
        )
    } else {
        // Both sides' setup blocks on the exchange: the receiver's on a
        // thread, the endpoints through channels.
        let (to_b, from_a) = mpsc::channel();
        let (to_a, from_b) = mpsc::channel();
        let dst2 = Arc::clone(&dst);
        let side_b = std::thread::spawn(move || {
            let exchange = move |mine: &Endpoint| {
                let _ = to_a.send(mine.clone());
                from_a.recv().map_err(std::io::Error::other)
            };
            sb.session(dst2, &o, exchange, no_tcp)
        });
        let exchange = |mine: &Endpoint| {
            let _ = to_b.send(mine.clone());
            from_b.recv().map_err(std::io::Error::other)
        };
        let a = sa.session(Arc::clone(&src), &o, exchange, no_tcp);
        let b = side_b
            .join()
            .map_err(|_| "session thread panicked".to_string())?;
        (a?, b?)
    };
    drive(kind.name(), cli, p, a, &src, local_receiver(b, dst))
}

/// A length-prefixed frame on the control connection.
fn send_frame(s: &mut TcpStream, b: &[u8]) -> std::io::Result<()> {
    s.write_all(&(b.len() as u32).to_le_bytes())?;
    s.write_all(b)
}

fn recv_frame(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut n = [0u8; 4];
    s.read_exact(&mut n)?;
    let n = u32::from_le_bytes(n) as usize;
    if n > 1 << 24 {
        return Err(std::io::Error::other("control frame too large"));
    }
    let mut b = vec![0u8; n];
    s.read_exact(&mut b)?;
    Ok(b)
}

/// Endpoints exchanged over the control connection.
fn exchange_over(
    control: &TcpStream,
    send_first: bool,
) -> impl FnOnce(&Endpoint) -> std::io::Result<Endpoint> + '_ {
    move |mine| {
        let mut c = control.try_clone()?;
        if send_first {
            send_frame(&mut c, &mine.to_bytes())?;
        }
        let peer = Endpoint::from_bytes(&recv_frame(&mut c)?)
            .ok_or_else(|| std::io::Error::other("a malformed endpoint"))?;
        if !send_first {
            send_frame(&mut c, &mine.to_bytes())?;
        }
        Ok(peer)
    }
}

/// The point a client asks a server for.
#[derive(Debug, Serialize, serde::Deserialize)]
struct Ask {
    transport: String,
    qps: usize,
    requests: usize,
}

/// `--role client`: the sender of `point` against a server process.
fn client_point(
    cli: &KvCli,
    p: &Point,
    kind: Kind,
    stacks: &mut Stacks,
    control: &mut TcpStream,
) -> Result<KvPoint, String> {
    let requests = cli.requests.max(p.concurrency);
    let ask = Ask {
        transport: kind.name().into(),
        qps: p.qps,
        requests,
    };
    send_frame(control, &serde_json::to_vec(&ask).unwrap_or_default()).map_err(err("control"))?;
    let dst_len = u64::from_le_bytes(
        recv_frame(control)
            .map_err(err("control"))?
            .try_into()
            .map_err(|_| "control: a malformed pool size")?,
    );
    // The free-slot list is sized by it: no larger than this side was
    // told the receiver's pool is (a server cannot make it allocate more).
    let dst_len = dst_len.min(pool_bytes(cli) as u64) as usize;
    let blocks = cli.layers * 2 * p.tokens.div_ceil(16);
    let side = stacks.side(kind, false)?;
    let src = side.pool(blocks * p.block)?;
    let o = options(cli, p, stacks.mtu);
    let server = control.peer_addr().map_err(err("control"))?.ip();
    let a = side.session(Arc::clone(&src), &o, exchange_over(control, true), |pool| {
        let mut c = control
            .try_clone()
            .map_err(|e| XferError::Setup(e.to_string()))?;
        let port = recv_frame(&mut c).map_err(|e| XferError::Setup(e.to_string()))?;
        let port = u16::from_le_bytes(port.try_into().unwrap_or([0, 0]));
        TcpSession::dial(pool, SocketAddr::new(server, port), p.qps)
    })?;
    // The server echoes each landing, then its CPU seconds.
    let mut c = control.try_clone().map_err(err("control"))?;
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for _ in 0..requests {
            let landed = recv_frame(&mut c).map_err(err("control")).and_then(|b| {
                let batch = b
                    .get(..8)
                    .and_then(|x| x.try_into().ok())
                    .map(u64::from_le_bytes);
                let bytes = b
                    .get(8..16)
                    .and_then(|x| x.try_into().ok())
                    .map(u64::from_le_bytes);
                match (batch, bytes) {
                    (Some(batch), Some(bytes)) => Ok(Landed {
                        batch: BatchId(batch),
                        bytes,
                    }),
                    _ => Err("control: a malformed landing".to_string()),
                }
            });
            let failed = landed.is_err();
            if tx.send(landed.map(|l| (l, Instant::now()))).is_err() || failed {
                return None;
            }
        }
        let cpu = recv_frame(&mut c).ok()?;
        Some(f64::from_le_bytes(cpu.try_into().ok()?))
    });
    let recv = Receiver {
        landings: rx,
        dst: None,
        dst_len,
        finish: Box::new(move || reader.join().ok().flatten()),
    };
    drive(kind.name(), cli, p, a, &src, recv)
}

/// `--role server`: serves the points one client asks for, then exits
/// when it hangs up (as perftest's servers do).
fn serve(cli: &KvCli, stacks: &mut Stacks) -> Result<(), String> {
    let l = TcpListener::bind(cli.control).map_err(err("control listen"))?;
    eprintln!("burst-bench kv: serving on {}", cli.control);
    let (mut c, _) = l.accept().map_err(err("control accept"))?;
    let _ = c.set_nodelay(true);
    while let Ok(ask) = recv_frame(&mut c) {
        serve_point(cli, stacks, &mut c, &ask)?;
    }
    Ok(())
}

fn serve_point(
    cli: &KvCli,
    stacks: &mut Stacks,
    c: &mut TcpStream,
    ask: &[u8],
) -> Result<(), String> {
    let ask: Ask = serde_json::from_slice(ask).map_err(err("control"))?;
    let kind = *Kind::parse(std::slice::from_ref(&ask.transport))?
        .first()
        .ok_or("no transport")?;
    if ask.qps == 0 || ask.qps > 1024 || ask.requests > 1 << 20 {
        return Err(format!("a point out of bounds: {ask:?}"));
    }
    let side = stacks.side(kind, false)?;
    let dst = side.pool(pool_bytes(cli))?;
    send_frame(c, &(dst.len() as u64).to_le_bytes()).map_err(err("control"))?;
    let p = Point {
        tokens: 0,
        block: 0,
        concurrency: 1,
        qps: ask.qps,
    };
    let o = options(cli, &p, stacks.mtu);
    let addr = c.local_addr().map_err(err("control"))?.ip();
    let mut b = side.session(dst, &o, exchange_over(c, false), |pool| {
        let l = TcpListener::bind(SocketAddr::new(addr, 0))
            .map_err(|e| XferError::Setup(e.to_string()))?;
        let port = l
            .local_addr()
            .map_err(|e| XferError::Setup(e.to_string()))?
            .port();
        let mut c = c.try_clone().map_err(|e| XferError::Setup(e.to_string()))?;
        send_frame(&mut c, &port.to_le_bytes()).map_err(|e| XferError::Setup(e.to_string()))?;
        TcpSession::accept(pool, &l, ask.qps)
    })?;
    let cpu0 = cpu_now();
    for _ in 0..ask.requests {
        let l = b
            .wait_landed(Duration::from_secs(60))
            .map_err(err("landing"))?;
        let mut f = [0u8; 16];
        f[..8].copy_from_slice(&l.batch.0.to_le_bytes());
        f[8..].copy_from_slice(&l.bytes.to_le_bytes());
        send_frame(c, &f).map_err(err("control"))?;
    }
    send_frame(c, &(cpu_now() - cpu0).to_le_bytes()).map_err(err("control"))?;
    Ok(())
}

fn print(cli: &KvCli, r: &KvPoint) {
    if cli.json {
        println!("{}", serde_json::to_string(r).unwrap_or_default());
    } else {
        println!(
            " {:<6} {:>6} {:>6} {:>7} {:>4} {:>4} {:>11.1} {:>11.1} {:>8.2} {:>9.3} {:>9} {:>8.2} {:>8}",
            r.transport,
            r.tokens,
            r.block_kib,
            r.blocks,
            r.concurrency,
            r.qps,
            r.p50_us,
            r.p99_us,
            r.gbps,
            r.wr_per_sec / 1e6,
            r.post_per_sec
                .map_or("-".to_string(), |p| format!("{:.2}", p / 1e6)),
            r.cpu_s_per_gb,
            r.peer_cpu_s_per_gb
                .map_or("-".to_string(), |c| format!("{c:.2}")),
        );
    }
}

/// `burst-bench kv ...`.
pub fn main(args: impl Iterator<Item = String>) -> Result<(), String> {
    let cli = KvCli::parse_from(args);
    let kinds = Kind::parse(&cli.transport)?;
    let mtu = Mtu::from_bytes(cli.mtu).ok_or_else(|| format!("--mtu {}: 256..4096", cli.mtu))?;
    let mut stacks = Stacks {
        addr: cli.addr.unwrap_or(LOOP_A),
        peer_addr: LOOP_B,
        mtu,
        engine: None,
        peer_engine: None,
        #[cfg(feature = "libibverbs")]
        ibv_dev: cli.ibv_dev.clone(),
        #[cfg(feature = "libibverbs")]
        gid_index: cli.gid_index,
        #[cfg(feature = "libibverbs")]
        ibv: None,
    };
    let mut control = match cli.role.as_str() {
        "both" => None,
        "server" => return serve(&cli, &mut stacks),
        "client" => {
            if cli.verify {
                return Err("--verify needs both ends in this process (--role both)".into());
            }
            let c = TcpStream::connect(cli.control).map_err(err("control connect"))?;
            let _ = c.set_nodelay(true);
            Some(c)
        }
        r => return Err(format!("--role {r}: both, server or client")),
    };
    if !cli.json {
        let ends = match &control {
            None => {
                format!("both ends in this process ({LOOP_A} -> {LOOP_B}); CPU is the process's")
            }
            Some(c) => format!(
                "to the server at {}; CPU per side",
                c.peer_addr().map_or("?".into(), |a| a.to_string())
            ),
        };
        println!(
            "burst-bench kv: {} layers, K and V blocks of 16 tokens, a {} GiB pool at the receiver; {ends}",
            cli.layers, cli.pool_gib
        );
        println!(
            " {:<6} {:>6} {:>6} {:>7} {:>4} {:>4} {:>11} {:>11} {:>8} {:>9} {:>9} {:>8} {:>8}",
            "",
            "tokens",
            "KiB",
            "blocks",
            "conc",
            "qps",
            "p50 us",
            "p99 us",
            "Gb/s",
            "M WR/s",
            "M post/s",
            "CPU s/GB",
            "peer s/GB"
        );
    }
    let mut k = 0;
    for &block_kib in &cli.block_kib {
        for &tokens in &cli.tokens {
            for &concurrency in &cli.concurrency {
                for &qps in &cli.qps {
                    let p = Point {
                        tokens,
                        block: block_kib * 1024,
                        concurrency,
                        qps,
                    };
                    let need = cli.layers * 2 * tokens.div_ceil(16) * p.block * concurrency;
                    if need as f64 > cli.pool_gib * (1u64 << 30) as f64 {
                        eprintln!(
                            "kv: {tokens} tokens x {concurrency} do not fit a {} GiB pool: skipped",
                            cli.pool_gib
                        );
                        continue;
                    }
                    // Alternate the order the transports go in.
                    let mut order = kinds.clone();
                    order.rotate_left(k % kinds.len().max(1));
                    k += 1;
                    for &kind in &order {
                        let r = match control.as_mut() {
                            None => local_point(&cli, &p, kind, &mut stacks)?,
                            Some(c) => client_point(&cli, &p, kind, &mut stacks, c)?,
                        };
                        print(&cli, &r);
                    }
                }
            }
        }
    }
    Ok(())
}
