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
//! Both ends run in this process (engines on 127.0.90.1 and .2; TCP over
//! the same addresses), so CPU time is the process's: both sides and the
//! engines together.

use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use burst_verbs::engine::Engine;
use burst_verbs::Mtu;
use burst_xfer::{Landed, Op, Pool, RdmaSession, Segment, SessionOptions, TcpSession, Transfer};
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
    /// Which transports: burst, tcp or both (alternated).
    #[arg(long, default_value = "both")]
    transport: String,
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
    /// Process CPU seconds per GB moved (both sides and the engines).
    pub cpu_s_per_gb: f64,
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

struct Point {
    tokens: usize,
    block: usize,
    concurrency: usize,
    qps: usize,
}

fn err<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> String {
    move |e| format!("{what}: {e}")
}

/// Runs `point` over a connected pair: `a` sends, `b` (on its own thread)
/// receives and reports landings.
fn drive<A: Transfer, B: Transfer + Send + 'static>(
    name: &'static str,
    cli: &KvCli,
    p: &Point,
    mut a: A,
    src: &Pool,
    mut b: B,
    dst: Arc<Pool>,
) -> Result<KvPoint, String> {
    let blocks = cli.layers * 2 * p.tokens.div_ceil(16);
    let (tx, rx) = mpsc::channel::<Result<(Landed, Instant), String>>();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = Arc::clone(&stop);
    let receiver = std::thread::spawn(move || {
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            match b.wait_landed(Duration::from_millis(200)) {
                Ok(l) => {
                    if tx.send(Ok((l, Instant::now()))).is_err() {
                        break;
                    }
                }
                Err(burst_xfer::XferError::Timeout(_)) => {}
                Err(e) => {
                    let _ = tx.send(Err(e.to_string()));
                    break;
                }
            }
        }
        b
    });
    let mut slots = Slots {
        free: (0..(dst.len() / p.block) as u64).collect(),
        rng: Rng(0x2545_f491_4f6c_dd1d ^ blocks as u64),
    };
    let requests = cli.requests.max(p.concurrency);
    let mut lat = Samples::new();
    let mut in_flight: std::collections::HashMap<u64, (usize, Instant, Vec<Segment>)> =
        std::collections::HashMap::new();
    let (mut submitted, mut done, mut submit_time, mut wrs) = (0usize, 0usize, 0f64, 0u64);
    let sources = if cli.verify { p.concurrency } else { 1 };
    let (t0, cpu0) = (Instant::now(), cpu_now());
    let mut bytes = 0u64;
    while done < requests {
        while submitted < requests && in_flight.len() < p.concurrency {
            let Some(remote) = slots.take(blocks) else {
                break;
            };
            let area = submitted % sources;
            if cli.verify {
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
        let (landed, at) = rx
            .recv_timeout(Duration::from_secs(60))
            .map_err(|_| "no landing within 60 s".to_string())??;
        let Some((r, t, segs)) = in_flight.remove(&landed.batch.0) else {
            return Err(format!("landing of unknown batch {}", landed.batch.0));
        };
        a.wait(landed.batch, Duration::from_secs(60))
            .map_err(err("wait"))?;
        lat.record(at.duration_since(t).as_nanos() as u64);
        bytes += landed.bytes;
        if cli.verify {
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
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = receiver.join();
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
        verified: cli.verify,
    })
}

/// A burst session pair over two engines.
fn burst_point(cli: &KvCli, p: &Point, ea: &Engine, eb: &Engine) -> Result<KvPoint, String> {
    let (ca, cb) = (ea.context(), eb.context());
    let blocks = cli.layers * 2 * p.tokens.div_ceil(16);
    let sources = if cli.verify { p.concurrency } else { 1 };
    let src = Arc::new(Pool::registered(&ca, sources * blocks * p.block).map_err(err("pool"))?);
    let dst = Arc::new(
        Pool::registered(&cb, (cli.pool_gib * (1u64 << 30) as f64) as usize)
            .map_err(err("pool"))?,
    );
    let o = SessionOptions {
        qps: p.qps,
        depth: cli.depth,
        ..SessionOptions::default()
    };
    let (to_b, from_a) = mpsc::channel();
    let (to_a, from_b) = mpsc::channel();
    let dst2 = Arc::clone(&dst);
    let side_b = std::thread::spawn(move || {
        RdmaSession::connect(&cb, dst2, &o, |mine| {
            let _ = to_a.send(mine.clone());
            from_a.recv().map_err(std::io::Error::other)
        })
    });
    let a = RdmaSession::connect(&ca, Arc::clone(&src), &o, |mine| {
        let _ = to_b.send(mine.clone());
        from_b.recv().map_err(std::io::Error::other)
    })
    .map_err(err("session"))?;
    let b = side_b
        .join()
        .map_err(|_| "session thread panicked".to_string())?
        .map_err(err("session"))?;
    drive("burst", cli, p, a, &src, b, dst)
}

/// A TCP session pair over loopback.
fn tcp_point(cli: &KvCli, p: &Point) -> Result<KvPoint, String> {
    let blocks = cli.layers * 2 * p.tokens.div_ceil(16);
    let sources = if cli.verify { p.concurrency } else { 1 };
    let src = Arc::new(Pool::new(sources * blocks * p.block).map_err(err("pool"))?);
    let dst =
        Arc::new(Pool::new((cli.pool_gib * (1u64 << 30) as f64) as usize).map_err(err("pool"))?);
    let l = TcpListener::bind(SocketAddr::new(LOOP_B, 0)).map_err(err("listen"))?;
    let addr = l.local_addr().map_err(err("listen"))?;
    let (dst2, n) = (Arc::clone(&dst), p.qps);
    let side_b = std::thread::spawn(move || TcpSession::accept(dst2, &l, n));
    let a = TcpSession::dial(Arc::clone(&src), addr, p.qps).map_err(err("session"))?;
    let b = side_b
        .join()
        .map_err(|_| "session thread panicked".to_string())?
        .map_err(err("session"))?;
    let _: IpAddr = LOOP_A;
    drive("tcp", cli, p, a, &src, b, dst)
}

fn print(cli: &KvCli, r: &KvPoint) {
    if cli.json {
        println!("{}", serde_json::to_string(r).unwrap_or_default());
    } else {
        println!(
            " {:<6} {:>6} {:>6} {:>7} {:>4} {:>4} {:>11.1} {:>11.1} {:>8.2} {:>9.3} {:>9} {:>8.2}",
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
            r.cpu_s_per_gb
        );
    }
}

/// `burst-bench kv ...`.
pub fn main(args: impl Iterator<Item = String>) -> Result<(), String> {
    let cli = KvCli::parse_from(args);
    let (burst, tcp) = match cli.transport.as_str() {
        "burst" => (true, false),
        "tcp" => (false, true),
        "both" => (true, true),
        t => return Err(format!("--transport {t}: burst, tcp or both")),
    };
    let mtu = Mtu::Mtu4096;
    let ea =
        Engine::start_config(&crate::rdma::device_config(LOOP_A, mtu)?).map_err(err("engine"))?;
    let eb =
        Engine::start_config(&crate::rdma::device_config(LOOP_B, mtu)?).map_err(err("engine"))?;
    if !cli.json {
        println!(
            "burst-bench kv: {} layers, K and V blocks of 16 tokens, a {} GiB pool at the receiver; both ends in this process ({LOOP_A} -> {LOOP_B}); CPU is the process's",
            cli.layers, cli.pool_gib
        );
        println!(
            " {:<6} {:>6} {:>6} {:>7} {:>4} {:>4} {:>11} {:>11} {:>8} {:>9} {:>8}",
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
            "CPU s/GB"
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
                    // Alternate which transport goes first.
                    let order: &[bool] = if k % 2 == 0 {
                        &[true, false]
                    } else {
                        &[false, true]
                    };
                    k += 1;
                    for &is_burst in order {
                        if is_burst && burst {
                            print(&cli, &burst_point(&cli, &p, &ea, &eb)?);
                        } else if !is_burst && tcp {
                            print(&cli, &tcp_point(&cli, &p)?);
                        }
                    }
                }
            }
        }
    }
    Ok(())
}
