//! Deterministic simulation of burst-transport's model of two nodes over a
//! faulty network (options: `burst_transport::sim::sweep`).
//!
//! ```text
//! cargo run --release -p burst-transport --example sim -- \
//!     --seeds N --loss P --reorder P --dup P [--corrupt P] [--seed S] [--ops N] [--max-size BYTES]
//! cargo run --release -p burst-transport --example sim -- --sweep [--rx-limits] --seeds N [--secs S] [--jobs J]
//! ```
//!
//! Runs one checked workload per seed (RC pairs with every opcode, plus a UC
//! and a UD pair), prints a line per failing seed with the command that
//! replays it, and ends with `N passed, M failed`. Exits 1 if any failed.
//! The same workload through the real data plane (burst-verbs' `Device`
//! over an in-memory port): `cargo run --release -p burst-verbs --example core_sim`.

fn main() -> std::process::ExitCode {
    burst_transport::sim::sweep::main_with(
        "-p burst-transport --example sim",
        burst_transport::sim::run_workload,
        burst_transport::sim::run_stream,
    )
}
