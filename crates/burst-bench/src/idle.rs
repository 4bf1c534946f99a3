//! `burst-bench idle`: the CPU an idle device costs. Two embedded engines
//! on loopback with connected RC QPs (a burst-xfer session of `--qps`),
//! one batch moved to warm them up, then nothing for `--secs`: the
//! process's CPU time over that span is what the engines spend waiting.
//! It also reports what the QPs cost in memory: the process's resident
//! set grown from before the session to after it (both sides' QPs, their
//! rings and burst-xfer's per-QP state), per QP. With `--daemon` the two
//! sides are clients of two burstd processes (`--daemon-pids` names them:
//! their resident sets are measured the same way).

use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use burst_verbs::engine::Engine;
use burst_verbs::Mtu;
use burst_xfer::{Op, Pool, RdmaSession, Segment, SessionOptions, Transfer};
use clap::Parser;

use crate::report::{cpu_now, rss_now, rss_of};
use crate::{LOOP_A, LOOP_B};

/// The idle-CPU measurement.
#[derive(Parser, Debug)]
#[command(name = "burst-bench idle")]
pub struct IdleCli {
    /// Seconds of idleness measured.
    #[arg(long, default_value_t = 10.0)]
    secs: f64,
    /// Connected RC QPs between the two engines.
    #[arg(long, default_value_t = 4)]
    qps: usize,
    /// Send queue depth of each QP (work requests outstanding at most).
    #[arg(long, default_value_t = 128)]
    depth: u32,
    /// One JSON object.
    #[arg(long)]
    json: bool,
    /// Daemon mode: the two sides' burstd sockets, `A,B`.
    #[arg(long, value_delimiter = ',')]
    daemon: Vec<std::path::PathBuf>,
    /// The two burstd processes' PIDs, `A,B`, for their memory.
    #[arg(long, value_delimiter = ',')]
    daemon_pids: Vec<u32>,
}

/// `burst-bench idle ...`.
pub fn main(args: impl Iterator<Item = String>) -> Result<(), String> {
    let cli = IdleCli::parse_from(args);
    if !matches!(cli.daemon.len(), 0 | 2) {
        return Err("--daemon takes two sockets, A,B".into());
    }
    let err = |what: &'static str| move |e: burst_xfer::XferError| format!("{what}: {e}");
    let start = |ip| {
        Engine::start_config(&crate::rdma::device_config(ip, Mtu::Mtu4096)?)
            .map_err(|e| format!("engine: {e}"))
    };
    // Embedded engines (kept alive to the end), or burstd's contexts.
    let (_engines, ca, cb) = if cli.daemon.is_empty() {
        let (ea, eb) = (start(LOOP_A)?, start(LOOP_B)?);
        let (ca, cb) = (ea.context(), eb.context());
        (Some((ea, eb)), ca, cb)
    } else {
        let c = |p: &std::path::PathBuf| {
            burst_verbs::engine::Context::connect(p).map_err(|e| format!("burstd: {e}"))
        };
        (None, c(&cli.daemon[0])?, c(&cli.daemon[1])?)
    };
    let daemons = || -> u64 { cli.daemon_pids.iter().map(|p| rss_of(&p.to_string())).sum() };
    let (rss0, drss0) = (rss_now(), daemons());
    let o = SessionOptions {
        qps: cli.qps,
        depth: cli.depth,
        ..SessionOptions::default()
    };
    let pa = Arc::new(Pool::registered(&ca, 1 << 20).map_err(err("pool"))?);
    let pb = Arc::new(Pool::registered(&cb, 1 << 20).map_err(err("pool"))?);
    let (to_b, from_a) = mpsc::channel();
    let (to_a, from_b) = mpsc::channel();
    let side_b = std::thread::spawn(move || {
        RdmaSession::connect(&cb, pb, &o, |mine| {
            let _ = to_a.send(mine.clone());
            from_a.recv().map_err(std::io::Error::other)
        })
    });
    let mut a = RdmaSession::connect(&ca, pa, &o, |mine| {
        let _ = to_b.send(mine.clone());
        from_b.recv().map_err(std::io::Error::other)
    })
    .map_err(err("session"))?;
    let mut b = side_b
        .join()
        .map_err(|_| "session thread panicked".to_string())?
        .map_err(err("session"))?;
    let t = Duration::from_secs(10);
    let seg = Segment {
        local: 0,
        remote: 0,
        len: 64 << 10,
    };
    let id = a.submit(Op::Write, &[seg]).map_err(err("submit"))?;
    a.wait(id, t).map_err(err("wait"))?;
    b.wait_landed(t).map_err(err("landing"))?;
    // Both engines' QPs (2 x qps), touched once by the warm-up.
    let per_qp = rss_now().saturating_sub(rss0) / (2 * cli.qps.max(1)) as u64;
    let daemon_per_qp = daemons().saturating_sub(drss0) / (2 * cli.qps.max(1)) as u64;
    // Let the last ACKs and any spinning after them end, then measure.
    std::thread::sleep(Duration::from_millis(100));
    let (t0, cpu0) = (Instant::now(), cpu_now());
    std::thread::sleep(Duration::from_secs_f64(cli.secs));
    let (secs, cpu) = (t0.elapsed().as_secs_f64(), cpu_now() - cpu0);
    if cli.json {
        println!(
            "{}",
            serde_json::json!({"test": "idle", "engines": 2, "qps": cli.qps, "depth": cli.depth, "secs": secs, "cpu_secs": cpu, "rss_per_qp": per_qp, "daemon": !cli.daemon.is_empty(), "daemon_rss_per_qp": daemon_per_qp})
        );
    } else {
        println!(
            "burst-bench idle: two {}, {} connected RC QPs of depth {}, idle {secs:.1} s: {cpu:.4} CPU s ({:.3}% of a core); resident memory {per_qp} bytes per QP{}",
            if cli.daemon.is_empty() { "engines" } else { "burstd clients" },
            cli.qps,
            cli.depth,
            100.0 * cpu / secs,
            if cli.daemon_pids.is_empty() {
                String::new()
            } else {
                format!(" in the clients, {daemon_per_qp} in the daemons")
            }
        );
    }
    Ok(())
}
