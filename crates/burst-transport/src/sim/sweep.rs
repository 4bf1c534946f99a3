//! The command line of the simulation examples (burst-transport's `sim`,
//! burst-verbs' `core_sim`): threads and the wall clock live here, beside
//! the simulator, never in a QP. It runs one seeded, checked
//! workload per seed, over a fault point or (`--sweep`) the whole fault
//! space.
//!
//! ```text
//! --seeds N --loss P --reorder P --dup P [--corrupt P] [--seed S] [--ops N] [--max-size BYTES]
//!     [--pairs N]
//!     [--repeat by-seed|go-back-n|selective|requester-only|responder-only]
//! --sweep [--rx-limits] --seeds N [--first-seed S] [--secs S] [--jobs J] [-v]
//! --stream --loss P [--repeat R] [--seeds N] [--bytes N] [--size BYTES] [--depth D] [--flows N]
//!     [--read | --send]
//! ```
//!
//! `--stream` measures goodput instead ([`super::stream`]): one RC pair
//! WRITEs (`--read`: READs, `--send`: SENDs) `--bytes` (256 MiB) in
//! `--size` (64 KiB) messages, checked; with
//! `--repeat by-seed` (the default) each seed runs go-back-N and selective
//! repeat alternately and the closing line gives both means.
//!
//! `--sweep` draws each seed's faults from the seed itself, over the whole
//! fault space (loss 0-10%, reordering 0-10%, duplication 0-2%, corruption
//! 0-1%), so one run covers the space instead of one point of it;
//! `--rx-limits` adds, for a quarter of the seeds, a receiver slower than the
//! link with a bounded queue (the overrun case congestion control is for).
//! `--secs` stops starting new seeds after that many seconds (the closing
//! line says how many ran); `--jobs` runs seeds on that many threads.

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::stream::{StreamOp, StreamOptions, StreamSummary};
use super::{Faults, Repeat, Rng, Summary, WorkloadOptions};

