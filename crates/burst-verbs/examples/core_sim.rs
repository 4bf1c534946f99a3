//! The transport simulation through the real data plane: two burst
//! `Device`s over an in-memory port (`burst_io::SimNet`), with real ICRC
//! sealing and checking, demux, UD GRH, memory registration and copies.
//!
//! ```text
//! cargo run --release -p burst-verbs --example core_sim -- \
//!     --seeds N --loss P --reorder P --dup P [--corrupt P] [--seed S] [--ops N] [--max-size BYTES]
//! cargo run --release -p burst-verbs --example core_sim -- --sweep [--rx-limits] --seeds N [--secs S] [--jobs J]
//! ```
//!
//! Ends with `N passed, M failed`; exits 1 if any failed. Options as for
//! burst-transport's `sim` example (`burst_transport::sim::sweep`).

fn main() -> std::process::ExitCode {
    burst_transport::sim::sweep::main_with(
        "-p burst-verbs --example core_sim",
        burst_verbs::sim::run_workload,
        burst_verbs::sim::run_stream,
    )
}
