//! Flows through a shared bottleneck on simulated time, under each
//! congestion control: rates, queue, fairness (see `burst_verbs::bottleneck`).
//!
//! `cargo run --release -p burst-verbs --example bottleneck -- [flows...] [--csv DIR] [--check]`
//!
//! `--check` (what `cargo xtask test` runs) fails unless the loss window
//! (the default) shares the bottleneck fairly (Jain's index of the last
//! half at least 0.95, converged, no drop, the queue below half its limit,
//! no failed work request), DCQCN inside it keeps the queue bounded
//! without drops at Jain >= 0.9, and no control at 16 flows or more
//! overflows the queue. DCQCN alone is reported, not checked: without PFC
//! (a lossy bottleneck) it does not survive large incasts.

use burst_cc::{Algorithm, DcqcnConfig};
use burst_verbs::bottleneck::{run, Scenario};

fn main() {
    let mut flows = Vec::new();
    let mut csv: Option<std::path::PathBuf> = None;
    let mut check = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--check" {
            check = true;
        } else if a == "--csv" {
            csv = args.next().map(Into::into);
        } else if let Ok(n) = a.parse::<usize>() {
            flows.push(n);
        } else {
            eprintln!("usage: bottleneck [flows...] [--csv DIR] [--check]");
            std::process::exit(2);
        }
    }
    if flows.is_empty() {
        flows = vec![2, 8, 16, 64];
    }
    let dcqcn = DcqcnConfig::with_line_rate(25_000_000_000 / 8);
    let mut failures = Vec::new();
    println!(
        "flows  algorithm           Gb/s   jain  converge_ms  max_queue  dropped  marked  failed"
    );
    for &n in &flows {
        for algo in [
            Algorithm::None,
            Algorithm::LossWindow,
            Algorithm::Dcqcn(dcqcn),
            Algorithm::DcqcnAndLossWindow(dcqcn),
        ] {
            let s = Scenario::new(n, algo);
            let t = std::time::Instant::now();
            let r = run(&s);
            println!(
                "{n:>5}  {:<18} {:>5.2}  {:.3}  {:>11}  {:>9}  {:>7}  {:>6}  {:>6}   ({:.1} s)",
                algo.name(),
                r.total_gbps(),
                r.jain,
                r.converged_ns
                    .map_or("never".into(), |c| format!("{:.1}", c as f64 / 1e6)),
                r.max_queue,
                r.dropped,
                r.marked,
                r.failed,
                t.elapsed().as_secs_f64()
            );
            // The default controller is held to the bar; DCQCN
            // inside it to a bounded queue without drops and Jain >= 0.9
            // (0.935 at 16 flows, 0.98-1.0 at 2, 8, 32, 64).
            let bar = match algo {
                Algorithm::LossWindow => Some((0.95, true)),
                Algorithm::DcqcnAndLossWindow(_) => Some((0.9, false)),
                _ => None,
            };
            if let Some((jain, converge)) = bar {
                if !(r.jain >= jain
                    && (!converge || r.converged_ns.is_some())
                    && r.dropped == 0
                    && r.max_queue < s.queue_limit as u64 / 2
                    && r.failed == 0)
                {
                    failures.push(format!(
                        "{n} flows, {}: not fair or not bounded",
                        algo.name()
                    ));
                }
            }
            if algo == Algorithm::None && n >= 16 && r.dropped == 0 {
                failures.push(format!("{n} flows, none: expected overflow"));
            }
            if let Some(dir) = &csv {
                let _ = std::fs::create_dir_all(dir);
                let mut out = String::from("ms,queue");
                for i in 0..n {
                    out += &format!(",flow{i}");
                }
                out.push('\n');
                for k in 0..r.queue.len() {
                    out += &format!(
                        "{},{}",
                        (k + 1) as u64 * s.interval_ns / 1_000_000,
                        r.queue[k]
                    );
                    for f in &r.flows {
                        out += &format!(",{:.3}", f[k]);
                    }
                    out.push('\n');
                }
                let _ =
                    std::fs::write(dir.join(format!("bottleneck-{n}-{}.csv", algo.name())), out);
            }
        }
    }
    if check {
        if failures.is_empty() {
            println!("bottleneck check: ok");
        } else {
            for f in &failures {
                eprintln!("bottleneck check: {f}");
            }
            std::process::exit(1);
        }
    }
}