/// The faults of seed `seed` in a sweep: a function of the seed alone, so a
/// failure replays from its seed and the printed faults.
fn sweep_faults(seed: u64, rx_limits: bool) -> Faults {
    let mut r = Rng::new(seed.wrapping_mul(0x2545_f491_4f6c_dd1d));
    let unit = |r: &mut Rng| (r.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    // Rounded so the replay line reproduces the same probabilities.
    let round = |p: f64| (p * 1e4).round() / 1e4;
    let mut f = Faults {
        loss: round(unit(&mut r) * 0.10),
        reorder: round(unit(&mut r) * 0.10),
        dup: round(unit(&mut r) * 0.02),
        corrupt: round(unit(&mut r) * 0.01),
        ..Faults::default()
    };
    if rx_limits && r.below(4) == 0 {
        f.rx_gbps = [10, 25, 50][r.below(3) as usize];
        f.rx_queue = [64, 256, 1024][r.below(3) as usize];
    }
    f
}

fn replay_line(example: &str, seed: u64, o: &WorkloadOptions) -> String {
    let f = o.faults;
    let mut s = format!(
        "cargo run --release {example} -- --seed {seed} --loss {} --reorder {} --dup {} --corrupt {} --ops {} --max-size {}",
        f.loss, f.reorder, f.dup, f.corrupt, o.ops_per_pair, o.max_size
    );
    if o.rc_pairs != WorkloadOptions::default().rc_pairs {
        s += &format!(" --pairs {}", o.rc_pairs);
    }
    if f.rx_gbps != 0 || f.rx_queue != 0 {
        s += &format!(" --rx-gbps {} --rx-queue {}", f.rx_gbps, f.rx_queue);
    }
    if o.repeat != Repeat::BySeed {
        s += &format!(" --repeat {}", o.repeat.name());
    }
    s
}

/// The simulation command line (see the `sim` examples of burst-transport
/// and burst-verbs): parses `std::env::args`, runs `run` per seed (on
/// `--jobs` threads), prints a replay line per failure and the closing
/// `N passed, M failed` line. `example` names the example in replay lines
/// (`-p CRATE --example sim`).
pub fn main_with(
    example: &str,
    run: fn(u64, &WorkloadOptions) -> Result<Summary, String>,
    stream: fn(u64, &StreamOptions) -> Result<StreamSummary, String>,
) -> ExitCode {
    let mut seeds = 100u64;
    let mut first = 1u64;
    let mut o = WorkloadOptions::default();
    let mut verbose = false;
    let mut sweep = false;
    let mut rx_limits = false;
    let mut secs: Option<f64> = None;
    let mut jobs = 1usize;
    let mut streaming = false;
    let mut so = StreamOptions::default();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    let num = |i: usize| -> f64 {
        args.get(i + 1)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| {
                eprintln!("sim: {} needs a number", args[i]);
                std::process::exit(2)
            })
    };
    while i < args.len() {
        match args[i].as_str() {
            "--seeds" => seeds = num(i) as u64,
            "--seed" => {
                first = num(i) as u64;
                seeds = 1;
            }
            "--first-seed" => first = num(i) as u64,
            "--loss" => o.faults.loss = num(i),
            "--reorder" => o.faults.reorder = num(i),
            "--dup" => o.faults.dup = num(i),
            "--corrupt" => o.faults.corrupt = num(i),
            "--rx-gbps" => o.faults.rx_gbps = num(i) as u64,
            "--rx-queue" => o.faults.rx_queue = num(i) as usize,
            "--ops" => o.ops_per_pair = num(i) as usize,
            "--pairs" => o.rc_pairs = (num(i) as usize).max(1),
            "--max-size" => o.max_size = num(i) as usize,
            "--repeat" => {
                let r = args.get(i + 1).and_then(|v| Repeat::parse(v));
                let Some(r) = r else {
                    eprintln!("sim: --repeat takes by-seed, go-back-n, selective, requester-only or responder-only");
                    return ExitCode::from(2);
                };
                o.repeat = r;
            }
            "--bytes" => so.bytes = num(i) as u64,
            "--size" => so.size = num(i) as usize,
            "--depth" => so.depth = num(i) as usize,
            "--flows" => so.flows = (num(i) as usize).max(1),
            "--secs" => secs = Some(num(i)),
            "--jobs" => jobs = (num(i) as usize).max(1),
            "--sweep" | "--stream" | "--read" | "--send" | "--rx-limits" | "-v" | "--verbose" => {
                match args[i].as_str() {
                    "--sweep" => sweep = true,
                    "--read" => so.op = StreamOp::Read,
                    "--send" => so.op = StreamOp::Send,
                    "--stream" => streaming = true,
                    "--rx-limits" => rx_limits = true,
                    _ => verbose = true,
                }
                i += 1;
                continue;
            }
            other => {
                eprintln!("sim: unknown argument {other}");
                return ExitCode::from(2);
            }
        }
        i += 2;
    }
    if streaming {
        so.faults = o.faults;
        so.repeat = o.repeat;
        return stream_main(stream, &so, first, seeds);
    }
    let start = Instant::now();
    let budget = secs.map(Duration::from_secs_f64);
    let next = AtomicU64::new(first);
    let (passed, failed) = (AtomicU64::new(0), AtomicU64::new(0));
    // Runs whose requester spent its retry count, and how many were
    // expected from the runs' own retry statistics.
    let spent = Mutex::new((Vec::<u64>::new(), 0f64));
    let out = Mutex::new(());
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| loop {
                if budget.is_some_and(|b| start.elapsed() >= b) {
                    break;
                }
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= first + seeds {
                    break;
                }
                let mut o = o;
                if sweep {
                    o.faults = sweep_faults(seed, rx_limits);
                }
                let res = run(seed, &o);
                let _guard = out.lock().unwrap_or_else(|e| e.into_inner());
                match res {
                    Ok(s) => {
                        passed.fetch_add(1, Ordering::Relaxed);
                        {
                            let mut sp = spent.lock().unwrap_or_else(|e| e.into_inner());
                            sp.1 += s.retry_exhaust_expected;
                            if s.retry_exhausted {
                                sp.0.push(seed);
                                println!(
                                    "seed {seed}: a requester spent its retry count (RetryExcErr; run ended)"
                                );
                                println!("  replay: {}", replay_line(example, seed, &o));
                            }
                        }
                        if verbose {
                            println!(
                                "seed {seed}: ok, {} ops, {} bytes, {:.3} ms simulated, {} frames ({} lost, {} dup, {} reordered, {} corrupt, {} overflowed), {} retransmitted, retry exhaustion expected {:.2e}",
                                s.ops, s.bytes, s.sim_ns as f64 / 1e6, s.net.sent, s.net.lost, s.net.duplicated, s.net.reordered, s.net.corrupted, s.net.overflowed, s.retransmitted, s.retry_exhaust_expected
                            );
                        }
                    }
                    Err(e) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        println!("FAIL {e}");
                        println!("  replay: {}", replay_line(example, seed, &o));
                    }
                }
            });
        }
    });
    let (mut passed, mut failed) = (passed.into_inner(), failed.into_inner());
    let (spent, expected) = spent.into_inner().unwrap_or_else(|e| e.into_inner());
    if !spent.is_empty() || expected > 1e-3 {
        let k = spent.len() as u64;
        let chance = poisson_at_least(k, expected);
        println!(
            "retry count spent in {k} run(s) {spent:?}; expected {expected:.4} from the runs' own \
             retry rounds (chance of {k} or more: {chance:.2e})"
        );
        // More runs spent their count than go-back-N at these losses
        // makes likely: a recovery weakness, not bad luck.
        if chance < 1e-3 {
            println!("FAIL retry count spent more often than the retry statistics explain");
            passed -= k;
            failed += k;
        }
    }
    if passed + failed < seeds {
        println!(
            "sim: time box of {:.0} s reached after {} of {seeds} seeds",
            secs.unwrap_or(0.0),
            passed + failed
        );
    }
    println!("{passed} passed, {failed} failed");
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// `--stream`: goodput per seed and repeat mode, then the means.
fn stream_main(
    stream: fn(u64, &StreamOptions) -> Result<StreamSummary, String>,
    o: &StreamOptions,
    first: u64,
    seeds: u64,
) -> ExitCode {
    let modes = match o.repeat {
        Repeat::BySeed => vec![Repeat::GoBackN, Repeat::Selective],
        r => vec![r],
    };
    let mut sums = vec![(0f64, 0u64); modes.len()];
    let mut failed = 0;
    for seed in first..first + seeds {
        for (m, &repeat) in modes.iter().enumerate() {
            let so = StreamOptions { repeat, ..*o };
            match stream(seed, &so) {
                Ok(s) => {
                    let c = s.counters;
                    println!(
                        "seed {seed} {}: {:.2} Gb/s goodput ({} bytes in {:.3} ms simulated), {} frames ({} lost), {} retransmitted, {} timeouts, {} held out of order, {} probes, Jain {:.4} over {} flow(s)",
                        repeat.name(),
                        s.gbps(),
                        s.bytes,
                        s.sim_ns as f64 / 1e6,
                        s.net.sent,
                        s.net.lost,
                        c.retransmitted_pkts,
                        c.completer_retry_err,
                        c.sr_held_pkts,
                        c.sr_probes,
                        s.jain,
                        so.flows
                    );
                    sums[m].0 += s.gbps();
                    sums[m].1 += 1;
                }
                Err(e) => {
                    failed += 1;
                    println!("FAIL {e}");
                }
            }
        }
    }
    for (m, (sum, n)) in modes.iter().zip(&sums) {
        if *n > 0 {
            println!(
                "{}: mean goodput {:.2} Gb/s over {n} seed(s) at loss {}",
                m.name(),
                sum / *n as f64,
                o.faults.loss
            );
        }
    }
    println!(
        "{} passed, {failed} failed",
        sums.iter().map(|s| s.1).sum::<u64>()
    );
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// P(X >= k) for X ~ Poisson(mean).
fn poisson_at_least(k: u64, mean: f64) -> f64 {
    if k == 0 {
        return 1.0;
    }
    let mut term = (-mean).exp();
    let mut below = 0.0;
    for i in 0..k {
        below += term;
        term *= mean / (i + 1) as f64;
    }
    (1.0 - below).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::poisson_at_least;

    #[test]
    fn poisson_tail_matches_closed_forms() {
        assert_eq!(poisson_at_least(0, 0.5), 1.0);
        // P(X >= 1) = 1 - e^-m.
        assert!((poisson_at_least(1, 0.01) - (1.0 - (-0.01f64).exp())).abs() < 1e-12);
        // P(X >= 2) = 1 - e^-m (1 + m).
        let m = 0.01f64;
        assert!((poisson_at_least(2, m) - (1.0 - (-m).exp() * (1.0 + m))).abs() < 1e-12);
        assert!(poisson_at_least(2, 0.01) < 1e-3);
        assert!(poisson_at_least(1, 0.01) > 1e-3);
    }
}
