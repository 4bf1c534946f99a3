//! Deterministic simulation of burst-transport over a faulty network.
//!
//! ```text
//! cargo run --release -p burst-transport --example sim -- \
//!     --seeds N --loss P --reorder P --dup P [--corrupt P] [--seed S] [--ops N] [--max-size BYTES]
//! ```
//!
//! Runs one checked workload per seed (RC pairs with every opcode, plus a UC
//! and a UD pair), prints a line per failing seed with the command that
//! replays it, and ends with `N passed, M failed`. Exits 1 if any failed.

use std::process::ExitCode;

use burst_transport::sim::{run_workload, Faults, WorkloadOptions};

fn main() -> ExitCode {
    let mut seeds = 100u64;
    let mut first = 1u64;
    let mut o = WorkloadOptions::default();
    let mut verbose = false;
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
            "--ops" => o.ops_per_pair = num(i) as usize,
            "--max-size" => o.max_size = num(i) as usize,
            "-v" | "--verbose" => {
                verbose = true;
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
    let Faults {
        loss,
        reorder,
        dup,
        corrupt,
        ..
    } = o.faults;
    let (mut passed, mut failed) = (0u64, 0u64);
    for seed in first..first + seeds {
        match run_workload(seed, &o) {
            Ok(s) => {
                passed += 1;
                if verbose {
                    println!(
                        "seed {seed}: ok, {} ops, {} bytes, {:.3} ms simulated, {} frames ({} lost, {} dup, {} reordered, {} corrupt), {} retransmitted",
                        s.ops, s.bytes, s.sim_ns as f64 / 1e6, s.net.sent, s.net.lost, s.net.duplicated, s.net.reordered, s.net.corrupted, s.retransmitted
                    );
                }
            }
            Err(e) => {
                failed += 1;
                println!("FAIL {e}");
                println!(
                    "  replay: cargo run --release -p burst-transport --example sim -- --seed {seed} --loss {loss} --reorder {reorder} --dup {dup} --corrupt {corrupt} --ops {} --max-size {}",
                    o.ops_per_pair, o.max_size
                );
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
